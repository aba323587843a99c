// SPDX-License-Identifier: GPL-2.0
/*
 * vt3 shared receive queues (docs/architecture.md §3.4): the
 * kernel allocates the ring of vt3_rq_wqe and the vt3_srq_status page and
 * hands them to vt3d; the producer is the provider (user SRQs, through
 * mmap; its doorbell is a zero-WR post_srq_recv) or this driver (kernel
 * SRQs); the QPs of the SRQ take its WQEs inside vt3d.
 *
 * Completions: a receive CQE of an SRQ WQE carries VT3_CQE_SRQ and the
 * WQE's SRQ index. For a kernel SRQ the driver keeps each slot's wr_id
 * and whether its completion is owed; a CQE completes the slot it names
 * once (then the slot is free for a post), whatever vt3d's consumer index
 * says. A QP error flushes nothing of the SRQ: vt3d itself completes the
 * one WQE the failing QP had taken. Only a lost device leaves owed slots
 * nobody completes: then the receive CQ of the first QP of the SRQ whose
 * flush runs completes them with IB_WC_WR_FLUSH_ERR (vt3_hw.h).
 */
#include <linux/log2.h>
#include <rdma/uverbs_ioctl.h>

#include "vt3.h"

static struct vt3_srq_status *vt3_srq_status(struct vt3_srq *srq)
{
	return vt3_pages_slot(srq->status.mem, 0);
}

static void vt3_srq_doorbell(struct vt3_srq *srq)
{
	struct vt3_cmd_doorbell req = {
		.qpn = cpu_to_le32(srq->srqn),
		.queues = cpu_to_le32(VT3_DB_SRQ),
	};

	if (irqs_disabled()) {
		/* dev_queue_xmit() needs IRQs on: ring from a worker. */
		queue_work(system_highpri_wq, &srq->db_work);
		return;
	}
	vt3_post(to_vt3_dev(srq->ibsrq.device), VT3_CMD_DOORBELL, &req,
		 sizeof(req));
}

static void vt3_srq_db_work(struct work_struct *work)
{
	vt3_srq_doorbell(container_of(work, struct vt3_srq, db_work));
}

/*
 * @slot's WR completed (srq->lock held): free it, and its copy in the
 * slots of a resize waiting for vt3d, should that win.
 */
static void vt3_srq_slot_done(struct vt3_srq *srq, struct vt3_srq_slot *slot)
{
	struct vt3_srq_slot *next;

	slot->owed = false;
	srq->owed--;
	if (srq->next_slots) {
		next = &srq->next_slots[slot->idx & (srq->next_depth - 1)];
		if (next->idx == slot->idx)
			next->owed = false;
	}
}

int vt3_create_srq(struct ib_srq *ibsrq, struct ib_srq_init_attr *init,
		   struct ib_udata *udata)
{
	struct vt3_dev *dev = to_vt3_dev(ibsrq->device);
	struct vt3_ucontext *uctx = rdma_udata_to_drv_context(udata,
				struct vt3_ucontext, ibuc);
	struct ib_ucontext *ibuc = uctx ? &uctx->ibuc : NULL;
	struct vt3_srq *srq = to_vt3_srq(ibsrq);
	const struct ib_srq_attr *a = &init->attr;
	struct vt3_create_srq_resp uresp = {};
	struct vt3_cmd_create_srq req = {};
	struct vt3_resp_handle resp;
	bool forgot;
	int err;

	if (!dev->lim.max_srq)
		return -EOPNOTSUPP;
	if (init->srq_type != IB_SRQT_BASIC)
		return -EOPNOTSUPP;
	if (a->max_wr < 1 || a->max_wr > dev->lim.max_srq_wr ||
	    a->max_sge > dev->lim.max_srq_sge)
		return -EINVAL;
	if (udata && (!vt3_udata_in_ok(udata) ||
		      udata->outlen < sizeof(uresp)))
		return -EINVAL;

	/* vt3d takes rings of at least two entries. */
	srq->depth = roundup_pow_of_two(max(a->max_wr, 2U));
	if (srq->depth > dev->lim.max_srq_depth)
		return -EINVAL;
	/* The verbs: a limit above the SRQ's size is refused. */
	if (a->srq_limit > srq->depth)
		return -EINVAL;
	srq->max_sge = a->max_sge;
	srq->limit = a->srq_limit;
	srq->user = !!udata;
	spin_lock_init(&srq->lock);
	mutex_init(&srq->modify_lock);
	INIT_WORK(&srq->db_work, vt3_srq_db_work);
	if (!udata) {
		srq->slots = kcalloc(srq->depth, sizeof(*srq->slots),
				     GFP_KERNEL);
		if (!srq->slots)
			return -ENOMEM;
	}

