// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
/*
 * vt3-chaos: the client's shared receive queues (docs/events.md, "QPs of
 * a shared receive queue"). The rules checked, as vt3 documents them:
 *
 *  - every SRQ WR completes at most once, on a QP attached to its SRQ
 *    (wc.qp_num), on that QP's receive CQ; with SUCCESS it holds the
 *    server's next reply on that QP's connection, intact;
 *  - a QP's error flushes nothing of its SRQ: the one WQE it had taken
 *    (a Send begun, not ended) completes on it in error (WR_FLUSH_ERR or
 *    its own), as its last SRQ completion: so at most one SRQ WR of a QP
 *    completes unsuccessfully, nothing with SUCCESS after it, and before
 *    the end of the run only on a QP the fault may fail;
 *  - a lost device (CQs frozen: device-fatal, vt3d killed, commands
 *    unanswered) is the exception: every SRQ WR not completed by then
 *    completes once with WR_FLUSH_ERR on one QP of the SRQ (besides each
 *    QP's taken WQE), also those posted after the loss;
 *  - IBV_EVENT_QP_LAST_WQE_REACHED once for each SRQ QP that enters
 *    ERROR, after the event that says why (lost device: in any order);
 *    once it was read and the QP's CQ polled, nothing of the SRQ
 *    completes on that QP with SUCCESS any more;
 *  - at the end, posted = completed + left, "left" proved: after every QP
 *    of the SRQ is destroyed, a drain QP on the SRQ is connected to a
 *    sender QP of our own device (loopback, so a dead peer does not
 *    matter), which sends one SEND more than WRs are left. Each left WR
 *    must complete once on the drain QP with the sender's data, and the
 *    last SEND must find no WQE: the drain QP fails with QP_REQ_ERR (DDP
 *    "no buffer" TERMINATE). A WQE lost by vt3d, the provider or a flush
 *    shows as a WR that never completes; one duplicated or not consumed
 *    as a completion twice or a pool that does not run dry. A QP
 *    destroyed before its LAST_WQE_REACHED (the abort fault) takes the
 *    WQEs whose CQEs were still in the ring with it (the verbs' rule):
 *    they are "dropped", at most as many as replies it had not received.
 *    After rmmod there is no device to drain with: what is left is
 *    counted "unproven".
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <arpa/inet.h>

#include "vt3-chaos.h"

#define DRAIN_QPI(s)	(MAX_QPS + (s)->idx)	/* the drain's replies' QP index */

static uint8_t *srq_slot(struct srq *s, uint32_t idx)
{
	return s->buf + (size_t)(idx % SRQ_SLOTS) * RSLOT;
}

/* Where an SRQ WR completed (wrec.by): "q3", "the drain QP", "qp_num 77". */
static const char *by_name(char *buf, size_t len, int by, uint32_t qp_num)
{
	if (by >= 0)
		snprintf(buf, len, "q%d", by);
	else if (by == -2)
		snprintf(buf, len, "the drain QP");
	else
		snprintf(buf, len, "qp_num %u", qp_num);
	return buf;
}

static bool rec_done(const struct wrec *r)
{
	return __atomic_load_n(&r->seen, __ATOMIC_ACQUIRE) || __atomic_load_n(&r->unposted, __ATOMIC_ACQUIRE);
}

int srq_create(struct client *c, struct srq *s)
{
	struct ibv_srq_init_attr attr = { .attr = { .max_wr = SRQ_DEPTH, .max_sge = 1 } };

	s->w = calloc(MAX_SRQ_WR, sizeof(*s->w));
	s->buf = calloc(SRQ_SLOTS, RSLOT);
	s->mr = s->buf ? ibv_reg_mr(c->pd, s->buf, SRQ_SLOTS * RSLOT, IBV_ACCESS_LOCAL_WRITE) : NULL;
	s->srq = s->mr && s->w ? ibv_create_srq(c->pd, &attr) : NULL;
	if (!s->srq) {
		cfail(c, "srq%d: create: %s", s->idx, strerror(errno));
		return -1;
	}
	/* Receives before the connections: the server answers at once. */
	srq_post_some(s);
	return 0;
}

