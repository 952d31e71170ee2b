/* The rsocket calls through the drop-in librdmacm.so.1 (tests/rsockets.rs runs this under
 * `softverbs run`): a forked client and the parent as server, one listener.
 *  1. blocking stream (the client's reply reader blocks in rrecv on another thread
 *     meanwhile, so the sends must not wait for it): 3 MiB with a position-dependent pattern through rsend, rwrite and
 *     rwritev in odd chunks, half-close (rshutdown SHUT_WR): the server reads it all in
 *     order, then end of stream (0); its reply, then 0 after its rclose;
 *  2. nonblocking: rconnect EINPROGRESS, rpoll POLLOUT, SO_ERROR 0, rrecv EAGAIN; rsend
 *     until EAGAIN while the server does not read (flow control), then the server reads
 *     exactly what was sent;
 *  3. rpoll over three rsockets and a pipe, then rselect: only the one written to is
 *     readable;
 *  4. rconnect to a port nobody listens on: ECONNREFUSED, blocking, and nonblocking
 *     through rpoll (POLLERR) and SO_ERROR;
 *  5. riomap on the server, riowrite from the client into it (and EINVAL outside it),
 *     visible once a later rsend arrives; riounmap; two adjacent mappings at offsets the
 *     server gives, one riowrite through both, EINVAL for one running past them; after
 *     the server unmaps the first (and says so), EINVAL into it and success into the other;
 *  6. a client SIGKILLed while connected: the server's rrecv fails with ECONNRESET.
 * Options and names are checked on the way. Every step prints "ok <step>"; any failure
 * exits non-zero with the reason. */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <poll.h>
#include <pthread.h>
#include <rdma/rsocket.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/select.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>
#include <fcntl.h>

#define BIG (3 << 20)
static int port;

#define CHECK(c, ...) do { if (!(c)) { fprintf(stderr, "%s:%d: ", __FILE__, __LINE__); \
	fprintf(stderr, __VA_ARGS__); fprintf(stderr, " (errno %d %s)\n", errno, strerror(errno)); \
	exit(1); } } while (0)

static unsigned char pat(size_t i) { return (unsigned char)(i * 7 + i / 251); }

static struct sockaddr_in addr(int p)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(p) };
	inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
	return a;
}

static int dial(int p)
{
	int s = rsocket(AF_INET, SOCK_STREAM, 0);
	CHECK(s >= 0, "rsocket");
	struct sockaddr_in a = addr(p);
	CHECK(rconnect(s, (struct sockaddr *)&a, sizeof a) == 0, "rconnect");
	return s;
}

static void read_all(int s, unsigned char *b, size_t n)
{
	size_t got = 0;
	while (got < n) {
		ssize_t r = rrecv(s, b + got, n - got, 0);
		CHECK(r > 0, "rrecv %zd after %zu of %zu", r, got, n);
		got += r;
	}
}

static void sync_write(int fd, long v) { CHECK(write(fd, &v, sizeof v) == sizeof v, "pipe"); }
static long sync_read(int fd) { long v; CHECK(read(fd, &v, sizeof v) == sizeof v, "pipe"); return v; }

static void *reply_reader(void *arg)
{
	int s = *(int *)arg;
	static long reply;
	read_all(s, (unsigned char *)&reply, sizeof reply);
	return &reply;
}

