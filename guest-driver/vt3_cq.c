// SPDX-License-Identifier: GPL-2.0
/*
 * vt3 completion queues: the kernel allocates the CQE ring and the status
 * page and hands them to vt3d, which produces CQEs; the consumer is the
 * provider (user CQs, through mmap) or this driver (kernel CQs).
 */
#include <linux/log2.h>
#include <rdma/uverbs_ioctl.h>

#include "vt3.h"

static struct vt3_cq_status *vt3_cq_status(struct vt3_cq *cq)
{
	return vt3_pages_slot(cq->status.mem, 0);
}

void vt3_cq_set_error(struct vt3_cq *cq)
{
	/* OR of little-endian bit masks is endian-neutral. */
	atomic_or((__force int)cpu_to_le32(VT3_CQ_F_ERROR),
		  (atomic_t *)&vt3_cq_status(cq)->flags);
}

/*
 * Runs the completion handler; the core wants one call at a time per CQ.
 * A kernel CQ of IB_POLL_DIRECT is polled by its owner only (its handler
 * warns on any call).
 */
static void vt3_cq_notify(struct vt3_cq *cq)
{
	unsigned long flags;

	if (!cq->user && cq->ibcq.poll_ctx == IB_POLL_DIRECT)
		return;
	spin_lock_irqsave(&cq->comp_lock, flags);
	if (cq->ibcq.comp_handler)
		cq->ibcq.comp_handler(&cq->ibcq, cq->ibcq.cq_context);
	spin_unlock_irqrestore(&cq->comp_lock, flags);
}

/*
 * A completion event the driver raises itself (a QP went to error, flush
 * work is waiting), delivered as vt3d delivers one: only to a CQ its
 * consumer armed, which it disarms. A consumer that did not arm polls
 * anyway (and sees the error flag or the flush completions then).
 */
void vt3_cq_kick(struct vt3_cq *cq)
{
	if (atomic_xchg(&cq->armed, 0))
		vt3_cq_notify(cq);
}

static void vt3_cq_kick_work(struct work_struct *work)
{
	vt3_cq_kick(container_of(work, struct vt3_cq, kick_work));
}

/*
 * From a post on a QP in error (any context, maybe inside the consumer's
 * own completion handler): the event goes out from a worker.
 */
void vt3_cq_kick_later(struct vt3_cq *cq)
{
	/* The WQE published before the load; pairs with the arm's xchg. */
	smp_mb();
	if (atomic_read(&cq->armed))
		queue_work(system_highpri_wq, &cq->kick_work);
}

/*
 * The device is gone: whatever it might still write into a CQ's ring is
 * ignored from now on (the driver and the provider flush those QPs'
 * work). A user CQ's consumer learns it from the status page
 * (VT3_CQ_F_FROZEN, frozen_prod); a kernel CQ's from cq->frozen.
 */
void vt3_cq_freeze(struct vt3_cq *cq)
{
	struct vt3_cq_status *st = vt3_cq_status(cq);
	unsigned long flags;

	if (cq->user) {
		if (le32_to_cpu(READ_ONCE(st->flags)) & VT3_CQ_F_FROZEN)
			return;
		WRITE_ONCE(st->frozen_prod, READ_ONCE(st->prod));
		/* The snapshot before the flag: pairs with the consumer's acquire. */
		smp_wmb();
		atomic_or((__force int)cpu_to_le32(VT3_CQ_F_FROZEN), (atomic_t *)&st->flags);
		return;
	}
	spin_lock_irqsave(&cq->lock, flags);
	if (!cq->frozen) {
		/* Pairs with vt3d's release store of prod after writing the CQE. */
		cq->frozen_prod = le32_to_cpu(smp_load_acquire(&vt3_cq_status(cq)->prod));
		cq->frozen = true;
	}
	spin_unlock_irqrestore(&cq->lock, flags);
}

void vt3_cq_freeze_all(struct vt3_dev *dev)
{
	unsigned long cqn;
	struct vt3_cq *cq;

	/* destroy_cq() erases, then waits for RCU readers. */
	rcu_read_lock();
	xa_for_each(&dev->cq_xa, cqn, cq)
		vt3_cq_freeze(cq);
	rcu_read_unlock();
}

