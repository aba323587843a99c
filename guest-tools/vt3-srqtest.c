// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
/*
 * vt3-srqtest: shared receive queue conformance over two real connections
 * (docs/architecture.md §3.4, docs/events.md). librdmacm + libibverbs.
 *
 *   vt3-srqtest srq  [--port P] [--timeout S] [--fault-wait S] [--lost|--lost-errored] [-v]
 *   vt3-srqtest peer --server IP [--port P] [--timeout S]
 *
 * The srq side is the one under test: it listens, and for the first
 * connection request creates a PD, one SRQ and the CQs on the request's
 * device; both QPs it accepts take their receives from that SRQ. The peer
 * (any iWARP device) connects two QPs and sends what the srq side asks
 * for, in messages the srq side verifies: SENDs of MSG_SIZE bytes, a
 * header (magic, QP index, sequence number) and a pattern of both.
 * The srq side steers the peer with SENDs on QP 2 ("send n1 on QP 1, n2
 * on QP 2", or "done"); the peer's receives are its own RQ. The peer
 * sends first on each QP (message 0, as soon as it is connected): an MPA
 * responder may not send before the initiator's first FPDU (RFC 5044),
 * and siw as the initiator sends none of its own (no RTR).
 * The srq side posts 34 WRs before it accepts the first connection.
 *
 * Steps of the srq side, each a check:
 *  create/query  ibv_create_srq, ibv_query_srq (max_wr, max_sge, limit 0)
 *  modify        ibv_modify_srq(IBV_SRQ_LIMIT) arms; query shows the limit
 *  shared        2 + 20 SENDs over both QPs: each lands once in an SRQ WR of
 *                ours, on the QP it was sent on, in order per QP, intact
 *  limit         5 more: IBV_EVENT_SRQ_LIMIT_REACHED once (element.srq),
 *                none for 2 more (disarmed: the query says limit 0), once
 *                again after re-arming
 *  last-wqe      RST on QP 1 (vt3d ctl fault rst from the host, after the
 *                line "READY <qpn1> <qpn2>"): QP_FATAL, then
 *                QP_LAST_WQE_REACHED, on QP 1 (element.qp); of the SRQ's
 *                WRs at most one completes on QP 1 (the one it had
 *                taken, FLUSH_ERR), none flushed
 *  survive       every SRQ WR still posted is consumed by QP 2: the peer
 *                sends exactly that many, each lands once, intact
 *  resize-einval ibv_modify_srq(IBV_SRQ_MAX_WR) below the WRs posted and
 *                not completed: EINVAL, the size as it was
 *  resize        twice the size while the peer SENDs on QP 2: query says so
 *  resize-post   more WRs posted than the old ring held
 *  resize-traffic every WR posted before and after completes once, in
 *                order, intact
 *  resize-smaller a max_wr the SRQ holds: success, the size kept
 *  busy          ibv_destroy_srq with QPs attached fails with EBUSY
 *  destroy       WRs posted then never taken complete nowhere; QPs and
 *                SRQ destroyed; every WR completed at most once, and
 *                exactly once unless still posted at the destroy
 * With --lost, after "shared" the srq side posts more, prints
 * "READY-LOST <qpn1> <qpn2>" and the host makes its device fatal (vt3d
 * ctl fault device-fatal): the device-loss rule of docs/architecture.md §10, checked as
 *  lost-events   QP_LAST_WQE_REACHED on both QPs and DEVICE_FATAL
 *  lost-post     a post after the loss is taken
 *  lost-flush    every SRQ WR completes once, IBV_WC_WR_FLUSH_ERR, all on
 *                one of the two QPs (the first whose flush ran), none twice
 *  lost-once     nothing more completes; every WR exactly once
 * --lost-errored moves both QPs to ERR first and polls the CQ, so libvt3
 * notes their errors while the device lives (lost-errored: nothing of the
 * SRQ completes); the loss must still flush every SRQ WR on one QP.
 * One line per check ("ok   NAME" / "FAIL NAME: why"), then
 * "vt3-srqtest: N passed, N failed"; exit 1 on a failure.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netdb.h>

#define VT3_CHECK_PROG "vt3-srqtest"
#include "vt3-check.h"

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#define MAGIC		0x76743373u	/* "vt3s" */
#define MSG_SIZE	256
#define SRQ_WR		64		/* asked; the SRQ may be deeper */
#define N_WRID		256		/* SRQ WRs of a run, wr_id 1..N_WRID */
#define CTRL_RECV	8
#define CQ_DEPTH	256

enum { CTRL_SEND = 1, CTRL_DONE = 2 };

struct ctrl {
	uint32_t magic;
	uint32_t op;
	uint32_t n[2];			/* SENDs to make on QP 1 and QP 2 */
};

struct msg {
	uint32_t magic;
	uint32_t qp;			/* 0 or 1 */
	uint32_t seq;
	uint32_t len;
};

static int timeout_s = 60;
static bool lost_mode;
static bool lost_errored;
static int fault_wait_s = 60;
static bool verbose;

static struct rdma_cm_event *cm_wait(struct rdma_event_channel *ch,
				     enum rdma_cm_event_type want)
{
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	struct rdma_cm_event *ev;

	if (poll(&p, 1, timeout_s * 1000) != 1) {
		errno = ETIMEDOUT;
		return NULL;
	}
	if (rdma_get_cm_event(ch, &ev))
		return NULL;
	if (ev->event != want) {
		printf("cm: %s (status %d), wanted %s\n", rdma_event_str(ev->event),
		       ev->status, rdma_event_str(want));
		rdma_ack_cm_event(ev);
		errno = EPROTO;
		return NULL;
	}
	return ev;
}

