// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
/*
 * vt3-chaos: a randomized fault soak of the exactly-once contract
 * (DESIGN.md section 5, docs/events.md). librdmacm + libibverbs.
 *
 *   vt3-chaos server [--port P] [--timeout S] [-v]
 *   vt3-chaos client --server IP [--port P] [--seed S] [--runs N]
 *                    [--faults F[,F...]] [--ack FILE] [--duration MS]
 *                    [--tcp-timeout S] [-v]
 *   vt3-chaos list
 *
 * The server is the passive side (any iWARP device): one connection per
 * client QP, each with its own buffers. It answers every SEND of the
 * client with a SEND of its own (so the client's receives carry data it
 * can check), checks the client's SENDs, serves its WRITEs and READs
 * from a region per connection, and on request ends one connection
 * (peer-close: rdma_disconnect; peer-abort: QP destroyed with the
 * connection up) a given time after it was established. "SERVER BAD …"
 * lines report wrong data.
 *
 * The client is the side under test. Run i of N uses the seed S + i, from
 * which everything but timing follows: 4-16 QPs on 1-4 shared CQs (some
 * QPs with separate send and receive CQs), 1-2 worker threads that post
 * and busy-poll, an async-event thread, maybe a cq-event thread (2-4
 * threads), a style per QP (poll: one poster; post: two posters at once;
 * async: the async thread also polls the QP's CQs after each of its
 * events; mixed: two posters, two pollers and the async thread on one
 * QP), every Nth send signaled (sq_sig_all = 0), in half of the runs
 * some or all QPs on one or two shared receive queues (QPs of different
 * receive CQs on one SRQ; the workers that post to its QPs refill it, at
 * once: several threads in ibv_post_srq_recv; an SRQ QP's SENDs only as
 * many as SRQ WRs were posted, so every reply finds a WQE; drawn from a
 * stream of their own, so the rest of a seed's plan is what it was before
 * SRQs), and one fault at a random moment:
 *   local   disconnect (rdma_disconnect of one QP), abort (destroy one QP
 *           with traffic in flight), bad-wqe (a WRITE with a bad lkey)
 *   peer    peer-close, peer-abort (the server, on the client's request)
 *   host    rst fin blackhole drop delay corrupt-crc terminate
 *           invalidate-stag device-fatal peer-killed peer-vt3d-killed
 *           vt3d-killed rmmod mute-commands: the client prints
 *             READY <run> <seed> <fault> <side> <qpn> <peer qpn> <stag> <a1> <a2> <a3>
 *           (side 0: the fault is done to the peer's vt3d and QP, 1: to
 *           ours; stag: the peer's rkey or our MR's; a1..a3: drop percent
 *           and seed, delay ms, terminate layer etype ecode) and keeps its
 *           traffic flowing until FILE (--ack) holds the run number.
 * Traffic: SEND, WRITE and READ on every QP with verified data (receives:
 * the server's header, sequence and bytes; READs: the bytes of the last
 * WRITE to that place, or of a region the server filled). At the end of
 * the run's duration every QP gets a last signaled WR and is disconnected
 * with work in flight; then every WR must be accounted for.
 *
 * Checks, per run: every signaled send WR and every receive completes
 * exactly once (wr_id accounting against the posted set); with SUCCESS,
 * IBV_WC_WR_FLUSH_ERR or an error of its own; per queue in posting order
 * with every device completion before the first flush; an unsignaled send
 * never completes with SUCCESS, and one the device did not retire is
 * flushed (DESIGN section 5: "every SQ WQE not retired, signaled or not"),
 * so a completion after an unsignaled WR that has none is a loss;
 * wc.qp_num and wc.opcode fit the WR; the right async event for the
 * fault on the QP it hit and no error event on the others before the end;
 * no completion of a QP after ibv_destroy_qp returned (a drain of every CQ
 * after the destroys finds nothing); nothing hangs (every wait bounded, a
 * watchdog ends a stuck run as FAIL). SRQ WRs (vt3-chaos-srq.c, where
 * the rules are spelled out): each completes at most once, on a QP of its
 * SRQ and that QP's receive CQ, with the server's next reply on that QP;
 * a QP's error flushes nothing of the SRQ but the one WQE the QP had
 * taken (at most one unsuccessful SRQ completion per QP, its last), a
 * lost device's flush completes every SRQ WR exactly once; each SRQ QP
 * in ERROR gets LAST_WQE_REACHED once, after its error event, and nothing
 * of the SRQ succeeds on it after that; at the end posted = completed +
 * left, "left" proved by draining the SRQ through a loopback connection
 * (each left WR taken once, then an empty SRQ). One line per run,
 *   RUN <i> seed <s> fault <f> ... ok|FAIL: sq …; rq …; srqs <n>: <p> posted
 *   <o> ok <f> flushed <e> error <l> left <d> dropped <t> taken[ unproven];
 *   events …  ("taken": SRQ WQEs a QP had begun to fill when it failed;
 *   the client asks for replies of up to three DDP segments so faults can
 *   cut one)
 *   [-- reasons]
 * and "vt3-chaos: N passed, N failed" last; exit 1 on a failure. Replay
 * one run with --seed <s> --runs 1 --faults <f>.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
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

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include "vt3-chaos.h"

/* ------------------------------------------------------------- common */

int verbose;
int timeout_s = 600;

double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

void vlog(const char *fmt, ...)
{
	va_list ap;

	if (!verbose)
		return;
	va_start(ap, fmt);
	fprintf(stderr, "  [%.3f] ", now());
	vfprintf(stderr, fmt, ap);
	va_end(ap);
}

/* ---------------------------------------------------------------- faults */

enum who { LOCAL, PEER, HOST };
enum scope {
	S_QP,		/* one QP: the others must see no error until the end */
	S_NOEVENT,	/* no QP may see an error until the end */
	S_ALL,		/* every QP ends: QP_FATAL each */
	S_DEVICE,	/* DEVICE_FATAL */
};

