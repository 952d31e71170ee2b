/* One side of an rdma_cm handshake that can stop at any step (tests/cm_kill.rs runs it
 * under `softverbs run` and SIGKILLs it at one of them).
 *
 *   cmsteps client|server ADDR PORT qp|noqp [STEP...]
 *
 * The client is the active side; with `noqp` its id has no QP, so the CONNECT_RESPONSE is
 * its event and it must call rdma_establish to send the RTU (rdma_establish(3)); with `qp`
 * the library brings its QP up and sends the RTU itself. The server is the passive side, an
 * id without a QP (the mode is ignored).
 *
 * At every step it prints "STEP <name>"; at the steps named on the command line it then
 * pauses: it goes on when a line arrives on stdin, and when an rdma_cm event arrives first
 * it prints "EVENT <name> <status>" and exits 3 (the peer went away). Steps, active:
 * resolved-addr, resolved-route, connect-sent, connect-response (noqp only), established,
 * disconnect-sent. Passive: listening, connect-request (the CONNECT_REQUEST held, not
 * answered), accepted (rdma_accept done, the RTU not yet seen), established. Every event it
 * waits for is printed the same way; an unexpected one exits 2. At the end it prints "DONE"
 * and exits 0. */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CHECK(c, ...) do { if (!(c)) { fprintf(stderr, "%s:%d: ", __FILE__, __LINE__); \
	fprintf(stderr, __VA_ARGS__); fprintf(stderr, " (errno %d %s)\n", errno, strerror(errno)); \
	exit(1); } } while (0)

static struct rdma_event_channel *ch;
static char **pauses;
static int npauses;

static void print_event(struct rdma_cm_event *e)
{
	printf("EVENT %s %d\n", rdma_event_str(e->event), e->status);
	fflush(stdout);
}

/* A step; where the test asked for a pause, a line on stdin goes on and an event ends
 * the program. */
static void step(const char *name)
{
	printf("STEP %s\n", name);
	fflush(stdout);
	int pause = 0;
	for (int i = 0; i < npauses; i++)
		pause |= strcmp(pauses[i], name) == 0;
	if (!pause)
		return;
	struct pollfd p[2] = { { .fd = 0, .events = POLLIN }, { .fd = ch->fd, .events = POLLIN } };
	/* Bounded: a test that forgets this process must not leave it forever. */
	int n = poll(p, 2, 60000);
	CHECK(n > 0, "paused at %s for 60 s", name);
	/* The go-ahead first: the test writes it before it lets the peer answer. */
	if (!(p[0].revents & (POLLIN | POLLHUP)) && (p[1].revents & POLLIN)) {
		struct rdma_cm_event *e;
		CHECK(rdma_get_cm_event(ch, &e) == 0, "rdma_get_cm_event");
		print_event(e);
		rdma_ack_cm_event(e);
		exit(3);
	}
	char line[64];
	CHECK(fgets(line, sizeof line, stdin) != NULL, "stdin closed at %s", name);
}

/* The next event, which must be `want` (with private data starting with `pd`, if given:
 * it lives until the event is acked); its id returned (a CONNECT_REQUEST's is new). */
static struct rdma_cm_id *expect(enum rdma_cm_event_type want, const char *pd)
{
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	CHECK(poll(&p, 1, 60000) == 1, "no %s within 60 s", rdma_event_str(want));
	struct rdma_cm_event *e;
	CHECK(rdma_get_cm_event(ch, &e) == 0, "rdma_get_cm_event");
	print_event(e);
	if (e->event != want) {
		printf("UNEXPECTED (wanted %s)\n", rdma_event_str(want));
		fflush(stdout);
		exit(2);
	}
	struct rdma_cm_id *id = e->id;
	if (pd)
		CHECK(e->param.conn.private_data_len >= strlen(pd) + 1 &&
		      memcmp(e->param.conn.private_data, pd, strlen(pd) + 1) == 0,
		      "private data of %s", rdma_event_str(want));
	rdma_ack_cm_event(e);
	return id;
}

static struct sockaddr_storage addr(const char *host, const char *port)
{
	struct addrinfo *ai, hints = { .ai_flags = AI_NUMERICHOST, .ai_socktype = SOCK_STREAM };
	CHECK(getaddrinfo(host, port, &hints, &ai) == 0, "getaddrinfo %s", host);
	struct sockaddr_storage s;
	memset(&s, 0, sizeof s);
	memcpy(&s, ai->ai_addr, ai->ai_addrlen);
	freeaddrinfo(ai);
	return s;
}