static void fill(uint8_t *buf, uint32_t qp, uint32_t seq)
{
	struct msg *m = (struct msg *)buf;
	uint32_t i;

	m->magic = MAGIC;
	m->qp = qp;
	m->seq = seq;
	m->len = MSG_SIZE;
	for (i = sizeof(*m); i < MSG_SIZE; i++)
		buf[i] = (uint8_t)(i * 7 + qp * 31 + seq * 13);
}

static bool intact(const uint8_t *buf, uint32_t qp, uint32_t seq)
{
	const struct msg *m = (const struct msg *)buf;
	uint32_t i;

	if (m->magic != MAGIC || m->qp != qp || m->seq != seq || m->len != MSG_SIZE)
		return false;
	for (i = sizeof(*m); i < MSG_SIZE; i++)
		if (buf[i] != (uint8_t)(i * 7 + qp * 31 + seq * 13))
			return false;
	return true;
}

/* ---------------------------------------------------------------- srq side */

struct srqside {
	struct rdma_event_channel *ch;
	struct rdma_cm_id *listen, *id[2];
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_srq *srq;
	struct ibv_cq *rcq, *scq;
	struct ibv_mr *mr;
	uint8_t *buf;			/* N_WRID receive slots, then ctrl */
	uint32_t max_wr;
	uint32_t next_wrid;		/* 1 up */
	uint32_t posted;		/* SRQ WRs not completed */
	uint8_t done[N_WRID + 1];	/* completions per wr_id */
	uint32_t seq[2];		/* next expected per QP */
	int bad_data, wrong_qp, dup, unknown, flushed_qp1, other_err;
};

static uint8_t *slot_of(struct srqside *s, uint32_t wrid)
{
	return s->buf + (size_t)(wrid - 1) * MSG_SIZE;
}

static int srq_post(struct srqside *s, int n)
{
	while (n--) {
		struct ibv_sge sge;
		struct ibv_recv_wr wr = {}, *bad;
		uint32_t wrid = s->next_wrid;

		if (wrid > N_WRID) {
			errno = ENOSPC;
			return -1;
		}
		sge.addr = (uintptr_t)slot_of(s, wrid);
		sge.length = MSG_SIZE;
		sge.lkey = s->mr->lkey;
		memset(slot_of(s, wrid), 0, MSG_SIZE);
		wr.wr_id = wrid;
		wr.sg_list = &sge;
		wr.num_sge = 1;
		errno = ibv_post_srq_recv(s->srq, &wr, &bad);
		if (errno)
			return -1;
		s->next_wrid++;
		s->posted++;
	}
	return 0;
}

/* One receive completion, accounted for; returns its QP index, or -1. */
static int srq_account(struct srqside *s, const struct ibv_wc *wc)
{
	uint32_t qpn[2] = { s->id[0] ? s->id[0]->qp->qp_num : 0,
			    s->id[1]->qp->qp_num };
	int q = wc->qp_num == qpn[0] ? 0 : wc->qp_num == qpn[1] ? 1 : -1;

	if (wc->wr_id < 1 || wc->wr_id >= s->next_wrid) {
		s->unknown++;
		printf("completion of unknown wr_id %" PRIu64 "\n", wc->wr_id);
		return -1;
	}
	if (s->done[wc->wr_id]++) {
		s->dup++;
		printf("wr_id %" PRIu64 " completed %u times\n", wc->wr_id, s->done[wc->wr_id]);
		return -1;
	}
	s->posted--;
	if (q < 0) {
		s->wrong_qp++;
		printf("wr_id %" PRIu64 " completed on QP %u, none of ours\n", wc->wr_id, wc->qp_num);
		return -1;
	}
	if (wc->status != IBV_WC_SUCCESS) {
		if (q == 0 && wc->status == IBV_WC_WR_FLUSH_ERR)
			s->flushed_qp1++;
		else
			s->other_err++;
		if (verbose || q != 0)
			printf("wr_id %" PRIu64 " on QP %d: %s\n", wc->wr_id, q + 1,
			       ibv_wc_status_str(wc->status));
		return -1;
	}
	if (wc->opcode != IBV_WC_RECV || wc->byte_len != MSG_SIZE ||
	    !intact(slot_of(s, wc->wr_id), q, s->seq[q])) {
		s->bad_data++;
		printf("wr_id %" PRIu64 " on QP %d: opcode %d, %u bytes, not message %u intact\n",
		       wc->wr_id, q + 1, wc->opcode, wc->byte_len, s->seq[q]);
	}
	s->seq[q]++;
	return q;
}

/* Polls until @want receives came (or the time is up); returns how many. */
static int srq_reap(struct srqside *s, int want, double secs)
{
	double end = now() + secs;
	struct ibv_wc wc[16];
	int got = 0, n, i;

	while (got < want && now() < end) {
		n = ibv_poll_cq(s->rcq, 16, wc);
		if (n < 0) {
			printf("ibv_poll_cq: %d\n", n);
			return got;
		}
		for (i = 0; i < n; i++) {
			srq_account(s, &wc[i]);
			got++;
		}
		if (!n)
			usleep(1000);
	}
	return got;
}