/* Expected first error event of the target QP (bit masks). */
#define E_FATAL		(1u << 0)
#define E_REQ		(1u << 1)
#define E_ACCESS	(1u << 2)
#define E_CLOSE		(1u << 3)
#define E_DEVICE	(1u << 4)
#define E_ANY_QP	(E_FATAL | E_REQ | E_ACCESS | E_CLOSE)

struct fault {
	const char *name;
	enum who who;
	enum scope scope;
	unsigned int expect;	/* the target's first event: E_* mask; 0: by args */
	bool destructive;	/* the rest of the batch has no device or peer */
};

static const struct fault faults[] = {
	{ "disconnect",		LOCAL,	S_QP,		E_CLOSE | E_FATAL, false },
	{ "abort",		LOCAL,	S_QP,		0, false },
	{ "bad-wqe",		LOCAL,	S_QP,		E_REQ, false },
	{ "peer-close",		PEER,	S_QP,		E_CLOSE | E_FATAL, false },
	{ "peer-abort",		PEER,	S_QP,		E_FATAL, false },
	{ "rst",		HOST,	S_QP,		E_FATAL, false },
	{ "fin",		HOST,	S_QP,		E_CLOSE | E_FATAL, false },
	{ "blackhole",		HOST,	S_QP,		E_FATAL, false },
	{ "drop",		HOST,	S_NOEVENT,	0, false },
	{ "delay",		HOST,	S_NOEVENT,	0, false },
	{ "corrupt-crc",	HOST,	S_QP,		E_FATAL, false },
	{ "terminate",		HOST,	S_QP,		0, false },
	{ "invalidate-stag",	HOST,	S_QP,		0, false },
	{ "device-fatal",	HOST,	S_DEVICE,	E_DEVICE,	true },
	{ "peer-killed",	HOST,	S_ALL,		E_FATAL,	true },
	{ "peer-vt3d-killed",	HOST,	S_ALL,		E_FATAL,	true },
	{ "vt3d-killed",	HOST,	S_DEVICE,	E_DEVICE,	true },
	{ "rmmod",		HOST,	S_DEVICE,	E_DEVICE,	true },
	{ "mute-commands",	HOST,	S_DEVICE,	E_DEVICE,	true },
};
#define N_FAULTS	((int)(sizeof(faults) / sizeof(faults[0])))

/* Registered TERMINATE codes (docs/vt3d-ctl.md): layer, etype, ecode. */
static const uint8_t terminates[][3] = {
	{ 0, 0, 0x00 }, { 0, 1, 0x00 }, { 0, 1, 0x02 }, { 0, 2, 0x06 }, { 0, 2, 0xff },
	{ 1, 0, 0x00 }, { 1, 1, 0x00 }, { 1, 2, 0x01 }, { 1, 2, 0x02 }, { 2, 0, 0x02 },
	{ 2, 0, 0x01 },
};

static int fault_find(const char *name)
{
	int i;

	for (i = 0; i < N_FAULTS; i++)
		if (!strcmp(faults[i].name, name))
			return i;
	return -1;
}

/* ------------------------------------------------------------------ plan */

static const char *const style_names[] = { "poll", "post", "async", "mixed" };

static uint64_t rng_next(uint64_t *s)
{
	*s = mix(*s);
	return *s;
}

static int rnd(uint64_t *s, int n)
{
	return (int)(rng_next(s) % (uint64_t)n);
}

static void plan_srqs(struct plan *p, uint64_t seed);

/* Everything but timing from the seed; the fault is drawn first from the
 * allowed list, so --faults F with one F keeps the rest of the plan. */
static void make_plan(struct plan *p, uint64_t seed, const int *allowed, int nallowed, int duration_ms)
{
	uint64_t s = hash(seed, 0, T_PLAN, 0);
	int i;

	memset(p, 0, sizeof(*p));
	p->seed = seed;
	p->fault = allowed[rnd(&s, nallowed)];
	p->side = rnd(&s, 2);
	p->nqp = 4 + rnd(&s, MAX_QPS - 3);
	p->ncq = 1 + rnd(&s, MAX_CQS);
	p->nworkers = 1 + rnd(&s, 2);
	p->target = rnd(&s, p->nqp);
	for (i = 0; i < p->ncq; i++)
		p->cq_event[i] = rnd(&s, 3) == 0;
	for (i = 0; i < p->nqp; i++) {
		p->send_cq[i] = rnd(&s, p->ncq);
		/* About a third with a receive CQ of their own choice. */
		p->recv_cq[i] = rnd(&s, 3) ? p->send_cq[i] : rnd(&s, p->ncq);
		p->style[i] = rnd(&s, 4);
		p->sig_every[i] = 1 + rnd(&s, 4);
	}
	p->duration = duration_ms * (0.75 + rnd(&s, 51) / 100.0) / 1000.0;
	p->fault_at = p->duration * (0.1 + rnd(&s, 71) / 100.0);
	if (!strcmp(faults[p->fault].name, "drop")) {
		p->a1 = 5 + rnd(&s, 26);	/* percent */
		p->a2 = 1 + rnd(&s, 1000);	/* its seed */
	} else if (!strcmp(faults[p->fault].name, "delay")) {
		p->a1 = 10 + rnd(&s, 191);	/* ms */
	} else if (!strcmp(faults[p->fault].name, "terminate")) {
		const uint8_t *t = terminates[rnd(&s, sizeof(terminates) / sizeof(terminates[0]))];

		p->a1 = t[0], p->a2 = t[1], p->a3 = t[2];
	}
	plan_srqs(p, seed);
}

/*
 * Shared receive queues, from a stream of their own (the rest of a plan
 * is what the seed drew before SRQs existed): half of the runs put a
 * random subset of their QPs, a quarter of those all of them, on one or
 * two SRQs; QPs of different receive CQs share one.
 */
