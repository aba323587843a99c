// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
/*
 * libvt3 control path: every verb here is a uverbs command to vt3.ko, which
 * turns it into a control frame to vt3d. What the kernel hands back for CQs
 * and QPs (rings, status pages) is mapped into this process.
 */
#include <config.h>

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <ccan/minmax.h>

#include "vt3.h"

int vt3_query_device(struct ibv_context *ibctx,
		     const struct ibv_query_device_ex_input *input,
		     struct ibv_device_attr_ex *attr, size_t attr_size)
{
	struct ib_uverbs_ex_query_device_resp resp;
	size_t resp_size = sizeof(resp);
	uint64_t fw;
	int ret;

	ret = ibv_cmd_query_device_any(ibctx, input, attr, attr_size, &resp,
				       &resp_size);
	if (ret)
		return ret;

	/* vt3.ko packs the firmware version as major.minor.sub, 16 bits each. */
	fw = resp.base.fw_ver;
	snprintf(attr->orig_attr.fw_ver, sizeof(attr->orig_attr.fw_ver),
		 "%u.%u.%u", (unsigned int)(fw >> 32) & 0xffff,
		 (unsigned int)(fw >> 16) & 0xffff, (unsigned int)fw & 0xffff);
	return 0;
}

int vt3_query_port(struct ibv_context *ibctx, uint8_t port,
		   struct ibv_port_attr *attr)
{
	struct ibv_query_port cmd = {};

	return ibv_cmd_query_port(ibctx, port, attr, &cmd, sizeof(cmd));
}

struct ibv_mr *vt3_reg_mr(struct ibv_pd *pd, void *addr, size_t len,
			  uint64_t hca_va, int access)
{
	struct ib_uverbs_reg_mr_resp resp = {};
	struct ibv_reg_mr cmd = {};
	struct verbs_mr *vmr;
	int ret;

	vmr = calloc(1, sizeof(*vmr));
	if (!vmr)
		return NULL;

	ret = ibv_cmd_reg_mr(pd, addr, len, hca_va, access, vmr, &cmd,
			     sizeof(cmd), &resp, sizeof(resp));
	if (ret) {
		free(vmr);
		errno = ret;
		return NULL;
	}
	return &vmr->ibv_mr;
}

/*
 * ibv_rereg_mr: vt3.ko changes the MR in place (same lkey and rkey); the
 * caller's errno says why it failed (EBUSY: memory windows are bound).
 */
int vt3_rereg_mr(struct verbs_mr *vmr, int flags, struct ibv_pd *pd,
		 void *addr, size_t length, int access)
{
	struct ib_uverbs_rereg_mr_resp resp = {};
	struct ibv_rereg_mr cmd = {};
	int ret;

	ret = ibv_cmd_rereg_mr(vmr, flags, addr, length, (uintptr_t)addr,
			       access, pd, &cmd, sizeof(cmd), &resp,
			       sizeof(resp));
	if (ret)
		errno = ret;
	return ret;
}

int vt3_dereg_mr(struct verbs_mr *vmr)
{
	int ret;

	ret = ibv_cmd_dereg_mr(vmr);
	if (ret)
		return ret;

	free(vmr);
	return 0;
}

/* An unbound window of @pd; vt3.ko checks the type. */
struct ibv_mw *vt3_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type)
{
	struct ib_uverbs_alloc_mw_resp resp = {};
	struct ibv_alloc_mw cmd = {};
	struct ibv_mw *mw;
	int ret;

	mw = calloc(1, sizeof(*mw));
	if (!mw)
		return NULL;
	ret = ibv_cmd_alloc_mw(pd, type, mw, &cmd, sizeof(cmd), &resp,
			       sizeof(resp));
	if (ret) {
		free(mw);
		errno = ret;
		return NULL;
	}
	return mw;
}

int vt3_dealloc_mw(struct ibv_mw *mw)
{
	int ret = ibv_cmd_dealloc_mw(mw);

	if (ret)
		return ret;
	free(mw);
	return 0;
}

/*
 * A ring the kernel describes must be a power of two deep and fit in what
 * it asks us to map; anything else is a driver/provider mismatch.
 */
