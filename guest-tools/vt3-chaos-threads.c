// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
/*
 * vt3-chaos: the client's threads: workers that post and busy-poll, the
 * async-event thread, the cq-event thread and the rdma_cm thread.
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include "vt3-chaos.h"
unsigned int ev_bit(int type)
{
	switch (type) {
	case IBV_EVENT_QP_FATAL: return E_FATAL;
	case IBV_EVENT_QP_REQ_ERR: return E_REQ;
	case IBV_EVENT_QP_ACCESS_ERR: return E_ACCESS;
	case EV_LLP_CLOSE_COMPLETE: return E_CLOSE;
	case IBV_EVENT_DEVICE_FATAL: return E_DEVICE;
	default: return 0;
	}
}

const char *ev_bits_str(unsigned int m, char *buf, size_t len)
{
	static const char *const names[] = { "QP_FATAL", "QP_REQ_ERR", "QP_ACCESS_ERR",
					     "LLP_CLOSE_COMPLETE", "DEVICE_FATAL" };
	size_t n = 0;
	int i;

	buf[0] = 0;
	for (i = 0; i < 5; i++)
		if (m & (1u << i))
			n += snprintf(buf + n, len - n, "%s%s", n ? "|" : "", names[i]);
	if (!n)
		snprintf(buf, len, "none");
	return buf;
}

static bool posts_to(struct client *c, int w, int qpi)
{
	struct qp *qp = &c->qps[qpi];

	if (c->plan.nworkers == 1)
		return true;
	/* post and mixed: both workers post to the QP at once. */
	return qp->style == ST_POST || qp->style == ST_MIXED || qpi % 2 == w;
}

static bool polls_cq(struct client *c, int w, int cqi)
{
	int i;

	if (c->cqs[cqi].event)
		return false;
	if (c->plan.nworkers == 1 || cqi % 2 == w)
		return true;
	/* mixed: the other worker polls its CQs too. */
	for (i = 0; i < c->nqp; i++)
		if (c->qps[i].style == ST_MIXED &&
		    (c->qps[i].scq == &c->cqs[cqi] || c->qps[i].rcq == &c->cqs[cqi]))
			return true;
	return false;
}

static bool srq_posts(struct client *c, int w, int si)
{
	int i;

	for (i = 0; i < c->nqp; i++)
		if (c->plan.srq[i] == si && posts_to(c, w, i))
			return true;
	return false;
}

void *worker_thread(void *arg)
{
	struct worker *w = arg;
	struct client *c = w->c;
	int i;

	while (!c->stop) {
		int got = 0;

		for (i = 0; i < c->nqp; i++)
			if (posts_to(c, w->n, i))
				post_some(&c->qps[i]);
		/* An SRQ: by every worker that posts to one of its QPs, at once. */
		for (i = 0; i < c->plan.nsrq; i++)
			if (srq_posts(c, w->n, i))
				srq_post_some(&c->srqs[i]);
		for (i = 0; i < c->plan.ncq; i++)
			if (polls_cq(c, w->n, i))
				got += poll_cq(c, &c->cqs[i], NULL);
		if (!got)
			usleep(200);
	}
	return NULL;
}

static struct qp *qp_of(struct client *c, struct ibv_qp *ibqp)
{
	int i;

	for (i = 0; i < c->nqp; i++)
		if (c->qps[i].qp == ibqp && ibqp)
			return &c->qps[i];
	return NULL;
}

struct qp *qp_of_num(struct client *c, uint32_t qpn)
{
	int i;

	for (i = 0; i < c->nqp; i++)
		if (c->qps[i].qpn == qpn && qpn)
			return &c->qps[i];
	return NULL;
}

static void note_event(struct client *c, struct qp *qp, int type)
{
	unsigned int bit = ev_bit(type);

	if (!bit)
		return;
	qp->nevents++;
	if (!qp->first_event) {
		qp->first_event = bit;
		qp->first_event_at = now();
	}
}

