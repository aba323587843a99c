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
#include <endian.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <ccan/list.h>
#include <infiniband/driver.h>
#include <infiniband/kern-abi.h>

#include <vt3_hw.h>
#include <uapi/vt3-abi.h>

#include "wrcheck.h"

/*
 * udata responses: the core uverbs response, then ours right behind it,
 * which is where vt3.ko's ib_copy_to_udata() lands. Only responses are
 * defined, but for modify_srq (below).
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
VT3_RESP(vt3_create_qp_resp, ib_uverbs_create_qp_resp);
VT3_RESP(vt3_create_srq_resp, ib_uverbs_create_srq_resp);

/*
 * modify_srq (resize): our request behind the core one; vt3.ko answers
 * through the address in it (vt3-abi.h).
 */
struct uvt3_modify_srq {
	struct ibv_modify_srq ibv_cmd;
	struct vt3_modify_srq_req drv;
};
static_assert(offsetof(struct uvt3_modify_srq, drv) ==
	      sizeof(struct ibv_modify_srq),
	      "vt3_modify_srq_req follows the core request");

/* create_cq_ex (every CQ): ours behind the extended core response. */
struct uvt3_create_cq_ex_resp {
	struct ib_uverbs_ex_create_cq_resp ibv_resp;
	struct vt3_create_cq_resp drv;
};
static_assert(offsetof(struct uvt3_create_cq_ex_resp, drv) ==
	      sizeof(struct ib_uverbs_ex_create_cq_resp),
	      "vt3_create_cq_resp follows the extended core response");

struct vt3_device {
	struct verbs_device ibv_dev;
	/* As reported by the kernel; goes back in every ioctl header. */
	uint32_t driver_id;
};

/* QP numbers below 2^20 (vt3d hands out small ones, 1 up). */
#define VT3_QP_TABLE_SHIFT	10
#define VT3_QP_TABLE_DIRS	1024
#define VT3_QP_TABLE_MAX	(VT3_QP_TABLE_DIRS << VT3_QP_TABLE_SHIFT)

struct vt3_context {
	struct verbs_context ibv_ctx;
	/* Device limit on the SGEs of an RDMA READ (its local sink). */
	uint32_t max_sge_rd;
	/* VT3_WRCHECK=1 at setup: its QPs and SRQs are watched (wrcheck.c). */
	bool wrcheck;
	/*
	 * Every QP of the context (vt3_qp.ctx_entry), for the async_event
	 * op: the vendor event names its QP only by the low 32 bits of the
	 * user handle (async.c). A QP is on the list from create until
	 * the kernel destroyed it (which waits for its events' accounting).
	 */
	pthread_mutex_t qps_lock;
	struct list_head qps;
	/*
	 * QPs by number, for poll_cq to find a CQE's queue (vt3_qp_find):
	 * directories allocated under qps_lock, entries stored and cleared
	 * with atomics; an entry is cleared under the QP's CQ locks.
	 */
	struct vt3_qp **qp_table[VT3_QP_TABLE_DIRS];
};

struct vt3_cq {
	union {				/* verbs_cq for create_cq_ex */
		struct ibv_cq ibv_cq;
		struct verbs_cq vcq;
	};
	/* Serializes polling; taken before any vt3_wq.lock. */
	pthread_spinlock_t lock;
	uint32_t depth;			/* power of two */
	uint32_t cons;			/* ours; published in status->cons */
	struct vt3_cqe *ring;		/* written by vt3d only: mapped read-only */
	size_t ring_size;
	struct vt3_cq_status *status;	/* prod from vt3d, cons from us */
	/*
	 * Work queues completing here (vt3_wq.cq_entry), under lock: on wqs
	 * those that may still owe flush completions or may yet go into
	 * error (poll_cq looks at them while VT3_CQ_F_ERROR is set), on
	 * flushed those in error whose flush is done. A WR posted to a QP
	 * in error sets repost (atomic), and the next poll moves the queues
	 * of flushed with work again back to wqs: a CQ whose QPs are all
	 * flushed costs poll_cq one atomic exchange, not a walk.
	 */
	struct list_head wqs;
	struct list_head flushed;
	int repost;
	/*
	 * Destroyed QPs whose CQEs may still be in the ring (vt3_gone),
	 * under lock: poll_cq skips them (cq.c).
	 */
	struct list_head gone;
	int ringing;			/* req_notify_cq doorbells in flight (atomic) */
	/*
	 * ibv_cq_ex (cq_ex.c): the completion start_poll/next_poll took,
	 * read by the read_* ops, under lock from start_poll to end_poll.
	 */
	struct ibv_wc cur;
	/* The parent domain it was created on (create_cq_ex), or NULL. */
	struct vt3_pd *domain;
};

