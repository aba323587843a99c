// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
/*
 * libvt3 send and receive (docs/architecture.md §3.1, §3.2).
 *
 * A WQE is built on the stack and checked, copied into the next ring slot
 * and remembered in the queue's shadow (wr_id, whether a completion is
 * owed, for a flush); the producer index then goes to the status page with
 * release semantics, and the doorbell, a post without WRs on the uverbs fd
 * that vt3.ko turns into VT3_CMD_DOORBELL, is rung only when vt3d said it
 * went idle on that queue. A busy queue costs no system call.
 *
 * A slot is free again once poll_cq took the CQE of its WQE or of a later
 * one of the queue (docs/architecture.md §10: vt3d's consumer index is
 * not trusted after a device loss, so what was not seen completing stays
 * in the ring and the shadow to be flushed). A QP in error takes WRs too, as the verbs (and
 * ib_drain_qp-style teardown) expect: they go into the ring and the shadow
 * like any other, vt3d no longer looks at them, and poll_cq completes them
 * with IBV_WC_WR_FLUSH_ERR after the device's CQEs (cq.c); there the flush
 * frees the slots.
 */
#include <config.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <ccan/array_size.h>
#include <util/udma_barrier.h>

#include "vt3.h"
#include "vt3dv.h"

void *vt3_wq_slot(struct vt3_wq *wq, uint32_t idx)
{
	return (uint8_t *)wq->ring + (size_t)(idx & (wq->depth - 1)) * VT3_WQE_SIZE;
}

/*
 * The testing knob VT3_TEST_NO_DOORBELL=1: posts never ring the doorbell,
 * as a broken provider would. WQEs posted while vt3d is idle then wait
 * for ever: vt3d's progress watchdog must report the stall (the
 * harness's own check, tests/system/test_harness.py). Read once per
 * queue, at its creation: the post path only tests a flag.
 */
static bool vt3_doorbell_muted(void)
{
	const char *env = getenv("VT3_TEST_NO_DOORBELL");

	return env && !strcmp(env, "1");
}

/* wq->ring, ring_size and depth are set; the QP's status page is mapped. */
int vt3_wq_init(struct vt3_qp *qp, struct vt3_wq *wq, struct vt3_cq *cq,
		bool recv, uint32_t max_sge)
{
	/* The empty RQ of a QP of an SRQ has depth 0: one entry, unused. */
	wq->swqe = vt3_buf_calloc(qp->domain, wq->depth ?: 1, sizeof(*wq->swqe),
				  VT3DV_RES_TYPE_QP, &wq->swqe_custom);
	if (!wq->swqe)
		return ENOMEM;
	pthread_spin_init(&wq->lock, PTHREAD_PROCESS_PRIVATE);
	wq->qp = qp;
	wq->cq = cq;
	wq->recv = recv;
	wq->no_doorbell = vt3_doorbell_muted();
	wq->max_sge = max_sge;
	if (recv) {
		wq->prod_idx = &qp->status->rq_prod;
		wq->cons_idx = &qp->status->rq_cons;
		wq->idle_flag = VT3_QP_F_RQ_IDLE;
	} else {
		wq->prod_idx = &qp->status->sq_prod;
		wq->cons_idx = &qp->status->sq_cons;
		wq->idle_flag = VT3_QP_F_SQ_IDLE;
	}
	/* The kernel hands out a zeroed page; start where it says anyway. */
	wq->prod = le32toh(*wq->prod_idx);
	wq->done = wq->prod;
	return 0;
}

/*
 * The triggers that may note a flush: all three, or those the testing knob
 * VT3_FLUSH_TRIGGERS=event,poll,post (any subset) names. Read when a QP's
 * error is first seen, so a test may change it between QPs.
 */
