// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
/*
 * libvt3 shared receive queues (docs/architecture.md §3.4).
 *
 * vt3.ko allocates the ring of vt3_rq_wqe and the vt3_srq_status page;
 * we map both and produce into the ring as into an RQ: the producer index
 * with release, then the doorbell (a post_srq_recv without WRs that
 * vt3.ko turns into VT3_CMD_DOORBELL with VT3_DB_SRQ) only when vt3d said
 * it went idle on the SRQ (VT3_SRQ_F_IDLE).
 *
 * Which QP takes a WQE is vt3d's choice, so completions come out of SRQ
 * order: each slot remembers its WR and whether its completion is owed,
 * and a CQE (VT3_CQE_SRQ, wqe_idx its SRQ index) completes the slot it
 * names once; only then is the slot free for a post. A QP error flushes
 * nothing of the SRQ: vt3d completes the one WQE the failing QP had
 * taken. A lost device leaves owed slots that nobody else completes: the
 * CQ of the first QP of the SRQ whose flush runs completes them with
 * IBV_WC_WR_FLUSH_ERR (cq.c), once each.
 */
#include <config.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <util/udma_barrier.h>

#include "vt3.h"
#include "vt3dv.h"

static void vt3_srq_free(struct vt3_srq *srq)
{
	if (srq->slots)
		vt3_buf_free(srq->domain, srq->slots, VT3DV_RES_TYPE_SRQ,
			     srq->slots_custom);
	vt3_domain_put(srq->domain);
	free(srq);
}

struct ibv_srq *vt3_create_srq(struct ibv_pd *pd,
			       struct ibv_srq_init_attr *attr)
{
	struct ibv_context *ibctx = pd->context;
	struct uvt3_create_srq_resp resp = {};
	struct ibv_create_srq cmd = {};
	struct vt3_srq *srq;
	int ret;

	srq = calloc(1, sizeof(*srq));
	if (!srq)
		return NULL;
	ret = ibv_cmd_create_srq(pd, &srq->ibv_srq, attr, &cmd, sizeof(cmd),
				 &resp.ibv_resp, sizeof(resp));
	if (ret) {
		free(srq);
		errno = ret;
		return NULL;
	}

	if (!vt3_ring_ok(resp.drv.depth, resp.drv.ring_size, VT3_WQE_SIZE)) {
		verbs_err(verbs_get_ctx(ibctx),
			  "libvt3: bad SRQ ring from the kernel: %u entries in %u bytes\n",
			  resp.drv.depth, resp.drv.ring_size);
		ret = EPROTO;
		goto err_destroy;
	}
	srq->depth = resp.drv.depth;
	srq->ring_size = resp.drv.ring_size;
	srq->max_sge = attr->attr.max_sge;
	srq->domain = vt3_domain_get(pd);
	srq->slots = vt3_buf_calloc(srq->domain, srq->depth, sizeof(*srq->slots),
				    VT3DV_RES_TYPE_SRQ, &srq->slots_custom);
	if (!srq->slots) {
		ret = ENOMEM;
		goto err_destroy;
	}
	srq->ring = vt3_mmap(ibctx, srq->ring_size, PROT_READ | PROT_WRITE,
			     resp.drv.ring_key, "SRQ ring");
	if (!srq->ring)
		goto err_unmap;
	srq->status = vt3_mmap(ibctx, sizeof(*srq->status),
			       PROT_READ | PROT_WRITE, resp.drv.status_key,
			       "SRQ status page");
	if (!srq->status)
		goto err_unmap;
	pthread_spin_init(&srq->lock, PTHREAD_PROCESS_PRIVATE);
	/* Indices are free running: start where the page says. */
	srq->prod = le32toh(srq->status->prod);
	vt3_wrcheck_srq_create(srq);
	return &srq->ibv_srq;

err_unmap:
	ret = errno;
	vt3_munmap(srq->ring, srq->ring_size);
	vt3_munmap(srq->status, sizeof(*srq->status));
err_destroy:
	ibv_cmd_destroy_srq(&srq->ibv_srq);
	vt3_srq_free(srq);
	errno = ret;
	return NULL;
}

