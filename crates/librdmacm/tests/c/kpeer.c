/* One RC message each way with immediate data, through rdma_cm's synchronous endpoint API,
 * against a peer that speaks as the Linux kernel's ib_cm and rxe do (tests/kernel_peer.rs).
 *
 *   kpeer server PORT        listen, accept, receive one message, answer it
 *   kpeer client ADDR PORT   connect, send one message, receive the answer
 *
 * Each message is a SEND with immediate data htobe32(0x2d) (as udaddy and rsocket write
 * theirs). What arrives is printed as
 *   recv len=N imm=0xHHHHHHHH bytes=b0.b1.b2.b3 data=TEXT
 * with imm the host value be32toh(wc.imm_data) and bytes the four bytes of wc.imm_data as
 * they lie in memory. */
#include <endian.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

#define LEN 64

static void die(const char *what)
{
	perror(what);
	exit(1);
}

static void post_send_imm(struct rdma_cm_id *id, struct ibv_mr *mr, char *buf, size_t len)
{
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = len, .lkey = mr->lkey };
	struct ibv_send_wr wr = { 0 }, *bad;
	struct ibv_wc wc;

	wr.wr_id = 2;
	wr.opcode = IBV_WR_SEND_WITH_IMM;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.imm_data = htobe32(0x2d);
	wr.sg_list = &sge;
	wr.num_sge = 1;
	if (ibv_post_send(id->qp, &wr, &bad))
		die("ibv_post_send");
	if (rdma_get_send_comp(id, &wc) <= 0)
		die("rdma_get_send_comp");
	if (wc.status != IBV_WC_SUCCESS) {
		fprintf(stderr, "send completion status %d\n", wc.status);
		exit(1);
	}
	printf("sent %zu\n", len);
	fflush(stdout);
}

static void wait_recv(struct rdma_cm_id *id, char *buf)
{
	struct ibv_wc wc;
	unsigned char *b = (unsigned char *)&wc.imm_data;

	if (rdma_get_recv_comp(id, &wc) <= 0)
		die("rdma_get_recv_comp");
	if (wc.status != IBV_WC_SUCCESS) {
		fprintf(stderr, "recv completion status %d\n", wc.status);
		exit(1);
	}
	if (!(wc.wc_flags & IBV_WC_WITH_IMM)) {
		fprintf(stderr, "recv completion without IBV_WC_WITH_IMM\n");
		exit(1);
	}
	buf[wc.byte_len < LEN ? wc.byte_len : LEN - 1] = 0;
	printf("recv len=%u imm=0x%08x bytes=%02x.%02x.%02x.%02x data=%s\n", wc.byte_len,
	       be32toh(wc.imm_data), b[0], b[1], b[2], b[3], buf);
	fflush(stdout);
}

int main(int argc, char **argv)
{
	struct rdma_addrinfo hints = { 0 }, *res;
	struct ibv_qp_init_attr attr = { 0 };
	struct rdma_cm_id *listen_id, *id;
	struct ibv_mr *rmr, *smr;
	static char rbuf[LEN], sbuf[LEN];
	int server;

	if (argc < 3 || (strcmp(argv[1], "server") && argc < 4)) {
		fprintf(stderr, "usage: kpeer server PORT | kpeer client ADDR PORT\n");
		return 2;
	}
	server = !strcmp(argv[1], "server");
	hints.ai_port_space = RDMA_PS_TCP;
	if (server)
		hints.ai_flags = RAI_PASSIVE;
	if (rdma_getaddrinfo(server ? NULL : argv[2], server ? argv[2] : argv[3], &hints, &res))
		die("rdma_getaddrinfo");
	attr.cap.max_send_wr = attr.cap.max_recv_wr = 2;
	attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
	attr.qp_type = IBV_QPT_RC;
	if (rdma_create_ep(server ? &listen_id : &id, res, NULL, &attr))
		die("rdma_create_ep");
	rdma_freeaddrinfo(res);
	if (server) {
		if (rdma_listen(listen_id, 1))
			die("rdma_listen");
		printf("listening\n");
		fflush(stdout);
		/* The id comes with a QP made from the listener's attributes. */
		if (rdma_get_request(listen_id, &id))
			die("rdma_get_request");
	}
	rmr = rdma_reg_msgs(id, rbuf, LEN);
	smr = rdma_reg_msgs(id, sbuf, LEN);
	if (!rmr || !smr)
		die("rdma_reg_msgs");
	if (rdma_post_recv(id, NULL, rbuf, LEN, rmr))
		die("rdma_post_recv");
	if (server) {
		if (rdma_accept(id, NULL))
			die("rdma_accept");
		wait_recv(id, rbuf);
		snprintf(sbuf, LEN, "answer to %.20s", rbuf);
		post_send_imm(id, smr, sbuf, strlen(sbuf));
	} else {
		if (rdma_connect(id, NULL))
			die("rdma_connect");
		strcpy(sbuf, "hello kernel");
		post_send_imm(id, smr, sbuf, strlen(sbuf));
		wait_recv(id, rbuf);
	}
	printf("done\n");
	return 0;
}