static void client(const char *host, const char *port, int with_qp)
{
	struct rdma_cm_id *id;
	CHECK(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0, "rdma_create_id");
	struct sockaddr_storage dst = addr(host, port);
	CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 2000) == 0, "rdma_resolve_addr");
	expect(RDMA_CM_EVENT_ADDR_RESOLVED, NULL);
	step("resolved-addr");
	CHECK(rdma_resolve_route(id, 2000) == 0, "rdma_resolve_route");
	expect(RDMA_CM_EVENT_ROUTE_RESOLVED, NULL);
	step("resolved-route");
	struct rdma_conn_param cp = { .responder_resources = 1, .initiator_depth = 1,
		.retry_count = 7, .rnr_retry_count = 7, .private_data = "cmsteps",
		.private_data_len = 8 };
	if (with_qp) {
		struct ibv_pd *pd = ibv_alloc_pd(id->verbs);
		CHECK(pd, "ibv_alloc_pd");
		struct ibv_cq *cq = ibv_create_cq(id->verbs, 4, NULL, NULL, 0);
		CHECK(cq, "ibv_create_cq");
		struct ibv_qp_init_attr qa = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
			.cap = { .max_send_wr = 2, .max_recv_wr = 2, .max_send_sge = 1,
				 .max_recv_sge = 1 } };
		CHECK(rdma_create_qp(id, pd, &qa) == 0, "rdma_create_qp");
	} else {
		cp.qp_num = 0x1234;
	}
	CHECK(rdma_connect(id, &cp) == 0, "rdma_connect");
	step("connect-sent");
	if (with_qp) {
		expect(RDMA_CM_EVENT_ESTABLISHED, "accept!");
	} else {
		expect(RDMA_CM_EVENT_CONNECT_RESPONSE, "accept!");
		step("connect-response");
		CHECK(rdma_establish(id) == 0, "rdma_establish");
	}
	step("established");
	CHECK(rdma_disconnect(id) == 0, "rdma_disconnect");
	step("disconnect-sent");
	expect(RDMA_CM_EVENT_DISCONNECTED, NULL);
	if (id->qp)
		rdma_destroy_qp(id);
	CHECK(rdma_destroy_id(id) == 0, "rdma_destroy_id");
}

static void server(const char *host, const char *port)
{
	struct rdma_cm_id *lid;
	CHECK(rdma_create_id(ch, &lid, NULL, RDMA_PS_TCP) == 0, "rdma_create_id");
	struct sockaddr_storage src = addr(host, port);
	CHECK(rdma_bind_addr(lid, (struct sockaddr *)&src) == 0, "rdma_bind_addr");
	CHECK(rdma_listen(lid, 4) == 0, "rdma_listen");
	step("listening");
	struct rdma_cm_id *id = expect(RDMA_CM_EVENT_CONNECT_REQUEST, "cmsteps");
	step("connect-request");
	struct rdma_conn_param cp = { .responder_resources = 1, .initiator_depth = 1,
		.rnr_retry_count = 7, .qp_num = 0x4321, .private_data = "accept!",
		.private_data_len = 8 };
	CHECK(rdma_accept(id, &cp) == 0, "rdma_accept");
	step("accepted");
	expect(RDMA_CM_EVENT_ESTABLISHED, NULL);
	step("established");
	expect(RDMA_CM_EVENT_DISCONNECTED, NULL);
	CHECK(rdma_destroy_id(id) == 0, "rdma_destroy_id");
	CHECK(rdma_destroy_id(lid) == 0, "rdma_destroy_id listener");
}

int main(int argc, char **argv)
{
	CHECK(argc >= 5, "usage: cmsteps client|server ADDR PORT qp|noqp [STEP...]");
	pauses = argv + 5;
	npauses = argc - 5;
	ch = rdma_create_event_channel();
	CHECK(ch, "rdma_create_event_channel");
	if (strcmp(argv[1], "client") == 0)
		client(argv[2], argv[3], strcmp(argv[4], "qp") == 0);
	else
		server(argv[2], argv[3]);
	rdma_destroy_event_channel(ch);
	printf("DONE\n");
	return 0;
}
