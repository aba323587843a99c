// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
/*
 * libvt3 completions: CQEs are read from the mapped ring between our
 * consumer index and vt3d's producer index (docs/architecture.md §3.1),
 * and QPs in error are flushed here (docs/architecture.md §5).
 *
 * vt3d never writes flush CQEs: once a QP is in error, every WR it has
 * not retired completes here, once, with IBV_WC_WR_FLUSH_ERR: every
 * receive and every send, signaled or not, of [consumer index, producer
 * index) (vt3_hw.h; a WR that completes in error always generates a
 * completion, ibv_post_send(3)). Those completions are made from the
 * queue's shadow (qp.c) only after poll_cq returned every device CQE of
 * that queue, so each queue keeps its order: device completions first,
 * then flushes in posting order, including WRs posted after the error.
 *
 * A destroyed QP's completions are never returned afterwards, as mlx5's
 * cq_clean does: its device CQEs still in the ring are skipped (the CQ
 * remembers its QP number up to the producer index at the destroy), and
 * the flush it still owed goes with it.
 */
#include <config.h>

#include <errno.h>
#include <sched.h>
#include <stdlib.h>

#include <ccan/array_size.h>

#include "vt3.h"

static const enum ibv_wc_status vt3_wc_status[] = {
	[VT3_WC_SUCCESS] = IBV_WC_SUCCESS,
	[VT3_WC_LOC_LEN_ERR] = IBV_WC_LOC_LEN_ERR,
	[VT3_WC_LOC_QP_OP_ERR] = IBV_WC_LOC_QP_OP_ERR,
	[VT3_WC_LOC_PROT_ERR] = IBV_WC_LOC_PROT_ERR,
	[VT3_WC_WR_FLUSH_ERR] = IBV_WC_WR_FLUSH_ERR,
	[VT3_WC_REM_ACCESS_ERR] = IBV_WC_REM_ACCESS_ERR,
	[VT3_WC_REM_OP_ERR] = IBV_WC_REM_OP_ERR,
	[VT3_WC_GENERAL_ERR] = IBV_WC_GENERAL_ERR,
	[VT3_WC_BAD_RESP_ERR] = IBV_WC_BAD_RESP_ERR,
	[VT3_WC_REM_INV_REQ_ERR] = IBV_WC_REM_INV_REQ_ERR,
	[VT3_WC_MW_BIND_ERR] = IBV_WC_MW_BIND_ERR,
};

static const enum ibv_wc_opcode vt3_wc_opcode[] = {
	[VT3_WC_SEND] = IBV_WC_SEND,
	[VT3_WC_WRITE] = IBV_WC_RDMA_WRITE,
	[VT3_WC_READ] = IBV_WC_RDMA_READ,
	[VT3_WC_RECV] = IBV_WC_RECV,
	[VT3_WC_LOCAL_INV] = IBV_WC_LOCAL_INV,
	[VT3_WC_BIND_MW] = IBV_WC_BIND_MW,
};

/* Two CQs of one QP, in address order so that two QPs never deadlock. */
void vt3_lock_cqs(struct vt3_cq *a, struct vt3_cq *b)
{
	if (a == b) {
		pthread_spin_lock(&a->lock);
	} else if (a < b) {
		pthread_spin_lock(&a->lock);
		pthread_spin_lock(&b->lock);
	} else {
		pthread_spin_lock(&b->lock);
		pthread_spin_lock(&a->lock);
	}
}

void vt3_unlock_cqs(struct vt3_cq *a, struct vt3_cq *b)
{
	pthread_spin_unlock(&a->lock);
	if (a != b)
		pthread_spin_unlock(&b->lock);
}

