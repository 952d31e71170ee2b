/* rdma_migrate_id(3) through the drop-in librdmacm.so.1 (tests/migrate.rs runs this under
 * `softverbs run`), one process playing both sides on 127.0.0.1:PORT:
 *  1. a listener is migrated to a second channel before any connect request, and its
 *     first channel destroyed: the connect request arrives on the second channel;
 *  2. the connecting id's connect response is queued, unread, on its channel when the id is
 *     migrated to a new one and the old channel destroyed: reading the new channel gives
 *     the ESTABLISHED (the old one's fd stopped being readable before it went), then the
 *     passive side is established too; the connection still carries a SEND;
 *  3. the migrated id disconnects: DISCONNECTED arrives on the new channel (and on the
 *     listener's channel for the passive side);
 *  4. an id migrated to NULL is synchronous: rdma_resolve_addr returns once resolved and
 *     queues nothing on its former channel.
 * Every step prints "ok <step>"; any failure exits non-zero with the reason. */
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CHECK(c, ...)                                                          \
	do {                                                                   \
		if (!(c)) {                                                    \
			fprintf(stderr, "line %d: %s: ", __LINE__, #c);        \
			fprintf(stderr, __VA_ARGS__);                          \
			fprintf(stderr, " (errno %d)\n", errno);               \
			exit(1);                                               \
		}                                                              \
	} while (0)

static int readable(struct rdma_event_channel *ch, int ms)
{
	struct pollfd p = {.fd = ch->fd, .events = POLLIN};
	return poll(&p, 1, ms) == 1 && (p.revents & POLLIN);
}

/* The next event on `ch` (within 10 s) must be `want` for `id`; returns the event's
 * listen_id (or the id for other events) after acking it, or the new id of a connect
 * request through `child`. */
static void expect(struct rdma_event_channel *ch, enum rdma_cm_event_type want,
		   struct rdma_cm_id *id, struct rdma_cm_id **child)
{
	struct rdma_cm_event *e;
	CHECK(readable(ch, 10000), "no event on the channel, waiting for %s",
	      rdma_event_str(want));
	CHECK(rdma_get_cm_event(ch, &e) == 0, "rdma_get_cm_event");
	CHECK(e->event == want, "got %s (status %d), wanted %s",
	      rdma_event_str(e->event), e->status, rdma_event_str(want));
	if (want == RDMA_CM_EVENT_CONNECT_REQUEST) {
		CHECK(e->listen_id == id, "connect request for another listener");
		CHECK(e->id->channel == ch, "the new id is not on the listener's channel");
		*child = e->id;
	} else {
		CHECK(e->id == id, "%s for another id", rdma_event_str(want));
	}
	rdma_ack_cm_event(e);
}

static struct sockaddr_in addr(int port)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
	inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
	return a;
}

static void make_qp(struct rdma_cm_id *id)
{
	struct ibv_qp_init_attr qa = {
		.cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1,
			.max_recv_sge = 1},
		.qp_type = IBV_QPT_RC,
		.sq_sig_all = 1,
	};
	CHECK(rdma_create_qp(id, NULL, &qa) == 0, "rdma_create_qp");
}

