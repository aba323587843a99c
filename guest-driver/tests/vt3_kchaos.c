// SPDX-License-Identifier: GPL-2.0
/*
 * vt3_kchaos: the randomized fault soak of guest-tools/vt3-chaos.c for
 * kernel QPs (docs/architecture.md §5 and §7.5), against the same
 * `vt3-chaos server`.
 * It uses the verbs as kernel ULPs do: rdma_cm, ib_alloc_cq with the
 * core's polling (softirq and workqueue CQs, shared by several QPs, some
 * QPs with separate send and receive CQs), wr_cqe done callbacks,
 * ib_drain_qp before destroy.
 *
 *   insmod vt3_kchaos.ko addr=IP [port=P] seed=S runs=N faults=F[,F...]
 *                        [duration_ms=MS]
 *   cat /proc/vt3_kchaos            the log (blocks until the runs end)
 *   echo RUN > /sys/module/vt3_kchaos/parameters/ack
 *   cat /sys/module/vt3_kchaos/parameters/failed; rmmod vt3_kchaos
 *
 * Run i uses seed S + i and fault i of the list (in turn): 2-8 QPs on 1-3 CQs, 1-2 poster threads, every
 * Nth send signaled, SEND/WRITE/READ traffic with verified data, and one
 * fault at a random moment: disconnect (rdma_disconnect), abort
 * (ib_destroy_qp with work in flight, no drain), peer-close, peer-abort
 * (the server, on request), or one the host does (every `vt3d ctl fault`
 * kind but the destructive ones, device-fatal, peer-killed) after the
 * module logged
 *   READY <run> <seed> <fault> <side> <qpn> <peer qpn> <stag> <a1> <a2> <a3>
 * and until the host wrote the run number into `ack`. At the end every
 * QP is disconnected with work in flight and drained with ib_drain_qp
 * (bounded: a drain that does not return is a hang, reported as FAIL).
 *
 * Checks: every signaled send WR and every receive completes exactly
 * once; an unsignaled send never with SUCCESS; per queue in posting order,
 * device completions before the first IB_WC_WR_FLUSH_ERR and every WR
 * after it flushed too; wc->qp is the WR's QP; nothing of a QP comes after
 * ib_destroy_qp returned (and its CQs' pollers were flushed); received
 * and READ data are right; no QP but the target sees an error event
 * before the end. One line per run, as vt3-chaos prints it:
 *   RUN <i> seed <s> fault <f> ... ok|FAIL: <counts> [-- reasons]
 * then "vt3_kchaos: N passed, N failed". With probe=1 two probes come
 * first, each counted as one more run (`probe=1 runs=0`: the probes
 * alone): the lost wake-up (probe_late_event) and a drain on a busy
 * shared CQ (probe_busy_drain).
 */
#include <linux/delay.h>
#include <linux/inet.h>
#include <linux/kthread.h>
#include <linux/module.h>
#include <linux/proc_fs.h>
#include <linux/slab.h>
#include <linux/vmalloc.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>

static char *addr = "10.77.0.1";
module_param(addr, charp, 0444);
MODULE_PARM_DESC(addr, "the vt3-chaos server's IPv4 address");
static ushort port = 7472;
module_param(port, ushort, 0444);
static ulong seed = 1;
module_param(seed, ulong, 0444);
MODULE_PARM_DESC(seed, "the first run's seed");
static int runs = 1;
module_param(runs, int, 0444);
static char *faults = "disconnect";
module_param(faults, charp, 0444);
MODULE_PARM_DESC(faults, "comma-separated fault kinds, drawn per run");
static int duration_ms = 1500;
module_param(duration_ms, int, 0444);
static bool probe;
module_param(probe, bool, 0444);
MODULE_PARM_DESC(probe, "first the late CQ event and busy CQ drain probes (a pass or fail each)");
static int ack = -1;
module_param(ack, int, 0644);
MODULE_PARM_DESC(ack, "the host writes a run's number once it did its fault");
static int failed;
module_param(failed, int, 0444);
MODULE_PARM_DESC(failed, "runs failed so far");

/* The wire protocol of vt3-chaos (guest-tools/vt3-chaos.c). */
#define MAGIC		0x76743363u
#define SLOT		256
#define NSLOT		64
#define RSLOTS		1024
#define RECENT		(RSLOTS / 2)
#define HDR		16
#define ORD		4
enum tag { T_LEN = 1, T_OP, T_CSEND, T_REPLY, T_WRITE, T_STATIC, T_PLAN };
enum action { ACT_NONE, ACT_CLOSE, ACT_ABORT };

struct msg_hdr {
	u32 magic;
	u16 qpi;
	u16 len;
	u32 seq;
	u32 tag;
};

struct req_pd {
	u32 magic;
	u32 qpi;
	u64 seed;
	u32 action;
	u32 act_ms;
};

struct rep_pd {
	u32 magic;
	u32 qpn;
	u64 addr;
	u32 rkey;
	u32 reserved;
};

#define MAX_QPS		8
#define MAX_CQS		3
#define SQ_DEPTH	32
#define RQ_DEPTH	32
#define MAX_WR		16384
#define MAX_POSTERS	2
#define DRAIN_TIMEOUT	(60 * HZ)

/* ---------------------------------------------------------------- log */

/* What `cat /proc/vt3_kchaos` reads: every line logged, in order. */
#define LOG_SIZE	(1 << 20)
static char *log_buf;
static size_t log_len;
static bool log_done;
static DEFINE_SPINLOCK(log_lock);
static DECLARE_WAIT_QUEUE_HEAD(log_wait);

static __printf(1, 2) void out(const char *fmt, ...)
{
	char line[512];
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vscnprintf(line, sizeof(line) - 1, fmt, ap);
	va_end(ap);
	line[n++] = '\n';
	pr_info("vt3_kchaos: %.*s", n, line);
	spin_lock(&log_lock);
	n = min_t(size_t, n, LOG_SIZE - log_len);
	memcpy(log_buf + log_len, line, n);
	log_len += n;
	spin_unlock(&log_lock);
	wake_up_interruptible(&log_wait);
}

static ssize_t log_read(struct file *f, char __user *ubuf, size_t len, loff_t *pos)
{
	size_t have;
	int err;

	err = wait_event_interruptible(log_wait, READ_ONCE(log_done) ||
				       *pos < (loff_t)READ_ONCE(log_len));
	if (err)
		return err;
	spin_lock(&log_lock);
	have = *pos < (loff_t)log_len ? min_t(size_t, len, log_len - *pos) : 0;
	spin_unlock(&log_lock);
	/* Lines are only appended: what was copied stays valid. */
	if (have && copy_to_user(ubuf, log_buf + *pos, have))
		return -EFAULT;
	*pos += have;
	return have;
}

static const struct proc_ops log_ops = {
	.proc_read = log_read,
	.proc_lseek = noop_llseek,
};

/* ------------------------------------------------------------ patterns */