static void vt3_cqe_to_wc(const struct vt3_cqe *cqe, struct ibv_wc *wc)
{
	*wc = (struct ibv_wc){
		.wr_id = le64toh(cqe->wr_id),
		.status = IBV_WC_GENERAL_ERR,
		.opcode = IBV_WC_SEND,
		.vendor_err = le32toh(cqe->vendor_err),
		.byte_len = le32toh(cqe->byte_len),
		.qp_num = le32toh(cqe->qpn),
		/* RC over iWARP: the peer's QP number is never exchanged. */
		.src_qp = 0,
	};
	if (cqe->status < ARRAY_SIZE(vt3_wc_status))
		wc->status = vt3_wc_status[cqe->status];
	/*
	 * An opcode we do not know is a device bug: an error on the SQ
	 * (REG_MR included: no user QP posts one).
	 */
	if (cqe->opcode < ARRAY_SIZE(vt3_wc_opcode) &&
	    cqe->opcode != VT3_WC_REG_MR)
		wc->opcode = vt3_wc_opcode[cqe->opcode];
	else
		wc->status = IBV_WC_GENERAL_ERR;
	if (cqe->flags & VT3_CQE_INVALIDATED) {
		wc->wc_flags |= IBV_WC_WITH_INV;
		wc->invalidated_rkey = le32toh(cqe->invalidated_stag);
	}
}

/*
 * Whether the CQE at the consumer index belongs to a destroyed QP; drops
 * the marks the consumer index has passed. cq->lock held.
 */
static bool vt3_cqe_of_gone_qp(struct vt3_cq *cq, uint32_t qpn)
{
	struct vt3_gone *g, *next;
	bool gone = false;

	list_for_each_safe(&cq->gone, g, next, entry) {
		if ((int32_t)(cq->cons - g->mark) >= 0) {
			list_del_from(&cq->gone, &g->entry);
			free(g);
		} else if (g->qpn == qpn) {
			gone = true;
		}
	}
	return gone;
}

/*
 * The producer index to read up to: vt3d's (acquire: pairs with its
 * release store after writing the CQEs), or, once vt3.ko declared the
 * device lost, the one it froze (vt3_hw.h, VT3_CQ_F_FROZEN).
 */
uint32_t vt3_cq_prod(struct vt3_cq *cq)
{
	if (vt3_cq_frozen(cq))
		return le32toh(cq->status->frozen_prod);
	return vt3_load_acquire(&cq->status->prod);
}

bool vt3_cq_frozen(struct vt3_cq *cq)
{
	return vt3_load_acquire(&cq->status->flags) & VT3_CQ_F_FROZEN;
}

/*
 * The CQE at the consumer index names WQE @idx of @qpn's queue: the WQEs
 * up to it are done and their slots free (vt3_hw.h). False: not to be
 * returned, as its queue's flush began (a lost device's CQE after the
 * last that counts, or a device bug): its WR completes with the flush.
 * A CQE of a QP we do not know (another process's, or a device bug) is
 * returned as it is. cq->lock held.
 */
static bool vt3_cqe_taken(struct vt3_cq *cq, const struct vt3_cqe *cqe,
			  uint64_t *wr_id)
{
	struct vt3_context *ctx = to_vt3_ctx(cq->ibv_cq.context);
	uint32_t qpn = le32toh(cqe->qpn), idx = le32toh(cqe->wqe_idx);
	bool recv = cqe->opcode == VT3_WC_RECV;
	struct vt3_qp *qp = vt3_qp_find(ctx, qpn);
	struct vt3_wq *wq;
	uint32_t done;

	*wr_id = le64toh(cqe->wr_id);
	if (!qp)
		return true;
	wq = recv ? &qp->rq : &qp->sq;
	if (wq->cq != cq)
		return true;
	/*
	 * A receive of a QP of an SRQ names its SRQ slot, which completes
	 * once (srq.c), whether or not a lost device's flush began; any
	 * other receive of such a QP is a device bug.
	 */
	if (recv && qp->srq)
		return (cqe->flags & VT3_CQE_SRQ) &&
		       vt3_srq_cqe_taken(qp->srq, idx, wr_id, true);
	/* Set under cq->lock: stable here. */
	if (wq->flushing)
		return false;
	done = wq->done;
	if (wq->check)
		vt3_wrcheck_completed(wq, idx, *wr_id, false);
	/* WQEs complete in order: this one lies in [done, prod). */
	if (idx - done < __atomic_load_n(&wq->prod, __ATOMIC_RELAXED) - done)
		__atomic_store_n(&wq->done, idx + 1, __ATOMIC_RELEASE);
	return true;
}

