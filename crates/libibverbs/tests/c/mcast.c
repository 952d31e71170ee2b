/* UD multicast through the drop-in: ibv_attach_mcast(3) / ibv_detach_mcast(3), the
 * device's multicast limits, and datagrams to a group (docs/guide/dropin.md "Multicast",
 * docs/design/roce-wire.md §8).
 *
 *   mcast errnos         the refusals rdma-core and the kernel (uverbs + rxe) give, the limits
 *   mcast send GROUP     prints "qp QPN"; on "send FIRST COUNT" sends COUNT datagrams to the
 *                        group (payload "mc" + 5-digit id), prints "sent COUNT self N" (N:
 *                        datagrams that came back to the sender); "mark ID" sends datagram ID
 *                        ("marked self N"); on EOF quits
 *   mcast recv GROUP     attaches a UD QP, prints "qp QPN" and "ready"; receives until "stop",
 *                        then prints "got ID COUNT" per datagram id, "bad N" (completions
 *                        with a wrong field) and "done"; "detach" detaches it ("detached");
 *                        "seen ID" prints "seen 1" once datagram ID has arrived, else "seen 0"
 *
 * GROUP is an IPv4 (GID ::ffff:GROUP) or IPv6 multicast address. Port 1, GID index 0. In
 * both GRH layouts the last 4 bytes of the 40 are the destination's last 4. */
#include "check.h"

#include <arpa/inet.h>
#include <poll.h>
#include <time.h>
#include <unistd.h>

#define QKEY 0x11111111u
#define SLOT 128
#define RECVS 1024

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *cq;
static struct ibv_mr *mr;
static char *bufs;
static union ibv_gid group;

static void open_first(void)
{
	struct ibv_device **l = ibv_get_device_list(NULL);

	if (!l || !l[0])
		fatal("ibv_get_device_list");
	ctx = ibv_open_device(l[0]);
	if (!ctx)
		fatal("ibv_open_device");
	ibv_free_device_list(l);
	pd = ibv_alloc_pd(ctx);
	cq = ibv_create_cq(ctx, 2 * RECVS, NULL, NULL, 0);
	bufs = calloc(RECVS, SLOT);
	if (!pd || !cq || !bufs)
		fatal("pd/cq/buffers");
	mr = ibv_reg_mr(pd, bufs, (size_t)RECVS * SLOT, IBV_ACCESS_LOCAL_WRITE);
	if (!mr)
		fatal("ibv_reg_mr");
}

static struct ibv_qp *new_qp(enum ibv_qp_type t, int rts)
{
	struct ibv_qp_init_attr ia;
	struct ibv_qp_attr a;
	struct ibv_qp *qp;

	memset(&ia, 0, sizeof(ia));
	ia.send_cq = cq;
	ia.recv_cq = cq;
	ia.qp_type = t;
	ia.cap.max_send_wr = 64;
	ia.cap.max_recv_wr = RECVS;
	ia.cap.max_send_sge = 1;
	ia.cap.max_recv_sge = 1;
	qp = ibv_create_qp(pd, &ia);
	if (!qp)
		fatal("ibv_create_qp");
	if (!rts)
		return qp;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qkey = QKEY;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY))
		fatal("INIT");
	a.qp_state = IBV_QPS_RTR;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE))
		fatal("RTR");
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 0;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN))
		fatal("RTS");
	return qp;
}

/* The RoCE v2 GID of an IPv4 address (::ffff:a.b.c.d) or of an IPv6 address. */
static void v4_gid(union ibv_gid *g, const char *ip)
{
	memset(g, 0, sizeof(*g));
	if (strchr(ip, ':')) {
		if (inet_pton(AF_INET6, ip, g->raw) != 1)
			fatal("group address");
		return;
	}
	g->raw[10] = 0xff;
	g->raw[11] = 0xff;
	if (inet_pton(AF_INET, ip, g->raw + 12) != 1)
		fatal("group address");
}