/* Sends control message @c on QP 2 and reaps its send completion. */
static int srq_ctrl(struct srqside *s, uint32_t op, uint32_t n1, uint32_t n2)
{
	struct ctrl *c = (struct ctrl *)(s->buf + (size_t)N_WRID * MSG_SIZE);
	struct ibv_sge sge = { (uintptr_t)c, sizeof(*c), s->mr->lkey };
	struct ibv_send_wr wr = {}, *bad;
	double end = now() + timeout_s;
	struct ibv_wc wc;
	int n;

	*c = (struct ctrl){ MAGIC, op, { n1, n2 } };
	wr.wr_id = 0xc0;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_SEND;
	wr.send_flags = IBV_SEND_SIGNALED;
	errno = ibv_post_send(s->id[1]->qp, &wr, &bad);
	if (errno)
		return -1;
	while (now() < end) {
		n = ibv_poll_cq(s->scq, 1, &wc);
		if (n == 1)
			return wc.status == IBV_WC_SUCCESS ? 0 : (errno = EIO, -1);
		if (n < 0)
			return -1;
		usleep(1000);
	}
	errno = ETIMEDOUT;
	return -1;
}

/* The next async event within @secs: 0 and *ev filled, or -1 (none). */
static int async_next(struct ibv_context *ctx, struct ibv_async_event *ev,
		      double secs)
{
	struct pollfd p = { .fd = ctx->async_fd, .events = POLLIN };

	if (poll(&p, 1, (int)(secs * 1000)) != 1)
		return -1;
	if (ibv_get_async_event(ctx, ev))
		return -1;
	return 0;
}

/* Counts SRQ_LIMIT_REACHED events of our SRQ within @secs; others printed. */
static int count_limit_events(struct srqside *s, double secs, int *wrong)
{
	double end = now() + secs;
	struct ibv_async_event ev;
	int n = 0;

	while (now() < end) {
		if (async_next(s->ctx, &ev, end - now()))
			break;
		if (ev.event_type == IBV_EVENT_SRQ_LIMIT_REACHED) {
			if (ev.element.srq == s->srq)
				n++;
			else
				(*wrong)++;
		} else {
			printf("unexpected async event %s\n", ibv_event_type_str(ev.event_type));
			(*wrong)++;
		}
		ibv_ack_async_event(&ev);
	}
	return n;
}

static void srq_setup(struct srqside *s, struct ibv_context *ctx)
{
	struct ibv_srq_init_attr init = { .attr = { .max_wr = SRQ_WR, .max_sge = 1 } };
	struct ibv_srq_attr attr = {};
	int ret;

	s->ctx = ctx;
	fcntl(ctx->async_fd, F_SETFL, fcntl(ctx->async_fd, F_GETFL) | O_NONBLOCK);
	s->pd = ibv_alloc_pd(ctx);
	s->rcq = ibv_create_cq(ctx, CQ_DEPTH, NULL, NULL, 0);
	s->scq = ibv_create_cq(ctx, CQ_DEPTH, NULL, NULL, 0);
	s->buf = calloc(N_WRID + 1, MSG_SIZE);
	if (!s->pd || !s->rcq || !s->scq || !s->buf)
		die("PD/CQs");
	s->mr = ibv_reg_mr(s->pd, s->buf, (size_t)(N_WRID + 1) * MSG_SIZE,
			   IBV_ACCESS_LOCAL_WRITE);
	if (!s->mr)
		die("ibv_reg_mr");
	s->srq = ibv_create_srq(s->pd, &init);
	check(s->srq != NULL, "create", "ibv_create_srq: %s", strerror(errno));
	if (!s->srq)
		die("no SRQ");
	ret = ibv_query_srq(s->srq, &attr);
	check(!ret && attr.max_wr >= SRQ_WR && attr.max_sge >= 1 && attr.srq_limit == 0 &&
	      init.attr.max_wr >= SRQ_WR && init.attr.max_wr <= N_WRID,
	      "query", "ret %d, max_wr %u (create said %u), max_sge %u, srq_limit %u",
	      ret, attr.max_wr, init.attr.max_wr, attr.max_sge, attr.srq_limit);
	s->max_wr = attr.max_wr;
	s->next_wrid = 1;
}

static struct rdma_cm_id *srq_accept(struct srqside *s)
{
	struct rdma_conn_param param = { .responder_resources = 1, .initiator_depth = 1 };
	struct ibv_qp_init_attr qa = {};
	struct rdma_cm_event *ev;
	struct rdma_cm_id *id;

	ev = cm_wait(s->ch, RDMA_CM_EVENT_CONNECT_REQUEST);
	if (!ev)
		die("connect request");
	id = ev->id;
	rdma_ack_cm_event(ev);
	if (!s->srq) {
		srq_setup(s, id->verbs);
		/* Before the peer's first message. */
		if (srq_post(s, 34))
			die("ibv_post_srq_recv");
	}
	if (id->verbs != s->ctx) {
		errno = EXDEV;
		die("second connection on another device");
	}
	qa.send_cq = s->scq;
	qa.recv_cq = s->rcq;
	qa.srq = s->srq;
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = 8;
	qa.cap.max_send_sge = 1;
	if (rdma_create_qp(id, s->pd, &qa))
		die("rdma_create_qp with an SRQ");
	if (rdma_accept(id, &param))
		die("rdma_accept");
	ev = cm_wait(s->ch, RDMA_CM_EVENT_ESTABLISHED);
	if (!ev)
		die("established");
	rdma_ack_cm_event(ev);
	return id;
}