/* Device CQEs up to the producer index as read once. */
static int vt3_poll_device(struct vt3_cq *cq, int num, struct ibv_wc *wc)
{
	uint32_t prod;
	int n = 0;
	bool moved = false;

	prod = vt3_cq_prod(cq);
	if (prod - cq->cons > cq->depth) {
		verbs_err(verbs_get_ctx(cq->ibv_cq.context),
			  "libvt3: CQ producer %u is past consumer %u + depth %u\n",
			  prod, cq->cons, cq->depth);
		return -EIO;
	}
	while (n < num && cq->cons != prod) {
		const struct vt3_cqe *cqe = &cq->ring[cq->cons & (cq->depth - 1)];
		uint32_t qpn = le32toh(cqe->qpn);
		uint64_t wr_id;

		if ((list_empty(&cq->gone) || !vt3_cqe_of_gone_qp(cq, qpn)) &&
		    vt3_cqe_taken(cq, cqe, &wr_id)) {
			vt3_cqe_to_wc(cqe, &wc[n]);
			wc[n++].wr_id = wr_id;
		}
		cq->cons++;
		moved = true;
	}
	if (!list_empty(&cq->gone))
		vt3_cqe_of_gone_qp(cq, 0);
	/* Release: our reads of the slots come before vt3d may reuse them. */
	if (moved)
		vt3_store_release(&cq->status->cons, cq->cons);
	return n;
}

/* Flush completions of one queue, in posting order. wq->lock is held. */
static int vt3_wq_flush(struct vt3_wq *wq, int num, struct ibv_wc *wc)
{
	int n = 0;

	while (n < num && wq->flush_pos != wq->prod) {
		const struct vt3_swqe *e =
			&wq->swqe[wq->flush_pos & (wq->depth - 1)];

		wq->flush_pos++;
		wc[n++] = (struct ibv_wc){
			.wr_id = e->wr_id,
			.status = IBV_WC_WR_FLUSH_ERR,
			.opcode = e->wc_opcode,
			.qp_num = wq->qp->ibv_qp.qp_num,
		};
		if (wq->check)
			vt3_wrcheck_completed(wq, wq->flush_pos - 1, e->wr_id, true);
	}
	if (wq->check)
		vt3_wrcheck_flushed_to(wq);
	return n;
}

/*
 * A queue on cq->flushed got work again (a WR posted in error): back to
 * cq->wqs. Called with cq->lock held.
 */
static void vt3_cq_take_reposts(struct vt3_cq *cq)
{
	struct vt3_wq *wq, *next;

	/* Acquire: pairs with the release in vt3_cq_note_repost(). */
	if (!__atomic_exchange_n(&cq->repost, 0, __ATOMIC_ACQ_REL))
		return;
	list_for_each_safe(&cq->flushed, wq, next, cq_entry) {
		bool work;

		pthread_spin_lock(&wq->lock);
		work = !wq->flushing || wq->flush_pos != wq->prod ||
		       (wq->srq_lost && vt3_srq_flush_pending(wq));
		pthread_spin_unlock(&wq->lock);
		if (work) {
			list_del_from(&cq->flushed, &wq->cq_entry);
			list_add_tail(&cq->wqs, &wq->cq_entry);
		}
	}
}

/*
 * A WR was taken on a queue in error: if its queue sits on cq->flushed,
 * the next poll_cq looks at it again. Called after wq->lock was dropped
 * (the release orders the new producer index before the flag).
 */
void vt3_cq_note_repost(struct vt3_wq *wq)
{
	__atomic_store_n(&wq->cq->repost, 1, __ATOMIC_RELEASE);
}

/*
 * Modify to RESET: the queue is healthy again and may go into error
 * anew, so poll_cq must look at it (cq->wqs).
 */