struct vt3_gone {
	struct list_node entry;		/* vt3_cq.gone */
	uint32_t qpn;
	uint32_t mark;			/* CQ producer index at the destroy */
};

/*
 * What the provider remembers of a posted WQE, for its flush: vt3d never
 * sees this.
 */
struct vt3_swqe {
	uint64_t wr_id;
	uint8_t wc_opcode;		/* enum ibv_wc_opcode */
};

/*
 * One work queue (SQ or RQ): the mapped ring, our producer index, and a
 * shadow of the WQEs vt3d has not retired. Indices are free running like
 * the device's; WQE i lives in slot i & (depth - 1) of the ring and of
 * swqe. vt3d's consumer index (status page) counts the WQEs it retired,
 * signaled or not, and moves before their CQEs are written.
 */
struct vt3_wq {
	pthread_spinlock_t lock;	/* after the CQ's lock, if both */
	void *ring;			/* VT3_WQE_SIZE slots, consumed by vt3d */
	size_t ring_size;
	uint32_t depth;			/* power of two */
	uint32_t max_sge;
	uint32_t prod;			/* next WQE; published in the status page */
	struct vt3_swqe *swqe;		/* depth entries */
	bool swqe_custom;		/* from the parent domain's allocator */
	__le32 *prod_idx;		/* status page words of this queue */
	__le32 *cons_idx;
	/*
	 * Index after the last WQE whose CQE poll_cq took (vt3_cqe.wqe_idx,
	 * atomic; written under the CQ's lock): the slots before it are
	 * free (vt3_hw.h).
	 */
	uint32_t done;
	uint32_t idle_flag;		/* VT3_QP_F_SQ_IDLE or VT3_QP_F_RQ_IDLE */
	bool recv;
	bool no_doorbell;		/* VT3_TEST_NO_DOORBELL (testing) */
	/*
	 * Flush (docs/architecture.md §5). error: the QP's error flag was seen;
	 * vt3d retires nothing more, so [flush_pos, prod) is what to flush,
	 * and every device CQE of the queue lies below flush_mark in the
	 * CQ. flushing: the CQ consumer passed flush_mark, so poll_cq
	 * completes [flush_pos, prod) with IBV_WC_WR_FLUSH_ERR, and so
	 * everything posted from then on; a device CQE of the queue after
	 * that is not returned. flush_at_done: the device was lost (its CQ
	 * frozen), its consumer index is not trusted: at flush_mark the
	 * flush starts at done instead (vt3_hw.h).
	 */
	bool error;
	bool flushing;
	bool flush_at_done;
	/*
	 * The RQ of a QP of an SRQ (empty: depth 0) noted its error on a
	 * lost device: its CQ may be the one that flushes the SRQ (srq.c).
	 */
	bool srq_lost;
	uint32_t flush_pos;
	uint32_t flush_mark;
	struct vt3_cq *cq;
	struct list_node cq_entry;	/* cq->wqs */
	struct vt3_qp *qp;
	struct vt3_wrcheck_q *check;	/* VT3_WRCHECK, else NULL */
};

/*
 * One SRQ slot (srq.c): which WQE is in it and whether its completion is
 * still owed; free for a post once the CQE of that WQE was taken.
 */
