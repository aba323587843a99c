// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
/*
 * VT3_WRCHECK=1 (docs/wrcheck.md): every WR posted is recorded by its
 * queue index, every completion handed back is matched to that record,
 * and the provider's own positions tell when a WR was passed. A WR the
 * provider passed without a completion it owed is lost (a signaled send,
 * a receive, or any WR once its QP is in error: the flush owes it); a
 * second completion of one record is a duplicate; what is still owed when
 * the QP goes (libvt3 drops it at destroy, as mlx5's cq_clean does) is
 * unpolled, not lost. Reports: at QP/SRQ destroy, at process exit for
 * what is alive, and at once for each lost or duplicated WR (a program
 * that then hangs still leaves the evidence).
 *
 * Locks: the records of an SQ or RQ are written by posts under the
 * queue's lock and judged under its CQ's lock (the flush holds both); an
 * SRQ's under the SRQ's lock; the list of what is alive and the process
 * totals under wrc_lock, taken at create, destroy and exit only.
 */
#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "vt3.h"

enum {
	VT3_WRC_POSTED = 1 << 0,
	VT3_WRC_OWED = 1 << 1,		/* signaled send, or a receive */
	VT3_WRC_RELEASED = 1 << 2,	/* SRQ: its QP went before it was polled */
};

static pthread_mutex_t wrc_lock = PTHREAD_MUTEX_INITIALIZER;
static LIST_HEAD(wrc_live);
static struct {
	bool on;
	char *file;			/* VT3_WRCHECK_FILE, or NULL */
	unsigned int qps, srqs, alive;
	struct vt3_wrcheck_counts n;
} wrc;

/* Read once per context, at its setup: the hooks then test a pointer. */
bool vt3_wrcheck_enabled(void)
{
	const char *env = getenv("VT3_WRCHECK");
	const char *file = getenv("VT3_WRCHECK_FILE");

	if (!env || strcmp(env, "1"))
		return false;
	pthread_mutex_lock(&wrc_lock);
	if (!wrc.on && file && *file)
		wrc.file = strdup(file);
	wrc.on = true;
	pthread_mutex_unlock(&wrc_lock);
	return true;
}

/* A line of JSON, built in place; too long a line is cut, never overrun. */
struct wrc_buf {
	char s[4096];
	size_t len;
};

static void wrc_add(struct wrc_buf *b, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (b->len >= sizeof(b->s))
		return;
	va_start(ap, fmt);
	n = vsnprintf(b->s + b->len, sizeof(b->s) - b->len, fmt, ap);
	va_end(ap);
	if (n > 0)
		b->len = b->len + n < sizeof(b->s) ? b->len + n : sizeof(b->s) - 1;
}