static void vt3_cq_arm_work(struct work_struct *work)
{
	struct vt3_cq *cq = container_of(work, struct vt3_cq, arm_work);
	struct vt3_cmd_arm_cq req = { .cqn = cpu_to_le32(cq->cqn) };
	u32 flags = atomic_xchg(&cq->arm_flags, 0);

	if (!flags)
		return;
	/* NEXT includes solicited completions. */
	req.flags = cpu_to_le32(flags & VT3_ARM_NEXT ? VT3_ARM_NEXT : flags);
	vt3_post(to_vt3_dev(cq->ibcq.device), VT3_CMD_ARM_CQ, &req,
		 sizeof(req));
}

int vt3_create_cq(struct ib_cq *ibcq, const struct ib_cq_init_attr *attr,
		  struct vt3_create_cq_attrs *attrs)
{
	struct ib_udata *udata = VT3_CREATE_CQ_UDATA(attrs);
	struct vt3_dev *dev = to_vt3_dev(ibcq->device);
	struct vt3_ucontext *uctx = rdma_udata_to_drv_context(udata,
				struct vt3_ucontext, ibuc);
	struct vt3_cq *cq = to_vt3_cq(ibcq);
	struct vt3_create_cq_resp uresp = {};
	struct vt3_cmd_create_cq req = {};
	struct vt3_resp_handle resp;
	bool forgot;
	int err;

	if (attr->flags || attr->comp_vector >= ibcq->device->num_comp_vectors)
		return -EOPNOTSUPP;
	if (attr->cqe < 1 || attr->cqe > dev->lim.max_cqe)
		return -EINVAL;
	if (udata && (!vt3_udata_in_ok(udata) ||
		      udata->outlen < sizeof(uresp)))
		return -EINVAL;

	/* A power of two, with room for one more CQE than asked for. */
	cq->depth = roundup_pow_of_two(attr->cqe + 1);
	if (cq->depth > dev->lim.max_cq_depth)
		return -EINVAL;
	cq->user = !!udata;
	spin_lock_init(&cq->lock);
	spin_lock_init(&cq->comp_lock);
	INIT_WORK(&cq->arm_work, vt3_cq_arm_work);
	INIT_WORK(&cq->kick_work, vt3_cq_kick_work);
	INIT_LIST_HEAD(&cq->flush_sq);
	INIT_LIST_HEAD(&cq->flush_rq);
	INIT_LIST_HEAD(&cq->gone);
	atomic_set(&cq->armed, 0);

	err = vt3_queue_mem_alloc(dev, uctx ? &uctx->ibuc : NULL, &cq->ring,
				  (size_t)cq->depth * sizeof(struct vt3_cqe),
				  true, &uresp.ring_key);
	if (err)
		return err;
	err = vt3_queue_mem_alloc(dev, uctx ? &uctx->ibuc : NULL, &cq->status,
				  sizeof(struct vt3_cq_status), false,
				  &uresp.status_key);
	if (err)
		goto err_ring;
	if (cq->ring.mem->pbl_len > dev->lim.max_pbl_pages) {
		err = -EINVAL;
		goto err_status;
	}

	req.ring_pbl_addr = cpu_to_le64(virt_to_phys(cq->ring.mem->pbl));
	req.status_addr = cpu_to_le64(page_to_phys(cq->status.mem->pages[0]));
	req.ring_npages = cpu_to_le32(cq->ring.mem->pbl_len);
	req.depth = cpu_to_le32(cq->depth);
	err = vt3_cmd(dev, VT3_CMD_CREATE_CQ, &req, sizeof(req), &resp,
		      sizeof(resp));
	if (err)
		goto err_status;
	cq->cqn = le32_to_cpu(resp.handle);
	/* Fails for a cqn vt3d handed out twice. */
	err = xa_insert(&dev->cq_xa, cq->cqn, cq, GFP_KERNEL);
	if (err) {
		ibdev_err(&dev->ibdev, "CREATE_CQ returned cqn %u in use\n",
			  cq->cqn);
		goto err_destroy;
	}

	if (udata) {
		uresp.cqn = cq->cqn;
		uresp.depth = cq->depth;
		uresp.ring_size = cq->ring.mem->npages << PAGE_SHIFT;
		err = ib_copy_to_udata(udata, &uresp, sizeof(uresp));
		if (err)
			goto err_xa;
	}
	ibcq->cqe = cq->depth - 1;
	return 0;

err_xa:
	xa_erase(&dev->cq_xa, cq->cqn);
	synchronize_rcu();
err_destroy:
	forgot = vt3_forgot(vt3_cmd_handle(dev, VT3_CMD_DESTROY_CQ, cq->cqn));
	vt3_queue_mem_release(dev, &cq->status, forgot);
	vt3_queue_mem_release(dev, &cq->ring, forgot);
	return err;
err_status:
	vt3_queue_mem_release(dev, &cq->status, vt3_refused(err));
err_ring:
	vt3_queue_mem_release(dev, &cq->ring, vt3_refused(err));
	return err;
}

