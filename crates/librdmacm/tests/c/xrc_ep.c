/* XRC through rdma_cm's synchronous endpoint API, as a program that shares receive queues
 * between connections does it (tests/xrc_ep.rs runs it under `softverbs run`):
 *
 *   xrc_ep server ADDR PORT lib|own|rc COUNT
 *   xrc_ep client|rcclient ADDR PORT COUNT
 *
 * Both sides: rdma_getaddrinfo with hints RDMA_PS_IB and IBV_QPT_XRC_RECV (server, passive) or
 * IBV_QPT_XRC_SEND (client), then rdma_create_ep.
 * Server "lib": the listener carries QP attributes, so rdma_get_request returns an id with its
 *   XRC receive QP made; rdma_create_srq_ex with only IBV_SRQ_INIT_ATTR_TYPE (XRC) lets the
 *   library pick the XRC domain and a CQ of the id's own (id->recv_cq), read with
 *   rdma_get_recv_comp.
 * Server "own": the listener has no QP attributes; after rdma_get_request the program opens
 *   its own XRC domain and CQ, makes the XRC SRQ with rdma_create_srq_ex (comp_mask with
 *   XRCD and CQ) and the XRC receive QP in that domain with rdma_create_qp_ex, and polls its
 *   CQ itself.
 * Either way the server posts COUNT receives to the SRQ, accepts with the SRQ number as
 * private data, and checks that COUNT messages of different sizes, each SEND with immediate
 * data, arrive whole on the SRQ's CQ (every message exactly once, its bytes and immediate
 * right).
 * Client: an XRC send QP from rdma_create_ep, rdma_connect, the SRQ number from the REP's
 * private data (id->event), COUNT sends naming it (wr.qp_type.xrc.remote_srqn), each
 * completion from rdma_get_send_comp.
 * Server "rc" / rcclient: the same over RC (RDMA_PS_TCP, IBV_QPT_RC) with a plain SRQ from
 * rdma_create_srq made before rdma_create_qp, whose QP must then receive through it.
 * Prints "ok xrc server <mode>" / "ok xrc client" (rc: "ok rc ..."); any failure exits
 * non-zero with the reason. */
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CHECK(c, ...) do { if (!(c)) { fprintf(stderr, "%s:%d: ", __FILE__, __LINE__); \
	fprintf(stderr, __VA_ARGS__); fprintf(stderr, " (errno %d %s)\n", errno, strerror(errno)); \
	exit(1); } } while (0)

#define SLOT 4096
#define MAXN 64

/* Message k: its length and its bytes (k first, so a receiver knows which it got). */
static size_t len_of(int k) { return 16 + (size_t)k * 37; }
static unsigned char byte_of(int k, size_t i) { return i == 0 ? (unsigned char)k : (unsigned char)(k * 31 + i * 7); }

static struct rdma_addrinfo *info(const char *addr, const char *port, int passive, int rc)
{
	struct rdma_addrinfo hints, *res;
	memset(&hints, 0, sizeof hints);
	hints.ai_port_space = rc ? RDMA_PS_TCP : RDMA_PS_IB;
	if (passive)
		hints.ai_flags = RAI_PASSIVE;
	if (rc)
		hints.ai_qp_type = IBV_QPT_RC;
	else
		hints.ai_qp_type = passive ? IBV_QPT_XRC_RECV : IBV_QPT_XRC_SEND;
	int r = rdma_getaddrinfo(addr, port, &hints, &res);
	CHECK(r == 0, "rdma_getaddrinfo: %s", gai_strerror(r));
	CHECK(res->ai_port_space == hints.ai_port_space, "port space %d", res->ai_port_space);
	CHECK(res->ai_qp_type == hints.ai_qp_type, "QP type %d", res->ai_qp_type);
	return res;
}