bool vt3_ring_ok(uint32_t depth, uint32_t map_size, size_t entry_size)
{
	return depth && !(depth & (depth - 1)) &&
	       (uint64_t)depth * entry_size <= map_size;
}

/* Maps what vt3.ko registered under @key (rdma_user_mmap_entry). */
void *vt3_mmap(struct ibv_context *ibctx, size_t len, int prot,
		      uint64_t key, const char *what)
{
	void *p;

	p = mmap(NULL, len, prot, MAP_SHARED, ibctx->cmd_fd, key);
	if (p == MAP_FAILED) {
		int err = errno;

		verbs_err(verbs_get_ctx(ibctx),
			  "libvt3: mmap of the %s (%zu bytes) failed: %s\n",
			  what, len, strerror(err));
		errno = err;
		return NULL;
	}
	return p;
}

void vt3_munmap(void *p, size_t len)
{
	if (p)
		munmap(p, len);
}

static void vt3_cq_unmap(struct vt3_cq *cq)
{
	vt3_munmap(cq->ring, cq->ring_size);
	vt3_munmap(cq->status, sizeof(*cq->status));
}

/*
 * Maps the CQ vt3.ko created (@drv: its answer). On failure the kernel's
 * CQ is destroyed and errno set.
 */
static int vt3_cq_setup(struct ibv_context *ibctx, struct vt3_cq *cq,
			const struct vt3_create_cq_resp *drv)
{
	int ret;

	if (!vt3_ring_ok(drv->depth, drv->ring_size, sizeof(struct vt3_cqe))) {
		verbs_err(verbs_get_ctx(ibctx),
			  "libvt3: bad CQ ring from the kernel: %u entries in %u bytes\n",
			  drv->depth, drv->ring_size);
		ret = EPROTO;
		goto err_destroy;
	}
	cq->depth = drv->depth;
	cq->ring_size = drv->ring_size;

	/* The device is the only producer: a stray store here is a fault. */
	cq->ring = vt3_mmap(ibctx, cq->ring_size, PROT_READ, drv->ring_key,
			    "CQ ring");
	if (!cq->ring)
		goto err_unmap;
	cq->status = vt3_mmap(ibctx, sizeof(*cq->status),
			      PROT_READ | PROT_WRITE, drv->status_key,
			      "CQ status page");
	if (!cq->status)
		goto err_unmap;

	pthread_spin_init(&cq->lock, PTHREAD_PROCESS_PRIVATE);
	list_head_init(&cq->wqs);
	list_head_init(&cq->flushed);
	list_head_init(&cq->gone);
	/* Indices are free running: start where the page says. */
	cq->cons = le32toh(cq->status->cons);
	return 0;

err_unmap:
	ret = errno;
	vt3_cq_unmap(cq);
err_destroy:
	ibv_cmd_destroy_cq(&cq->ibv_cq);
	errno = ret;
	return ret;
}

/*
 * The completion fields vt3 fills: iWARP has no immediate data (IMM is
 * the channel of the invalidated rkey, ibv_wc_read_invalidated_rkey()),
 * no remote QP number, no LIDs or SLs (read as 0, as in ibv_poll_cq's
 * ibv_wc), so the standard set; no timestamps, VLANs, flow tags or tag
 * matching.
 */
#define VT3_CQ_EX_WC_FLAGS	IBV_WC_STANDARD_FLAGS

struct ibv_cq_ex *vt3_create_cq_ex(struct ibv_context *ibctx,
				   struct ibv_cq_init_attr_ex *attr)
{
	struct uvt3_create_cq_ex_resp resp = {};
	struct ibv_create_cq_ex cmd = {};
	struct vt3_cq *cq;
	int ret;

	if (attr->wc_flags & ~(uint64_t)VT3_CQ_EX_WC_FLAGS ||
	    !check_comp_mask(attr->comp_mask, IBV_CQ_INIT_ATTR_MASK_FLAGS |
					      IBV_CQ_INIT_ATTR_MASK_PD) ||
	    /* A CQ overflow is reported, never ignored (docs/architecture.md §3). */
	    (attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS &&
	     attr->flags & ~IBV_CREATE_CQ_ATTR_SINGLE_THREADED)) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	/* As mlx5: only a parent domain, which no buffer of a CQ uses here. */
	if (attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_PD &&
	    (!attr->parent_domain || !to_vt3_pd(attr->parent_domain)->protection)) {
		errno = EINVAL;
		return NULL;
	}

