/* What real stacks read from a UD receive completion and from ibv_query_device_ex
 * (docs/design/roce-wire.md "UD receive completions", docs/guide/dropin.md "ibv_query_device_ex").
 *
 *   ud_completion recv   prints "qp QPN GID", reads "peer QPN GID", checks one datagram
 *   ud_completion send   prints "qp QPN GID", reads "peer QPN GID", sends one datagram
 *   ud_completion device checks every ibv_device_attr_ex field of rdma-core 44
 *
 * GIDs travel as 32 hex digits. Both roles use GID index 0 of port 1. */
#include "check.h"

#include <inttypes.h>
#include <time.h>

#define QKEY 0x11111111u
#define PAYLOAD 64

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *cq;
static struct ibv_qp *qp;
static union ibv_gid gid;
static char buf[40 + PAYLOAD];
static struct ibv_mr *mr;

static void open_first(void)
{
	struct ibv_device **l = ibv_get_device_list(NULL);

	if (!l || !l[0])
		fatal("ibv_get_device_list");
	ctx = ibv_open_device(l[0]);
	if (!ctx)
		fatal("ibv_open_device");
	ibv_free_device_list(l);
}

static void ud_setup(void)
{
	struct ibv_qp_init_attr ia;
	struct ibv_qp_attr a;
	int i;

	open_first();
	pd = ibv_alloc_pd(ctx);
	cq = ibv_create_cq(ctx, 8, NULL, NULL, 0);
	if (!pd || !cq)
		fatal("pd/cq");
	mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	if (!mr)
		fatal("ibv_reg_mr");
	memset(&ia, 0, sizeof(ia));
	ia.send_cq = cq;
	ia.recv_cq = cq;
	ia.qp_type = IBV_QPT_UD;
	ia.cap.max_send_wr = 4;
	ia.cap.max_recv_wr = 4;
	ia.cap.max_send_sge = 1;
	ia.cap.max_recv_sge = 1;
	qp = ibv_create_qp(pd, &ia);
	if (!qp)
		fatal("ibv_create_qp UD");
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
	if (ibv_query_gid(ctx, 1, 0, &gid))
		fatal("ibv_query_gid");
	printf("qp %u ", qp->qp_num);
	for (i = 0; i < 16; i++)
		printf("%02x", gid.raw[i]);
	printf("\n");
	fflush(stdout);
}

static void read_peer(uint32_t *qpn, union ibv_gid *g)
{
	char line[128], hex[33];
	int i;

	if (!fgets(line, sizeof(line), stdin) || sscanf(line, "peer %u %32s", qpn, hex) != 2)
		fatal("peer line");
	for (i = 0; i < 16; i++) {
		unsigned v;

		sscanf(hex + 2 * i, "%2x", &v);
		g->raw[i] = (uint8_t)v;
	}
}

static int poll_one(struct ibv_wc *wc)
{
	struct timespec t0, t;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		int n = ibv_poll_cq(cq, 1, wc);

		if (n != 0)
			return n;
		clock_gettime(CLOCK_MONOTONIC, &t);
		if (t.tv_sec - t0.tv_sec > 5)
			return 0;
	}
}

static int is_v4_mapped(const union ibv_gid *g)
{
	static const uint8_t prefix[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff };

	return memcmp(g->raw, prefix, 12) == 0;
}

/* The Internet checksum of n bytes (RFC 1071): 0 over a header whose checksum is right. */
static uint16_t ip_checksum(const uint8_t *p, int n)
{
	uint32_t sum = 0;
	int i;

	for (i = 0; i + 1 < n; i += 2)
		sum += (uint32_t)(p[i] << 8 | p[i + 1]);
	while (sum >> 16)
		sum = (sum & 0xffff) + (sum >> 16);
	return (uint16_t)~sum;
}

/* Whether UCX 1.13's UD receive check (uct_ud_iface_check_grh, on by default:
 * UCX_UD_VERBS_ETH_DGID_CHECK=y) keeps this datagram: it takes the packet type from wc.sl
 * (mlx5's L3 header type, 2 = IPv4), reads the destination address at the end of the GRH
 * area (bytes 36-39 as an IPv4-mapped GID for IPv4, bytes 24-39 otherwise) and keeps the
 * datagram only if that GID is one of the port's non-zero GIDs. */
