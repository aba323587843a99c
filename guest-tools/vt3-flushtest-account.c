// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
/*
 * vt3-flushtest's client: posting WRs, accounting for each completion
 * (exactly once, allowed status, flush order) and reading async events.
 */
#include "vt3-flushtest.h"

void cfail(struct client *c, const char *fmt, ...)
{
	va_list ap;
	size_t len = strlen(c->err);

	if (len)
		len += snprintf(c->err + len, sizeof(c->err) - len, "; ");
	if (len >= sizeof(c->err))
		return;
	va_start(ap, fmt);
	vsnprintf(c->err + len, sizeof(c->err) - len, fmt, ap);
	va_end(ap);
}

static struct wrec *wrec_add(struct client *c, enum queue q, enum expect x)
{
	struct wrec *r = &c->wr[c->nwr];

	r->wr_id = 0x1000 * (q + 1) + c->nwr;
	r->q = q;
	r->x = x;
	c->nwr++;
	return r;
}

int post_recv(struct client *c, enum expect x)
{
	struct wrec *r = wrec_add(c, RQ, x);
	struct ibv_sge sge = { .addr = (uintptr_t)c->buf + (c->nwr % 16) * 1024,
			       .length = 1024, .lkey = c->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = r->wr_id, .sg_list = &sge, .num_sge = 1 }, *bad;
	int ret = ibv_post_recv(c->id->qp, &wr, &bad);

	if (ret) {
		cfail(c, "post_recv: %s", strerror(ret));
		c->nwr--;
	}
	return ret;
}

int post_send(struct client *c, enum ibv_wr_opcode op, bool signaled,
	      uint32_t lkey, enum expect x)
{
	struct wrec *r = wrec_add(c, SQ, x);
	struct ibv_sge sge = { .addr = (uintptr_t)c->buf + BUF_SIZE / 2,
			       .length = MSG_SIZE, .lkey = lkey };
	struct ibv_send_wr wr = { .wr_id = r->wr_id, .sg_list = &sge, .num_sge = 1,
				  .opcode = op,
				  .send_flags = signaled ? IBV_SEND_SIGNALED : 0 }, *bad;
	int ret;

	if (op == IBV_WR_RDMA_WRITE) {
		wr.wr.rdma.remote_addr = c->peer.addr + 4096;
		wr.wr.rdma.rkey = c->peer.rkey;
	}
	ret = ibv_post_send(c->id->qp, &wr, &bad);
	if (ret) {
		cfail(c, "post_send: %s", strerror(ret));
		c->nwr--;
	}
	return ret;
}

static struct wrec *wrec_find(struct client *c, uint64_t wr_id)
{
	int i;

	for (i = 0; i < c->nwr; i++)
		if (c->wr[i].wr_id == wr_id)
			return &c->wr[i];
	return NULL;
}