	cq = calloc(1, sizeof(*cq));
	if (!cq)
		return NULL;

	ret = ibv_cmd_create_cq_ex(ibctx, attr, &cq->vcq, &cmd, sizeof(cmd),
				   &resp.ibv_resp, sizeof(resp), 0);
	if (ret) {
		free(cq);
		errno = ret;
		return NULL;
	}
	if (vt3_cq_setup(ibctx, cq, &resp.drv)) {
		free(cq);
		return NULL;
	}
	if (attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_PD)
		cq->domain = vt3_domain_get(attr->parent_domain);
	vt3_cq_ex_setup(cq);
	return &cq->vcq.cq_ex;
}

/* The same CQ: ibv_create_cq's fields are ibv_cq_ex's first ones. */
struct ibv_cq *vt3_create_cq(struct ibv_context *ibctx, int cqe,
			     struct ibv_comp_channel *channel, int comp_vector)
{
	struct ibv_cq_init_attr_ex attr = {
		.cqe = cqe,
		.channel = channel,
		.comp_vector = comp_vector,
		.wc_flags = VT3_CQ_EX_WC_FLAGS,
	};
	struct ibv_cq_ex *cqx = vt3_create_cq_ex(ibctx, &attr);

	return cqx ? ibv_cq_ex_to_cq(cqx) : NULL;
}

int vt3_destroy_cq(struct ibv_cq *ibcq)
{
	struct vt3_cq *cq = to_vt3_cq(ibcq);
	int ret;

	/* Kernel first: should it fail, the CQ is still whole and usable. */
	ret = ibv_cmd_destroy_cq(ibcq);
	if (ret)
		return ret;

	vt3_cq_free_gone(cq);
	vt3_cq_unmap(cq);
	pthread_spin_destroy(&cq->lock);
	vt3_domain_put(cq->domain);
	free(cq);
	return 0;
}

static void vt3_qp_unmap(struct vt3_qp *qp)
{
	vt3_wq_cleanup(&qp->sq);
	vt3_wq_cleanup(&qp->rq);
	vt3_munmap(qp->sq.ring, qp->sq.ring_size);
	vt3_munmap(qp->rq.ring, qp->rq.ring_size);
	vt3_munmap(qp->status, sizeof(*qp->status));
}

/*
 * QP structs come from one region of the process, far smaller than 4 GiB,
 * so no two live QPs share the low 32 bits of their address: the vendor
 * event names its QP by those bits only (async.c). Slots are reused.
 */
#define VT3_QP_ARENA_SIZE	(64u << 20)
#define VT3_QP_SLOT		((sizeof(struct vt3_qp) + 63) & ~(size_t)63)

static pthread_mutex_t vt3_qp_arena_lock = PTHREAD_MUTEX_INITIALIZER;
static char *vt3_qp_arena;
static size_t vt3_qp_arena_used;
static void *vt3_qp_free_slots;		/* each free slot starts with the next */

static struct vt3_qp *vt3_qp_alloc(void)
{
	void *slot = NULL;

