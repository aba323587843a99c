// SPDX-License-Identifier: GPL-2.0
/*
 * vt3 queue pairs: the kernel allocates the SQ and RQ rings and the status
 * page and hands them to vt3d. The producer is the provider (user QPs,
 * through mmap; its doorbell is a zero-WR post) or this driver (kernel
 * QPs); vt3d consumes.
 *
 * IB states map on vt3d's iWARP states as: RESET/INIT/RTR -> IDLE,
 * RTS -> RTS, SQD -> CLOSING, SQE/ERR -> ERROR. A new QP is INIT, as an
 * RNIC's IDLE QP is reported (cxgb4 does so; rdma-core's tests expect it).
 * A QP reaches RTS through its connection (vt3_cm.c: vt3d moves it, the
 * driver follows on the event), or by an RTS after an RTR that named a
 * peer QP of this device (vt3_pair.c); vt3d refuses RTS without one of
 * them. A connected QP closes through
 * VT3_CMD_DISCONNECT: gracefully on RTS -> SQD (iw_cm_disconnect), with an
 * RST on any way to ERR or RESET.
 */
#include <linux/log2.h>
#include <rdma/uverbs_ioctl.h>

#include "vt3.h"

static const char * const vt3_ib_qp_state_names[] = {
	[IB_QPS_RESET] = "RESET",
	[IB_QPS_INIT] = "INIT",
	[IB_QPS_RTR] = "RTR",
	[IB_QPS_RTS] = "RTS",
	[IB_QPS_SQD] = "SQD",
	[IB_QPS_SQE] = "SQE",
	[IB_QPS_ERR] = "ERR",
};

static const char *vt3_ib_qp_state_name(enum ib_qp_state state)
{
	return state < ARRAY_SIZE(vt3_ib_qp_state_names) ?
	       vt3_ib_qp_state_names[state] : "?";
}

static enum vt3_qp_state vt3_state_from_ib(enum ib_qp_state state)
{
	switch (state) {
	case IB_QPS_RTS:
		return VT3_QPS_RTS;
	case IB_QPS_SQD:
		return VT3_QPS_CLOSING;
	case IB_QPS_SQE:
	case IB_QPS_ERR:
		return VT3_QPS_ERROR;
	default:
		return VT3_QPS_IDLE;
	}
}

/* @idle_as: what IDLE means, which only the driver knows. */
static enum ib_qp_state vt3_state_to_ib(u32 state, enum ib_qp_state idle_as)
{
	switch (state) {
	case VT3_QPS_IDLE:
		return idle_as;
	case VT3_QPS_RTS:
		return IB_QPS_RTS;
	case VT3_QPS_CLOSING:
		return IB_QPS_SQD;
	case VT3_QPS_TERMINATE:
		return IB_QPS_SQE;
	default:
		return IB_QPS_ERR;
	}
}

static void vt3_qp_release(struct kref *ref)
{
	complete(&container_of(ref, struct vt3_qp, ref)->freed);
}

void vt3_qp_put(struct vt3_qp *qp)
{
	kref_put(&qp->ref, vt3_qp_release);
}

/*
 * A referenced QP by number, for work that may race with destroy_qp():
 * that erases the QP under the same lock before dropping its own
 * reference, so a QP found here is never at zero.
 */
struct vt3_qp *vt3_qp_get(struct vt3_dev *dev, u32 qpn)
{
	struct vt3_qp *qp;

	xa_lock(&dev->qp_xa);
	qp = xa_load(&dev->qp_xa, qpn);
	if (qp)
		kref_get(&qp->ref);
	xa_unlock(&dev->qp_xa);
	return qp;
}

/* The referenced QP with the lowest number >= *qpn, which is updated. */
struct vt3_qp *vt3_qp_get_next(struct vt3_dev *dev, unsigned long *qpn)
{
	struct vt3_qp *qp;

	xa_lock(&dev->qp_xa);
	qp = xa_find(&dev->qp_xa, qpn, U32_MAX, XA_PRESENT);
	if (qp)
		kref_get(&qp->ref);
	xa_unlock(&dev->qp_xa);
	return qp;
}

static void vt3_qp_doorbell(struct vt3_qp *qp, u32 queues)
{
	struct vt3_cmd_doorbell req = {
		.qpn = cpu_to_le32(qp->qpn),
		.queues = cpu_to_le32(queues),
	};

	if (irqs_disabled()) {
		/* dev_queue_xmit() needs IRQs on: ring from a worker. */
		atomic_or(queues, &qp->db_pending);
		queue_work(system_highpri_wq, &qp->db_work);
		return;
	}
	vt3_post(to_vt3_dev(qp->ibqp.device), VT3_CMD_DOORBELL, &req,
		 sizeof(req));
}

static void vt3_qp_db_work(struct work_struct *work)
{
	struct vt3_qp *qp = container_of(work, struct vt3_qp, db_work);
	u32 queues = atomic_xchg(&qp->db_pending, 0);

	if (queues)
		vt3_qp_doorbell(qp, queues);
}