static void plan_srqs(struct plan *p, uint64_t seed)
{
	uint64_t s = hash(seed, 0, T_PLAN, 1);
	int used[MAX_SRQS] = {}, i, n = 0;
	bool all;

	for (i = 0; i < p->nqp; i++)
		p->srq[i] = -1;
	if (rnd(&s, 2))
		return;
	p->nsrq = 1 + rnd(&s, MAX_SRQS);
	all = rnd(&s, 4) == 0;
	for (i = 0; i < p->nqp; i++)
		if (all || rnd(&s, 2))
			p->srq[i] = rnd(&s, p->nsrq);
	/* SRQs numbered in their QPs' order, none without a QP. */
	for (i = 0; i < MAX_SRQS; i++)
		used[i] = -1;
	for (i = 0; i < p->nqp; i++) {
		if (p->srq[i] < 0)
			continue;
		if (used[p->srq[i]] < 0)
			used[p->srq[i]] = n++;
		p->srq[i] = used[p->srq[i]];
	}
	if (!n)
		p->srq[rnd(&s, p->nqp)] = n++;
	p->nsrq = n;
}

/* The target's first error event for this fault. */
static unsigned int plan_expect(const struct plan *p)
{
	const struct fault *f = &faults[p->fault];

	if (f->expect)
		return f->expect;
	if (!strcmp(f->name, "terminate")) {
		if (p->a1 == 2 || p->a2 == 0)
			return E_FATAL;
		return p->a2 == 1 ? E_ACCESS : E_REQ;
	}
	if (!strcmp(f->name, "invalidate-stag"))
		/* The peer's STag: the peer detects the access (QP_ACCESS_ERR);
		 * ours: our WQEs or the peer's SENDs into it fail locally. */
		return p->side ? E_FATAL | E_REQ | E_ACCESS : E_ACCESS;
	return 0;
}

/* ---------------------------------------------------------------- client */

static const char *const op_names[] = { "SEND", "WRITE", "READ", "RECV" };

static const char *server_ip;
/* --signaled-flush-only: what libvt3 flushes today (only signaled send WRs),
 * to look for other bugs behind that one; the case never passes it. */
static bool signaled_flush_only;
static int port = 7472;
static const char *ack_file;
static int tcp_timeout = 15;

void cfail(struct client *c, const char *fmt, ...)
{
	va_list ap;
	size_t len;

	pthread_mutex_lock(&c->err_lock);
	c->nerr++;
	len = strlen(c->err);
	if (len < sizeof(c->err) - 1 && c->nerr <= 6) {
		if (len)
			len += snprintf(c->err + len, sizeof(c->err) - len, "; ");
		va_start(ap, fmt);
		if (len < sizeof(c->err))
			vsnprintf(c->err + len, sizeof(c->err) - len, fmt, ap);
		va_end(ap);
	}
	pthread_mutex_unlock(&c->err_lock);
	if (verbose) {
		va_start(ap, fmt);
		fprintf(stderr, "  [%.3f] FAIL: ", now());
		vfprintf(stderr, fmt, ap);
		fprintf(stderr, "\n");
		va_end(ap);
	}
}

/* The watchdog: a run that does not end in time is a hang, reported. */
static char watchdog_line[512];
static int passed, failed;

static void on_alarm(int sig)
{
	char tail[96];
	int n;

	(void)sig;
	if (write(1, watchdog_line, strlen(watchdog_line)) < 0)
		_exit(3);
	n = snprintf(tail, sizeof(tail), "vt3-chaos: %d passed, %d failed\n", passed, failed + 1);
	if (write(1, tail, n) < 0)
		_exit(3);
	_exit(3);
}

static void watchdog(struct client *c, const char *phase, int secs)
{
	snprintf(watchdog_line, sizeof(watchdog_line),
		 "RUN %d seed %" PRIu64 " fault %s FAIL: hangs in %s (%d s watchdog)\n",
		 c->run, c->plan.seed, faults[c->plan.fault].name, phase, secs);
	alarm(secs);
}

uint64_t make_wr_id(struct client *c, int qpi, enum queue q, uint32_t idx)
{
	return ((uint64_t)(c->run & 0xffff) << 48) | ((uint64_t)qpi << 40) | ((uint64_t)q << 32) | idx;
}

static uint8_t *src_slot(struct qp *qp, uint32_t idx) { return qp->buf + (idx % NSLOT) * SLOT; }
static uint8_t *read_slot(struct qp *qp, uint32_t idx) { return qp->buf + (NSLOT + idx % NSLOT) * SLOT; }
static uint8_t *recv_slot(struct qp *qp, uint32_t idx) { return qp->buf + 2 * NSLOT * SLOT + idx % NSLOT * RSLOT; }


/*
 * The application knows the QP is in error: it read an error event for it
 * (or DEVICE_FATAL), or a queue of it gave a FLUSH_ERR. A WR posted from
 * then on never reached the device: it must complete with FLUSH_ERR,
 * signaled or not (DESIGN section 5, trigger 3). Before that, an
 * unsignaled send WR without a completion may have been retired by the
 * device: nothing tells the two apart.
 */
static bool known_error(struct qp *qp)
{
	return qp->first_event || qp->q[SQ].flushed || qp->q[RQ].flushed || qp->c->device_fatal;
}

/* Posts one receive; under qp->lock. */
static int post_recv(struct qp *qp)
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
static int post_send(struct qp *qp, enum op op, bool signaled, uint32_t lkey)
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
static void post_some(struct qp *qp)
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

static unsigned int ev_bit(int type)
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

static const char *ev_bits_str(unsigned int m, char *buf, size_t len)
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

/* ------------------------------------------------------------- threads */

struct worker {
	struct client *c;
	int n;
	pthread_t t;
};

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

static void *worker_thread(void *arg)
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