static unsigned int vt3_allowed_triggers(void)
{
	const char *env = getenv("VT3_FLUSH_TRIGGERS");
	unsigned int mask = 0;

	if (!env)
		return VT3_BY_EVENT | VT3_BY_POLL | VT3_BY_POST;
	if (strstr(env, "event"))
		mask |= VT3_BY_EVENT;
	if (strstr(env, "poll"))
		mask |= VT3_BY_POLL;
	if (strstr(env, "post"))
		mask |= VT3_BY_POST;
	return mask;
}

void vt3_wq_cleanup(struct vt3_wq *wq)
{
	if (!wq->swqe)
		return;
	pthread_spin_destroy(&wq->lock);
	vt3_buf_free(wq->qp->domain, wq->swqe, VT3DV_RES_TYPE_QP,
		     wq->swqe_custom);
	wq->swqe = NULL;
}

/*
 * Whether the QP is in error for this queue. On first sight it notes what
 * to flush and from when (docs/architecture.md §5): vt3d publishes its consumer
 * indices, then its last CQE of the QP, then the error flag, and retires
 * nothing afterwards. Read after the flag (acquire), the consumer index
 * starts the WQEs to flush and the CQ producer index is past every device
 * CQE of this queue. A lost device's consumer index is not trusted:
 * vt3.ko froze the CQ before it set the flag, and the flush starts after
 * the last CQE taken up to the frozen producer index (flush_at_done).
 * @by is the trigger asking (the testing knob may leave it out). Called
 * with wq->lock held.
 */
bool vt3_wq_error(struct vt3_wq *wq, enum vt3_trigger by)
{
	if (wq->error) {
		/*
		 * The device was lost after this queue's error was noted:
		 * vt3d's own device-fatal sets the QP flags before vt3.ko
		 * freezes the CQs. The SRQ's owed WQEs are a lost device's
		 * flush now, once the frozen CQ's last CQE was taken.
		 */
		if (!wq->srq_lost && wq->recv && wq->qp->srq &&
		    vt3_cq_frozen(wq->cq)) {
			wq->srq_lost = true;
			wq->flushing = false;
			wq->flush_mark = vt3_cq_prod(wq->cq);
			vt3_cq_note_repost(wq);
		}
		return true;
	}
	if (!(vt3_qp_flags(wq->qp) & VT3_QP_F_ERROR) || !(vt3_allowed_triggers() & by))
		return false;
	wq->flush_at_done = vt3_cq_frozen(wq->cq);
	if (wq->flush_at_done) {
		/* Until flush_mark: where posting may reuse slots from. */
		wq->flush_pos = __atomic_load_n(&wq->done, __ATOMIC_ACQUIRE);
	} else {
		wq->flush_pos = vt3_load_acquire(wq->cons_idx);
		/* A consumer index past ours is a device bug: flush nothing. */
		if (wq->prod - wq->flush_pos > wq->depth)
			wq->flush_pos = wq->prod;
	}
	wq->flush_mark = vt3_cq_prod(wq->cq);
	/*
	 * The RQ of a QP of an SRQ is empty: a QP error flushes nothing of
	 * the SRQ (vt3d completed the WQE the QP had taken), a lost device
	 * leaves owed SRQ WQEs that this queue's CQ may flush (srq.c).
	 */
	wq->srq_lost = wq->recv && wq->qp->srq && wq->flush_at_done;
	wq->error = true;
	return true;
}

/*
 * The flush hook (docs/architecture.md §5): notes the error on both queues,
 * whose outstanding WRs then complete with IBV_WC_WR_FLUSH_ERR from
 * poll_cq. poll_cq and the post verbs call it through vt3_wq_error();
 * the async_event op (async.c) calls it for QP_FATAL, QP_REQ_ERR,
 * QP_ACCESS_ERR, DEVICE_FATAL and the vendor close event.
 */
bool vt3_qp_check_error(struct vt3_qp *qp, enum vt3_trigger by)
{
	bool error;

	pthread_spin_lock(&qp->sq.lock);
	error = vt3_wq_error(&qp->sq, by);
	pthread_spin_unlock(&qp->sq.lock);
	pthread_spin_lock(&qp->rq.lock);
	error = vt3_wq_error(&qp->rq, by) || error;
	pthread_spin_unlock(&qp->rq.lock);
	return error;
}