static void client(int to_srv, int from_srv)
{
	/* 1 */
	CHECK(sync_read(from_srv) == 1, "server listening");
	unsigned char *big = malloc(BIG);
	for (size_t i = 0; i < BIG; i++)
		big[i] = pat(i);
	int s = dial(port);
	struct sockaddr_in me; socklen_t ml = sizeof me;
	CHECK(rgetsockname(s, (struct sockaddr *)&me, &ml) == 0 && me.sin_family == AF_INET, "rgetsockname");
	pthread_t reader;
	CHECK(pthread_create(&reader, NULL, reply_reader, &s) == 0, "pthread_create");
	size_t off = 0, k = 0;
	while (off < BIG) {
		size_t n = 1 + (k * 7919) % 70000;
		if (n > BIG - off) n = BIG - off;
		ssize_t r;
		if (k % 3 == 0) {
			r = rsend(s, big + off, n, 0);
		} else if (k % 3 == 1) {
			r = rwrite(s, big + off, n);
		} else {
			struct iovec v[2] = { { big + off, n / 2 }, { big + off + n / 2, n - n / 2 } };
			r = rwritev(s, v, 2);
		}
		CHECK(r == (ssize_t)n, "send %zd of %zu", r, n);
		off += n; k++;
	}
	CHECK(rshutdown(s, SHUT_WR) == 0, "rshutdown");
	void *rp;
	CHECK(pthread_join(reader, &rp) == 0, "pthread_join");
	long reply = *(long *)rp;
	CHECK(reply == BIG, "reply %ld", reply);
	char c;
	CHECK(rrecv(s, &c, 1, 0) == 0, "EOF after the server's rclose");
	rclose(s);

	/* 2 */
	s = rsocket(AF_INET, SOCK_STREAM, 0);
	CHECK(rfcntl(s, F_SETFL, rfcntl(s, F_GETFL) | O_NONBLOCK) == 0, "rfcntl");
	CHECK(rfcntl(s, F_GETFL) & O_NONBLOCK, "O_NONBLOCK kept");
	struct sockaddr_in a = addr(port);
	int r = rconnect(s, (struct sockaddr *)&a, sizeof a);
	CHECK(r == 0 || errno == EINPROGRESS, "nonblocking rconnect");
	struct pollfd p = { .fd = s, .events = POLLOUT };
	CHECK(rpoll(&p, 1, 10000) == 1 && (p.revents & POLLOUT), "POLLOUT %x", p.revents);
	int err = -1; socklen_t el = sizeof err;
	CHECK(rgetsockopt(s, SOL_SOCKET, SO_ERROR, &err, &el) == 0 && err == 0, "SO_ERROR %d", err);
	CHECK(rrecv(s, &c, 1, 0) < 0 && errno == EAGAIN, "rrecv EAGAIN");
	size_t total = 0;
	for (;;) {
		ssize_t w = rsend(s, big + (total % (BIG / 2)), 8192, 0);
		if (w < 0) {
			CHECK(errno == EAGAIN, "nonblocking rsend");
			break;
		}
		total += w;
		CHECK(total < 64u << 20, "no flow control: %zu bytes accepted", total);
	}
	sync_write(to_srv, total);
	CHECK(sync_read(from_srv) == (long)total, "server read count");
	rclose(s);

	/* 3 */
	int m[3];
	for (int i = 0; i < 3; i++)
		m[i] = dial(port);
	sync_read(from_srv);
	CHECK(rsend(m[1], "x", 1, 0) == 1, "rsend on the middle one");
	sync_read(from_srv);
	for (int i = 0; i < 3; i++)
		rclose(m[i]);

	/* 4 */
	s = rsocket(AF_INET, SOCK_STREAM, 0);
	a = addr(port + 1);
	CHECK(rconnect(s, (struct sockaddr *)&a, sizeof a) < 0 && errno == ECONNREFUSED, "refused");
	rclose(s);
	s = rsocket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
	CHECK(rconnect(s, (struct sockaddr *)&a, sizeof a) < 0 && errno == EINPROGRESS, "EINPROGRESS");
	p.events = POLLOUT;
	p.fd = s;
	CHECK(rpoll(&p, 1, 10000) == 1 && (p.revents & POLLERR), "POLLERR %x", p.revents);
	el = sizeof err;
	CHECK(rgetsockopt(s, SOL_SOCKET, SO_ERROR, &err, &el) == 0 && err == ECONNREFUSED, "SO_ERROR %d", err);
	rclose(s);

	/* 5 */
	s = dial(port);
	long where = -1;
	read_all(s, (unsigned char *)&where, sizeof where);
	CHECK(where >= 0, "offset");
	CHECK(riowrite(s, big + 5, 65536, where, 0) == 65536, "riowrite");
	CHECK(riowrite(s, big, 16, where + 65536, 0) == (size_t)-1 && errno == EINVAL, "riowrite outside the mapping");
	CHECK(rsend(s, "d", 1, 0) == 1, "done");
	long two = -1;
	read_all(s, (unsigned char *)&two, sizeof two);
	CHECK(two == (1L << 30), "second offset %ld", two);
	CHECK(riowrite(s, big + 9, 16384, two, 0) == 16384, "riowrite through two adjacent mappings");
	CHECK(riowrite(s, big, 8192, two + 12288, 0) == (size_t)-1 && errno == EINVAL,
	      "riowrite running past the last mapping");
	CHECK(rsend(s, "e", 1, 0) == 1, "done 2");
	CHECK(rrecv(s, &c, 1, 0) == 1 && c == 'u', "unmapped");
	CHECK(riowrite(s, big, 16, two, 0) == (size_t)-1 && errno == EINVAL, "riowrite into an unmapped window");
	CHECK(riowrite(s, big + 1, 16, two + 8192, 0) == 16, "riowrite into the mapping left");
	CHECK(rsend(s, "f", 1, 0) == 1, "done 3");
	CHECK(rrecv(s, &c, 1, 0) == 0, "EOF 5");
	rclose(s);

	/* 6 */
	s = dial(port);
	CHECK(rsend(s, big, 100, 0) == 100, "rsend before dying");
	sync_write(to_srv, 5);
	pause();
}