/*
 * Posts one WR to the SRQ, from any thread: the record is reserved by an
 * atomic index, never more than SRQ_DEPTH outstanding (the ring has that
 * room, and each CQ of its QPs too), a receive slot reused only once its
 * last WR completed. False: nothing posted.
 */
static bool srq_post_one(struct srq *s)
{
	struct client *c = s->c;
	uint32_t idx = load(&s->reserved);
	struct ibv_sge sge;
	struct ibv_recv_wr wr = { .sg_list = &sge, .num_sge = 1 }, *bad;
	struct wrec *r;
	int ret;

	do {
		if (idx >= MAX_SRQ_WR || idx - load(&s->done) >= SRQ_DEPTH ||
		    (idx >= SRQ_SLOTS && !rec_done(&s->w[idx - SRQ_SLOTS])))
			return false;
		/* After a device loss a few more, each to be flushed. */
		if (c->device_fatal && load(&s->after_err) >= 2 * SRQ_DEPTH)
			return false;
	} while (!__atomic_compare_exchange_n(&s->reserved, &idx, idx + 1, false, __ATOMIC_ACQ_REL,
					      __ATOMIC_ACQUIRE));
	r = &s->w[idx];
	r->op = OP_RECV;
	r->signaled = 1;
	r->by = -1;
	r->after_err = c->device_fatal;
	sge = (struct ibv_sge){ .addr = (uintptr_t)srq_slot(s, idx), .length = RSLOT, .lkey = s->mr->lkey };
	wr.wr_id = make_wr_id(c, s->idx, SRQ_Q, idx);
	ret = ibv_post_srq_recv(s->srq, &wr, &bad);
	if (ret) {
		__atomic_store_n(&r->unposted, 1, __ATOMIC_RELEASE);
		__atomic_add_fetch(&s->done, 1, __ATOMIC_ACQ_REL);
		/* ENOMEM: the WQE in the slot at the producer index still owes
		 * its completion (SRQ WRs complete out of order). */
		if (ret == ENOMEM)
			s->enomem++;
		else
			cfail(c, "srq%d: ibv_post_srq_recv: %s", s->idx, strerror(ret));
		return false;
	}
	if (r->after_err)
		__atomic_add_fetch(&s->after_err, 1, __ATOMIC_ACQ_REL);
	__atomic_add_fetch(&s->posted_ok, 1, __ATOMIC_ACQ_REL);
	return true;
}

void srq_post_some(struct srq *s)
{
	int i;

	for (i = 0; i < SRQ_DEPTH && !s->c->stop_post; i++)
		if (!srq_post_one(s))
			break;
}

/*
 * A SEND of one of the SRQ's QPs may go: every reply finds a WQE, as no
 * more SENDs are made than WRs were posted (a reply takes one WQE, and
 * nothing else does).
 */
bool srq_send_credit(struct srq *s)
{
	uint32_t n = load(&s->credits);

	do {
		if (n >= load(&s->posted_ok))
			return false;
	} while (!__atomic_compare_exchange_n(&s->credits, &n, n + 1, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE));
	return true;
}