/*
 * Modify to RESET succeeded: outstanding WRs are gone without completions
 * (verbs). vt3d dropped them too (ERROR -> IDLE moves its consumer indices
 * up to our producer indices and clears the error flag). A flush not yet
 * returned goes with them.
 */
void vt3_qp_reset(struct vt3_qp *qp)
{
	struct vt3_wq *wqs[] = { &qp->sq, &qp->rq };
	unsigned int i;

	for (i = 0; i < 2; i++) {
		pthread_spin_lock(&wqs[i]->lock);
		wqs[i]->error = false;
		wqs[i]->flushing = false;
		wqs[i]->flush_at_done = false;
		wqs[i]->srq_lost = false;
		__atomic_store_n(&wqs[i]->done, wqs[i]->prod, __ATOMIC_RELEASE);
		pthread_spin_unlock(&wqs[i]->lock);
		if (wqs[i]->check)
			vt3_wrcheck_reset(wqs[i]);
		vt3_cq_requeue(wqs[i]);
	}
}

/*
 * Verbs: receive WRs from INIT on, send WRs from RTS on (a QP in error
 * takes both; the caller checked that first). vt3d reports IDLE for
 * RESET, INIT and RTR alike and knows when a connection made the QP RTS;
 * which of the first three the application left it in, only we know.
 */
static bool vt3_qp_may_post(struct vt3_qp *qp, bool recv)
{
	if (vt3_load_acquire(&qp->status->state) != VT3_QPS_IDLE)
		return true;
	switch (__atomic_load_n(&qp->state, __ATOMIC_RELAXED)) {
	case IBV_QPS_RESET:
		return false;
	case IBV_QPS_INIT:
	case IBV_QPS_RTR:
		return recv;
	default:
		return true;
	}
}

/*
 * A slot is free again once poll_cq took the CQE of its WQE or a later
 * one (acquire: pairs with its release), and in error, where vt3d
 * retires nothing more, once the flush returned it. @prod: the index
 * of the WQE to be written.
 */
bool vt3_wq_full(struct vt3_wq *wq, uint32_t prod)
{
	uint32_t tail = wq->error ? wq->flush_pos :
				    __atomic_load_n(&wq->done, __ATOMIC_ACQUIRE);

	return prod - tail >= wq->depth;
}

/*
 * Publishes the WQEs up to wq->prod and tells whether to ring the
 * doorbell. vt3d sets the IDLE flag, issues a full barrier and re-reads
 * the producer index before it stops polling a queue; we store the index,
 * issue a full barrier and read the flag. One of us sees the other's
 * store, so a WQE is never left behind unannounced.
 */
static bool vt3_wq_publish(struct vt3_wq *wq)
{
	/* The WQEs before the index that covers them... */
	udma_to_device_barrier();
	vt3_store_release(wq->prod_idx, wq->prod);
	/* ...and the index before the flag: a store-load order. */
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	return le32toh(__atomic_load_n(&wq->qp->status->flags,
				       __ATOMIC_RELAXED)) & wq->idle_flag;
}

/*
 * The doorbell: a post without WRs on the uverbs fd, which vt3.ko turns
 * into VT3_CMD_DOORBELL for this queue (as siw's user QPs do). Rung on a
 * QP in error, it is the hook that has vt3.ko run the completion handler
 * of this queue's CQ (vt3_user_doorbell(), vt3_cq_kick()): flush
 * completions are made here, not by vt3d, so no device event announces
 * them.
 */