struct vt3_srq_slot {
	uint64_t wr_id;
	uint32_t idx;			/* the WQE's free-running SRQ index */
	bool owed;
};

struct vt3_srq {
	struct ibv_srq ibv_srq;
	/* Producer and slots; taken after a CQ's and a vt3_wq's lock. */
	pthread_spinlock_t lock;
	void *ring;			/* depth vt3_rq_wqe slots; NULL: lost */
	size_t ring_size;
	uint32_t depth;			/* power of two; every entry usable */
	uint32_t max_sge;
	uint32_t prod;
	uint32_t owed;			/* slots with owed set */
	struct vt3_srq_slot *slots;
	bool slots_custom;		/* from the parent domain's allocator */
	struct vt3_srq_status *status;
	/* The parent domain whose allocator gave the slots, or NULL. */
	struct vt3_pd *domain;
	/*
	 * The device was lost: the RQ (of a QP of this SRQ) whose CQ
	 * flushes every owed slot, from flush_pos on (vt3_hw.h); NULL
	 * until one claims it.
	 */
	struct vt3_wq *flusher;
	uint32_t flush_pos;
	struct vt3_wrcheck *wrcheck;	/* VT3_WRCHECK, else NULL */
};

/*
 * A PD, or a parent domain (protection set): the PD's handle, the
 * thread domain and the allocator of the provider's own buffers
 * (pd.c). refs: parent domains on a PD, QPs/SRQs/CQs on a parent
 * domain (atomic); dealloc refuses while there are any.
 */
struct vt3_pd {
	struct ibv_pd ibv_pd;
	struct vt3_pd *protection;
	struct ibv_td *td;
	void *(*alloc)(struct ibv_pd *pd, void *pd_context, size_t size,
		       size_t alignment, uint64_t resource_type);
	void (*free)(struct ibv_pd *pd, void *pd_context, void *ptr,
		     uint64_t resource_type);
	void *pd_context;
	int refs;
};

struct vt3_td {
	struct ibv_td ibv_td;
	int refs;			/* parent domains on it (atomic) */
};

/*
 * What an ibv_wr_opcode makes of an SQ WQE (qp.c: one table for
 * post_send and the ibv_wr_* builders).
 */
struct vt3_send_op {
	bool supported;
	uint8_t opcode;			/* enum vt3_wr_opcode */
	uint8_t opcode_se;		/* the same with IBV_SEND_SOLICITED */
	uint8_t wc_opcode;		/* enum ibv_wc_opcode of its completion */
	bool remote;			/* remote_addr and rkey */
	bool invalidate;		/* invalidate_stag */
	bool data;			/* SGEs or inline data */
	bool sink;			/* SGEs are a READ's sink: not inline, max_sge_rd */
	bool bind;			/* a memory window's bind (vt3_sq_wqe_set_bind) */
};

/* A send WR's header, whichever API gave it. */
struct vt3_send_req {
	uint64_t wr_id;
	unsigned int send_flags;	/* enum ibv_send_flags */
	uint64_t remote_addr;
	uint32_t rkey;
	uint32_t invalidate_rkey;
};

/*
 * A batch of ibv_wr_* between wr_start and wr_complete/wr_abort
 * (qp_ex.c), under sq.lock: WQEs go straight into the ring slots from
 * sq.prod on, published only by wr_complete.
 */
struct vt3_qp_batch {
	uint32_t next;			/* index of the next WQE */
	const struct vt3_send_op *op;	/* of WQE next - 1; NULL: none yet */
	int err;			/* first error: wr_complete posts nothing */
	bool error;			/* the QP was in error at wr_start */
};