static int ucx_keeps(const uint8_t *g, uint8_t sl)
{
	static const union ibv_gid zero_gid;
	struct ibv_port_attr pa;
	union ibv_gid dgid, t;
	int i;

	memset(&dgid, 0, sizeof(dgid));
	if ((sl & 7) == 2) {
		dgid.raw[10] = dgid.raw[11] = 0xff;
		memcpy(dgid.raw + 12, g + 36, 4);
	} else {
		memcpy(dgid.raw, g + 24, 16);
	}
	if (ibv_query_port(ctx, 1, &pa))
		return 0;
	for (i = 0; i < pa.gid_tbl_len; i++) {
		if (ibv_query_gid(ctx, 1, i, &t) || !memcmp(&t, &zero_gid, sizeof(t)))
			continue;
		if (!memcmp(&t, &dgid, sizeof(t)))
			return 1;
	}
	return 0;
}

static int role_recv(void)
{
	struct ibv_sge sge = { (uintptr_t)buf, sizeof(buf), mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = 7, .sg_list = &sge, .num_sge = 1 }, *bad;
	union ibv_gid peer;
	uint32_t peer_qpn;
	struct ibv_wc wc;
	const uint8_t *g = (const uint8_t *)buf;
	static const uint8_t zero[20];
	int v4, i, udp_len, payload_ok = 1;

	if (ibv_post_recv(qp, &wr, &bad))
		fatal("ibv_post_recv");
	printf("posted\n");
	fflush(stdout);
	read_peer(&peer_qpn, &peer);
	memset(&wc, 0, sizeof(wc));
	wc.sl = 0xee;
	wc.pkey_index = 0xeeee;
	wc.dlid_path_bits = 0xee;
	if (poll_one(&wc) != 1 || wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RECV) {
		check("ud_recv_completes", 0, "no successful IBV_WC_RECV within 5 s");
		return summary("ud_completion");
	}
	check("ud_recv_completes", wc.byte_len == 40 + PAYLOAD, "byte_len is not 40 + payload");
	v4 = is_v4_mapped(&gid) && is_v4_mapped(&peer);
	/* mlx5's L3 header type, what UCX's uct_ud_iface_check_grh reads: 2 IPv4, 1 IPv6. */
	check("ud_recv_sl_is_l3_type", wc.sl == (v4 ? 2 : 1), "wc.sl is not the L3 header type");
	check("ud_recv_wc_grh", (wc.wc_flags & IBV_WC_GRH) != 0, "IBV_WC_GRH not set");
	check("ud_recv_src_qp", wc.src_qp == peer_qpn, "src_qp is not the sender's QPN");
	check("ud_recv_qp_num", wc.qp_num == qp->qp_num, "qp_num is not ours");
	check("ud_recv_pkey_index", wc.pkey_index == 0, "pkey_index is not 0 (the only P_Key)");
	check("ud_recv_slid_path_bits", wc.slid == 0 && wc.dlid_path_bits == 0,
	      "RoCE has no LIDs: slid and dlid_path_bits must be 0");
	/* The datagram's UDP length: UDP header, BTH, DETH, payload, ICRC. */
	udp_len = 8 + 12 + 8 + PAYLOAD + 4;
	if (v4) {
		/* The kernel's layout (rxe_resp.c, build_rdma_network_hdr; the RoCE v2 annex
		 * A17.4.5.2): 20 zero bytes, then the IPv4 header the datagram arrived with —
		 * version 4, IHL 5, the total length, DF and no fragment, a TTL, protocol UDP, a
		 * checksum that verifies, the peers' addresses. */
		check("ud_recv_grh_ipv4_layout",
		      memcmp(g, zero, 20) == 0 && g[20] == 0x45 &&
			      (g[22] << 8 | g[23]) == 20 + udp_len &&
			      (g[26] << 8 | g[27]) == 0x4000 && g[28] != 0 && g[29] == 17 &&
			      ip_checksum(g + 20, 20) == 0 &&
			      memcmp(g + 32, peer.raw + 12, 4) == 0 &&
			      memcmp(g + 36, gid.raw + 12, 4) == 0,
		      "GRH area is not 20 zero bytes + the IPv4 header the datagram arrived with");
	} else {
		/* The IPv6 header: version 6, the payload length, next header UDP, a hop limit,
		 * the peers' GIDs. */
		check("ud_recv_grh_ipv6_layout",
		      (g[0] >> 4) == 6 && (g[4] << 8 | g[5]) == udp_len && g[6] == 17 &&
			      g[7] != 0 && memcmp(g + 8, peer.raw, 16) == 0 &&
			      memcmp(g + 24, gid.raw, 16) == 0,
		      "GRH area is not the IPv6 header the datagram arrived with");
	}
	check("ud_recv_ucx_keeps", ucx_keeps(g, wc.sl),
	      "UCX's UD receive check would drop this datagram (its DGID is not a port GID)");
	for (i = 0; i < PAYLOAD; i++)
		payload_ok &= buf[40 + i] == (char)(i + 1);
	check("ud_recv_payload", payload_ok, "payload after the GRH differs");
	return summary("ud_completion");
}