static int vt3_check_caps(struct vt3_dev *dev, struct ib_qp_init_attr *attr,
			  bool user)
{
	const struct ib_qp_cap *cap = &attr->cap;
	const struct vt3_limits *l = &dev->lim;

	if (attr->qp_type != IB_QPT_RC || attr->create_flags)
		return -EOPNOTSUPP;
	if (!attr->send_cq || !attr->recv_cq)
		return -EINVAL;
	/* A QP of an SRQ has no receive queue: its receive caps mean nothing. */
	if (cap->max_send_wr > l->max_qp_wr || cap->max_send_sge > l->max_sge ||
	    (!attr->srq && (cap->max_recv_wr > l->max_qp_wr ||
			    cap->max_recv_sge > l->max_sge)))
		return -EINVAL;
	/* Kernel and user objects do not mix (the core keeps them apart too). */
	if (attr->srq && to_vt3_srq(attr->srq)->user != user)
		return -EINVAL;
	/*
	 * Kernel QPs take no inline data: kernel SGEs carry DMA addresses,
	 * which the driver must not dereference.
	 */
	if (cap->max_inline_data > (user ? l->max_inline : 0))
		return -EINVAL;
	return 0;
}

int vt3_create_qp(struct ib_qp *ibqp, struct ib_qp_init_attr *attr,
		  struct ib_udata *udata)
{
	struct vt3_dev *dev = to_vt3_dev(ibqp->device);
	struct vt3_ucontext *uctx = rdma_udata_to_drv_context(udata,
				struct vt3_ucontext, ibuc);
	struct ib_ucontext *ibuc = uctx ? &uctx->ibuc : NULL;
	struct vt3_qp *qp = to_vt3_qp(ibqp);
	struct vt3_create_qp_resp uresp = {};
	struct vt3_cmd_create_qp req = {};
	struct vt3_resp_handle resp;
	bool forgot;
	int err;

	err = vt3_check_caps(dev, attr, !!udata);
	if (err)
		return err;
	if (udata && (!vt3_udata_in_ok(udata) ||
		      udata->outlen < sizeof(uresp)))
		return -EINVAL;

	kref_init(&qp->ref);
	init_completion(&qp->freed);
	mutex_init(&qp->state_lock);
	spin_lock_init(&qp->sq_lock);
	spin_lock_init(&qp->rq_lock);
	INIT_WORK(&qp->db_work, vt3_qp_db_work);
	INIT_LIST_HEAD(&qp->sq_flush_node);
	INIT_LIST_HEAD(&qp->rq_flush_node);
	vt3_cm_qp_init(qp);
	qp->ib_state = IB_QPS_INIT;
	qp->user = !!udata;
	qp->sig_all = attr->sq_sig_type == IB_SIGNAL_ALL_WR;
	/* vt3d takes rings of at least two entries. */
	qp->sq_depth = roundup_pow_of_two(max(attr->cap.max_send_wr, 2U));
	/* A QP of an SRQ takes its receive WQEs from there: no RQ ring. */
	qp->rq_depth = attr->srq ? 0 :
		       roundup_pow_of_two(max(attr->cap.max_recv_wr, 2U));
	if (qp->sq_depth > dev->lim.max_qp_depth ||
	    qp->rq_depth > dev->lim.max_qp_depth)
		return -EINVAL;
	qp->max_send_sge = attr->cap.max_send_sge;
	qp->max_recv_sge = attr->srq ? 0 : attr->cap.max_recv_sge;
	qp->max_inline = udata ? dev->lim.max_inline : 0;

	err = vt3_queue_mem_alloc(dev, ibuc, &qp->sq,
				  (size_t)qp->sq_depth * VT3_WQE_SIZE, true,
				  &uresp.sq_key);
	if (err)
		return err;
	if (qp->rq_depth) {
		err = vt3_queue_mem_alloc(dev, ibuc, &qp->rq,
					  (size_t)qp->rq_depth * VT3_WQE_SIZE,
					  true, &uresp.rq_key);
		if (err)
			goto err_sq;
	}
	err = vt3_queue_mem_alloc(dev, ibuc, &qp->status,
				  sizeof(struct vt3_qp_status), false,
				  &uresp.status_key);
	if (err)
		goto err_rq;
	if (qp->sq.mem->pbl_len > dev->lim.max_pbl_pages ||
	    (qp->rq.mem && qp->rq.mem->pbl_len > dev->lim.max_pbl_pages)) {
		err = -EINVAL;
		goto err_status;
	}