	err = vt3_queue_mem_alloc(dev, ibuc, &srq->ring,
				  (size_t)srq->depth * VT3_WQE_SIZE, true,
				  &uresp.ring_key);
	if (err)
		goto err_slots;
	err = vt3_queue_mem_alloc(dev, ibuc, &srq->status,
				  sizeof(struct vt3_srq_status), false,
				  &uresp.status_key);
	if (err)
		goto err_ring;
	if (srq->ring.mem->pbl_len > dev->lim.max_pbl_pages) {
		err = -EINVAL;
		goto err_status;
	}

	req.ring_pbl_addr = cpu_to_le64(virt_to_phys(srq->ring.mem->pbl));
	req.status_addr = cpu_to_le64(page_to_phys(srq->status.mem->pages[0]));
	req.ring_npages = cpu_to_le32(srq->ring.mem->pbl_len);
	req.depth = cpu_to_le32(srq->depth);
	req.pdn = cpu_to_le32(to_vt3_pd(ibsrq->pd)->pdn);
	req.max_sge = cpu_to_le32(srq->max_sge);
	req.limit = cpu_to_le32(srq->limit);
	err = vt3_cmd(dev, VT3_CMD_CREATE_SRQ, &req, sizeof(req), &resp,
		      sizeof(resp));
	if (err)
		goto err_status;
	srq->srqn = le32_to_cpu(resp.handle);

	if (udata) {
		uresp.srqn = srq->srqn;
		uresp.depth = srq->depth;
		uresp.ring_size = srq->ring.mem->npages << PAGE_SHIFT;
		err = ib_copy_to_udata(udata, &uresp, sizeof(uresp));
		if (err)
			goto err_destroy;
	}
	/* Findable by events only once nothing can fail. */
	err = xa_insert_irq(&dev->srq_xa, srq->srqn, srq, GFP_KERNEL);
	if (err) {
		ibdev_err(&dev->ibdev, "CREATE_SRQ returned srqn %u in use\n",
			  srq->srqn);
		goto err_destroy;
	}
	init->attr.max_wr = srq->depth;
	return 0;

err_destroy:
	forgot = vt3_forgot(vt3_cmd_handle(dev, VT3_CMD_DESTROY_SRQ,
					   srq->srqn));
	vt3_queue_mem_release(dev, &srq->status, forgot);
	vt3_queue_mem_release(dev, &srq->ring, forgot);
	goto err_slots;
err_status:
	vt3_queue_mem_release(dev, &srq->status, vt3_refused(err));
err_ring:
	vt3_queue_mem_release(dev, &srq->ring, vt3_refused(err));
err_slots:
	kfree(srq->slots);
	srq->slots = NULL;
	return err;
}

/*
 * The core refuses to destroy an SRQ that QPs use (its usecnt), so vt3d's
 * BUSY cannot come from a consumer; like every destroy verb this returns
 * 0 whatever vt3d says, keeping the memory it may still use as orphans.
 * WQEs still in the SRQ complete nowhere (the verbs' rule).
 */
int vt3_destroy_srq(struct ib_srq *ibsrq, struct ib_udata *udata)
{
	struct vt3_dev *dev = to_vt3_dev(ibsrq->device);
	struct vt3_srq *srq = to_vt3_srq(ibsrq);
	bool forgot;
	int err;

	/* Event handlers look SRQs up under the xarray's lock. */
	xa_erase_irq(&dev->srq_xa, srq->srqn);
	cancel_work_sync(&srq->db_work);
	err = vt3_cmd_handle(dev, VT3_CMD_DESTROY_SRQ, srq->srqn);
	forgot = vt3_forgot(err);
	if (!forgot)
		ibdev_dbg(ibsrq->device, "DESTROY_SRQ %u: %d\n", srq->srqn, err);
	vt3_queue_mem_release(dev, &srq->status, forgot);
	vt3_queue_mem_release(dev, &srq->ring, forgot);
	kfree(srq->slots);
	srq->slots = NULL;
	return 0;
}