/*
 * The kernel refuses while QPs use the SRQ (EBUSY); WQEs still in a
 * destroyed SRQ complete nowhere (the verbs' rule).
 */
int vt3_destroy_srq(struct ibv_srq *ibsrq)
{
	struct vt3_srq *srq = to_vt3_srq(ibsrq);
	int ret;

	ret = ibv_cmd_destroy_srq(ibsrq);
	if (ret)
		return ret;
	vt3_wrcheck_srq_destroy(srq);
	vt3_munmap(srq->ring, srq->ring_size);
	vt3_munmap(srq->status, sizeof(*srq->status));
	pthread_spin_destroy(&srq->lock);
	vt3_srq_free(srq);
	return 0;
}

/*
 * IBV_SRQ_MAX_WR (resize; docs/architecture.md §3.4): under the
 * SRQ's lock, so no post or completion runs meanwhile. vt3.ko copies the
 * WQEs into a new ring and says where it is through resp; the slots move
 * to their index in a table of the new depth, allocated before, so
 * nothing can fail once vt3d switched but the mapping: then posts fail
 * (EIO) and the WRs posted complete as before. The old ring is unmapped
 * only after the switch. vt3 never shrinks a ring: a max_wr it already
 * holds succeeds and changes nothing; fewer than the WRs posted and not
 * completed is EINVAL (the verbs' rule).
 */
int vt3_modify_srq(struct ibv_srq *ibsrq, struct ibv_srq_attr *attr,
		   int attr_mask)
{
	struct vt3_srq *srq = to_vt3_srq(ibsrq);
	struct vt3_resize_srq_resp resp = {};
	struct uvt3_modify_srq cmd = {};
	struct vt3_srq_slot *slots = NULL;
	uint32_t want = 0, i;
	bool custom = false;
	void *ring;
	int ret;

	if (!(attr_mask & IBV_SRQ_MAX_WR))
		return ibv_cmd_modify_srq(ibsrq, attr, attr_mask, &cmd.ibv_cmd,
					  sizeof(cmd.ibv_cmd));

	pthread_spin_lock(&srq->lock);
	if (attr->max_wr < srq->owed || attr->max_wr > 1U << 31) {
		ret = EINVAL;
		goto out;
	}
	for (want = 2; want < attr->max_wr; want <<= 1)
		;
	if (want > srq->depth) {
		slots = vt3_buf_calloc(srq->domain, want, sizeof(*slots),
				       VT3DV_RES_TYPE_SRQ, &custom);
		if (!slots) {
			ret = ENOMEM;
			goto out;
		}
	}
	cmd.drv.resize_resp = (uintptr_t)&resp;
	ret = ibv_cmd_modify_srq(ibsrq, attr, attr_mask, &cmd.ibv_cmd,
				 sizeof(cmd));
	if (ret || !resp.depth)
		goto out;
	if (!slots || resp.depth != want) {
		verbs_err(verbs_get_ctx(ibsrq->context),
			  "libvt3: SRQ resized to %u entries, not %u\n",
			  resp.depth, want);
		/* vt3d reads a ring we do not know: no more posts. */
		vt3_munmap(srq->ring, srq->ring_size);
		srq->ring = NULL;
		ret = EPROTO;
		goto out;
	}
	for (i = 0; i < srq->depth; i++)
		if (srq->slots[i].owed)
			slots[srq->slots[i].idx & (want - 1)] = srq->slots[i];
	vt3_buf_free(srq->domain, srq->slots, VT3DV_RES_TYPE_SRQ,
		     srq->slots_custom);
	srq->slots = slots;
	srq->slots_custom = custom;
	slots = NULL;
	if (srq->wrcheck)
		vt3_wrcheck_srq_resized(srq, want);
	srq->depth = want;
	ring = NULL;
	if (vt3_ring_ok(resp.depth, resp.ring_size, VT3_WQE_SIZE))
		ring = vt3_mmap(ibsrq->context, resp.ring_size,
				PROT_READ | PROT_WRITE, resp.ring_key,
				"SRQ ring");
	if (srq->ring)
		vt3_munmap(srq->ring, srq->ring_size);
	srq->ring = ring;
	srq->ring_size = ring ? resp.ring_size : 0;
	if (!ring)
		ret = errno ?: EPROTO;
out:
	pthread_spin_unlock(&srq->lock);
	if (slots)
		vt3_buf_free(srq->domain, slots, VT3DV_RES_TYPE_SRQ, custom);
	return ret;
}