	req.sq_pbl_addr = cpu_to_le64(virt_to_phys(qp->sq.mem->pbl));
	if (qp->rq.mem) {
		req.rq_pbl_addr = cpu_to_le64(virt_to_phys(qp->rq.mem->pbl));
		req.rq_npages = cpu_to_le32(qp->rq.mem->pbl_len);
	} else {
		req.srqn = cpu_to_le32(to_vt3_srq(attr->srq)->srqn);
	}
	req.status_addr = cpu_to_le64(page_to_phys(qp->status.mem->pages[0]));
	req.sq_npages = cpu_to_le32(qp->sq.mem->pbl_len);
	req.sq_depth = cpu_to_le32(qp->sq_depth);
	req.rq_depth = cpu_to_le32(qp->rq_depth);
	req.pdn = cpu_to_le32(to_vt3_pd(ibqp->pd)->pdn);
	req.send_cqn = cpu_to_le32(to_vt3_cq(attr->send_cq)->cqn);
	req.recv_cqn = cpu_to_le32(to_vt3_cq(attr->recv_cq)->cqn);
	req.max_send_sge = cpu_to_le32(qp->max_send_sge);
	req.max_recv_sge = cpu_to_le32(qp->max_recv_sge);
	req.max_inline = cpu_to_le32(qp->max_inline);
	req.flags = cpu_to_le32((udata ? 0 : VT3_QP_KERNEL) |
				(qp->sig_all ? VT3_QP_SIG_ALL : 0));
	err = vt3_cmd(dev, VT3_CMD_CREATE_QP, &req, sizeof(req), &resp,
		      sizeof(resp));
	if (err)
		goto err_status;
	qp->qpn = le32_to_cpu(resp.handle);
	ibqp->qp_num = qp->qpn;

	if (udata) {
		uresp.qpn = qp->qpn;
		uresp.sq_depth = qp->sq_depth;
		uresp.rq_depth = qp->rq_depth;
		uresp.sq_size = qp->sq.mem->npages << PAGE_SHIFT;
		uresp.rq_size = qp->rq.mem ? qp->rq.mem->npages << PAGE_SHIFT : 0;
		uresp.max_inline = qp->max_inline;
		err = ib_copy_to_udata(udata, &uresp, sizeof(uresp));
		if (err)
			goto err_destroy;
	}
	/*
	 * Findable (events, CQEs) only once nothing can fail: an error path
	 * after this would have to wait for the references others took.
	 */
	err = xa_insert(&dev->qp_xa, qp->qpn, qp, GFP_KERNEL);
	if (err) {
		ibdev_err(&dev->ibdev, "CREATE_QP returned qpn %u in use\n",
			  qp->qpn);
		goto err_destroy;
	}
	attr->cap.max_send_wr = qp->sq_depth;
	attr->cap.max_recv_wr = qp->rq_depth;
	attr->cap.max_recv_sge = qp->max_recv_sge;
	attr->cap.max_inline_data = qp->max_inline;
	return 0;

err_destroy:
	forgot = vt3_forgot(vt3_cmd_handle(dev, VT3_CMD_DESTROY_QP, qp->qpn));
	vt3_queue_mem_release(dev, &qp->status, forgot);
	vt3_queue_mem_release(dev, &qp->rq, forgot);
	vt3_queue_mem_release(dev, &qp->sq, forgot);
	return err;
err_status:
	vt3_queue_mem_release(dev, &qp->status, vt3_refused(err));
err_rq:
	vt3_queue_mem_release(dev, &qp->rq, vt3_refused(err));
err_sq:
	vt3_queue_mem_release(dev, &qp->sq, vt3_refused(err));
	return err;
}

int vt3_destroy_qp(struct ib_qp *ibqp, struct ib_udata *udata)
{
	struct vt3_dev *dev = to_vt3_dev(ibqp->device);
	struct vt3_qp *qp = to_vt3_qp(ibqp);
	bool forgot;
	int err;

	/*
	 * A live connection is aborted and iw_cm told, so that it drops
	 * its references, which are waited for below.
	 */
	vt3_cm_qp_destroy(qp);
	vt3_qp_forget(qp);
	xa_erase(&dev->qp_xa, qp->qpn);
	cancel_work_sync(&qp->db_work);
	vt3_qp_put(qp);
	wait_for_completion(&qp->freed);

	err = vt3_cmd_handle(dev, VT3_CMD_DESTROY_QP, qp->qpn);
	forgot = vt3_forgot(err);
	if (!forgot)
		ibdev_dbg(ibqp->device, "DESTROY_QP %u: %d\n", qp->qpn, err);
	vt3_queue_mem_release(dev, &qp->status, forgot);
	vt3_queue_mem_release(dev, &qp->rq, forgot);
	vt3_queue_mem_release(dev, &qp->sq, forgot);
	return 0;
}

static bool vt3_transition_ok(enum ib_qp_state cur, enum ib_qp_state next)
{
	switch (next) {
	case IB_QPS_RESET:
	case IB_QPS_ERR:
		return true;
	case IB_QPS_INIT:
		return cur == IB_QPS_RESET || cur == IB_QPS_INIT;
	case IB_QPS_RTR:
		return cur == IB_QPS_INIT || cur == IB_QPS_RTR;
	case IB_QPS_RTS:
		return cur == IB_QPS_INIT || cur == IB_QPS_RTR ||
		       cur == IB_QPS_RTS || cur == IB_QPS_SQD ||
		       cur == IB_QPS_SQE;
	case IB_QPS_SQD:
		return cur == IB_QPS_RTS || cur == IB_QPS_SQD;
	case IB_QPS_SQE:
		return cur == IB_QPS_RTS || cur == IB_QPS_SQD ||
		       cur == IB_QPS_SQE;
	default:
		return false;
	}
}