static u64 mix(u64 x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

static u64 hash(u64 s, unsigned int qpi, enum tag tag, u32 idx)
{
	return mix(s ^ mix(((u64)qpi << 40) ^ ((u64)tag << 32) ^ idx));
}

static u8 pat(u64 base, unsigned int i)
{
	return (u8)((base >> ((i & 7) * 8)) + (i >> 3) * 151);
}

static void fill(u8 *p, u64 base, unsigned int from, unsigned int len)
{
	unsigned int i;

	for (i = from; i < len; i++)
		p[i] = pat(base, i);
}

static int verify(const u8 *p, u64 base, unsigned int from, unsigned int len)
{
	unsigned int i;

	for (i = from; i < len; i++)
		if (p[i] != pat(base, i))
			return i;
	return -1;
}

static unsigned int reply_len(u64 s, unsigned int qpi, u32 seq)
{
	return HDR + hash(s, qpi, T_REPLY, seq ^ 0x80000000u) % (SLOT - HDR + 1);
}

/* -------------------------------------------------------------- faults */

enum who { LOCAL, PEER, HOST };

struct fault {
	const char *name;
	enum who who;
	bool all_qps;		/* every QP may end, not just the target */
	bool no_event;		/* no QP may see an error before the end */
	bool removal;		/* the device goes away: DEVICE_REMOVAL */
};

static const struct fault fault_table[] = {
	{ "disconnect",		LOCAL },
	{ "abort",		LOCAL },
	{ "peer-close",		PEER },
	{ "peer-abort",		PEER },
	{ "rst",		HOST },
	{ "fin",		HOST },
	{ "blackhole",		HOST },
	{ "drop",		HOST, false, true },
	{ "delay",		HOST, false, true },
	{ "corrupt-crc",	HOST },
	{ "terminate",		HOST },
	{ "invalidate-stag",	HOST },
	{ "device-fatal",	HOST, true },
	{ "peer-killed",	HOST, true },
	/* The device goes away: rdma_cm's DEVICE_REMOVAL, handled as ULPs do. */
	{ "rmmod",		HOST, true, false, true },
	{ "mute-commands",	HOST, true, false, true },
	{ "vt3d-killed",	HOST, true, false, true },
	{ "peer-vt3d-killed",	HOST, true },
};

/* The registered TERMINATE codes (docs/vt3d-ctl.md): layer, etype, ecode. */
static const u8 terminates[][3] = {
	{ 0, 0, 0x00 }, { 0, 1, 0x00 }, { 0, 1, 0x02 }, { 0, 2, 0x06 }, { 0, 2, 0xff },
	{ 1, 0, 0x00 }, { 1, 1, 0x00 }, { 1, 2, 0x01 }, { 1, 2, 0x02 }, { 2, 0, 0x02 },
	{ 2, 0, 0x01 },
};

static int allowed[ARRAY_SIZE(fault_table)];
static int nallowed;

/* ---------------------------------------------------------------- plan */

enum queue { SQ, RQ };
enum op { OP_SEND, OP_WRITE, OP_READ, OP_RECV };
static const char *const op_names[] = { "SEND", "WRITE", "READ", "RECV" };
static const enum ib_poll_context poll_ctxs[] = {
	IB_POLL_SOFTIRQ, IB_POLL_WORKQUEUE, IB_POLL_UNBOUND_WORKQUEUE,
};
static const char *const poll_names[] = { "softirq", "wq", "unbound-wq" };

struct plan {
	u64 seed;
	int fault;
	int side;		/* 0: the fault is done to the peer's side, 1: ours */
	int target;
	int nqp, ncq, nposters;
	int send_cq[MAX_QPS], recv_cq[MAX_QPS];
	int poll[MAX_CQS];	/* index into poll_ctxs */
	int sig_every[MAX_QPS];
	unsigned int duration_ms, fault_at_ms;
	int a1, a2, a3;
};

static int rnd(u64 *s, int n)
{
	*s = mix(*s);
	return (int)(*s % (u64)n);
}

/* Everything but timing from the seed; the faults are taken in turn, so
 * a batch hits each kind and `runs=1 faults=F` replays a run. */
static void make_plan(struct plan *p, u64 s0, int run)
{
	u64 s = hash(s0, 0, T_PLAN, 0x6b);
	const char *name;
	int i;

	memset(p, 0, sizeof(*p));
	p->seed = s0;
	p->fault = allowed[run % nallowed];
	name = fault_table[p->fault].name;
	p->nqp = 2 + rnd(&s, MAX_QPS - 1);
	p->ncq = 1 + rnd(&s, MAX_CQS);
	p->nposters = 1 + rnd(&s, MAX_POSTERS);
	p->target = rnd(&s, p->nqp);
	/* Ours is the kernel PD's global rkey: every QP's, not one. */
	p->side = strcmp(name, "invalidate-stag") ? rnd(&s, 2) : 0;
	for (i = 0; i < p->ncq; i++)
		p->poll[i] = rnd(&s, ARRAY_SIZE(poll_ctxs));
	for (i = 0; i < p->nqp; i++) {
		p->send_cq[i] = rnd(&s, p->ncq);
		p->recv_cq[i] = rnd(&s, 3) ? p->send_cq[i] : rnd(&s, p->ncq);
		p->sig_every[i] = 1 + rnd(&s, 4);
	}
	/*
	 * The abort target's CQs are polled from a workqueue: after its
	 * destroy the poller is flushed, so "nothing after the destroy" can
	 * be checked exactly (a softirq poller cannot be waited for).
	 */
	if (!strcmp(name, "abort")) {
		if (!p->poll[p->send_cq[p->target]])
			p->poll[p->send_cq[p->target]] = 1;
		if (!p->poll[p->recv_cq[p->target]])
			p->poll[p->recv_cq[p->target]] = 1;
	}
	p->duration_ms = duration_ms * (75 + rnd(&s, 51)) / 100;
	p->fault_at_ms = p->duration_ms * (10 + rnd(&s, 71)) / 100;
	if (!strcmp(name, "drop")) {
		p->a1 = 5 + rnd(&s, 26);
		p->a2 = 1 + rnd(&s, 1000);
	} else if (!strcmp(name, "delay")) {
		p->a1 = 10 + rnd(&s, 191);
	} else if (!strcmp(name, "terminate")) {
		const u8 *t = terminates[rnd(&s, ARRAY_SIZE(terminates))];

		p->a1 = t[0];
		p->a2 = t[1];
		p->a3 = t[2];
	}
}

/* -------------------------------------------------------------- client */

struct kwr {
	struct ib_cqe cqe;
	struct kqp *qp;
	u32 idx;
	u8 queue, op, signaled, seen, after_err;
	enum ib_wc_status status;
	u16 len;
	s32 src;		/* READ: the WRITE it reads back; -1 the static slot */
};

struct kwq {
	struct kwr *w;
	u32 posted;		/* records 0..posted-1 */
	u32 next;		/* completions so far came for indexes < next */
	u32 flush_from;		/* the first flushed index, or U32_MAX */
	u32 after_err;
	unsigned long ok, flush, err;
};

struct kcq {
	struct ib_cq *cq;
	int poll;
};

struct kqp {
	int idx;
	struct krun *r;
	struct rdma_cm_id *id;
	struct ib_qp *qp;	/* NULL once destroyed */
	u32 qpn;
	u8 *buf;		/* NSLOT source, NSLOT READ sink, NSLOT receive slots */
	u64 dma;
	struct rep_pd peer;
	struct kcq *scq, *rcq;
	spinlock_t post_lock;	/* posting: index order == ring order */
	struct kwq q[2];
	u32 nsend, nrecv_ok;
	s32 last_write;
	bool gone;		/* never posted to again */
	bool destroyed;		/* ib_destroy_qp returned, pollers flushed */
	bool drained;
	int first_event;	/* ib_event_type + 1, 0: none */
	unsigned long first_event_at;
	/* rdma_cm */
	struct completion cm_done;
	enum rdma_cm_event_type cm_event;
	int cm_status;
	bool cm_closed;
};

struct krun {
	struct plan plan;
	int run;
	struct ib_device *dev;
	struct ib_pd *pd;
	struct kcq cqs[MAX_CQS];
	struct kqp qps[MAX_QPS];
	struct task_struct *posters[MAX_POSTERS];
	bool stop_post;
	unsigned long t0;
	/*
	 * The verbs objects go once, under this lock: at the run's end, or in
	 * rdma_cm's DEVICE_REMOVAL handler if the device goes first (a ULP
	 * must free everything of the device before that handler returns).
	 */
	struct mutex lock;
	bool released, hung;
	struct completion released_done;
	spinlock_t err_lock;
	char err[768];
	int nerr;
	unsigned long t_fault, t_end, t_drained;	/* phases, for the RUN line */
};

static __printf(2, 3) void cfail(struct krun *r, const char *fmt, ...)
{
	unsigned long flags;
	va_list ap;
	size_t len;

	spin_lock_irqsave(&r->err_lock, flags);
	r->nerr++;
	len = strlen(r->err);
	if (r->nerr <= 6 && len < sizeof(r->err) - 8) {
		if (len)
			len += scnprintf(r->err + len, sizeof(r->err) - len, "; ");
		va_start(ap, fmt);
		vscnprintf(r->err + len, sizeof(r->err) - len, fmt, ap);
		va_end(ap);
	}
	spin_unlock_irqrestore(&r->err_lock, flags);
}

static u8 *src_slot(struct kqp *qp, u32 i) { return qp->buf + (i % NSLOT) * SLOT; }
static u8 *read_slot(struct kqp *qp, u32 i) { return qp->buf + (NSLOT + i % NSLOT) * SLOT; }
static u8 *recv_slot(struct kqp *qp, u32 i) { return qp->buf + (2 * NSLOT + i % NSLOT) * SLOT; }
static u64 slot_dma(struct kqp *qp, const u8 *p) { return qp->dma + (p - qp->buf); }

/* The ULP knows the QP is in error: a WR posted now must be flushed. */
static bool known_error(struct kqp *qp)
{
	return READ_ONCE(qp->first_event) ||
	       READ_ONCE(qp->q[SQ].flush_from) != U32_MAX ||
	       READ_ONCE(qp->q[RQ].flush_from) != U32_MAX;
}

static void kwr_done(struct ib_cq *cq, struct ib_wc *wc);

static struct kwr *new_wr(struct kqp *qp, enum queue qn, enum op op, bool signaled)
{
	struct kwq *q = &qp->q[qn];
	struct kwr *w = &q->w[q->posted];

	memset(w, 0, sizeof(*w));
	w->cqe.done = kwr_done;
	w->qp = qp;
	w->idx = q->posted;
	w->queue = qn;
	w->op = op;
	w->signaled = signaled;
	w->after_err = known_error(qp);
	w->src = -1;
	return w;
}

/* Under qp->post_lock. */
static int post_recv(struct kqp *qp)
{
	struct kwq *q = &qp->q[RQ];
	struct kwr *w = new_wr(qp, RQ, OP_RECV, true);
	struct ib_sge sge = { .addr = slot_dma(qp, recv_slot(qp, w->idx)), .length = SLOT,
			      .lkey = qp->r->pd->local_dma_lkey };
	struct ib_recv_wr wr = { .wr_cqe = &w->cqe, .sg_list = &sge, .num_sge = 1 };
	int err;

	/* Published before the post: its completion may come at once. */
	smp_store_release(&q->posted, w->idx + 1);
	err = ib_post_recv(qp->qp, &wr, NULL);
	if (err)
		smp_store_release(&q->posted, w->idx);
	else if (w->after_err)
		q->after_err++;
	return err;
}

/* Under qp->post_lock. */
static int post_send(struct kqp *qp, enum op op, bool signaled)
{
	struct krun *r = qp->r;
	struct kwq *q = &qp->q[SQ];
	struct kwr *w = new_wr(qp, SQ, op, signaled);
	unsigned int len = HDR + hash(r->plan.seed, qp->idx, T_LEN, w->idx) % (SLOT - HDR + 1);
	struct ib_sge sge = { .lkey = r->pd->local_dma_lkey };
	struct ib_rdma_wr wr = { .wr = { .wr_cqe = &w->cqe, .sg_list = &sge, .num_sge = 1,
					 .send_flags = signaled ? IB_SEND_SIGNALED : 0 } };
	u8 *p;
	int err;

	switch (op) {
	case OP_SEND: {
		struct msg_hdr h = { .magic = MAGIC, .qpi = qp->idx, .len = len,
				     .seq = qp->nsend, .tag = T_CSEND };

		p = src_slot(qp, w->idx);
		memcpy(p, &h, sizeof(h));
		fill(p, hash(r->plan.seed, qp->idx, T_CSEND, h.seq), HDR, len);
		wr.wr.opcode = IB_WR_SEND;
		break;
	}
	case OP_WRITE:
		p = src_slot(qp, w->idx);
		fill(p, hash(r->plan.seed, qp->idx, T_WRITE, w->idx), 0, len);
		wr.wr.opcode = IB_WR_RDMA_WRITE;
		wr.remote_addr = qp->peer.addr + (w->idx % RSLOTS) * SLOT;
		wr.rkey = qp->peer.rkey;
		break;
	case OP_READ:
		p = read_slot(qp, w->idx);
		wr.wr.opcode = IB_WR_RDMA_READ;
		wr.rkey = qp->peer.rkey;
		if (qp->last_write >= 0 && w->idx - qp->last_write < RECENT) {
			w->src = qp->last_write;
			len = q->w[qp->last_write].len;
			wr.remote_addr = qp->peer.addr + (qp->last_write % RSLOTS) * SLOT;
		} else {
			wr.remote_addr = qp->peer.addr + RSLOTS * SLOT;
		}
		memset(p, 0, len);
		break;
	default:
		return -EINVAL;
	}
	w->len = len;
	sge.addr = slot_dma(qp, p);
	sge.length = len;
	ib_dma_sync_single_for_device(r->dev, slot_dma(qp, p), SLOT, DMA_BIDIRECTIONAL);
	smp_store_release(&q->posted, w->idx + 1);
	err = ib_post_send(qp->qp, &wr.wr, NULL);
	if (err) {
		smp_store_release(&q->posted, w->idx);
		return err;
	}
	if (w->after_err)
		q->after_err++;
	if (op == OP_SEND)
		qp->nsend++;
	if (op == OP_WRITE)
		qp->last_write = w->idx;
	return 0;
}

/* One pass of a poster over a QP: refill the RQ, a few send WRs. */
static void post_some(struct kqp *qp)
{
	struct krun *r = qp->r;
	struct kwq *sq = &qp->q[SQ], *rq = &qp->q[RQ];
	int i;

	if (!spin_trylock_bh(&qp->post_lock))
		return;
	if (READ_ONCE(r->stop_post) || qp->gone)
		goto out;
	while (rq->posted - smp_load_acquire(&rq->next) < RQ_DEPTH && rq->posted < MAX_WR &&
	       rq->after_err < 2 * RQ_DEPTH)
		if (post_recv(qp))
			break;
	/* One slot stays free for the run's last, signaled WR. */
	for (i = 0; i < 4 && sq->posted - smp_load_acquire(&sq->next) < SQ_DEPTH - 1 &&
	     sq->posted < MAX_WR - 1 && sq->after_err < 2 * SQ_DEPTH; i++) {
		u32 idx = sq->posted;
		int h = hash(r->plan.seed, qp->idx, T_OP, idx) % 10;
		enum op op = h < 4 ? OP_SEND : h < 7 ? OP_WRITE : OP_READ;

		if (op == OP_SEND && qp->nsend >= rq->posted)
			op = OP_WRITE;	/* each SEND is answered: only as many as receives */
		if (post_send(qp, op, op == OP_READ || (idx + 1) % qp->r->plan.sig_every[qp->idx] == 0))
			break;
	}
out:
	spin_unlock_bh(&qp->post_lock);
}

static int poster_thread(void *arg)
{
	struct krun *r = arg;
	int me = -1, i;

	for (i = 0; i < r->plan.nposters; i++)
		if (r->posters[i] == current)
			me = i;
	while (!kthread_should_stop()) {
		for (i = 0; i < r->plan.nqp; i++)
			if (r->plan.nposters == 1 || i % 2 == me || i == r->plan.target)
				post_some(&r->qps[i]);
		/*
		 * A pace the guest's one emulated CPU can follow and still run
		 * the agent the host talks to (faster, the completion softirqs
		 * starve it: a READY took 17 s to be seen); MAX_WR lasts the run.
		 */
		usleep_range(5000, 6000);
	}
	return 0;
}

/* A completion, against the posted set (the CQ's poller context). */
static void kwr_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kwr *w = container_of(wc->wr_cqe, struct kwr, cqe);
	struct kqp *qp = w->qp;
	struct krun *r = qp->r;
	struct kwq *q = &qp->q[w->queue];
	const char *qname = w->queue == SQ ? "SQ" : "RQ";
	bool flush = wc->status == IB_WC_WR_FLUSH_ERR;
	int bad;

	if (READ_ONCE(qp->destroyed)) {
		cfail(r, "q%d %s wr %u completed (%s) after ib_destroy_qp returned", qp->idx, qname,
		      w->idx, ib_wc_status_msg(wc->status));
		return;
	}
	if (cq != (w->queue == SQ ? qp->scq->cq : qp->rcq->cq))
		cfail(r, "q%d %s wr %u completed on another CQ", qp->idx, qname, w->idx);
	if (wc->qp != qp->qp)
		cfail(r, "q%d %s wr %u: wc->qp %px, want %px", qp->idx, qname, w->idx, wc->qp, qp->qp);
	if (w->seen++) {
		cfail(r, "q%d %s wr %u (%s) completed twice: %s, then %s", qp->idx, qname, w->idx,
		      op_names[w->op], ib_wc_status_msg(w->status), ib_wc_status_msg(wc->status));
		return;
	}
	w->status = wc->status;
	if (w->idx < q->next)
		cfail(r, "q%d %s wr %u (%s) completed after wr %u: out of posting order", qp->idx,
		      qname, w->idx, ib_wc_status_msg(wc->status), q->next - 1);
	else
		smp_store_release(&q->next, w->idx + 1);
	if (flush) {
		if (q->flush_from == U32_MAX)
			WRITE_ONCE(q->flush_from, w->idx);
		q->flush++;
		return;
	}
	if (w->after_err)
		cfail(r, "q%d %s wr %u (%s) posted with the QP known in error: %s, want WR_FLUSH_ERR",
		      qp->idx, qname, w->idx, op_names[w->op], ib_wc_status_msg(wc->status));
	if (q->flush_from != U32_MAX)
		cfail(r, "q%d %s wr %u: device completion (%s) after a FLUSH_ERR", qp->idx, qname,
		      w->idx, ib_wc_status_msg(wc->status));
	if (wc->status != IB_WC_SUCCESS) {
		q->err++;
		return;
	}
	q->ok++;
	if (!w->signaled) {
		cfail(r, "q%d unsignaled wr %u (%s) completed with SUCCESS", qp->idx, w->idx,
		      op_names[w->op]);
		return;
	}
	switch (w->op) {
	case OP_RECV: {
		const u8 *p = recv_slot(qp, w->idx);
		u32 seq = qp->nrecv_ok++;
		unsigned int len = reply_len(r->plan.seed, qp->idx, seq);
		struct msg_hdr h;

		ib_dma_sync_single_for_cpu(r->dev, slot_dma(qp, p), SLOT, DMA_BIDIRECTIONAL);
		memcpy(&h, p, sizeof(h));
		if (wc->opcode != IB_WC_RECV)
			cfail(r, "q%d RQ wr %u: opcode %d, want RECV", qp->idx, w->idx, wc->opcode);
		if (h.magic != MAGIC || h.qpi != qp->idx || h.tag != T_REPLY || h.seq != seq ||
		    h.len != len || wc->byte_len != len) {
			cfail(r, "q%d RQ wr %u: received magic %#x qpi %u tag %u seq %u len %u byte_len %u, want seq %u len %u",
			      qp->idx, w->idx, h.magic, h.qpi, h.tag, h.seq, h.len, wc->byte_len, seq, len);
			break;
		}
		bad = verify(p, hash(r->plan.seed, qp->idx, T_REPLY, seq), HDR, len);
		if (bad >= 0)
			cfail(r, "q%d RQ wr %u (reply %u): byte %d wrong", qp->idx, w->idx, seq, bad);
		break;
	}
	case OP_READ: {
		u64 base = w->src >= 0 ? hash(r->plan.seed, qp->idx, T_WRITE, w->src)
				       : hash(r->plan.seed, qp->idx, T_STATIC, 0);

		ib_dma_sync_single_for_cpu(r->dev, slot_dma(qp, read_slot(qp, w->idx)), SLOT,
					   DMA_BIDIRECTIONAL);
		if (wc->opcode != IB_WC_RDMA_READ)
			cfail(r, "q%d SQ wr %u: opcode %d, want RDMA_READ", qp->idx, w->idx, wc->opcode);
		bad = verify(read_slot(qp, w->idx), base, 0, w->len);
		if (bad >= 0)
			cfail(r, "q%d READ wr %u of %s %d: byte %d of %u wrong", qp->idx, w->idx,
			      w->src >= 0 ? "WRITE" : "static", w->src, bad, w->len);
		break;
	}
	case OP_SEND:
		if (wc->opcode != IB_WC_SEND)
			cfail(r, "q%d SQ wr %u: opcode %d, want SEND", qp->idx, w->idx, wc->opcode);
		break;
	case OP_WRITE:
		if (wc->opcode != IB_WC_RDMA_WRITE)
			cfail(r, "q%d SQ wr %u: opcode %d, want RDMA_WRITE", qp->idx, w->idx, wc->opcode);
		break;
	}
}