static void *async_thread(void *arg)
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
static void *cq_event_thread(void *arg)
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

static void *cm_thread(void *arg)
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

/* -------------------------------------------------------- setup, teardown */

static int cm_wait(struct client *c, struct rdma_cm_id *id, enum rdma_cm_event_type want,
		   int ms, struct rep_pd *rep)
{
	struct pollfd pfd = { .fd = c->ch->fd, .events = POLLIN };
	struct rdma_cm_event *ev;
	int ret = -1;

	if (poll(&pfd, 1, ms) <= 0) {
		cfail(c, "no %s within %d ms", rdma_event_str(want), ms);
		return -1;
	}
	if (rdma_get_cm_event(c->ch, &ev)) {
		cfail(c, "rdma_get_cm_event: %s", strerror(errno));
		return -1;
	}
	if (ev->id != id) {
		/* An earlier QP's (a peer fault came early): close it as usual. */
		struct qp *other = ev->id->context;

		if (ev->event == RDMA_CM_EVENT_DISCONNECTED && other && !other->cm_closed) {
			other->cm_closed = true;
			rdma_disconnect(other->id);
		}
		rdma_ack_cm_event(ev);
		return cm_wait(c, id, want, ms, rep);
	}
	if (ev->event != want) {
		cfail(c, "%s (status %d), want %s", rdma_event_str(ev->event), ev->status,
		      rdma_event_str(want));
	} else {
		ret = 0;
		if (rep) {
			memset(rep, 0, sizeof(*rep));
			if (ev->param.conn.private_data_len >= sizeof(*rep))
				memcpy(rep, ev->param.conn.private_data, sizeof(*rep));
		}
	}
	rdma_ack_cm_event(ev);
	return ret;
}

