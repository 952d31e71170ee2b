/*
 * softverbs: the legacy OFED XRC API and the minimal register/unregister pair.
 *
 * Exported by the softverbs drop-in libibverbs.so.1 in version node SOFTVERBS_XRC_1.0, next to
 * rdma-core 44's whole ABI. Include it after <infiniband/verbs.h>.
 *
 * One mechanism behind three faces: a legacy XRC domain IS an upstream struct ibv_xrcd
 * (opened by the inode of `fd`, shared by every process that opens the same file), a
 * registration is this process's hold on a shared XRC receive QP, and the QP lives exactly as
 * long as some process holds it (a registration, or an upstream handle from ibv_create_qp_ex /
 * ibv_open_qp). A process that exits, even by SIGKILL, drops its holds. Async events of a
 * receive QP reach every holder; a registration sees them with IBV_XRC_QP_EVENT_FLAG set in
 * event_type and the QP number in element (read it with ibv_xrc_event_qp_num()).
 *
 * Errors are positive errno values (0 on success), as the OFED header documented.
 * Differences from OFED 1.5: the domain is passed to ibv_create_xrc_rcv_qp() as its first
 * argument (rdma-core's struct ibv_qp_init_attr has no xrc_domain field), and the remote SRQ
 * of a send is named with rdma-core's wr.qp_type.xrc.remote_srqn (ibv_xrc_set_remote_srqn()).
 */
#ifndef SOFTVERBS_XRC_LEGACY_H
#define SOFTVERBS_XRC_LEGACY_H

#include <stdint.h>
#include <infiniband/verbs.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The legacy name of the domain object. */
#define ibv_xrc_domain ibv_xrcd

/* OR-ed into ibv_async_event.event_type for events delivered to a registration. */
#define IBV_XRC_QP_EVENT_FLAG 0x80000000u

/* Opens (oflag O_CREAT: creating if needed; O_EXCL: only creating) the domain of `fd`;
 * fd -1 gives a private domain. NULL with errno on failure. */
struct ibv_xrc_domain *ibv_open_xrc_domain(struct ibv_context *context, int fd, int oflag);

/* Closes this process's handle; EBUSY while its SRQs, QPs or registrations use it. */
int ibv_close_xrc_domain(struct ibv_xrc_domain *d);

/* An XRC SRQ in the domain whose completions go to xrc_cq. Its number for senders:
 * ibv_get_srq_num(). */
struct ibv_srq *ibv_create_xrc_srq(struct ibv_pd *pd, struct ibv_xrc_domain *xrc_domain,
				   struct ibv_cq *xrc_cq, struct ibv_srq_init_attr *srq_init_attr);

/* Creates a receive QP in the domain and registers this process with it; the QP number is
 * written to *xrc_rcv_qpn. init_attr may be NULL (its fields are ignored). */
int ibv_create_xrc_rcv_qp(struct ibv_xrc_domain *xrc_domain, struct ibv_qp_init_attr *init_attr,
			  uint32_t *xrc_rcv_qpn);

/* Any holder may modify or query the QP (RESET->INIT->RTR is enough to receive). */
int ibv_modify_xrc_rcv_qp(struct ibv_xrc_domain *xrc_domain, uint32_t xrc_qp_num,
			  struct ibv_qp_attr *attr, int attr_mask);
int ibv_query_xrc_rcv_qp(struct ibv_xrc_domain *xrc_domain, uint32_t xrc_qp_num,
			 struct ibv_qp_attr *attr, int attr_mask,
			 struct ibv_qp_init_attr *init_attr);

/* Registers this process with an existing receive QP of the domain (EINVAL if there is none).
 * Registering again succeeds and needs one more unregister. */
int ibv_reg_xrc_rcv_qp(struct ibv_xrc_domain *xrc_domain, uint32_t xrc_qp_num);

/* Drops one registration; the last holder's unregister destroys the QP (and succeeds). */
int ibv_unreg_xrc_rcv_qp(struct ibv_xrc_domain *xrc_domain, uint32_t xrc_qp_num);

/* The minimal pair proposed in the 2010 thread: *qp_num == IBV_XRC_NEW_QP creates a receive
 * QP and registers (the number is written back); any other value registers with that QP.
 * Unregister as above. */
#define IBV_XRC_NEW_QP 0xffffffffu
int ibv_xrc_rcv_qp_register(struct ibv_xrcd *xrcd, uint32_t *qp_num);
int ibv_xrc_rcv_qp_unregister(struct ibv_xrcd *xrcd, uint32_t qp_num);

/* Names the destination XRC SRQ of a send on an XRC send QP. */
static inline void ibv_xrc_set_remote_srqn(struct ibv_send_wr *wr, uint32_t srqn)
{
	wr->qp_type.xrc.remote_srqn = srqn;
}

/* The QP number of an event delivered to a registration (0 if it is not one). */
static inline uint32_t ibv_xrc_event_qp_num(const struct ibv_async_event *ev)
{
	if (!((uint32_t)ev->event_type & IBV_XRC_QP_EVENT_FLAG))
		return 0;
	return (uint32_t)(uintptr_t)ev->element.qp;
}

/* The event type without the flag. */
static inline enum ibv_event_type ibv_xrc_event_type(const struct ibv_async_event *ev)
{
	return (enum ibv_event_type)((uint32_t)ev->event_type & ~IBV_XRC_QP_EVENT_FLAG);
}

#ifdef __cplusplus
}
#endif

#endif /* SOFTVERBS_XRC_LEGACY_H */
