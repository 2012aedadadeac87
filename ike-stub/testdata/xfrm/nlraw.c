/* nlraw: print NETLINK_XFRM datagrams in hex, one per line, in the form of
 * espgw's XFRM fixtures: "dump sa" / "dump policy" before each dump's
 * replies, then every notification of XFRMNLGRP_SA, _POLICY, _EXPIRE.
 * usage: nlraw [dump] [follow]  */
#include <linux/netlink.h>
#include <linux/xfrm.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <errno.h>

static unsigned char buf[1 << 18];

static void hexline(const unsigned char *p, ssize_t n) {
	for (ssize_t i = 0; i < n; i++) printf("%02x", p[i]);
	printf("\n");
	fflush(stdout);
}

static int ends(const unsigned char *p, ssize_t n) {
	struct nlmsghdr *h;
	for (h = (struct nlmsghdr *)p; NLMSG_OK(h, n); h = NLMSG_NEXT(h, n))
		if (h->nlmsg_type == NLMSG_DONE || h->nlmsg_type == NLMSG_ERROR) return 1;
	return 0;
}

static void dump(int type, const char *what) {
	int s = socket(AF_NETLINK, SOCK_RAW, NETLINK_XFRM);
	struct sockaddr_nl a = { .nl_family = AF_NETLINK };
	struct { struct nlmsghdr h; } req = { .h = { .nlmsg_len = NLMSG_LENGTH(0), .nlmsg_type = type,
		.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP, .nlmsg_seq = 1 } };
	if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) < 0) { perror("dump socket"); exit(1); }
	printf("dump %s\n", what);
	if (send(s, &req, req.h.nlmsg_len, 0) < 0) { perror("send"); exit(1); }
	for (;;) {
		ssize_t n = recv(s, buf, sizeof buf, 0);
		if (n < 0) { perror("recv dump"); exit(1); }
		hexline(buf, n);
		if (ends(buf, n)) break;
	}
	close(s);
}

int main(int argc, char **argv) {
	int do_dump = 0, follow = 0;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "dump")) do_dump = 1;
		if (!strcmp(argv[i], "follow")) follow = 1;
	}
	int s = socket(AF_NETLINK, SOCK_RAW, NETLINK_XFRM);
	struct sockaddr_nl a = { .nl_family = AF_NETLINK,
		.nl_groups = (1 << (XFRMNLGRP_SA - 1)) | (1 << (XFRMNLGRP_POLICY - 1)) | (1 << (XFRMNLGRP_EXPIRE - 1)) };
	if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) < 0) { perror("event socket"); return 1; }
	if (do_dump) { dump(XFRM_MSG_GETSA, "sa"); dump(XFRM_MSG_GETPOLICY, "policy"); }
	while (follow) {
		ssize_t n = recv(s, buf, sizeof buf, 0);
		if (n < 0) { if (errno == EINTR) continue; perror("recv"); return 1; }
		hexline(buf, n);
	}
	return 0;
}