void vt3_wq_doorbell(struct vt3_wq *wq)
{
	struct ibv_qp *ibqp = &wq->qp->ibv_qp;
	int ret;

	if (wq->recv) {
		struct ibv_recv_wr *bad;

		ret = ibv_cmd_post_recv(ibqp, NULL, &bad);
	} else {
		struct ibv_send_wr *bad;

		ret = ibv_cmd_post_send(ibqp, NULL, &bad);
	}
	/*
	 * The WRs are posted whatever happens here: should the device be
	 * gone, the QP goes to error and they are flushed.
	 */
	if (ret)
		verbs_err(verbs_get_ctx(ibqp->context),
			  "libvt3: QP %u: %s doorbell failed: %s\n",
			  ibqp->qp_num, wq->recv ? "RQ" : "SQ", strerror(ret));
}

/*
 * Starts a post to @wq: takes its lock (vt3_wq_post_end() drops it) and
 * tells whether the QP is in error (*@error; then it takes WRs to flush
 * them). EINVAL: the QP's state takes no WRs of this kind.
 */
int vt3_wq_post_begin(struct vt3_wq *wq, bool *error)
{
	pthread_spin_lock(&wq->lock);
	*error = vt3_wq_error(wq, VT3_BY_POST);
	if (!*error && !vt3_qp_may_post(wq->qp, wq->recv))
		return EINVAL;
	return 0;
}

/*
 * Ends a post to @wq that began at producer index @start (wq->lock held;
 * dropped here): publishes the WQEs taken, then rings the doorbell if
 * vt3d went idle. In error vt3d ignores the ring, but the producer index
 * still moves (vt3d catches its consumer index up to it on RESET), and
 * the doorbell is the kick that wakes a waiter for the flush.
 */
void vt3_wq_post_end(struct vt3_wq *wq, uint32_t start, bool error)
{
	bool posted = wq->prod != start, ring = false;

	if (posted) {
		if (wq->check)
			vt3_wrcheck_posted(wq, start);
		ring = vt3_wq_publish(wq) || error;
	}
	pthread_spin_unlock(&wq->lock);
	/* poll_cq may have put the queue aside as flushed. */
	if (posted && error)
		vt3_cq_note_repost(wq);
	if (ring && !wq->no_doorbell)
		vt3_wq_doorbell(wq);
}

/*
 * The send opcodes vt3 supports, by enum ibv_wr_opcode: the one place
 * that knows what each makes of an SQ WQE, for post_send and the ibv_wr_*
 * builders (qp_ex.c) alike. iWARP has no immediate data; vt3 no atomics.
 */
static const struct vt3_send_op vt3_send_ops[] = {
	[IBV_WR_SEND] = {
		.supported = true, .opcode = VT3_WR_SEND,
		.opcode_se = VT3_WR_SEND_SE, .wc_opcode = IBV_WC_SEND,
		.data = true,
	},
	[IBV_WR_SEND_WITH_INV] = {
		.supported = true, .opcode = VT3_WR_SEND_INV,
		.opcode_se = VT3_WR_SEND_SE_INV, .wc_opcode = IBV_WC_SEND,
		.invalidate = true, .data = true,
	},
	[IBV_WR_RDMA_WRITE] = {
		.supported = true, .opcode = VT3_WR_WRITE,
		.opcode_se = VT3_WR_WRITE, .wc_opcode = IBV_WC_RDMA_WRITE,
		.remote = true, .data = true,
	},
	[IBV_WR_RDMA_READ] = {
		.supported = true, .opcode = VT3_WR_READ,
		.opcode_se = VT3_WR_READ, .wc_opcode = IBV_WC_RDMA_READ,
		.remote = true, .data = true, .sink = true,
	},
	/* Of a fast-registered STag or a type 2 window; vt3d refuses others. */
	[IBV_WR_LOCAL_INV] = {
		.supported = true, .opcode = VT3_WR_LOCAL_INV,
		.opcode_se = VT3_WR_LOCAL_INV, .wc_opcode = IBV_WC_LOCAL_INV,
		.invalidate = true,
	},
	/* Type 2 windows here; ibv_bind_mw's type 1 binds come this way too. */
	[IBV_WR_BIND_MW] = {
		.supported = true, .opcode = VT3_WR_BIND_MW,
		.opcode_se = VT3_WR_BIND_MW, .wc_opcode = IBV_WC_BIND_MW,
		.bind = true,
	},
};

