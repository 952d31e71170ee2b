/*
 * xrc_legacy: the legacy OFED XRC API across processes, on the softverbs drop-in libibverbs.
 *
 * One shared XRC receive QP, created by one process and used by others that each own an XRC
 * SRQ behind it; a sender reaches every SRQ through that one QP. The creator may die (even by
 * SIGKILL) once the others registered: the QP lives while anyone holds it.
 *
 * Build (link against the drop-in itself: the legacy symbols are not in rdma-core's library):
 *
 *   gcc -I/usr/include -Icrates/libibverbs/include xrc_legacy.c -o xrc_legacy \
 *       target/debug/libibverbs.so
 *
 * Run every role with `softverbs run -- ./xrc_legacy ROLE ...`. Roles (FACE is `legacy`, the
 * OFED calls, or `minimal`, the register/unregister pair; default legacy):
 *
 *   creator FILE [FACE]
 *       Opens the XRC domain of FILE (creating both), creates the receive QP, moves it to INIT
 *       and prints "QPN <qpn>". Then reads "<sender qpn> <sender psn>" from stdin, moves the QP
 *       to RTR towards that sender, prints "RTR" and waits to be killed.
 *   worker FILE QPN COUNT [FACE]
 *       Opens the domain of FILE, registers with receive QP QPN, creates its own XRC SRQ and CQ,
 *       posts COUNT receives and prints "SRQN <srqn>". Receives COUNT messages, checks each,
 *       and prints "RECEIVED <n> bad=<b> digest=<hex>". Then waits for a line (or EOF) on
 *       stdin, looks once more for stray completions, unregisters and prints
 *       "UNREGISTERED extra=<e>".
 *   sender RECV_QPN SRQN...
 *       An XRC send QP (rdma-core's ibv_create_qp with IBV_QPT_XRC_SEND) connected to receive
 *       QP RECV_QPN through GID index 0 of the same device; prints "QPN <qpn> PSN <psn>". For
 *       every stdin line "SEND <m>" it sends the next m messages to each SRQ, waits for their
 *       completions and prints "SENT <total>". At EOF it prints "SENT_TO <srqn> <n> <digest>"
 *       for every SRQ, then "DONE".
 *
 * Message k for SRQ s is a text header naming s and k followed by a pattern derived from both,
 * of a length that varies with k (up to MSG_MAX bytes, several packets at MTU 1024). Digests
 * are order-independent sums of FNV-1a hashes of whole messages, so what a worker received can
 * be compared with what the sender sent to its SRQ.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>
#include <softverbs/xrc_legacy.h>

#define PORT 1
#define GID_INDEX 0
#define HEADER 64
#define MSG_MAX 4096
#define MAX_SRQS 16
#define TIMEOUT_S 60

static const char *role = "xrc_legacy";

static void die(const char *what, int err)
{
	printf("ERROR %s: %s\n", what, strerror(err));
	fflush(stdout);
	fprintf(stderr, "%s: %s: %s\n", role, what, strerror(err));
	exit(1);
}

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
	fflush(stdout);
}

static uint32_t parse_u32(const char *s)
{
	char *end;
	unsigned long v;

	errno = 0;
	v = strtoul(s, &end, 0);
	if (errno || *end || v > UINT32_MAX)
		die("bad number", EINVAL);
	return (uint32_t)v;
}

static double now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void nap(void)
{
	struct timespec t = { .tv_sec = 0, .tv_nsec = 200000 };

	nanosleep(&t, NULL);
}

static int use_minimal(int argc, char **argv, int i)
{
	if (argc <= i || !strcmp(argv[i], "legacy"))
		return 0;
	if (!strcmp(argv[i], "minimal"))
		return 1;
	die("FACE is legacy or minimal", EINVAL);
	return 0;
}

/* ---- messages ------------------------------------------------------------------------- */

static uint32_t msg_len(uint32_t srqn, uint32_t seq)
{
	return HEADER + (seq * 509u + srqn) % (MSG_MAX - HEADER + 1);
}

static uint8_t msg_byte(uint32_t srqn, uint32_t seq, uint32_t i)
{
	return (uint8_t)(srqn * 131u + seq * 7u + i * 13u + (i >> 8));
}

static void msg_fill(uint8_t *buf, uint32_t srqn, uint32_t seq)
{
	uint32_t len = msg_len(srqn, seq), i;

	memset(buf, 0, HEADER);
	snprintf((char *)buf, HEADER, "xrc_legacy srqn=%u seq=%u len=%u", srqn, seq, len);
	for (i = HEADER; i < len; i++)
		buf[i] = msg_byte(srqn, seq, i);
}