static void qp_event(struct ib_event *ev, void *ctx)
{
	struct kqp *qp = ctx;

	if (cmpxchg(&qp->first_event, 0, ev->event + 1) == 0)
		qp->first_event_at = jiffies;
}

static void release_verbs(struct krun *r);
static void stop_posters(struct krun *r);
static bool drain_qp(struct kqp *qp);
static void destroy_qp(struct kqp *qp);

/* ---------------------------------------------------- rdma_cm and setup */

static int cm_handler(struct rdma_cm_id *id, struct rdma_cm_event *ev)
{
	struct kqp *qp = id->context;

	if (ev->event == RDMA_CM_EVENT_ESTABLISHED && ev->param.conn.private_data_len >= sizeof(qp->peer))
		memcpy(&qp->peer, ev->param.conn.private_data, sizeof(qp->peer));
	if (ev->event == RDMA_CM_EVENT_DISCONNECTED) {
		/* As every rdma_cm ULP does: complete the close. */
		if (!READ_ONCE(qp->cm_closed))
			rdma_disconnect(id);
		WRITE_ONCE(qp->cm_closed, true);
		return 0;
	}
	if (ev->event == RDMA_CM_EVENT_DEVICE_REMOVAL) {
		struct krun *r = qp->r;
		bool last = true;
		int i;

		/*
		 * As ULPs do it per id: this id's QP drained and destroyed
		 * (its CLOSE makes iw_cm drop its QP reference; iw_cm's
		 * ordered worker then waits for this handler, so no other
		 * id's QP may be destroyed here), the shared objects with the
		 * last one.
		 */
		mutex_lock(&r->lock);
		stop_posters(r);
		if (qp->qp && !r->hung) {
			if (drain_qp(qp)) {
				qp->drained = true;
				destroy_qp(qp);
			} else {
				r->hung = true;
			}
		}
		for (i = 0; i < r->plan.nqp; i++)
			last &= !r->qps[i].qp;
		if (last && !r->released && !r->hung)
			release_verbs(r);
		if (r->hung) {
			mutex_unlock(&r->lock);
			return 0;	/* its QP is stuck: the id stays too */
		}
		/* Non-zero: rdma_cm destroys the id when we return. */
		qp->id = NULL;
		mutex_unlock(&r->lock);
		WRITE_ONCE(qp->cm_closed, true);
		return 1;
	}
	qp->cm_event = ev->event;
	qp->cm_status = ev->status;
	complete(&qp->cm_done);
	return 0;
}