static void check_recv(struct ibv_wc *wc, unsigned char *bufs, int *seen, int n)
{
	CHECK(wc->status == IBV_WC_SUCCESS, "receive completion status %d (%s)", wc->status,
	      ibv_wc_status_str(wc->status));
	CHECK(wc->opcode == IBV_WC_RECV, "receive opcode %d", wc->opcode);
	CHECK(wc->wr_id < (uint64_t)n, "wr_id %llu", (unsigned long long)wc->wr_id);
	unsigned char *b = bufs + wc->wr_id * SLOT;
	int k = b[0];
	CHECK(k < n && !seen[k], "message %d twice or unknown", k);
	seen[k] = 1;
	CHECK(wc->byte_len == len_of(k), "message %d: %u bytes, want %zu", k, wc->byte_len, len_of(k));
	for (size_t i = 0; i < len_of(k); i++)
		CHECK(b[i] == byte_of(k, i), "message %d byte %zu", k, i);
	CHECK(wc->wc_flags & IBV_WC_WITH_IMM, "message %d without immediate", k);
	CHECK(be32toh(wc->imm_data) == 0x1000u + k, "message %d immediate %#x", k, be32toh(wc->imm_data));
}

static int accept_and_receive(struct rdma_cm_id *id, struct ibv_cq *cq, int own, uint32_t srqn, int n);

/* Server "rc": an RC id with a plain SRQ from rdma_create_srq, then rdma_create_qp, whose QP
 * must receive through it (rdma_create_qp(3): the id's SRQ), completions on id->recv_cq. */
static int rc_server(struct rdma_cm_id *listen_id, struct rdma_cm_id *id, int n)
{
	struct ibv_srq_init_attr sa;
	memset(&sa, 0, sizeof sa);
	sa.attr.max_wr = n;
	sa.attr.max_sge = 1;
	CHECK(rdma_create_srq(id, NULL, &sa) == 0, "rdma_create_srq (basic)");
	CHECK(id->srq, "no id->srq");
	struct ibv_qp_init_attr qa;
	memset(&qa, 0, sizeof qa);
	qa.cap.max_send_wr = 1;
	qa.cap.max_send_sge = 1;
	qa.cap.max_recv_wr = n;
	qa.cap.max_recv_sge = 1;
	qa.qp_type = IBV_QPT_RC;
	CHECK(rdma_create_qp(id, NULL, &qa) == 0, "rdma_create_qp");
	CHECK(id->qp->srq == id->srq, "the QP does not receive through the id's SRQ");
	int r = accept_and_receive(id, id->recv_cq, 0, 0, n);
	rdma_destroy_ep(id);
	rdma_destroy_ep(listen_id);
	printf("ok rc server srq %d messages\n", n);
	return r;
}

