/* The daemon's death as a verbs program sees it: a device fatal error (ibv_get_async_event(3):
 * IBV_EVENT_DEVICE_FATAL). With work outstanding it prints "ready"; the test then kills the
 * daemon with SIGKILL, telling the program nothing: it learns of the death by waiting in
 * ibv_get_async_event. It then checks that the armed CQ's channel fires, that the completion
 * the daemon had written comes before the flush of every outstanding request (with its wr_id,
 * in order, unsignaled ones too), that later verbs fail with EIO, and that every object still
 * destroys. It prints "closed" and waits for a line on stdin, sent once a new daemon serves the
 * same socket, and then opens the same device again and moves data through it.
 * Prints "ok NAME" per check and a summary. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#include "check.h"

#define ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

static unsigned char buf[4096];

static int readable(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };

	return poll(&p, 1, 0) == 1;
}

static struct ibv_sge sge(struct ibv_mr *mr, int off)
{
	struct ibv_sge s = { .addr = (uintptr_t)buf + off, .length = 64, .lkey = mr->lkey };

	return s;
}

static void post_send(struct ibv_qp *qp, struct ibv_mr *mr, uint64_t wr_id, int signaled)
{
	struct ibv_sge s = sge(mr, 64);
	struct ibv_send_wr wr = { .wr_id = wr_id, .sg_list = &s, .num_sge = 1,
				  .opcode = IBV_WR_SEND,
				  .send_flags = signaled ? IBV_SEND_SIGNALED : 0 }, *bad;

	if (ibv_post_send(qp, &wr, &bad))
		fatal("ibv_post_send");
}

static void post_recv(struct ibv_qp *qp, struct ibv_mr *mr, uint64_t wr_id)
{
	struct ibv_sge s = sge(mr, 0);
	struct ibv_recv_wr wr = { .wr_id = wr_id, .sg_list = &s, .num_sge = 1 }, *bad;

	if (ibv_post_recv(qp, &wr, &bad))
		fatal("ibv_post_recv");
}

/* Polls until `n` completions arrived (the daemon is alive here). */
static void wait_wc(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
	while (n > 0) {
		int k = ibv_poll_cq(cq, n, wc);

		if (k < 0)
			fatal("ibv_poll_cq");
		wc += k;
		n -= k;
	}
}

/* What one poll of up to 16 hands out now. */
static int poll_now(struct ibv_cq *cq, struct ibv_wc *wc)
{
	return ibv_poll_cq(cq, 16, wc);
}

static struct ibv_qp *rc_qp(struct ibv_pd *pd, struct ibv_cq *scq, struct ibv_cq *rcq)
{
	struct ibv_qp_init_attr a;
	struct ibv_qp *qp;

	memset(&a, 0, sizeof(a));
	a.send_cq = scq;
	a.recv_cq = rcq;
	a.qp_type = IBV_QPT_RC;
	a.cap.max_send_wr = 16;
	a.cap.max_recv_wr = 16;
	a.cap.max_send_sge = 1;
	a.cap.max_recv_sge = 1;
	qp = ibv_create_qp(pd, &a);
	if (!qp)
		fatal("ibv_create_qp");
	return qp;
}

/* After the device went: one more round of everything, which must work on a new context. */
static int moves_data(struct ibv_device *dev)
{
	struct ibv_context *ctx = ibv_open_device(dev);
	struct ibv_wc wc[2];
	union ibv_gid gid;
	int ok;

	if (!ctx)
		return 0;
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_mr *mr = pd ? ibv_reg_mr(pd, buf, sizeof(buf), ACCESS) : NULL;
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);

	if (!mr || !cq || ibv_query_gid(ctx, 1, 0, &gid))
		fatal("setup on the new context");
	struct ibv_qp *a = new_rc_qp(pd, cq, 16, 1), *b = new_rc_qp(pd, cq, 16, 1);

	connect_rc(a, &gid, b->qp_num, ACCESS);
	connect_rc(b, &gid, a->qp_num, ACCESS);
	post_recv(b, mr, 7);
	post_send(a, mr, 8, 1);
	wait_wc(cq, 2, wc);
	ok = wc[0].status == IBV_WC_SUCCESS && wc[1].status == IBV_WC_SUCCESS;
	ok = !ibv_destroy_qp(a) && !ibv_destroy_qp(b) && !ibv_destroy_cq(cq) &&
	     !ibv_dereg_mr(mr) && !ibv_dealloc_pd(pd) && !ibv_close_device(ctx) && ok;
	return ok;
}