struct vt3_qp {
	union {				/* verbs_qp for ibv_qp_ex */
		struct ibv_qp ibv_qp;
		struct verbs_qp vqp;
	};
	struct vt3_wq sq;
	struct vt3_wq rq;
	struct vt3_srq *srq;		/* NULL: the QP has its own RQ */
	uint32_t max_inline;
	uint32_t max_sge_rd;
	bool sig_all;
	/*
	 * enum ibv_qp_state as last set or queried through us (atomic):
	 * tells RESET from INIT and RTR, which vt3d all calls IDLE.
	 */
	int state;
	struct vt3_qp_status *status;	/* producer indices from us, the rest from vt3d */
	struct list_node ctx_entry;	/* vt3_context.qps */
	struct vt3_qp_batch batch;
	/* The parent domain whose allocator gave the shadows, or NULL. */
	struct vt3_pd *domain;
	struct vt3_wrcheck *wrcheck;	/* VT3_WRCHECK, else NULL */
};

static inline struct vt3_device *to_vt3_dev(struct ibv_device *ibdev)
{
	return container_of(ibdev, struct vt3_device, ibv_dev.device);
}

static inline struct vt3_context *to_vt3_ctx(struct ibv_context *ibctx)
{
	return container_of(ibctx, struct vt3_context, ibv_ctx.context);
}

static inline struct vt3_cq *to_vt3_cq(struct ibv_cq *ibcq)
{
	return container_of(ibcq, struct vt3_cq, ibv_cq);
}

static inline struct vt3_qp *to_vt3_qp(struct ibv_qp *ibqp)
{
	return container_of(ibqp, struct vt3_qp, ibv_qp);
}

static inline struct vt3_pd *to_vt3_pd(struct ibv_pd *ibpd)
{
	return container_of(ibpd, struct vt3_pd, ibv_pd);
}

static inline struct vt3_qp *vt3_qp_of_ex(struct ibv_qp_ex *qpx)
{
	return container_of(qpx, struct vt3_qp, vqp.qp_ex);
}

static inline struct vt3_cq *vt3_cq_of_ex(struct ibv_cq_ex *cqx)
{
	return container_of(cqx, struct vt3_cq, vcq.cq_ex);
}

static inline struct vt3_srq *to_vt3_srq(struct ibv_srq *ibsrq)
{
	return container_of(ibsrq, struct vt3_srq, ibv_srq);
}

/* vt3.c: contexts */
struct vt3_context *vt3_context_alloc(struct ibv_device *ibdev, int cmd_fd);
struct verbs_context *vt3_context_setup(struct vt3_context *ctx, int err,
					const struct vt3_alloc_ucontext_resp *resp);

/* import.c: a context, PD and MR taken over from another process */
struct verbs_context *vt3_import_context(struct ibv_device *ibdev, int cmd_fd);
struct ibv_pd *vt3_import_pd(struct ibv_context *ibctx, uint32_t pd_handle);
void vt3_unimport_pd(struct ibv_pd *ibpd);
struct ibv_mr *vt3_import_mr(struct ibv_pd *pd, uint32_t mr_handle);
void vt3_unimport_mr(struct ibv_mr *ibmr);

/* verbs.c: control path, through the kernel */
bool vt3_ring_ok(uint32_t depth, uint32_t map_size, size_t entry_size);
void *vt3_mmap(struct ibv_context *ibctx, size_t len, int prot, uint64_t key,
	       const char *what);
void vt3_munmap(void *p, size_t len);
int vt3_query_device(struct ibv_context *ibctx,
		     const struct ibv_query_device_ex_input *input,
		     struct ibv_device_attr_ex *attr, size_t attr_size);
int vt3_query_port(struct ibv_context *ibctx, uint8_t port,
		   struct ibv_port_attr *attr);
struct ibv_mr *vt3_reg_mr(struct ibv_pd *pd, void *addr, size_t len,
			  uint64_t hca_va, int access);
int vt3_rereg_mr(struct verbs_mr *vmr, int flags, struct ibv_pd *pd,
		 void *addr, size_t length, int access);