static int cm_wait(struct kqp *qp, enum rdma_cm_event_type want, int ms)
{
	if (!wait_for_completion_timeout(&qp->cm_done, msecs_to_jiffies(ms))) {
		cfail(qp->r, "q%d: no %s within %d ms", qp->idx, rdma_event_msg(want), ms);
		return -ETIMEDOUT;
	}
	if (qp->cm_event != want) {
		cfail(qp->r, "q%d: %s (status %d), want %s", qp->idx, rdma_event_msg(qp->cm_event),
		      qp->cm_status, rdma_event_msg(want));
		return -EIO;
	}
	return 0;
}

static int setup_device(struct krun *r)
{
	int i, j;

	/* The peer's READ responses land through this MR's rkey, as its WRITEs do. */
	r->pd = ib_alloc_pd(r->dev, IB_PD_UNSAFE_GLOBAL_RKEY);
	if (IS_ERR(r->pd)) {
		cfail(r, "ib_alloc_pd: %ld", PTR_ERR(r->pd));
		r->pd = NULL;
		return -EIO;
	}
	for (i = 0; i < r->plan.ncq; i++) {
		int depth = 0;

		/* Room for every WR of every queue feeding it, drains included. */
		for (j = 0; j < r->plan.nqp; j++)
			depth += (r->plan.send_cq[j] == i) * (SQ_DEPTH + 1) +
				 (r->plan.recv_cq[j] == i) * (RQ_DEPTH + 1);
		r->cqs[i].poll = r->plan.poll[i];
		r->cqs[i].cq = ib_alloc_cq(r->dev, NULL, max(depth, 1),
					   i % r->dev->num_comp_vectors,
					   poll_ctxs[r->cqs[i].poll]);
		if (IS_ERR(r->cqs[i].cq)) {
			cfail(r, "ib_alloc_cq %d: %ld", depth, PTR_ERR(r->cqs[i].cq));
			r->cqs[i].cq = NULL;
			return -EIO;
		}
	}
	return 0;
}