void vt3_cq_requeue(struct vt3_wq *wq)
{
	struct vt3_cq *cq = wq->cq;
	struct vt3_wq *w;

	pthread_spin_lock(&cq->lock);
	list_for_each(&cq->flushed, w, cq_entry) {
		if (w == wq) {
			list_del_from(&cq->flushed, &wq->cq_entry);
			list_add_tail(&cq->wqs, &wq->cq_entry);
			break;
		}
	}
	pthread_spin_unlock(&cq->lock);
}

/*
 * Flushes the queues of this CQ whose QP is in error, each once every
 * device CQE of it was returned (the CQ consumer index passed the queue's
 * flush mark). A queue whose flush is complete moves to cq->flushed and
 * is not looked at again until a WR is posted to it (repost) or its QP
 * is reset. Called with cq->lock held.
 */
static int vt3_cq_flush(struct vt3_cq *cq, int num, struct ibv_wc *wc)
{
	struct vt3_wq *wq, *next;
	int n = 0;

	vt3_cq_take_reposts(cq);
	list_for_each_safe(&cq->wqs, wq, next, cq_entry) {
		bool done = false;

		if (n == num)
			break;
		pthread_spin_lock(&wq->lock);
		if (vt3_wq_error(wq, VT3_BY_POLL) && !wq->flushing &&
		    (int32_t)(cq->cons - wq->flush_mark) >= 0) {
			/* Its last CQE that counts was taken. */
			if (wq->flush_at_done)
				wq->flush_pos = wq->done;
			wq->flushing = true;
			if (wq->check)
				vt3_wrcheck_flush_begins(wq);
		}
		if (wq->flushing) {
			n += vt3_wq_flush(wq, num - n, wc + n);
			if (wq->srq_lost)
				n += vt3_srq_flush(wq, num - n, wc + n);
			done = wq->flush_pos == wq->prod &&
			       !(wq->srq_lost && vt3_srq_flush_pending(wq));
		}
		pthread_spin_unlock(&wq->lock);
		if (done) {
			list_del_from(&cq->wqs, &wq->cq_entry);
			list_add_tail(&cq->flushed, &wq->cq_entry);
		}
	}
	return n;
}

/*
 * The receives of SRQ @srq that @qpn completed in [cq->cons, @prod) are
 * never returned (the QP is gone): their slots are free again at once,
 * or the SRQ would stay short of them for good. cq->lock held.
 */
static void vt3_cq_release_srq_slots(struct vt3_cq *cq, uint32_t qpn,
				     struct vt3_srq *srq, uint32_t prod)
{
	uint32_t i;

	for (i = cq->cons; i != prod; i++) {
		const struct vt3_cqe *cqe = &cq->ring[i & (cq->depth - 1)];
		uint64_t wr_id;

		if (le32toh(cqe->qpn) == qpn && cqe->opcode == VT3_WC_RECV &&
		    cqe->flags & VT3_CQE_SRQ)
			vt3_srq_cqe_taken(srq, le32toh(cqe->wqe_idx), &wr_id,
					  false);
	}
}

/*
 * The QP @qpn was destroyed (vt3d confirmed: it writes no more CQEs for
 * it): its CQEs below the producer index are skipped from now on, and
 * the SRQ slots those of @srq (its SRQ, if it completes receives here;
 * else NULL) held are free. Called with cq->lock held.
 */
void vt3_cq_forget(struct vt3_cq *cq, uint32_t qpn, struct vt3_srq *srq)
{
	struct vt3_gone *g;
	uint32_t prod = vt3_cq_prod(cq);

	if (prod == cq->cons)
		return;
	/* A producer past the ring is a device bug: vt3_poll_device() says so. */
	if (srq && prod - cq->cons <= cq->depth)
		vt3_cq_release_srq_slots(cq, qpn, srq, prod);
	g = calloc(1, sizeof(*g));
	if (!g) {
		verbs_err(verbs_get_ctx(cq->ibv_cq.context),
			  "libvt3: no memory to forget QP %u's CQEs\n", qpn);
		return;
	}
	g->qpn = qpn;
	g->mark = prod;
	list_add_tail(&cq->gone, &g->entry);
}

