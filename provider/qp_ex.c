// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
/*
 * libvt3 ibv_qp_ex: posting with ibv_wr_start(), the ibv_wr_* builders
 * and setters, and ibv_wr_complete()/ibv_wr_abort() (ibv_wr_post(3)).
 *
 * One mechanism with post_send (qp.c): wr_start is post_send's start
 * (the SQ lock, the QP state, a QP in error taking WRs to flush them),
 * each builder fills the next ring slot through the same table-driven
 * WQE builder (vt3_send_op(), vt3_sq_wqe_init()) and the setters through
 * the same data setters, and wr_complete is post_send's end (the producer
 * index published once for the batch, the doorbell only if vt3d went
 * idle). The WQEs go straight into the ring slots past the producer
 * index, which vt3d does not read until wr_complete moves it.
 *
 * The builders and setters return nothing: the first error (ring full
 * ENOMEM, too many SGEs or too much inline data EINVAL, the QP's state
 * EINVAL) is kept and returned by wr_complete, which then posts nothing
 * of the batch (ibv_wr_post(3), "RETURN VALUE").
 */
#include <config.h>

#include <errno.h>

#include <ccan/array_size.h>

#include "vt3.h"

/* The builders, by the ops flag that asks for them. */
static const struct {
	uint64_t flag;			/* enum ibv_qp_create_send_ops_flags */
	unsigned int opcode;		/* enum ibv_wr_opcode */
} vt3_qp_ex_ops[] = {
	{ IBV_QP_EX_WITH_SEND, IBV_WR_SEND },
	{ IBV_QP_EX_WITH_SEND_WITH_INV, IBV_WR_SEND_WITH_INV },
	{ IBV_QP_EX_WITH_RDMA_WRITE, IBV_WR_RDMA_WRITE },
	{ IBV_QP_EX_WITH_RDMA_READ, IBV_WR_RDMA_READ },
	{ IBV_QP_EX_WITH_LOCAL_INV, IBV_WR_LOCAL_INV },
	{ IBV_QP_EX_WITH_BIND_MW, IBV_WR_BIND_MW },
};

static void vt3_wr_fail(struct vt3_qp_batch *batch, int err)
{
	if (!batch->err)
		batch->err = err;
	batch->op = NULL;
}

/* A builder: the header of the next WQE of the batch. */
static void vt3_wr_build(struct ibv_qp_ex *qpx, unsigned int opcode,
			 uint64_t remote_addr, uint32_t rkey,
			 uint32_t invalidate_rkey)
{
	struct vt3_qp *qp = vt3_qp_of_ex(qpx);
	struct vt3_qp_batch *batch = &qp->batch;
	struct vt3_wq *wq = &qp->sq;
	const struct vt3_send_op *op = vt3_send_op(opcode);
	struct vt3_send_req req = {
		.wr_id = qpx->wr_id,
		.send_flags = qpx->wr_flags,
		.remote_addr = remote_addr,
		.rkey = rkey,
		.invalidate_rkey = invalidate_rkey,
	};
	int ret;

	if (batch->err)
		return;
	if (vt3_wq_full(wq, batch->next)) {
		vt3_wr_fail(batch, ENOMEM);
		return;
	}
	ret = vt3_sq_wqe_init(qp, op, &req, vt3_wq_slot(wq, batch->next),
			      &wq->swqe[batch->next & (wq->depth - 1)]);
	if (ret) {
		vt3_wr_fail(batch, ret);
		return;
	}
	batch->op = op;
	batch->next++;
}

static void vt3_wr_send(struct ibv_qp_ex *qpx)
{
	vt3_wr_build(qpx, IBV_WR_SEND, 0, 0, 0);
}

static void vt3_wr_send_inv(struct ibv_qp_ex *qpx, uint32_t invalidate_rkey)
{
	vt3_wr_build(qpx, IBV_WR_SEND_WITH_INV, 0, 0, invalidate_rkey);
}

static void vt3_wr_rdma_write(struct ibv_qp_ex *qpx, uint32_t rkey,
			      uint64_t remote_addr)
{
	vt3_wr_build(qpx, IBV_WR_RDMA_WRITE, remote_addr, rkey, 0);
}

static void vt3_wr_rdma_read(struct ibv_qp_ex *qpx, uint32_t rkey,
			     uint64_t remote_addr)
{
	vt3_wr_build(qpx, IBV_WR_RDMA_READ, remote_addr, rkey, 0);
}

static void vt3_wr_local_inv(struct ibv_qp_ex *qpx, uint32_t invalidate_rkey)
{
	vt3_wr_build(qpx, IBV_WR_LOCAL_INV, 0, 0, invalidate_rkey);
}

static void vt3_wr_bind_mw(struct ibv_qp_ex *qpx, struct ibv_mw *mw,
			   uint32_t rkey, const struct ibv_mw_bind_info *info)
{
	struct vt3_qp *qp = vt3_qp_of_ex(qpx);
	struct vt3_qp_batch *batch = &qp->batch;
	int ret;

	vt3_wr_build(qpx, IBV_WR_BIND_MW, 0, 0, 0);
	if (batch->err)
		return;
	ret = vt3_sq_wqe_set_bind(vt3_wq_slot(&qp->sq, batch->next - 1), mw,
				  rkey, info);
	if (ret)
		vt3_wr_fail(batch, ret);
}

/*
 * The WQE the last builder made, for a setter; NULL (the error noted):
 * the batch failed already, or no builder came first.
 */