void *async_thread(void *arg)
{
	struct client *c = arg;
	int i;

	while (!c->stop) {
		struct pollfd pfd = { .fd = c->ctx->async_fd, .events = POLLIN };
		struct ibv_async_event ev;
		struct qp *qp = NULL;
		int type;

		if (poll(&pfd, 1, 20) <= 0 || ibv_get_async_event(c->ctx, &ev))
			continue;
		type = ev.event_type;
		vlog("async event %d\n", type);
		switch (type) {
		case EV_LLP_CLOSE_COMPLETE:
		case IBV_EVENT_QP_FATAL:
		case IBV_EVENT_QP_REQ_ERR:
		case IBV_EVENT_QP_ACCESS_ERR:
		case IBV_EVENT_COMM_EST:
		case IBV_EVENT_SQ_DRAINED:
			qp = qp_of(c, ev.element.qp);
			if (!qp) {
				cfail(c, "async event %d: element.qp %p is none of our QPs", type,
				      (void *)ev.element.qp);
				break;
			}
			note_event(c, qp, type);
			break;
		case IBV_EVENT_DEVICE_FATAL:
			c->device_fatal = true;
			for (i = 0; i < c->nqp; i++)
				note_event(c, &c->qps[i], type);
			break;
		case IBV_EVENT_CQ_ERR:
			cfail(c, "CQ_ERR: a CQ overflowed (sized for every WR of its QPs)");
			break;
		case IBV_EVENT_QP_LAST_WQE_REACHED: {
			struct qp *sqp = qp_of(c, ev.element.qp);

			if (sqp)
				srq_last_wqe(c, sqp);
			else
				cfail(c, "LAST_WQE_REACHED: element.qp %p is none of our QPs",
				      (void *)ev.element.qp);
			break;
		}
		case IBV_EVENT_SRQ_LIMIT_REACHED:
		case IBV_EVENT_SRQ_ERR:
			/* No limit is armed; the rings are ours and sound. */
			cfail(c, "%s on an SRQ (%p)", ibv_event_type_str(type), (void *)ev.element.srq);
			break;
		default:
			break;	/* port events */
		}
		if (type != IBV_EVENT_QP_LAST_WQE_REACHED)
			c->events[type == IBV_EVENT_DEVICE_FATAL ? 4 : ev_bit(type) ?
				  __builtin_ctz(ev_bit(type)) : 5]++;
		ibv_ack_async_event(&ev);
		/* async and mixed: this thread polls the QP's CQs at once. */
		if (qp && (qp->style == ST_ASYNC || qp->style == ST_MIXED)) {
			poll_cq(c, qp->scq, NULL);
			if (qp->rcq != qp->scq)
				poll_cq(c, qp->rcq, NULL);
		}
	}
	return NULL;
}

/* Blocks on the completion channel of the cq-event CQs; after a second
 * without a wakeup it polls them anyway (WRs posted to a QP in error
 * complete without an event: no device is involved). */
void *cq_event_thread(void *arg)
{
	struct client *c = arg;
	double last = now();
	int i, ret;

	while (!c->stop) {
		struct pollfd pfd = { .fd = c->cch->fd, .events = POLLIN };
		struct ibv_cq *ecq;
		void *ectx;

		bool channel_gone = false;

		if (poll(&pfd, 1, 20) > 0) {
			if (!ibv_get_cq_event(c->cch, &ecq, &ectx))
				goto event;
			/* A removed device's channel (uverbs disassociated it)
			 * fails at once: poll as an application cleaning up does. */
			channel_gone = true;
			usleep(5000);
		}
		if (!channel_gone && now() - last < 1)
			continue;
		last = now();
		for (i = 0; i < c->plan.ncq; i++) {
			int device_cqes = 0;

			if (!c->cqs[i].event || !poll_cq(c, &c->cqs[i], &device_cqes))
				continue;
			c->fallback_polls++;
			/* A CQE the device wrote to an armed CQ raises an
			 * event; unless it is on its way just now, it is lost. */
			if (device_cqes && !channel_gone && !c->device_fatal && poll(&pfd, 1, 200) <= 0)
				cfail(c, "CQ %d armed, yet no event for %d device completion(s)",
				      i, device_cqes);
		}
		continue;
event:
		last = now();
		c->cq_wakeups++;
		for (i = 0; i < c->plan.ncq; i++) {
			if (c->cqs[i].cq != ecq)
				continue;
			c->cqs[i].unacked++;
			/*
			 * Arm first, then poll: a CQE after the poll wakes us
			 * again. Arming a CQ of a removed device fails with EIO
			 * (uverbs disassociated it), possibly before our async
			 * thread has read the DEVICE_FATAL that came first.
			 */
			ret = ibv_req_notify_cq(ecq, 0);
			if (ret && !c->device_fatal && ret != EIO)
				cfail(c, "ibv_req_notify_cq failed: %s", strerror(ret));
			poll_cq(c, &c->cqs[i], NULL);
		}
	}
	return NULL;
}

void *cm_thread(void *arg)
{
	struct client *c = arg;
	int i;

	while (!c->stop) {
		struct pollfd pfd = { .fd = c->ch->fd, .events = POLLIN };
		struct rdma_cm_event *ev;

		if (poll(&pfd, 1, 20) <= 0 || rdma_get_cm_event(c->ch, &ev))
			continue;
		vlog("cm event %s status %d\n", rdma_event_str(ev->event), ev->status);
		for (i = 0; i < c->nqp; i++) {
			struct qp *qp = &c->qps[i];

			if (qp->id != ev->id)
				continue;
			if (ev->event == RDMA_CM_EVENT_DISCONNECTED ||
			    ev->event == RDMA_CM_EVENT_DEVICE_REMOVAL) {
				/*
				 * As every rdma_cm application does: complete the
				 * close; but never beside rdma_destroy_qp (abort):
				 * rdma_disconnect modifies id->qp, which that frees.
				 */
				pthread_mutex_lock(&qp->lock);
				if (!qp->cm_closed && !qp->gone)
					rdma_disconnect(qp->id);
				qp->cm_closed = true;
				pthread_mutex_unlock(&qp->lock);
			}
		}
		rdma_ack_cm_event(ev);
	}
	return NULL;
}