static int role_errnos(void)
{
	struct ibv_device_attr da;
	struct ibv_qp *rc = new_qp(IBV_QPT_RC, 0), *uc = new_qp(IBV_QPT_UC, 0);
	struct ibv_qp *ud = new_qp(IBV_QPT_UD, 0), *many[64];
	union ibv_gid unicast, v6mc, v6uc, other;
	int i, n, r;

	v4_gid(&group, "239.1.2.3");
	v4_gid(&unicast, "10.0.0.1");
	v4_gid(&other, "239.9.9.9");
	memset(&v6mc, 0, sizeof(v6mc));
	v6mc.raw[0] = 0xff;
	v6mc.raw[1] = 0x0e;
	v6mc.raw[15] = 1;
	memset(&v6uc, 0, sizeof(v6uc));
	v6uc.raw[0] = 0xfd;
	v6uc.raw[15] = 1;

	check("query_device", ibv_query_device(ctx, &da) == 0, "ibv_query_device failed");
	/* Advertised as rxe does (rxe_param.h), and enforced; the group table is at most
	 * RLIMIT_NOFILE / 8 of the daemon (one socket per joined group): the Rust side checks
	 * the value printed here. */
	printf("max_mcast_grp %d\n", da.max_mcast_grp);
	check("max_mcast_grp", da.max_mcast_grp > 0 && da.max_mcast_grp <= 8192,
	      "max_mcast_grp is not in 1..8192");
	check("max_mcast_qp_attach", da.max_mcast_qp_attach == 56,
	      "max_mcast_qp_attach is not 56");
	check("max_total_mcast_qp_attach", da.max_total_mcast_qp_attach == 0x70000,
	      "max_total_mcast_qp_attach is not 0x70000");

	/* ib_attach_mcast (kernel verbs.c): a QP that is not UD, or a GID that is not
	 * multicast, is EINVAL; ibv_attach_mcast returns the errno. */
	check("attach_rc_einval", ibv_attach_mcast(rc, &group, 0) == EINVAL, "RC QP attached");
	check("attach_uc_einval", ibv_attach_mcast(uc, &group, 0) == EINVAL, "UC QP attached");
	check("attach_unicast_einval", ibv_attach_mcast(ud, &unicast, 0) == EINVAL,
	      "unicast IPv4 GID accepted");
	check("attach_ipv6_unicast_einval", ibv_attach_mcast(ud, &v6uc, 0) == EINVAL,
	      "unicast IPv6 GID accepted");
	check("detach_rc_einval", ibv_detach_mcast(rc, &group, 0) == EINVAL, "RC QP detached");
	check("attach", ibv_attach_mcast(ud, &group, 0) == 0, "attach failed");
	/* uverbs finds the group in the QP's list and answers 0 without a second entry. */
	check("attach_twice_ok", ibv_attach_mcast(ud, &group, 0) == 0, "second attach failed");
	check("attach_ipv6_multicast", ibv_attach_mcast(ud, &v6mc, 0) == 0, "ff0e::1 refused");
	check("detach_ipv6_multicast", ibv_detach_mcast(ud, &v6mc, 0) == 0, "ff0e::1 detach");
	check("detach_not_attached_einval", ibv_detach_mcast(ud, &other, 0) == EINVAL,
	      "detached a group never attached");
	check("detach", ibv_detach_mcast(ud, &group, 0) == 0, "detach failed");
	check("detach_again_einval", ibv_detach_mcast(ud, &group, 0) == EINVAL,
	      "attached twice, detached twice: one attachment only");

	/* rxe __rxe_init_mca: the QP past max_mcast_qp_attach in one group is ENOMEM. */
	n = da.max_mcast_qp_attach;
	if (n > 63)
		n = 63;
	r = 0;
	for (i = 0; i <= n; i++) {
		many[i] = new_qp(IBV_QPT_UD, 0);
		r = ibv_attach_mcast(many[i], &group, 0);
		if (i < n && r != 0)
			break;
	}
	check("attach_past_max_mcast_qp_attach_enomem", i == n + 1 && r == ENOMEM,
	      "the QP past max_mcast_qp_attach was not refused with ENOMEM");
	/* A destroyed QP leaves its groups: room for one more. */
	check("destroy_leaves_group", ibv_destroy_qp(many[0]) == 0 &&
		      ibv_attach_mcast(many[n], &group, 0) == 0,
	      "destroying an attached QP did not free its place in the group");
	return summary("mcast");
}

static int poll_some(struct ibv_wc *wc, int max)
{
	return ibv_poll_cq(cq, max, wc);
}

static int role_send(void)
{
	struct ibv_qp *qp = new_qp(IBV_QPT_UD, 1);
	struct ibv_ah_attr aa;
	struct ibv_ah *ah;
	char line[128];

	memset(&aa, 0, sizeof(aa));
	aa.is_global = 1;
	aa.port_num = 1;
	aa.grh.dgid = group;
	aa.grh.sgid_index = 0;
	aa.grh.hop_limit = 1;
	ah = ibv_create_ah(pd, &aa);
	if (!ah)
		fatal("ibv_create_ah");
	/* The sender attaches too, with receives posted: rxe does not loop a datagram back to
	 * the QP that sent it ("self" counts any that come back). */
	for (unsigned j = 64; j < 128; j++) {
		struct ibv_sge sge = { (uintptr_t)(bufs + (size_t)j * SLOT), SLOT, mr->lkey };
		struct ibv_recv_wr wr = { .wr_id = j, .sg_list = &sge, .num_sge = 1 }, *b;

		if (ibv_post_recv(qp, &wr, &b))
			fatal("ibv_post_recv");
	}
	if (ibv_attach_mcast(qp, &group, 0))
		fatal("sender attach");
	printf("qp %u\n", qp->qp_num);
	fflush(stdout);
	while (fgets(line, sizeof(line), stdin)) {
		unsigned first, count, i, done = 0, got_self = 0, mark = 0;
		struct timespec t0, t;

		if (sscanf(line, "mark %u", &first) == 1) {
			count = 1;
			mark = 1;
		} else if (sscanf(line, "send %u %u", &first, &count) != 2) {
			continue;
		}
		clock_gettime(CLOCK_MONOTONIC, &t0);
		for (i = 0; i < count; i++) {
			char *p = bufs + (size_t)(i % 64) * SLOT;
			struct ibv_sge sge = { (uintptr_t)p, 7, mr->lkey };
			struct ibv_send_wr wr, *bad;

			snprintf(p, SLOT, "mc%05u", first + i);
			memset(&wr, 0, sizeof(wr));
			wr.wr_id = i;
			wr.sg_list = &sge;
			wr.num_sge = 1;
			wr.opcode = IBV_WR_SEND;
			wr.send_flags = IBV_SEND_SIGNALED;
			wr.wr.ud.ah = ah;
			wr.wr.ud.remote_qpn = 0xffffff;
			wr.wr.ud.remote_qkey = QKEY;
			if (ibv_post_send(qp, &wr, &bad))
				fatal("ibv_post_send");
			/* One at a time: each datagram's completion before the next, so a burst
			 * never outruns a receiver's socket buffer. */
			while (done <= i) {
				struct ibv_wc wc;
				int n = poll_some(&wc, 1);

				if (n > 0) {
					if (wc.opcode == IBV_WC_RECV)
						got_self++;
					else if (wc.status != IBV_WC_SUCCESS)
						fatal("send completion");
					else
						done++;
				}
				clock_gettime(CLOCK_MONOTONIC, &t);
				if (t.tv_sec - t0.tv_sec > 20)
					fatal("send completions");
			}
			usleep(500);
		}
		if (mark)
			printf("marked self %u\n", got_self);
		else
			printf("sent %u self %u\n", count, got_self);
		fflush(stdout);
	}
	return 0;
}