static int connect_qp(struct krun *r, struct kqp *qp, struct sockaddr_in *dst)
{
	const struct plan *p = &r->plan;
	const struct fault *f = &fault_table[p->fault];
	struct req_pd req = { .magic = MAGIC, .qpi = qp->idx, .seed = p->seed };
	struct rdma_conn_param param = { .responder_resources = ORD, .initiator_depth = ORD,
					 .retry_count = 7, .private_data = &req,
					 .private_data_len = sizeof(req) };
	struct ib_qp_init_attr attr = {
		.event_handler = qp_event, .qp_context = qp,
		.cap = { .max_send_wr = SQ_DEPTH, .max_recv_wr = RQ_DEPTH,
			 .max_send_sge = 1, .max_recv_sge = 1 },
		.sq_sig_type = IB_SIGNAL_REQ_WR, .qp_type = IB_QPT_RC,
		.send_cq = qp->scq->cq, .recv_cq = qp->rcq->cq,
	};
	int i, err;

	if (f->who == PEER && qp->idx == p->target) {
		req.action = !strcmp(f->name, "peer-close") ? ACT_CLOSE : ACT_ABORT;
		req.act_ms = p->fault_at_ms + (p->nqp - qp->idx) * 60;
	}
	qp->buf = kzalloc(3 * NSLOT * SLOT, GFP_KERNEL);
	if (!qp->buf)
		return -ENOMEM;
	qp->dma = ib_dma_map_single(r->dev, qp->buf, 3 * NSLOT * SLOT, DMA_BIDIRECTIONAL);
	if (ib_dma_mapping_error(r->dev, qp->dma)) {
		kfree(qp->buf);
		qp->buf = NULL;
		cfail(r, "q%d: DMA mapping failed", qp->idx);
		return -EIO;
	}
	err = rdma_create_qp(qp->id, r->pd, &attr);
	if (err) {
		cfail(r, "q%d: rdma_create_qp: %d", qp->idx, err);
		return err;
	}
	qp->qp = qp->id->qp;
	qp->qpn = qp->qp->qp_num;
	spin_lock_bh(&qp->post_lock);
	for (i = 0; i < RQ_DEPTH; i++)
		if (post_recv(qp))
			break;
	spin_unlock_bh(&qp->post_lock);
	reinit_completion(&qp->cm_done);
	err = rdma_connect(qp->id, &param);
	if (err) {
		cfail(r, "q%d: rdma_connect: %d", qp->idx, err);
		return err;
	}
	err = cm_wait(qp, RDMA_CM_EVENT_ESTABLISHED, 30000);
	if (err)
		return err;
	if (qp->peer.magic != MAGIC) {
		cfail(r, "q%d: the server sent no buffer (not vt3-chaos server?)", qp->idx);
		return -EIO;
	}
	return 0;
}

static int resolve(struct krun *r, struct kqp *qp, struct sockaddr_in *dst)
{
	int err;

	qp->id = rdma_create_id(&init_net, cm_handler, qp, RDMA_PS_TCP, IB_QPT_RC);
	if (IS_ERR(qp->id)) {
		cfail(r, "rdma_create_id: %ld", PTR_ERR(qp->id));
		qp->id = NULL;
		return -EIO;
	}
	err = rdma_resolve_addr(qp->id, NULL, (struct sockaddr *)dst, 5000);
	if (!err)
		err = cm_wait(qp, RDMA_CM_EVENT_ADDR_RESOLVED, 10000);
	if (!err) {
		reinit_completion(&qp->cm_done);
		err = rdma_resolve_route(qp->id, 5000);
		if (!err)
			err = cm_wait(qp, RDMA_CM_EVENT_ROUTE_RESOLVED, 10000);
	}
	if (err) {
		cfail(r, "q%d: resolving %s: %d", qp->idx, addr, err);
		return err;
	}
	if (!r->dev)
		r->dev = qp->id->device;
	else if (qp->id->device != r->dev) {
		cfail(r, "q%d resolved to another device", qp->idx);
		return -EIO;
	}
	reinit_completion(&qp->cm_done);
	return 0;
}

/* ------------------------------------------------------------ teardown */

/* After ib_destroy_qp returned: wait out the pollers of its CQs, so any
 * completion of it from now on is one polled after the destroy. */
static void flush_pollers(struct kqp *qp)
{
	struct kcq *cqs[2] = { qp->scq, qp->rcq };
	int i;

	for (i = 0; i < 2; i++)
		if (poll_ctxs[cqs[i]->poll] != IB_POLL_SOFTIRQ)
			flush_work(&cqs[i]->cq->work);
	/* Pairs with kwr_done's READ_ONCE: later completions see it. */
	smp_mb();
	WRITE_ONCE(qp->destroyed, true);
}

static void destroy_qp(struct kqp *qp)
{
	spin_lock_bh(&qp->post_lock);
	qp->gone = true;
	spin_unlock_bh(&qp->post_lock);
	rdma_destroy_qp(qp->id);
	qp->qp = NULL;
	flush_pollers(qp);
}

struct drain_work {
	struct work_struct work;
	struct ib_qp *qp;
	struct completion done;
};

static void drain_fn(struct work_struct *work)
{
	struct drain_work *d = container_of(work, struct drain_work, work);

	ib_drain_qp(d->qp);
	complete(&d->done);
}

/* ib_drain_qp, bounded: false if it did not return (a hang). */
static bool drain_qp(struct kqp *qp)
{
	struct drain_work *d = kzalloc(sizeof(*d), GFP_KERNEL);

	if (!d)
		return false;
	INIT_WORK(&d->work, drain_fn);
	init_completion(&d->done);
	d->qp = qp->qp;
	queue_work(system_unbound_wq, &d->work);
	if (!wait_for_completion_timeout(&d->done, DRAIN_TIMEOUT)) {
		cfail(qp->r, "q%d: hangs in ib_drain_qp (%d s)", qp->idx, DRAIN_TIMEOUT / HZ);
		/* d stays, and so does our code: the stuck drain returns into it. */
		__module_get(THIS_MODULE);
		return false;
	}
	kfree(d);
	return true;
}

/* The run's last WR on every live QP, signaled, then the disconnect. */
static void end_traffic(struct krun *r)
{
	int i;

	WRITE_ONCE(r->stop_post, true);
	mutex_lock(&r->lock);
	if (r->released)
		goto out;	/* the device went away first */
	for (i = 0; i < r->plan.nqp; i++) {
		struct kqp *qp = &r->qps[i];

		spin_lock_bh(&qp->post_lock);
		if (!qp->gone && qp->qp)
			post_send(qp, OP_WRITE, true);
		spin_unlock_bh(&qp->post_lock);
	}
	for (i = 0; i < r->plan.nqp; i++)
		if (r->qps[i].qp && !READ_ONCE(r->qps[i].cm_closed))
			rdma_disconnect(r->qps[i].id);
out:
	mutex_unlock(&r->lock);
}

/* After the drains: every receive and signaled send completed once, and
 * from a queue's first flush on, every WR is flushed. */
static void check_queues(struct krun *r, struct kqp *qp)
{
	int qn;

	if (!qp->drained)
		return;		/* destroyed with work in flight: nothing owed */
	for (qn = SQ; qn <= RQ; qn++) {
		struct kwq *q = &qp->q[qn];
		const char *qname = qn == SQ ? "SQ" : "RQ";
		u32 i, lost = 0, first = 0;

		for (i = 0; i < q->posted; i++) {
			struct kwr *w = &q->w[i];
			bool owed = w->signaled || w->after_err || i >= q->flush_from;

			if (owed && !w->seen) {
				if (!lost++)
					first = i;
			}
		}
		if (lost)
			cfail(r, "q%d %s: %u of %u WRs without a completion (first wr %u %s, flushing from %d)",
			      qp->idx, qname, lost, q->posted, first, op_names[q->w[first].op],
			      q->flush_from == U32_MAX ? -1 : (int)q->flush_from);
	}
}

/*
 * Every verbs object of the run, in a ULP's order: posters stopped, each
 * QP drained (bounded) and destroyed, the accounting checked, CQs, buffers
 * and the PD freed. r->lock held; at the run's end or from the device's
 * removal.
 */
static void stop_posters(struct krun *r)
{
	int i;

	for (i = 0; i < MAX_POSTERS; i++)
		if (r->posters[i]) {
			kthread_stop(r->posters[i]);
			r->posters[i] = NULL;
		}
	WRITE_ONCE(r->stop_post, true);
}

