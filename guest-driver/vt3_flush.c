// SPDX-License-Identifier: GPL-2.0
/*
 * vt3 kernel QPs' flush (docs/architecture.md §5): the driver owns a
 * kernel QP's rings, so once the QP is in error it completes what vt3d did not
 * (IB_WC_WR_FLUSH_ERR) from poll_cq, after the device's CQEs; and it
 * keeps the books that make every WR complete exactly once: which CQE
 * freed which slot, where a lost device's flush starts, which destroyed
 * QP's CQEs are skipped. A QP of an SRQ has no RQ: its receives are the
 * SRQ's (vt3_srq.c).
 */
#include "vt3.h"

/*
 * Kernel QPs' rings belong to the driver, so it flushes them itself
 * (docs/architecture.md §5): once the QP is in error, vt3d writes no CQE for
 * it and has published, before reporting the error, its consumer indices
 * and every CQE of the WQEs it retired. What lies in [cons, prod) of each
 * queue then completes with IB_WC_WR_FLUSH_ERR when the CQ is polled,
 * after the ring's CQEs, as do WQEs posted later (ib_drain_qp). Every SQ
 * WQE completes, signaled or not: a flushed WR always completes (IB
 * semantics; ib_drain_sq posts an unsignaled one).
 *
 * A queue whose consumer index vt3d left beyond its producer index is not
 * trusted: nothing of it is flushed. Nor is the consumer index of a lost
 * device (vt3d may have retired WQEs whose CQEs came after the freeze):
 * then the flush starts after the last WQE whose CQE was taken.
 */
static u32 vt3_flush_start_index(struct vt3_qp *qp, __le32 *cons_p, u32 prod,
				 u32 depth)
{
	/* Acquire: pairs with vt3d's release of cons (before its CQEs). */
	u32 cons = le32_to_cpu(smp_load_acquire(cons_p));

	if (prod - cons > depth) {
		ibdev_warn_ratelimited(qp->ibqp.device,
				       "QP %u: consumer %u not within producer %u - depth %u: not flushed\n",
				       qp->qpn, cons, prod, depth);
		return prod;
	}
	return cons;
}

static bool vt3_cons_untrusted(struct vt3_qp *qp, struct vt3_cq *cq)
{
	return cq->frozen || READ_ONCE(to_vt3_dev(qp->ibqp.device)->ctrl.lost);
}

void vt3_qp_flush_start(struct vt3_qp *qp)
{
	struct vt3_cq *scq = to_vt3_cq(qp->ibqp.send_cq);
	struct vt3_cq *rcq = to_vt3_cq(qp->ibqp.recv_cq);
	struct vt3_qp_status *st = vt3_qp_status(qp);
	unsigned long flags;

	if (qp->user)
		return;
	spin_lock_irqsave(&scq->lock, flags);
	spin_lock(&qp->sq_lock);
	if (!qp->sq_flushing && !qp->destroyed) {
		qp->sq_flush_at_done = vt3_cons_untrusted(qp, scq);
		/* Until the mark: where posting may reuse slots from. */
		qp->sq_flush = qp->sq_flush_at_done ? qp->sq_done :
			       vt3_flush_start_index(qp, &st->sq_cons,
						     qp->sq_prod, qp->sq_depth);
		qp->sq_flush_mark = vt3_cq_prod(scq);
		WRITE_ONCE(qp->sq_flushing, true);
		list_add_tail(&qp->sq_flush_node, &scq->flush_sq);
	}
	spin_unlock(&qp->sq_lock);
	spin_unlock_irqrestore(&scq->lock, flags);

	spin_lock_irqsave(&rcq->lock, flags);
	spin_lock(&qp->rq_lock);
	/*
	 * A QP error flushes nothing of an SRQ (vt3d completed the WQE the
	 * QP had taken); a lost device leaves that to the SRQ's flush
	 * (vt3_srq.c), which this QP's receive CQ may run.
	 */
	if (!qp->rq_flushing && !qp->destroyed &&
	    (!qp->ibqp.srq || vt3_cons_untrusted(qp, rcq))) {
		qp->rq_flush_at_done = vt3_cons_untrusted(qp, rcq);
		qp->rq_flush = qp->rq_flush_at_done ? qp->rq_done :
			       vt3_flush_start_index(qp, &st->rq_cons,
						     qp->rq_prod, qp->rq_depth);
		qp->rq_flush_mark = vt3_cq_prod(rcq);
		WRITE_ONCE(qp->rq_flushing, true);
		list_add_tail(&qp->rq_flush_node, &rcq->flush_rq);
	}
	spin_unlock(&qp->rq_lock);
	spin_unlock_irqrestore(&rcq->lock, flags);
}

/*
 * Destroy, or ERR -> RESET: what is not flushed yet never completes (RESET
 * empties the queues; vt3d catches its consumer indices up).
 */