static uint64_t fnv(const uint8_t *p, size_t n)
{
	uint64_t h = 0xcbf29ce484222325ull;
	size_t i;

	for (i = 0; i < n; i++) {
		h ^= p[i];
		h *= 0x100000001b3ull;
	}
	return h;
}

/* ---- device and domain ------------------------------------------------------------------ */

static struct ibv_context *open_first_device(void)
{
	struct ibv_device **list;
	struct ibv_context *ctx;
	int n;

	list = ibv_get_device_list(&n);
	if (!list)
		die("ibv_get_device_list", errno);
	if (n < 1)
		die("no device", ENODEV);
	ctx = ibv_open_device(list[0]);
	if (!ctx)
		die("ibv_open_device", errno);
	ibv_free_device_list(list);
	return ctx;
}

static struct ibv_xrc_domain *open_domain(struct ibv_context *ctx, const char *file, int create,
					  int *fd)
{
	struct ibv_xrc_domain *d;

	*fd = open(file, create ? O_RDONLY | O_CREAT : O_RDONLY, 0644);
	if (*fd < 0)
		die("open domain file", errno);
	d = ibv_open_xrc_domain(ctx, *fd, create ? O_CREAT : 0);
	if (!d)
		die("ibv_open_xrc_domain", errno);
	return d;
}

/* The address of this device's GID 0: every process here runs on the same device. */
static void own_address(struct ibv_context *ctx, struct ibv_ah_attr *ah)
{
	union ibv_gid gid;

	if (ibv_query_gid(ctx, PORT, GID_INDEX, &gid))
		die("ibv_query_gid", errno ? errno : EINVAL);
	memset(ah, 0, sizeof(*ah));
	ah->is_global = 1;
	ah->grh.dgid = gid;
	ah->grh.sgid_index = GID_INDEX;
	ah->grh.hop_limit = 64;
	ah->port_num = PORT;
}

static void init_attr(struct ibv_qp_attr *a)
{
	memset(a, 0, sizeof(*a));
	a->qp_state = IBV_QPS_INIT;
	a->pkey_index = 0;
	a->port_num = PORT;
	a->qp_access_flags = 0;
}

#define INIT_MASK (IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)

/* ---- creator ---------------------------------------------------------------------------- */

static int creator(int argc, char **argv)
{
	struct ibv_context *ctx;
	struct ibv_xrc_domain *d;
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr init;
	uint32_t qpn, sqpn, spsn;
	char line[128];
	int fd, err, minimal;

	if (argc < 3)
		die("usage: creator FILE [FACE]", EINVAL);
	minimal = use_minimal(argc, argv, 3);
	ctx = open_first_device();
	d = open_domain(ctx, argv[2], 1, &fd);
	if (minimal) {
		qpn = IBV_XRC_NEW_QP;
		err = ibv_xrc_rcv_qp_register(d, &qpn);
		if (err)
			die("ibv_xrc_rcv_qp_register(IBV_XRC_NEW_QP)", err);
	} else {
		err = ibv_create_xrc_rcv_qp(d, NULL, &qpn);
		if (err)
			die("ibv_create_xrc_rcv_qp", err);
	}
	init_attr(&a);
	err = ibv_modify_xrc_rcv_qp(d, qpn, &a, INIT_MASK);
	if (err)
		die("ibv_modify_xrc_rcv_qp INIT", err);
	say("QPN %u", qpn);

	if (!fgets(line, sizeof(line), stdin) ||
	    sscanf(line, "%" SCNu32 " %" SCNu32, &sqpn, &spsn) != 2)
		die("expected \"<sender qpn> <sender psn>\" on stdin", EINVAL);
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	own_address(ctx, &a.ah_attr);
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = sqpn;
	a.rq_psn = spsn;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	err = ibv_modify_xrc_rcv_qp(d, qpn, &a,
				    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
					    IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
					    IBV_QP_MIN_RNR_TIMER);
	if (err)
		die("ibv_modify_xrc_rcv_qp RTR", err);
	memset(&a, 0, sizeof(a));
	err = ibv_query_xrc_rcv_qp(d, qpn, &a, IBV_QP_STATE, &init);
	if (err)
		die("ibv_query_xrc_rcv_qp", err);
	if (a.qp_state != IBV_QPS_RTR || init.qp_type != IBV_QPT_XRC_RECV)
		die("the receive QP is not an XRC receive QP in RTR", EPROTO);
	say("RTR");
	for (;;)
		pause();
	return 0;
}