/* --lost: accounts for @n completions of the lost device's flush. */
static void lost_account(struct srqside *s, const struct ibv_wc *wc, int n, const uint32_t qpn[2],
			 uint32_t on[2], uint32_t *flushes)
{
	int i;

	for (i = 0; i < n; i++) {
		if (wc[i].wr_id < 1 || wc[i].wr_id >= s->next_wrid || s->done[wc[i].wr_id]++) {
			s->dup++;
			continue;
		}
		s->posted--;
		if (wc[i].status == IBV_WC_WR_FLUSH_ERR)
			(*flushes)++;
		else
			printf("wr_id %" PRIu64 ": %s\n", wc[i].wr_id, ibv_wc_status_str(wc[i].status));
		if (wc[i].qp_num == qpn[0])
			on[0]++;
		else if (wc[i].qp_num == qpn[1])
			on[1]++;
	}
}

/*
 * --lost: the device is made fatal under the SRQ (vt3_hw.h device loss).
 * The CQ is polled while it happens, until the first async event: a
 * poller may see the QPs' error flags (vt3d sets them) before vt3.ko
 * freezes the CQs, and the SRQ's flush must still come.
 */
static int run_lost(struct srqside *s)
{
	struct ibv_async_event ev;
	bool last[2] = { false, false }, fatal = false;
	const uint32_t qpn[2] = { s->id[0]->qp->qp_num, s->id[1]->qp->qp_num };
	struct pollfd async = { .fd = s->ctx->async_fd, .events = POLLIN };
	double end;
	int got = 0, n, i, wrong = 0, ret;
	struct ibv_wc wc[16];
	uint32_t on[2] = { 0, 0 }, flushes = 0, want, polls = 0;

	if (srq_post(s, 8))
		die("ibv_post_srq_recv");
	if (lost_errored) {
		struct ibv_qp_attr attr = { .qp_state = IBV_QPS_ERR };

		for (i = 0; i < 2; i++)
			if (ibv_modify_qp(s->id[i]->qp, &attr, IBV_QP_STATE))
				die("ibv_modify_qp to ERR");
		/* libvt3 notes both errors while the device lives. */
		n = ibv_poll_cq(s->rcq, 16, wc);
		check(n == 0, "lost-errored", "%d completions once both QPs were in ERR, want none "
		      "(a QP error flushes nothing of its SRQ)", n);
	}
	printf("READY-LOST %u %u\n", qpn[0], qpn[1]);
	fflush(stdout);
	end = now() + fault_wait_s;
	while (now() < end && poll(&async, 1, 0) == 0) {
		n = ibv_poll_cq(s->rcq, 16, wc);
		if (n < 0)
			break;
		lost_account(s, wc, n, qpn, on, &flushes);
		got += n;
		polls++;
	}
	if (verbose)
		printf("%u polls before the first async event, %d completions\n", polls, got);
	while (now() < end && !(fatal && last[0] && last[1])) {
		if (async_next(s->ctx, &ev, end - now()))
			break;
		if (ev.event_type == IBV_EVENT_DEVICE_FATAL)
			fatal = true;
		else if (ev.event_type == IBV_EVENT_QP_LAST_WQE_REACHED &&
			 (ev.element.qp == s->id[0]->qp || ev.element.qp == s->id[1]->qp))
			last[ev.element.qp == s->id[1]->qp] = true;
		else if (ev.event_type != IBV_EVENT_QP_FATAL && ev.event_type != IBV_EVENT_PORT_ERR)
			wrong++;
		if (verbose || wrong)
			printf("async event %s\n", ibv_event_type_str(ev.event_type));
		ibv_ack_async_event(&ev);
	}
	check(fatal && last[0] && last[1] && !wrong, "lost-events",
	      "DEVICE_FATAL %s, LAST_WQE_REACHED on QP 1 %s, on QP 2 %s, %d unexpected",
	      fatal ? "yes" : "no", last[0] ? "yes" : "no", last[1] ? "yes" : "no", wrong);
	ret = srq_post(s, 2);
	check(!ret, "lost-post", "ibv_post_srq_recv after the loss: %s", strerror(errno));
	want = s->posted + got;
	/* Every owed SRQ WR comes back once, flushed, on one QP. */
	end = now() + timeout_s;
	while ((uint32_t)got < want && now() < end) {
		n = ibv_poll_cq(s->rcq, 16, wc);
		if (n < 0)
			break;
		lost_account(s, wc, n, qpn, on, &flushes);
		got += n;
		if (!n)
			usleep(1000);
	}
	check((uint32_t)got == want && flushes == want && !s->dup && (on[0] == want || on[1] == want),
	      "lost-flush", "%d of %u completions, %u FLUSH_ERR, %d unknown or twice, %u on QP 1, %u on QP 2 "
	      "(all on one wanted)", got, want, flushes, s->dup, on[0], on[1]);
	got = srq_reap(s, 1, 1.5);
	for (i = 1, n = 0; i < (int)s->next_wrid; i++)
		n += s->done[i] == 1;
	check(got == 0 && !s->dup && s->posted == 0 && n == (int)s->next_wrid - 1, "lost-once",
	      "%d more completions, %d twice, %u never completed, %d of %u exactly once", got, s->dup,
	      s->posted, n, s->next_wrid - 1);
	rdma_destroy_qp(s->id[0]);
	rdma_destroy_qp(s->id[1]);
	ibv_destroy_srq(s->srq);
	rdma_destroy_id(s->id[0]);
	rdma_destroy_id(s->id[1]);
	ibv_dereg_mr(s->mr);
	ibv_destroy_cq(s->rcq);
	ibv_destroy_cq(s->scq);
	ibv_dealloc_pd(s->pd);
	rdma_destroy_id(s->listen);
	return check_summary();
}