	pthread_mutex_lock(&vt3_qp_arena_lock);
	if (!vt3_qp_arena) {
		/* Pages are only backed once a slot on them is used. */
		void *arena = mmap(NULL, VT3_QP_ARENA_SIZE, PROT_READ | PROT_WRITE,
				   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

		if (arena != MAP_FAILED)
			vt3_qp_arena = arena;
	}
	if (vt3_qp_free_slots) {
		slot = vt3_qp_free_slots;
		vt3_qp_free_slots = *(void **)slot;
	} else if (vt3_qp_arena && vt3_qp_arena_used + VT3_QP_SLOT <= VT3_QP_ARENA_SIZE) {
		slot = vt3_qp_arena + vt3_qp_arena_used;
		vt3_qp_arena_used += VT3_QP_SLOT;
	}
	pthread_mutex_unlock(&vt3_qp_arena_lock);
	if (!slot) {
		errno = ENOMEM;
		return NULL;
	}
	memset(slot, 0, sizeof(struct vt3_qp));
	return slot;
}

static void vt3_qp_free(struct vt3_qp *qp)
{
	pthread_mutex_lock(&vt3_qp_arena_lock);
	*(void **)qp = vt3_qp_free_slots;
	vt3_qp_free_slots = qp;
	pthread_mutex_unlock(&vt3_qp_arena_lock);
}

/*
 * The context's QPs by number (vt3.h): poll_cq looks a CQE's QP up under
 * the CQ's lock; destroy clears the entry under the same lock, so a QP
 * found there is alive while the lock is held.
 */
int vt3_qp_table_insert(struct vt3_context *ctx, struct vt3_qp *qp)
{
	uint32_t qpn = qp->ibv_qp.qp_num;
	struct vt3_qp **dir;

	if (qpn >= VT3_QP_TABLE_MAX)
		return EOVERFLOW;
	pthread_mutex_lock(&ctx->qps_lock);
	dir = ctx->qp_table[qpn >> VT3_QP_TABLE_SHIFT];
	if (!dir) {
		dir = calloc(1u << VT3_QP_TABLE_SHIFT, sizeof(*dir));
		if (!dir) {
			pthread_mutex_unlock(&ctx->qps_lock);
			return ENOMEM;
		}
		__atomic_store_n(&ctx->qp_table[qpn >> VT3_QP_TABLE_SHIFT], dir,
				 __ATOMIC_RELEASE);
	}
	__atomic_store_n(&dir[qpn & ((1u << VT3_QP_TABLE_SHIFT) - 1)], qp,
			 __ATOMIC_RELEASE);
	pthread_mutex_unlock(&ctx->qps_lock);
	return 0;
}

void vt3_qp_table_clear(struct vt3_context *ctx, uint32_t qpn)
{
	struct vt3_qp **dir;

	if (qpn >= VT3_QP_TABLE_MAX)
		return;
	dir = __atomic_load_n(&ctx->qp_table[qpn >> VT3_QP_TABLE_SHIFT],
			      __ATOMIC_ACQUIRE);
	if (dir)
		__atomic_store_n(&dir[qpn & ((1u << VT3_QP_TABLE_SHIFT) - 1)],
				 NULL, __ATOMIC_RELEASE);
}

struct vt3_qp *vt3_qp_find(struct vt3_context *ctx, uint32_t qpn)
{
	struct vt3_qp **dir;

	if (qpn >= VT3_QP_TABLE_MAX)
		return NULL;
	dir = __atomic_load_n(&ctx->qp_table[qpn >> VT3_QP_TABLE_SHIFT],
			      __ATOMIC_ACQUIRE);
	if (!dir)
		return NULL;
	return __atomic_load_n(&dir[qpn & ((1u << VT3_QP_TABLE_SHIFT) - 1)],
			       __ATOMIC_ACQUIRE);
}

void vt3_qp_table_free(struct vt3_context *ctx)
{
	unsigned int i;

	for (i = 0; i < VT3_QP_TABLE_DIRS; i++)
		free(ctx->qp_table[i]);
}

/*
 * What create_qp_ex takes: a PD (or parent domain), the ibv_wr_* opcodes
 * (qp_ex.c checks which), and create flags if none is set (vt3 has none).
 */
#define VT3_QP_INIT_ATTR_MASK	(IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS | \
				 IBV_QP_INIT_ATTR_CREATE_FLAGS)

struct ibv_qp *vt3_create_qp_ex(struct ibv_context *ibctx,
				struct ibv_qp_init_attr_ex *attr)
{
	struct vt3_context *ctx = to_vt3_ctx(ibctx);
	struct uvt3_create_qp_resp resp = {};
	struct ibv_create_qp cmd = {};
	struct ibv_qp_init_attr_ex kattr;
	struct vt3_cq *scq, *rcq;
	struct vt3_qp *qp;
	int ret;

	if (!check_comp_mask(attr->comp_mask, VT3_QP_INIT_ATTR_MASK) ||
	    (attr->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS && attr->create_flags)) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	qp = vt3_qp_alloc();
	if (!qp)
		return NULL;
	if (attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) {
		ret = vt3_qp_ex_setup(qp, attr);
		if (ret) {
			vt3_qp_free(qp);
			errno = ret;
			return NULL;
		}
	}