static void release_verbs(struct krun *r)
{
	int i;

	r->released = true;
	stop_posters(r);
	for (i = 0; i < r->plan.nqp; i++) {
		struct kqp *qp = &r->qps[i];

		if (!qp->qp)
			continue;
		if (!drain_qp(qp)) {
			r->hung = true;
			return;		/* resources stay: a stuck drain uses them */
		}
		qp->drained = true;
		destroy_qp(qp);
	}
	r->t_drained = jiffies;
	/* Late completions of a destroyed QP would show by now. */
	msleep(100);
	for (i = 0; i < r->plan.nqp; i++)
		check_queues(r, &r->qps[i]);
	for (i = 0; i < r->plan.ncq; i++)
		if (r->cqs[i].cq) {
			ib_free_cq(r->cqs[i].cq);
			r->cqs[i].cq = NULL;
		}
	for (i = 0; i < r->plan.nqp; i++) {
		struct kqp *qp = &r->qps[i];

		if (qp->buf) {
			ib_dma_unmap_single(r->dev, qp->dma, 3 * NSLOT * SLOT, DMA_BIDIRECTIONAL);
			kfree(qp->buf);
			qp->buf = NULL;
		}
	}
	if (r->pd) {
		ib_dealloc_pd(r->pd);
		r->pd = NULL;
	}
	complete(&r->released_done);
}

/* ------------------------------------------------------------------ run */

static void host_fault(struct krun *r)
{
	const struct plan *p = &r->plan;
	struct kqp *t = &r->qps[p->target];
	unsigned long until = jiffies + 120 * HZ;

	out("READY %d %llu %s %d %u %u %#x %d %d %d", r->run, p->seed, fault_table[p->fault].name,
	    p->side, t->qpn, t->peer.qpn, p->side ? r->pd->unsafe_global_rkey : t->peer.rkey,
	    p->a1, p->a2, p->a3);
	while (READ_ONCE(ack) != r->run) {
		if (time_after(jiffies, until)) {
			cfail(r, "the host did not acknowledge the fault in 120 s");
			return;
		}
		msleep(20);
	}
}

/*
 * mute-commands: our vt3d answers no command while its data path runs
 * on. A verb that needs an answer now goes unanswered, vt3.ko's probes
 * too: it declares the device lost (CQs frozen, every QP in error,
 * unregistered: DEVICE_REMOVAL) while vt3d may still write CQEs that must
 * not be taken.
 */
static void muted_command(struct krun *r)
{
	struct ib_pd *pd = ib_alloc_pd(r->dev, 0);

	if (!IS_ERR(pd)) {
		cfail(r, "ib_alloc_pd was answered while vt3d's commands were muted");
		ib_dealloc_pd(pd);
	}
}

static void do_fault(struct krun *r)
{
	const struct fault *f = &fault_table[r->plan.fault];
	struct kqp *t = &r->qps[r->plan.target];

	if (f->who == HOST) {
		host_fault(r);
		if (!strcmp(f->name, "mute-commands"))
			muted_command(r);
		/*
		 * The device goes away: its DEVICE_REMOVAL handlers free the
		 * run's objects; ours must not meanwhile (a QP destroyed here
		 * would wait on iw_cm's worker, which waits on those handlers).
		 */
		if (f->removal && !wait_for_completion_timeout(&r->released_done, 120 * HZ))
			cfail(r, "the device's removal did not end the run's objects in 120 s");
		return;
	}
	mutex_lock(&r->lock);
	if (!r->released && !strcmp(f->name, "disconnect"))
		rdma_disconnect(t->id);
	else if (!r->released && !strcmp(f->name, "abort"))
		destroy_qp(t);
	mutex_unlock(&r->lock);
}

/* No QP but the target may see an error before the end (none for
 * drop/delay, which TCP must absorb). */
static void check_events(struct krun *r)
{
	const struct fault *f = &fault_table[r->plan.fault];
	int i;

	if (f->all_qps)
		return;
	for (i = 0; i < r->plan.nqp; i++) {
		struct kqp *qp = &r->qps[i];

		if (!qp->first_event || (i == r->plan.target && !f->no_event))
			continue;
		if (time_before(qp->first_event_at, r->t0 + msecs_to_jiffies(r->plan.duration_ms)))
			cfail(r, "q%d (not the target q%d) got %s before the end", i, r->plan.target,
			      ib_event_msg(qp->first_event - 1));
	}
}

static void counts(struct krun *r, char *buf, size_t len)
{
	unsigned long v[2][3] = {};
	u32 posted[2] = {};
	int i, qn;

	for (i = 0; i < r->plan.nqp; i++)
		for (qn = 0; qn < 2; qn++) {
			posted[qn] += r->qps[i].q[qn].posted;
			v[qn][0] += r->qps[i].q[qn].ok;
			v[qn][1] += r->qps[i].q[qn].flush;
			v[qn][2] += r->qps[i].q[qn].err;
		}
	/* "silent": unsignaled send WRs the device retired without a completion. */
	scnprintf(buf, len, "sq %u posted %lu ok %lu flushed %lu error %lu silent; rq %u posted %lu ok %lu flushed %lu error; ",
		  posted[0], v[0][0], v[0][1], v[0][2],
		  posted[0] - (v[0][0] + v[0][1] + v[0][2]),
		  posted[1], v[1][0], v[1][1], v[1][2]);
}

enum verdict { RUN_OK, RUN_FAIL, RUN_HUNG };

static unsigned int since(struct krun *r, unsigned long t)
{
	return t ? jiffies_to_msecs(t - r->t0) : 0;
}

/* A run's own state (RUN: its number in the batch, or a probe's). */
static struct krun *krun_alloc(int run)
{
	struct krun *r = vzalloc(sizeof(*r));

	if (!r)
		return NULL;
	r->run = run;
	r->t0 = jiffies;
	spin_lock_init(&r->err_lock);
	mutex_init(&r->lock);
	init_completion(&r->released_done);
	return r;
}

/* QP I of R on the CQs it sends and receives on, with its WR records. */
static int kqp_init(struct krun *r, int i, struct kcq *scq, struct kcq *rcq)
{
	struct kqp *qp = &r->qps[i];
	int qn;

	qp->idx = i;
	qp->r = r;
	qp->last_write = -1;
	spin_lock_init(&qp->post_lock);
	init_completion(&qp->cm_done);
	qp->scq = scq;
	qp->rcq = rcq;
	for (qn = 0; qn < 2; qn++) {
		qp->q[qn].flush_from = U32_MAX;
		qp->q[qn].w = vzalloc(MAX_WR * sizeof(struct kwr));
		if (!qp->q[qn].w)
			return -ENOMEM;
	}
	return 0;
}

static enum verdict run_one(int run, u64 s)
{
	struct krun *r;
	struct sockaddr_in dst = { .sin_family = AF_INET, .sin_port = htons(port) };
	char styles[160], cnt[192];
	unsigned long end;
	bool ok, hung = false;
	int i, n;