int main(void)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_async_event ev;
	struct ibv_wc wc[16];
	struct ibv_cq *ev_cq;
	void *ev_ctx;
	union ibv_gid gid;
	char line[64];
	int n, ok;

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (!list || !list[0])
		fatal("ibv_get_device_list");
	struct ibv_device *dev = list[0];
	struct ibv_context *ctx = ibv_open_device(dev);

	if (!ctx)
		fatal("ibv_open_device");
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_mr *mr = pd ? ibv_reg_mr(pd, buf, sizeof(buf), ACCESS) : NULL;
	struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
	struct ibv_cq *send_cq = ch ? ibv_create_cq(ctx, 16, NULL, ch, 0) : NULL;
	struct ibv_cq *recv_cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	struct ibv_cq *a_cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);

	if (!mr || !send_cq || !recv_cq || !a_cq || ibv_query_gid(ctx, 1, 0, &gid))
		fatal("setup");
	struct ibv_qp *qa = rc_qp(pd, a_cq, a_cq), *qb = rc_qp(pd, send_cq, recv_cq);

	connect_rc(qa, &gid, qb->qp_num, ACCESS);
	connect_rc(qb, &gid, qa->qp_num, ACCESS);

	/* One send completes; the channel says its completion is in the CQ, left unpolled. */
	post_recv(qa, mr, 50);
	if (ibv_req_notify_cq(send_cq, 0))
		fatal("ibv_req_notify_cq");
	post_send(qb, mr, 1, 1);
	if (ibv_get_cq_event(ch, &ev_cq, &ev_ctx) || ev_cq != send_cq)
		fatal("ibv_get_cq_event");
	ibv_ack_cq_events(send_cq, 1);
	wait_wc(a_cq, 1, wc);
	if (wc[0].wr_id != 50 || wc[0].status != IBV_WC_SUCCESS)
		fatal("the first message");
	if (ibv_req_notify_cq(send_cq, 0))
		fatal("ibv_req_notify_cq");
	/* qa has no receive left: these sends meet RNR NAKs, retried forever (rnr_retry 7). */
	post_send(qb, mr, 2, 1);
	post_send(qb, mr, 3, 0);
	post_send(qb, mr, 4, 1);
	/* Receives nobody sends to. */
	post_recv(qb, mr, 100);
	post_recv(qb, mr, 101);
	post_recv(qb, mr, 102);
	printf("ready\n");

	/* The daemon is killed now; nothing tells this program but the device. */
	ok = ibv_get_async_event(ctx, &ev) == 0;
	check("async_event_is_device_fatal", ok && ev.event_type == IBV_EVENT_DEVICE_FATAL,
	      ok ? ibv_event_type_str(ev.event_type) : "ibv_get_async_event failed");
	if (ok)
		ibv_ack_async_event(&ev);
	check("async_fd_stays_readable", readable(ctx->async_fd), "poll(async_fd)");
	check("async_event_then_eio", ibv_get_async_event(ctx, &ev) == -1 && errno == EIO,
	      "second ibv_get_async_event");
	check("channel_fd_readable", readable(ch->fd), "poll(channel fd)");
	ok = ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == 0;
	check("armed_cq_gets_an_event", ok && ev_cq == send_cq, "ibv_get_cq_event");
	if (ok)
		ibv_ack_cq_events(ev_cq, 1);
	check("cq_event_then_eio", ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == -1 && errno == EIO,
	      "second ibv_get_cq_event");

	n = poll_now(send_cq, wc);
	ok = n == 4 && wc[0].wr_id == 1 && wc[0].status == IBV_WC_SUCCESS;
	for (int i = 1; ok && i < 4; i++)
		ok = wc[i].wr_id == (uint64_t)i + 1 && wc[i].status == IBV_WC_WR_FLUSH_ERR &&
		     wc[i].qp_num == qb->qp_num;
	check("completed_first_then_sends_flushed_in_order", ok, "send CQ");
	n = poll_now(recv_cq, wc);
	ok = n == 3;
	for (int i = 0; ok && i < 3; i++)
		ok = wc[i].wr_id == 100 + (uint64_t)i && wc[i].status == IBV_WC_WR_FLUSH_ERR &&
		     wc[i].opcode == IBV_WC_RECV && wc[i].qp_num == qb->qp_num;
	check("receives_flushed_in_order", ok, "receive CQ");
	check("no_duplicates",
	      poll_now(send_cq, wc) == 0 && poll_now(recv_cq, wc) == 0 && poll_now(a_cq, wc) == 0,
	      "a later poll");

	{
		struct ibv_sge s = sge(mr, 0);
		struct ibv_send_wr swr = { .wr_id = 9, .sg_list = &s, .num_sge = 1,
					   .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED },
				   *sbad = NULL;
		struct ibv_recv_wr rwr = { .wr_id = 9, .sg_list = &s, .num_sge = 1 }, *rbad = NULL;
		struct ibv_qp_attr qa_attr = { .qp_state = IBV_QPS_ERR };
		struct ibv_port_attr pa;

		errno = 0;
		check("alloc_pd_eio", !ibv_alloc_pd(ctx) && errno == EIO, "ibv_alloc_pd");
		errno = 0;
		check("create_cq_eio", !ibv_create_cq(ctx, 4, NULL, NULL, 0) && errno == EIO,
		      "ibv_create_cq");
		errno = 0;
		check("reg_mr_eio", !ibv_reg_mr(pd, buf, 64, ACCESS) && errno == EIO, "ibv_reg_mr");
		check("modify_qp_eio", ibv_modify_qp(qb, &qa_attr, IBV_QP_STATE) == EIO,
		      "ibv_modify_qp");
		check("post_send_eio", ibv_post_send(qb, &swr, &sbad) == EIO && sbad == &swr,
		      "ibv_post_send");
		check("post_recv_eio", ibv_post_recv(qb, &rwr, &rbad) == EIO && rbad == &rwr,
		      "ibv_post_recv");
		check("req_notify_cq_eio", ibv_req_notify_cq(send_cq, 0) == EIO, "ibv_req_notify_cq");
		check("query_port_eio", ibv_query_port(ctx, 1, &pa) == EIO, "ibv_query_port");
	}
	check("destroy_after_death",
	      !ibv_destroy_qp(qa) && !ibv_destroy_qp(qb) && !ibv_destroy_cq(send_cq) &&
		      !ibv_destroy_cq(recv_cq) && !ibv_destroy_cq(a_cq) &&
		      !ibv_destroy_comp_channel(ch) && !ibv_dereg_mr(mr) && !ibv_dealloc_pd(pd),
	      "a destroy call");
	check("close_after_death", ibv_close_device(ctx) == 0, "ibv_close_device");
	printf("closed\n");

	/* A new daemon serves the same socket once a line arrives. */
	if (!fgets(line, sizeof(line), stdin))
		fatal("stdin closed before the new daemon");
	check("reopen_moves_data", moves_data(dev), "the reopened device");
	ibv_free_device_list(list);
	return summary("daemon_death");
}