/*
 * The QP is in error (docs/architecture.md §5): its consumer sees it through
 * the status pages (vt3d sets the flags when it reports an error; the
 * driver sets them too, for the cases vt3d cannot: device lost), a kernel
 * QP's outstanding work is flushed, and the CQs' completion handlers run,
 * so that a consumer blocked on a CQ event wakes up.
 */
void vt3_qp_enter_error(struct vt3_qp *qp)
{
	struct vt3_cq *scq = to_vt3_cq(qp->ibqp.send_cq);
	struct vt3_cq *rcq = to_vt3_cq(qp->ibqp.recv_cq);

	lockdep_assert_held(&qp->state_lock);
	/* A lost device's CQ freeze before the flag: the provider's order. */
	smp_mb__before_atomic();
	atomic_or((__force int)cpu_to_le32(VT3_QP_F_ERROR),
		  (atomic_t *)&vt3_qp_status(qp)->flags);
	vt3_cq_set_error(scq);
	vt3_cq_set_error(rcq);
	vt3_qp_flush_start(qp);
	WRITE_ONCE(qp->ib_state, IB_QPS_ERR);
	vt3_cq_kick(scq);
	if (rcq != scq)
		vt3_cq_kick(rcq);
}

void vt3_qp_ib_event(struct vt3_qp *qp, enum ib_event_type type)
{
	struct ib_event ev = {
		.device = qp->ibqp.device,
		.element.qp = &qp->ibqp,
		.event = type,
	};

	if (qp->ibqp.event_handler)
		qp->ibqp.event_handler(&ev, qp->ibqp.qp_context);
}

/*
 * A QP of an SRQ in ERR takes no more SRQ WQEs and its last CQE was
 * written: IB_EVENT_QP_LAST_WQE_REACHED, once per entry into ERR, after
 * the event that says why. state_lock held.
 */
void vt3_qp_last_wqe(struct vt3_qp *qp)
{
	lockdep_assert_held(&qp->state_lock);
	if (!qp->ibqp.srq || qp->last_wqe_done)
		return;
	qp->last_wqe_done = true;
	vt3_qp_ib_event(qp, IB_EVENT_QP_LAST_WQE_REACHED);
}

int vt3_modify_qp(struct ib_qp *ibqp, struct ib_qp_attr *attr, int mask,
		  struct ib_udata *udata)
{
	struct vt3_dev *dev = to_vt3_dev(ibqp->device);
	struct vt3_qp *qp = to_vt3_qp(ibqp);
	struct vt3_cmd_modify_qp req = { .qpn = cpu_to_le32(qp->qpn) };
	enum ib_qp_state cur, next;
	bool pairing, named = false;
	u32 vmask = 0;
	int err = 0;

	/* IB-only attributes (paths, timeouts, P_Keys) mean nothing here. */
	if (mask & ~IB_QP_ATTR_STANDARD_BITS)
		return -EOPNOTSUPP;
	if (!vt3_udata_in_ok(udata))
		return -EINVAL;