/* One completion of an SRQ WR; under the CQ's lock it came on. */
void srq_account(struct client *c, struct cq *cq, const struct ibv_wc *wc, const bool was_destroyed[])
{
	unsigned int si = (wc->wr_id >> 40) & 0xff;
	uint32_t idx = (uint32_t)wc->wr_id;
	const char *st = ibv_wc_status_str(wc->status);
	bool ok = wc->status == IBV_WC_SUCCESS;
	struct srq *s;
	struct wrec *r;
	struct qp *qp;
	char what[16], first[24], second[24];

	if (si >= (unsigned int)c->plan.nsrq) {
		cfail(c, "completion of unknown SRQ wr_id %#" PRIx64 " (%s, qp_num %u)", wc->wr_id, st, wc->qp_num);
		return;
	}
	s = &c->srqs[si];
	if (idx >= load(&s->reserved) || __atomic_load_n(&s->w[idx].unposted, __ATOMIC_ACQUIRE)) {
		cfail(c, "srq%u: completion of wr %u never posted (%s, qp_num %u)", si, idx, st, wc->qp_num);
		return;
	}
	r = &s->w[idx];
	qp = qp_of_num(c, wc->qp_num);
	pthread_mutex_lock(&s->lock);
	if (r->seen) {
		cfail(c, "srq%u wr %u completed twice: %s on %s, then %s on %s", si, idx,
		      ibv_wc_status_str(r->status), by_name(first, sizeof(first), r->by, r->by_qpn), st,
		      by_name(second, sizeof(second), qp ? qp->idx : -1, wc->qp_num));
		pthread_mutex_unlock(&s->lock);
		return;
	}
	r->status = wc->status;
	r->by = qp ? qp->idx : -1;
	r->by_qpn = wc->qp_num;
	__atomic_store_n(&r->seen, 1, __ATOMIC_RELEASE);
	__atomic_add_fetch(&s->done, 1, __ATOMIC_ACQ_REL);
	if (ok)
		s->ok++;
	else if (wc->status == IBV_WC_WR_FLUSH_ERR)
		s->flush++;
	else
		s->err++;
	pthread_mutex_unlock(&s->lock);
	if (!qp || qp->srq != s) {
		cfail(c, "srq%u wr %u completed (%s) on qp_num %u, %s", si, idx, st, wc->qp_num,
		      qp ? "a QP not attached to it" : "none of our QPs");
		return;
	}
	if (was_destroyed[qp->idx]) {
		cfail(c, "q%d: srq%u wr %u completed (%s) after ibv_destroy_qp returned", qp->idx, si, idx, st);
		return;
	}
	if (qp->rcq != cq)
		cfail(c, "q%d: srq%u wr %u completed on CQ %ld, not the QP's receive CQ", qp->idx, si, idx,
		      (long)(cq - c->cqs));
	if (!ok) {
		qp->srq_unsuccessful++;
		if (wc->status == IBV_WC_WR_FLUSH_ERR)
			qp->srq_flushed++;
		if (c->lost_run)
			return;		/* the lost device's flush: checked at the end */
		if (qp->srq_unsuccessful == 1)	/* QPs of other CQs share s: atomic */
			__atomic_add_fetch(&s->taken, 1, __ATOMIC_RELAXED);
		if (qp->srq_unsuccessful > 1)
			cfail(c, "q%d: srq%u wr %u completed with %s, its SRQ WR #%d in error: a QP's error flushes nothing of its SRQ but the one WQE it had taken",
			      qp->idx, si, idx, st, qp->srq_unsuccessful);
		else if (!c->ending && c->may_fail != -2 && c->may_fail != qp->idx)
			cfail(c, "q%d: srq%u wr %u completed with %s before the end, though the fault may fail %s",
			      qp->idx, si, idx, st, c->may_fail < 0 ? "no QP" : "another QP");
		return;
	}
	if (r->after_err)
		cfail(c, "srq%u wr %u, posted after the device was lost, completed with SUCCESS, want WR_FLUSH_ERR",
		      si, idx);
	if (qp->srq_unsuccessful)
		cfail(c, "q%d: srq%u wr %u completed with SUCCESS after an SRQ WR of the QP completed in error (its last)",
		      qp->idx, si, idx);
	if (qp->last_wqe_polled)
		cfail(c, "q%d: srq%u wr %u completed with SUCCESS after LAST_WQE_REACHED and a poll of its CQ",
		      qp->idx, si, idx);
	snprintf(what, sizeof(what), "srq%u", si);
	check_reply(c, qp, srq_slot(s, idx), wc, what, idx);
}

/* IBV_EVENT_QP_LAST_WQE_REACHED for QP, read by the async thread. */
void srq_last_wqe(struct client *c, struct qp *qp)
{
	c->last_wqe_events++;
	if (!qp->srq) {
		cfail(c, "q%d: LAST_WQE_REACHED, but the QP has no SRQ", qp->idx);
		return;
	}
	if (qp->last_wqe++) {
		cfail(c, "q%d: LAST_WQE_REACHED twice (once per entry into ERROR)", qp->idx);
		return;
	}
	/* Unless its destroy put it in ERROR (the verbs' MODIFY_QP to ERROR). */
	if (!c->lost_run && !c->removed_run && !qp->first_event && !qp->gone)
		cfail(c, "q%d: LAST_WQE_REACHED before the event that says why the QP failed", qp->idx);
	/* vt3d wrote its last CQE for the QP: a poll takes them all. */
	poll_cq(c, qp->rcq, NULL);
	qp->last_wqe_polled = true;
}