/*
 * IB_SRQ_MAX_WR (resize; docs/architecture.md §3.4): a new ring
 * of the next power of two, never a smaller one (a request the ring
 * already holds succeeds and changes nothing); fewer than the WRs posted
 * and not completed is EINVAL (for a user SRQ vt3.ko knows only those
 * not taken: libvt3 checks the rest). The WQEs of [prod - depth, prod)
 * are copied to the new ring at their index before vt3d switches; the
 * old ring is freed once vt3d answered. A user SRQ learns the new ring's
 * mmap key through the address in its request (vt3-abi.h).
 */
static int vt3_srq_resize(struct vt3_srq *srq, u32 depth, u64 resp_addr,
			  struct ib_udata *udata)
{
	struct vt3_dev *dev = to_vt3_dev(srq->ibsrq.device);
	struct vt3_ucontext *uctx = rdma_udata_to_drv_context(udata,
				struct vt3_ucontext, ibuc);
	struct vt3_srq_status *st = vt3_srq_status(srq);
	struct vt3_cmd_resize_srq req = {};
	struct vt3_resize_srq_resp uresp = {};
	struct vt3_srq_slot *slots = NULL, *old_slots;
	struct vt3_queue_mem ring = {}, old_ring;
	unsigned long flags;
	u32 i, idx, prod;
	int err;

	if (srq->user && !resp_addr)
		return -EINVAL;
	err = vt3_queue_mem_alloc(dev, uctx ? &uctx->ibuc : NULL, &ring,
				  (size_t)depth * VT3_WQE_SIZE, true,
				  &uresp.ring_key);
	if (err)
		return err;
	if (ring.mem->pbl_len > dev->lim.max_pbl_pages) {
		err = -EINVAL;
		goto err_ring;
	}
	if (srq->user) {
		uresp.depth = depth;
		uresp.ring_size = ring.mem->npages << PAGE_SHIFT;
		if (copy_to_user(u64_to_user_ptr(resp_addr), &uresp,
				 sizeof(uresp))) {
			err = -EFAULT;
			goto err_ring;
		}
	} else {
		slots = kcalloc(depth, sizeof(*slots), GFP_KERNEL);
		if (!slots) {
			err = -ENOMEM;
			goto err_ring;
		}
	}

	/*
	 * Every WQE vt3d may still read is in [prod - depth, prod): at its
	 * index in the new ring. A user SRQ's provider posts nothing now
	 * (its lock); kernel posts from here on go to both rings.
	 */
	spin_lock_irqsave(&srq->lock, flags);
	prod = srq->user ? le32_to_cpu(READ_ONCE(st->prod)) : srq->prod;
	for (i = 0; i < srq->depth; i++) {
		idx = prod - srq->depth + i;
		memcpy(vt3_pages_slot(ring.mem, (size_t)(idx & (depth - 1)) *
					       VT3_WQE_SIZE),
		       vt3_pages_slot(srq->ring.mem,
				      (size_t)(idx & (srq->depth - 1)) *
					      VT3_WQE_SIZE),
		       VT3_WQE_SIZE);
		if (slots && srq->slots[idx & (srq->depth - 1)].idx == idx)
			slots[idx & (depth - 1)] =
				srq->slots[idx & (srq->depth - 1)];
	}
	if (slots) {
		srq->next_ring = ring.mem;
		srq->next_slots = slots;
		srq->next_depth = depth;
	}
	spin_unlock_irqrestore(&srq->lock, flags);

	req.ring_pbl_addr = cpu_to_le64(virt_to_phys(ring.mem->pbl));
	req.ring_npages = cpu_to_le32(ring.mem->pbl_len);
	req.depth = cpu_to_le32(depth);
	req.srqn = cpu_to_le32(srq->srqn);
	err = vt3_cmd(dev, VT3_CMD_RESIZE_SRQ, &req, sizeof(req), NULL, 0);

	spin_lock_irqsave(&srq->lock, flags);
	srq->next_ring = NULL;
	srq->next_slots = NULL;
	if (!err) {
		old_ring = srq->ring;
		srq->ring = ring;
		ring = old_ring;
		old_slots = srq->slots;
		srq->slots = slots;
		slots = old_slots;
		WRITE_ONCE(srq->depth, depth);
	}
	spin_unlock_irqrestore(&srq->lock, flags);
	/* vt3d answered: it reads nothing of the ring that lost any more. */
	vt3_queue_mem_release(dev, &ring, !err || vt3_refused(err));
	kfree(slots);
	return err;

err_ring:
	kfree(slots);
	vt3_queue_mem_release(dev, &ring, true);
	return err;
}