static int server(const char *addr, const char *port, const char *mode, int n)
{
	int own = strcmp(mode, "own") == 0, rc = strcmp(mode, "rc") == 0;
	struct rdma_addrinfo *res = info(addr, port, 1, rc);
	struct rdma_cm_id *listen_id, *id;
	struct ibv_qp_init_attr qa;
	memset(&qa, 0, sizeof qa);
	qa.cap.max_recv_wr = n; /* ignored for an XRC receive QP: it has no receive queue */
	qa.cap.max_recv_sge = 1;
	CHECK(rdma_create_ep(&listen_id, res, NULL, own || rc ? NULL : &qa) == 0, "rdma_create_ep (passive)");
	rdma_freeaddrinfo(res);
	int qpt = rc ? IBV_QPT_RC : IBV_QPT_XRC_RECV;
	CHECK(listen_id->qp_type == qpt, "listener QP type %d", listen_id->qp_type);
	CHECK(rdma_listen(listen_id, 1) == 0, "rdma_listen");
	CHECK(rdma_get_request(listen_id, &id) == 0, "rdma_get_request");
	CHECK(id->event && id->event->event == RDMA_CM_EVENT_CONNECT_REQUEST, "request event");
	CHECK(id->qp_type == qpt, "request id QP type %d", id->qp_type);
	if (rc)
		return rc_server(listen_id, id, n);

	struct ibv_xrcd *xrcd = NULL;
	struct ibv_cq *cq = NULL;
	struct ibv_srq_init_attr_ex sa;
	memset(&sa, 0, sizeof sa);
	sa.attr.max_wr = n;
	sa.attr.max_sge = 1;
	sa.srq_type = IBV_SRQT_XRC;
	sa.comp_mask = IBV_SRQ_INIT_ATTR_TYPE;
	if (own) {
		CHECK(id->qp == NULL, "a QP without QP attributes on the listener");
		struct ibv_xrcd_init_attr xa = {
			.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS,
			.fd = -1,
			.oflags = O_CREAT,
		};
		xrcd = ibv_open_xrcd(id->verbs, &xa);
		CHECK(xrcd, "ibv_open_xrcd");
		cq = ibv_create_cq(id->verbs, n, NULL, NULL, 0);
		CHECK(cq, "ibv_create_cq");
		sa.comp_mask |= IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ;
		sa.pd = id->pd;
		sa.xrcd = xrcd;
		sa.cq = cq;
	} else {
		CHECK(id->qp && id->qp->qp_type == IBV_QPT_XRC_RECV, "rdma_get_request made no XRC receive QP");
	}
	CHECK(rdma_create_srq_ex(id, &sa) == 0, "rdma_create_srq_ex");
	CHECK(id->srq, "no id->srq");
	CHECK(sa.xrcd && sa.cq, "the library filled in no XRC domain or CQ");
	if (own) {
		CHECK(sa.xrcd == xrcd && sa.cq == cq, "the library replaced the program's domain or CQ");
		struct ibv_qp_init_attr_ex qx;
		memset(&qx, 0, sizeof qx);
		qx.qp_type = IBV_QPT_XRC_RECV;
		qx.comp_mask = IBV_QP_INIT_ATTR_XRCD;
		qx.xrcd = xrcd;
		CHECK(rdma_create_qp_ex(id, &qx) == 0, "rdma_create_qp_ex (XRC receive)");
		CHECK(id->qp && id->qp->qp_type == IBV_QPT_XRC_RECV, "no XRC receive QP");
	} else {
		CHECK(id->recv_cq && sa.cq == id->recv_cq, "the SRQ's CQ is not id->recv_cq");
		cq = id->recv_cq;
	}
	uint32_t srqn;
	CHECK(ibv_get_srq_num(id->srq, &srqn) == 0, "ibv_get_srq_num");
	accept_and_receive(id, cq, own, srqn, n);
	if (own) {
		rdma_destroy_qp(id);
		rdma_destroy_srq(id);
		CHECK(ibv_destroy_cq(cq) == 0, "ibv_destroy_cq");
		CHECK(ibv_close_xrcd(xrcd) == 0, "ibv_close_xrcd");
		rdma_destroy_id(id);
	} else {
		rdma_destroy_ep(id);
	}
	rdma_destroy_ep(listen_id);
	printf("ok xrc server %s %d messages\n", mode, n);
	return 0;
}

/* Posts n receives to id->srq, accepts with the SRQ number as private data, and checks the n
 * messages on cq (polled directly, or for the library's CQ with rdma_get_recv_comp). */
static int accept_and_receive(struct rdma_cm_id *id, struct ibv_cq *cq, int own, uint32_t srqn, int n)
{
	unsigned char *bufs = calloc(n, SLOT);
	CHECK(bufs, "calloc");
	struct ibv_mr *mr = rdma_reg_msgs(id, bufs, (size_t)n * SLOT);
	CHECK(mr, "rdma_reg_msgs");
	for (int k = 0; k < n; k++)
		CHECK(rdma_post_recv(id, (void *)(uintptr_t)k, bufs + (size_t)k * SLOT, SLOT, mr) == 0,
		      "rdma_post_recv %d (to id->srq)", k);

	uint32_t be = htobe32(srqn);
	struct rdma_conn_param cp;
	memset(&cp, 0, sizeof cp);
	cp.private_data = &be;
	cp.private_data_len = sizeof be;
	CHECK(rdma_accept(id, &cp) == 0, "rdma_accept");

	int seen[MAXN] = { 0 };
	for (int got = 0; got < n; got++) {
		struct ibv_wc wc;
		if (own) {
			int r;
			while ((r = ibv_poll_cq(cq, 1, &wc)) == 0)
				;
			CHECK(r == 1, "ibv_poll_cq");
		} else {
			CHECK(rdma_get_recv_comp(id, &wc) == 1, "rdma_get_recv_comp");
		}
		check_recv(&wc, bufs, seen, n);
	}
	struct ibv_wc extra;
	CHECK(ibv_poll_cq(cq, 1, &extra) == 0, "a completion more than was sent");

	/* The client disconnects once its sends completed; either side may get there first. */
	rdma_disconnect(id);
	rdma_dereg_mr(mr);
	free(bufs);
	return 0;
}