static int role_send(void)
{
	struct ibv_ah_attr aa;
	struct ibv_ah *ah;
	union ibv_gid peer;
	uint32_t peer_qpn;
	struct ibv_sge sge = { (uintptr_t)buf, PAYLOAD, mr->lkey };
	struct ibv_send_wr wr, *bad;
	struct ibv_wc wc;
	int i;

	read_peer(&peer_qpn, &peer);
	for (i = 0; i < PAYLOAD; i++)
		buf[i] = (char)(i + 1);
	memset(&aa, 0, sizeof(aa));
	aa.is_global = 1;
	aa.grh.dgid = peer;
	aa.grh.sgid_index = 0;
	aa.grh.hop_limit = 64;
	aa.port_num = 1;
	ah = ibv_create_ah(pd, &aa);
	if (!ah)
		fatal("ibv_create_ah");
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = 9;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_SEND;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.ud.ah = ah;
	wr.wr.ud.remote_qpn = peer_qpn;
	wr.wr.ud.remote_qkey = QKEY;
	if (ibv_post_send(qp, &wr, &bad))
		fatal("ibv_post_send");
	check("ud_send_completes", poll_one(&wc) == 1 && wc.status == IBV_WC_SUCCESS,
	      "no successful send completion within 5 s");
	return summary("ud_completion");
}