/*
 * resize (after "exactly-once": QP 2 alone, nothing posted): RESIZE_POST
 * posted; a max_wr below them is EINVAL; the peer starts RESIZE_FIRST
 * SENDs and the SRQ is resized to twice its size meanwhile; RESIZE_MORE
 * posted on top (more than the old ring held); the peer sends the rest:
 * every WR completes once, in order, intact. Then a smaller max_wr
 * changes nothing (vt3 never shrinks).
 */
#define RESIZE_POST	40
#define RESIZE_FIRST	30
#define RESIZE_MORE	80

static void run_resize(struct srqside *s)
{
	struct ibv_srq_attr attr = { .max_wr = RESIZE_POST - 1 };
	uint32_t want = 2 * s->max_wr, seq0 = s->seq[1], i;
	int ret, got, once;

	if (srq_post(s, RESIZE_POST))
		die("ibv_post_srq_recv");
	ret = ibv_modify_srq(s->srq, &attr, IBV_SRQ_MAX_WR);
	memset(&attr, 0, sizeof(attr));
	check(ret == EINVAL && !ibv_query_srq(s->srq, &attr) && attr.max_wr == s->max_wr,
	      "resize-einval", "max_wr %d with %d posted: %s (EINVAL wanted), then max_wr %u (%u wanted)",
	      RESIZE_POST - 1, RESIZE_POST, ret ? strerror(ret) : "resized", attr.max_wr, s->max_wr);
	if (srq_ctrl(s, CTRL_SEND, 0, RESIZE_FIRST))
		die("control SEND");
	attr.max_wr = want;
	ret = ibv_modify_srq(s->srq, &attr, IBV_SRQ_MAX_WR);
	memset(&attr, 0, sizeof(attr));
	check(!ret && !ibv_query_srq(s->srq, &attr) && attr.max_wr >= want, "resize",
	      "ibv_modify_srq(max_wr %u) while the peer sends: %s, then max_wr %u", want,
	      ret ? strerror(ret) : "ok", attr.max_wr);
	ret = srq_post(s, RESIZE_MORE);
	check(!ret, "resize-post", "%d more posts after the resize (%u posted, the old ring held %u): %s",
	      RESIZE_MORE, s->posted, s->max_wr, ret ? strerror(errno) : "ok");
	if (ret)
		die("ibv_post_srq_recv");
	if (srq_ctrl(s, CTRL_SEND, 0, RESIZE_POST + RESIZE_MORE - RESIZE_FIRST))
		die("control SEND");
	got = srq_reap(s, RESIZE_POST + RESIZE_MORE, timeout_s);
	for (i = 1, once = 0; i < s->next_wrid; i++)
		once += s->done[i] == 1;
	check(got == RESIZE_POST + RESIZE_MORE && s->posted == 0 &&
	      s->seq[1] == seq0 + RESIZE_POST + RESIZE_MORE && !s->bad_data && !s->dup &&
	      !s->wrong_qp && !s->unknown && !s->other_err && once == (int)s->next_wrid - 1,
	      "resize-traffic", "%d of %d completions across the resize; QP 2 %u of %u in order; %u posted, "
	      "%d bad, %d twice, %d wrong QP, %d unknown, %d errors; %d of %u exactly once", got,
	      RESIZE_POST + RESIZE_MORE, s->seq[1] - seq0, RESIZE_POST + RESIZE_MORE, s->posted,
	      s->bad_data, s->dup, s->wrong_qp, s->unknown, s->other_err, once, s->next_wrid - 1);
	attr.max_wr = 4;
	ret = ibv_modify_srq(s->srq, &attr, IBV_SRQ_MAX_WR);
	memset(&attr, 0, sizeof(attr));
	check(!ret && !ibv_query_srq(s->srq, &attr) && attr.max_wr >= want, "resize-smaller",
	      "max_wr 4 with nothing posted: %s, then max_wr %u (%u kept wanted)",
	      ret ? strerror(ret) : "ok", attr.max_wr, want);
}

