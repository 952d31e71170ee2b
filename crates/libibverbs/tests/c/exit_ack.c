/* A receiver that exits right after its last receive, without destroying anything, and a
 * sender that checks its SEND still completes successfully (tests/exit_ack.rs): on the net
 * path the receiver's library holds a poll's ACK for the program's next round
 * (docs/design/net-path.md, "Order"), and a NIC would have acknowledged the SEND on arrival.
 *
 *   exit_ack receiver|sender
 *       prints "qp GID QPN", reads "peer GID QPN", connects, prints "ready";
 *       receiver: waits for the SEND, prints "ok received", calls exit(0) at once;
 *       sender: reads "go", sends, prints "ok send_completed" (or FAIL with the status).
 */
#include "check.h"

static char buf[4096] __attribute__((aligned(4096)));

int main(int argc, char **argv)
{
	int receiver = argc > 1 && strcmp(argv[1], "receiver") == 0;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_context *ctx = open_first_device(&pd, &cq, 16);
	struct ibv_qp *qp = new_rc_qp(pd, cq, 8, 1);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 64 };
	union ibv_gid gid, peer;
	char line[256], hex[64];
	unsigned remote;

	if (!mr)
		fatal("ibv_reg_mr");
	sge.lkey = mr->lkey;
	if (ibv_query_gid(ctx, 1, 0, &gid))
		fatal("ibv_query_gid");
	printf("qp ");
	print_gid(&gid);
	printf(" %u\n", qp->qp_num);
	fflush(stdout);
	if (!fgets(line, sizeof(line), stdin) || sscanf(line, "peer %32s %u", hex, &remote) != 2)
		fatal("peer line");
	parse_gid(hex, &peer);
	connect_rc(qp, &peer, remote, IBV_ACCESS_LOCAL_WRITE);
	if (receiver) {
		struct ibv_recv_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1 }, *bad;

		if (ibv_post_recv(qp, &wr, &bad))
			fatal("ibv_post_recv");
	}
	printf("ready\n");
	fflush(stdout);
	if (receiver) {
		int st = wait_one_wc(cq);

		check("received", st == IBV_WC_SUCCESS, ibv_wc_status_str(st));
		/* No ibv_destroy_qp, no ibv_close_device: exit(3) with the poll's ACK held. */
		exit(0);
	}
	if (!fgets(line, sizeof(line), stdin) || strncmp(line, "go", 2) != 0)
		fatal("go line");
	memcpy(buf, "the last message", 17);
	struct ibv_send_wr wr = { .wr_id = 2, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED }, *bad;
	if (ibv_post_send(qp, &wr, &bad))
		fatal("ibv_post_send");
	int st = wait_one_wc(cq);
	check("send_completed", st == IBV_WC_SUCCESS, ibv_wc_status_str(st));
	return summary("exit_ack sender");
}
