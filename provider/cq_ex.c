// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
/*
 * libvt3 ibv_cq_ex: ibv_start_poll(), ibv_next_poll(), ibv_end_poll()
 * and the ibv_wc_read_*() of the completion at hand (ibv_create_cq_ex(3)).
 *
 * No second CQE parser: each step takes one completion through the
 * reader ibv_poll_cq uses (vt3_cq_poll_locked(): device CQEs, the flush,
 * the destroyed QPs' CQEs skipped), into cq->cur, and the read_* ops
 * read that. So a completion is consumed once whichever API polls it,
 * both may be mixed on one CQ, and arming sees the consumer index each
 * step published. The CQ lock is held from a successful start_poll to
 * end_poll, as mlx5 holds its own; start_poll that finds nothing
 * (ENOENT) releases it, and end_poll is not called then (the API's rule).
 */
#include <config.h>

#include <errno.h>

#include "vt3.h"

/* One completion into cq->cur: 0, ENOENT when none waits, or EIO. */
static int vt3_cq_ex_take(struct vt3_cq *cq)
{
	struct ibv_cq_ex *cqx = &cq->vcq.cq_ex;
	int n = vt3_cq_poll_locked(cq, 1, &cq->cur);

	if (n < 0)
		return -n;
	if (!n)
		return ENOENT;
	cqx->wr_id = cq->cur.wr_id;
	cqx->status = cq->cur.status;
	return 0;
}

static int vt3_start_poll(struct ibv_cq_ex *cqx, struct ibv_poll_cq_attr *attr)
{
	struct vt3_cq *cq = vt3_cq_of_ex(cqx);
	int ret;

	if (attr->comp_mask)
		return EINVAL;
	pthread_spin_lock(&cq->lock);
	ret = vt3_cq_ex_take(cq);
	if (ret)
		pthread_spin_unlock(&cq->lock);
	return ret;
}

static int vt3_next_poll(struct ibv_cq_ex *cqx)
{
	return vt3_cq_ex_take(vt3_cq_of_ex(cqx));
}

static void vt3_end_poll(struct ibv_cq_ex *cqx)
{
	pthread_spin_unlock(&vt3_cq_of_ex(cqx)->lock);
}

static enum ibv_wc_opcode vt3_read_opcode(struct ibv_cq_ex *cqx)
{
	return vt3_cq_of_ex(cqx)->cur.opcode;
}

static uint32_t vt3_read_vendor_err(struct ibv_cq_ex *cqx)
{
	return vt3_cq_of_ex(cqx)->cur.vendor_err;
}

static uint32_t vt3_read_byte_len(struct ibv_cq_ex *cqx)
{
	return vt3_cq_of_ex(cqx)->cur.byte_len;
}

/*
 * iWARP carries no immediate data: this is the invalidated rkey of a
 * receive with IBV_WC_WITH_INV (ibv_wc_read_invalidated_rkey()), else 0.
 */
static __be32 vt3_read_imm_data(struct ibv_cq_ex *cqx)
{
	return vt3_cq_of_ex(cqx)->cur.imm_data;
}

static uint32_t vt3_read_qp_num(struct ibv_cq_ex *cqx)
{
	return vt3_cq_of_ex(cqx)->cur.qp_num;
}

static uint32_t vt3_read_src_qp(struct ibv_cq_ex *cqx)
{
	return vt3_cq_of_ex(cqx)->cur.src_qp;
}

static unsigned int vt3_read_wc_flags(struct ibv_cq_ex *cqx)
{
	return vt3_cq_of_ex(cqx)->cur.wc_flags;
}

/* InfiniBand addressing: an iWARP completion has none (0, as in ibv_wc). */
static uint32_t vt3_read_slid(struct ibv_cq_ex *cqx)
{
	return vt3_cq_of_ex(cqx)->cur.slid;
}

static uint8_t vt3_read_sl(struct ibv_cq_ex *cqx)
{
	return vt3_cq_of_ex(cqx)->cur.sl;
}

static uint8_t vt3_read_dlid_path_bits(struct ibv_cq_ex *cqx)
{
	return vt3_cq_of_ex(cqx)->cur.dlid_path_bits;
}

/* The ops of a CQ made by create_cq_ex (verbs.c checked its wc_flags). */
void vt3_cq_ex_setup(struct vt3_cq *cq)
{
	struct ibv_cq_ex *cqx = &cq->vcq.cq_ex;

	cqx->start_poll = vt3_start_poll;
	cqx->next_poll = vt3_next_poll;
	cqx->end_poll = vt3_end_poll;
	cqx->read_opcode = vt3_read_opcode;
	cqx->read_vendor_err = vt3_read_vendor_err;
	cqx->read_byte_len = vt3_read_byte_len;
	cqx->read_imm_data = vt3_read_imm_data;
	cqx->read_qp_num = vt3_read_qp_num;
	cqx->read_src_qp = vt3_read_src_qp;
	cqx->read_wc_flags = vt3_read_wc_flags;
	cqx->read_slid = vt3_read_slid;
	cqx->read_sl = vt3_read_sl;
	cqx->read_dlid_path_bits = vt3_read_dlid_path_bits;
}