const struct vt3_send_op *vt3_send_op(unsigned int opcode)
{
	if (opcode >= ARRAY_SIZE(vt3_send_ops) || !vt3_send_ops[opcode].supported)
		return NULL;
	return &vt3_send_ops[opcode];
}

/*
 * The header of an SQ WQE for @op (no data yet: no SGEs) and its
 * shadow entry. EINVAL: inline data asked for a READ's sink.
 */
int vt3_sq_wqe_init(struct vt3_qp *qp, const struct vt3_send_op *op,
		    const struct vt3_send_req *req, struct vt3_sq_wqe *wqe,
		    struct vt3_swqe *swqe)
{
	memset(wqe, 0, sizeof(*wqe));
	if (op->sink && req->send_flags & IBV_SEND_INLINE)
		return EINVAL;
	wqe->opcode = req->send_flags & IBV_SEND_SOLICITED ? op->opcode_se :
							     op->opcode;
	if (op->remote) {
		wqe->remote_addr = htole64(req->remote_addr);
		wqe->remote_stag = htole32(req->rkey);
	}
	if (op->invalidate)
		wqe->invalidate_stag = htole32(req->invalidate_rkey);
	wqe->wr_id = htole64(req->wr_id);
	if (qp->sig_all || req->send_flags & IBV_SEND_SIGNALED)
		wqe->flags |= VT3_WQE_SIGNALED;
	if (req->send_flags & IBV_SEND_FENCE)
		wqe->flags |= VT3_WQE_FENCE;
	swqe->wr_id = req->wr_id;
	swqe->wc_opcode = op->wc_opcode;
	return 0;
}

/*
 * The WQE's data as @num SGEs (replacing inline data set before). A
 * READ's sink is also bounded by the device's READ limit; an operation
 * without data (LOCAL_INV) ignores them, as the verbs say.
 */
int vt3_sq_wqe_set_sges(struct vt3_qp *qp, const struct vt3_send_op *op,
			struct vt3_sq_wqe *wqe, const struct ibv_sge *sges,
			size_t num)
{
	uint32_t max_sge = qp->sq.max_sge;
	size_t i;

	if (!op->data)
		return 0;
	if (op->sink && max_sge > qp->max_sge_rd)
		max_sge = qp->max_sge_rd;
	if (num > max_sge)
		return EINVAL;
	wqe->flags &= ~VT3_WQE_INLINE;
	wqe->inline_len = 0;
	wqe->num_sge = num;
	for (i = 0; i < num; i++) {
		wqe->sge[i].addr = htole64(sges[i].addr);
		wqe->sge[i].length = htole32(sges[i].length);
		wqe->sge[i].lkey = htole32(sges[i].lkey);
	}
	return 0;
}

/*
 * The WQE's data as inline bytes, copied now (the application may reuse
 * its buffers at once): @num buffers, at most the QP's max_inline in all.
 */
int vt3_sq_wqe_set_inline(struct vt3_qp *qp, const struct vt3_send_op *op,
			  struct vt3_sq_wqe *wqe, const struct ibv_data_buf *bufs,
			  size_t num)
{
	uint32_t len = 0;
	size_t i;

	if (!op->data || op->sink)
		return EINVAL;
	for (i = 0; i < num; i++) {
		if (bufs[i].length > qp->max_inline - len)
			return EINVAL;
		if (bufs[i].length)
			memcpy(wqe->inline_data + len, bufs[i].addr,
			       bufs[i].length);
		len += bufs[i].length;
	}
	wqe->num_sge = 0;
	wqe->flags |= VT3_WQE_INLINE;
	wqe->inline_len = htole32(len);
	return 0;
}

