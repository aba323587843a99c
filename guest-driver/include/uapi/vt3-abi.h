/* SPDX-License-Identifier: ((GPL-2.0 WITH Linux-syscall-note) OR Linux-OpenIB) */
/*
 * vt3-abi.h - uverbs udata between vt3.ko and libvt3 (the rdma-core
 * provider). The kernel allocates every ring and status page; the provider
 * maps them with mmap(offset = the key returned here) on the uverbs fd.
 * Layouts of what is mapped are in vt3_hw.h.
 */
#ifndef VT3_ABI_USER_H
#define VT3_ABI_USER_H

#include <linux/types.h>
#include <rdma/ib_user_ioctl_cmds.h>

/* Bumped on any incompatible change; the provider refuses a mismatch. */
#define VT3_ABI_VERSION		3

/*
 * Vendor async event (docs/architecture.md §5): a user QP's connection closed
 * gracefully and no SQ WQE was flushed -- the case where a T3 posted no
 * event at all. vt3.ko dispatches it through the QP's event handler, so
 * uverbs reports it with the QP's user handle; libibverbs does not know
 * the type and passes it on as a port event, and libvt3's async_event op
 * turns it back into a QP event (element.qp) and does the QP's event
 * accounting. The value is outside enum ib_event_type on purpose.
 */
#define VT3_EVENT_LLP_CLOSE_COMPLETE	0x8001

struct vt3_alloc_ucontext_resp {
	__u32	abi_version;		/* VT3_ABI_VERSION */
	__u32	wqe_size;		/* VT3_WQE_SIZE */
	__u32	cqe_size;		/* sizeof(struct vt3_cqe) */
	__u32	max_inline;
};

/*
 * Importing a context, PD or MR into another process (ibv_import_device(),
 * ibv_import_pd()): driver attributes and methods of the ioctl uverbs,
 * in the driver's id space.
 *
 * UVERBS_METHOD_QUERY_CONTEXT returns, in VT3_ATTR_QUERY_CONTEXT_RESP_UCTX,
 * the struct vt3_alloc_ucontext_resp that created the context, so an
 * importer checks the same ABI its creator did.
 */
enum vt3_query_context_attrs {
	VT3_ATTR_QUERY_CONTEXT_RESP_UCTX = (1U << UVERBS_ID_NS_SHIFT),
};

/* UVERBS_OBJECT_PD: VT3_METHOD_PD_QUERY, a PD handle of the context -> pdn. */
enum vt3_pd_methods {
	VT3_METHOD_PD_QUERY = (1U << UVERBS_ID_NS_SHIFT),
};

enum vt3_query_pd_attrs {
	VT3_ATTR_QUERY_PD_HANDLE = (1U << UVERBS_ID_NS_SHIFT),
	VT3_ATTR_QUERY_PD_RESP_PDN,
};

struct vt3_alloc_pd_resp {
	__u32	pdn;
	__u32	reserved;
};

struct vt3_create_cq_resp {
	__aligned_u64	ring_key;	/* mmap offset of the CQE ring */
	__aligned_u64	status_key;	/* mmap offset of the vt3_cq_status page */
	__u32	cqn;
	__u32	depth;			/* entries in the ring (power of two) */
	__u32	ring_size;		/* bytes to map */
	__u32	reserved;
};

struct vt3_create_qp_resp {
	__aligned_u64	sq_key;
	__aligned_u64	rq_key;
	__aligned_u64	status_key;	/* vt3_qp_status page */
	__u32	qpn;
	__u32	sq_depth;		/* power of two */
	__u32	rq_depth;		/* power of two */
	__u32	sq_size;		/* bytes to map */
	__u32	rq_size;
	__u32	max_inline;
};

/* A user SRQ: the provider maps the ring and the vt3_srq_status page. */
struct vt3_create_srq_resp {
	__aligned_u64	ring_key;	/* mmap offset of the vt3_rq_wqe ring */
	__aligned_u64	status_key;	/* mmap offset of the vt3_srq_status page */
	__u32	srqn;
	__u32	depth;			/* power of two */
	__u32	ring_size;		/* bytes to map */
	__u32	reserved;
};

/*
 * ibv_modify_srq with IBV_SRQ_MAX_WR (resize): uverbs' modify_srq has
 * request udata but no response, so the provider names in the request
 * the address of a struct vt3_resize_srq_resp that vt3.ko fills (with
 * copy_to_user) before vt3d switches to the new ring; the command's
 * result says whether it did. Without IBV_SRQ_MAX_WR the request is
 * empty or zeroes. vt3.ko copies the WQEs into the new ring itself
 * (docs/architecture.md §3.4); the provider must not post
 * until the command returned, then maps the new ring and unmaps the old.
 */
struct vt3_modify_srq_req {
	__aligned_u64	resize_resp;	/* user address, or 0 */
};

struct vt3_resize_srq_resp {
	__aligned_u64	ring_key;	/* mmap offset of the new ring */
	__u32	depth;			/* 0: the ring stayed (it held max_wr) */
	__u32	ring_size;		/* bytes to map */
};

#endif /* VT3_ABI_USER_H */
