/*
 * vmtool: small helpers for the test VM's guest, built static by
 * scripts/vm/build.sh and installed as /bin/vmtool.
 *
 *   vmtool afalg [-v]   known-answer checks of the kernel crypto API through
 *                       AF_ALG sockets (hash, skcipher, aead, rng); prints one
 *                       PASS/FAIL line per check and a summary line
 *                       "== AF_ALG summary: N passed, M failed, K skipped ==";
 *                       exit status 0 iff nothing failed
 *   vmtool natt PORT    bind a UDP socket on PORT with UDP_ENCAP_ESPINUDP and
 *                       sleep: the kernel only decapsulates ESP in UDP that
 *                       arrives on such a socket (manually keyed SAs with
 *                       "encap espinudp" need one)
 *
 * Expected values: SHA-1("abc") (FIPS 180), HMAC-SHA-1 and HMAC-SHA-256 of
 * "what do ya want for nothing?" under "Jefe" (RFC 2202, RFC 4231), AES-CBC
 * (SP 800-38A F.2.1), AES-GCM with zero key, IV and plaintext (the GCM
 * specification's test case 2). The ESP-shaped AEAD and authenc checks use
 * values computed independently with python3-cryptography (keys are byte
 * sequences 00 01 02 ..., see build notes in scripts/vm/README.md).
 *
 * AF_ALG rules these checks follow (the 6.1 kernel):
 *   - read exactly the size of the result; a larger read blocks forever;
 *   - aead input is AAD || text, output AAD || text' (|| ICV when encrypting);
 *   - rfc4106(gcm(aes)) and rfc7539esp(chacha20,poly1305) take key || 4-byte
 *     salt, an 8-byte IV through ALG_SET_IV, and that IV again at the end of
 *     the AAD (assoclen = 8 + 8 here);
 *   - authenc(hmac(H),cbc(C)) takes an rtattr {CRYPTO_AUTHENC_KEYA_PARAM,
 *     be32 enckeylen} followed by the auth key and the cipher key; its ICV is
 *     HMAC(AAD || ciphertext) truncated to the authsize;
 *   - stdrng must be seeded (ALG_SET_KEY) before it reads.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <linux/if_alg.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#ifndef SOL_ALG
#define SOL_ALG 279
#endif
#ifndef UDP_ENCAP
#define UDP_ENCAP 100
#endif
#ifndef UDP_ENCAP_ESPINUDP
#define UDP_ENCAP_ESPINUDP 2
#endif

static int verbose, n_pass, n_fail, n_skip;

static size_t unhex(const char *s, uint8_t *out)
{
	size_t n = 0;
	while (s[0] && s[1]) {
		unsigned v;
		sscanf(s, "%2x", &v);
		out[n++] = (uint8_t)v;
		s += 2;
	}
	return n;
}

static void seq(uint8_t *out, int start, size_t n)
{
	for (size_t i = 0; i < n; i++)
		out[i] = (uint8_t)(start + i);
}

static void hexdump(const char *what, const uint8_t *b, size_t n)
{
	printf("     %s ", what);
	for (size_t i = 0; i < n; i++)
		printf("%02x", b[i]);
	printf("\n");
}

static void verdict(const char *name, int ok, const char *why)
{
	if (ok > 0) {
		n_pass++;
		printf("PASS %s\n", name);
	} else if (ok == 0) {
		n_fail++;
		printf("FAIL %s%s%s\n", name, why ? ": " : "", why ? why : "");
	} else {
		n_skip++;
		printf("SKIP %s%s%s\n", name, why ? ": " : "", why ? why : "");
	}
}

/* A bound, keyed transform socket; -1 with errno when the kernel refuses. */
static int tfm(const char *type, const char *name, const uint8_t *key, size_t keylen, int authsize)
{
	struct sockaddr_alg sa = {.salg_family = AF_ALG};
	int fd = socket(AF_ALG, SOCK_SEQPACKET, 0);
	if (fd < 0)
		return -1;
	snprintf((char *)sa.salg_type, sizeof sa.salg_type, "%s", type);
	snprintf((char *)sa.salg_name, sizeof sa.salg_name, "%s", name);
	if (bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0 ||
	    (key && setsockopt(fd, SOL_ALG, ALG_SET_KEY, key, keylen) < 0) ||
	    (authsize && setsockopt(fd, SOL_ALG, ALG_SET_AEAD_AUTHSIZE, NULL, authsize) < 0)) {
		int e = errno;
		close(fd);
		errno = e;
		return -1;
	}
	return fd;
}