static int connect_qp(struct client *c, struct qp *qp, struct addrinfo *ai)
{
	const struct plan *p = &c->plan;
	const struct fault *f = &faults[p->fault];
	struct ibv_qp_init_attr attr = {
		.cap = { .max_send_wr = SQ_DEPTH, .max_recv_wr = RQ_DEPTH,
			 .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC, .sq_sig_all = 0,
	};
	struct rdma_conn_param param = { .responder_resources = ORD, .initiator_depth = ORD,
					 .retry_count = 7 };
	struct req_pd req = { .magic = MAGIC, .qpi = qp->idx, .seed = p->seed,
			      .flags = qp->srq ? REQ_BIG_REPLIES : 0 };
	int i;

	if (f->who == PEER && qp->idx == p->target) {
		req.action = !strcmp(f->name, "peer-close") ? ACT_CLOSE : ACT_ABORT;
		/* The QPs connect one after another: count from the last. */
		req.act_ms = p->fault_at * 1000 + (p->nqp - qp->idx) * 60;
	}
	if (rdma_create_id(c->ch, &qp->id, qp, RDMA_PS_TCP)) {
		cfail(c, "rdma_create_id: %s", strerror(errno));
		return -1;
	}
	if (rdma_resolve_addr(qp->id, NULL, ai->ai_addr, 5000) ||
	    cm_wait(c, qp->id, RDMA_CM_EVENT_ADDR_RESOLVED, 10000, NULL) ||
	    rdma_resolve_route(qp->id, 5000) ||
	    cm_wait(c, qp->id, RDMA_CM_EVENT_ROUTE_RESOLVED, 10000, NULL)) {
		cfail(c, "q%d: resolve %s", qp->idx, server_ip);
		return -1;
	}
	if (!c->ctx) {
		c->ctx = qp->id->verbs;
		c->pd = ibv_alloc_pd(c->ctx);
		c->cch = ibv_create_comp_channel(c->ctx);
		for (i = 0; i < p->ncq && c->pd && c->cch; i++) {
			struct cq *cq = &c->cqs[i];
			int j, k, depth = 0;

			/* Room for every WR of every queue feeding it: no overflow. */
			for (j = 0; j < p->nqp; j++)
				depth += (p->send_cq[j] == i) * SQ_DEPTH + (p->recv_cq[j] == i) * RQ_DEPTH;
			/* An SRQ's WRs may all complete on any CQ of its QPs. */
			for (k = 0; k < p->nsrq; k++)
				for (j = 0; j < p->nqp; j++)
					if (p->srq[j] == k && p->recv_cq[j] == i) {
						depth += SRQ_DEPTH;
						break;
					}
			cq->event = p->cq_event[i];
			cq->cq = ibv_create_cq(c->ctx, depth ? depth : 1, NULL,
					       cq->event ? c->cch : NULL, 0);
			if (!cq->cq)
				break;
			if (cq->event && ibv_req_notify_cq(cq->cq, 0))
				break;
		}
		if (i < p->ncq) {
			cfail(c, "verbs setup: %s", strerror(errno));
			return -1;
		}
		for (i = 0; i < p->nsrq; i++)
			if (srq_create(c, &c->srqs[i]))
				return -1;
		memcpy(&c->local, rdma_get_local_addr(qp->id), sizeof(struct sockaddr_in));
	} else if (qp->id->verbs != c->ctx) {
		cfail(c, "q%d resolved to another device", qp->idx);
		return -1;
	}
	qp->buf = calloc(1, QP_BUF);
	qp->mr = qp->buf ? ibv_reg_mr(c->pd, qp->buf, QP_BUF, IBV_ACCESS_LOCAL_WRITE) : NULL;
	attr.send_cq = qp->scq->cq;
	attr.recv_cq = qp->rcq->cq;
	attr.srq = qp->srq ? qp->srq->srq : NULL;
	if (!qp->mr || rdma_create_qp(qp->id, c->pd, &attr)) {
		cfail(c, "q%d: create QP: %s", qp->idx, strerror(errno));
		return -1;
	}
	qp->qp = qp->id->qp;
	qp->qpn = qp->qp->qp_num;
	/* Receives before the connection: the server answers at once. */
	pthread_mutex_lock(&qp->lock);
	for (i = 0; i < RQ_DEPTH && !qp->srq; i++)
		if (post_recv(qp))
			break;
	pthread_mutex_unlock(&qp->lock);
	param.private_data = &req;
	param.private_data_len = sizeof(req);
	if (rdma_connect(qp->id, &param)) {
		cfail(c, "q%d: rdma_connect: %s", qp->idx, strerror(errno));
		return -1;
	}
	if (cm_wait(c, qp->id, RDMA_CM_EVENT_ESTABLISHED, 30000, &qp->peer))
		return -1;
	if (qp->peer.magic != MAGIC) {
		cfail(c, "q%d: the server sent no buffer (not vt3-chaos server?)", qp->idx);
		return -1;
	}
	return 0;
}

struct destroy_arg {
	struct qp *qp;
	volatile bool done;
};

static void *destroy_thread(void *arg)
{
	struct destroy_arg *d = arg;

	rdma_destroy_qp(d->qp->id);
	d->done = true;
	return NULL;
}

/* rdma_destroy_qp, bounded: a hang is a failure (the watchdog reports it). */
static void destroy_qp(struct client *c, struct qp *qp)
{
	struct destroy_arg d = { .qp = qp };
	pthread_t t;
	double until = now() + 20;
	int i;

	/* Under the lock: the CM thread's rdma_disconnect is done or never comes. */
	pthread_mutex_lock(&qp->lock);
	qp->gone = true;
	pthread_mutex_unlock(&qp->lock);
	/* Its SRQ WQEs whose CQEs were still in the ring go with it. */
	qp->aborted = qp->srq && !qp->last_wqe;
	if (pthread_create(&t, NULL, destroy_thread, &d)) {
		destroy_thread(&d);
	} else {
		while (!d.done && now() < until)
			usleep(2000);
		if (!d.done) {
			cfail(c, "q%d: ibv_destroy_qp hangs (20 s)", qp->idx);
			watchdog(c, "ibv_destroy_qp", 1);
			pause();
		}
		pthread_join(t, NULL);
	}
	/* What was not completed by now never will be. */
	for (i = 0; i < 2; i++)
		qp->q[i].discarded = load(&qp->q[i].next);
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	qp->destroyed = true;
	qp->qp = NULL;
}

static bool qp_accounted(struct qp *qp);

/* The last WR of the run on every QP still there: signaled, so what the
 * device retired before it is known; then the disconnect, work in flight. */
static void end_traffic(struct client *c)
{
	int i;

	c->stop_post = true;
	c->ending = true;
	for (i = 0; i < c->nqp; i++) {
		struct qp *qp = &c->qps[i];

		pthread_mutex_lock(&qp->lock);
		if (!qp->gone && !post_send(qp, OP_WRITE, true, qp->mr->lkey))
			qp->fenced = true;
		pthread_mutex_unlock(&qp->lock);
	}
	for (i = 0; i < c->nqp; i++)
		if (!c->qps[i].destroyed && !c->qps[i].cm_closed)
			rdma_disconnect(c->qps[i].id);
}

/* Every signaled send WR and every receive has its completion; for a
 * destroyed QP what it had completed by then. */
static bool qp_accounted(struct qp *qp)
{
	int qn;

	if (qp->destroyed)
		return true;
	for (qn = SQ; qn <= RQ; qn++) {
		struct wq *q = &qp->q[qn];
		uint32_t posted = load(&q->posted), i;

		for (i = load(&q->next); i < posted; i++)
			if (q->w[i].signaled)
				return false;
	}
	return true;
}

/* After the run, per queue: every signaled WR, and every WR posted with
 * the QP known in error, completed (once: checked as they came). */
static void check_queues(struct client *c, struct qp *qp)
{
	int qn;

	for (qn = SQ; qn <= RQ; qn++) {
		struct wq *q = &qp->q[qn];
		uint32_t end = qp->destroyed ? q->discarded : q->posted, i;
		int lost = 0;

		for (i = 0; i < end; i++) {
			struct wrec *r = &q->w[i];

			if (r->seen)
				continue;
			if (r->signaled || r->after_err) {
				if (!lost++)
					cfail(c, "q%d %s wr %u (%s%s%s) lost: no completion", qp->idx,
					      qn == SQ ? "SQ" : "RQ", i, r->signaled ? "" : "unsignaled ",
					      op_names[r->op], r->after_err ? ", posted in error" : "");
			} else {
				q->silent++;	/* retired by the device, or lost: unknowable */
			}
		}
		if (lost > 1)
			cfail(c, "q%d %s: %d WRs lost in all", qp->idx, qn == SQ ? "SQ" : "RQ", lost);
	}
}

static void check_events(struct client *c)
{
	const struct plan *p = &c->plan;
	const struct fault *f = &faults[p->fault];
	unsigned int want = plan_expect(p);
	char b1[96], b2[96];
	int i;

	for (i = 0; i < c->nqp; i++) {
		struct qp *qp = &c->qps[i];
		bool target = f->scope == S_ALL || f->scope == S_DEVICE ||
			      (f->scope == S_QP && i == p->target);
		bool before_end = qp->first_event && (!c->ending || qp->first_event_at < c->t_end);

		if (target && f->scope == S_QP && !strcmp(f->name, "abort"))
			continue;	/* destroyed: no event to read */
		if (target) {
			if (!qp->first_event)
				cfail(c, "q%d: no event for the fault (want %s)", i, ev_bits_str(want, b1, sizeof(b1)));
			else if (!(qp->first_event & want))
				cfail(c, "q%d: first event %s, want %s", i,
				      ev_bits_str(qp->first_event, b1, sizeof(b1)), ev_bits_str(want, b2, sizeof(b2)));
		} else if (before_end && !(qp->first_event & E_DEVICE)) {
			cfail(c, "q%d: %s before the end though the fault was %s", i,
			      ev_bits_str(qp->first_event, b1, sizeof(b1)),
			      f->scope == S_QP ? "on another QP" : "without events");
		}
	}
}

/* The host does the fault: READY, then (bounded) its acknowledgement. */
static void host_fault(struct client *c)
{
	const struct plan *p = &c->plan;
	struct qp *t = &c->qps[p->target];
	double until = now() + 120;
	char buf[32];

	printf("READY %d %" PRIu64 " %s %d %u %u %#x %d %d %d\n", c->run, p->seed,
	       faults[p->fault].name, p->side, t->qpn, t->peer.qpn,
	       p->side ? t->mr->rkey : t->peer.rkey, p->a1, p->a2, p->a3);
	fflush(stdout);
	if (!ack_file) {
		cfail(c, "a host fault without --ack FILE");
		return;
	}
	while (now() < until) {
		FILE *fp = fopen(ack_file, "r");

		if (fp) {
			bool got = fgets(buf, sizeof(buf), fp) && atoi(buf) == c->run;

			fclose(fp);
			if (got)
				return;
		}
		usleep(20000);
	}
	cfail(c, "the host did not acknowledge the fault in 120 s");
}

/*
 * mute-commands: our vt3d answers no command while its data path runs on.
 * A command now (what any verb would send) goes unanswered, vt3.ko's
 * probes too: it declares the device lost (CQs frozen, DEVICE_FATAL),
 * while vt3d may still write CQEs that must not be taken.
 */
static void muted_command(struct client *c)
{
	double t = now();
	struct ibv_cq *cq = ibv_create_cq(c->ctx, 1, NULL, NULL, 0);

	if (cq) {
		cfail(c, "ibv_create_cq was answered while vt3d's commands were muted");
		ibv_destroy_cq(cq);
		return;
	}
	vlog("ibv_create_cq failed after %.1f s: %s\n", now() - t, strerror(errno));
}

static void local_fault(struct client *c)
{
	const struct plan *p = &c->plan;
	const char *name = faults[p->fault].name;
	struct qp *t = &c->qps[p->target];

	if (!strcmp(name, "disconnect")) {
		rdma_disconnect(t->id);
	} else if (!strcmp(name, "abort")) {
		destroy_qp(c, t);
	} else if (!strcmp(name, "bad-wqe")) {
		pthread_mutex_lock(&t->lock);
		/* Its own error completion, everything after it flushed. */
		if (post_send(t, OP_WRITE, true, t->mr->lkey ^ 0x5a00))
			cfail(c, "q%d: posting the bad WQE failed", t->idx);
		pthread_mutex_unlock(&t->lock);
	}
}

static bool target_hit(struct client *c)
{
	const struct plan *p = &c->plan;
	const struct fault *f = &faults[p->fault];
	int i;

	switch (f->scope) {
	case S_NOEVENT:
		return true;
	case S_QP:
		return !strcmp(f->name, "abort") || c->qps[p->target].first_event;
	case S_DEVICE:
		return c->device_fatal;
	case S_ALL:
		for (i = 0; i < c->nqp; i++)
			if (!c->qps[i].first_event)
				return false;
		return true;
	}
	return true;
}

static const char *styles_str(struct client *c, char *buf, size_t len)
{
	size_t n = 0;
	int i;

	for (i = 0; i < c->nqp && n < len; i++) {
		struct qp *qp = &c->qps[i];

		n += snprintf(buf + n, len - n, "%s%s/%d%s%s", i ? "," : "", style_names[qp->style],
			      qp->sig_every, qp->scq->event || qp->rcq->event ? "+cq-event" : "",
			      qp->scq != qp->rcq ? "+2cq" : "");
		if (qp->srq && n < len)
			n += snprintf(buf + n, len - n, "+srq%d", qp->srq->idx);
	}
	return buf;
}

static bool run_one(int run, uint64_t seed, const int *allowed, int nallowed, int duration_ms)
{
	struct client *c = calloc(1, sizeof(*c));
	struct plan *p = &c->plan;
	const struct fault *f;
	struct addrinfo *ai = NULL, hints = { .ai_family = AF_INET };
	pthread_t async_t, cqev_t, cm_t;
	bool async_on = false, cqev_on = false, cm_on = false, any_event_cq = false;
	struct worker workers[2];
	int nworkers = 0, i, qn, threads;
	char portstr[16], styles[768], srqs[160];
	unsigned long tot[2][5] = {};
	double until, t_start = now(), t_setup = 0, t_reap = 0, t_down;
	bool pass;

	c->run = run;
	pthread_mutex_init(&c->err_lock, NULL);
	make_plan(p, seed, allowed, nallowed, duration_ms);
	f = &faults[p->fault];
	watchdog(c, "setup", 120);
	c->nqp = p->nqp;
	/* A lost device (CQs frozen) flushes its SRQs; a removed one (rmmod)
	 * ends its QPs through vt3d, which flushes nothing of them. */
	c->lost_run = f->scope == S_DEVICE && strcmp(f->name, "rmmod");
	c->removed_run = !strcmp(f->name, "rmmod");
	c->may_fail = f->scope == S_QP ? p->target : f->scope == S_NOEVENT ? -1 : -2;
	for (i = 0; i < p->nsrq; i++) {
		c->srqs[i].idx = i;
		c->srqs[i].c = c;
		pthread_mutex_init(&c->srqs[i].lock, NULL);
	}
	for (i = 0; i < p->ncq; i++)
		pthread_mutex_init(&c->cqs[i].lock, NULL);
	for (i = 0; i < p->nqp; i++) {
		struct qp *qp = &c->qps[i];

		qp->idx = i;
		qp->c = c;
		qp->style = p->style[i];
		qp->sig_every = p->sig_every[i];
		qp->scq = &c->cqs[p->send_cq[i]];
		qp->rcq = &c->cqs[p->recv_cq[i]];
		qp->srq = p->srq[i] >= 0 ? &c->srqs[p->srq[i]] : NULL;
		qp->last_write = -1;
		pthread_mutex_init(&qp->lock, NULL);
		qp->q[SQ].w = calloc(MAX_WR, sizeof(struct wrec));
		qp->q[RQ].w = calloc(MAX_WR, sizeof(struct wrec));
		any_event_cq |= p->cq_event[p->send_cq[i]] || p->cq_event[p->recv_cq[i]];
	}
	snprintf(portstr, sizeof(portstr), "%d", port);
	c->ch = rdma_create_event_channel();
	if (!c->ch || getaddrinfo(server_ip, portstr, &hints, &ai)) {
		cfail(c, "cannot resolve %s / no event channel", server_ip);
		goto out;
	}
	for (i = 0; i < p->nqp; i++)
		if (connect_qp(c, &c->qps[i], ai))
			goto out;

	/* Traffic. */
	c->t0 = now();
	t_setup = c->t0 - t_start;
	watchdog(c, "traffic", 120 + 2 * tcp_timeout);
	async_on = !pthread_create(&async_t, NULL, async_thread, c);
	cm_on = !pthread_create(&cm_t, NULL, cm_thread, c);
	if (any_event_cq)
		cqev_on = !pthread_create(&cqev_t, NULL, cq_event_thread, c);
	for (i = 0; i < p->nworkers; i++) {
		workers[i].c = c;
		workers[i].n = i;
		if (!pthread_create(&workers[i].t, NULL, worker_thread, &workers[i]))
			nworkers++;
	}
	while (now() < c->t0 + p->fault_at)
		usleep(5000);
	vlog("fault %s on q%d\n", f->name, p->target);
	if (f->who == HOST)
		host_fault(c);
	if (!strcmp(f->name, "mute-commands"))
		muted_command(c);
	else if (f->who == LOCAL)
		local_fault(c);
	c->t_end = now();
	/* The fault shows before the end (the peer's act_ms came with the
	 * connect; a timeout takes vt3d's TCP timeout). */
	until = now() + tcp_timeout + 15;
	while (!target_hit(c) && now() < until)
		usleep(5000);
	while (now() < c->t0 + p->duration)
		usleep(5000);
	c->t_end = now();

	/* The end: every WR accounted for, bounded. */
	watchdog(c, "reaping", 60 + 2 * tcp_timeout);
	t_reap = now();
	end_traffic(c);
	until = now() + tcp_timeout + 20;
	for (;;) {
		bool all = true;

		for (i = 0; i < c->nqp; i++)
			all &= qp_accounted(&c->qps[i]);
		if ((all && srq_accounted(c)) || now() > until)
			break;
		usleep(5000);
	}
	/* A device loss too: what was posted completes, from libvt3's own books. */
	for (i = 0; i < c->nqp; i++)
		if (!qp_accounted(&c->qps[i]))
			cfail(c, "q%d: signaled WRs without a completion %.0f s after the end", i,
			      now() - t_reap);
	srq_check_last_wqe(c);
	c->stop = true;
	for (i = 0; i < nworkers; i++)
		pthread_join(workers[i].t, NULL);
	if (async_on)
		pthread_join(async_t, NULL);
	if (cqev_on)
		pthread_join(cqev_t, NULL);
	if (cm_on)
		pthread_join(cm_t, NULL);
	cm_on = async_on = cqev_on = false;
	t_reap = now() - t_reap;

out:
	/* Teardown: destroy never hangs; then nothing of any QP is left in a CQ. */
	watchdog(c, "teardown", 90);
	t_down = now();
	c->stop = true;
	if (async_on)
		pthread_join(async_t, NULL);
	if (cm_on)
		pthread_join(cm_t, NULL);
	/* What the device wrote before LAST_WQE_REACHED is the SRQ's, not lost. */
	for (i = 0; i < p->ncq; i++)
		if (c->cqs[i].cq)
			poll_cq(c, &c->cqs[i], NULL);
	for (i = 0; i < c->nqp; i++)
		if (c->qps[i].qp)
			destroy_qp(c, &c->qps[i]);
	for (i = 0; i < p->ncq; i++)
		if (c->cqs[i].cq)
			poll_cq(c, &c->cqs[i], NULL);
	for (i = 0; i < c->nqp; i++) {
		struct qp *qp = &c->qps[i];

		if (qp->qpn)
			check_queues(c, qp);
		for (qn = SQ; qn <= RQ; qn++) {
			tot[qn][0] += qp->q[qn].posted;
			tot[qn][1] += qp->q[qn].ok;
			tot[qn][2] += qp->q[qn].flush;
			tot[qn][3] += qp->q[qn].err;
			tot[qn][4] += qp->q[qn].silent;
		}
		if (qp->id)
			rdma_destroy_id(qp->id);
		if (qp->mr)
			ibv_dereg_mr(qp->mr);
		free(qp->buf);
	}
	/* Every QP of the SRQs is gone: what they still hold is accounted. */
	for (i = 0; i < p->nsrq; i++)
		srq_end(c, &c->srqs[i]);
	if (c->t0 && !c->err[0])
		check_events(c);
	for (i = 0; i < p->ncq; i++) {
		if (!c->cqs[i].cq)
			continue;
		if (c->cqs[i].unacked)
			ibv_ack_cq_events(c->cqs[i].cq, c->cqs[i].unacked);
		if (ibv_destroy_cq(c->cqs[i].cq) && !c->device_fatal)
			cfail(c, "ibv_destroy_cq failed");
	}
	if (c->cch)
		ibv_destroy_comp_channel(c->cch);
	if (c->pd)
		ibv_dealloc_pd(c->pd);
	if (c->ch)
		rdma_destroy_event_channel(c->ch);
	if (ai)
		freeaddrinfo(ai);
	alarm(0);
	t_down = now() - t_down;

	threads = 1 + nworkers + any_event_cq + 1;	/* + the main thread's cm part */
	srq_counts(c, srqs, sizeof(srqs));
	pass = !c->err[0];
	printf("RUN %d seed %" PRIu64 " fault %s side %d target q%d qps %d cqs %d threads %d "
	       "styles %s; %.2f s: %s: sq %lu posted %lu ok %lu flushed %lu error %lu silent; "
	       "rq %lu posted %lu ok %lu flushed %lu error; %s; "
	       "events fatal %lu req %lu access %lu close %lu device %lu other %lu last-wqe %lu; "
	       "cq-wakeups %lu fallback %lu; setup %.2f reap %.2f teardown %.2f s%s%s\n",
	       run, seed, f->name, p->side, p->target, p->nqp, p->ncq, threads,
	       styles_str(c, styles, sizeof(styles)), now() - t_start, pass ? "ok" : "FAIL",
	       tot[SQ][0], tot[SQ][1], tot[SQ][2], tot[SQ][3], tot[SQ][4],
	       tot[RQ][0], tot[RQ][1], tot[RQ][2], tot[RQ][3], srqs,
	       c->events[0], c->events[1], c->events[2], c->events[3], c->events[4], c->events[5],
	       c->last_wqe_events,
	       c->cq_wakeups, c->fallback_polls, t_setup, t_reap, t_down, pass ? "" : " -- ", c->err);
	fflush(stdout);
	for (i = 0; i < c->nqp; i++) {
		free(c->qps[i].q[SQ].w);
		free(c->qps[i].q[RQ].w);
	}
	for (i = 0; i < p->nsrq; i++)
		free(c->srqs[i].w);
	free(c);
	return pass;
}

/* ----------------------------------------------------------------- main */

static void usage(void)
{
	int i;

	fprintf(stderr,
		"usage: vt3-chaos server [--port P] [--timeout S] [-v]\n"
		"       vt3-chaos client --server IP [--port P] [--seed S] [--runs N] [--faults F[,F..]]\n"
		"                        [--cycle] [--ack FILE] [--duration MS] [--tcp-timeout S] [-v]\n"
		"       vt3-chaos list\n"
		"faults (default: every non-destructive one):\n");
	for (i = 0; i < N_FAULTS; i++)
		fprintf(stderr, "  %-17s %s%s\n", faults[i].name,
			faults[i].who == LOCAL ? "the client itself" :
			faults[i].who == PEER ? "the server, on request" : "the host, after READY",
			faults[i].destructive ? " (destructive: last of a batch)" : "");
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "port", required_argument, NULL, 'p' },
		{ "server", required_argument, NULL, 's' },
		{ "seed", required_argument, NULL, 'S' },
		{ "runs", required_argument, NULL, 'n' },
		{ "faults", required_argument, NULL, 'f' },
		{ "ack", required_argument, NULL, 'a' },
		{ "duration", required_argument, NULL, 'd' },
		{ "tcp-timeout", required_argument, NULL, 'T' },
		{ "timeout", required_argument, NULL, 't' },
		{ "cycle", no_argument, NULL, 'c' },
		{ "signaled-flush-only", no_argument, NULL, 'F' },
		{ "verbose", no_argument, NULL, 'v' },
		{}
	};
	uint64_t seed = 0;
	bool seed_given = false, cycle = false;
	int runs = 1, duration_ms = 1500, allowed[N_FAULTS], nallowed = 0, opt, i;
	char *fault_list = NULL;
	const char *role;

	if (argc < 2) {
		usage();
		return 2;
	}
	role = argv[1];
	if (!strcmp(role, "list")) {
		usage();
		return 0;
	}
	optind = 2;
	while ((opt = getopt_long(argc, argv, "p:s:S:n:f:a:d:T:t:cFv", opts, NULL)) != -1) {
		switch (opt) {
		case 'p': port = atoi(optarg); break;
		case 's': server_ip = optarg; break;
		case 'S': seed = strtoull(optarg, NULL, 0); seed_given = true; break;
		case 'n': runs = atoi(optarg); break;
		case 'f': fault_list = strdup(optarg); break;
		case 'a': ack_file = optarg; break;
		case 'd': duration_ms = atoi(optarg); break;
		case 'T': tcp_timeout = atoi(optarg); break;
		case 't': timeout_s = atoi(optarg); break;
		case 'c': cycle = true; break;
		case 'F': signaled_flush_only = true; break;
		case 'v': verbose = 1; break;
		default: usage(); return 2;
		}
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (!strcmp(role, "server"))
		return run_server(port);
	if (strcmp(role, "client") || !server_ip || runs < 1 || duration_ms < 100) {
		usage();
		return 2;
	}
	if (fault_list) {
		char *tok, *save;

		for (tok = strtok_r(fault_list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
			int k = fault_find(tok);

			if (k < 0) {
				fprintf(stderr, "unknown fault %s (vt3-chaos list)\n", tok);
				return 2;
			}
			allowed[nallowed++] = k;
		}
	} else {
		for (i = 0; i < N_FAULTS; i++)
			if (!faults[i].destructive)
				allowed[nallowed++] = i;
	}
	if (!seed_given)
		seed = (uint64_t)time(NULL) * 1000 + getpid() % 1000;
	signal(SIGALRM, on_alarm);
	signal(SIGPIPE, SIG_IGN);
	printf("vt3-chaos: seed %" PRIu64 ", %d run(s)\n", seed, runs);
	for (i = 0; i < runs; i++) {
		/* --cycle: the faults in turn (as --faults F alone would pick F). */
		bool ok = cycle ? run_one(i, seed + i, &allowed[i % nallowed], 1, duration_ms) :
				  run_one(i, seed + i, allowed, nallowed, duration_ms);

		if (ok)
			passed++;
		else
			failed++;
	}
	printf("vt3-chaos: %d passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}