static int role_recv(void)
{
	struct ibv_qp *qp = new_qp(IBV_QPT_UD, 1);
	static unsigned counts[100000];
	unsigned bad = 0, i, src = 0, srcs = 0;
	int v6 = !(group.raw[10] == 0xff && group.raw[11] == 0xff && group.raw[0] == 0);
	char line[128];
	struct pollfd in = { .fd = 0, .events = POLLIN };

	for (i = 0; i < RECVS; i++) {
		struct ibv_sge sge = { (uintptr_t)(bufs + (size_t)i * SLOT), SLOT, mr->lkey };
		struct ibv_recv_wr wr = { .wr_id = i, .sg_list = &sge, .num_sge = 1 }, *b;

		if (ibv_post_recv(qp, &wr, &b))
			fatal("ibv_post_recv");
	}
	if (ibv_attach_mcast(qp, &group, 0))
		fatal("ibv_attach_mcast");
	printf("qp %u\nready\n", qp->qp_num);
	fflush(stdout);
	for (;;) {
		struct ibv_wc wc[16];
		int n = poll_some(wc, 16), k;

		for (k = 0; k < n; k++) {
			const uint8_t *g = (const uint8_t *)bufs + wc[k].wr_id * SLOT;
			unsigned id;

			if (wc[k].status != IBV_WC_SUCCESS || wc[k].opcode != IBV_WC_RECV ||
			    !(wc[k].wc_flags & IBV_WC_GRH) || wc[k].byte_len != 40 + 7 ||
			    wc[k].qp_num != qp->qp_num || memcmp(g + 36, group.raw + 12, 4) != 0 ||
			    g[v6 ? 7 : 28] != 1 /* multicast TTL / hop limit */ ||
			    sscanf((const char *)g + 42, "%5u", &id) != 1 || id >= 100000) {
				bad++;
			} else {
				counts[id]++;
			}
			if (srcs == 0 || wc[k].src_qp != src)
				srcs++;
			src = wc[k].src_qp;
			/* Put the buffer back: plenty of receives for duplicates too. */
			{
				struct ibv_sge sge = { (uintptr_t)g, SLOT, mr->lkey };
				struct ibv_recv_wr wr = { .wr_id = wc[k].wr_id, .sg_list = &sge,
							  .num_sge = 1 }, *b;

				if (ibv_post_recv(qp, &wr, &b))
					fatal("re-post");
			}
		}
		if (n == 0 && poll(&in, 1, 1) > 0) {
			if (!fgets(line, sizeof(line), stdin) || strncmp(line, "stop", 4) == 0)
				break;
			if (sscanf(line, "seen %u", &i) == 1 && i < 100000) {
				printf("seen %u\n", counts[i] ? 1 : 0);
				fflush(stdout);
			}
			if (strncmp(line, "detach", 6) == 0) {
				if (ibv_detach_mcast(qp, &group, 0))
					fatal("ibv_detach_mcast");
				printf("detached\n");
				fflush(stdout);
			}
		}
	}
	for (i = 0; i < 100000; i++)
		if (counts[i])
			printf("got %u %u\n", i, counts[i]);
	printf("src %u %u\nbad %u\ndone\n", srcs, src, bad);
	fflush(stdout);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc < 2)
		return 2;
	open_first();
	if (strcmp(argv[1], "errnos") == 0)
		return role_errnos();
	if (argc < 3)
		return 2;
	v4_gid(&group, argv[2]);
	if (strcmp(argv[1], "send") == 0)
		return role_send();
	if (strcmp(argv[1], "recv") == 0)
		return role_recv();
	return 2;
}