/*
 * One operation on an op socket of TFM: send IN (with op, IV and assoclen in
 * control messages), read exactly OUTLEN bytes. Returns the bytes read or -1.
 */
static ssize_t crypt_op(int tfmfd, int op, const uint8_t *iv, size_t ivlen, int assoclen,
			const uint8_t *in, size_t inlen, uint8_t *out, size_t outlen)
{
	char cbuf[CMSG_SPACE(4) + CMSG_SPACE(4 + 32) + CMSG_SPACE(4)];
	struct iovec iov = {.iov_base = (void *)in, .iov_len = inlen};
	struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf};
	struct cmsghdr *c;
	ssize_t n;
	int fd = accept(tfmfd, NULL, 0);
	if (fd < 0)
		return -1;
	memset(cbuf, 0, sizeof cbuf);
	msg.msg_controllen = CMSG_SPACE(4) + (iv ? CMSG_SPACE(4 + ivlen) : 0) +
			     (assoclen >= 0 ? CMSG_SPACE(4) : 0);
	c = CMSG_FIRSTHDR(&msg);
	c->cmsg_level = SOL_ALG;
	c->cmsg_type = ALG_SET_OP;
	c->cmsg_len = CMSG_LEN(4);
	*(uint32_t *)CMSG_DATA(c) = op;
	if (iv) {
		struct af_alg_iv *a;
		c = CMSG_NXTHDR(&msg, c);
		c->cmsg_level = SOL_ALG;
		c->cmsg_type = ALG_SET_IV;
		c->cmsg_len = CMSG_LEN(4 + ivlen);
		a = (struct af_alg_iv *)CMSG_DATA(c);
		a->ivlen = ivlen;
		memcpy(a->iv, iv, ivlen);
	}
	if (assoclen >= 0) {
		c = CMSG_NXTHDR(&msg, c);
		c->cmsg_level = SOL_ALG;
		c->cmsg_type = ALG_SET_AEAD_ASSOCLEN;
		c->cmsg_len = CMSG_LEN(4);
		*(uint32_t *)CMSG_DATA(c) = assoclen;
	}
	n = sendmsg(fd, &msg, 0);
	if (n == (ssize_t)inlen)
		n = read(fd, out, outlen);
	else if (n >= 0) {
		errno = EIO;
		n = -1;
	}
	int e = errno;
	close(fd);
	errno = e;
	return n;
}

static void check_hash(const char *name, const char *alg, const char *key, const char *msg, const char *want)
{
	uint8_t k[64], w[64], got[64];
	size_t kl = key ? strlen(key) : 0, wl = unhex(want, w);
	int t, fd;
	memcpy(k, key ? key : "", kl);
	t = tfm("hash", alg, key ? k : NULL, kl, 0);
	if (t < 0) {
		verdict(name, errno == ENOENT ? -1 : 0, strerror(errno));
		return;
	}
	fd = accept(t, NULL, 0);
	int ok = fd >= 0 && write(fd, msg, strlen(msg)) == (ssize_t)strlen(msg) &&
		 read(fd, got, wl) == (ssize_t)wl && memcmp(got, w, wl) == 0;
	if (verbose)
		hexdump(alg, got, wl);
	verdict(name, ok, ok ? NULL : "wrong digest");
	if (fd >= 0)
		close(fd);
	close(t);
}

/* skcipher: encrypt PT, compare with CT, decrypt back. */
static void check_cipher(const char *name, const char *alg, const uint8_t *key, size_t kl,
			 const uint8_t *iv, size_t ivl, const uint8_t *pt, const char *want)
{
	uint8_t w[256], got[256], back[256];
	size_t n = unhex(want, w);
	int t = tfm("skcipher", alg, key, kl, 0);
	if (t < 0) {
		verdict(name, errno == ENOENT ? -1 : 0, strerror(errno));
		return;
	}
	int ok = crypt_op(t, ALG_OP_ENCRYPT, iv, ivl, -1, pt, n, got, n) == (ssize_t)n &&
		 memcmp(got, w, n) == 0 &&
		 crypt_op(t, ALG_OP_DECRYPT, iv, ivl, -1, got, n, back, n) == (ssize_t)n &&
		 memcmp(back, pt, n) == 0;
	if (verbose)
		hexdump(alg, got, n);
	verdict(name, ok, ok ? NULL : "wrong output");
	close(t);
}