/* ---- worker ----------------------------------------------------------------------------- */

struct check {
	uint32_t srqn, qpn, count, got, bad;
	uint64_t digest;
	uint8_t *seen;
};

static void complain(struct check *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void complain(struct check *c, const char *fmt, ...)
{
	va_list ap;

	c->bad++;
	if (c->bad > 10)
		return;
	fprintf(stderr, "%s srqn=%u: ", role, c->srqn);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

/* One receive completion: its status, its QP, and the message's SRQ, number, length and bytes. */
static void check_one(struct check *c, const struct ibv_wc *wc, const uint8_t *buf)
{
	uint32_t srqn, seq, len, i;
	char expect[HEADER];

	if (wc->status != IBV_WC_SUCCESS) {
		complain(c, "wr %" PRIu64 ": %s", wc->wr_id, ibv_wc_status_str(wc->status));
		return;
	}
	if (wc->opcode != IBV_WC_RECV || wc->qp_num != c->qpn) {
		complain(c, "wr %" PRIu64 ": opcode %d qp_num %u", wc->wr_id, wc->opcode,
			 wc->qp_num);
		return;
	}
	if (wc->byte_len < HEADER ||
	    sscanf((const char *)buf, "xrc_legacy srqn=%u seq=%u len=%u", &srqn, &seq, &len) !=
		    3) {
		complain(c, "wr %" PRIu64 ": no header", wc->wr_id);
		return;
	}
	if (srqn != c->srqn) {
		complain(c, "seq %u was aimed at SRQ %u", seq, srqn);
		return;
	}
	if (seq >= c->count || len != msg_len(srqn, seq) || wc->byte_len != len) {
		complain(c, "seq %u: len %u, byte_len %u", seq, len, wc->byte_len);
		return;
	}
	if (c->seen[seq]) {
		complain(c, "seq %u received twice", seq);
		return;
	}
	snprintf(expect, sizeof(expect), "xrc_legacy srqn=%u seq=%u len=%u", srqn, seq, len);
	for (i = 0; i < HEADER; i++)
		if (buf[i] != (i < strlen(expect) ? (uint8_t)expect[i] : 0)) {
			complain(c, "seq %u: header byte %u", seq, i);
			return;
		}
	for (i = HEADER; i < len; i++)
		if (buf[i] != msg_byte(srqn, seq, i)) {
			complain(c, "seq %u: corrupt at byte %u", seq, i);
			return;
		}
	c->seen[seq] = 1;
	c->got++;
	c->digest += fnv(buf, len);
}

static int worker(int argc, char **argv)
{
	struct ibv_context *ctx;
	struct ibv_xrc_domain *d;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_srq *srq;
	struct ibv_mr *mr;
	struct ibv_srq_init_attr sa;
	struct ibv_wc wc[16];
	struct check c;
	uint8_t *buf;
	uint32_t i, extra = 0;
	double deadline;
	char line[128];
	int fd, err, n, k, minimal;

	if (argc < 5)
		die("usage: worker FILE QPN COUNT [FACE]", EINVAL);
	memset(&c, 0, sizeof(c));
	c.qpn = parse_u32(argv[3]);
	c.count = parse_u32(argv[4]);
	if (c.count == 0 || c.count > 4096)
		die("COUNT is 1..4096", EINVAL);
	minimal = use_minimal(argc, argv, 5);
	ctx = open_first_device();
	d = open_domain(ctx, argv[2], 0, &fd);
	if (minimal) {
		uint32_t q = c.qpn;

		err = ibv_xrc_rcv_qp_register(d, &q);
		if (!err && q != c.qpn)
			err = EPROTO;
		if (err)
			die("ibv_xrc_rcv_qp_register", err);
	} else {
		err = ibv_reg_xrc_rcv_qp(d, c.qpn);
		if (err)
			die("ibv_reg_xrc_rcv_qp", err);
	}

	pd = ibv_alloc_pd(ctx);
	if (!pd)
		die("ibv_alloc_pd", errno);
	cq = ibv_create_cq(ctx, (int)c.count + 16, NULL, NULL, 0);
	if (!cq)
		die("ibv_create_cq", errno);
	memset(&sa, 0, sizeof(sa));
	sa.attr.max_wr = c.count;
	sa.attr.max_sge = 1;
	srq = ibv_create_xrc_srq(pd, d, cq, &sa);
	if (!srq)
		die("ibv_create_xrc_srq", errno);
	err = ibv_get_srq_num(srq, &c.srqn);
	if (err)
		die("ibv_get_srq_num", err);
	buf = calloc(c.count, MSG_MAX);
	c.seen = calloc(c.count, 1);
	if (!buf || !c.seen)
		die("calloc", ENOMEM);
	mr = ibv_reg_mr(pd, buf, (size_t)c.count * MSG_MAX, IBV_ACCESS_LOCAL_WRITE);
	if (!mr)
		die("ibv_reg_mr", errno);
	for (i = 0; i < c.count; i++) {
		struct ibv_sge sge = {
			.addr = (uintptr_t)(buf + (size_t)i * MSG_MAX),
			.length = MSG_MAX,
			.lkey = mr->lkey,
		};
		struct ibv_recv_wr wr = { .wr_id = i, .sg_list = &sge, .num_sge = 1 }, *bad;

		err = ibv_post_srq_recv(srq, &wr, &bad);
		if (err)
			die("ibv_post_srq_recv", err);
	}
	say("SRQN %u", c.srqn);

	deadline = now() + TIMEOUT_S;
	while (c.got + c.bad < c.count && now() < deadline) {
		n = ibv_poll_cq(cq, 16, wc);
		if (n < 0)
			die("ibv_poll_cq", EIO);
		for (k = 0; k < n; k++)
			check_one(&c, &wc[k], buf + wc[k].wr_id * MSG_MAX);
		if (n == 0)
			nap();
	}
	say("RECEIVED %u bad=%u digest=%016" PRIx64, c.got, c.bad, c.digest);

	/* Leave when told to (or when stdin closes). A completion found now was not asked for:
	 * every receive was used already. */
	if (!fgets(line, sizeof(line), stdin))
		line[0] = 0;
	while ((n = ibv_poll_cq(cq, 16, wc)) > 0)
		extra += (uint32_t)n;
	err = minimal ? ibv_xrc_rcv_qp_unregister(d, c.qpn) : ibv_unreg_xrc_rcv_qp(d, c.qpn);
	if (err)
		die("unregister", err);
	if ((err = ibv_destroy_srq(srq)))
		die("ibv_destroy_srq", err);
	if ((err = ibv_dereg_mr(mr)))
		die("ibv_dereg_mr", err);
	if ((err = ibv_destroy_cq(cq)))
		die("ibv_destroy_cq", err);
	if ((err = ibv_dealloc_pd(pd)))
		die("ibv_dealloc_pd", err);
	if ((err = ibv_close_xrc_domain(d)))
		die("ibv_close_xrc_domain", err);
	close(fd);
	if ((err = ibv_close_device(ctx)))
		die("ibv_close_device", err);
	say("UNREGISTERED extra=%u", extra);
	free(buf);
	free(c.seen);
	return c.bad || extra || c.got != c.count;
}

/* ---- sender ----------------------------------------------------------------------------- */

static int sender(int argc, char **argv)
{
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	struct ibv_qp_init_attr qa;
	struct ibv_qp_attr a;
	struct ibv_wc wc[16];
	uint32_t rqpn, psn, srqn[MAX_SRQS], sent = 0, i, s;
	uint64_t digest[MAX_SRQS] = { 0 };
	uint8_t *buf;
	int nsrq, err, n, k, depth = 0, window = 64;
	char line[128];

	if (argc < 4 || argc - 3 > MAX_SRQS)
		die("usage: sender RECV_QPN SRQN...", EINVAL);
	rqpn = parse_u32(argv[2]);
	nsrq = argc - 3;
	for (k = 0; k < nsrq; k++)
		srqn[k] = parse_u32(argv[3 + k]);

	ctx = open_first_device();
	pd = ibv_alloc_pd(ctx);
	if (!pd)
		die("ibv_alloc_pd", errno);
	cq = ibv_create_cq(ctx, 2 * window, NULL, NULL, 0);
	if (!cq)
		die("ibv_create_cq", errno);
	memset(&qa, 0, sizeof(qa));
	qa.send_cq = cq;
	qa.recv_cq = cq;
	qa.qp_type = IBV_QPT_XRC_SEND;
	qa.cap.max_send_wr = (uint32_t)window;
	qa.cap.max_send_sge = 1;
	qp = ibv_create_qp(pd, &qa);
	if (!qp)
		die("ibv_create_qp(IBV_QPT_XRC_SEND)", errno);
	buf = calloc((size_t)window, MSG_MAX);
	if (!buf)
		die("calloc", ENOMEM);
	mr = ibv_reg_mr(pd, buf, (size_t)window * MSG_MAX, 0);
	if (!mr)
		die("ibv_reg_mr", errno);

	init_attr(&a);
	if ((err = ibv_modify_qp(qp, &a, INIT_MASK)))
		die("ibv_modify_qp INIT", err);
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	own_address(ctx, &a.ah_attr);
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = rqpn;
	a.rq_psn = 0;
	if ((err = ibv_modify_qp(qp, &a,
				 IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
					 IBV_QP_RQ_PSN)))
		die("ibv_modify_qp RTR", err);
	srand48(getpid() ^ (long)time(NULL));
	psn = (uint32_t)lrand48() & 0xffffff;
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = psn;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 1;
	if ((err = ibv_modify_qp(qp, &a,
				 IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
					 IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC)))
		die("ibv_modify_qp RTS", err);
	say("QPN %u PSN %u", qp->qp_num, psn);

	while (fgets(line, sizeof(line), stdin)) {
		uint32_t m, total, posted = 0, done = 0, seq;
		double deadline = now() + TIMEOUT_S;

		if (sscanf(line, "SEND %" SCNu32, &m) != 1)
			die("expected \"SEND <m>\" on stdin", EINVAL);
		total = m * (uint32_t)nsrq;
		while (done < total) {
			/* Keep up to `window` sends in flight; slot = message number mod window. */
			while (posted < total && depth < window) {
				struct ibv_sge sge;
				struct ibv_send_wr wr, *bad;
				uint8_t *slot = buf + (size_t)((sent + posted) % window) * MSG_MAX;

				s = posted % (uint32_t)nsrq;
				seq = sent / (uint32_t)nsrq + posted / (uint32_t)nsrq;
				msg_fill(slot, srqn[s], seq);
				digest[s] += fnv(slot, msg_len(srqn[s], seq));
				sge.addr = (uintptr_t)slot;
				sge.length = msg_len(srqn[s], seq);
				sge.lkey = mr->lkey;
				memset(&wr, 0, sizeof(wr));
				wr.wr_id = sent + posted;
				wr.sg_list = &sge;
				wr.num_sge = 1;
				wr.opcode = IBV_WR_SEND;
				wr.send_flags = IBV_SEND_SIGNALED;
				ibv_xrc_set_remote_srqn(&wr, srqn[s]);
				if ((err = ibv_post_send(qp, &wr, &bad)))
					die("ibv_post_send", err);
				posted++;
				depth++;
			}
			n = ibv_poll_cq(cq, 16, wc);
			if (n < 0)
				die("ibv_poll_cq", EIO);
			for (k = 0; k < n; k++) {
				if (wc[k].status != IBV_WC_SUCCESS || wc[k].opcode != IBV_WC_SEND) {
					fprintf(stderr, "%s: wr %" PRIu64 ": %s\n", role, wc[k].wr_id,
						ibv_wc_status_str(wc[k].status));
					die("send completion", EIO);
				}
			}
			done += (uint32_t)n;
			depth -= n;
			if (n == 0) {
				if (now() > deadline)
					die("send completions", ETIMEDOUT);
				nap();
			}
		}
		sent += total;
		say("SENT %u", sent);
	}
	for (i = 0; i < (uint32_t)nsrq; i++)
		say("SENT_TO %u %u %016" PRIx64, srqn[i], sent / (uint32_t)nsrq, digest[i]);
	if ((err = ibv_destroy_qp(qp)))
		die("ibv_destroy_qp", err);
	if ((err = ibv_dereg_mr(mr)))
		die("ibv_dereg_mr", err);
	if ((err = ibv_destroy_cq(cq)))
		die("ibv_destroy_cq", err);
	if ((err = ibv_dealloc_pd(pd)))
		die("ibv_dealloc_pd", err);
	if ((err = ibv_close_device(ctx)))
		die("ibv_close_device", err);
	free(buf);
	say("DONE");
	return 0;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: %s creator|worker|sender ...\n", argv[0]);
		return 2;
	}
	role = argv[1];
	if (!strcmp(argv[1], "creator"))
		return creator(argc, argv);
	if (!strcmp(argv[1], "worker"))
		return worker(argc, argv);
	if (!strcmp(argv[1], "sender"))
		return sender(argc, argv);
	fprintf(stderr, "%s: unknown role %s\n", argv[0], argv[1]);
	return 2;
}