/*
 * A BIND_MW slot (struct vt3_bind_mw_wqe, the size of a vt3_sq_wqe, with
 * the same wr_id, opcode and flags): the window's type is the one it was
 * allocated with, its new key the one the application (type 2) or
 * vt3_bind_mw (type 1) chose; vt3d checks the rest in SQ order (vt3_hw.h
 * "Memory windows").
 */
int vt3_sq_wqe_set_bind(struct vt3_sq_wqe *wqe, const struct ibv_mw *mw,
			uint32_t rkey, const struct ibv_mw_bind_info *info)
{
	const unsigned int rights = IBV_ACCESS_LOCAL_WRITE |
				    IBV_ACCESS_REMOTE_WRITE |
				    IBV_ACCESS_REMOTE_READ;
	struct vt3_bind_mw_wqe bind = {
		.wr_id = wqe->wr_id,
		.opcode = wqe->opcode,
		.flags = wqe->flags,
	};

	if (!mw || info->mw_access_flags & ~rights || (!info->mr && info->length))
		return EINVAL;
	bind.mw_type = mw->type == IBV_MW_TYPE_1 ? VT3_MW_TYPE_1 : VT3_MW_TYPE_2;
	bind.mw_stag = htole32(rkey);
	bind.mr_stag = htole32(info->mr ? info->mr->lkey : 0);
	bind.addr = htole64(info->addr);
	bind.length = htole64(info->length);
	/* The IBV_ACCESS_* bits of these rights are the VT3_ACCESS_* ones. */
	bind.access = htole32(info->mw_access_flags);
	memcpy(wqe, &bind, sizeof(bind));
	return 0;
}

/* @wr through the builder, into @wqe and @swqe. */
static int vt3_build_send(struct vt3_qp *qp, const struct ibv_send_wr *wr,
			  struct vt3_sq_wqe *wqe, struct vt3_swqe *swqe)
{
	const struct vt3_send_op *op = vt3_send_op(wr->opcode);
	struct vt3_send_req req = {
		.wr_id = wr->wr_id,
		.send_flags = wr->send_flags,
		.invalidate_rkey = wr->invalidate_rkey,
	};
	struct ibv_data_buf bufs[VT3_MAX_SGE];
	int i, ret;

	if (!op || wr->num_sge < 0)
		return EINVAL;
	if (op->remote) {
		req.remote_addr = wr->wr.rdma.remote_addr;
		req.rkey = wr->wr.rdma.rkey;
	}
	ret = vt3_sq_wqe_init(qp, op, &req, wqe, swqe);
	if (ret)
		return ret;
	if (op->bind)
		return wr->send_flags & IBV_SEND_INLINE ? EINVAL :
		       vt3_sq_wqe_set_bind(wqe, wr->bind_mw.mw, wr->bind_mw.rkey,
					   &wr->bind_mw.bind_info);
	if (!(wr->send_flags & IBV_SEND_INLINE) || !op->data)
		return vt3_sq_wqe_set_sges(qp, op, wqe, wr->sg_list, wr->num_sge);
	/* Inline or not, num_sge is bounded by the QP's max_send_sge. */
	if ((uint32_t)wr->num_sge > qp->sq.max_sge || wr->num_sge > VT3_MAX_SGE)
		return EINVAL;
	for (i = 0; i < wr->num_sge; i++)
		bufs[i] = (struct ibv_data_buf){
			.addr = (void *)(uintptr_t)wr->sg_list[i].addr,
			.length = wr->sg_list[i].length,
		};
	return vt3_sq_wqe_set_inline(qp, op, wqe, bufs, wr->num_sge);
}

int vt3_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr,
		  struct ibv_send_wr **bad_wr)
{
	struct vt3_qp *qp = to_vt3_qp(ibqp);
	struct vt3_wq *wq = &qp->sq;
	struct vt3_sq_wqe wqe;
	struct vt3_swqe swqe;
	uint32_t start;
	bool error;
	int ret;

