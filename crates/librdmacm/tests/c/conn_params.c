/*
 * What rdma_cm's events carry for the program (rdma_get_cm_event(3), `param.conn` and
 * `param.ud`), checked on one daemon between a listener and a connecting id of one process:
 *
 *  - RC: the active side's ESTABLISHED reports the REP's QPN (`param.conn.qp_num`, the
 *    passive side's QP) and its private data. libfabric's XRC keeps that QPN as the target
 *    QP later connections share.
 *  - SIDR (RDMA_PS_UDP): the ESTABLISHED made by the SIDR_REP reports the passive side's UD
 *    QPN (`param.ud.qp_num`) and the SIDR_REP's private data (`param.ud.private_data`).
 *    libfabric's XRC tells an initiator's SIDR ESTABLISHED (the peer's SRQ number in that
 *    data) from a target's by whether it has private data.
 *  - DISCONNECTED (RC): the library leaves the passive side's QP in RTS, as librdmacm does.
 *
 * The passive side puts its QPN in its private data, so the active side can compare.
 * Prints "ok rc" and "ok sidr"; exits 1 with what differed otherwise. Argument: a port.
 */
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void die(const char *what)
{
    perror(what);
    exit(1);
}

static struct rdma_cm_event *expect(struct rdma_event_channel *ch, enum rdma_cm_event_type want)
{
    struct rdma_cm_event *e;
    if (rdma_get_cm_event(ch, &e))
        die("rdma_get_cm_event");
    if (e->event != want) {
        fprintf(stderr, "event %s (status %d), expected %s\n", rdma_event_str(e->event), e->status,
                rdma_event_str(want));
        exit(1);
    }
    return e;
}

struct side {
    struct ibv_pd *pd;
    struct ibv_cq *cq;
};

static void make_qp(struct rdma_cm_id *id, struct side *s, enum ibv_qp_type type)
{
    s->pd = ibv_alloc_pd(id->verbs);
    if (!s->pd)
        die("ibv_alloc_pd");
    s->cq = ibv_create_cq(id->verbs, 16, NULL, NULL, 0);
    if (!s->cq)
        die("ibv_create_cq");
    struct ibv_qp_init_attr a = {
        .send_cq = s->cq,
        .recv_cq = s->cq,
        .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1},
        .qp_type = type,
    };
    if (rdma_create_qp(id, s->pd, &a))
        die("rdma_create_qp");
}

static void free_side(struct rdma_cm_id *id, struct side *s)
{
    rdma_destroy_qp(id);
    ibv_destroy_cq(s->cq);
    ibv_dealloc_pd(s->pd);
}

/* What the passive side answers with: its QPN, then a tag. */
struct answer {
    uint32_t qpn;
    char tag[12];
};

static void run(enum rdma_port_space ps, int port)
{
    int sidr = ps == RDMA_PS_UDP;
    enum ibv_qp_type type = sidr ? IBV_QPT_UD : IBV_QPT_RC;
    const char *what = sidr ? "sidr" : "rc";
    struct rdma_event_channel *sch = rdma_create_event_channel(), *cch = rdma_create_event_channel();
    if (!sch || !cch)
        die("rdma_create_event_channel");
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);

    struct rdma_cm_id *lid, *cid;
    if (rdma_create_id(sch, &lid, NULL, ps) || rdma_create_id(cch, &cid, NULL, ps))
        die("rdma_create_id");
    if (rdma_bind_addr(lid, (struct sockaddr *)&addr) || rdma_listen(lid, 4))
        die("rdma_bind_addr/rdma_listen");

    if (rdma_resolve_addr(cid, NULL, (struct sockaddr *)&addr, 1000))
        die("rdma_resolve_addr");
    rdma_ack_cm_event(expect(cch, RDMA_CM_EVENT_ADDR_RESOLVED));
    if (rdma_resolve_route(cid, 1000))
        die("rdma_resolve_route");
    rdma_ack_cm_event(expect(cch, RDMA_CM_EVENT_ROUTE_RESOLVED));
    struct side cs, ss;
    make_qp(cid, &cs, type);
    struct rdma_conn_param cp = {.private_data = "hello", .private_data_len = 6, .retry_count = 7,
                                 .rnr_retry_count = 7, .responder_resources = 1,
                                 .initiator_depth = 1};
    if (rdma_connect(cid, &cp))
        die("rdma_connect");

    struct rdma_cm_event *req = expect(sch, RDMA_CM_EVENT_CONNECT_REQUEST);
    struct rdma_cm_id *child = req->id;
    rdma_ack_cm_event(req);
    make_qp(child, &ss, type);
    struct answer ans = {.qpn = child->qp->qp_num};
    snprintf(ans.tag, sizeof ans.tag, "%s-world", what);
    struct rdma_conn_param ap = {.private_data = &ans, .private_data_len = sizeof ans,
                                 .responder_resources = 1, .initiator_depth = 1,
                                 .rnr_retry_count = 7, .qp_num = child->qp->qp_num};
    if (rdma_accept(child, &ap))
        die("rdma_accept");

    struct rdma_cm_event *est = expect(cch, RDMA_CM_EVENT_ESTABLISHED);
    const void *pd = sidr ? est->param.ud.private_data : est->param.conn.private_data;
    uint8_t pdlen = sidr ? est->param.ud.private_data_len : est->param.conn.private_data_len;
    uint32_t qpn = sidr ? est->param.ud.qp_num : est->param.conn.qp_num;
    if (qpn != ans.qpn) {
        fprintf(stderr, "%s: ESTABLISHED reports peer QPN %u, the peer's QP is %u\n", what, qpn,
                ans.qpn);
        exit(1);
    }
    if (!pd || pdlen < sizeof ans || memcmp(pd, &ans, sizeof ans)) {
        fprintf(stderr, "%s: ESTABLISHED private data %p/%u is not the peer's answer\n", what, pd,
                pdlen);
        exit(1);
    }
    rdma_ack_cm_event(est);
    if (!sidr) {
        rdma_ack_cm_event(expect(sch, RDMA_CM_EVENT_ESTABLISHED));
        if (rdma_disconnect(cid))
            die("rdma_disconnect");
        rdma_ack_cm_event(expect(cch, RDMA_CM_EVENT_DISCONNECTED));
        rdma_ack_cm_event(expect(sch, RDMA_CM_EVENT_DISCONNECTED));
        /* The peer's DREQ leaves the passive side's QP to the program, as librdmacm does:
         * a library that moved it here would race the program's rdma_destroy_qp. */
        struct ibv_qp_attr qa;
        struct ibv_qp_init_attr qi;
        if (ibv_query_qp(child->qp, &qa, IBV_QP_STATE, &qi))
            die("ibv_query_qp");
        if (qa.qp_state != IBV_QPS_RTS) {
            fprintf(stderr, "%s: passive QP in state %d after DISCONNECTED, expected RTS\n",
                    what, qa.qp_state);
            exit(1);
        }
    }
    free_side(cid, &cs);
    free_side(child, &ss);
    rdma_destroy_id(cid);
    rdma_destroy_id(child);
    rdma_destroy_id(lid);
    rdma_destroy_event_channel(cch);
    rdma_destroy_event_channel(sch);
    printf("ok %s\n", what);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    int port = argc > 1 ? atoi(argv[1]) : 7590;
    run(RDMA_PS_TCP, port);
    run(RDMA_PS_UDP, port + 1);
    return 0;
}
