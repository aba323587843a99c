// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
/*
 * vt3-chaos: the client's work requests: posting SENDs, WRITEs, READs and
 * receives with their patterns, and accounting for every completion
 * against the posted set (the exactly-once checks).
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
static uint8_t *src_slot(struct qp *qp, uint32_t idx) { return qp->buf + (idx % NSLOT) * SLOT; }
static uint8_t *read_slot(struct qp *qp, uint32_t idx) { return qp->buf + (NSLOT + idx % NSLOT) * SLOT; }
static uint8_t *recv_slot(struct qp *qp, uint32_t idx) { return qp->buf + 2 * NSLOT * SLOT + idx % NSLOT * RSLOT; }


/*
 * The application knows the QP is in error: it read an error event for it
 * (or DEVICE_FATAL), or a queue of it gave a FLUSH_ERR. A WR posted from
 * then on never reached the device: it must complete with FLUSH_ERR,
 * signaled or not (docs/architecture.md §5, trigger 3). Before that, an
 * unsignaled send WR without a completion may have been retired by the
 * device: nothing tells the two apart.
 */
static bool known_error(struct qp *qp)
{
	return qp->first_event || qp->q[SQ].flushed || qp->q[RQ].flushed || qp->c->device_fatal;
}

/* Posts one receive; under qp->lock. */
int post_recv(struct qp *qp)
{
	struct wq *q = &qp->q[RQ];
	uint32_t idx = q->posted;
	struct wrec *r = &q->w[idx];
	struct ibv_sge sge = { .addr = (uintptr_t)recv_slot(qp, idx), .length = RSLOT,
			       .lkey = qp->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = make_wr_id(qp->c, qp->idx, RQ, idx),
				  .sg_list = &sge, .num_sge = 1 }, *bad;
	int ret;

	memset(r, 0, sizeof(*r));
	r->op = OP_RECV;
	r->signaled = 1;
	r->after_err = known_error(qp);
	/* Recorded before the post: its completion may come at once. */
	store(&q->posted, idx + 1);
	ret = ibv_post_recv(qp->qp, &wr, &bad);
	if (ret)
		store(&q->posted, idx);
	else if (r->after_err)
		q->after_err++;
	return ret;
}

/* Posts one send WR of op (chosen by the caller); under qp->lock. */
int post_send(struct qp *qp, enum op op, bool signaled, uint32_t lkey)
{
	struct client *c = qp->c;
	struct wq *q = &qp->q[SQ];
	uint32_t idx = q->posted;
	struct wrec *r = &q->w[idx];
	unsigned int len = HDR + hash(c->plan.seed, qp->idx, T_LEN, idx) % (SLOT - HDR + 1);
	struct ibv_sge sge = { .lkey = lkey };
	struct ibv_send_wr wr = { .wr_id = make_wr_id(c, qp->idx, SQ, idx), .sg_list = &sge,
				  .num_sge = 1, .send_flags = signaled ? IBV_SEND_SIGNALED : 0 }, *bad;
	int ret;

	memset(r, 0, sizeof(*r));
	r->op = op;
	r->signaled = signaled;
	r->after_err = known_error(qp) && (signaled || !signaled_flush_only);
	r->src = -1;
	switch (op) {
	case OP_SEND: {
		struct msg_hdr h = { .magic = MAGIC, .qpi = qp->idx, .len = len,
				     .seq = qp->nsend, .tag = T_CSEND };
		uint8_t *p = src_slot(qp, idx);

		memcpy(p, &h, sizeof(h));
		fill(p, hash(c->plan.seed, qp->idx, T_CSEND, h.seq), HDR, len);
		r->seq = qp->nsend;
		wr.opcode = IBV_WR_SEND;
		sge.addr = (uintptr_t)p;
		break;
	}
	case OP_WRITE:
		fill(src_slot(qp, idx), hash(c->plan.seed, qp->idx, T_WRITE, idx), 0, len);
		wr.opcode = IBV_WR_RDMA_WRITE;
		wr.wr.rdma.remote_addr = qp->peer.addr + (idx % RSLOTS) * SLOT;
		wr.wr.rdma.rkey = qp->peer.rkey;
		sge.addr = (uintptr_t)src_slot(qp, idx);
		break;
	case OP_READ:
		wr.opcode = IBV_WR_RDMA_READ;
		wr.wr.rdma.rkey = qp->peer.rkey;
		if (qp->last_write >= 0 && idx - qp->last_write < RECENT) {
			/* Read back the last WRITE: placed before this READ is served. */
			r->src = qp->last_write;
			len = q->w[qp->last_write].len;
			wr.wr.rdma.remote_addr = qp->peer.addr + (qp->last_write % RSLOTS) * SLOT;
		} else {
			wr.wr.rdma.remote_addr = qp->peer.addr + RSLOTS * SLOT;
		}
		memset(read_slot(qp, idx), 0, len);
		sge.addr = (uintptr_t)read_slot(qp, idx);
		break;
	default:
		return EINVAL;
	}
	r->len = len;
	sge.length = len;
	store(&q->posted, idx + 1);
	ret = ibv_post_send(qp->qp, &wr, &bad);
	if (ret) {
		store(&q->posted, idx);
		return ret;
	}
	if (r->after_err)
		q->after_err++;
	if (op == OP_SEND)
		qp->nsend++;
	if (op == OP_WRITE)
		qp->last_write = idx;
	return 0;
}

