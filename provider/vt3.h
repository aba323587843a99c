/* SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB */
/*
 * libvt3: rdma-core provider for the vt3 virtual iWARP RNIC.
 *
 * The kernel (vt3.ko) allocates every ring and status page; this library
 * maps them through the uverbs fd with the keys vt3.ko returns in udata.
 * Layouts and ordering rules: vt3_hw.h. udata: uapi/vt3-abi.h.
 */
#ifndef VT3_H
#define VT3_H

#include <assert.h>
#include <stddef.h>
#include <stdint.h>

#include <infiniband/driver.h>
#include <infiniband/kern-abi.h>

#include <vt3_hw.h>
#include <uapi/vt3-abi.h>

/*
 * udata responses: the core uverbs response, then ours right behind it,
 * which is where vt3.ko's ib_copy_to_udata() lands. Only responses are
 * defined: vt3.ko reads no request udata.
 */
#define VT3_RESP(name, core)				\
	struct u##name {				\
		struct core ibv_resp;			\
		struct name drv;			\
	};						\
	static_assert(offsetof(struct u##name, drv) ==	\
		      sizeof(struct core), #name " follows the core response")

VT3_RESP(vt3_alloc_ucontext_resp, ib_uverbs_get_context_resp);
VT3_RESP(vt3_alloc_pd_resp, ib_uverbs_alloc_pd_resp);
VT3_RESP(vt3_create_cq_resp, ib_uverbs_create_cq_resp);
VT3_RESP(vt3_create_qp_resp, ib_uverbs_create_qp_resp);

struct vt3_device {
	struct verbs_device ibv_dev;
	/* As reported by the kernel; goes back in every ioctl header. */
	uint32_t driver_id;
};

struct vt3_context {
	struct verbs_context ibv_ctx;
};

struct vt3_cq {
	struct ibv_cq ibv_cq;
	uint32_t depth;			/* power of two */
	struct vt3_cqe *ring;		/* written by vt3d only: mapped read-only */
	size_t ring_size;
	struct vt3_cq_status *status;	/* prod from vt3d, cons from us */
};

struct vt3_qp {
	struct ibv_qp ibv_qp;
	uint32_t sq_depth;		/* powers of two */
	uint32_t rq_depth;
	uint32_t max_inline;
	struct vt3_sq_wqe *sq;		/* produced here, consumed by vt3d */
	size_t sq_size;
	struct vt3_rq_wqe *rq;
	size_t rq_size;
	struct vt3_qp_status *status;	/* producer indices from us, the rest from vt3d */
};

static inline struct vt3_device *to_vt3_dev(struct ibv_device *ibdev)
{
	return container_of(ibdev, struct vt3_device, ibv_dev.device);
}

static inline struct vt3_cq *to_vt3_cq(struct ibv_cq *ibcq)
{
	return container_of(ibcq, struct vt3_cq, ibv_cq);
}

static inline struct vt3_qp *to_vt3_qp(struct ibv_qp *ibqp)
{
	return container_of(ibqp, struct vt3_qp, ibv_qp);
}

/* verbs.c: control path, through the kernel */
int vt3_query_device(struct ibv_context *ibctx,
		     const struct ibv_query_device_ex_input *input,
		     struct ibv_device_attr_ex *attr, size_t attr_size);
int vt3_query_port(struct ibv_context *ibctx, uint8_t port,
		   struct ibv_port_attr *attr);
struct ibv_pd *vt3_alloc_pd(struct ibv_context *ibctx);
int vt3_dealloc_pd(struct ibv_pd *pd);
struct ibv_mr *vt3_reg_mr(struct ibv_pd *pd, void *addr, size_t len,
			  uint64_t hca_va, int access);
int vt3_dereg_mr(struct verbs_mr *vmr);
struct ibv_cq *vt3_create_cq(struct ibv_context *ibctx, int cqe,
			     struct ibv_comp_channel *channel, int comp_vector);
int vt3_destroy_cq(struct ibv_cq *ibcq);
struct ibv_qp *vt3_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
int vt3_modify_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr,
		  int attr_mask);
int vt3_query_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int attr_mask,
		 struct ibv_qp_init_attr *init_attr);
int vt3_destroy_qp(struct ibv_qp *ibqp);

/* qp.c: posting to the mapped SQ/RQ rings */
int vt3_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr,
		  struct ibv_send_wr **bad_wr);
int vt3_post_recv(struct ibv_qp *ibqp, struct ibv_recv_wr *wr,
		  struct ibv_recv_wr **bad_wr);

/* cq.c: reaping the mapped CQE ring */
int vt3_poll_cq(struct ibv_cq *ibcq, int num_entries, struct ibv_wc *wc);
int vt3_req_notify_cq(struct ibv_cq *ibcq, int solicited_only);

#endif /* VT3_H */
