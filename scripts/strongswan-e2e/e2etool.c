/*
 * e2etool: traffic checks for scripts/strongswan-e2e.sh, compiled static on
 * the host and run in the test VM from the shared directory (the guest has
 * neither python3 nor a tool that numbers datagrams).
 *
 *   e2etool udp-send IP PORT COUNT PPS SIZE [SRC]
 *       COUNT datagrams of SIZE bytes, each starting with its 64-bit
 *       sequence number (big-endian), paced at PPS against an absolute clock
 *       so that a slow turn does not stretch the run
 *   e2etool udp-recv PORT COUNT IDLE_MS
 *       counts what arrives until all COUNT were seen (plus a short grace for
 *       late duplicates) or nothing came for IDLE_MS; prints
 *       "udp: N received, U unique, D duplicated, L lost, R out of order"
 *       and exits 0 iff nothing was lost or duplicated
 *   e2etool tcp-serve PORT
 *       accepts one connection, reads to its end, answers with the byte count
 *       and an FNV-1a hash of what it read
 *   e2etool tcp-send IP PORT BYTES [SRC]
 *       connects, sends BYTES of a pseudo-random pattern, half-closes, and
 *       checks the answer against what it sent; exit 0 iff they match
 *
 * SRC binds the sending end to that address: a host with several
 * (one per CHILD_SA) must not leave it to the route's choice.
 *
 * Every command gives up after 60 s (alarm), so a black-holed tunnel ends
 * as a failure, not a hang.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static void die(const char *what)
{
	fprintf(stderr, "e2etool: %s: %s\n", what, strerror(errno));
	exit(2);
}

static struct sockaddr_in addr_of(const char *ip, const char *port)
{
	struct sockaddr_in a;
	memset(&a, 0, sizeof a);
	a.sin_family = AF_INET;
	a.sin_port = htons((uint16_t)atoi(port));
	if (ip && inet_pton(AF_INET, ip, &a.sin_addr) != 1) {
		fprintf(stderr, "e2etool: not an IPv4 address: %s\n", ip);
		exit(2);
	}
	return a;
}

/* Binds s to src (an address, port chosen by the kernel), if given. */
static void bind_src(int s, const char *src)
{
	if (!src)
		return;
	struct sockaddr_in a = addr_of(src, "0");
	if (bind(s, (struct sockaddr *)&a, sizeof a) < 0)
		die("bind");
}

static uint64_t now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static int udp_send(char **av, const char *src)
{
	struct sockaddr_in dst = addr_of(av[0], av[1]);
	long count = atol(av[2]), pps = atol(av[3]), size = atol(av[4]);
	unsigned char buf[65536];
	if (size < 8 || size > (long)sizeof buf || pps <= 0)
		return fprintf(stderr, "e2etool: bad size or rate\n"), 2;
	memset(buf, 0xa5, sizeof buf);
	int s = socket(AF_INET, SOCK_DGRAM, 0);
	if (s < 0)
		die("socket");
	bind_src(s, src);
	uint64_t start = now_ns(), step = 1000000000u / (uint64_t)pps;
	long failed = 0;
	for (long i = 0; i < count; i++) {
		uint64_t due = start + (uint64_t)i * step;
		struct timespec t = {(time_t)(due / 1000000000u), (long)(due % 1000000000u)};
		clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &t, NULL);
		uint64_t seq = (uint64_t)i;
		for (int b = 0; b < 8; b++)
			buf[b] = (unsigned char)(seq >> (56 - 8 * b));
		/* A send the kernel refuses (no route, no neighbour yet) is not
		 * retried: it counts as lost at the receiver, which is the point. */
		if (sendto(s, buf, (size_t)size, 0, (struct sockaddr *)&dst, sizeof dst) < 0)
			failed++;
	}
	printf("udp-send: %ld sent to %s:%s in %.1f s, %ld refused by the kernel\n", count, av[0], av[1],
	       (double)(now_ns() - start) / 1e9, failed);
	return failed != 0;
}