/* Whether a QP of an SRQ still owes LAST_WQE_REACHED: every one that
 * entered ERROR and is there to read it (after rmmod uverbs drops events
 * that come once the device is unregistered). */
static bool owes_last_wqe(struct client *c, struct qp *qp)
{
	return qp->srq && !qp->destroyed && !qp->last_wqe && !c->removed_run;
}

/* The end of the reaping: every LAST_WQE_REACHED came; after a lost
 * device, every SRQ WR completed (the flush). */
bool srq_accounted(struct client *c)
{
	int i;

	for (i = 0; i < c->nqp; i++)
		if (owes_last_wqe(c, &c->qps[i]))
			return false;
	for (i = 0; i < c->plan.nsrq && c->lost_run; i++)
		if (load(&c->srqs[i].done) != load(&c->srqs[i].reserved))
			return false;
	return true;
}

void srq_check_last_wqe(struct client *c)
{
	int i;

	for (i = 0; i < c->nqp; i++)
		if (owes_last_wqe(c, &c->qps[i]))
			cfail(c, "q%d: no LAST_WQE_REACHED (a QP of srq%d, in ERROR)", i, c->qps[i].srq->idx);
}

/* ------------------------------------------------------------ the drain */

struct drain {
	struct client *c;
	struct srq *s;
	struct rdma_event_channel *ch;
	struct rdma_cm_id *listen, *passive, *active;
	struct ibv_cq *dcq, *scq;	/* the drain QP's, the sender's */
	struct ibv_mr *mr;
	uint8_t *buf;
	struct qp dq;			/* the drain QP, as check_reply sees it */
	uint32_t sends;
	int first_event;		/* of the drain QP */
	bool last_wqe;
};

/* The connection events of the loopback pair, until both ends are up. */
static int drain_connect(struct drain *d, struct ibv_qp_init_attr *pattr)
{
	struct rdma_conn_param param = { .responder_resources = ORD, .initiator_depth = ORD, .retry_count = 7 };
	bool up[2] = {};
	double until = now() + 30;

	while (!(up[0] && up[1])) {
		struct pollfd pfd = { .fd = d->ch->fd, .events = POLLIN };
		struct rdma_cm_event *ev;
		enum rdma_cm_event_type type;
		struct rdma_cm_id *id;
		int ret = 0;

		if (now() > until || poll(&pfd, 1, 1000) < 0) {
			cfail(d->c, "srq%d drain: the loopback connection is not up in 30 s", d->s->idx);
			return -1;
		}
		if (!(pfd.revents & POLLIN) || rdma_get_cm_event(d->ch, &ev))
			continue;
		type = ev->event;
		id = ev->id;
		if (type == RDMA_CM_EVENT_ADDR_RESOLVED) {
			ret = rdma_resolve_route(id, 5000);
		} else if (type == RDMA_CM_EVENT_ROUTE_RESOLVED) {
			struct ibv_qp_init_attr attr = {
				.send_cq = d->scq, .recv_cq = d->scq, .qp_type = IBV_QPT_RC,
				.cap = { .max_send_wr = d->sends, .max_recv_wr = 1,
					 .max_send_sge = 1, .max_recv_sge = 1 },
			};

			ret = rdma_create_qp(id, d->c->pd, &attr) || rdma_connect(id, &param);
		} else if (type == RDMA_CM_EVENT_CONNECT_REQUEST) {
			d->passive = id;
			ret = rdma_create_qp(id, d->c->pd, pattr) || rdma_accept(id, &param);
		} else if (type == RDMA_CM_EVENT_ESTABLISHED) {
			up[id == d->active] = true;
		} else {
			cfail(d->c, "srq%d drain: %s (status %d) while connecting", d->s->idx,
			      rdma_event_str(type), ev->status);
			ret = -1;
		}
		rdma_ack_cm_event(ev);
		if (ret) {
			if (type != RDMA_CM_EVENT_ESTABLISHED && !d->c->err[0])
				cfail(d->c, "srq%d drain: after %s: %s", d->s->idx, rdma_event_str(type),
				      strerror(errno));
			return -1;
		}
	}
	return 0;
}