int vt3_destroy_cq(struct ib_cq *ibcq, struct ib_udata *udata)
{
	struct vt3_dev *dev = to_vt3_dev(ibcq->device);
	struct vt3_cq *cq = to_vt3_cq(ibcq);
	bool forgot;
	int err;

	xa_erase(&dev->cq_xa, cq->cqn);
	/* Event handlers run under RCU (softirq): none sees cq after this. */
	synchronize_rcu();
	cancel_work_sync(&cq->arm_work);
	cancel_work_sync(&cq->kick_work);
	vt3_cq_free_gone(cq);

	err = vt3_cmd_handle(dev, VT3_CMD_DESTROY_CQ, cq->cqn);
	forgot = vt3_forgot(err);
	if (!forgot)
		ibdev_dbg(ibcq->device, "DESTROY_CQ %u: %d\n", cq->cqn, err);
	vt3_queue_mem_release(dev, &cq->status, forgot);
	vt3_queue_mem_release(dev, &cq->ring, forgot);
	return 0;
}

static enum ib_wc_status vt3_wc_status(u8 status)
{
	static const enum ib_wc_status map[] = {
		[VT3_WC_SUCCESS] = IB_WC_SUCCESS,
		[VT3_WC_LOC_LEN_ERR] = IB_WC_LOC_LEN_ERR,
		[VT3_WC_LOC_QP_OP_ERR] = IB_WC_LOC_QP_OP_ERR,
		[VT3_WC_LOC_PROT_ERR] = IB_WC_LOC_PROT_ERR,
		[VT3_WC_WR_FLUSH_ERR] = IB_WC_WR_FLUSH_ERR,
		[VT3_WC_REM_ACCESS_ERR] = IB_WC_REM_ACCESS_ERR,
		[VT3_WC_REM_OP_ERR] = IB_WC_REM_OP_ERR,
		[VT3_WC_GENERAL_ERR] = IB_WC_GENERAL_ERR,
		[VT3_WC_BAD_RESP_ERR] = IB_WC_BAD_RESP_ERR,
		[VT3_WC_REM_INV_REQ_ERR] = IB_WC_REM_INV_REQ_ERR,
	};

	return status < ARRAY_SIZE(map) ? map[status] : IB_WC_GENERAL_ERR;
}

struct vt3_gone {
	struct list_head node;		/* vt3_cq.gone */
	u32 qpn;
	u32 mark;			/* the CQ's producer index at the destroy */
};

u32 vt3_cq_prod(struct vt3_cq *cq)
{
	return cq->frozen ? cq->frozen_prod :
			    /* Pairs with vt3d's release store of prod after writing the CQE. */
			    le32_to_cpu(smp_load_acquire(&vt3_cq_status(cq)->prod));
}

/*
 * Kernel CQs: the QP @qpn was destroyed (vt3d writes no more CQEs for
 * it), and none of its completions is delivered from now on. cq->lock
 * held; atomic context.
 */
void vt3_cq_forget(struct vt3_cq *cq, u32 qpn)
{
	struct vt3_gone *g;
	u32 prod = vt3_cq_prod(cq);

	lockdep_assert_held(&cq->lock);
	if (prod == cq->cons)
		return;
	g = kmalloc(sizeof(*g), GFP_ATOMIC);
	if (!g) {
		ibdev_warn(cq->ibcq.device,
			   "CQ %u: no memory to skip QP %u's CQEs\n", cq->cqn, qpn);
		return;
	}
	g->qpn = qpn;
	g->mark = prod;
	list_add_tail(&g->node, &cq->gone);
}

void vt3_cq_free_gone(struct vt3_cq *cq)
{
	struct vt3_gone *g, *tmp;

	list_for_each_entry_safe(g, tmp, &cq->gone, node)
		kfree(g);
	INIT_LIST_HEAD(&cq->gone);
}