/*
 * IB_SRQ_LIMIT sets the limit and arms it (0 disarms: a limit of 0 never
 * fires); IB_SRQ_MAX_WR resizes (above), before the limit is checked
 * against the new depth.
 */
int vt3_modify_srq(struct ib_srq *ibsrq, struct ib_srq_attr *attr,
		   enum ib_srq_attr_mask mask, struct ib_udata *udata)
{
	struct vt3_dev *dev = to_vt3_dev(ibsrq->device);
	struct vt3_srq *srq = to_vt3_srq(ibsrq);
	struct vt3_cmd_modify_srq req = { .srqn = cpu_to_le32(srq->srqn) };
	struct vt3_modify_srq_req ureq = {};
	u32 depth, outstanding;
	unsigned long flags;
	int err;

	if (udata && udata->inlen) {
		if (udata->inlen < sizeof(ureq) ||
		    !ib_is_udata_cleared(udata, sizeof(ureq),
					 udata->inlen - sizeof(ureq)))
			return -EINVAL;
		if (ib_copy_from_udata(&ureq, udata, sizeof(ureq)))
			return -EFAULT;
	}
	if (mask & ~(IB_SRQ_LIMIT | IB_SRQ_MAX_WR))
		return -EOPNOTSUPP;
	if (!(mask & IB_SRQ_MAX_WR) && ureq.resize_resp)
		return -EINVAL;

	mutex_lock(&srq->modify_lock);
	depth = srq->depth;
	if (mask & IB_SRQ_MAX_WR) {
		err = -EINVAL;
		if (attr->max_wr < 1 || attr->max_wr > dev->lim.max_srq_wr)
			goto out;
		spin_lock_irqsave(&srq->lock, flags);
		outstanding = srq->user ?
			le32_to_cpu(READ_ONCE(vt3_srq_status(srq)->prod)) -
			le32_to_cpu(READ_ONCE(vt3_srq_status(srq)->cons)) :
			srq->owed;
		spin_unlock_irqrestore(&srq->lock, flags);
		if (attr->max_wr < outstanding)
			goto out;
		depth = max_t(u32, roundup_pow_of_two(attr->max_wr),
			      srq->depth);
		if (depth > dev->lim.max_srq_depth)
			goto out;
	}
	if ((mask & IB_SRQ_LIMIT) && attr->srq_limit > depth) {
		err = -EINVAL;
		goto out;
	}
	if (depth != srq->depth) {
		err = vt3_srq_resize(srq, depth, ureq.resize_resp, udata);
		if (err)
			goto out;
	}
	err = 0;
	if (!(mask & IB_SRQ_LIMIT))
		goto out;
	req.mask = cpu_to_le32(VT3_SRQ_MODIFY_LIMIT |
			       (attr->srq_limit ? VT3_SRQ_MODIFY_ARM : 0));
	req.limit = cpu_to_le32(attr->srq_limit);
	err = vt3_cmd(dev, VT3_CMD_MODIFY_SRQ, &req, sizeof(req), NULL, 0);
	if (!err)
		WRITE_ONCE(srq->limit, attr->srq_limit);
out:
	mutex_unlock(&srq->modify_lock);
	return err;
}

int vt3_query_srq(struct ib_srq *ibsrq, struct ib_srq_attr *attr)
{
	struct vt3_dev *dev = to_vt3_dev(ibsrq->device);
	struct vt3_srq *srq = to_vt3_srq(ibsrq);
	struct vt3_cmd_handle req = { .handle = cpu_to_le32(srq->srqn) };
	struct vt3_srq_attr resp;
	int err;

	err = vt3_cmd(dev, VT3_CMD_QUERY_SRQ, &req, sizeof(req), &resp,
		      sizeof(resp));
	if (err)
		return err;
	memset(attr, 0, sizeof(*attr));
	attr->max_wr = srq->depth;
	attr->max_sge = srq->max_sge;
	/*
	 * The verbs' limit is that of an armed SRQ: 0 once the event fired
	 * (as rxe reports it), until modify_srq arms it again.
	 */
	attr->srq_limit = le32_to_cpu(resp.armed) ?
			  min_t(u32, le32_to_cpu(resp.limit), srq->depth) : 0;
	return 0;
}