/*
 * aead: encrypt AAD || PT (PTLEN bytes), compare text' || ICV with WANT,
 * decrypt it back, then flip one ICV bit and expect EBADMSG.
 */
static void check_aead(const char *name, const char *alg, const uint8_t *key, size_t kl, int authsize,
		       const uint8_t *iv, size_t ivl, const uint8_t *aad, size_t al,
		       const uint8_t *pt, size_t ptlen, const char *want)
{
	uint8_t w[256], in[512], out[512];
	size_t wl = unhex(want, w);
	int t = tfm("aead", alg, key, kl, authsize);
	const char *why = "wrong ciphertext or ICV";
	int ok = 0;
	if (t < 0) {
		verdict(name, errno == ENOENT ? -1 : 0, strerror(errno));
		return;
	}
	memcpy(in, aad, al);
	memcpy(in + al, pt, ptlen);
	if (crypt_op(t, ALG_OP_ENCRYPT, iv, ivl, al, in, al + ptlen, out, al + ptlen + authsize) ==
		    (ssize_t)(al + ptlen + authsize) &&
	    wl == ptlen + authsize && memcmp(out + al, w, wl) == 0) {
		if (verbose)
			hexdump(alg, out + al, wl);
		memcpy(in + al, w, wl);
		why = "decryption did not give the plaintext back";
		if (crypt_op(t, ALG_OP_DECRYPT, iv, ivl, al, in, al + wl, out, al + ptlen) ==
			    (ssize_t)(al + ptlen) &&
		    memcmp(out + al, pt, ptlen) == 0) {
			in[al + wl - 1] ^= 1;
			why = "a forged ICV was accepted";
			ok = crypt_op(t, ALG_OP_DECRYPT, iv, ivl, al, in, al + wl, out, al + ptlen) < 0 &&
			     errno == EBADMSG;
		}
	} else if (verbose) {
		hexdump(alg, out + al, ptlen + authsize);
	}
	verdict(name, ok, ok ? NULL : why);
	close(t);
}

static void check_rng(void)
{
	uint8_t seed[32], a[32], b[32];
	int t, fd;
	seq(seed, 0x55, sizeof seed);
	t = tfm("rng", "stdrng", seed, sizeof seed, 0);
	if (t < 0) {
		verdict("rng stdrng", errno == ENOENT ? -1 : 0, strerror(errno));
		return;
	}
	fd = accept(t, NULL, 0);
	int ok = fd >= 0 && read(fd, a, sizeof a) == sizeof a && read(fd, b, sizeof b) == sizeof b &&
		 memcmp(a, b, sizeof a) != 0;
	verdict("rng stdrng", ok, ok ? NULL : "no distinct output");
	if (fd >= 0)
		close(fd);
	close(t);
}

/* authenc key blob: rtattr {len 8, type 1 (KEYA_PARAM)}, be32 enckeylen, authkey, enckey */
static size_t authenc_key(uint8_t *out, const uint8_t *ak, size_t akl, const uint8_t *ek, size_t ekl)
{
	uint16_t len = 8, type = 1;
	uint32_t be = htonl((uint32_t)ekl);
	memcpy(out, &len, 2);
	memcpy(out + 2, &type, 2);
	memcpy(out + 4, &be, 4);
	memcpy(out + 8, ak, akl);
	memcpy(out + 8 + akl, ek, ekl);
	return 8 + akl + ekl;
}

