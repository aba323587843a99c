// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
/*
 * libvt3 async events (docs/architecture.md §5): the first of the three flush
 * triggers, and the vendor event LLP_CLOSE_COMPLETE made usable with stock
 * libibverbs.
 *
 * ibv_get_async_event() reads the kernel's event, fills event->element by
 * the event type it knows, and calls this op before it returns. For a type
 * it does not know, which VT3_EVENT_LLP_CLOSE_COMPLETE is, it stores the
 * kernel's 64-bit element (the QP's user handle, i.e. its ibv_qp pointer)
 * into element.port_num, an int: only the low 32 bits survive. We find
 * the QP among the context's QPs by those bits, which no two QPs share
 * (verbs.c allocates them from one small region), and put it into
 * element.qp.
 *
 * Accounting. uverbs counted the event in the QP's events_reported when
 * ibv_get_async_event() read it, and ibv_destroy_qp() waits until
 * qp->events_completed reaches that count. ibv_ack_async_event() only
 * counts the event types libibverbs knows as QP events; for ours it does
 * nothing. So this op counts it, under qp->mutex with qp->cond signaled,
 * exactly as ibv_ack_async_event() would: at get time, since no hook runs
 * at ack time (see vt3dv.h for what that means to an application).
 *
 * Flush: for QP_FATAL, QP_REQ_ERR, QP_ACCESS_ERR and LLP_CLOSE_COMPLETE the
 * QP's queues note the error now (vt3_qp_check_error()); from then on
 * their outstanding WRs are owed as IBV_WC_WR_FLUSH_ERR completions that
 * poll_cq returns after the queue's device CQEs. The note is made once
 * per queue whichever trigger comes first (poll_cq, a post, this op), so
 * a WR completes exactly once. DEVICE_FATAL does the same for every QP of
 * the context.
 */
#include <config.h>

#include <stdint.h>

#include "vt3.h"
#include "vt3dv.h"

static_assert(VT3DV_EVENT_LLP_CLOSE_COMPLETE == VT3_EVENT_LLP_CLOSE_COMPLETE,
	      "vt3dv.h names the kernel's vendor event");

/*
 * The QP whose user handle (its address) has these low 32 bits: QP
 * structs live in one region far smaller than 4 GiB (verbs.c), so there
 * is at most one. Called with ctx->qps_lock held.
 */
static struct vt3_qp *vt3_find_qp(struct vt3_context *ctx, uint32_t handle)
{
	struct vt3_qp *qp;

	list_for_each(&ctx->qps, qp, ctx_entry)
		if ((uint32_t)(uintptr_t)&qp->ibv_qp == handle)
			return qp;
	return NULL;
}

/* What ibv_ack_async_event() does for a QP event (libibverbs device.c). */
static void vt3_qp_event_done(struct ibv_qp *ibqp)
{
	pthread_mutex_lock(&ibqp->mutex);
	++ibqp->events_completed;
	pthread_cond_signal(&ibqp->cond);
	pthread_mutex_unlock(&ibqp->mutex);
}

static void vt3_llp_close_complete(struct vt3_context *ctx,
				   struct ibv_async_event *event)
{
	uint32_t handle = (uint32_t)event->element.port_num;
	struct vt3_qp *qp;

	pthread_mutex_lock(&ctx->qps_lock);
	qp = vt3_find_qp(ctx, handle);
	if (!qp) {
		/* Cannot happen for a QP of ours: uverbs delivers per context. */
		pthread_mutex_unlock(&ctx->qps_lock);
		verbs_err(&ctx->ibv_ctx,
			  "libvt3: LLP_CLOSE_COMPLETE for unknown QP handle %#x\n",
			  handle);
		return;
	}
	if (!(vt3_qp_flags(qp) & VT3_QP_F_ERROR))
		verbs_debug(&ctx->ibv_ctx,
			    "libvt3: LLP_CLOSE_COMPLETE for QP %u without its error flag\n",
			    qp->ibv_qp.qp_num);
	/* Flush first: once counted, ibv_destroy_qp() may free the QP. */
	vt3_qp_check_error(qp, VT3_BY_EVENT);
	event->element.qp = &qp->ibv_qp;
	vt3_qp_event_done(&qp->ibv_qp);
	pthread_mutex_unlock(&ctx->qps_lock);
}

void vt3_async_event(struct ibv_context *ibctx, struct ibv_async_event *event)
{
	struct vt3_context *ctx = to_vt3_ctx(ibctx);
	struct vt3_qp *qp;

	switch ((int)event->event_type) {
	case IBV_EVENT_QP_FATAL:
	case IBV_EVENT_QP_REQ_ERR:
	case IBV_EVENT_QP_ACCESS_ERR:
		/* Not acked yet: ibv_destroy_qp() cannot free it meanwhile. */
		vt3_qp_check_error(to_vt3_qp(event->element.qp), VT3_BY_EVENT);
		break;
	case IBV_EVENT_DEVICE_FATAL:
		pthread_mutex_lock(&ctx->qps_lock);
		list_for_each(&ctx->qps, qp, ctx_entry)
			vt3_qp_check_error(qp, VT3_BY_EVENT);
		pthread_mutex_unlock(&ctx->qps_lock);
		break;
	case VT3_EVENT_LLP_CLOSE_COMPLETE:
		vt3_llp_close_complete(ctx, event);
		break;
	default:
		break;
	}
}
