/* Completion channels and async events as rdma-core documents them (ibv_get_cq_event(3),
 * ibv_get_async_event(3), ibv_create_comp_channel(3)): blocking and non-blocking fds, one event
 * per arming, acknowledgement, and destroy waiting for the acks of the events it handed out.
 * Run with `softverbs run` (which exports SOFTVERBS_DAEMON_BIN and SOFTVERBS_SOCKET, used here to
 * inject async events as the NIC would). Prints "ok NAME" per check and a summary. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#include "check.h"

static unsigned char buf[4096];

/* One message from `a` to `b`: a receive on b, a signaled send on a. */
static void send_one(struct ibv_qp *a, struct ibv_qp *b, struct ibv_mr *mr)
{
	struct ibv_sge rs = { .addr = (uintptr_t)buf, .length = 64, .lkey = mr->lkey };
	struct ibv_sge ss = { .addr = (uintptr_t)buf + 64, .length = 64, .lkey = mr->lkey };
	struct ibv_recv_wr rwr = { .wr_id = 1, .sg_list = &rs, .num_sge = 1 }, *rbad;
	struct ibv_send_wr swr = { .wr_id = 2, .sg_list = &ss, .num_sge = 1,
				   .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED }, *sbad;

	if (ibv_post_recv(b, &rwr, &rbad) || ibv_post_send(a, &swr, &sbad))
		fatal("post");
}

/* Polls until `n` completions arrived. */
static void drain(struct ibv_cq *cq, int n)
{
	struct ibv_wc wc[4];

	while (n > 0) {
		int k = ibv_poll_cq(cq, 4, wc);

		if (k < 0)
			fatal("ibv_poll_cq");
		for (int i = 0; i < k; i++)
			if (wc[i].status != IBV_WC_SUCCESS)
				fatal(ibv_wc_status_str(wc[i].status));
		n -= k;
	}
}

static int readable(int fd, int ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };

	return poll(&p, 1, ms) == 1 && (p.revents & POLLIN);
}

static void inject(const char *args)
{
	char cmd[512];
	const char *bin = getenv("SOFTVERBS_DAEMON_BIN");
	const char *sock = getenv("SOFTVERBS_SOCKET");

	if (!bin || !sock)
		fatal("run me with softverbs run");
	snprintf(cmd, sizeof(cmd), "%s --socket %s inject-event %s >/dev/null", bin, sock, args);
	if (system(cmd) != 0)
		fatal(cmd);
}

struct destroyer {
	int (*fn)(void *);
	void *obj;
	volatile int done;
	int ret;
};

static int destroy_cq_fn(void *o) { return ibv_destroy_cq(o); }
static int destroy_qp_fn(void *o) { return ibv_destroy_qp(o); }

static void *destroy_thread(void *arg)
{
	struct destroyer *d = arg;

	d->ret = d->fn(d->obj);
	__atomic_store_n(&d->done, 1, __ATOMIC_SEQ_CST);
	return NULL;
}