static int role_device(void)
{
	struct ibv_device_attr_ex x;

	open_first();
	memset(&x, 0xa5, sizeof(x));
	if (ibv_query_device_ex(ctx, NULL, &x)) {
		check("query_device_ex", 0, "ibv_query_device_ex failed");
		return summary("ud_completion");
	}
	check("query_device_ex", 1, "");
	check("dx_comp_mask_zero", x.comp_mask == 0, "comp_mask is not 0");
	/* On-demand paging with the implicit MR; each transport's operations (UC has no READ or
	 * atomics, UD no RDMA); tests/c/odp.c exercises them. */
	check("dx_odp_caps",
	      x.odp_caps.general_caps == (IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT) &&
		      x.odp_caps.per_transport_caps.rc_odp_caps == 0x3f &&
		      x.odp_caps.per_transport_caps.uc_odp_caps ==
			      (IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE |
			       IBV_ODP_SUPPORT_SRQ_RECV) &&
		      x.odp_caps.per_transport_caps.ud_odp_caps ==
			      (IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_SRQ_RECV) &&
		      x.xrc_odp_caps == 0x3f,
	      "ODP capabilities are not the device's");
	/* Completion timestamps count nanoseconds: a full 64-bit mask at 1 GHz (in kHz). */
	check("dx_timestamp_clock", x.completion_timestamp_mask == UINT64_MAX &&
		      x.hca_core_clock == 1000000,
	      "timestamp mask / clock are not the nanosecond clock");
	/* The low 32 bits are ibv_device_attr's flags; no extended flag (raw scatter FCS, PCI
	 * write end padding, ...) is claimed. */
	check("dx_cap_flags_ex", x.device_cap_flags_ex == (uint64_t)x.orig_attr.device_cap_flags,
	      "device_cap_flags_ex claims more than device_cap_flags");
	check("dx_no_tso", x.tso_caps.max_tso == 0 && x.tso_caps.supported_qpts == 0, "TSO claimed");
	check("dx_no_rss", x.rss_caps.supported_qpts == 0 && x.rss_caps.max_rwq_indirection_tables == 0 &&
		      x.rss_caps.max_rwq_indirection_table_size == 0 &&
		      x.rss_caps.rx_hash_fields_mask == 0 && x.rss_caps.rx_hash_function == 0,
	      "RSS claimed");
	check("dx_no_wq", x.max_wq_type_rq == 0, "receive WQs claimed");
	check("dx_no_pacing", x.packet_pacing_caps.qp_rate_limit_min == 0 &&
		      x.packet_pacing_caps.qp_rate_limit_max == 0 &&
		      x.packet_pacing_caps.supported_qpts == 0,
	      "packet pacing claimed");
	check("dx_no_raw_packet", x.raw_packet_caps == 0, "raw packet caps claimed");
	check("dx_no_tag_matching", x.tm_caps.max_rndv_hdr_size == 0 && x.tm_caps.max_num_tags == 0 &&
		      x.tm_caps.flags == 0 && x.tm_caps.max_ops == 0 && x.tm_caps.max_sge == 0,
	      "tag matching claimed");
	check("dx_no_cq_moderation", x.cq_mod_caps.max_cq_count == 0 && x.cq_mod_caps.max_cq_period == 0,
	      "CQ moderation claimed");
	check("dx_no_device_memory", x.max_dm_size == 0, "device memory claimed");
	check("dx_no_pci_atomics", x.pci_atomic_caps.fetch_add == 0 &&
		      x.pci_atomic_caps.swap == 0 && x.pci_atomic_caps.compare_swap == 0,
	      "PCIe atomics claimed");
	check("dx_phys_port_cnt_ex", x.phys_port_cnt_ex == x.orig_attr.phys_port_cnt &&
		      x.phys_port_cnt_ex == 1,
	      "phys_port_cnt_ex differs from phys_port_cnt");
	/* Claimed-off capabilities really are off. */
	{
		struct ibv_cq_ex *cx;
		struct ibv_cq_init_attr_ex ca;
		struct ibv_modify_cq_attr m;
		struct ibv_alloc_dm_attr da = { .length = 64 };
		int r;

		memset(&ca, 0, sizeof(ca));
		ca.cqe = 4;
		ca.wc_flags = IBV_WC_STANDARD_FLAGS;
		cx = ibv_create_cq_ex(ctx, &ca);
		memset(&m, 0, sizeof(m));
		m.attr_mask = IBV_CQ_ATTR_MODERATE;
		m.moderate.cq_count = 1;
		m.moderate.cq_period = 1;
		r = cx ? ibv_modify_cq(ibv_cq_ex_to_cq(cx), &m) : -1;
		check("dx_modify_cq_unsupported", cx && r == EOPNOTSUPP, "ibv_modify_cq did not say EOPNOTSUPP");
		if (cx)
			ibv_destroy_cq(ibv_cq_ex_to_cq(cx));
		errno = 0;
		check("dx_alloc_dm_unsupported", ibv_alloc_dm(ctx, &da) == NULL && errno == EOPNOTSUPP,
		      "ibv_alloc_dm did not fail with EOPNOTSUPP");
	}
	return summary("ud_completion");
}

int main(int argc, char **argv)
{
	if (argc != 2)
		return 2;
	if (!strcmp(argv[1], "device"))
		return role_device();
	ud_setup();
	if (!strcmp(argv[1], "recv"))
		return role_recv();
	if (!strcmp(argv[1], "send"))
		return role_send();
	return 2;
}