	ret = vt3_wq_post_begin(wq, &error);
	start = wq->prod;
	for (; wr && !ret; wr = wr->next) {
		if (vt3_wq_full(wq, wq->prod)) {
			ret = ENOMEM;
			break;
		}
		ret = vt3_build_send(qp, wr, &wqe, &swqe);
		if (ret)
			break;
		memcpy(vt3_wq_slot(wq, wq->prod), &wqe, sizeof(wqe));
		wq->swqe[wq->prod & (wq->depth - 1)] = swqe;
		wq->prod++;
	}
	if (ret)
		*bad_wr = wr;
	vt3_wq_post_end(wq, start, error);
	return ret;
}

/*
 * ibv_bind_mw (type 1): a BIND_MW work request under the window's next
 * key, which the window takes now (rxe and mlx5 do the same; a bind that
 * then fails leaves the application to undo it, the verbs say).
 */
int vt3_bind_mw(struct ibv_qp *ibqp, struct ibv_mw *mw,
		struct ibv_mw_bind *mw_bind)
{
	struct ibv_send_wr wr = {}, *bad_wr;
	int ret;

	wr.wr_id = mw_bind->wr_id;
	wr.opcode = IBV_WR_BIND_MW;
	wr.send_flags = mw_bind->send_flags;
	wr.bind_mw.mw = mw;
	wr.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
	wr.bind_mw.bind_info = mw_bind->bind_info;
	ret = vt3_post_send(ibqp, &wr, &bad_wr);
	if (ret)
		return ret;
	mw->rkey = wr.bind_mw.rkey;
	return 0;
}

/* @wr as a receive WQE (its SGE count checked by the caller): RQ or SRQ. */
void vt3_fill_recv_wqe(struct vt3_rq_wqe *wqe, const struct ibv_recv_wr *wr)
{
	int i;

	memset(wqe, 0, sizeof(*wqe));
	wqe->wr_id = htole64(wr->wr_id);
	wqe->num_sge = wr->num_sge;
	for (i = 0; i < wr->num_sge; i++) {
		wqe->sge[i].addr = htole64(wr->sg_list[i].addr);
		wqe->sge[i].length = htole32(wr->sg_list[i].length);
		wqe->sge[i].lkey = htole32(wr->sg_list[i].lkey);
	}
}

static int vt3_build_recv(struct vt3_qp *qp, const struct ibv_recv_wr *wr,
			  struct vt3_rq_wqe *wqe, struct vt3_swqe *swqe)
{
	if (wr->num_sge < 0 || (uint32_t)wr->num_sge > qp->rq.max_sge)
		return EINVAL;
	vt3_fill_recv_wqe(wqe, wr);
	swqe->wr_id = wr->wr_id;
	swqe->wc_opcode = IBV_WC_RECV;
	return 0;
}

int vt3_post_recv(struct ibv_qp *ibqp, struct ibv_recv_wr *wr,
		  struct ibv_recv_wr **bad_wr)
{
	struct vt3_qp *qp = to_vt3_qp(ibqp);
	struct vt3_wq *wq = &qp->rq;
	struct vt3_rq_wqe wqe;
	struct vt3_swqe swqe;
	uint32_t start;
	bool error;
	int ret;

	/* A QP of an SRQ receives into the SRQ's WQEs only. */
	if (qp->srq) {
		*bad_wr = wr;
		return EINVAL;
	}
	ret = vt3_wq_post_begin(wq, &error);
	start = wq->prod;
	for (; wr && !ret; wr = wr->next) {
		if (vt3_wq_full(wq, wq->prod)) {
			ret = ENOMEM;
			break;
		}
		ret = vt3_build_recv(qp, wr, &wqe, &swqe);
		if (ret)
			break;
		memcpy(vt3_wq_slot(wq, wq->prod), &wqe, sizeof(wqe));
		wq->swqe[wq->prod & (wq->depth - 1)] = swqe;
		wq->prod++;
	}
	if (ret)
		*bad_wr = wr;
	vt3_wq_post_end(wq, start, error);
	return ret;
}