	mutex_lock(&qp->state_lock);
	cur = qp->ib_state;
	next = mask & IB_QP_STATE ? attr->qp_state : cur;
	/*
	 * librdmacm's rdma_disconnect() moves the QP to SQD before it calls
	 * iw_cm_disconnect(); after the peer closed, the connection may be
	 * over already (vt3d answers the peer's FIN itself), or still ending,
	 * and the QP in ERR. iw_cm takes a disconnect then as done: so does
	 * the QP, as siw's does in ERROR.
	 */
	if (cur == IB_QPS_ERR && next == IB_QPS_SQD && !(mask & ~IB_QP_STATE))
		goto out;
	if ((mask & IB_QP_CUR_STATE && attr->cur_qp_state != cur) ||
	    !vt3_transition_ok(cur, next)) {
		err = -EINVAL;
		goto out;
	}
	/* IRD/ORD are fixed before the connection is set up. */
	if (mask & (IB_QP_MAX_QP_RD_ATOMIC | IB_QP_MAX_DEST_RD_ATOMIC) &&
	    cur != IB_QPS_RESET && cur != IB_QPS_INIT && cur != IB_QPS_RTR) {
		err = -EINVAL;
		goto out;
	}
	if (mask & IB_QP_MAX_QP_RD_ATOMIC) {
		if (attr->max_rd_atomic > dev->lim.max_ord) {
			err = -EINVAL;
			goto out;
		}
		vmask |= VT3_MODIFY_ORD;
		req.ord = cpu_to_le32(attr->max_rd_atomic);
	}
	if (mask & IB_QP_MAX_DEST_RD_ATOMIC) {
		if (attr->max_dest_rd_atomic > dev->lim.max_ird) {
			err = -EINVAL;
			goto out;
		}
		vmask |= VT3_MODIFY_IRD;
		req.ird = cpu_to_le32(attr->max_dest_rd_atomic);
	}
	/* vt3's extension: an RTR that names a peer QP (vt3_pair.c). */
	if (mask & IB_QP_DEST_QPN) {
		err = next == IB_QPS_RTR ? vt3_pair_name(qp, attr, mask) : -EINVAL;
		if (err)
			goto out;
		named = true;
	}
	/* Its RTS asks for the connection, which takes it to RTS in vt3d. */
	pairing = next == IB_QPS_RTS && cur != IB_QPS_RTS && qp->pair_named &&
		  qp->conn == VT3_CONN_NONE;
	if (qp->conn != VT3_CONN_NONE && next != cur) {
		/* iw_cm_disconnect(): a graceful close, FIN after the SQ. */
		if (cur == IB_QPS_RTS && next == IB_QPS_SQD) {
			err = vt3_cm_disconnect(qp);
			if (!err)
				WRITE_ONCE(qp->ib_state, next);
			goto out;
		}
		/*
		 * Anything else that leaves the connection behind is an
		 * abortive close; the MODIFY_QP below still sets the state.
		 */
		if (next == IB_QPS_RESET ||
		    vt3_state_from_ib(next) == VT3_QPS_ERROR)
			vt3_cm_abort(qp, -ECONNRESET);
	}
	if (vt3_state_from_ib(next) != vt3_state_from_ib(cur) && !pairing) {
		vmask |= VT3_MODIFY_STATE;
		req.state = cpu_to_le32(vt3_state_from_ib(next));
	}
	if (vmask) {
		req.mask = cpu_to_le32(vmask);
		err = vt3_cmd(dev, VT3_CMD_MODIFY_QP, &req, sizeof(req), NULL, 0);
		/*
		 * A lost device processes nothing any more: the QP is in
		 * error whatever it answered (ib_drain_qp must work then).
		 */
		if (err && vt3_state_from_ib(next) == VT3_QPS_ERROR &&
		    READ_ONCE(dev->ctrl.lost)) {
			/* Frozen first: no CQE it may still write is taken. */
			vt3_cq_freeze(to_vt3_cq(ibqp->send_cq));
			vt3_cq_freeze(to_vt3_cq(ibqp->recv_cq));
			err = 0;
		}
		if (err) {
			ibdev_dbg(ibqp->device, "QP %u %s -> %s: %d\n", qp->qpn,
				  vt3_ib_qp_state_name(cur),
				  vt3_ib_qp_state_name(next), err);
			goto out;
		}
	}
	/* After IRD/ORD: the connection negotiates them. */
	if (pairing) {
		err = vt3_pair_connect(qp);
		if (err)
			goto out;
	}
	if (next == IB_QPS_RESET)
		qp->pair_named = false;
	if (vt3_state_from_ib(next) == VT3_QPS_ERROR)
		vt3_qp_enter_error(qp);
	else if (next == IB_QPS_RESET && cur != IB_QPS_RESET)
		vt3_qp_flush_stop(qp);
	/* Out of ERR: the next entry reports LAST_WQE_REACHED again. */
	if (vt3_state_from_ib(next) != VT3_QPS_ERROR)
		qp->last_wqe_done = false;
	WRITE_ONCE(qp->ib_state, next);
out:
	/* An RTR that failed names no peer. */
	if (err && named)
		qp->pair_named = false;
	mutex_unlock(&qp->state_lock);
	return err;
}

int vt3_query_qp(struct ib_qp *ibqp, struct ib_qp_attr *attr, int mask,
		 struct ib_qp_init_attr *init)
{
	struct vt3_dev *dev = to_vt3_dev(ibqp->device);
	struct vt3_qp *qp = to_vt3_qp(ibqp);
	struct vt3_cmd_handle req = { .handle = cpu_to_le32(qp->qpn) };
	struct vt3_qp_attr resp;
	enum ib_qp_state state;
	int err;

	mutex_lock(&qp->state_lock);
	err = vt3_cmd(dev, VT3_CMD_QUERY_QP, &req, sizeof(req), &resp,
		      sizeof(resp));
	if (err)
		goto out;
	/* vt3d knows where the connection took the QP. */
	state = vt3_state_to_ib(le32_to_cpu(resp.state), qp->ib_state);
	if (vt3_state_from_ib(state) != vt3_state_from_ib(qp->ib_state)) {
		ibdev_dbg(ibqp->device, "QP %u is %s in vt3d\n", qp->qpn,
			  vt3_qp_state_name(le32_to_cpu(resp.state)));
		WRITE_ONCE(qp->ib_state, state);
	}