void vt3_qp_flush_stop(struct vt3_qp *qp)
{
	struct vt3_cq *scq = to_vt3_cq(qp->ibqp.send_cq);
	struct vt3_cq *rcq = to_vt3_cq(qp->ibqp.recv_cq);
	unsigned long flags;

	if (qp->user)
		return;
	spin_lock_irqsave(&scq->lock, flags);
	spin_lock(&qp->sq_lock);
	if (qp->sq_flushing) {
		list_del_init(&qp->sq_flush_node);
		WRITE_ONCE(qp->sq_flushing, false);
	}
	/* Every slot is free again, as vt3d's consumer index says. */
	smp_store_release(&qp->sq_done, qp->sq_prod);
	spin_unlock(&qp->sq_lock);
	spin_unlock_irqrestore(&scq->lock, flags);

	spin_lock_irqsave(&rcq->lock, flags);
	spin_lock(&qp->rq_lock);
	if (qp->rq_flushing) {
		list_del_init(&qp->rq_flush_node);
		WRITE_ONCE(qp->rq_flushing, false);
	}
	/* The same for the RQ: pairs with post_recv's acquire of rq_done. */
	smp_store_release(&qp->rq_done, qp->rq_prod);
	spin_unlock(&qp->rq_lock);
	spin_unlock_irqrestore(&rcq->lock, flags);
}

static enum ib_wc_opcode vt3_flush_opcode(u8 opcode)
{
	switch (opcode) {
	case VT3_WR_WRITE:
		return IB_WC_RDMA_WRITE;
	case VT3_WR_READ:
	case VT3_WR_READ_INV:
		return IB_WC_RDMA_READ;
	case VT3_WR_REG_MR:
		return IB_WC_REG_MR;
	case VT3_WR_LOCAL_INV:
		return IB_WC_LOCAL_INV;
	default:
		return IB_WC_SEND;
	}
}

static void vt3_flush_wc(struct ib_wc *wc, struct vt3_qp *qp, u64 wr_id,
			 enum ib_wc_opcode opcode)
{
	memset(wc, 0, sizeof(*wc));
	wc->wr_id = wr_id;
	wc->status = IB_WC_WR_FLUSH_ERR;
	wc->opcode = opcode;
	wc->qp = &qp->ibqp;
}

/* Up to @num flush completions of @qp's SQ; its CQ's lock held. */
static int vt3_flush_sq(struct vt3_qp *qp, int num, struct ib_wc *wc)
{
	const struct vt3_sq_wqe *sqe;
	int n = 0;

	spin_lock(&qp->sq_lock);
	while (n < num && qp->sq_flush != qp->sq_prod) {
		sqe = vt3_pages_slot(qp->sq.mem,
				     (qp->sq_flush & (qp->sq_depth - 1)) *
				     VT3_WQE_SIZE);
		vt3_flush_wc(&wc[n++], qp, le64_to_cpu(READ_ONCE(sqe->wr_id)),
			     vt3_flush_opcode(READ_ONCE(sqe->opcode)));
		/* The slot is free for a post once this is seen. */
		WRITE_ONCE(qp->sq_flush, qp->sq_flush + 1);
	}
	spin_unlock(&qp->sq_lock);
	return n;
}

static int vt3_flush_rq(struct vt3_qp *qp, int num, struct ib_wc *wc)
{
	const struct vt3_rq_wqe *rqe;
	int n = 0;

	spin_lock(&qp->rq_lock);
	while (n < num && qp->rq_flush != qp->rq_prod) {
		rqe = vt3_pages_slot(qp->rq.mem,
				     (qp->rq_flush & (qp->rq_depth - 1)) *
				     VT3_WQE_SIZE);
		vt3_flush_wc(&wc[n++], qp, le64_to_cpu(READ_ONCE(rqe->wr_id)),
			     IB_WC_RECV);
		WRITE_ONCE(qp->rq_flush, qp->rq_flush + 1);
	}
	spin_unlock(&qp->rq_lock);
	return n;
}

/* Up to @num flush completions of @cq's QPs; cq->lock held. */
int vt3_qp_poll_flush(struct vt3_cq *cq, int num, struct ib_wc *wc)
{
	struct vt3_qp *qp;
	int n = 0;

	lockdep_assert_held(&cq->lock);
	list_for_each_entry(qp, &cq->flush_sq, sq_flush_node) {
		if ((s32)(cq->cons - qp->sq_flush_mark) < 0)
			continue;
		if (qp->sq_flush_at_done) {
			/* Its last CQE that counts was taken. */
			spin_lock(&qp->sq_lock);
			WRITE_ONCE(qp->sq_flush, qp->sq_done);
			qp->sq_flush_at_done = false;
			spin_unlock(&qp->sq_lock);
		}
		n += vt3_flush_sq(qp, num - n, wc + n);
		if (n == num)
			return n;
	}
	list_for_each_entry(qp, &cq->flush_rq, rq_flush_node) {
		if ((s32)(cq->cons - qp->rq_flush_mark) < 0)
			continue;
		if (qp->rq_flush_at_done) {
			spin_lock(&qp->rq_lock);
			WRITE_ONCE(qp->rq_flush, qp->rq_done);
			qp->rq_flush_at_done = false;
			spin_unlock(&qp->rq_lock);
		}
		if (qp->ibqp.srq)
			n += vt3_srq_flush(qp, num - n, wc + n);
		else
			n += vt3_flush_rq(qp, num - n, wc + n);
		if (n == num)
			return n;
	}
	return n;
}