static int run_srq(const char *port)
{
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons(atoi(port)) };
	struct srqside s = {};
	struct ibv_srq_attr attr = {};
	struct ibv_async_event ev;
	int wrong = 0, n, got, ret, i;
	bool fatal = false, last = false, order = true;

	s.ch = rdma_create_event_channel();
	if (!s.ch || rdma_create_id(s.ch, &s.listen, NULL, RDMA_PS_TCP) ||
	    rdma_bind_addr(s.listen, (struct sockaddr *)&sin) || rdma_listen(s.listen, 4))
		die("listen");
	printf("LISTENING %s\n", port);
	fflush(stdout);
	s.id[0] = srq_accept(&s);
	s.id[1] = srq_accept(&s);

	/* modify: arm at 8; query shows it. */
	attr.srq_limit = 8;
	ret = ibv_modify_srq(s.srq, &attr, IBV_SRQ_LIMIT);
	memset(&attr, 0, sizeof(attr));
	check(!ret && !ibv_query_srq(s.srq, &attr) && attr.srq_limit == 8, "modify",
	      "ibv_modify_srq: %d, query: srq_limit %u", ret, attr.srq_limit);

	/* shared: the first on each QP and 10 more, 34 posted: 12 left, above the limit. */
	if (srq_ctrl(&s, CTRL_SEND, 10, 10))
		die("control SEND");
	got = srq_reap(&s, 22, timeout_s);
	check(got == 22 && s.seq[0] == 11 && s.seq[1] == 11 && !s.bad_data && !s.dup &&
	      !s.wrong_qp && !s.unknown && !s.other_err && !s.flushed_qp1 && s.posted == 12,
	      "shared", "%d of 22 completions; QP 1 %u, QP 2 %u in order; %d bad, %d twice, %d wrong QP, "
	      "%d unknown, %d errors; %u still posted (12 wanted)", got, s.seq[0], s.seq[1],
	      s.bad_data, s.dup, s.wrong_qp, s.unknown, s.other_err + s.flushed_qp1, s.posted);
	n = count_limit_events(&s, 0.5, &wrong);
	check(n == 0 && !wrong, "limit-not-yet", "%d limit events with 12 of limit 8 posted", n);
	if (lost_mode)
		return run_lost(&s);

	/* limit: 5 more leave 7 < 8: one event; 2 more: none (disarmed). */
	if (srq_ctrl(&s, CTRL_SEND, 0, 5))
		die("control SEND");
	got = srq_reap(&s, 5, timeout_s);
	n = count_limit_events(&s, 3, &wrong);
	check(got == 5 && n == 1 && !wrong && s.posted == 7, "limit",
	      "%d of 5 completions, %d limit events (1 wanted), %d other events, %u posted", got, n,
	      wrong, s.posted);
	if (srq_ctrl(&s, CTRL_SEND, 0, 2))
		die("control SEND");
	got = srq_reap(&s, 2, timeout_s);
	n = count_limit_events(&s, 1.5, &wrong);
	check(got == 2 && n == 0 && !wrong, "limit-once", "%d of 2 completions, %d limit events after the first (0 wanted)",
	      got, n);
	memset(&attr, 0, sizeof(attr));
	check(!ibv_query_srq(s.srq, &attr) && attr.srq_limit == 0, "limit-query",
	      "srq_limit %u after the event (0: disarmed)", attr.srq_limit);
	/* Re-armed at 4 with 5 posted: 2 more leave 3 < 4. */
	attr.srq_limit = 4;
	ret = ibv_modify_srq(s.srq, &attr, IBV_SRQ_LIMIT);
	if (!ret && srq_ctrl(&s, CTRL_SEND, 0, 2))
		die("control SEND");
	got = ret ? 0 : srq_reap(&s, 2, timeout_s);
	n = count_limit_events(&s, 3, &wrong);
	check(!ret && got == 2 && n == 1 && !wrong && s.posted == 3, "limit-rearm",
	      "modify %d, %d of 2 completions, %d limit events (1 wanted), %u posted", ret, got, n, s.posted);
	check(!s.bad_data && !s.dup && !s.wrong_qp && !s.unknown && !s.other_err && !s.flushed_qp1,
	      "limit-data", "%d bad, %d twice, %d wrong QP, %d unknown, %d errors", s.bad_data, s.dup,
	      s.wrong_qp, s.unknown, s.other_err + s.flushed_qp1);

	/* last-wqe: refill, then the host resets QP 1's connection. */
	if (srq_post(&s, 30))
		die("ibv_post_srq_recv");
	printf("READY %u %u\n", s.id[0]->qp->qp_num, s.id[1]->qp->qp_num);
	fflush(stdout);
	{
		double end = now() + fault_wait_s;

		while (now() < end && !last) {
			if (async_next(s.ctx, &ev, end - now()))
				break;
			if (ev.event_type == IBV_EVENT_QP_FATAL && ev.element.qp == s.id[0]->qp) {
				fatal = true;
			} else if (ev.event_type == IBV_EVENT_QP_LAST_WQE_REACHED &&
				   ev.element.qp == s.id[0]->qp) {
				order = fatal;
				last = true;
			} else {
				printf("unexpected async event %s\n", ibv_event_type_str(ev.event_type));
				wrong++;
			}
			ibv_ack_async_event(&ev);
		}
	}
	check(fatal && last && order && !wrong, "last-wqe",
	      "QP_FATAL on QP 1: %s, then QP_LAST_WQE_REACHED on QP 1: %s (in order: %s), %d other events",
	      fatal ? "yes" : "no", last ? "yes" : "no", order ? "yes" : "no", wrong);
	/* Whatever QP 1 had taken completes now (at most one), nothing else. */
	got = srq_reap(&s, 2, 2);
	check(s.flushed_qp1 <= 1 && got == s.flushed_qp1 && !s.other_err && !s.dup &&
	      s.posted == 33 - (uint32_t)s.flushed_qp1, "no-flush",
	      "%d completions after the error (%d FLUSH_ERR on QP 1, at most 1 allowed), %d errors, "
	      "%u of 33 still posted", got, s.flushed_qp1, s.other_err, s.posted);
	{
		struct rdma_cm_event *cev;
		struct pollfd p = { .fd = s.ch->fd, .events = POLLIN };

		/* QP 1's connection ended: its DISCONNECTED (if any) is taken. */
		while (poll(&p, 1, 500) == 1 && !rdma_get_cm_event(s.ch, &cev))
			rdma_ack_cm_event(cev);
	}

	/* survive: QP 2 consumes every SRQ WR still posted. */
	n = s.posted;
	if (srq_ctrl(&s, CTRL_SEND, 0, n))
		die("control SEND");
	got = srq_reap(&s, n, timeout_s);
	check(got == n && s.posted == 0 && !s.bad_data && !s.dup && !s.wrong_qp && !s.unknown &&
	      !s.other_err && s.seq[1] == 20 + (uint32_t)n, "survive",
	      "%d of %d completions on QP 2 after QP 1 failed; %u posted, %d bad, %d twice, %d wrong QP, "
	      "%d unknown, %d errors", got, n, s.posted, s.bad_data, s.dup, s.wrong_qp, s.unknown,
	      s.other_err);
	for (i = 1, n = 0; i < (int)s.next_wrid; i++)
		n += s.done[i] == 1;
	check(n == (int)s.next_wrid - 1, "exactly-once", "%d of %u SRQ WRs completed exactly once", n,
	      s.next_wrid - 1);

	run_resize(&s);

	/* busy: not while QPs use it. */
	ret = ibv_destroy_srq(s.srq);
	check(ret == EBUSY || (ret && errno == EBUSY), "busy", "ibv_destroy_srq with 2 QPs: %d (%s)", ret,
	      ret ? strerror(ret) : "destroyed");
	if (!ret)
		die("the SRQ is gone");

	/* destroy: WRs never taken complete nowhere. */
	if (srq_post(&s, 4))
		die("ibv_post_srq_recv");
	srq_ctrl(&s, CTRL_DONE, 0, 0);
	rdma_disconnect(s.id[1]);
	rdma_destroy_qp(s.id[0]);
	rdma_destroy_qp(s.id[1]);
	got = srq_reap(&s, 1, 1);
	ret = ibv_destroy_srq(s.srq);
	check(!ret && got == 0 && !s.dup && s.posted == 4, "destroy",
	      "destroy_srq %d; %d completions after the QPs were destroyed (0 wanted), %u posted", ret,
	      got, s.posted);
	rdma_destroy_id(s.id[0]);
	rdma_destroy_id(s.id[1]);
	ibv_dereg_mr(s.mr);
	ibv_destroy_cq(s.rcq);
	ibv_destroy_cq(s.scq);
	ibv_dealloc_pd(s.pd);
	rdma_destroy_id(s.listen);
	rdma_destroy_event_channel(s.ch);
	free(s.buf);
	return check_summary();
}