static struct vt3_sq_wqe *vt3_wr_current(struct vt3_qp *qp)
{
	struct vt3_qp_batch *batch = &qp->batch;

	if (batch->err)
		return NULL;
	if (!batch->op) {
		vt3_wr_fail(batch, EINVAL);
		return NULL;
	}
	return vt3_wq_slot(&qp->sq, batch->next - 1);
}

static void vt3_wr_set_sge_list(struct ibv_qp_ex *qpx, size_t num_sge,
				const struct ibv_sge *sg_list)
{
	struct vt3_qp *qp = vt3_qp_of_ex(qpx);
	struct vt3_sq_wqe *wqe = vt3_wr_current(qp);
	int ret;

	if (!wqe)
		return;
	ret = vt3_sq_wqe_set_sges(qp, qp->batch.op, wqe, sg_list, num_sge);
	if (ret)
		vt3_wr_fail(&qp->batch, ret);
}

static void vt3_wr_set_sge(struct ibv_qp_ex *qpx, uint32_t lkey, uint64_t addr,
			   uint32_t length)
{
	struct ibv_sge sge = { .addr = addr, .length = length, .lkey = lkey };

	vt3_wr_set_sge_list(qpx, 1, &sge);
}

static void vt3_wr_set_inline_data_list(struct ibv_qp_ex *qpx, size_t num_buf,
					const struct ibv_data_buf *buf_list)
{
	struct vt3_qp *qp = vt3_qp_of_ex(qpx);
	struct vt3_sq_wqe *wqe = vt3_wr_current(qp);
	int ret;

	if (!wqe)
		return;
	ret = vt3_sq_wqe_set_inline(qp, qp->batch.op, wqe, buf_list, num_buf);
	if (ret)
		vt3_wr_fail(&qp->batch, ret);
}

static void vt3_wr_set_inline_data(struct ibv_qp_ex *qpx, void *addr,
				   size_t length)
{
	struct ibv_data_buf buf = { .addr = addr, .length = length };

	vt3_wr_set_inline_data_list(qpx, 1, &buf);
}

static void vt3_wr_start(struct ibv_qp_ex *qpx)
{
	struct vt3_qp *qp = vt3_qp_of_ex(qpx);
	struct vt3_qp_batch *batch = &qp->batch;

	batch->err = vt3_wq_post_begin(&qp->sq, &batch->error);
	batch->next = qp->sq.prod;
	batch->op = NULL;
}

static int vt3_wr_complete(struct ibv_qp_ex *qpx)
{
	struct vt3_qp *qp = vt3_qp_of_ex(qpx);
	struct vt3_qp_batch *batch = &qp->batch;
	struct vt3_wq *wq = &qp->sq;
	uint32_t start = wq->prod;
	int err = batch->err;

	if (!err)
		wq->prod = batch->next;
	vt3_wq_post_end(wq, start, batch->error);
	return err;
}

/* Nothing of the batch was published: the producer index stays. */
static void vt3_wr_abort(struct ibv_qp_ex *qpx)
{
	struct vt3_qp *qp = vt3_qp_of_ex(qpx);

	vt3_wq_post_end(&qp->sq, qp->sq.prod, qp->batch.error);
}

/*
 * create_qp_ex with IBV_QP_INIT_ATTR_SEND_OPS_FLAGS: EOPNOTSUPP unless
 * vt3 does every op asked for (on an RC QP, the only kind iWARP has);
 * sets the builders asked for and every setter.
 */
int vt3_qp_ex_setup(struct vt3_qp *qp, const struct ibv_qp_init_attr_ex *attr)
{
	struct ibv_qp_ex *qpx = &qp->vqp.qp_ex;
	uint64_t left = attr->send_ops_flags;
	size_t i;

	if (attr->qp_type != IBV_QPT_RC)
		return EOPNOTSUPP;
	for (i = 0; i < ARRAY_SIZE(vt3_qp_ex_ops); i++)
		if (vt3_send_op(vt3_qp_ex_ops[i].opcode))
			left &= ~vt3_qp_ex_ops[i].flag;
	if (left)
		return EOPNOTSUPP;

	if (attr->send_ops_flags & IBV_QP_EX_WITH_SEND)
		qpx->wr_send = vt3_wr_send;
	if (attr->send_ops_flags & IBV_QP_EX_WITH_SEND_WITH_INV)
		qpx->wr_send_inv = vt3_wr_send_inv;
	if (attr->send_ops_flags & IBV_QP_EX_WITH_RDMA_WRITE)
		qpx->wr_rdma_write = vt3_wr_rdma_write;
	if (attr->send_ops_flags & IBV_QP_EX_WITH_RDMA_READ)
		qpx->wr_rdma_read = vt3_wr_rdma_read;
	if (attr->send_ops_flags & IBV_QP_EX_WITH_LOCAL_INV)
		qpx->wr_local_inv = vt3_wr_local_inv;
	if (attr->send_ops_flags & IBV_QP_EX_WITH_BIND_MW)
		qpx->wr_bind_mw = vt3_wr_bind_mw;
	qpx->wr_set_sge = vt3_wr_set_sge;
	qpx->wr_set_sge_list = vt3_wr_set_sge_list;
	qpx->wr_set_inline_data = vt3_wr_set_inline_data;
	qpx->wr_set_inline_data_list = vt3_wr_set_inline_data_list;
	qpx->wr_start = vt3_wr_start;
	qpx->wr_complete = vt3_wr_complete;
	qpx->wr_abort = vt3_wr_abort;
	return 0;
}