int main(int argc, char **argv)
{
	int port = argc > 1 ? atoi(argv[1]) : 7590;
	struct sockaddr_in sa = addr(port);
	struct rdma_cm_id *l, *c, *s, *x;
	struct ibv_wc wc;
	char rbuf[16] = {0}, sbuf[16] = "migrated";
	alarm(50);

	/* 1. */
	struct rdma_event_channel *l1 = rdma_create_event_channel();
	struct rdma_event_channel *l2 = rdma_create_event_channel();
	CHECK(l1 && l2, "rdma_create_event_channel");
	CHECK(rdma_create_id(l1, &l, NULL, RDMA_PS_TCP) == 0, "rdma_create_id");
	CHECK(rdma_bind_addr(l, (struct sockaddr *)&sa) == 0, "rdma_bind_addr");
	CHECK(rdma_listen(l, 4) == 0, "rdma_listen");
	CHECK(rdma_migrate_id(l, l2) == 0, "rdma_migrate_id(listener)");
	CHECK(l->channel == l2, "listener's channel after migration");
	rdma_destroy_event_channel(l1);

	struct rdma_event_channel *c1 = rdma_create_event_channel();
	CHECK(c1, "rdma_create_event_channel");
	CHECK(rdma_create_id(c1, &c, NULL, RDMA_PS_TCP) == 0, "rdma_create_id");
	CHECK(rdma_resolve_addr(c, NULL, (struct sockaddr *)&sa, 2000) == 0,
	      "rdma_resolve_addr");
	expect(c1, RDMA_CM_EVENT_ADDR_RESOLVED, c, NULL);
	CHECK(rdma_resolve_route(c, 2000) == 0, "rdma_resolve_route");
	expect(c1, RDMA_CM_EVENT_ROUTE_RESOLVED, c, NULL);
	make_qp(c);
	struct ibv_mr *rmr = rdma_reg_msgs(c, rbuf, sizeof rbuf);
	CHECK(rmr, "rdma_reg_msgs");
	CHECK(rdma_post_recv(c, NULL, rbuf, sizeof rbuf, rmr) == 0, "rdma_post_recv");
	struct rdma_conn_param cp = {.retry_count = 7, .rnr_retry_count = 7};
	CHECK(rdma_connect(c, &cp) == 0, "rdma_connect");
	expect(l2, RDMA_CM_EVENT_CONNECT_REQUEST, l, &s);
	make_qp(s);
	CHECK(rdma_accept(s, NULL) == 0, "rdma_accept");
	printf("ok listener migrated before the connect request\n");

	/* 2. The REP waits on c1 unread: as with rdma-core, the library answers it (QP to RTS,
	 * the RTU) when the program reads it, so the passive side is established only then. */
	CHECK(readable(c1, 10000), "the client's connect response never queued");
	struct rdma_event_channel *c2 = rdma_create_event_channel();
	CHECK(c2, "rdma_create_event_channel");
	CHECK(rdma_migrate_id(c, c2) == 0, "rdma_migrate_id(connected id)");
	CHECK(c->channel == c2, "the id's channel after migration");
	CHECK(!readable(c1, 0), "the old channel still readable after the migration");
	rdma_destroy_event_channel(c1);
	expect(c2, RDMA_CM_EVENT_ESTABLISHED, c, NULL);
	expect(l2, RDMA_CM_EVENT_ESTABLISHED, s, NULL);
	struct ibv_mr *smr = rdma_reg_msgs(s, sbuf, sizeof sbuf);
	CHECK(smr, "rdma_reg_msgs");
	CHECK(rdma_post_send(s, NULL, sbuf, sizeof sbuf, smr, 0) == 0, "rdma_post_send");
	CHECK(rdma_get_send_comp(s, &wc) == 1 && wc.status == IBV_WC_SUCCESS,
	      "send completion %d", wc.status);
	CHECK(rdma_get_recv_comp(c, &wc) == 1 && wc.status == IBV_WC_SUCCESS,
	      "receive completion %d", wc.status);
	CHECK(strcmp(rbuf, "migrated") == 0, "received \"%s\"", rbuf);
	printf("ok queued event moved with the connected id\n");

	/* 3. */
	CHECK(rdma_disconnect(c) == 0, "rdma_disconnect");
	expect(c2, RDMA_CM_EVENT_DISCONNECTED, c, NULL);
	expect(l2, RDMA_CM_EVENT_DISCONNECTED, s, NULL);
	printf("ok disconnected on the new channel\n");

	/* 4. */
	CHECK(rdma_create_id(l2, &x, NULL, RDMA_PS_TCP) == 0, "rdma_create_id");
	CHECK(rdma_migrate_id(x, NULL) == 0, "rdma_migrate_id(NULL)");
	CHECK(x->channel && x->channel != l2, "a synchronous id's channel");
	CHECK(rdma_resolve_addr(x, NULL, (struct sockaddr *)&sa, 2000) == 0,
	      "synchronous rdma_resolve_addr");
	CHECK(x->verbs != NULL, "resolved without a device");
	CHECK(!readable(l2, 200), "an event for the synchronous id on its old channel");
	printf("ok synchronous after migrating to NULL\n");

	rdma_dereg_mr(rmr);
	rdma_dereg_mr(smr);
	rdma_destroy_qp(s);
	rdma_destroy_qp(c);
	CHECK(rdma_destroy_id(s) == 0 && rdma_destroy_id(c) == 0 &&
		      rdma_destroy_id(l) == 0 && rdma_destroy_id(x) == 0,
	      "rdma_destroy_id");
	rdma_destroy_event_channel(c2);
	rdma_destroy_event_channel(l2);
	return 0;
}