/* The sender's SEND k: the reply k of the drain's connection. */
static int drain_send_all(struct drain *d)
{
	uint64_t seed = d->c->plan.seed;
	uint32_t k;

	for (k = 0; k < d->sends; k++) {
		unsigned int len = reply_len(seed, DRAIN_QPI(d->s), k, true);
		uint8_t *p = d->buf + (size_t)k * RSLOT;
		struct msg_hdr h = { .magic = MAGIC, .qpi = DRAIN_QPI(d->s), .len = len, .seq = k,
				     .tag = T_REPLY };
		struct ibv_sge sge = { .addr = (uintptr_t)p, .length = len, .lkey = d->mr->lkey };
		struct ibv_send_wr wr = { .wr_id = k, .sg_list = &sge, .num_sge = 1,
					  .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED }, *bad;

		memcpy(p, &h, sizeof(h));
		fill(p, hash(seed, DRAIN_QPI(d->s), T_REPLY, k), HDR, len);
		if (ibv_post_send(d->active->qp, &wr, &bad)) {
			cfail(d->c, "srq%d drain: posting SEND %u of %u: %s", d->s->idx, k, d->sends,
			      strerror(errno));
			return -1;
		}
	}
	return 0;
}

/* The drain QP's completions: each one a WR still in the SRQ, once. */
static void drain_poll(struct drain *d)
{
	struct srq *s = d->s;
	struct ibv_wc wc[16];
	int n, i;

	while ((n = ibv_poll_cq(d->dcq, 16, wc)) > 0) {
		for (i = 0; i < n; i++) {
			uint32_t idx = (uint32_t)wc[i].wr_id;
			struct wrec *r = &s->w[idx % MAX_SRQ_WR];
			char what[24], first[24];

			if (wc[i].wr_id != make_wr_id(d->c, s->idx, SRQ_Q, idx) || idx >= load(&s->reserved) ||
			    r->unposted) {
				cfail(d->c, "srq%d drain: completion of wr_id %#" PRIx64 " (%s), none of its WRs",
				      s->idx, wc[i].wr_id, ibv_wc_status_str(wc[i].status));
				continue;
			}
			if (r->seen) {
				cfail(d->c, "srq%d wr %u completed twice: %s on %s, then %s on the drain QP",
				      s->idx, idx, ibv_wc_status_str(r->status),
				      by_name(first, sizeof(first), r->by, r->by_qpn), ibv_wc_status_str(wc[i].status));
				continue;
			}
			r->seen = 1;
			r->status = wc[i].status;
			r->by = -2;
			if (wc[i].status != IBV_WC_SUCCESS || wc[i].qp_num != d->dq.qpn) {
				cfail(d->c, "srq%d wr %u left: completed with %s on qp_num %u, want SUCCESS on the drain QP %u",
				      s->idx, idx, ibv_wc_status_str(wc[i].status), wc[i].qp_num, d->dq.qpn);
				continue;
			}
			s->left++;
			snprintf(what, sizeof(what), "srq%d drain", s->idx);
			check_reply(d->c, &d->dq, srq_slot(s, idx), &wc[i], what, idx);
		}
	}
	/* The sender's own completions say nothing of the SRQ. */
	while (ibv_poll_cq(d->scq, 16, wc) > 0)
		;
}

/* Async events until the drain QP's LAST_WQE_REACHED (it failed, and its
 * last CQE is written), polling meanwhile; bounded. */