/* -------------------------------------------------------------------- peer */

struct peer {
	struct rdma_event_channel *ch;
	struct rdma_cm_id *id[2];
	struct ibv_pd *pd;
	struct ibv_cq *cq[2];		/* each QP's sends */
	struct ibv_cq *rcq;		/* the receives (control messages, on QP 2) */
	struct ibv_mr *mr;
	uint8_t *buf;			/* CTRL_RECV ctrl slots, then a send slot per QP */
	uint32_t seq[2];
};

static void peer_connect(struct peer *p, int q, const char *server, const char *port)
{
	struct rdma_conn_param param = { .responder_resources = 1, .initiator_depth = 1 };
	struct ibv_qp_init_attr qa = {};
	struct rdma_addrinfo hints = { .ai_port_space = RDMA_PS_TCP }, *ai;
	struct rdma_cm_event *ev;
	struct rdma_cm_id *id;
	int i;

	if (rdma_getaddrinfo(server, port, &hints, &ai))
		die("rdma_getaddrinfo");
	if (rdma_create_id(p->ch, &id, NULL, RDMA_PS_TCP) ||
	    rdma_resolve_addr(id, NULL, ai->ai_dst_addr, 5000))
		die("resolve addr");
	rdma_freeaddrinfo(ai);
	ev = cm_wait(p->ch, RDMA_CM_EVENT_ADDR_RESOLVED);
	if (!ev)
		die("addr resolved");
	rdma_ack_cm_event(ev);
	if (rdma_resolve_route(id, 5000))
		die("resolve route");
	ev = cm_wait(p->ch, RDMA_CM_EVENT_ROUTE_RESOLVED);
	if (!ev)
		die("route resolved");
	rdma_ack_cm_event(ev);
	if (!p->pd) {
		p->pd = ibv_alloc_pd(id->verbs);
		p->buf = calloc(CTRL_RECV + 2, MSG_SIZE);
		if (!p->pd || !p->buf)
			die("PD");
		p->mr = ibv_reg_mr(p->pd, p->buf, (CTRL_RECV + 2) * MSG_SIZE, IBV_ACCESS_LOCAL_WRITE);
		p->rcq = ibv_create_cq(id->verbs, CQ_DEPTH, NULL, NULL, 0);
		if (!p->mr || !p->rcq)
			die("ibv_reg_mr / receive CQ");
	}
	p->cq[q] = ibv_create_cq(id->verbs, CQ_DEPTH, NULL, NULL, 0);
	if (!p->cq[q])
		die("ibv_create_cq");
	qa.send_cq = p->cq[q];
	qa.recv_cq = p->rcq;
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = 128;
	qa.cap.max_recv_wr = CTRL_RECV;
	qa.cap.max_send_sge = 1;
	qa.cap.max_recv_sge = 1;
	if (rdma_create_qp(id, p->pd, &qa))
		die("rdma_create_qp");
	if (q == 1) {
		for (i = 0; i < CTRL_RECV; i++) {
			struct ibv_sge sge = { (uintptr_t)(p->buf + i * MSG_SIZE), MSG_SIZE, p->mr->lkey };
			struct ibv_recv_wr wr = { .wr_id = i, .sg_list = &sge, .num_sge = 1 }, *bad;

			if (ibv_post_recv(id->qp, &wr, &bad))
				die("ibv_post_recv");
		}
	}
	if (rdma_connect(id, &param))
		die("rdma_connect");
	ev = cm_wait(p->ch, RDMA_CM_EVENT_ESTABLISHED);
	if (!ev)
		die("established");
	rdma_ack_cm_event(ev);
	p->id[q] = id;
}