int vt3_query_srq(struct ibv_srq *ibsrq, struct ibv_srq_attr *attr)
{
	struct ibv_query_srq cmd = {};

	return ibv_cmd_query_srq(ibsrq, attr, &cmd, sizeof(cmd));
}

static void vt3_srq_doorbell(struct vt3_srq *srq)
{
	struct ibv_recv_wr *bad;
	int ret;

	ret = ibv_cmd_post_srq_recv(&srq->ibv_srq, NULL, &bad);
	/* Should the device be gone, the QPs' flush completes the WRs. */
	if (ret)
		verbs_err(verbs_get_ctx(srq->ibv_srq.context),
			  "libvt3: SRQ doorbell failed: %s\n", strerror(ret));
}

int vt3_post_srq_recv(struct ibv_srq *ibsrq, struct ibv_recv_wr *wr,
		      struct ibv_recv_wr **bad_wr)
{
	struct vt3_srq *srq = to_vt3_srq(ibsrq);
	bool ring = false;
	uint32_t start;
	int ret = 0;

	pthread_spin_lock(&srq->lock);
	start = srq->prod;
	for (; wr; wr = wr->next) {
		struct vt3_srq_slot *slot = &srq->slots[srq->prod & (srq->depth - 1)];
		struct vt3_rq_wqe *wqe = (struct vt3_rq_wqe *)((uint8_t *)srq->ring +
			(size_t)(srq->prod & (srq->depth - 1)) * VT3_WQE_SIZE);

		if (!srq->ring) {
			ret = EIO;	/* a resize lost its mapping */
			break;
		}
		if (slot->owed) {
			ret = ENOMEM;
			break;
		}
		if (wr->num_sge < 0 || (uint32_t)wr->num_sge > srq->max_sge) {
			ret = EINVAL;
			break;
		}
		vt3_fill_recv_wqe(wqe, wr);
		slot->wr_id = wr->wr_id;
		slot->idx = srq->prod;
		slot->owed = true;
		srq->owed++;
		srq->prod++;
	}
	if (srq->prod != start) {
		if (srq->wrcheck)
			vt3_wrcheck_srq_posted(srq, start);
		/* The WQEs before the index that covers them... */
		udma_to_device_barrier();
		vt3_store_release(&srq->status->prod, srq->prod);
		/* ...and the index before the flag: a store-load order. */
		__atomic_thread_fence(__ATOMIC_SEQ_CST);
		ring = le32toh(__atomic_load_n(&srq->status->flags,
					       __ATOMIC_RELAXED)) & VT3_SRQ_F_IDLE;
		/*
		 * A lost device's SRQ: the flusher's CQ completes them; its
		 * next poll looks at its queue again (the flusher is cleared
		 * under this lock before its QP goes). No device event comes:
		 * an application that posts after DEVICE_FATAL polls.
		 */
		if (srq->flusher) {
			vt3_cq_note_repost(srq->flusher);
			ring = false;
		}
	}
	pthread_spin_unlock(&srq->lock);
	if (ret)
		*bad_wr = wr;
	if (ring)
		vt3_srq_doorbell(srq);
	return ret;
}