/* What a poster does on one pass: refill the RQ, post a few send WRs. */
void post_some(struct qp *qp)
{
	struct client *c = qp->c;
	struct wq *sq = &qp->q[SQ], *rq = &qp->q[RQ];
	int i;

	if (pthread_mutex_trylock(&qp->lock))
		return;
	if (c->stop_post || qp->gone)
		goto out;
	/* In error, WRs go on being posted (each must be flushed), a few. */
	while (!qp->srq && rq->posted - load(&rq->next) < RQ_DEPTH && rq->posted < MAX_WR &&
	       rq->after_err < 2 * RQ_DEPTH)
		if (post_recv(qp))
			break;
	/* One slot stays free for the last, signaled WR of the run. */
	for (i = 0; i < 4 && sq->posted - load(&sq->next) < SQ_DEPTH - 1 && sq->posted < MAX_WR - 1 &&
	     sq->after_err < 2 * SQ_DEPTH; i++) {
		uint32_t idx = sq->posted;
		int h = hash(c->plan.seed, qp->idx, T_OP, idx) % 10;
		enum op op = h < 4 ? OP_SEND : h < 7 ? OP_WRITE : OP_READ;
		bool sig;

		/* Each SEND gets an answer: only as many as receives wait. */
		if (op == OP_SEND && (qp->srq ? !srq_send_credit(qp->srq) : qp->nsend >= rq->posted))
			op = OP_WRITE;
		/* A READ's data is checked at its completion: always signaled. */
		sig = op == OP_READ || (idx + 1) % qp->sig_every == 0;
		if (post_send(qp, op, sig, qp->mr->lkey))
			break;
	}
out:
	pthread_mutex_unlock(&qp->lock);
}


/*
 * A receive of QP's (its RQ's WR idx, or of WHAT, its SRQ) completed with
 * SUCCESS into P: the server's next reply on that connection, intact.
 * Under the QP's receive CQ's lock.
 */
void check_reply(struct client *c, struct qp *qp, const uint8_t *p, const struct ibv_wc *wc,
		 const char *what, uint32_t idx)
{
	unsigned int qpi = qp->idx;
	uint32_t seq = qp->nrecv_ok++;
	unsigned int len = reply_len(c->plan.seed, qpi, seq, qp->srq);
	struct msg_hdr h;
	int bad;

	memcpy(&h, p, sizeof(h));
	if (wc->opcode != IBV_WC_RECV)
		cfail(c, "q%u %s wr %u: opcode %d, want RECV", qpi, what, idx, wc->opcode);
	if (h.magic != MAGIC || h.qpi != qpi || h.tag != T_REPLY || h.seq != seq ||
	    h.len != len || wc->byte_len != len) {
		cfail(c, "q%u %s wr %u: received magic %#x qpi %u tag %u seq %u len %u byte_len %u, want seq %u len %u",
		      qpi, what, idx, h.magic, h.qpi, h.tag, h.seq, h.len, wc->byte_len, seq, len);
		return;
	}
	bad = verify(p, hash(c->plan.seed, qpi, T_REPLY, seq), HDR, len);
	if (bad >= 0)
		cfail(c, "q%u %s wr %u (reply %u): byte %d wrong", qpi, what, idx, seq, bad);
}