	memset(attr, 0, sizeof(*attr));
	memset(init, 0, sizeof(*init));
	attr->qp_state = state;
	attr->cur_qp_state = state;
	attr->path_mtu = ib_mtu_int_to_enum(READ_ONCE(dev->netdev->mtu));
	attr->qp_access_flags = IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE |
				IB_ACCESS_REMOTE_READ;
	attr->max_rd_atomic = min_t(u32, le32_to_cpu(resp.ord), U8_MAX);
	attr->max_dest_rd_atomic = min_t(u32, le32_to_cpu(resp.ird), U8_MAX);
	attr->cap.max_send_wr = qp->sq_depth;
	attr->cap.max_recv_wr = qp->rq_depth;
	attr->cap.max_send_sge = qp->max_send_sge;
	attr->cap.max_recv_sge = qp->max_recv_sge;
	attr->cap.max_inline_data = qp->max_inline;

	init->qp_type = IB_QPT_RC;
	init->send_cq = ibqp->send_cq;
	init->recv_cq = ibqp->recv_cq;
	init->srq = ibqp->srq;
	init->cap = attr->cap;
	init->sq_sig_type = qp->sig_all ? IB_SIGNAL_ALL_WR : IB_SIGNAL_REQ_WR;
out:
	mutex_unlock(&qp->state_lock);
	return err;
}

/*
 * Kernel QPs accept work from INIT on; in error too, where it completes
 * with IB_WC_WR_FLUSH_ERR (what ib_drain_qp relies on).
 */
static bool vt3_qp_postable(struct vt3_qp *qp)
{
	return READ_ONCE(qp->ib_state) != IB_QPS_RESET;
}

/*
 * IB_WR_REG_MR: the MR's page list as map_mr_sg left it, under the key
 * the ULP chose (ib_update_fast_reg_key); vt3d copies the list when it
 * executes the WQE. The slot holds a struct vt3_reg_mr_wqe.
 */
static int vt3_build_reg_mr_wqe(struct vt3_qp *qp, const struct ib_reg_wr *reg,
				struct vt3_sq_wqe *slot)
{
	struct vt3_reg_mr_wqe *wqe = (struct vt3_reg_mr_wqe *)slot;
	struct vt3_mr *mr = to_vt3_mr(reg->mr);
	u32 access;

	BUILD_BUG_ON(sizeof(*wqe) != sizeof(*slot));
	if (!mr->fast_reg || reg->wr.num_sge ||
	    reg->wr.send_flags & IB_SEND_INLINE ||
	    vt3_access(reg->access, &access))
		return -EINVAL;
	wqe->opcode = VT3_WR_REG_MR;
	wqe->wr_id = cpu_to_le64(reg->wr.wr_id);
	if (qp->sig_all || reg->wr.send_flags & IB_SEND_SIGNALED)
		wqe->flags |= VT3_WQE_SIGNALED;
	if (reg->wr.send_flags & IB_SEND_FENCE)
		wqe->flags |= VT3_WQE_FENCE;
	wqe->stag = cpu_to_le32(reg->key);
	wqe->iova = cpu_to_le64(reg->mr->iova);
	wqe->length = cpu_to_le64(reg->mr->length);
	wqe->pbl_addr = cpu_to_le64(virt_to_phys(mr->mem->pbl));
	wqe->npages = cpu_to_le32(mr->npages);
	wqe->access = cpu_to_le32(access);
	wqe->page_shift = cpu_to_le32(VT3_PAGE_SHIFT);
	return 0;
}

static int vt3_build_sq_wqe(struct vt3_qp *qp, const struct ib_send_wr *wr,
			    struct vt3_sq_wqe *wqe)
{
	bool se = wr->send_flags & IB_SEND_SOLICITED;
	u32 max_sge = qp->max_send_sge;
	int i;