/* n SENDs on QP @q, each signaled and reaped before the next (in order). */
static int peer_send(struct peer *p, int q, uint32_t n)
{
	uint8_t *m = p->buf + (CTRL_RECV + q) * MSG_SIZE;
	double end = now() + timeout_s;
	struct ibv_wc wc;
	int got;

	while (n--) {
		struct ibv_sge sge = { (uintptr_t)m, MSG_SIZE, p->mr->lkey };
		struct ibv_send_wr wr = { .wr_id = 0x5e, .sg_list = &sge, .num_sge = 1,
					  .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED }, *bad;

		fill(m, q, p->seq[q]);
		if (ibv_post_send(p->id[q]->qp, &wr, &bad))
			return -1;
		do {
			got = ibv_poll_cq(p->cq[q], 1, &wc);
			if (!got)
				usleep(200);
		} while (!got && now() < end);
		if (got != 1 || wc.status != IBV_WC_SUCCESS || wc.wr_id != 0x5e) {
			printf("peer: SEND %u on QP %d: %s\n", p->seq[q], q + 1,
			       got == 1 ? ibv_wc_status_str(wc.status) : "no completion");
			return -1;
		}
		p->seq[q]++;
	}
	return 0;
}

static int run_peer(const char *server, const char *port)
{
	struct peer p = {};
	double end;
	int q;

	p.ch = rdma_create_event_channel();
	if (!p.ch)
		die("event channel");
	/* Message 0 on each: the initiator's first FPDU (see the top). */
	peer_connect(&p, 0, server, port);
	if (peer_send(&p, 0, 1))
		return 1;
	peer_connect(&p, 1, server, port);
	if (peer_send(&p, 1, 1))
		return 1;
	printf("PEER %u %u\n", p.id[0]->qp->qp_num, p.id[1]->qp->qp_num);
	fflush(stdout);
	end = now() + 10 * timeout_s;
	while (now() < end) {
		struct ibv_wc wc;
		const struct ctrl *c;
		int got = ibv_poll_cq(p.rcq, 1, &wc);

		if (!got) {
			usleep(1000);
			continue;
		}
		if (got == 1 && wc.status == IBV_WC_WR_FLUSH_ERR) {
			/* The srq side's device went away (--lost): the end. */
			printf("vt3-srqtest peer: ended by the other side (%u + %u SENDs)\n",
			       p.seq[0], p.seq[1]);
			return 0;
		}
		if (got < 0 || wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RECV) {
			printf("peer: control receive: %s\n", got < 0 ? "poll failed" :
			       ibv_wc_status_str(wc.status));
			return 1;
		}
		c = (const struct ctrl *)(p.buf + wc.wr_id * MSG_SIZE);
		if (c->magic != MAGIC)
			return 1;
		if (c->op == CTRL_DONE)
			break;
		for (q = 0; q < 2; q++)
			if (c->n[q] && peer_send(&p, q, c->n[q]))
				return 1;
		{
			struct ibv_sge sge = { (uintptr_t)c, MSG_SIZE, p.mr->lkey };
			struct ibv_recv_wr wr = { .wr_id = wc.wr_id, .sg_list = &sge, .num_sge = 1 }, *bad;

			if (ibv_post_recv(p.id[1]->qp, &wr, &bad))
				return 1;
		}
	}
	for (q = 0; q < 2; q++) {
		rdma_disconnect(p.id[q]);
		rdma_destroy_qp(p.id[q]);
		rdma_destroy_id(p.id[q]);
		ibv_destroy_cq(p.cq[q]);
	}
	ibv_destroy_cq(p.rcq);
	ibv_dereg_mr(p.mr);
	ibv_dealloc_pd(p.pd);
	rdma_destroy_event_channel(p.ch);
	free(p.buf);
	printf("vt3-srqtest peer: done (%u + %u SENDs)\n", p.seq[0], p.seq[1]);
	return 0;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "server", required_argument, NULL, 's' },
		{ "port", required_argument, NULL, 'p' },
		{ "timeout", required_argument, NULL, 't' },
		{ "fault-wait", required_argument, NULL, 'f' },
		{ "verbose", no_argument, NULL, 'v' },
		{ "lost", no_argument, NULL, 'l' },
		{ "lost-errored", no_argument, NULL, 'e' },
		{}
	};
	const char *server = NULL, *port = "7475";
	int c;

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc < 2) {
		fprintf(stderr, "usage: vt3-srqtest srq|peer [--server IP] [--port P] [--timeout S]\n");
		return 2;
	}
	optind = 2;
	while ((c = getopt_long(argc, argv, "s:p:t:f:vle", opts, NULL)) != -1) {
		switch (c) {
		case 's':
			server = optarg;
			break;
		case 'p':
			port = optarg;
			break;
		case 't':
			timeout_s = atoi(optarg);
			break;
		case 'f':
			fault_wait_s = atoi(optarg);
			break;
		case 'v':
			verbose = true;
			break;
		case 'l':
			lost_mode = true;
			break;
		case 'e':
			lost_mode = lost_errored = true;
			break;
		default:
			return 2;
		}
	}
	if (!strcmp(argv[1], "srq"))
		return run_srq(port);
	if (!strcmp(argv[1], "peer") && server)
		return run_peer(server, port);
	fprintf(stderr, "vt3-srqtest: srq, or peer --server IP\n");
	return 2;
}