/* Whether the CQE at cq->cons is a destroyed QP's; drops passed marks. */
static bool vt3_cqe_of_gone_qp(struct vt3_cq *cq, u32 qpn)
{
	struct vt3_gone *g, *tmp;
	bool gone = false;

	list_for_each_entry_safe(g, tmp, &cq->gone, node) {
		if ((s32)(cq->cons - g->mark) >= 0) {
			list_del(&g->node);
			kfree(g);
		} else if (g->qpn == qpn) {
			gone = true;
		}
	}
	return gone;
}

/* Translates one CQE (already copied out of the ring); false: skip it. */
static bool vt3_cqe_to_wc(struct vt3_dev *dev, struct vt3_cq *cq,
			  const struct vt3_cqe *cqe, struct ib_wc *wc)
{
	static const enum ib_wc_opcode opcodes[] = {
		[VT3_WC_SEND] = IB_WC_SEND,
		[VT3_WC_WRITE] = IB_WC_RDMA_WRITE,
		[VT3_WC_READ] = IB_WC_RDMA_READ,
		[VT3_WC_RECV] = IB_WC_RECV,
		[VT3_WC_REG_MR] = IB_WC_REG_MR,
		[VT3_WC_LOCAL_INV] = IB_WC_LOCAL_INV,
	};
	bool recv = cqe->opcode == VT3_WC_RECV;
	u64 wr_id = le64_to_cpu(cqe->wr_id);
	struct vt3_qp *qp;

	/* A CQE of a QP destroyed meanwhile has nobody to go to. */
	qp = xa_load(&dev->qp_xa, le32_to_cpu(cqe->qpn));
	if (!qp)
		return false;
	/*
	 * A receive of a QP of an SRQ names its SRQ slot, whose record
	 * holds the WR (vt3_srq.c); any other receive of such a QP is a
	 * device bug.
	 */
	if (recv && (qp->ibqp.srq || cqe->flags & VT3_CQE_SRQ)) {
		if (!(cqe->flags & VT3_CQE_SRQ) || qp->user ||
		    !vt3_srq_cqe_taken(qp, cq, le32_to_cpu(cqe->wqe_idx),
				       &wr_id))
			return false;
	} else if (!vt3_qp_cqe_taken(qp, cq, recv,
				     le32_to_cpu(cqe->wqe_idx))) {
		return false;
	}

	memset(wc, 0, sizeof(*wc));
	wc->wr_id = wr_id;
	wc->status = vt3_wc_status(cqe->status);
	wc->qp = &qp->ibqp;
	wc->vendor_err = le32_to_cpu(cqe->vendor_err);
	if (cqe->opcode < ARRAY_SIZE(opcodes)) {
		wc->opcode = opcodes[cqe->opcode];
	} else {
		wc->opcode = IB_WC_SEND;
		if (wc->status == IB_WC_SUCCESS)
			wc->status = IB_WC_GENERAL_ERR;
	}
	wc->byte_len = le32_to_cpu(cqe->byte_len);
	if (cqe->flags & VT3_CQE_INVALIDATED) {
		wc->wc_flags |= IB_WC_WITH_INVALIDATE;
		wc->ex.invalidate_rkey = le32_to_cpu(cqe->invalidated_stag);
	}
	return true;
}

/* Kernel CQs only: user CQs are polled by the provider. */
int vt3_poll_cq(struct ib_cq *ibcq, int num, struct ib_wc *wc)
{
	struct vt3_dev *dev = to_vt3_dev(ibcq->device);
	struct vt3_cq *cq = to_vt3_cq(ibcq);
	struct vt3_cq_status *st;
	unsigned long flags;
	struct vt3_cqe cqe;
	int n = 0;
	u32 prod;

	if (cq->user)
		return -EINVAL;
	st = vt3_cq_status(cq);
	spin_lock_irqsave(&cq->lock, flags);
	prod = cq->frozen ? cq->frozen_prod :
			    /* Pairs with vt3d's release store of prod after writing the CQE. */
			    le32_to_cpu(smp_load_acquire(&st->prod));
	if (prod - cq->cons > cq->depth) {
		spin_unlock_irqrestore(&cq->lock, flags);
		ibdev_err_ratelimited(ibcq->device,
				      "CQ %u: producer %u is past consumer %u + depth %u\n",
				      cq->cqn, prod, cq->cons, cq->depth);
		return -EIO;
	}
	/*
	 * Due flush completions first (every device CQE of their queue was
	 * returned): a CQ other QPs keep busy cannot starve ib_drain_qp.
	 */
	n = vt3_qp_poll_flush(cq, num, wc);
	rcu_read_lock();
	while (n < num && cq->cons != prod) {
		memcpy(&cqe, vt3_pages_slot(cq->ring.mem,
					    (cq->cons & (cq->depth - 1)) *
					    sizeof(cqe)),
		       sizeof(cqe));
		if ((list_empty(&cq->gone) ||
		     !vt3_cqe_of_gone_qp(cq, le32_to_cpu(cqe.qpn))) &&
		    vt3_cqe_to_wc(dev, cq, &cqe, &wc[n]))
			n++;
		cq->cons++;
	}
	rcu_read_unlock();
	/* The slots read may be reused by vt3d from now on. */
	smp_store_release(&st->cons, cpu_to_le32(cq->cons));
	spin_unlock_irqrestore(&cq->lock, flags);
	return n;
}