static void drain_wait(struct drain *d)
{
	struct ibv_context *ctx = d->c->ctx;
	double until = now() + 20;

	while (!d->last_wqe && now() < until) {
		/* Failed, yet no LAST_WQE_REACHED: a little longer only. */
		if (d->first_event && until > now() + 3)
			until = now() + 3;
		struct pollfd pfd = { .fd = ctx->async_fd, .events = POLLIN };
		struct ibv_async_event ev;

		drain_poll(d);
		if (poll(&pfd, 1, 5) <= 0 || ibv_get_async_event(ctx, &ev))
			continue;
		if (ev.element.qp == d->passive->qp) {
			if (ev.event_type == IBV_EVENT_QP_LAST_WQE_REACHED)
				d->last_wqe = true;
			else if (!d->first_event)
				d->first_event = ev.event_type;
		}
		ibv_ack_async_event(&ev);
	}
	drain_poll(d);
}

static void drain_free(struct drain *d)
{
	struct rdma_cm_event *ev;
	int flags;

	/* Events still queued are acknowledged, so the ids can go. */
	flags = d->ch ? fcntl(d->ch->fd, F_GETFL) : 0;
	if (d->ch && fcntl(d->ch->fd, F_SETFL, flags | O_NONBLOCK) == 0)
		while (!rdma_get_cm_event(d->ch, &ev))
			rdma_ack_cm_event(ev);
	if (d->passive) {
		if (d->passive->qp)
			rdma_destroy_qp(d->passive);
		rdma_destroy_id(d->passive);
	}
	if (d->active) {
		if (d->active->qp)
			rdma_destroy_qp(d->active);
		rdma_destroy_id(d->active);
	}
	if (d->listen)
		rdma_destroy_id(d->listen);
	if (d->ch)
		rdma_destroy_event_channel(d->ch);
	if (d->dcq)
		ibv_destroy_cq(d->dcq);
	if (d->scq)
		ibv_destroy_cq(d->scq);
	if (d->mr)
		ibv_dereg_mr(d->mr);
	free(d->buf);
}

/*
 * Proves what the SRQ holds (every QP of it is destroyed): UNSEEN WRs
 * were posted and never completed; the drain QP must take exactly them,
 * less at most DROPPABLE that a QP destroyed before its LAST_WQE_REACHED
 * took with it, and then find the SRQ empty.
 */
static void srq_drain(struct client *c, struct srq *s, uint32_t unseen, uint32_t droppable)
{
	struct drain d = { .c = c, .s = s, .sends = unseen + 1 };
	struct sockaddr_in addr;
	struct ibv_qp_init_attr pattr = { .qp_type = IBV_QPT_RC, .srq = s->srq,
					  .cap = { .max_send_wr = 1, .max_send_sge = 1, .max_recv_sge = 1 } };
	uint32_t i, missing = 0, first_missing = 0;

	memcpy(&addr, &c->local, sizeof(addr));
	addr.sin_port = 0;
	d.dq.idx = DRAIN_QPI(s);
	d.dq.srq = s;		/* its replies are an SRQ QP's: up to RSLOT */
	d.buf = calloc(d.sends, RSLOT);
	d.mr = d.buf ? ibv_reg_mr(c->pd, d.buf, (size_t)d.sends * RSLOT, IBV_ACCESS_LOCAL_WRITE) : NULL;
	d.dcq = ibv_create_cq(c->ctx, unseen + 2, NULL, NULL, 0);
	d.scq = ibv_create_cq(c->ctx, d.sends + 2, NULL, NULL, 0);
	d.ch = rdma_create_event_channel();
	pattr.send_cq = pattr.recv_cq = d.dcq;
	if (!d.mr || !d.dcq || !d.scq || !d.ch ||
	    rdma_create_id(d.ch, &d.listen, NULL, RDMA_PS_TCP) ||
	    rdma_bind_addr(d.listen, (struct sockaddr *)&addr) || rdma_listen(d.listen, 1) ||
	    rdma_create_id(d.ch, &d.active, NULL, RDMA_PS_TCP)) {
		cfail(c, "srq%d drain: setup: %s", s->idx, strerror(errno));
		goto out;
	}
	addr.sin_port = rdma_get_src_port(d.listen);
	if (rdma_resolve_addr(d.active, NULL, (struct sockaddr *)&addr, 5000)) {
		cfail(c, "srq%d drain: rdma_resolve_addr: %s", s->idx, strerror(errno));
		goto out;
	}
	if (drain_connect(&d, &pattr))
		goto out;
	d.dq.qpn = d.passive->qp->qp_num;
	if (drain_send_all(&d))
		goto out;
	drain_wait(&d);
	for (i = 0; i < load(&s->reserved); i++)
		if (!s->w[i].seen && !s->w[i].unposted && !missing++)
			first_missing = i;
	s->dropped = missing;
	if (!d.first_event)
		cfail(c, "srq%d drain: %u SENDs for %u WRs left, %lu taken, and the drain QP did not fail: the SRQ held more WQEs than were left",
		      s->idx, d.sends, unseen, s->left);
	else if (!d.last_wqe)
		cfail(c, "srq%d drain: the drain QP failed (%s), but no LAST_WQE_REACHED", s->idx,
		      ibv_event_type_str(d.first_event));
	else if (d.first_event != IBV_EVENT_QP_REQ_ERR)
		cfail(c, "srq%d drain: the drain QP's error was %s, want QP_REQ_ERR (a SEND found no WQE)",
		      s->idx, d.first_event ? ibv_event_type_str(d.first_event) : "no event");
	if (missing > droppable)
		cfail(c, "srq%d: %u WRs (wr %u first) posted, never completed and not in the SRQ: lost%s",
		      s->idx, missing, first_missing,
		      droppable ? " (more than an aborted QP can have taken)" : "");
out:
	drain_free(&d);
}