static void account(struct client *c, const struct ibv_wc *wc)
{
	struct wrec *r = wrec_find(c, wc->wr_id);
	bool flush = wc->status == IBV_WC_WR_FLUSH_ERR;

	vlog("wc wr_id %#" PRIx64 " %s opcode %d\n", wc->wr_id,
	     ibv_wc_status_str(wc->status), wc->opcode);
	if (!r) {
		cfail(c, "completion of unknown wr_id %#" PRIx64, wc->wr_id);
		return;
	}
	if (r->seen++) {
		cfail(c, "wr_id %#" PRIx64 " completed twice (%s, then %s)", wc->wr_id,
		      ibv_wc_status_str(r->status), ibv_wc_status_str(wc->status));
		return;
	}
	r->status = wc->status;
	if (wc->qp_num != c->qpn)
		cfail(c, "wr_id %#" PRIx64 ": qp_num %u, want %u", wc->wr_id, wc->qp_num, c->qpn);
	if (flush) {
		if (!c->flushed[r->q] && !c->t_first_flush)
			c->t_first_flush = now();
		if (c->flushed[r->q] && wc->wr_id < c->last_flush[r->q])
			cfail(c, "%s flushes out of posting order", r->q == SQ ? "SQ" : "RQ");
		c->flushed[r->q] = true;
		c->last_flush[r->q] = wc->wr_id;
	} else if (c->flushed[r->q]) {
		cfail(c, "wr_id %#" PRIx64 " device completion (%s) after a FLUSH_ERR on the %s",
		      wc->wr_id, ibv_wc_status_str(wc->status), r->q == SQ ? "SQ" : "RQ");
	}
	switch (r->x) {
	case X_FLUSH:
		if (!flush)
			cfail(c, "wr_id %#" PRIx64 ": %s, want WR_FLUSH_ERR", wc->wr_id,
			      ibv_wc_status_str(wc->status));
		break;
	case X_OK_OR_FLUSH:
	case X_MAYBE:
		if (!flush && wc->status != IBV_WC_SUCCESS)
			cfail(c, "wr_id %#" PRIx64 ": %s", wc->wr_id, ibv_wc_status_str(wc->status));
		break;
	case X_ERROR:
		if (flush || wc->status == IBV_WC_SUCCESS)
			cfail(c, "wr_id %#" PRIx64 ": %s, want its own error", wc->wr_id,
			      ibv_wc_status_str(wc->status));
		break;
	case X_UNSIGNALED:
		if (wc->status == IBV_WC_SUCCESS)
			cfail(c, "unsignaled wr_id %#" PRIx64 " completed with %s", wc->wr_id,
			      ibv_wc_status_str(wc->status));
		break;
	}
}

/* Every WR that owes a completion has one. */
bool all_done(struct client *c)
{
	int i;

	for (i = 0; i < c->nwr; i++)
		if (c->wr[i].x != X_MAYBE && c->wr[i].x != X_UNSIGNALED && !c->wr[i].seen)
			return false;
	return true;
}

int poll_some(struct client *c)
{
	struct ibv_wc wc[16];
	int n, i, total = 0;

	do {
		n = ibv_poll_cq(c->cq, 16, wc);
		if (n < 0) {
			cfail(c, "ibv_poll_cq: %d", n);
			return n;
		}
		for (i = 0; i < n; i++)
			account(c, &wc[i]);
		total += n;
	} while (n > 0);
	return total;
}

static bool expected_event(struct client *c, int type)
{
	int i;

	for (i = 0; i < c->nexpect; i++)
		if (c->expect[i] == type)
			return true;
	return false;
}

bool events_complete(struct client *c)
{
	int i, j;

	for (i = 0; i < c->nexpect; i++) {
		for (j = 0; j < c->nev; j++)
			if (c->got_ev[j] == c->expect[i])
				break;
		if (j == c->nev)
			return false;
	}
	return true;
}

/* Reads one async event within ms; checks its element. */
int read_event(struct client *c, int ms)
{
	struct pollfd pfd = { .fd = c->ctx->async_fd, .events = POLLIN };
	struct ibv_async_event ev;
	int type;

	if (poll(&pfd, 1, ms) <= 0)
		return 0;
	if (ibv_get_async_event(c->ctx, &ev))
		return 0;
	type = ev.event_type;
	vlog("async event %s (%#x)\n", ev_name(type), type);
	if (!c->t_event && expected_event(c, type))
		c->t_event = now();
	switch (type) {
	case EV_LLP_CLOSE_COMPLETE:
	case IBV_EVENT_QP_FATAL:
	case IBV_EVENT_QP_REQ_ERR:
	case IBV_EVENT_QP_ACCESS_ERR:
		if (ev.element.qp != c->id->qp)
			cfail(c, "%s: element.qp %p is not our QP %p", ev_name(type),
			      (void *)ev.element.qp, (void *)c->id->qp);
		break;
	case IBV_EVENT_CQ_ERR:
		if (ev.element.cq != c->cq)
			cfail(c, "CQ_ERR: element.cq %p is not our CQ %p",
			      (void *)ev.element.cq, (void *)c->cq);
		break;
	default:
		break;
	}
	if (c->nev < 8)
		c->got_ev[c->nev++] = type;
	ibv_ack_async_event(&ev);
	return 1;
}