	r = krun_alloc(run);
	if (!r)
		return RUN_FAIL;
	make_plan(&r->plan, s, run);
	if (!in4_pton(addr, -1, (u8 *)&dst.sin_addr.s_addr, -1, NULL)) {
		cfail(r, "addr=%s is not an IPv4 address", addr);
		goto report;
	}
	for (i = 0; i < r->plan.nqp; i++) {
		if (kqp_init(r, i, &r->cqs[r->plan.send_cq[i]], &r->cqs[r->plan.recv_cq[i]])) {
			cfail(r, "out of memory");
			goto teardown;
		}
	}
	for (i = 0; i < r->plan.nqp; i++) {
		if (resolve(r, &r->qps[i], &dst))
			goto teardown;
		if (i == 0 && setup_device(r))
			goto teardown;
		if (connect_qp(r, &r->qps[i], &dst))
			goto teardown;
	}
	r->t0 = jiffies;
	for (i = 0; i < r->plan.nposters; i++) {
		r->posters[i] = kthread_create(poster_thread, r, "vt3_kchaos/%d", i);
		if (IS_ERR(r->posters[i])) {
			r->posters[i] = NULL;
			cfail(r, "kthread_create failed");
			goto teardown;
		}
	}
	for (i = 0; i < r->plan.nposters; i++)
		wake_up_process(r->posters[i]);
	msleep(r->plan.fault_at_ms);
	do_fault(r);
	r->t_fault = jiffies;
	end = r->t0 + msecs_to_jiffies(r->plan.duration_ms);
	if (time_before(jiffies, end))
		msleep(jiffies_to_msecs(end - jiffies));
	check_events(r);
	end_traffic(r);
	r->t_end = jiffies;
teardown:
	mutex_lock(&r->lock);
	if (!r->released)
		release_verbs(r);
	hung = r->hung;
	mutex_unlock(&r->lock);
	if (hung)
		goto report;	/* resources stay: a stuck drain uses them */
	for (i = 0; i < r->plan.nqp; i++) {
		struct kqp *qp = &r->qps[i];
		struct rdma_cm_id *id;

		/* Unless rdma_cm's removal took it (and destroys it itself). */
		mutex_lock(&r->lock);
		id = qp->id;
		qp->id = NULL;
		mutex_unlock(&r->lock);
		if (id)
			rdma_destroy_id(id);
		vfree(qp->q[SQ].w);
		vfree(qp->q[RQ].w);
	}
report:
	n = 0;
	styles[0] = 0;
	for (i = 0; i < r->plan.nqp; i++)
		n += scnprintf(styles + n, sizeof(styles) - n, "%s%s/%d%s", i ? "," : "",
			       poll_names[r->plan.poll[r->plan.send_cq[i]]], r->plan.sig_every[i],
			       r->plan.send_cq[i] != r->plan.recv_cq[i] ? "+2cq" : "");
	counts(r, cnt, sizeof(cnt));
	ok = !r->nerr;
	out("RUN %d seed %llu fault %s side %d target q%d qps %d cqs %d threads %d styles %s; %u.%03u s: %s: %sphases: fault %u end %u drained %u ms%s%s",
	    run, s, fault_table[r->plan.fault].name, r->plan.side, r->plan.target, r->plan.nqp,
	    r->plan.ncq, r->plan.nposters, styles[0] ? styles : "-",
	    jiffies_to_msecs(jiffies - r->t0) / 1000, jiffies_to_msecs(jiffies - r->t0) % 1000,
	    ok ? "ok" : "FAIL", cnt, since(r, r->t_fault), since(r, r->t_end), since(r, r->t_drained),
	    ok ? "" : " -- ", r->err);
	/* A hang leaves its run behind: the module cannot be unloaded. */
	if (hung)
		return RUN_HUNG;
	vfree(r);
	return ok ? RUN_OK : RUN_FAIL;
}

/* ----------------------------------------------- the late CQ event probe */

static atomic_t probe_events;

static void probe_comp(struct ib_cq *cq, void *ctx)
{
	atomic_inc(&probe_events);
}

static bool probe_wait(int n, int ms)
{
	unsigned long until = jiffies + msecs_to_jiffies(ms);

	while (atomic_read(&probe_events) < n)
		if (time_after(jiffies, until))
			return false;
		else
			msleep(10);
	return true;
}

/*
 * A completion event that answers an older arm must not disarm the CQ
 * for the driver's own kicks (issue 12's lost wake-up): ib_cq arms with
 * REPORT_MISSED_EVENTS and polls again without waiting, so the event of
 * the first arm can come after the second. On the guest's one CPU,
 * softirqs held back make it so: arm with a completion pending (vt3d
 * answers with an event at once, held in the RX ring), poll the CQ
 * empty, arm again (vt3d stays armed, no event), let the event in; then
 * an error on the QP must still reach the consumer (vt3.ko kicks the CQ
 * its consumer armed). One line: "PROBE late-cq-event ok|FAIL: …".
 */
static bool probe_late_event(void)
{
	struct sockaddr_in dst = { .sin_family = AF_INET, .sin_port = htons(port) };
	struct ib_cq_init_attr attr = { .cqe = SQ_DEPTH + RQ_DEPTH + 2 };
	struct ib_qp_attr err_attr = { .qp_state = IB_QPS_ERR };
	struct krun *r = krun_alloc(0xffff);
	struct kqp *qp;
	struct ib_wc wc[16];
	int before = 0, after_enable = 0, polled = 0, n;
	bool ok = false;

	if (!r)
		return false;
	r->plan.seed = seed ^ 0x7761;
	r->plan.nqp = 1;
	qp = &r->qps[0];
	if (kqp_init(r, 0, &r->cqs[0], &r->cqs[0]))
		goto out;
	if (!in4_pton(addr, -1, (u8 *)&dst.sin_addr.s_addr, -1, NULL) || resolve(r, qp, &dst))
		goto out;
	r->pd = ib_alloc_pd(r->dev, IB_PD_UNSAFE_GLOBAL_RKEY);
	if (IS_ERR(r->pd)) {
		r->pd = NULL;
		goto out;
	}
	/* Our own handler: every completion event the consumer gets, counted. */
	r->cqs[0].cq = ib_create_cq(r->dev, probe_comp, NULL, NULL, &attr);
	if (IS_ERR(r->cqs[0].cq)) {
		r->cqs[0].cq = NULL;
		goto out;
	}
	if (connect_qp(r, qp, &dst))
		goto out;
	/* A SEND, answered by the server: completions in the ring, an event. */
	ib_req_notify_cq(r->cqs[0].cq, IB_CQ_NEXT_COMP);
	spin_lock_bh(&qp->post_lock);
	post_send(qp, OP_SEND, true);
	spin_unlock_bh(&qp->post_lock);
	if (!probe_wait(1, 10000)) {
		cfail(r, "no completion event for the first SEND");
		goto out;
	}
	msleep(500);		/* the reply lands too */
	before = atomic_read(&probe_events);
	local_bh_disable();
	ib_req_notify_cq(r->cqs[0].cq, IB_CQ_NEXT_COMP);
	mdelay(1000);		/* vt3d answers: the event waits in the RX ring */
	while ((n = ib_poll_cq(r->cqs[0].cq, ARRAY_SIZE(wc), wc)) > 0)
		polled += n;
	ib_req_notify_cq(r->cqs[0].cq, IB_CQ_NEXT_COMP);
	mdelay(200);
	after_enable = atomic_read(&probe_events);
	local_bh_enable();
	if (after_enable != before || !polled) {
		cfail(r, "no late event set up: %d events while softirqs were held, %d completions polled",
		      after_enable - before, polled);
		goto out;
	}
	if (!probe_wait(before + 1, 5000)) {
		cfail(r, "vt3d raised no event for the arm with completions pending");
		goto out;
	}
	msleep(200);
	after_enable = atomic_read(&probe_events);
	/* The consumer armed last: an error on its QP must wake it. */
	ib_modify_qp(qp->qp, &err_attr, IB_QP_STATE);
	ok = probe_wait(after_enable + 1, 5000);
	if (!ok)
		cfail(r, "after a late CQ event the error kick never came (%d events, %d before the error)",
		      atomic_read(&probe_events), after_enable);
out:
	if (qp->qp) {
		qp->gone = true;
		rdma_destroy_qp(qp->id);
	}
	if (r->cqs[0].cq)
		ib_destroy_cq(r->cqs[0].cq);
	if (qp->id)
		rdma_destroy_id(qp->id);
	if (qp->buf) {
		ib_dma_unmap_single(r->dev, qp->dma, 3 * NSLOT * SLOT, DMA_BIDIRECTIONAL);
		kfree(qp->buf);
	}
	if (r->pd)
		ib_dealloc_pd(r->pd);
	ok = ok && !r->nerr;
	out("PROBE late-cq-event %s: %d completions polled, %d events%s%s", ok ? "ok" : "FAIL",
	    polled, atomic_read(&probe_events), r->nerr ? " -- " : "", r->err);
	vfree(qp->q[SQ].w);
	vfree(qp->q[RQ].w);
	vfree(r);
	return ok;
}

/* ------------------------------------------------ the busy CQ drain probe */

/*
 * ib_drain_qp must return while another QP keeps their shared CQ busy
 * (issue 12's starvation): a flush completion that is due is not held
 * back until the CQ's ring is empty. Two QPs to the server share one CQ,
 * polled here in small batches as the core's pollers poll; q1 keeps more
 * WRITE completions waiting in the ring than a batch takes (a streaming
 * QP on a guest that polls slower than the device completes), while q0
 * is drained with ib_drain_qp, which must return within BUSY_POLLS
 * batches. Every completion goes to its done callback, so kwr_done checks
 * them as in the runs. One line: "PROBE busy-drain ok|FAIL: …".
 */
#define BUSY_BATCH	4
#define BUSY_BACKLOG	24
#define BUSY_POLLS	60