/*
 * The end of an SRQ: every QP of it is destroyed. What it holds is
 * accounted (see the top of this file), then it is destroyed.
 */
void srq_end(struct client *c, struct srq *s)
{
	uint32_t i, unseen = 0, droppable = 0;
	int many = 0;

	if (!s->srq)
		goto out;
	for (i = 0; i < load(&s->reserved); i++)
		unseen += !s->w[i].seen && !s->w[i].unposted;
	for (i = 0; i < (uint32_t)c->nqp; i++) {
		struct qp *qp = &c->qps[i];

		if (qp->srq != s)
			continue;
		many += qp->srq_flushed > 1;
		if (qp->aborted) {
			/* At most the replies it was owed and did not see. */
			if (qp->nsend > qp->nrecv_ok + qp->srq_unsuccessful)
				droppable += qp->nsend - qp->nrecv_ok - qp->srq_unsuccessful;
		}
	}
	if (!c->t0) {
		/* The run never started: nothing to prove. */
	} else if (c->lost_run) {
		if (unseen)
			cfail(c, "srq%d: %u WRs never completed after the device was lost (want each flushed once)",
			      s->idx, unseen);
		if (many > 1)
			cfail(c, "srq%d: the lost device's flush came on %d QPs, want one", s->idx, many);
	} else if (c->removed_run) {
		s->left = unseen;	/* no device left to drain with */
	} else {
		srq_drain(c, s, unseen, droppable);
	}
	if (ibv_destroy_srq(s->srq) && !c->device_fatal)
		cfail(c, "srq%d: ibv_destroy_srq: %s", s->idx, strerror(errno));
out:
	if (s->mr)
		ibv_dereg_mr(s->mr);
	free(s->buf);
}

/* "srqs N: P posted O ok F flushed E error L left D dropped T taken" */
void srq_counts(struct client *c, char *buf, size_t len)
{
	unsigned long t[7] = {};
	int i;

	for (i = 0; i < c->plan.nsrq; i++) {
		struct srq *s = &c->srqs[i];

		t[0] += s->posted_ok;
		t[1] += s->ok;
		t[2] += s->flush;
		t[3] += s->err;
		t[4] += s->left;
		t[5] += s->dropped;
		t[6] += s->taken;
	}
	snprintf(buf, len, "srqs %d: %lu posted %lu ok %lu flushed %lu error %lu left %lu dropped %lu taken%s",
		 c->plan.nsrq, t[0], t[1], t[2], t[3], t[4], t[5], t[6],
		 c->removed_run && c->plan.nsrq ? " unproven" : "");
}