int vt3_dereg_mr(struct verbs_mr *vmr);
struct ibv_mw *vt3_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type);
int vt3_dealloc_mw(struct ibv_mw *mw);
int vt3_bind_mw(struct ibv_qp *ibqp, struct ibv_mw *mw,
		struct ibv_mw_bind *mw_bind);
struct ibv_cq *vt3_create_cq(struct ibv_context *ibctx, int cqe,
			     struct ibv_comp_channel *channel, int comp_vector);
int vt3_destroy_cq(struct ibv_cq *ibcq);
struct ibv_cq_ex *vt3_create_cq_ex(struct ibv_context *ibctx,
				   struct ibv_cq_init_attr_ex *attr);
struct ibv_qp *vt3_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
struct ibv_qp *vt3_create_qp_ex(struct ibv_context *ibctx,
				struct ibv_qp_init_attr_ex *attr);
int vt3_modify_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr,
		  int attr_mask);
int vt3_query_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int attr_mask,
		 struct ibv_qp_init_attr *init_attr);
int vt3_destroy_qp(struct ibv_qp *ibqp);
int vt3_qp_table_insert(struct vt3_context *ctx, struct vt3_qp *qp);
void vt3_qp_table_clear(struct vt3_context *ctx, uint32_t qpn);
struct vt3_qp *vt3_qp_find(struct vt3_context *ctx, uint32_t qpn);
void vt3_qp_table_free(struct vt3_context *ctx);

/* pd.c: PDs, parent and thread domains, the provider's buffers */
struct ibv_pd *vt3_alloc_pd(struct ibv_context *ibctx);
int vt3_dealloc_pd(struct ibv_pd *pd);
struct ibv_pd *vt3_alloc_parent_domain(struct ibv_context *ibctx,
				       struct ibv_parent_domain_init_attr *attr);
struct ibv_td *vt3_alloc_td(struct ibv_context *ibctx,
			    struct ibv_td_init_attr *attr);
int vt3_dealloc_td(struct ibv_td *td);
struct vt3_pd *vt3_domain_get(struct ibv_pd *pd);
void vt3_domain_put(struct vt3_pd *domain);
void *vt3_buf_calloc(struct vt3_pd *domain, size_t num, size_t size,
		     uint64_t type, bool *custom);
void vt3_buf_free(struct vt3_pd *domain, void *ptr, uint64_t type, bool custom);

/* qp.c: posting to the mapped SQ/RQ rings */
void *vt3_wq_slot(struct vt3_wq *wq, uint32_t idx);
bool vt3_wq_full(struct vt3_wq *wq, uint32_t prod);
int vt3_wq_post_begin(struct vt3_wq *wq, bool *error);
void vt3_wq_post_end(struct vt3_wq *wq, uint32_t start, bool error);
const struct vt3_send_op *vt3_send_op(unsigned int opcode);
int vt3_sq_wqe_init(struct vt3_qp *qp, const struct vt3_send_op *op,
		    const struct vt3_send_req *req, struct vt3_sq_wqe *wqe,
		    struct vt3_swqe *swqe);
int vt3_sq_wqe_set_sges(struct vt3_qp *qp, const struct vt3_send_op *op,
			struct vt3_sq_wqe *wqe, const struct ibv_sge *sges,
			size_t num);
int vt3_sq_wqe_set_bind(struct vt3_sq_wqe *wqe, const struct ibv_mw *mw,
			uint32_t rkey, const struct ibv_mw_bind_info *info);
int vt3_sq_wqe_set_inline(struct vt3_qp *qp, const struct vt3_send_op *op,
			  struct vt3_sq_wqe *wqe, const struct ibv_data_buf *bufs,
			  size_t num);
int vt3_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr,
		  struct ibv_send_wr **bad_wr);
int vt3_post_recv(struct ibv_qp *ibqp, struct ibv_recv_wr *wr,
		  struct ibv_recv_wr **bad_wr);
int vt3_wq_init(struct vt3_qp *qp, struct vt3_wq *wq, struct vt3_cq *cq,
		bool recv, uint32_t max_sge);