static bool probe_busy_drain(void)
{
	struct sockaddr_in dst = { .sin_family = AF_INET, .sin_port = htons(port) };
	struct ib_cq_init_attr attr = { .cqe = 2 * (SQ_DEPTH + RQ_DEPTH + 2) };
	struct krun *r = krun_alloc(0xfffe);
	struct drain_work *d = NULL;
	int i, n, polls = 0, a_flushed = 0, b_done = 0, b_seen = 0;
	bool returned = false, ok = false;
	struct ib_wc wc[BUSY_BATCH];
	struct kqp *a, *b, *qp;
	struct ib_cq *cq;
	unsigned long until;

	if (!r)
		return false;
	r->plan.seed = seed ^ 0x6472;
	r->plan.nqp = 2;
	for (i = 0; i < 2; i++)
		if (kqp_init(r, i, &r->cqs[0], &r->cqs[0]))
			goto out;
	a = &r->qps[0];
	b = &r->qps[1];
	if (!in4_pton(addr, -1, (u8 *)&dst.sin_addr.s_addr, -1, NULL) ||
	    resolve(r, a, &dst) || resolve(r, b, &dst))
		goto out;
	r->pd = ib_alloc_pd(r->dev, IB_PD_UNSAFE_GLOBAL_RKEY);
	if (IS_ERR(r->pd)) {
		cfail(r, "ib_alloc_pd: %ld", PTR_ERR(r->pd));
		r->pd = NULL;
		goto out;
	}
	/* No poller of the core's: this probe polls, in batches. */
	cq = ib_create_cq(r->dev, NULL, NULL, NULL, &attr);
	if (IS_ERR(cq)) {
		cfail(r, "ib_create_cq: %ld", PTR_ERR(cq));
		goto out;
	}
	r->cqs[0].cq = cq;
	if (connect_qp(r, a, &dst) || connect_qp(r, b, &dst))
		goto out;

	/* q1's backlog: WRITE completions in the ring, more than a batch. */
	spin_lock_bh(&b->post_lock);
	for (i = 0; i < BUSY_BACKLOG; i++)
		if (post_send(b, OP_WRITE, true))
			break;
	spin_unlock_bh(&b->post_lock);
	msleep(1000);

	d = kzalloc(sizeof(*d), GFP_KERNEL);
	if (!d)
		goto out;
	INIT_WORK(&d->work, drain_fn);
	init_completion(&d->done);
	d->qp = a->qp;
	queue_work(system_unbound_wq, &d->work);
	while (polls < BUSY_POLLS && !returned) {
		msleep(50);
		n = ib_poll_cq(cq, BUSY_BATCH, wc);
		polls++;
		for (i = 0; i < n; i++) {
			if (wc[i].qp == a->qp && wc[i].status == IB_WC_WR_FLUSH_ERR)
				a_flushed++;
			if (wc[i].qp == b->qp) {
				b_seen++;
				b_done += container_of(wc[i].wr_cqe, struct kwr, cqe)->queue == SQ;
			}
			wc[i].wr_cqe->done(cq, &wc[i]);
		}
		/* q1 streams on: its backlog stays above a batch. */
		spin_lock_bh(&b->post_lock);
		while (b->q[SQ].posted - b_done < BUSY_BACKLOG + BUSY_BATCH)
			if (post_send(b, OP_WRITE, true))
				break;
		spin_unlock_bh(&b->post_lock);
		returned = completion_done(&d->done);
	}
	if (!returned)
		cfail(r, "ib_drain_qp starved: q0's drain did not return in %d polls of %d while q1 kept the CQ busy (%d of q1's completions, %d of q0's flushed)",
		      polls, BUSY_BATCH, b_seen, a_flushed);
	/* q1 quiet now: whatever is owed comes, the drain must return. */
	until = jiffies + 30 * HZ;
	while (!completion_done(&d->done) && time_before(jiffies, until)) {
		n = ib_poll_cq(cq, BUSY_BATCH, wc);
		for (i = 0; i < n; i++)
			wc[i].wr_cqe->done(cq, &wc[i]);
		if (!n)
			msleep(10);
	}
	if (!completion_done(&d->done)) {
		/* Everything stays, and so does our code: the drain returns into it. */
		__module_get(THIS_MODULE);
		out("PROBE busy-drain FAIL: q0 hangs in ib_drain_qp (30 s after q1 stopped) -- %s", r->err);
		return false;
	}
	flush_work(&d->work);
	ok = a->q[RQ].flush == RQ_DEPTH;
	if (!ok)
		cfail(r, "q0: %lu of its %d receives flushed, want all", a->q[RQ].flush, RQ_DEPTH);
out:
	kfree(d);
	for (i = 0; i < 2; i++) {
		qp = &r->qps[i];
		if (qp->qp) {
			qp->gone = true;
			rdma_destroy_qp(qp->id);
			qp->qp = NULL;
			WRITE_ONCE(qp->destroyed, true);
		}
	}
	if (r->cqs[0].cq)
		ib_destroy_cq(r->cqs[0].cq);
	for (i = 0; i < 2; i++) {
		qp = &r->qps[i];
		if (qp->id)
			rdma_destroy_id(qp->id);
		if (qp->buf) {
			ib_dma_unmap_single(r->dev, qp->dma, 3 * NSLOT * SLOT, DMA_BIDIRECTIONAL);
			kfree(qp->buf);
		}
	}
	if (r->pd)
		ib_dealloc_pd(r->pd);
	ok = ok && !r->nerr;
	out("PROBE busy-drain %s: %d polls of %d, q0 %d flushed, q1 %d completions%s%s",
	    ok ? "ok" : "FAIL", polls, BUSY_BATCH, a_flushed, b_seen,
	    r->nerr ? " -- " : "", r->err);
	for (i = 0; i < 2; i++) {
		vfree(r->qps[i].q[SQ].w);
		vfree(r->qps[i].q[RQ].w);
	}
	vfree(r);
	return ok;
}

static struct task_struct *runner;
static struct proc_dir_entry *proc;

static int runner_thread(void *arg)
{
	int i, pass = 0, fail = 0;

	if (probe) {
		if (probe_late_event())
			pass++;
		else
			WRITE_ONCE(failed, ++fail);
		if (probe_busy_drain())
			pass++;
		else
			WRITE_ONCE(failed, ++fail);
	}
	for (i = 0; i < runs && !kthread_should_stop(); i++) {
		enum verdict v = run_one(i, seed + i);

		if (v == RUN_OK)
			pass++;
		else
			WRITE_ONCE(failed, ++fail);
		if (v == RUN_HUNG)
			break;	/* its resources are stuck: no further run */
	}
	out("vt3_kchaos: %d passed, %d failed", pass, fail);
	WRITE_ONCE(log_done, true);
	wake_up_interruptible(&log_wait);
	while (!kthread_should_stop())
		msleep(50);
	return 0;
}

static int parse_faults(void)
{
	char *list = kstrdup(faults, GFP_KERNEL), *cur, *name;
	size_t i;

	if (!list)
		return -ENOMEM;
	cur = list;
	while ((name = strsep(&cur, ",")) != NULL) {
		for (i = 0; i < ARRAY_SIZE(fault_table); i++)
			if (!strcmp(fault_table[i].name, name))
				break;
		if (i == ARRAY_SIZE(fault_table) || nallowed == ARRAY_SIZE(allowed)) {
			pr_err("vt3_kchaos: unknown fault '%s'\n", name);
			kfree(list);
			return -EINVAL;
		}
		allowed[nallowed++] = i;
	}
	kfree(list);
	return 0;
}

static int __init vt3_kchaos_init(void)
{
	int err = parse_faults();

	if (err)
		return err;
	if (runs < (probe ? 0 : 1) || duration_ms < 100)
		return -EINVAL;
	log_buf = vzalloc(LOG_SIZE);
	if (!log_buf)
		return -ENOMEM;
	proc = proc_create("vt3_kchaos", 0444, NULL, &log_ops);
	if (!proc) {
		vfree(log_buf);
		return -ENOMEM;
	}
	runner = kthread_run(runner_thread, NULL, "vt3_kchaos");
	if (IS_ERR(runner)) {
		proc_remove(proc);
		vfree(log_buf);
		return PTR_ERR(runner);
	}
	return 0;
}

static void __exit vt3_kchaos_exit(void)
{
	kthread_stop(runner);
	proc_remove(proc);
	vfree(log_buf);
}

module_init(vt3_kchaos_init);
module_exit(vt3_kchaos_exit);
MODULE_DESCRIPTION("vt3: randomized fault soak of kernel QPs (vt3-chaos for ULPs)");
MODULE_LICENSE("GPL");