/*
 * A CQE of @qp's @recv queue was taken from @cq (its lock held): the
 * WQEs up to it are done and their slots free (vt3_hw.h). Returns false
 * when it must not be delivered: its queue's flush began (a lost
 * device's CQE after the last that counts, or a device bug), so its WR
 * completes with the flush.
 */
bool vt3_qp_cqe_taken(struct vt3_qp *qp, struct vt3_cq *cq, bool recv,
		      u32 wqe_idx)
{
	struct ib_cq *qcq = recv ? qp->ibqp.recv_cq : qp->ibqp.send_cq;
	u32 *done = recv ? &qp->rq_done : &qp->sq_done;
	u32 prod = READ_ONCE(*(recv ? &qp->rq_prod : &qp->sq_prod));
	bool flushing = READ_ONCE(*(recv ? &qp->rq_flushing : &qp->sq_flushing));
	u32 mark = recv ? qp->rq_flush_mark : qp->sq_flush_mark;

	lockdep_assert_held(&cq->lock);
	if (qcq != &cq->ibcq || qp->user) {
		ibdev_warn_ratelimited(qp->ibqp.device,
				       "CQ %u: a CQE of QP %u, whose %s CQ it is not\n",
				       cq->cqn, qp->qpn, recv ? "receive" : "send");
		return false;
	}
	if (flushing && (s32)(cq->cons - mark) >= 0)
		return false;
	/* WQEs complete in order: this one lies in [done, prod). */
	if (wqe_idx - *done >= prod - *done) {
		ibdev_warn_ratelimited(qp->ibqp.device,
				       "QP %u: CQE for %s WQE %u outside [%u, %u)\n",
				       qp->qpn, recv ? "RQ" : "SQ", wqe_idx,
				       *done, prod);
		return true;
	}
	/* The slot is free once we read the CQE: pairs with the poster's acquire. */
	smp_store_release(done, wqe_idx + 1);
	return true;
}

/*
 * destroy_qp of a kernel QP: none of its completions is delivered from now
 * on (kernel ULPs dereference wc->qp): what it still owed a flush goes
 * with it, its CQEs still in the rings are skipped, and a device loss
 * after this cannot put it on a flush list again.
 */
void vt3_qp_forget(struct vt3_qp *qp)
{
	struct vt3_cq *scq = to_vt3_cq(qp->ibqp.send_cq);
	struct vt3_cq *rcq = to_vt3_cq(qp->ibqp.recv_cq);
	unsigned long flags;

	if (qp->user)
		return;
	local_irq_save(flags);
	if (scq == rcq) {
		spin_lock(&scq->lock);
		/* For sparse: rcq's lock is scq's, unlocked as such below. */
		__acquire(&rcq->lock);
	} else {
		/* Address order, as every path that takes both. */
		spin_lock(scq < rcq ? &scq->lock : &rcq->lock);
		spin_lock_nested(scq < rcq ? &rcq->lock : &scq->lock,
				 SINGLE_DEPTH_NESTING);
	}
	spin_lock(&qp->sq_lock);
	spin_lock_nested(&qp->rq_lock, SINGLE_DEPTH_NESTING);
	qp->destroyed = true;
	if (qp->sq_flushing) {
		list_del_init(&qp->sq_flush_node);
		WRITE_ONCE(qp->sq_flushing, false);
	}
	if (qp->rq_flushing) {
		list_del_init(&qp->rq_flush_node);
		WRITE_ONCE(qp->rq_flushing, false);
	}
	spin_unlock(&qp->rq_lock);
	spin_unlock(&qp->sq_lock);
	vt3_srq_qp_gone(qp);
	vt3_cq_forget(scq, qp->qpn);
	if (rcq != scq) {
		vt3_cq_forget(rcq, qp->qpn);
		spin_unlock(&rcq->lock);
	} else {
		__release(&rcq->lock);
	}
	spin_unlock(&scq->lock);
	local_irq_restore(flags);
}

/* Whether a poll of @cq would return flush completions; cq->lock held. */
bool vt3_qp_flush_pending(struct vt3_cq *cq)
{
	struct vt3_qp *qp;

	lockdep_assert_held(&cq->lock);
	list_for_each_entry(qp, &cq->flush_sq, sq_flush_node)
		if (READ_ONCE(qp->sq_flush) != READ_ONCE(qp->sq_prod))
			return true;
	list_for_each_entry(qp, &cq->flush_rq, rq_flush_node)
		if (qp->ibqp.srq ? vt3_srq_flush_pending(qp) :
		    READ_ONCE(qp->rq_flush) != READ_ONCE(qp->rq_prod))
			return true;
	return false;
}