void vt3_wq_cleanup(struct vt3_wq *wq);
void vt3_fill_recv_wqe(struct vt3_rq_wqe *wqe, const struct ibv_recv_wr *wr);
void vt3_qp_reset(struct vt3_qp *qp);
/* The three flush triggers (docs/architecture.md §5): VT3_FLUSH_TRIGGERS. */
enum vt3_trigger {
	VT3_BY_EVENT = 1 << 0,
	VT3_BY_POLL = 1 << 1,
	VT3_BY_POST = 1 << 2,
};

bool vt3_wq_error(struct vt3_wq *wq, enum vt3_trigger by);
bool vt3_qp_check_error(struct vt3_qp *qp, enum vt3_trigger by);
void vt3_wq_doorbell(struct vt3_wq *wq);

/* qp_ex.c: ibv_qp_ex, the ibv_wr_* posting */
int vt3_qp_ex_setup(struct vt3_qp *qp, const struct ibv_qp_init_attr_ex *attr);

/* cq_ex.c: ibv_cq_ex, the start_poll/next_poll/end_poll reading */
void vt3_cq_ex_setup(struct vt3_cq *cq);

/* cq.c: reaping the mapped CQE ring, flushing */
int vt3_cq_poll_locked(struct vt3_cq *cq, int num, struct ibv_wc *wc);
int vt3_poll_cq(struct ibv_cq *ibcq, int num_entries, struct ibv_wc *wc);
int vt3_req_notify_cq(struct ibv_cq *ibcq, int solicited_only);
void vt3_cq_requeue(struct vt3_wq *wq);
void vt3_cq_note_repost(struct vt3_wq *wq);
uint32_t vt3_cq_prod(struct vt3_cq *cq);
void vt3_cq_forget(struct vt3_cq *cq, uint32_t qpn, struct vt3_srq *srq);
bool vt3_cq_frozen(struct vt3_cq *cq);
void vt3_cq_free_gone(struct vt3_cq *cq);
void vt3_cq_wait_ringing(struct vt3_cq *cq);
void vt3_lock_cqs(struct vt3_cq *a, struct vt3_cq *b);
void vt3_unlock_cqs(struct vt3_cq *a, struct vt3_cq *b);

/* srq.c: shared receive queues */
struct ibv_srq *vt3_create_srq(struct ibv_pd *pd,
			       struct ibv_srq_init_attr *attr);
int vt3_modify_srq(struct ibv_srq *ibsrq, struct ibv_srq_attr *attr,
		   int attr_mask);
int vt3_query_srq(struct ibv_srq *ibsrq, struct ibv_srq_attr *attr);
int vt3_destroy_srq(struct ibv_srq *ibsrq);
int vt3_post_srq_recv(struct ibv_srq *ibsrq, struct ibv_recv_wr *wr,
		      struct ibv_recv_wr **bad_wr);
bool vt3_srq_cqe_taken(struct vt3_srq *srq, uint32_t idx, uint64_t *wr_id,
		       bool returned);
int vt3_srq_flush(struct vt3_wq *wq, int num, struct ibv_wc *wc);
bool vt3_srq_flush_pending(struct vt3_wq *wq);
void vt3_srq_wq_gone(struct vt3_wq *wq);

/* async.c: async events (docs/architecture.md §5, trigger 1) */
void vt3_async_event(struct ibv_context *ibctx, struct ibv_async_event *event);

/* Status page words: little endian, shared with vt3d (vt3_hw.h). */
static inline uint32_t vt3_load_acquire(const __le32 *p)
{
	return le32toh(__atomic_load_n(p, __ATOMIC_ACQUIRE));
}

static inline void vt3_store_release(__le32 *p, uint32_t v)
{
	__atomic_store_n(p, htole32(v), __ATOMIC_RELEASE);
}

static inline uint32_t vt3_qp_flags(struct vt3_qp *qp)
{
	return vt3_load_acquire(&qp->status->flags);
}

#endif /* VT3_H */