	/* The command takes no create flags, not even none. */
	kattr = *attr;
	kattr.comp_mask &= ~IBV_QP_INIT_ATTR_CREATE_FLAGS;
	ret = ibv_cmd_create_qp_ex(ibctx, &qp->vqp, &kattr, &cmd, sizeof(cmd),
				   &resp.ibv_resp, sizeof(resp));
	if (ret) {
		vt3_qp_free(qp);
		errno = ret;
		return NULL;
	}
	attr->cap = kattr.cap;
	if (attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS)
		qp->vqp.comp_mask |= VERBS_QP_EX;
	qp->domain = vt3_domain_get(attr->pd);

	/* A QP of an SRQ has no RQ ring of its own. */
	if (!vt3_ring_ok(resp.drv.sq_depth, resp.drv.sq_size, VT3_WQE_SIZE) ||
	    (attr->srq ? resp.drv.rq_depth || resp.drv.rq_size :
	     !vt3_ring_ok(resp.drv.rq_depth, resp.drv.rq_size, VT3_WQE_SIZE))) {
		verbs_err(verbs_get_ctx(ibctx),
			  "libvt3: bad QP rings from the kernel: SQ %u entries in %u bytes, RQ %u in %u\n",
			  resp.drv.sq_depth, resp.drv.sq_size,
			  resp.drv.rq_depth, resp.drv.rq_size);
		ret = EPROTO;
		goto err_destroy;
	}
	qp->sq.depth = resp.drv.sq_depth;
	qp->rq.depth = resp.drv.rq_depth;
	qp->sq.ring_size = resp.drv.sq_size;
	qp->rq.ring_size = resp.drv.rq_size;
	/* The kernel's word, within what a WQE holds. */
	qp->max_inline = min_t(uint32_t, resp.drv.max_inline, VT3_MAX_INLINE);
	qp->max_sge_rd = ctx->max_sge_rd;
	qp->sig_all = attr->sq_sig_all;
	qp->state = IBV_QPS_RESET;

	qp->sq.ring = vt3_mmap(ibctx, qp->sq.ring_size, PROT_READ | PROT_WRITE,
			       resp.drv.sq_key, "SQ ring");
	if (!qp->sq.ring)
		goto err_unmap;
	if (attr->srq) {
		qp->srq = to_vt3_srq(attr->srq);
	} else {
		qp->rq.ring = vt3_mmap(ibctx, qp->rq.ring_size,
				       PROT_READ | PROT_WRITE, resp.drv.rq_key,
				       "RQ ring");
		if (!qp->rq.ring)
			goto err_unmap;
	}
	qp->status = vt3_mmap(ibctx, sizeof(*qp->status),
			      PROT_READ | PROT_WRITE, resp.drv.status_key,
			      "QP status page");
	if (!qp->status)
		goto err_unmap;

	scq = to_vt3_cq(attr->send_cq);
	rcq = to_vt3_cq(attr->recv_cq);
	/* SGE counts as the kernel granted them (ibv_cmd_create_qp set attr->cap). */
	ret = vt3_wq_init(qp, &qp->sq, scq, false, attr->cap.max_send_sge);
	if (!ret)
		ret = vt3_wq_init(qp, &qp->rq, rcq, true, attr->cap.max_recv_sge);
	if (!ret)
		ret = vt3_qp_table_insert(ctx, qp);
	if (ret) {
		errno = ret;
		goto err_unmap;
	}

	/* From now on poll_cq finds the queues' CQEs and flushes them. */
	vt3_lock_cqs(scq, rcq);
	list_add_tail(&scq->wqs, &qp->sq.cq_entry);
	list_add_tail(&rcq->wqs, &qp->rq.cq_entry);
	vt3_unlock_cqs(scq, rcq);
	/* ...and the async_event op finds it (vendor events name it by handle). */
	pthread_mutex_lock(&ctx->qps_lock);
	list_add_tail(&ctx->qps, &qp->ctx_entry);
	pthread_mutex_unlock(&ctx->qps_lock);
	vt3_wrcheck_qp_create(qp);
	return &qp->ibv_qp;

err_unmap:
	ret = errno;
	vt3_qp_unmap(qp);
err_destroy:
	ibv_cmd_destroy_qp(&qp->ibv_qp);
	vt3_domain_put(qp->domain);
	vt3_qp_free(qp);
	errno = ret;
	return NULL;
}