	memset(wqe, 0, sizeof(*wqe));
	switch (wr->opcode) {
	case IB_WR_REG_MR:
		return vt3_build_reg_mr_wqe(qp, reg_wr(wr), wqe);
	case IB_WR_LOCAL_INV:
		wqe->opcode = VT3_WR_LOCAL_INV;
		wqe->invalidate_stag = cpu_to_le32(wr->ex.invalidate_rkey);
		max_sge = 0;
		break;
	case IB_WR_SEND:
		wqe->opcode = se ? VT3_WR_SEND_SE : VT3_WR_SEND;
		break;
	case IB_WR_SEND_WITH_INV:
		wqe->opcode = se ? VT3_WR_SEND_SE_INV : VT3_WR_SEND_INV;
		wqe->invalidate_stag = cpu_to_le32(wr->ex.invalidate_rkey);
		break;
	case IB_WR_RDMA_WRITE:
		wqe->opcode = VT3_WR_WRITE;
		wqe->remote_addr = cpu_to_le64(rdma_wr(wr)->remote_addr);
		wqe->remote_stag = cpu_to_le32(rdma_wr(wr)->rkey);
		break;
	case IB_WR_RDMA_READ:
	case IB_WR_RDMA_READ_WITH_INV:
		wqe->opcode = VT3_WR_READ;
		if (wr->opcode == IB_WR_RDMA_READ_WITH_INV) {
			/*
			 * rdma_rw's READ on iWARP: what is invalidated is the
			 * sink, sg_list[0]'s STag, as siw and iw_cxgb4 take
			 * it. Not ex.invalidate_rkey: rdma_rw fills that in
			 * before it rotates the key (rdma_rw_update_lkey), so
			 * it names the MR's previous registration.
			 */
			if (wr->num_sge != 1)
				return -EINVAL;
			wqe->opcode = VT3_WR_READ_INV;
			wqe->invalidate_stag =
				cpu_to_le32(wr->sg_list[0].lkey);
		}
		wqe->remote_addr = cpu_to_le64(rdma_wr(wr)->remote_addr);
		wqe->remote_stag = cpu_to_le32(rdma_wr(wr)->rkey);
		max_sge = min(max_sge, to_vt3_dev(qp->ibqp.device)->lim.max_sge_rd);
		break;
	default:
		return -EINVAL;
	}
	if (wr->send_flags & IB_SEND_INLINE || wr->num_sge < 0 ||
	    wr->num_sge > max_sge)
		return -EINVAL;
	wqe->wr_id = cpu_to_le64(wr->wr_id);
	if (qp->sig_all || wr->send_flags & IB_SEND_SIGNALED)
		wqe->flags |= VT3_WQE_SIGNALED;
	if (wr->send_flags & IB_SEND_FENCE)
		wqe->flags |= VT3_WQE_FENCE;
	wqe->num_sge = wr->num_sge;
	for (i = 0; i < wr->num_sge; i++) {
		wqe->sge[i].addr = cpu_to_le64(wr->sg_list[i].addr);
		wqe->sge[i].length = cpu_to_le32(wr->sg_list[i].length);
		wqe->sge[i].lkey = cpu_to_le32(wr->sg_list[i].lkey);
	}
	return 0;
}

/*
 * Publishes a new producer index and rings the doorbell only if vt3d said
 * it went idle on that queue. The full barrier orders our index store
 * before the flag load; vt3d sets the flag, then re-reads the index.
 */
static void vt3_qp_publish(struct vt3_qp *qp, __le32 *prod, u32 value,
			   u32 idle_flag, u32 queue)
{
	/* Release: the WQEs written before are visible with the index. */
	smp_store_release(prod, cpu_to_le32(value));
	/* Store-load order: index store before the idle flag load. */
	smp_mb();
	if (le32_to_cpu(READ_ONCE(vt3_qp_status(qp)->flags)) & idle_flag)
		vt3_qp_doorbell(qp, queue);
}

/*
 * A user QP's doorbell. In error vt3d consumes nothing more: the provider
 * flushes what it posted and rings to have the CQ's waiter woken (a post
 * in error, or an arm with flush completions pending), so kick the CQ.
 */
static void vt3_user_doorbell(struct vt3_qp *qp, u32 queue, struct ib_cq *cq)
{
	if (le32_to_cpu(READ_ONCE(vt3_qp_status(qp)->flags)) & VT3_QP_F_ERROR) {
		vt3_cq_kick(to_vt3_cq(cq));
		return;
	}
	vt3_qp_doorbell(qp, queue);
}

int vt3_post_send(struct ib_qp *ibqp, const struct ib_send_wr *wr,
		  const struct ib_send_wr **bad_wr)
{
	struct vt3_qp *qp = to_vt3_qp(ibqp);
	struct vt3_qp_status *st;
	struct vt3_sq_wqe wqe;
	unsigned long flags;
	bool flushing, posted;
	u32 cons, start;
	int err = 0;

	if (qp->user) {
		/* The provider wrote the WQEs; this is its doorbell. */
		if (wr) {
			*bad_wr = wr;
			return -EINVAL;
		}
		vt3_user_doorbell(qp, VT3_DB_SQ, ibqp->send_cq);
		return 0;
	}
	if (!vt3_qp_postable(qp)) {
		*bad_wr = wr;
		return -EINVAL;
	}

	st = vt3_qp_status(qp);
	spin_lock_irqsave(&qp->sq_lock, flags);
	start = qp->sq_prod;
	/* In error, the driver consumes: slots before sq_flush are free. */
	flushing = qp->sq_flushing;
	/* Acquire: pairs with poll_cq's release once it took the CQE. */
	cons = flushing ? qp->sq_flush : smp_load_acquire(&qp->sq_done);
	for (; wr; wr = wr->next) {
		if (qp->sq_prod - cons >= qp->sq_depth) {
			err = -ENOMEM;
			break;
		}
		err = vt3_build_sq_wqe(qp, wr, &wqe);
		if (err)
			break;
		memcpy(vt3_pages_slot(qp->sq.mem, (qp->sq_prod &
						   (qp->sq_depth - 1)) *
				      VT3_WQE_SIZE),
		       &wqe, sizeof(wqe));
		qp->sq_prod++;
	}
	posted = qp->sq_prod != start;
	if (posted && flushing)
		/* Kept in step for ERROR -> IDLE; vt3d reads no more. */
		smp_store_release(&st->sq_prod, cpu_to_le32(qp->sq_prod));
	else if (posted)
		vt3_qp_publish(qp, &st->sq_prod, qp->sq_prod, VT3_QP_F_SQ_IDLE,
			       VT3_DB_SQ);
	spin_unlock_irqrestore(&qp->sq_lock, flags);
	if (posted && flushing)
		vt3_cq_kick_later(to_vt3_cq(ibqp->send_cq));
	if (err)
		*bad_wr = wr;
	return err;
}