/*
 * Arming is asynchronous (it may be called in atomic context): vt3d must
 * raise the event at once when it processes the arm while CQEs are
 * pending (prod != status.cons), or a completion between our check and
 * its arm would be lost.
 */
int vt3_req_notify_cq(struct ib_cq *ibcq, enum ib_cq_notify_flags flags)
{
	struct vt3_cq *cq = to_vt3_cq(ibcq);
	struct vt3_cmd_arm_cq req = { .cqn = cpu_to_le32(cq->cqn) };
	u32 arm = (flags & IB_CQ_SOLICITED_MASK) == IB_CQ_SOLICITED ?
		  VT3_ARM_SOLICITED : VT3_ARM_NEXT;
	unsigned long irqflags;
	bool missed;
	int err = 0;
	u32 prod;

	/* Before the command: an event racing with it must find it armed. */
	atomic_xchg(&cq->armed, 1);
	if (irqs_disabled()) {
		/* dev_queue_xmit() needs IRQs on: send from a worker. */
		atomic_or(arm, &cq->arm_flags);
		queue_work(system_highpri_wq, &cq->arm_work);
	} else {
		req.flags = cpu_to_le32(arm);
		err = vt3_post(to_vt3_dev(ibcq->device), VT3_CMD_ARM_CQ, &req,
			       sizeof(req));
	}
	/* A lost device raises no event: only flush work is left, below. */
	if (err && !cq->user && READ_ONCE(cq->frozen))
		err = 0;
	if (err)
		return err;
	if (!(flags & IB_CQ_REPORT_MISSED_EVENTS) || cq->user)
		return 0;
	spin_lock_irqsave(&cq->lock, irqflags);
	prod = cq->frozen ? cq->frozen_prod :
			    /* Acquire: pairs with vt3d's release store of prod. */
			    le32_to_cpu(smp_load_acquire(&vt3_cq_status(cq)->prod));
	/* Flush completions raise no device event: report them here. */
	missed = prod != cq->cons || vt3_qp_flush_pending(cq);
	spin_unlock_irqrestore(&cq->lock, irqflags);
	return missed;
}

/* VT3_EV_CQ_COMPLETION / VT3_EV_CQ_ERROR from vt3d (softirq). */
void vt3_cq_event(struct vt3_dev *dev, u16 type, const struct vt3_event *ev)
{
	struct ib_event ibev;
	struct vt3_cq *cq;

	rcu_read_lock();
	cq = xa_load(&dev->cq_xa, le32_to_cpu(ev->handle));
	if (!cq)
		goto out;
	if (type == VT3_EV_CQ_COMPLETION) {
		/*
		 * vt3d disarmed the CQ, but this event may answer an arm
		 * older than the consumer's last: clearing 'armed' here could
		 * swallow the driver's next kick (an error, flush work). A
		 * kick on a CQ armed only in our books costs one spurious
		 * completion event at worst, which consumers tolerate.
		 */
		vt3_cq_notify(cq);
	} else {
		ibdev_warn_ratelimited(&dev->ibdev, "CQ %u overflowed\n",
				       cq->cqn);
		if (cq->ibcq.event_handler) {
			ibev.device = &dev->ibdev;
			ibev.element.cq = &cq->ibcq;
			ibev.event = IB_EVENT_CQ_ERR;
			cq->ibcq.event_handler(&ibev, cq->ibcq.cq_context);
		}
	}
out:
	rcu_read_unlock();
}