static int afalg(void)
{
	uint8_t key[64], key2[64], blob[128], iv[16], pt[32], aad[16], zero[16] = {0};
	int s = socket(AF_ALG, SOCK_SEQPACKET, 0);
	if (s < 0) {
		printf("AF_ALG unavailable: %s\n", strerror(errno));
		printf("== AF_ALG summary: 0 passed, 1 failed, 0 skipped ==\n");
		return 1;
	}
	close(s);

	check_hash("hash sha1", "sha1", NULL, "abc", "a9993e364706816aba3e25717850c26c9cd0d89d");
	check_hash("hash hmac(sha1)", "hmac(sha1)", "Jefe", "what do ya want for nothing?",
		   "effcdf6ae5eb2fa2d27416d5f184df9c259a7c79");
	check_hash("hash hmac(sha256)", "hmac(sha256)", "Jefe", "what do ya want for nothing?",
		   "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");

	unhex("2b7e151628aed2a6abf7158809cf4f3c", key);
	unhex("000102030405060708090a0b0c0d0e0f", iv);
	unhex("6bc1bee22e409f96e93d7e117393172a", pt);
	check_cipher("skcipher cbc(aes)", "cbc(aes)", key, 16, iv, 16, pt, "7649abac8119b246cee98e9b12e9197d");
	seq(key, 0, 24);
	seq(iv, 0xa0, 8);
	seq(pt, 0x40, 32);
	check_cipher("skcipher cbc(des3_ede)", "cbc(des3_ede)", key, 24, iv, 8, pt, "86aac5edf2ea2761b18e2523d88a35a9");

	memset(iv, 0, 12);
	check_aead("aead gcm(aes)", "gcm(aes)", zero, 16, 16, iv, 12, NULL, 0, zero, 16,
		   "0388dace60b6a392f328c2b971b2fe78ab6e47d42cec13bdf53a67b21257bddf");

	/* ESP-shaped: AAD = SPI 0x1002 || seq 1, then the 8-byte IV a0..a7 */
	unhex("0000100200000001", aad);
	seq(iv, 0xa0, 8);
	memcpy(aad + 8, iv, 8);
	seq(key, 0, 20); /* AES-128 key 00..0f, salt 10..13 */
	check_aead("aead rfc4106(gcm(aes))", "rfc4106(gcm(aes))", key, 20, 16, iv, 8, aad, 16, pt, 32,
		   "92b8851c8a4e9b10c554b90f021f05d78e38211c4b5e9d4ebb403cf56fb37b05"
		   "b97b0948e8d6f7007b399c221b2c6ff4");
	seq(key, 0, 36); /* ChaCha20 key 00..1f, salt 20..23 */
	check_aead("aead rfc7539esp(chacha20,poly1305)", "rfc7539esp(chacha20,poly1305)", key, 36, 16, iv, 8,
		   aad, 16, pt, 32,
		   "c8a3dec008d13c4449c92351a50d65232b6e9826e86d4351ff16d1dd8d7215f6"
		   "1d5bd0530d02cd9af90a7a56293edb2f");

	/* authenc: AES-128 key 00..0f, IV a0..af, AAD = SPI || seq only */
	seq(key, 0, 16);
	seq(iv, 0xa0, 16);
	seq(key2, 0x10, 32);
	size_t bl = authenc_key(blob, key2, 20, key, 16);
	check_aead("aead authenc(hmac(sha1),cbc(aes))", "authenc(hmac(sha1),cbc(aes))", blob, bl, 12, iv, 16,
		   aad, 8, pt, 32,
		   "de8e8d962b69074b2a38943bad35bc52a42c8437314440fde66ba2283786396d"
		   "e513075e503aecc5e66a6b75");
	bl = authenc_key(blob, key2, 32, key, 16);
	check_aead("aead authenc(hmac(sha256),cbc(aes))", "authenc(hmac(sha256),cbc(aes))", blob, bl, 16, iv, 16,
		   aad, 8, pt, 32,
		   "de8e8d962b69074b2a38943bad35bc52a42c8437314440fde66ba2283786396d"
		   "00d5e5b759e70f84822d0f2296bc9b3f");
	check_rng();

	printf("== AF_ALG summary: %d passed, %d failed, %d skipped ==\n", n_pass, n_fail, n_skip);
	return n_fail != 0;
}

static int natt(int port)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
	int type = UDP_ENCAP_ESPINUDP;
	int fd = socket(AF_INET, SOCK_DGRAM, 0);
	if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) < 0 ||
	    setsockopt(fd, IPPROTO_UDP, UDP_ENCAP, &type, sizeof type) < 0) {
		perror("vmtool natt");
		return 1;
	}
	for (;;)
		pause();
}

int main(int argc, char **argv)
{
	if (argc >= 2 && strcmp(argv[1], "afalg") == 0) {
		verbose = argc >= 3 && strcmp(argv[2], "-v") == 0;
		return afalg();
	}
	if (argc == 3 && strcmp(argv[1], "natt") == 0)
		return natt(atoi(argv[2]));
	fprintf(stderr, "usage: vmtool afalg [-v] | vmtool natt PORT\n");
	return 2;
}