struct ibv_qp *vt3_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
	struct ibv_qp_init_attr_ex attr_ex = {
		.qp_context = attr->qp_context,
		.send_cq = attr->send_cq,
		.recv_cq = attr->recv_cq,
		.srq = attr->srq,
		.cap = attr->cap,
		.qp_type = attr->qp_type,
		.sq_sig_all = attr->sq_sig_all,
		.comp_mask = IBV_QP_INIT_ATTR_PD,
		.pd = pd,
	};
	struct ibv_qp *qp;

	qp = vt3_create_qp_ex(pd->context, &attr_ex);
	/* What the kernel granted, as ibv_cmd_create_qp() reports it. */
	if (qp)
		attr->cap = attr_ex.cap;
	return qp;
}

/*
 * The state the application moved the QP to, for the post verbs; RESET
 * drops the outstanding WRs without completions.
 */
int vt3_modify_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int attr_mask)
{
	struct vt3_qp *qp = to_vt3_qp(ibqp);
	struct ibv_modify_qp cmd = {};
	int ret;

	ret = ibv_cmd_modify_qp(ibqp, attr, attr_mask, &cmd, sizeof(cmd));
	if (ret || !(attr_mask & IBV_QP_STATE))
		return ret;

	if (attr->qp_state == IBV_QPS_RESET)
		vt3_qp_reset(qp);
	__atomic_store_n(&qp->state, attr->qp_state, __ATOMIC_RELAXED);
	return 0;
}

int vt3_query_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr, int attr_mask,
		 struct ibv_qp_init_attr *init_attr)
{
	struct vt3_qp *qp = to_vt3_qp(ibqp);
	struct ibv_query_qp cmd = {};
	int ret;

	ret = ibv_cmd_query_qp(ibqp, attr, attr_mask, init_attr, &cmd,
			       sizeof(cmd));
	/* vt3.ko knows where the connection took the QP. */
	if (!ret)
		__atomic_store_n(&qp->state, attr->qp_state, __ATOMIC_RELAXED);
	return ret;
}

int vt3_destroy_qp(struct ibv_qp *ibqp)
{
	struct vt3_context *ctx = to_vt3_ctx(ibqp->context);
	struct vt3_qp *qp = to_vt3_qp(ibqp);
	int ret;

	/*
	 * Kernel first: should it fail, the QP is still whole and usable.
	 * ibv_cmd_destroy_qp() also waits until every async event of the QP
	 * read so far is accounted for (acked, or for the vendor event done
	 * by the async_event op, async.c), so no one still looks it up.
	 */
	ret = ibv_cmd_destroy_qp(ibqp);
	if (ret)
		return ret;

	pthread_mutex_lock(&ctx->qps_lock);
	list_del_from(&ctx->qps, &qp->ctx_entry);
	pthread_mutex_unlock(&ctx->qps_lock);

	/*
	 * None of its completions is returned from now on (as mlx5 cleans
	 * its CQs): its CQEs still in the rings are skipped, the flush it
	 * still owed goes with it.
	 */
	vt3_lock_cqs(qp->sq.cq, qp->rq.cq);
	vt3_qp_table_clear(ctx, qp->ibv_qp.qp_num);
	vt3_cq_forget(qp->rq.cq, qp->ibv_qp.qp_num, qp->srq);
	if (qp->sq.cq != qp->rq.cq)
		vt3_cq_forget(qp->sq.cq, qp->ibv_qp.qp_num, NULL);
	vt3_srq_wq_gone(&qp->rq);
	list_del(&qp->sq.cq_entry);
	list_del(&qp->rq.cq_entry);
	vt3_unlock_cqs(qp->sq.cq, qp->rq.cq);
	vt3_cq_wait_ringing(qp->sq.cq);
	vt3_cq_wait_ringing(qp->rq.cq);
	vt3_wrcheck_qp_destroy(qp);

	vt3_qp_unmap(qp);
	vt3_domain_put(qp->domain);
	vt3_qp_free(qp);
	return 0;
}
