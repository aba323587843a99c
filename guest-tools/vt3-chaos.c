// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
/*
 * vt3-chaos: a randomized fault soak of the exactly-once contract
 * (docs/architecture.md §5 and §7.5, docs/events.md). librdmacm +
 * libibverbs.
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
 *   host    rst fin blackhole drop delay split corrupt-crc terminate
 *           invalidate-stag device-fatal peer-killed peer-vt3d-killed
 *           vt3d-killed rmmod mute-commands: the client prints
 *             READY <run> <seed> <fault> <side> <qpn> <peer qpn> <stag> <a1> <a2> <a3>
 *           (side 0: the fault is done to the peer's vt3d and QP, 1: to
 *           ours; stag: the peer's rkey or our MR's; a1..a3: drop percent
 *           and seed, delay ms, split tail and hold ms, terminate layer
 *           etype ecode) and keeps its
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
 * flushed (docs/architecture.md §5: every WQE in [cons, prod), signaled or
 * not), so a completion after an unsignaled WR that has none is a loss;
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


/* ---------------------------------------------------------------- client */

const char *const op_names[] = { "SEND", "WRITE", "READ", "RECV" };

static const char *server_ip;
/* --signaled-flush-only: what libvt3 flushes today (only signaled send WRs),
 * to look for other bugs behind that one; the case never passes it. */
bool signaled_flush_only;
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