/* One completion, against the posted set; under its CQ's lock. */
static void account(struct client *c, struct cq *cq, const struct ibv_wc *wc, bool was_destroyed[])
{
	unsigned int run = wc->wr_id >> 48, qpi = (wc->wr_id >> 40) & 0xff;
	enum queue qn = (wc->wr_id >> 32) & 0xff;
	uint32_t idx = (uint32_t)wc->wr_id;
	bool flush = wc->status == IBV_WC_WR_FLUSH_ERR;
	struct qp *qp;
	struct wq *q;
	struct wrec *r;

	vlog("wc %#" PRIx64 " %s opcode %d qp_num %u\n", wc->wr_id, ibv_wc_status_str(wc->status),
	     wc->opcode, wc->qp_num);
	if (run == (unsigned int)(c->run & 0xffff) && qn == SRQ_Q) {
		srq_account(c, cq, wc, was_destroyed);
		return;
	}
	if (run != (unsigned int)(c->run & 0xffff) || qpi >= (unsigned int)c->nqp || qn > RQ) {
		cfail(c, "completion of unknown wr_id %#" PRIx64 " (%s, qp_num %u)", wc->wr_id,
		      ibv_wc_status_str(wc->status), wc->qp_num);
		return;
	}
	qp = &c->qps[qpi];
	q = &qp->q[qn];
	if (was_destroyed[qpi]) {
		cfail(c, "q%u %s wr %u completed (%s) after ibv_destroy_qp returned", qpi,
		      qn == SQ ? "SQ" : "RQ", idx, ibv_wc_status_str(wc->status));
		return;
	}
	if ((qn == SQ ? qp->scq : qp->rcq) != cq)
		cfail(c, "q%u %s wr %u completed on CQ %ld, not its own", qpi, qn == SQ ? "SQ" : "RQ",
		      idx, (long)(cq - c->cqs));
	if (idx >= load(&q->posted)) {
		cfail(c, "q%u %s: completion of wr %u never posted (%s)", qpi, qn == SQ ? "SQ" : "RQ",
		      idx, ibv_wc_status_str(wc->status));
		return;
	}
	r = &q->w[idx];
	if (r->seen++) {
		cfail(c, "q%u %s wr %u (%s) completed twice: %s, then %s", qpi, qn == SQ ? "SQ" : "RQ",
		      idx, op_names[r->op], ibv_wc_status_str(r->status), ibv_wc_status_str(wc->status));
		return;
	}
	r->status = wc->status;
	if (wc->qp_num != qp->qpn)
		cfail(c, "q%u wr %u: qp_num %u, want %u", qpi, idx, wc->qp_num, qp->qpn);
	if (idx < q->next)
		cfail(c, "q%u %s wr %u (%s) completed after wr %u: out of posting order", qpi,
		      qn == SQ ? "SQ" : "RQ", idx, ibv_wc_status_str(wc->status), q->next - 1);
	else
		store(&q->next, idx + 1);
	if (flush) {
		q->flushed = true;
		q->flush++;
		return;
	}
	if (r->after_err)
		cfail(c, "q%u %s wr %u (%s) posted after the QP was in error, completed with %s, want WR_FLUSH_ERR",
		      qpi, qn == SQ ? "SQ" : "RQ", idx, op_names[r->op], ibv_wc_status_str(wc->status));
	if (q->flushed)
		cfail(c, "q%u %s wr %u: device completion (%s) after a FLUSH_ERR", qpi,
		      qn == SQ ? "SQ" : "RQ", idx, ibv_wc_status_str(wc->status));
	if (wc->status != IBV_WC_SUCCESS) {
		q->err++;
		return;
	}
	q->ok++;
	if (!r->signaled) {
		cfail(c, "q%u unsignaled wr %u (%s) completed with SUCCESS", qpi, idx, op_names[r->op]);
		return;
	}
	switch (r->op) {
	case OP_RECV:
		check_reply(c, qp, recv_slot(qp, idx), wc, "RQ", idx);
		break;
	case OP_READ: {
		uint64_t base = r->src >= 0 ? hash(c->plan.seed, qpi, T_WRITE, r->src)
					    : hash(c->plan.seed, qpi, T_STATIC, 0);
		int bad = verify(read_slot(qp, idx), base, 0, r->len);

		if (wc->opcode != IBV_WC_RDMA_READ)
			cfail(c, "q%u SQ wr %u: opcode %d, want RDMA_READ", qpi, idx, wc->opcode);
		if (bad >= 0)
			cfail(c, "q%u READ wr %u of %s %d: byte %d of %u wrong", qpi, idx,
			      r->src >= 0 ? "WRITE" : "static", r->src, bad, r->len);
		break;
	}
	case OP_SEND:
		if (wc->opcode != IBV_WC_SEND)
			cfail(c, "q%u SQ wr %u: opcode %d, want SEND", qpi, idx, wc->opcode);
		break;
	case OP_WRITE:
		if (wc->opcode != IBV_WC_RDMA_WRITE)
			cfail(c, "q%u SQ wr %u: opcode %d, want RDMA_WRITE", qpi, idx, wc->opcode);
		break;
	}
}

/* Polls CQ until it is empty; returns how many completions came. */
int poll_cq(struct client *c, struct cq *cq, int *device_cqes)
{
	struct ibv_wc wc[16];
	bool was_destroyed[MAX_QPS];
	int n, i, total = 0;

	pthread_mutex_lock(&cq->lock);
	/* Destroyed before this poll began: nothing of it may come out. */
	for (i = 0; i < c->nqp; i++)
		was_destroyed[i] = c->qps[i].destroyed;
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	do {
		n = ibv_poll_cq(cq->cq, 16, wc);
		if (n < 0) {
			/* Only a dead device may refuse a poll. */
			if (!c->device_fatal)
				cfail(c, "ibv_poll_cq: %d", n);
			break;
		}
		for (i = 0; i < n; i++) {
			account(c, cq, &wc[i], was_destroyed);
			if (device_cqes && wc[i].status != IBV_WC_WR_FLUSH_ERR)
				(*device_cqes)++;
		}
		total += n;
	} while (n > 0);
	pthread_mutex_unlock(&cq->lock);
	return total;
}