/*
 * Writes @wr (its SGE count checked by the caller) as the receive WQE in
 * slot @index of @ring: a QP's RQ or an SRQ.
 */
void vt3_write_recv_wqe(struct vt3_pages *ring, u32 index,
			const struct ib_recv_wr *wr)
{
	struct vt3_rq_wqe wqe;
	int i;

	memset(&wqe, 0, sizeof(wqe));
	wqe.wr_id = cpu_to_le64(wr->wr_id);
	wqe.num_sge = wr->num_sge;
	for (i = 0; i < wr->num_sge; i++) {
		wqe.sge[i].addr = cpu_to_le64(wr->sg_list[i].addr);
		wqe.sge[i].length = cpu_to_le32(wr->sg_list[i].length);
		wqe.sge[i].lkey = cpu_to_le32(wr->sg_list[i].lkey);
	}
	memcpy(vt3_pages_slot(ring, index * VT3_WQE_SIZE), &wqe, sizeof(wqe));
}

int vt3_post_recv(struct ib_qp *ibqp, const struct ib_recv_wr *wr,
		  const struct ib_recv_wr **bad_wr)
{
	struct vt3_qp *qp = to_vt3_qp(ibqp);
	struct vt3_qp_status *st;
	unsigned long flags;
	bool flushing, posted;
	u32 cons, start;
	int err = 0;

	/*
	 * A QP of an SRQ receives into the SRQ's WQEs only. A user one's
	 * RQ doorbell is still the provider's kick of its receive CQ in
	 * error (a lost device's SRQ flush); vt3d takes it as the SRQ's.
	 */
	if (ibqp->srq && !qp->user) {
		*bad_wr = wr;
		return -EINVAL;
	}
	if (qp->user) {
		if (wr) {
			*bad_wr = wr;
			return -EINVAL;
		}
		vt3_user_doorbell(qp, VT3_DB_RQ, ibqp->recv_cq);
		return 0;
	}
	if (!vt3_qp_postable(qp)) {
		*bad_wr = wr;
		return -EINVAL;
	}

	st = vt3_qp_status(qp);
	spin_lock_irqsave(&qp->rq_lock, flags);
	start = qp->rq_prod;
	flushing = qp->rq_flushing;
	/* Acquire: pairs with poll_cq's release once it took the CQE. */
	cons = flushing ? qp->rq_flush : smp_load_acquire(&qp->rq_done);
	for (; wr; wr = wr->next) {
		if (qp->rq_prod - cons >= qp->rq_depth) {
			err = -ENOMEM;
			break;
		}
		if (wr->num_sge < 0 || wr->num_sge > qp->max_recv_sge) {
			err = -EINVAL;
			break;
		}
		vt3_write_recv_wqe(qp->rq.mem, qp->rq_prod & (qp->rq_depth - 1), wr);
		qp->rq_prod++;
	}
	posted = qp->rq_prod != start;
	if (posted && flushing)
		/* Kept in step for ERROR -> IDLE; vt3d reads no more. */
		smp_store_release(&st->rq_prod, cpu_to_le32(qp->rq_prod));
	else if (posted)
		vt3_qp_publish(qp, &st->rq_prod, qp->rq_prod, VT3_QP_F_RQ_IDLE,
			       VT3_DB_RQ);
	spin_unlock_irqrestore(&qp->rq_lock, flags);
	if (posted && flushing)
		vt3_cq_kick_later(to_vt3_cq(ibqp->recv_cq));
	if (err)
		*bad_wr = wr;
	return err;
}

/* iw_cm looks QPs up by number (under a spinlock: no sleeping). */
struct ib_qp *vt3_iw_get_qp(struct ib_device *ibdev, int qpn)
{
	struct vt3_qp *qp = xa_load(&to_vt3_dev(ibdev)->qp_xa, qpn);

	return qp ? &qp->ibqp : NULL;
}

void vt3_iw_add_ref(struct ib_qp *ibqp)
{
	kref_get(&to_vt3_qp(ibqp)->ref);
}

void vt3_iw_rem_ref(struct ib_qp *ibqp)
{
	vt3_qp_put(to_vt3_qp(ibqp));
}