static int udp_recv(char **av)
{
	struct sockaddr_in me = addr_of(NULL, av[0]);
	long count = atol(av[1]), idle_ms = atol(av[2]);
	int s = socket(AF_INET, SOCK_DGRAM, 0);
	if (s < 0)
		die("socket");
	int big = 4 << 20;
	setsockopt(s, SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
	if (bind(s, (struct sockaddr *)&me, sizeof me) < 0)
		die("bind");
	unsigned char *seen = calloc((size_t)count + 1, 1);
	long got = 0, unique = 0, dup = 0, reordered = 0, outside = 0;
	uint64_t highest = 0;
	int any = 0;
	unsigned char buf[65536];
	/* Until the first datagram the wait is the whole alarm: the sender
	 * starts later than the receiver. */
	for (;;) {
		struct pollfd p = {s, POLLIN, 0};
		int wait = !any ? 55000 : (unique == count ? 500 : (int)idle_ms);
		int r = poll(&p, 1, wait);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		ssize_t n = recv(s, buf, sizeof buf, 0);
		if (n < 8)
			continue;
		uint64_t seq = 0;
		for (int b = 0; b < 8; b++)
			seq = seq << 8 | buf[b];
		got++;
		if (seq >= (uint64_t)count) {
			outside++;
			continue;
		}
		if (any && seq < highest)
			reordered++;
		if (!any || seq > highest)
			highest = seq;
		any = 1;
		if (seen[seq])
			dup++;
		else
			seen[seq] = 1, unique++;
	}
	long lost = count - unique;
	printf("udp: %ld received, %ld unique, %ld duplicated, %ld lost, %ld out of order, %ld unknown\n", got, unique,
	       dup, lost, reordered, outside);
	if (lost) {
		/* The first few gaps say when in the run they fell (a rekey?). */
		int shown = 0;
		printf("udp: first lost:");
		for (long i = 0; i < count && shown < 10; i++)
			if (!seen[i])
				printf(" %ld", i), shown++;
		printf("\n");
	}
	return lost != 0 || dup != 0 || outside != 0;
}

static uint64_t fnv(uint64_t h, const unsigned char *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		h = (h ^ p[i]) * 0x100000001b3u;
	return h;
}

static int tcp_serve(char **av)
{
	struct sockaddr_in me = addr_of(NULL, av[0]);
	int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	if (l < 0)
		die("socket");
	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (bind(l, (struct sockaddr *)&me, sizeof me) < 0 || listen(l, 1) < 0)
		die("bind/listen");
	int c = accept(l, NULL, NULL);
	if (c < 0)
		die("accept");
	unsigned char buf[65536];
	uint64_t h = 0xcbf29ce484222325u, total = 0;
	ssize_t n;
	while ((n = read(c, buf, sizeof buf)) > 0)
		h = fnv(h, buf, (size_t)n), total += (uint64_t)n;
	if (n < 0)
		die("read");
	char answer[64];
	int len = snprintf(answer, sizeof answer, "%llu %016llx\n", (unsigned long long)total, (unsigned long long)h);
	if (write(c, answer, (size_t)len) != len)
		die("write");
	close(c);
	printf("tcp-serve: %s", answer);
	return 0;
}

static int tcp_send(char **av, const char *src)
{
	struct sockaddr_in dst = addr_of(av[0], av[1]);
	long bytes = atol(av[2]);
	int s = socket(AF_INET, SOCK_STREAM, 0);
	if (s < 0)
		die("socket");
	bind_src(s, src);
	if (connect(s, (struct sockaddr *)&dst, sizeof dst) < 0)
		die("connect");
	uint64_t start = now_ns(), x = 0x9e3779b97f4a7c15u, h = 0xcbf29ce484222325u;
	unsigned char buf[16384];
	for (long left = bytes; left > 0;) {
		size_t n = left < (long)sizeof buf ? (size_t)left : sizeof buf;
		for (size_t i = 0; i < n; i++) {
			x ^= x << 13, x ^= x >> 7, x ^= x << 17;
			buf[i] = (unsigned char)x;
		}
		h = fnv(h, buf, n);
		for (size_t off = 0; off < n;) {
			ssize_t w = write(s, buf + off, n - off);
			if (w < 0)
				die("write");
			off += (size_t)w;
		}
		left -= (long)n;
	}
	shutdown(s, SHUT_WR);
	char answer[64] = {0};
	size_t have = 0;
	ssize_t n;
	while (have < sizeof answer - 1 && (n = read(s, answer + have, sizeof answer - 1 - have)) > 0)
		have += (size_t)n;
	char want[64];
	snprintf(want, sizeof want, "%ld %016llx\n", bytes, (unsigned long long)h);
	int ok = strcmp(answer, want) == 0;
	printf("tcp %s:%s: %ld bytes in %.2f s, %s\n", av[0], av[1], bytes, (double)(now_ns() - start) / 1e9,
	       ok ? "the far end read them all intact" : "MISMATCH");
	if (!ok)
		printf("tcp: sent \"%.*s\", the far end read \"%.*s\"\n", (int)strcspn(want, "\n"), want,
		       (int)strcspn(answer, "\n"), answer);
	return !ok;
}

int main(int argc, char **argv)
{
	alarm(60);
	if ((argc == 7 || argc == 8) && !strcmp(argv[1], "udp-send"))
		return udp_send(argv + 2, argc == 8 ? argv[7] : NULL);
	if (argc == 5 && !strcmp(argv[1], "udp-recv"))
		return udp_recv(argv + 2);
	if (argc == 3 && !strcmp(argv[1], "tcp-serve"))
		return tcp_serve(argv + 2);
	if ((argc == 5 || argc == 6) && !strcmp(argv[1], "tcp-send"))
		return tcp_send(argv + 2, argc == 6 ? argv[5] : NULL);
	fprintf(stderr, "usage: e2etool udp-send IP PORT COUNT PPS SIZE [SRC] | udp-recv PORT COUNT IDLE_MS |\n"
			"               tcp-serve PORT | tcp-send IP PORT BYTES [SRC]\n");
	return 2;
}