int main(void)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_mr *mr;
	struct ibv_comp_channel *ch;
	struct ibv_cq *cq, *ev_cq, *cq2;
	struct ibv_qp *a, *b, *c;
	struct ibv_async_event ev;
	union ibv_gid gid;
	void *ev_ctx;
	int marker = 7;
	pthread_t t;
	struct destroyer d;

	if (!list || !list[0] || !(ctx = ibv_open_device(list[0])))
		fatal("open");
	ibv_free_device_list(list);
	if (ibv_query_gid(ctx, 1, 0, &gid))
		fatal("gid");
	pd = ibv_alloc_pd(ctx);
	mr = pd ? ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE) : NULL;
	ch = ibv_create_comp_channel(ctx);
	cq = ch ? ibv_create_cq(ctx, 16, &marker, ch, 0) : NULL;
	if (!mr || !cq)
		fatal("setup");
	check("channel_refcnt_counts_cqs", ch->refcnt == 1, "refcnt after one CQ");
	a = new_rc_qp(pd, cq, 8, 1);
	b = new_rc_qp(pd, cq, 8, 1);
	connect_rc(a, &gid, b->qp_num, IBV_ACCESS_LOCAL_WRITE);
	connect_rc(b, &gid, a->qp_num, IBV_ACCESS_LOCAL_WRITE);

	/* A blocking channel: the armed CQ's next completion is one event naming the CQ. */
	if (ibv_req_notify_cq(cq, 0))
		fatal("req_notify");
	send_one(a, b, mr);
	ev_cq = NULL;
	ev_ctx = NULL;
	check("get_cq_event_blocks_then_names_the_cq",
	      ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == 0 && ev_cq == cq && ev_ctx == &marker,
	      "wrong CQ or context");
	drain(cq, 2);

	/* Not re-armed: no second event, and a non-blocking channel says EAGAIN. */
	if (fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK))
		fatal("fcntl");
	send_one(a, b, mr);
	drain(cq, 2);
	errno = 0;
	check("unarmed_cq_raises_no_event",
	      ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == -1 && errno == EAGAIN, "an event came");
	check("nonblocking_channel_fd_not_readable", !readable(ch->fd, 0), "readable");

	/* Re-armed: the fd becomes readable, and the event is there. */
	if (ibv_req_notify_cq(cq, 0))
		fatal("req_notify");
	send_one(a, b, mr);
	check("channel_fd_becomes_readable", readable(ch->fd, 10000), "never readable");
	check("get_cq_event_nonblocking",
	      ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == 0 && ev_cq == cq, "no event");
	drain(cq, 2);

	/* Solicited-only arming ignores an unsolicited completion. */
	if (ibv_req_notify_cq(cq, 1))
		fatal("req_notify solicited");
	send_one(a, b, mr);
	drain(cq, 2);
	usleep(100000);
	check("solicited_only_ignores_unsolicited",
	      ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == -1 && errno == EAGAIN, "an event came");

	/* Two events handed out, none acknowledged: destroy_cq waits for the acks. */
	if (ibv_destroy_qp(a) || ibv_destroy_qp(b))
		fatal("destroy qps");
	d = (struct destroyer){ .fn = destroy_cq_fn, .obj = cq };
	pthread_create(&t, NULL, destroy_thread, &d);
	usleep(300000);
	check("destroy_cq_waits_for_acks", !__atomic_load_n(&d.done, __ATOMIC_SEQ_CST),
	      "destroy returned with events unacknowledged");
	ibv_ack_cq_events(cq, 2);
	pthread_join(t, NULL);
	check("destroy_cq_returns_after_acks", d.ret == 0, "destroy failed");
	check("channel_refcnt_drops", ch->refcnt == 0, "refcnt after destroy");
	check("destroy_comp_channel", ibv_destroy_comp_channel(ch) == 0, "destroy failed");

	/* Async events: a QP event names the QP; destroy_qp waits for its ack. */
	cq2 = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	if (!cq2)
		fatal("cq2");
	c = new_rc_qp(pd, cq2, 8, 1);
	{
		char args[64];

		snprintf(args, sizeof(args), "--qpn %u --event path-mig", c->qp_num);
		inject(args);
	}
	check("get_async_event_blocks_then_names_the_qp",
	      ibv_get_async_event(ctx, &ev) == 0 && ev.event_type == IBV_EVENT_PATH_MIG &&
		      ev.element.qp == c,
	      "wrong event");
	d = (struct destroyer){ .fn = destroy_qp_fn, .obj = c };
	pthread_create(&t, NULL, destroy_thread, &d);
	usleep(300000);
	check("destroy_qp_waits_for_ack", !__atomic_load_n(&d.done, __ATOMIC_SEQ_CST),
	      "destroy returned with an event unacknowledged");
	ibv_ack_async_event(&ev);
	pthread_join(t, NULL);
	check("destroy_qp_returns_after_ack", d.ret == 0, "destroy failed");

	/* A non-blocking async fd: EAGAIN when empty; a port event names the port. */
	if (fcntl(ctx->async_fd, F_SETFL, fcntl(ctx->async_fd, F_GETFL) | O_NONBLOCK))
		fatal("fcntl async");
	errno = 0;
	check("async_nonblocking_eagain", ibv_get_async_event(ctx, &ev) == -1 && errno == EAGAIN,
	      "not EAGAIN");
	inject("--port 1 --event port-active");
	check("async_fd_becomes_readable", readable(ctx->async_fd, 10000), "never readable");
	check("async_port_event",
	      ibv_get_async_event(ctx, &ev) == 0 && ev.event_type == IBV_EVENT_PORT_ACTIVE &&
		      ev.element.port_num == 1,
	      "wrong event");
	ibv_ack_async_event(&ev);

	if (ibv_destroy_cq(cq2) || ibv_dereg_mr(mr) || ibv_dealloc_pd(pd) || ibv_close_device(ctx))
		fatal("teardown");
	return summary("events");
}