/* One write per line, O_APPEND: lines of several processes never mix. */
static void wrc_emit(struct wrc_buf *b)
{
	int fd;

	if (!wrc.file)
		return;
	wrc_add(b, "\n");
	fd = open(wrc.file, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
	if (fd < 0) {
		fprintf(stderr, "libvt3 wrcheck: %s: %s\n", wrc.file, strerror(errno));
		return;
	}
	if (write(fd, b->s, b->len) != (ssize_t)b->len)
		fprintf(stderr, "libvt3 wrcheck: %s: short write\n", wrc.file);
	close(fd);
}

static void wrc_note(uint64_t *count, uint64_t *ids, unsigned int *nids,
		     uint64_t wr_id)
{
	(*count)++;
	if (*nids < VT3_WRCHECK_IDS)
		ids[(*nids)++] = wr_id;
}

/*
 * A lost or duplicated WR, reported when seen (the first VT3_WRCHECK_IDS
 * of a queue): @who is "qp_num":N or "srq":H, @queue sq, rq or srq.
 */
static void wrc_event(const char *what, const char *who, uint32_t id,
		      const char *queue, uint64_t wr_id, uint32_t seq)
{
	struct wrc_buf b = {};

	fprintf(stderr, "libvt3 wrcheck: %s %u %s: WR %#llx (index %u) %s\n",
		strcmp(who, "srq") ? "QP" : "SRQ", id, queue,
		(unsigned long long)wr_id, seq,
		strcmp(what, "lost") ? "completed twice" :
				       "passed without its completion");
	wrc_add(&b, "{\"wrcheck\":\"%s\",\"pid\":%d,\"%s\":%u,\"queue\":\"%s\",\"wr_id\":%llu,\"index\":%u}",
		what, (int)getpid(), who, id, queue, (unsigned long long)wr_id, seq);
	wrc_emit(&b);
}

static void wrc_qp_event(struct vt3_wq *wq, const char *what, uint64_t wr_id,
			 uint32_t seq, unsigned int nth)
{
	if (nth < VT3_WRCHECK_IDS)
		wrc_event(what, "qp_num", wq->qp->ibv_qp.qp_num,
			  wq->recv ? "rq" : "sq", wr_id, seq);
}

static struct vt3_wrcheck_rec *wrc_rec(struct vt3_wrcheck_q *q, uint32_t seq)
{
	return &q->rec[seq & (q->size - 1)];
}

static bool wrc_q_init(struct vt3_wrcheck_q *q, uint32_t size, uint32_t start)
{
	q->rec = calloc(size, sizeof(*q->rec));
	q->size = size;
	q->retired = start;
	return q->rec;
}

static bool wrc_pending(const struct vt3_wrcheck_rec *r, uint32_t seq)
{
	return r->flags & VT3_WRC_POSTED && r->seq == seq && !r->ncomp;
}

/*
 * The provider passed every WR before @upto (a later one completed, or
 * the flush went past it): those it owed a completion and never gave one
 * are lost; an unsignaled send retired by the device owed none. CQ lock
 * held.
 */
static void wrc_retire(struct vt3_wq *wq, struct vt3_wrcheck_q *q, uint32_t upto)
{
	/* Backwards, or past anything the ring holds: a device bug, not ours to judge. */
	if (upto - q->retired > q->size / 2)
		return;
	for (; q->retired != upto; q->retired++) {
		struct vt3_wrcheck_rec *r = wrc_rec(q, q->retired);

		if (!wrc_pending(r, q->retired))
			continue;
		if (r->flags & VT3_WRC_OWED ||
		    (q->flushing && (int32_t)(r->seq - q->flush_from) >= 0)) {
			wrc_qp_event(wq, "lost", r->wr_id, r->seq, q->n.nlost);
			wrc_note(&q->n.lost, q->n.lost_ids, &q->n.nlost, r->wr_id);
		} else {
			q->n.unsignaled++;
		}
	}
}

/* Posts of [start, wq->prod), before they are published; wq->lock held. */
void vt3_wrcheck_posted(struct vt3_wq *wq, uint32_t start)
{
	struct vt3_wrcheck_q *q = wq->check;
	uint32_t i;

	for (i = start; i != wq->prod; i++) {
		const struct vt3_sq_wqe *wqe = vt3_wq_slot(wq, i);
		bool owed = wq->recv || wqe->flags & VT3_WQE_SIGNALED;

		*wrc_rec(q, i) = (struct vt3_wrcheck_rec){
			.wr_id = wq->swqe[i & (wq->depth - 1)].wr_id,
			.seq = i,
			.flags = VT3_WRC_POSTED | (owed ? VT3_WRC_OWED : 0),
		};
		q->n.posted++;
	}
}

/*
 * A completion of WR @idx is handed back (a device CQE, or the flush):
 * its first, or a duplicate. Queues complete in order, so the WRs before
 * it were passed. CQ lock held; called before the provider moves
 * wq->done, whose release publishes the records to the posters.
 */
void vt3_wrcheck_completed(struct vt3_wq *wq, uint32_t idx, uint64_t wr_id,
			   bool flush)
{
	struct vt3_wrcheck_q *q = wq->check;
	struct vt3_wrcheck_rec *r = wrc_rec(q, idx);

	if (!(r->flags & VT3_WRC_POSTED) || r->seq != idx || r->ncomp) {
		wrc_qp_event(wq, "duplicated", wr_id, idx, q->n.ndup);
		wrc_note(&q->n.duplicated, q->n.dup_ids, &q->n.ndup, wr_id);
		return;
	}
	r->ncomp = 1;
	q->n.completed++;
	if (flush)
		q->n.flushed++;
	wrc_retire(wq, q, idx + 1);
}

/* The queue's flush begins at wq->flush_pos: from there on every WR is owed. */
void vt3_wrcheck_flush_begins(struct vt3_wq *wq)
{
	wq->check->flushing = true;
	wq->check->flush_from = wq->flush_pos;
}

/* The flush went up to wq->flush_pos (both locks held). */
void vt3_wrcheck_flushed_to(struct vt3_wq *wq)
{
	wrc_retire(wq, wq->check, wq->flush_pos);
}

/* Modify to RESET dropped what was outstanding: neither lost nor owed. */
void vt3_wrcheck_reset(struct vt3_wq *wq)
{
	struct vt3_wrcheck_q *q = wq->check;

	pthread_spin_lock(&wq->cq->lock);
	pthread_spin_lock(&wq->lock);
	if (wq->prod - q->retired <= q->size / 2)
		for (; q->retired != wq->prod; q->retired++)
			if (wrc_pending(wrc_rec(q, q->retired), q->retired))
				q->n.reset++;
	q->flushing = false;
	pthread_spin_unlock(&wq->lock);
	pthread_spin_unlock(&wq->cq->lock);
}

/*
 * At destroy or exit: what the provider passed is judged, and what is
 * still owed is unpolled: a signaled send or a receive, or any WR the
 * QP's flush would have returned (from flush_pos on, once in error).
 */
static void wrc_settle(struct vt3_wq *wq, struct vt3_wrcheck_q *q)
{
	uint32_t i;

	wrc_retire(wq, q, wq->flushing ? wq->flush_pos :
			  __atomic_load_n(&wq->done, __ATOMIC_ACQUIRE));
	if (wq->prod - q->retired > q->size / 2)
		return;
	for (i = q->retired; i != wq->prod; i++) {
		struct vt3_wrcheck_rec *r = wrc_rec(q, i);

		if (!wrc_pending(r, i))
			continue;
		if (r->flags & VT3_WRC_OWED ||
		    (wq->error && (int32_t)(i - wq->flush_pos) >= 0))
			q->n.unpolled++;
		else
			q->n.unsignaled++;
	}
}

static void wrc_sum(struct vt3_wrcheck_counts *to,
		    const struct vt3_wrcheck_counts *from)
{
	unsigned int i;

	to->posted += from->posted;
	to->completed += from->completed;
	to->flushed += from->flushed;
	to->lost += from->lost;
	to->duplicated += from->duplicated;
	to->unpolled += from->unpolled;
	to->unsignaled += from->unsignaled;
	to->reset += from->reset;
	for (i = 0; i < from->nlost && to->nlost < VT3_WRCHECK_IDS; i++)
		to->lost_ids[to->nlost++] = from->lost_ids[i];
	for (i = 0; i < from->ndup && to->ndup < VT3_WRCHECK_IDS; i++)
		to->dup_ids[to->ndup++] = from->dup_ids[i];
}

static void wrc_add_counts(struct wrc_buf *b, const struct vt3_wrcheck_counts *n)
{
	wrc_add(b, "\"posted\":%llu,\"completed\":%llu,\"flushed\":%llu,\"lost\":%llu,\"duplicated\":%llu,\"unpolled\":%llu,\"unsignaled\":%llu,\"reset\":%llu",
		(unsigned long long)n->posted, (unsigned long long)n->completed,
		(unsigned long long)n->flushed, (unsigned long long)n->lost,
		(unsigned long long)n->duplicated, (unsigned long long)n->unpolled,
		(unsigned long long)n->unsignaled, (unsigned long long)n->reset);
}

static void wrc_add_ids(struct wrc_buf *b, const char *name,
			const uint64_t *ids, unsigned int n)
{
	unsigned int i;

	wrc_add(b, ",\"%s\":[", name);
	for (i = 0; i < n; i++)
		wrc_add(b, "%s%llu", i ? "," : "", (unsigned long long)ids[i]);
	wrc_add(b, "]");
}

/*
 * One QP's or SRQ's report: a JSON line, a line on stderr if anything is
 * lost, duplicated or unpolled, and its numbers into the process totals.
 * @q: its queues (@nq of them), each listed apart under @names if given.
 */
static void wrc_report(const char *kind, const char *who, uint32_t id,
		       bool alive, const struct vt3_wrcheck_q *q,
		       const char *const *names, unsigned int nq)
{
	struct vt3_wrcheck_counts all = {};
	struct wrc_buf b = {};
	unsigned int i;

	for (i = 0; i < nq; i++)
		wrc_sum(&all, &q[i].n);
	wrc_add(&b, "{\"wrcheck\":\"%s\",\"pid\":%d,\"%s\":%u,\"at\":\"%s\",",
		kind, (int)getpid(), who, id, alive ? "exit" : "destroy");
	wrc_add_counts(&b, &all);
	wrc_add_ids(&b, "lost_wr_ids", all.lost_ids, all.nlost);
	wrc_add_ids(&b, "duplicated_wr_ids", all.dup_ids, all.ndup);
	for (i = 0; names && i < nq; i++) {
		wrc_add(&b, ",\"%s\":{", names[i]);
		wrc_add_counts(&b, &q[i].n);
		wrc_add(&b, "}");
	}
	wrc_add(&b, "}");
	wrc_emit(&b);
	if (all.lost || all.duplicated || all.unpolled)
		fprintf(stderr, "libvt3 wrcheck: %s %u (%s): posted %llu, completed %llu, lost %llu, duplicated %llu, unpolled %llu\n",
			strcmp(kind, "qp") ? "SRQ" : "QP", id,
			alive ? "alive at exit" : "destroyed",
			(unsigned long long)all.posted,
			(unsigned long long)all.completed,
			(unsigned long long)all.lost,
			(unsigned long long)all.duplicated,
			(unsigned long long)all.unpolled);
	wrc_sum(&wrc.n, &all);
	if (alive)
		wrc.alive++;
}

static void wrc_qp_report(struct vt3_wrcheck *c, bool alive)
{
	static const char *const names[] = { "sq", "rq" };
	struct vt3_qp *qp = c->qp;

	wrc_settle(&qp->sq, &c->q[0]);
	if (c->q[1].rec)
		wrc_settle(&qp->rq, &c->q[1]);
	wrc_report("qp", "qp_num", qp->ibv_qp.qp_num, alive, c->q, names,
		   c->q[1].rec ? 2 : 1);
	wrc.qps++;
}

static void wrc_free(struct vt3_wrcheck *c)
{
	free(c->q[0].rec);
	free(c->q[1].rec);
	free(c);
}

/* On the list of what is alive, for the exit report. */
static void wrc_watch(struct vt3_wrcheck *c)
{
	pthread_mutex_lock(&wrc_lock);
	list_add_tail(&wrc_live, &c->entry);
	pthread_mutex_unlock(&wrc_lock);
}

/* After a successful create: a QP of an SRQ has no RQ of its own to watch. */
void vt3_wrcheck_qp_create(struct vt3_qp *qp)
{
	struct vt3_wrcheck *c;

	if (!to_vt3_ctx(qp->ibv_qp.context)->wrcheck)
		return;
	c = calloc(1, sizeof(*c));
	if (!c || !wrc_q_init(&c->q[0], 2 * qp->sq.depth, qp->sq.prod) ||
	    (qp->rq.depth &&
	     !wrc_q_init(&c->q[1], 2 * qp->rq.depth, qp->rq.prod))) {
		fprintf(stderr, "libvt3 wrcheck: QP %u: no memory, not watched\n",
			qp->ibv_qp.qp_num);
		if (c)
			wrc_free(c);
		return;
	}
	c->qp = qp;
	wrc_watch(c);
	qp->wrcheck = c;
	qp->sq.check = &c->q[0];
	if (c->q[1].rec)
		qp->rq.check = &c->q[1];
}

static void wrc_srq_event(struct vt3_srq *srq, const char *what,
			  const struct vt3_wrcheck_rec *r, unsigned int nth)
{
	if (nth < VT3_WRCHECK_IDS)
		wrc_event(what, "srq", srq->ibv_srq.handle, "srq", r->wr_id, r->seq);
}

void vt3_wrcheck_srq_create(struct vt3_srq *srq)
{
	struct vt3_wrcheck *c;

	if (!to_vt3_ctx(srq->ibv_srq.context)->wrcheck)
		return;
	c = calloc(1, sizeof(*c));
	if (!c || !wrc_q_init(&c->q[0], srq->depth, srq->prod)) {
		fprintf(stderr, "libvt3 wrcheck: SRQ %u: no memory, not watched\n",
			srq->ibv_srq.handle);
		free(c);
		return;
	}
	c->srq = srq;
	wrc_watch(c);
	srq->wrcheck = c;
}

/*
 * A slot the provider gave back for a post: the WR it held is lost unless
 * it completed or its QP's destroy dropped it. srq->lock held.
 */
void vt3_wrcheck_srq_posted(struct vt3_srq *srq, uint32_t start)
{
	struct vt3_wrcheck_q *q = &srq->wrcheck->q[0];
	uint32_t i;

	for (i = start; i != srq->prod; i++) {
		struct vt3_wrcheck_rec *r = wrc_rec(q, i);

		if (r->flags & VT3_WRC_POSTED && !r->ncomp &&
		    !(r->flags & VT3_WRC_RELEASED)) {
			wrc_srq_event(srq, "lost", r, q->n.nlost);
			wrc_note(&q->n.lost, q->n.lost_ids, &q->n.nlost, r->wr_id);
		}
		*r = (struct vt3_wrcheck_rec){
			.wr_id = srq->slots[i & (srq->depth - 1)].wr_id,
			.seq = i,
			.flags = VT3_WRC_POSTED | VT3_WRC_OWED,
		};
		q->n.posted++;
	}
}

/*
 * The provider completed SRQ WR @idx: handed back (@returned; by the
 * lost device's @flush or a CQE) or dropped with its destroyed QP
 * (unpolled). srq->lock held.
 */
void vt3_wrcheck_srq_completed(struct vt3_srq *srq, uint32_t idx,
			       bool returned, bool flush)
{
	struct vt3_wrcheck_q *q = &srq->wrcheck->q[0];
	struct vt3_wrcheck_rec *r = wrc_rec(q, idx);

	if (!(r->flags & VT3_WRC_POSTED) || r->seq != idx || r->ncomp ||
	    r->flags & VT3_WRC_RELEASED) {
		wrc_srq_event(srq, "duplicated", r, q->n.ndup);
		wrc_note(&q->n.duplicated, q->n.dup_ids, &q->n.ndup, r->wr_id);
		return;
	}
	if (!returned) {
		r->flags |= VT3_WRC_RELEASED;
		q->n.unpolled++;
		return;
	}
	r->ncomp = 1;
	q->n.completed++;
	if (flush)
		q->n.flushed++;
}

/*
 * A resize moved the slots to a table of @depth, the SRQ's from now on:
 * the records of outstanding WRs follow them. srq->lock held.
 */
void vt3_wrcheck_srq_resized(struct vt3_srq *srq, uint32_t depth)
{
	struct vt3_wrcheck *c = srq->wrcheck;
	struct vt3_wrcheck_q *q = &c->q[0];
	struct vt3_wrcheck_rec *rec;
	uint32_t i;

	if (q->size == depth)
		return;
	rec = calloc(depth, sizeof(*rec));
	if (!rec) {
		fprintf(stderr, "libvt3 wrcheck: SRQ %u: no memory for its resize, no longer watched\n",
			srq->ibv_srq.handle);
		srq->wrcheck = NULL;
		pthread_mutex_lock(&wrc_lock);
		list_del_from(&wrc_live, &c->entry);
		pthread_mutex_unlock(&wrc_lock);
		wrc_free(c);
		return;
	}
	for (i = 0; i < q->size; i++)
		if (q->rec[i].flags & VT3_WRC_POSTED && !q->rec[i].ncomp &&
		    !(q->rec[i].flags & VT3_WRC_RELEASED))
			rec[q->rec[i].seq & (depth - 1)] = q->rec[i];
	free(q->rec);
	q->rec = rec;
	q->size = depth;
}

/* What the SRQ still holds is unpolled; a WR whose slot it gave up, lost. */
static void wrc_srq_report(struct vt3_wrcheck *c, bool alive)
{
	struct vt3_srq *srq = c->srq;
	struct vt3_wrcheck_q *q = &c->q[0];
	uint32_t i;

	for (i = 0; i < q->size; i++) {
		struct vt3_wrcheck_rec *r = &q->rec[i];
		const struct vt3_srq_slot *slot = &srq->slots[i];

		if (!(r->flags & VT3_WRC_POSTED) || r->ncomp ||
		    r->flags & VT3_WRC_RELEASED)
			continue;
		if (slot->owed && slot->idx == r->seq) {
			q->n.unpolled++;
		} else {
			wrc_srq_event(srq, "lost", r, q->n.nlost);
			wrc_note(&q->n.lost, q->n.lost_ids, &q->n.nlost, r->wr_id);
		}
	}
	wrc_report("srq", "srq", srq->ibv_srq.handle, alive, q, NULL, 1);
	wrc.srqs++;
}

/* wrc_lock held. */
static void wrc_report_one(struct vt3_wrcheck *c, bool alive)
{
	if (c->srq)
		wrc_srq_report(c, alive);
	else
		wrc_qp_report(c, alive);
}

/* After the destroy took it off its CQs (QP) or the kernel's (SRQ). */
static void wrc_destroyed(struct vt3_wrcheck *c)
{
	if (!c)
		return;
	pthread_mutex_lock(&wrc_lock);
	list_del_from(&wrc_live, &c->entry);
	wrc_report_one(c, false);
	pthread_mutex_unlock(&wrc_lock);
	wrc_free(c);
}

void vt3_wrcheck_qp_destroy(struct vt3_qp *qp)
{
	wrc_destroyed(qp->wrcheck);
}

void vt3_wrcheck_srq_destroy(struct vt3_srq *srq)
{
	wrc_destroyed(srq->wrcheck);
}

/*
 * A lock at exit: another thread may hold it for a moment (a poll) or
 * for ever (parked between wr_start and wr_complete). After a bounded
 * wait the report reads without it rather than hang the exit.
 */
static bool wrc_grab(pthread_spinlock_t *lock)
{
	unsigned int i;

	for (i = 0; i < 10000; i++) {
		if (!pthread_spin_trylock(lock))
			return true;
		sched_yield();
	}
	return false;
}

static void wrc_report_alive(struct vt3_wrcheck *c)
{
	pthread_spinlock_t *locks[4];
	unsigned int n = 0, i;

	if (c->srq) {
		locks[n++] = &c->srq->lock;
	} else {
		/* The CQs first, in the provider's order, then the queues. */
		struct vt3_cq *a = c->qp->sq.cq, *b = c->qp->rq.cq;

		locks[n++] = a < b ? &a->lock : &b->lock;
		if (a != b)
			locks[n++] = a < b ? &b->lock : &a->lock;
		locks[n++] = &c->qp->sq.lock;
		locks[n++] = &c->qp->rq.lock;
	}
	for (i = 0; i < n; i++)
		if (!wrc_grab(locks[i]))
			locks[i] = NULL;
	wrc_report_one(c, true);
	while (n--)
		if (locks[n])
			pthread_spin_unlock(locks[n]);
}

/* Process exit: what is alive, then the summary line. */
static void __attribute__((destructor)) vt3_wrcheck_exit(void)
{
	struct vt3_wrcheck *c;
	struct wrc_buf b = {};

	pthread_mutex_lock(&wrc_lock);
	if (!wrc.on) {
		pthread_mutex_unlock(&wrc_lock);
		return;
	}
	list_for_each(&wrc_live, c, entry)
		wrc_report_alive(c);
	wrc_add(&b, "{\"wrcheck\":\"summary\",\"pid\":%d,\"qps\":%u,\"srqs\":%u,\"alive\":%u,",
		(int)getpid(), wrc.qps, wrc.srqs, wrc.alive);
	wrc_add_counts(&b, &wrc.n);
	wrc_add_ids(&b, "lost_wr_ids", wrc.n.lost_ids, wrc.n.nlost);
	wrc_add_ids(&b, "duplicated_wr_ids", wrc.n.dup_ids, wrc.n.ndup);
	wrc_add(&b, "}");
	wrc_emit(&b);
	fprintf(stderr, "libvt3 wrcheck: pid %d: %u QPs, %u SRQs (%u alive at exit): posted %llu, completed %llu (%llu flushed), lost %llu, duplicated %llu, unpolled %llu\n",
		(int)getpid(), wrc.qps, wrc.srqs, wrc.alive,
		(unsigned long long)wrc.n.posted,
		(unsigned long long)wrc.n.completed,
		(unsigned long long)wrc.n.flushed,
		(unsigned long long)wrc.n.lost,
		(unsigned long long)wrc.n.duplicated,
		(unsigned long long)wrc.n.unpolled);
	pthread_mutex_unlock(&wrc_lock);
}