/*
 * A CQE of an SRQ WQE: completes the slot it names, once, and frees it;
 * *@wr_id is the WR's. False: not to be returned (the slot owes nothing:
 * a lost device's flush completed it, or vt3d named a WQE that is not
 * there). @returned: the completion goes to the application (not when
 * its QP was destroyed first). Called under the CQ's lock.
 */
bool vt3_srq_cqe_taken(struct vt3_srq *srq, uint32_t idx, uint64_t *wr_id,
		       bool returned)
{
	struct vt3_srq_slot *slot;
	bool owed;

	pthread_spin_lock(&srq->lock);
	slot = &srq->slots[idx & (srq->depth - 1)];
	owed = slot->owed && slot->idx == idx;
	if (owed) {
		*wr_id = slot->wr_id;
		slot->owed = false;
		srq->owed--;
		if (srq->wrcheck)
			vt3_wrcheck_srq_completed(srq, idx, returned, false);
	}
	pthread_spin_unlock(&srq->lock);
	return owed;
}

/*
 * Whether @wq's CQ flushes its SRQ (the device is lost): the first RQ to
 * ask claims it. srq->lock held.
 */
static bool vt3_srq_flushes_here(struct vt3_srq *srq, struct vt3_wq *wq)
{
	if (!srq->flusher) {
		srq->flusher = wq;
		/* The oldest slot that can owe anything. */
		srq->flush_pos = srq->prod - srq->depth;
	}
	return srq->flusher == wq;
}

/*
 * A lost device's flush of the SRQ of @wq's QP, from @wq's CQ (its lock
 * and wq->lock held) once its consumer passed the queue's flush mark: up
 * to @num owed slots, in SRQ order, complete with IBV_WC_WR_FLUSH_ERR.
 */
int vt3_srq_flush(struct vt3_wq *wq, int num, struct ibv_wc *wc)
{
	struct vt3_srq *srq = wq->qp->srq;
	int n = 0;

	pthread_spin_lock(&srq->lock);
	if (vt3_srq_flushes_here(srq, wq)) {
		while (n < num && srq->flush_pos != srq->prod) {
			struct vt3_srq_slot *slot =
				&srq->slots[srq->flush_pos & (srq->depth - 1)];

			if (slot->owed && slot->idx == srq->flush_pos) {
				wc[n++] = (struct ibv_wc){
					.wr_id = slot->wr_id,
					.status = IBV_WC_WR_FLUSH_ERR,
					.opcode = IBV_WC_RECV,
					.qp_num = wq->qp->ibv_qp.qp_num,
				};
				slot->owed = false;
				srq->owed--;
				if (srq->wrcheck)
					vt3_wrcheck_srq_completed(srq, srq->flush_pos,
								  true, true);
			}
			srq->flush_pos++;
		}
	}
	pthread_spin_unlock(&srq->lock);
	return n;
}

/* Whether vt3_srq_flush() would return anything for @wq. */
bool vt3_srq_flush_pending(struct vt3_wq *wq)
{
	struct vt3_srq *srq = wq->qp->srq;
	bool pending;

	pthread_spin_lock(&srq->lock);
	pending = srq->owed && (!srq->flusher || srq->flusher == wq);
	pthread_spin_unlock(&srq->lock);
	return pending;
}

/*
 * @wq's QP is being destroyed (its CQ's lock held): should it have been
 * flushing the SRQ, the next QP to flush takes over where it stopped.
 */
void vt3_srq_wq_gone(struct vt3_wq *wq)
{
	struct vt3_srq *srq = wq->qp->srq;

	if (!srq)
		return;
	pthread_spin_lock(&srq->lock);
	if (srq->flusher == wq)
		srq->flusher = NULL;
	pthread_spin_unlock(&srq->lock);
}