/*
 * Kernel SRQs: receive WRs into the ring; a slot is free once the CQE of
 * the WQE in it was taken. A user SRQ's provider writes its WQEs itself:
 * a post without WRs is its doorbell.
 */
int vt3_post_srq_recv(struct ib_srq *ibsrq, const struct ib_recv_wr *wr,
		      const struct ib_recv_wr **bad_wr)
{
	struct vt3_srq *srq = to_vt3_srq(ibsrq);
	struct vt3_srq_status *st = vt3_srq_status(srq);
	struct vt3_qp *flusher;
	struct vt3_srq_slot *slot;
	unsigned long flags;
	bool posted;
	u32 start;
	int err = 0;

	if (srq->user) {
		if (wr) {
			*bad_wr = wr;
			return -EINVAL;
		}
		vt3_srq_doorbell(srq);
		return 0;
	}

	spin_lock_irqsave(&srq->lock, flags);
	start = srq->prod;
	for (; wr; wr = wr->next) {
		slot = &srq->slots[srq->prod & (srq->depth - 1)];
		if (slot->owed) {
			err = -ENOMEM;
			break;
		}
		if (wr->num_sge < 0 || wr->num_sge > srq->max_sge) {
			err = -EINVAL;
			break;
		}
		vt3_write_recv_wqe(srq->ring.mem, srq->prod & (srq->depth - 1), wr);
		slot->wr_id = wr->wr_id;
		slot->idx = srq->prod;
		slot->owed = true;
		/* A resize waits for vt3d: its ring gets the WQE too. */
		if (srq->next_slots) {
			vt3_write_recv_wqe(srq->next_ring,
					   srq->prod & (srq->next_depth - 1), wr);
			srq->next_slots[srq->prod & (srq->next_depth - 1)] = *slot;
		}
		srq->owed++;
		srq->prod++;
	}
	flusher = srq->flusher;
	posted = srq->prod != start;
	if (posted) {
		/* Release: the WQEs written before are visible with the index. */
		smp_store_release(&st->prod, cpu_to_le32(srq->prod));
		/* Store-load order: index store before the idle flag load. */
		smp_mb();
		if (!flusher && le32_to_cpu(READ_ONCE(st->flags)) &
				VT3_SRQ_F_IDLE)
			vt3_srq_doorbell(srq);
	}
	/*
	 * A lost device's SRQ: the flusher's CQ completes them (under the
	 * lock: vt3_srq_qp_gone() clears the flusher under it).
	 */
	if (flusher && posted)
		vt3_cq_kick_later(to_vt3_cq(flusher->ibqp.recv_cq));
	spin_unlock_irqrestore(&srq->lock, flags);
	if (err)
		*bad_wr = wr;
	return err;
}

/*
 * A CQE of an SRQ WQE taken from @cq (its lock held): completes the slot
 * it names, once, and frees it; *@wr_id is the WR's. False: not to be
 * delivered (the slot owes nothing: a lost device's flush completed it,
 * or the device named a WQE that is not there).
 */
bool vt3_srq_cqe_taken(struct vt3_qp *qp, struct vt3_cq *cq, u32 wqe_idx,
		       u64 *wr_id)
{
	struct vt3_srq *srq = qp->ibqp.srq ? to_vt3_srq(qp->ibqp.srq) : NULL;
	struct vt3_srq_slot *slot;
	bool owed;

	lockdep_assert_held(&cq->lock);
	if (!srq || srq->user || qp->ibqp.recv_cq != &cq->ibcq) {
		ibdev_warn_ratelimited(qp->ibqp.device,
				       "CQ %u: an SRQ CQE of QP %u, which has no kernel SRQ receiving here\n",
				       cq->cqn, qp->qpn);
		return false;
	}
	spin_lock(&srq->lock);
	slot = &srq->slots[wqe_idx & (srq->depth - 1)];
	owed = slot->owed && slot->idx == wqe_idx;
	if (owed) {
		*wr_id = slot->wr_id;
		vt3_srq_slot_done(srq, slot);
	}
	spin_unlock(&srq->lock);
	if (!owed && !srq->flusher)
		ibdev_warn_ratelimited(qp->ibqp.device,
				       "SRQ %u: CQE for WQE %u, which owes no completion\n",
				       srq->srqn, wqe_idx);
	return owed;
}