void vt3_cq_free_gone(struct vt3_cq *cq)
{
	struct vt3_gone *g, *next;

	list_for_each_safe(&cq->gone, g, next, entry) {
		list_del_from(&cq->gone, &g->entry);
		free(g);
	}
}

/*
 * Up to @num completions into @wc, cq->lock held: the one reader of the
 * CQ for ibv_poll_cq and ibv_cq_ex (cq_ex.c) alike, so a completion is
 * returned once whichever API takes it.
 */
int vt3_cq_poll_locked(struct vt3_cq *cq, int num, struct ibv_wc *wc)
{
	int flushed = 0, n;

	/*
	 * vt3d and vt3.ko flag a QP in error before its CQs: the CQ flag
	 * (it stays set) spares a look at every QP on a healthy CQ. Flush
	 * completions that are due (every device CQE of their queue was
	 * returned) go first, so a CQ that other QPs keep busy cannot starve
	 * a drain.
	 */
	if (vt3_load_acquire(&cq->status->flags) & VT3_CQ_F_ERROR)
		flushed = vt3_cq_flush(cq, num, wc);
	n = vt3_poll_device(cq, num - flushed, wc + flushed);
	if (n >= 0)
		return n + flushed;
	return flushed ? flushed : n;
}

int vt3_poll_cq(struct ibv_cq *ibcq, int num_entries, struct ibv_wc *wc)
{
	struct vt3_cq *cq = to_vt3_cq(ibcq);
	int n;

	pthread_spin_lock(&cq->lock);
	n = vt3_cq_poll_locked(cq, num_entries, wc);
	pthread_spin_unlock(&cq->lock);
	return n;
}

/*
 * Arming is a kernel command (VT3_CMD_ARM_CQ). vt3d raises the event at
 * once if CQEs wait when it processes the arm (prod != the cons we
 * published at the end of the last poll), so no device completion is
 * missed. Flush completions are ours and no device event announces them:
 * if some wait, ring the doorbell of their queue: on a QP in error vt3.ko
 * turns it into a run of the CQ's completion handler (the armed CQ's
 * event).
 */
int vt3_req_notify_cq(struct ibv_cq *ibcq, int solicited_only)
{
	struct vt3_cq *cq = to_vt3_cq(ibcq);
	struct vt3_wq *wq, *ring = NULL;
	int ret;

	ret = ibv_cmd_req_notify_cq(ibcq, solicited_only);
	if (ret || !(vt3_load_acquire(&cq->status->flags) & VT3_CQ_F_ERROR))
		return ret;

	/*
	 * Found under cq->lock, rung outside it (a syscall must not hold up
	 * pollers spinning on the lock): 'ringing' keeps destroy_qp from
	 * freeing the queue meanwhile (vt3_cq_wait_ringing()).
	 */
	pthread_spin_lock(&cq->lock);
	list_for_each(&cq->wqs, wq, cq_entry) {
		bool pending;

		pthread_spin_lock(&wq->lock);
		pending = vt3_wq_error(wq, VT3_BY_POLL) &&
			  (wq->flush_pos != wq->prod ||
			   (wq->srq_lost && vt3_srq_flush_pending(wq)));
		pthread_spin_unlock(&wq->lock);
		if (pending) {
			ring = wq;
			__atomic_add_fetch(&cq->ringing, 1, __ATOMIC_ACQ_REL);
			break;
		}
	}
	pthread_spin_unlock(&cq->lock);
	if (ring) {
		vt3_wq_doorbell(ring);
		__atomic_sub_fetch(&cq->ringing, 1, __ATOMIC_RELEASE);
	}
	return 0;
}

/*
 * destroy_qp took its queues off @cq: waits until no req_notify_cq still
 * rings a doorbell it found before (a syscall's time).
 */
void vt3_cq_wait_ringing(struct vt3_cq *cq)
{
	while (__atomic_load_n(&cq->ringing, __ATOMIC_ACQUIRE))
		sched_yield();
}