int main(int argc, char **argv)
{
	port = argc > 1 ? atoi(argv[1]) : 7590;
	setvbuf(stdout, NULL, _IONBF, 0);
	int up[2], down[2];
	CHECK(pipe(up) == 0 && pipe(down) == 0, "pipe");
	pid_t kid = fork();
	if (kid == 0) {
		alarm(30);
		client(up[1], down[0]);
		return 0;
	}
	alarm(30);
	int l = rsocket(AF_INET, SOCK_STREAM, 0);
	CHECK(l >= 0, "rsocket");
	int one = 1, v = 0; socklen_t vl = sizeof v;
	CHECK(rsetsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0, "SO_REUSEADDR");
	CHECK(rgetsockopt(l, SOL_SOCKET, SO_REUSEADDR, &v, &vl) == 0 && v == 1, "SO_REUSEADDR back");
	int sz = 1 << 20;
	CHECK(rsetsockopt(l, SOL_SOCKET, SO_RCVBUF, &sz, sizeof sz) == 0, "SO_RCVBUF");
	CHECK(rsetsockopt(l, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) == 0, "TCP_NODELAY");
	int q = 64;
	CHECK(rsetsockopt(l, SOL_RDMA, RDMA_SQSIZE, &q, sizeof q) == 0, "RDMA_SQSIZE");
	vl = sizeof v;
	CHECK(rgetsockopt(l, SOL_RDMA, RDMA_SQSIZE, &v, &vl) == 0 && v == 64, "RDMA_SQSIZE back");
	struct linger lg = { 1, 0 };
	CHECK(rsetsockopt(l, SOL_SOCKET, SO_LINGER, &lg, sizeof lg) == 0, "SO_LINGER");
	CHECK(rsetsockopt(l, SOL_SOCKET, SO_BROADCAST, &one, sizeof one) < 0 && errno == ENOPROTOOPT, "unknown option");
	struct sockaddr_in a = addr(port);
	CHECK(rbind(l, (struct sockaddr *)&a, sizeof a) == 0, "rbind");
	CHECK(rlisten(l, 8) == 0, "rlisten");
	sync_write(down[1], 1);
	printf("ok options\n");

	/* 1 */
	struct sockaddr_in peer; socklen_t pl = sizeof peer;
	int s = raccept(l, (struct sockaddr *)&peer, &pl);
	CHECK(s >= 0, "raccept");
	CHECK(peer.sin_family == AF_INET && peer.sin_addr.s_addr == htonl(INADDR_LOOPBACK), "peer address");
	pl = sizeof peer;
	CHECK(rgetpeername(s, (struct sockaddr *)&peer, &pl) == 0 && peer.sin_addr.s_addr == htonl(INADDR_LOOPBACK), "rgetpeername");
	unsigned char *got = malloc(BIG);
	size_t n = 0;
	for (;;) {
		size_t want = 1 + (n * 31) % 50000;
		if (want > BIG + 1 - n) want = BIG + 1 - n;
		ssize_t r = (n & 1) ? rread(s, got + n, want) : rrecv(s, got + n, want, 0);
		CHECK(r >= 0, "rrecv at %zu", n);
		if (r == 0)
			break;
		n += r;
		CHECK(n <= BIG, "more than sent");
	}
	CHECK(n == BIG, "got %zu of %d", n, BIG);
	for (size_t i = 0; i < BIG; i++)
		CHECK(got[i] == pat(i), "byte %zu is %u, not %u", i, got[i], pat(i));
	long reply = BIG;
	CHECK(rsend(s, &reply, sizeof reply, 0) == sizeof reply, "reply");
	rclose(s);
	printf("ok blocking stream and end of stream\n");

	/* 2 */
	s = raccept(l, NULL, NULL);
	CHECK(s >= 0, "raccept 2");
	long total = sync_read(up[0]);
	CHECK(total > 0, "the client sent nothing before EAGAIN");
	read_all(s, got, total);
	for (long i = 0; i < total; i++)
		CHECK(got[i] == pat(i % (BIG / 2)), "nonblocking byte %ld", i);
	sync_write(down[1], total);
	char c;
	CHECK(rrecv(s, &c, 1, 0) == 0, "EOF 2");
	rclose(s);
	printf("ok nonblocking: %ld bytes before EAGAIN\n", total);

	/* 3 */
	int m[3];
	for (int i = 0; i < 3; i++)
		CHECK((m[i] = raccept(l, NULL, NULL)) >= 0, "raccept %d", i);
	struct pollfd pf[4] = { { m[0], POLLIN }, { m[1], POLLIN }, { m[2], POLLIN }, { up[0], POLLIN } };
	CHECK(rpoll(pf, 4, 200) == 0, "nothing readable yet");
	sync_write(down[1], 3);
	CHECK(rpoll(pf, 4, 10000) == 1, "one readable");
	CHECK(pf[1].revents == POLLIN && !pf[0].revents && !pf[2].revents && !pf[3].revents,
	      "revents %x %x %x %x", pf[0].revents, pf[1].revents, pf[2].revents, pf[3].revents);
	fd_set rs;
	FD_ZERO(&rs);
	for (int i = 0; i < 3; i++)
		FD_SET(m[i], &rs);
	struct timeval tv = { 5, 0 };
	CHECK(rselect(FD_SETSIZE, &rs, NULL, NULL, &tv) == 1 && FD_ISSET(m[1], &rs) && !FD_ISSET(m[0], &rs) && !FD_ISSET(m[2], &rs), "rselect");
	CHECK(rrecv(m[1], &c, 1, 0) == 1 && c == 'x', "the byte");
	sync_write(down[1], 3);
	for (int i = 0; i < 3; i++) {
		CHECK(rrecv(m[i], &c, 1, 0) == 0, "EOF on %d", i);
		rclose(m[i]);
	}
	printf("ok rpoll\n");

	/* 5 (4 happens in the client) */
	s = raccept(l, NULL, NULL);
	CHECK(s >= 0, "raccept 5");
	unsigned char *win = calloc(1, 65536);
	off_t where = riomap(s, win, 65536, PROT_WRITE, 0, -1);
	CHECK(where >= 0, "riomap");
	CHECK(where == (off_t)(uintptr_t)win, "offset -1 is the buffer's address (rdma-core's choice)");
	long w = where;
	CHECK(rsend(s, &w, sizeof w, 0) == sizeof w, "send offset");
	CHECK(rrecv(s, &c, 1, 0) == 1 && c == 'd', "done");
	for (int i = 0; i < 65536; i++)
		CHECK(win[i] == pat(i + 5), "iomapped byte %d", i);
	CHECK(riounmap(s, win, 65536) == 0, "riounmap");
	/* Two adjacent mappings at offsets of the program's choosing, one riowrite through both;
	 * then the first unmapped: the client's writes into it fail, into the second land. */
	unsigned char *two = calloc(1, 16384);
	CHECK(riomap(s, two, 8192, PROT_WRITE, 0, 1L << 30) == (1L << 30), "riomap at an offset");
	CHECK(riomap(s, two + 8192, 8192, PROT_WRITE, 0, (1L << 30) + 8192) == (1L << 30) + 8192,
	      "riomap adjacent");
	w = 1L << 30;
	CHECK(rsend(s, &w, sizeof w, 0) == sizeof w, "send offset 2");
	CHECK(rrecv(s, &c, 1, 0) == 1 && c == 'e', "done 2");
	for (int i = 0; i < 16384; i++)
		CHECK(two[i] == pat(i + 9), "byte %d of two mappings", i);
	CHECK(riounmap(s, two, 8192) == 0, "riounmap first");
	memset(two, 0, 16384);
	CHECK(rsend(s, "u", 1, 0) == 1, "unmapped");
	CHECK(rrecv(s, &c, 1, 0) == 1 && c == 'f', "done 3");
	for (int i = 0; i < 16; i++)
		CHECK(two[i] == 0 && two[8192 + i] == pat(i + 1), "byte %d after the unmap", i);
	CHECK(riounmap(s, two + 8192, 8192) == 0, "riounmap second");
	rclose(s);
	free(two);
	printf("ok riomap and riowrite\n");

	/* 6 */
	s = raccept(l, NULL, NULL);
	CHECK(s >= 0, "raccept 6");
	CHECK(sync_read(up[0]) == 5, "client ready");
	read_all(s, got, 100);
	printf("ok refused\n");
	kill(kid, SIGKILL);
	int st;
	waitpid(kid, &st, 0);
	CHECK(rrecv(s, &c, 1, 0) < 0 && errno == ECONNRESET, "ECONNRESET after the peer's death");
	struct pollfd pk = { s, POLLIN };
	CHECK(rpoll(&pk, 1, 1000) == 1 && (pk.revents & (POLLERR | POLLHUP)), "POLLERR/POLLHUP %x", pk.revents);
	rclose(s);
	rclose(l);
	printf("ok peer killed\n");
	return 0;
}