/*
 * Whether @qp's receive CQ flushes its SRQ (the device is lost): the
 * first QP to ask claims it. srq->lock held.
 */
static bool vt3_srq_flushes_here(struct vt3_srq *srq, struct vt3_qp *qp)
{
	if (!srq->flusher) {
		srq->flusher = qp;
		/* The oldest slot that can owe anything. */
		srq->flush_pos = srq->prod - srq->depth;
	}
	return srq->flusher == qp;
}

/*
 * A lost device's flush of @qp's SRQ, from its receive CQ (its lock held)
 * once that CQ's consumer passed the QP's flush mark: up to @num owed
 * slots, in SRQ order, complete with IB_WC_WR_FLUSH_ERR.
 */
int vt3_srq_flush(struct vt3_qp *qp, int num, struct ib_wc *wc)
{
	struct vt3_srq *srq = to_vt3_srq(qp->ibqp.srq);
	struct vt3_srq_slot *slot;
	int n = 0;

	if (srq->user)
		return 0;
	spin_lock(&srq->lock);
	if (vt3_srq_flushes_here(srq, qp)) {
		while (n < num && srq->flush_pos != srq->prod) {
			slot = &srq->slots[srq->flush_pos & (srq->depth - 1)];
			if (slot->owed && slot->idx == srq->flush_pos) {
				memset(&wc[n], 0, sizeof(wc[n]));
				wc[n].wr_id = slot->wr_id;
				wc[n].status = IB_WC_WR_FLUSH_ERR;
				wc[n].opcode = IB_WC_RECV;
				wc[n].qp = &qp->ibqp;
				n++;
				vt3_srq_slot_done(srq, slot);
			}
			srq->flush_pos++;
		}
	}
	spin_unlock(&srq->lock);
	return n;
}

/* Whether vt3_srq_flush() would return anything for @qp. */
bool vt3_srq_flush_pending(struct vt3_qp *qp)
{
	struct vt3_srq *srq = to_vt3_srq(qp->ibqp.srq);
	bool pending;

	if (srq->user)
		return false;
	spin_lock(&srq->lock);
	pending = srq->owed && (!srq->flusher || srq->flusher == qp);
	spin_unlock(&srq->lock);
	return pending;
}

/*
 * @qp is being destroyed (its receive CQ's lock held): should it have
 * been flushing its SRQ, the next QP to flush takes over from where it
 * stopped.
 */
void vt3_srq_qp_gone(struct vt3_qp *qp)
{
	struct vt3_srq *srq;

	if (!qp->ibqp.srq)
		return;
	srq = to_vt3_srq(qp->ibqp.srq);
	if (srq->user)
		return;
	spin_lock(&srq->lock);
	if (srq->flusher == qp)
		srq->flusher = NULL;
	spin_unlock(&srq->lock);
}

/* VT3_EV_SRQ_LIMIT / VT3_EV_SRQ_ERROR from vt3d (process context). */
void vt3_srq_event(struct vt3_dev *dev, u16 type, const struct vt3_event *ev)
{
	struct ib_event ibev = { .device = &dev->ibdev };
	struct vt3_srq *srq;

	ibev.event = type == VT3_EV_SRQ_LIMIT ? IB_EVENT_SRQ_LIMIT_REACHED :
						IB_EVENT_SRQ_ERR;
	/* destroy_srq() erases under this lock before it tells vt3d. */
	xa_lock_irq(&dev->srq_xa);
	srq = xa_load(&dev->srq_xa, le32_to_cpu(ev->handle));
	if (srq) {
		if (type == VT3_EV_SRQ_ERROR)
			ibdev_warn_ratelimited(&dev->ibdev,
					       "SRQ %u: vt3d found its ring broken\n",
					       srq->srqn);
		ibev.element.srq = &srq->ibsrq;
		if (srq->ibsrq.event_handler)
			srq->ibsrq.event_handler(&ibev, srq->ibsrq.srq_context);
	}
	xa_unlock_irq(&dev->srq_xa);
	if (!srq)
		ibdev_dbg(&dev->ibdev, "event %u for no SRQ %u\n", type,
			  le32_to_cpu(ev->handle));
}