static int client(const char *addr, const char *port, int n, int rc)
{
	struct rdma_addrinfo *res = info(addr, port, 0, rc);
	struct rdma_cm_id *id;
	struct ibv_qp_init_attr qa;
	memset(&qa, 0, sizeof qa);
	qa.cap.max_send_wr = n;
	qa.cap.max_send_sge = 1;
	qa.sq_sig_all = 1;
	CHECK(rdma_create_ep(&id, res, NULL, &qa) == 0, "rdma_create_ep (active)");
	rdma_freeaddrinfo(res);
	CHECK(id->qp && id->qp->qp_type == (rc ? IBV_QPT_RC : IBV_QPT_XRC_SEND), "no XRC send QP");
	CHECK(id->send_cq, "no send CQ on the id");

	unsigned char *bufs = calloc(n, SLOT);
	CHECK(bufs, "calloc");
	for (int k = 0; k < n; k++)
		for (size_t i = 0; i < len_of(k); i++)
			bufs[(size_t)k * SLOT + i] = byte_of(k, i);
	struct ibv_mr *mr = rdma_reg_msgs(id, bufs, (size_t)n * SLOT);
	CHECK(mr, "rdma_reg_msgs");
	CHECK(rdma_connect(id, NULL) == 0, "rdma_connect");
	CHECK(id->event && id->event->event == RDMA_CM_EVENT_ESTABLISHED, "no ESTABLISHED event on the id");
	CHECK(id->event->param.conn.private_data && id->event->param.conn.private_data_len >= 4,
	      "no SRQ number in the REP's private data (%u bytes)", id->event->param.conn.private_data_len);
	uint32_t srqn = be32toh(*(const uint32_t *)id->event->param.conn.private_data);

	for (int k = 0; k < n; k++) {
		struct ibv_sge sge = {
			.addr = (uintptr_t)(bufs + (size_t)k * SLOT),
			.length = (uint32_t)len_of(k),
			.lkey = mr->lkey,
		};
		struct ibv_send_wr wr, *bad;
		memset(&wr, 0, sizeof wr);
		wr.wr_id = k;
		wr.sg_list = &sge;
		wr.num_sge = 1;
		wr.opcode = IBV_WR_SEND_WITH_IMM;
		wr.imm_data = htobe32(0x1000u + k);
		if (!rc)
			wr.qp_type.xrc.remote_srqn = srqn;
		CHECK(ibv_post_send(id->qp, &wr, &bad) == 0, "ibv_post_send %d", k);
	}
	for (int k = 0; k < n; k++) {
		struct ibv_wc wc;
		CHECK(rdma_get_send_comp(id, &wc) == 1, "rdma_get_send_comp");
		CHECK(wc.status == IBV_WC_SUCCESS, "send %llu: status %d (%s)", (unsigned long long)wc.wr_id,
		      wc.status, ibv_wc_status_str(wc.status));
		CHECK(wc.opcode == IBV_WC_SEND && wc.wr_id == (uint64_t)k, "send completion %d: opcode %d wr_id %llu",
		      k, wc.opcode, (unsigned long long)wc.wr_id);
	}
	rdma_disconnect(id);
	rdma_dereg_mr(mr);
	rdma_destroy_ep(id);
	free(bufs);
	printf("ok %s client %d messages\n", rc ? "rc" : "xrc", n);
	return 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IONBF, 0);
	if (argc == 6 && strcmp(argv[1], "server") == 0) {
		int n = atoi(argv[5]);
		CHECK(n > 0 && n <= MAXN, "COUNT 1..%d", MAXN);
		return server(argv[2], argv[3], argv[4], n);
	}
	if (argc == 5 && (strcmp(argv[1], "client") == 0 || strcmp(argv[1], "rcclient") == 0)) {
		int n = atoi(argv[4]);
		CHECK(n > 0 && n <= MAXN, "COUNT 1..%d", MAXN);
		return client(argv[2], argv[3], n, argv[1][0] == 'r');
	}
	fprintf(stderr, "usage: %s server ADDR PORT lib|own|rc COUNT | client|rcclient ADDR PORT COUNT\n",
		argv[0]);
	return 2;
}
