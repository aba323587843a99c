// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
/*
 * vt3-datapath: the data-path verbs that need no connection. Posting to a
 * QP in RESET, INIT and ERROR as the verbs say, SGE, opcode and inline
 * checks with *bad_wr, ring-full behaviour, and the flush: every WR of a QP
 * in error completes exactly once with IBV_WC_WR_FLUSH_ERR, in posting
 * order per queue, including WRs posted after the error.
 *
 * Each check runs on fresh CQs and QPs. Checks marked "generic" are plain
 * verbs and run on any device (siw0 as the reference); the others hold
 * libvt3 to its own contract and are skipped elsewhere, with the reason.
 * On other devices a negative errno (siw returns -EINVAL) is accepted for
 * a positive one, and *bad_wr and exact counts are checked only on vt3.
 *
 * Usage: vt3-datapath [-d DEVICE] [-c CHECK[,CHECK...]] [-a] [-l] [-v]
 *   -d DEVICE  ib device (default: the first whose name starts with "vt3")
 *   -c CHECKS  only these checks (names from -l)
 *   -a         run the vt3 checks on another device too, to see it differ
 *   -l         list the checks
 *   -v         say what each check saw
 * Prints "ok", "FAIL" or "skip" per check and a closing line
 * "vt3-datapath: DEVICE: N passed, N failed, N skipped"; exit status 0
 * when none failed.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <fcntl.h>
#include <dlfcn.h>
#include <pthread.h>
#include <infiniband/verbs.h>

#define BUF_SIZE	(64 << 10)
#define QP_WRS		16
#define QP_SGES		2
#define QP_INLINE	64
#define MAX_WC		1024
/* How long a completion may take to show up (siw flushes in the kernel). */
#define WAIT_MS		3000
/* How long to watch for completions that must not come. */
#define QUIET_MS	300

static const char *prog = "vt3-datapath";
static bool verbose;

/* The device under test. */
static struct ibv_context *ctx;
static struct ibv_device_attr dev_attr;
static struct ibv_pd *pd;
static struct ibv_mr *mr;
static char *buf;
static bool is_vt3;

/* What one check created: the harness destroys it, whatever happened. */
struct env {
	struct ibv_comp_channel *channel;
	struct ibv_cq *cq[2];
	struct ibv_qp *qp[2];
	struct ibv_qp_cap cap[2];	/* as granted */
};

static char fail_msg[512];

static void failf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void failf(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(fail_msg, sizeof(fail_msg), fmt, ap);
	va_end(ap);
}

static void info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void info(const char *fmt, ...)
{
	va_list ap;

	if (!verbose)
		return;
	va_start(ap, fmt);
	fputs("    ", stdout);
	vprintf(fmt, ap);
	va_end(ap);
	fputc('\n', stdout);
}

/* In a check: fail it with a message and return. */
#define EXPECT(cond, ...)			\
	do {					\
		if (!(cond)) {			\
			failf(__VA_ARGS__);	\
			return false;		\
		}				\
	} while (0)

/* Or fail it when a helper already said why. */
#define TRY(call)				\
	do {					\
		if (!(call))			\
			return false;		\
	} while (0)

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* An errno as the verbs return it; elsewhere siw's negative one too. */
static bool is_errno(int ret, int want)
{
	return ret == want || (!is_vt3 && ret == -want);
}

static const char *err_name(int ret)
{
	static char s[64];

	snprintf(s, sizeof(s), "%d (%s)", ret, ret ? strerror(ret < 0 ? -ret : ret) : "success");
	return s;
}

/* ------------------------------------------------------------------ */
/* Resources                                                           */

static bool make_cq(struct env *e, int i, bool with_channel)
{
	if (with_channel && !e->channel) {
		e->channel = ibv_create_comp_channel(ctx);
		EXPECT(e->channel, "ibv_create_comp_channel: %s", strerror(errno));
		EXPECT(fcntl(e->channel->fd, F_SETFL,
			     fcntl(e->channel->fd, F_GETFL) | O_NONBLOCK) == 0,
		       "fcntl(O_NONBLOCK): %s", strerror(errno));
	}
	e->cq[i] = ibv_create_cq(ctx, 256, NULL, with_channel ? e->channel : NULL, 0);
	EXPECT(e->cq[i], "ibv_create_cq(256): %s", strerror(errno));
	return true;
}

/*
 * QP i of the env, on CQ scq (send) and rcq (receive), QP_WRS deep with
 * QP_SGES SGEs, QP_INLINE bytes of inline data if the device takes them.
 */
static bool make_qp(struct env *e, int i, int scq, int rcq, bool sig_all)
{
	struct ibv_qp_init_attr init = {
		.send_cq = e->cq[scq],
		.recv_cq = e->cq[rcq],
		.qp_type = IBV_QPT_RC,
		.sq_sig_all = sig_all,
		.cap = {
			.max_send_wr = QP_WRS,
			.max_recv_wr = QP_WRS,
			.max_send_sge = QP_SGES,
			.max_recv_sge = QP_SGES,
			.max_inline_data = QP_INLINE,
		},
	};

	e->qp[i] = ibv_create_qp(pd, &init);
	if (!e->qp[i]) {
		init.cap.max_inline_data = 0;
		e->qp[i] = ibv_create_qp(pd, &init);
	}
	EXPECT(e->qp[i], "ibv_create_qp(RC, %d WRs, %d SGEs): %s", QP_WRS,
	       QP_SGES, strerror(errno));
	e->cap[i] = init.cap;
	info("QP %u: %u/%u WRs, %u/%u SGEs, %u inline", e->qp[i]->qp_num,
	     init.cap.max_send_wr, init.cap.max_recv_wr, init.cap.max_send_sge,
	     init.cap.max_recv_sge, init.cap.max_inline_data);
	return true;
}

/* One CQ for both queues of one QP: the common case. */
static bool make_env(struct env *e)
{
	TRY(make_cq(e, 0, false));
	return make_qp(e, 0, 0, 0, false);
}

static void free_env(struct env *e)
{
	int i;

	for (i = 0; i < 2; i++)
		if (e->qp[i] && ibv_destroy_qp(e->qp[i]))
			fprintf(stderr, "%s: ibv_destroy_qp: %s\n", prog, strerror(errno));
	for (i = 0; i < 2; i++)
		if (e->cq[i] && ibv_destroy_cq(e->cq[i]))
			fprintf(stderr, "%s: ibv_destroy_cq: %s\n", prog, strerror(errno));
	if (e->channel && ibv_destroy_comp_channel(e->channel))
		fprintf(stderr, "%s: ibv_destroy_comp_channel: %s\n", prog, strerror(errno));
}

static const char *state_name(enum ibv_qp_state state)
{
	static const char *const names[] = {
		[IBV_QPS_RESET] = "RESET", [IBV_QPS_INIT] = "INIT",
		[IBV_QPS_RTR] = "RTR", [IBV_QPS_RTS] = "RTS",
		[IBV_QPS_SQD] = "SQD", [IBV_QPS_SQE] = "SQE",
		[IBV_QPS_ERR] = "ERR",
	};

	return state < sizeof(names) / sizeof(names[0]) ? names[state] : "?";
}

static bool to_state(struct ibv_qp *qp, enum ibv_qp_state state)
{
	struct ibv_qp_attr attr = { .qp_state = state };
	int mask = IBV_QP_STATE;
	int ret;

	if (state == IBV_QPS_INIT) {
		attr.qp_access_flags = IBV_ACCESS_LOCAL_WRITE |
				       IBV_ACCESS_REMOTE_WRITE |
				       IBV_ACCESS_REMOTE_READ;
		mask |= IBV_QP_ACCESS_FLAGS;
	}
	ret = ibv_modify_qp(qp, &attr, mask);
	EXPECT(!ret, "ibv_modify_qp(QP %u -> %s): %s", qp->qp_num,
	       state_name(state), err_name(ret));
	return true;
}

/* ------------------------------------------------------------------ */
/* Work requests                                                       */

/* Each WR its own slice of the buffer, so a stray transfer shows. */
static struct ibv_sge sges[MAX_WC][8];

static void fill_sges(unsigned int slot, int n)
{
	int i;

	for (i = 0; i < n && i < 8; i++) {
		sges[slot % MAX_WC][i] = (struct ibv_sge){
			.addr = (uintptr_t)buf + ((slot * 8 + i) * 64) % BUF_SIZE,
			.length = 64,
			.lkey = mr->lkey,
		};
	}
}

static void recv_wr(struct ibv_recv_wr *wr, uint64_t id, int num_sge)
{
	fill_sges(id, num_sge);
	*wr = (struct ibv_recv_wr){
		.wr_id = id,
		.sg_list = sges[id % MAX_WC],
		.num_sge = num_sge,
	};
}

static void send_wr(struct ibv_send_wr *wr, uint64_t id,
		    enum ibv_wr_opcode opcode, int num_sge, unsigned int flags)
{
	fill_sges(id, num_sge);
	*wr = (struct ibv_send_wr){
		.wr_id = id,
		.sg_list = sges[id % MAX_WC],
		.num_sge = num_sge,
		.opcode = opcode,
		.send_flags = flags,
	};
	if (opcode == IBV_WR_RDMA_WRITE || opcode == IBV_WR_RDMA_READ) {
		wr->wr.rdma.remote_addr = (uintptr_t)buf;
		wr->wr.rdma.rkey = mr->rkey;
	}
	if (opcode == IBV_WR_SEND_WITH_INV)
		wr->invalidate_rkey = mr->rkey;
}

static void chain_recv(struct ibv_recv_wr *wr, int n)
{
	int i;

	for (i = 0; i + 1 < n; i++)
		wr[i].next = &wr[i + 1];
}

static void chain_send(struct ibv_send_wr *wr, int n)
{
	int i;

	for (i = 0; i + 1 < n; i++)
		wr[i].next = &wr[i + 1];
}

/* A post that must fail with @want (0: any error) at @want_bad. */
static bool post_send_fails(struct ibv_qp *qp, struct ibv_send_wr *wr,
			    struct ibv_send_wr *want_bad, int want,
			    const char *what)
{
	struct ibv_send_wr *bad = NULL;
	int ret = ibv_post_send(qp, wr, &bad);

	info("%s: ibv_post_send -> %s", what, err_name(ret));
	EXPECT(ret, "%s: ibv_post_send succeeded", what);
	EXPECT(!want || is_errno(ret, want), "%s: ibv_post_send returned %s, not %s",
	       what, err_name(ret), strerror(want));
	/* siw leaves *bad_wr NULL when the kernel refuses the doorbell. */
	EXPECT(!is_vt3 || bad == want_bad, "%s: *bad_wr is %p, not WR %p", what,
	       (void *)bad, (void *)want_bad);
	return true;
}

static bool post_recv_fails(struct ibv_qp *qp, struct ibv_recv_wr *wr,
			    struct ibv_recv_wr *want_bad, int want,
			    const char *what)
{
	struct ibv_recv_wr *bad = NULL;
	int ret = ibv_post_recv(qp, wr, &bad);

	info("%s: ibv_post_recv -> %s", what, err_name(ret));
	EXPECT(ret, "%s: ibv_post_recv succeeded", what);
	EXPECT(!want || is_errno(ret, want), "%s: ibv_post_recv returned %s, not %s",
	       what, err_name(ret), strerror(want));
	EXPECT(!is_vt3 || bad == want_bad, "%s: *bad_wr is %p, not WR %p", what,
	       (void *)bad, (void *)want_bad);
	return true;
}

static bool post_send_ok(struct ibv_qp *qp, struct ibv_send_wr *wr, const char *what)
{
	struct ibv_send_wr *bad = NULL;
	int ret = ibv_post_send(qp, wr, &bad);

	EXPECT(!ret, "%s: ibv_post_send: %s (bad_wr %p, first %p)", what,
	       err_name(ret), (void *)bad, (void *)wr);
	return true;
}

static bool post_recv_ok(struct ibv_qp *qp, struct ibv_recv_wr *wr, const char *what)
{
	struct ibv_recv_wr *bad = NULL;
	int ret = ibv_post_recv(qp, wr, &bad);

	EXPECT(!ret, "%s: ibv_post_recv: %s (bad_wr %p, first %p)", what,
	       err_name(ret), (void *)bad, (void *)wr);
	return true;
}

/* ------------------------------------------------------------------ */
/* Completions                                                         */

struct reaped {
	struct ibv_wc wc[MAX_WC];
	int n;
};

/*
 * Polls @cq until @want completions came (then watches QUIET_MS more for
 * any that must not come) or WAIT_MS passed.
 */
static bool reap(struct ibv_cq *cq, int want, struct reaped *r)
{
	double deadline = now_ms() + WAIT_MS, quiet = 0;
	int ret;

	r->n = 0;
	for (;;) {
		ret = ibv_poll_cq(cq, MAX_WC - r->n, r->wc + r->n);
		EXPECT(ret >= 0, "ibv_poll_cq: %d", ret);
		r->n += ret;
		if (r->n >= want && !quiet)
			quiet = now_ms() + QUIET_MS;
		if (r->n == MAX_WC || now_ms() > (quiet ? quiet : deadline))
			break;
		if (!ret) {
			struct timespec ts = { .tv_nsec = 2000000 };

			nanosleep(&ts, NULL);
		}
	}
	info("reaped %d completions (wanted %d)", r->n, want);
	return true;
}

static bool no_completions(struct ibv_cq *cq, const char *what)
{
	struct reaped r;

	TRY(reap(cq, 0, &r));
	EXPECT(r.n == 0, "%s: %d completion(s), the first wr_id %" PRIu64 " status %s",
	       what, r.n, r.wc[0].wr_id, ibv_wc_status_str(r.wc[0].status));
	return true;
}

/* The opcode a flushed WR of this kind reports (libvt3 fills it in). */
static enum ibv_wc_opcode wc_opcode_of(enum ibv_wr_opcode op)
{
	switch (op) {
	case IBV_WR_RDMA_WRITE:
		return IBV_WC_RDMA_WRITE;
	case IBV_WR_RDMA_READ:
		return IBV_WC_RDMA_READ;
	default:
		return IBV_WC_SEND;
	}
}

/*
 * The completions of one queue of @qp among @r: exactly @ids, each once,
 * in this order, all IBV_WC_WR_FLUSH_ERR; with @opcodes (vt3 only, since
 * the verbs leave the opcode of an error completion undefined) those.
 */
static bool flushed_exactly(const struct reaped *r, struct ibv_qp *qp,
			    bool recv, const uint64_t *ids, int n,
			    const enum ibv_wc_opcode *opcodes)
{
	int i, k = 0;

	for (i = 0; i < r->n; i++) {
		const struct ibv_wc *wc = &r->wc[i];

		if (wc->qp_num != qp->qp_num || (wc->status == IBV_WC_SUCCESS) ||
		    (is_vt3 && (wc->opcode == IBV_WC_RECV) != recv))
			continue;
		/* Without opcodes, receive and send flushes tell apart by wr_id. */
		if (!is_vt3) {
			int j;
			bool mine = false;

			for (j = 0; j < n; j++)
				mine |= wc->wr_id == ids[j];
			if (!mine)
				continue;
		}
		EXPECT(k < n, "%s: completion %d: wr_id %" PRIu64 " (%s) after all %d expected",
		       recv ? "RQ" : "SQ", i, wc->wr_id, ibv_wc_status_str(wc->status), n);
		EXPECT(wc->wr_id == ids[k], "%s: completion %d is wr_id %" PRIu64 ", expected %" PRIu64 " (order or duplicate)",
		       recv ? "RQ" : "SQ", k, wc->wr_id, ids[k]);
		EXPECT(wc->status == IBV_WC_WR_FLUSH_ERR, "%s: wr_id %" PRIu64 ": status %s, not WR_FLUSH_ERR",
		       recv ? "RQ" : "SQ", wc->wr_id, ibv_wc_status_str(wc->status));
		EXPECT(!is_vt3 || !opcodes || wc->opcode == opcodes[k],
		       "%s: wr_id %" PRIu64 ": opcode %d, expected %d", recv ? "RQ" : "SQ",
		       wc->wr_id, wc->opcode, opcodes ? opcodes[k] : 0);
		k++;
	}
	EXPECT(k == n, "%s: %d of %d WRs completed (missing wr_id %" PRIu64 ")",
	       recv ? "RQ" : "SQ", k, n, ids[k < n ? k : 0]);
	return true;
}

/* Every completion in @r belongs to one of the queues checked. */
static bool all_accounted(const struct reaped *r, int expected)
{
	EXPECT(r->n == expected, "%d completions, expected %d (an extra or a duplicate)",
	       r->n, expected);
	return true;
}

/* ------------------------------------------------------------------ */
/* The checks                                                          */

static bool check_poll_empty(struct env *e)
{
	struct ibv_wc wc[4];
	int ret;

	TRY(make_env(e));
	ret = ibv_poll_cq(e->cq[0], 4, wc);
	EXPECT(ret == 0, "ibv_poll_cq on a new CQ returned %d", ret);
	return no_completions(e->cq[0], "new CQ");
}

static bool check_reset_send(struct env *e)
{
	struct ibv_send_wr wr;

	TRY(make_env(e));
	send_wr(&wr, 1, IBV_WR_SEND, 1, IBV_SEND_SIGNALED);
	TRY(post_send_fails(e->qp[0], &wr, &wr, is_vt3 ? EINVAL : 0, "SEND in RESET"));
	return no_completions(e->cq[0], "after a SEND refused in RESET");
}

static bool check_reset_recv(struct env *e)
{
	struct ibv_recv_wr wr;

	TRY(make_env(e));
	recv_wr(&wr, 1, 1);
	TRY(post_recv_fails(e->qp[0], &wr, &wr, EINVAL, "RECV in RESET"));
	return no_completions(e->cq[0], "after a RECV refused in RESET");
}

static bool check_init_send(struct env *e)
{
	struct ibv_send_wr wr[2];

	TRY(make_env(e));
	TRY(to_state(e->qp[0], IBV_QPS_INIT));
	send_wr(&wr[0], 1, IBV_WR_SEND, 1, IBV_SEND_SIGNALED);
	send_wr(&wr[1], 2, IBV_WR_RDMA_WRITE, 1, IBV_SEND_SIGNALED);
	chain_send(wr, 2);
	TRY(post_send_fails(e->qp[0], wr, wr, is_vt3 ? EINVAL : 0, "SEND in INIT"));
	return no_completions(e->cq[0], "after sends refused in INIT");
}

static bool check_init_recv(struct env *e)
{
	struct ibv_recv_wr wr[4];
	int i;

	TRY(make_env(e));
	TRY(to_state(e->qp[0], IBV_QPS_INIT));
	for (i = 0; i < 4; i++)
		recv_wr(&wr[i], 10 + i, 1 + i % 2);
	chain_recv(wr, 4);
	TRY(post_recv_ok(e->qp[0], wr, "4 RECVs in INIT"));
	return no_completions(e->cq[0], "RECVs waiting in INIT");
}

/* The RQ takes max_recv_wr WRs, then refuses with ENOMEM at the first extra. */
static bool check_recv_full(struct env *e)
{
	struct ibv_recv_wr wr[3];
	unsigned int n = 0, limit;
	struct ibv_recv_wr *bad;
	int ret;

	TRY(make_env(e));
	TRY(to_state(e->qp[0], IBV_QPS_INIT));
	limit = e->cap[0].max_recv_wr + 64;
	for (;;) {
		recv_wr(&wr[0], n, 1);
		bad = NULL;
		ret = ibv_post_recv(e->qp[0], &wr[0], &bad);
		if (ret)
			break;
		EXPECT(++n < limit, "the RQ took %u WRs and more (cap %u)", n,
		       e->cap[0].max_recv_wr);
	}
	info("RQ took %u WRs (cap %u), then %s", n, e->cap[0].max_recv_wr, err_name(ret));
	EXPECT(is_errno(ret, ENOMEM), "the full RQ refused with %s, not ENOMEM", err_name(ret));
	EXPECT(bad == &wr[0], "*bad_wr of the refused WR is %p, not %p", (void *)bad, (void *)&wr[0]);
	EXPECT(n >= e->cap[0].max_recv_wr, "the RQ took %u WRs, fewer than its cap %u",
	       n, e->cap[0].max_recv_wr);
	EXPECT(!is_vt3 || n == e->cap[0].max_recv_wr, "the RQ took %u WRs, cap %u", n,
	       e->cap[0].max_recv_wr);
	/* Still full for a list: the first one is refused. */
	recv_wr(&wr[1], 1000, 1);
	recv_wr(&wr[2], 1001, 1);
	wr[1].next = &wr[2];
	TRY(post_recv_fails(e->qp[0], &wr[1], &wr[1], ENOMEM, "a list on a full RQ"));
	return true;
}

static bool check_recv_sge(struct env *e)
{
	struct ibv_recv_wr wr;

	TRY(make_env(e));
	TRY(to_state(e->qp[0], IBV_QPS_INIT));
	recv_wr(&wr, 1, 1);
	wr.num_sge = dev_attr.max_sge + 1;
	TRY(post_recv_fails(e->qp[0], &wr, &wr, EINVAL, "RECV with the device's max_sge + 1 SGEs"));
	return no_completions(e->cq[0], "after a RECV refused for its SGEs");
}

/* libvt3 checks the QP's own SGE limit, refuses a list at the bad WR. */
static bool check_recv_sge_vt3(struct env *e)
{
	struct ibv_recv_wr wr[3];
	struct reaped r;
	uint64_t id;

	TRY(make_env(e));
	TRY(to_state(e->qp[0], IBV_QPS_INIT));
	recv_wr(&wr[0], 1, 1);
	wr[0].num_sge = e->cap[0].max_recv_sge + 1;
	TRY(post_recv_fails(e->qp[0], &wr[0], &wr[0], EINVAL, "RECV with max_recv_sge + 1 SGEs"));
	recv_wr(&wr[0], 2, 1);
	wr[0].num_sge = -1;
	TRY(post_recv_fails(e->qp[0], &wr[0], &wr[0], EINVAL, "RECV with -1 SGEs"));
	/* Good, bad, good: the first is posted, *bad_wr is the second. */
	recv_wr(&wr[0], 3, 0);
	recv_wr(&wr[1], 4, 1);
	recv_wr(&wr[2], 5, 1);
	wr[1].num_sge = e->cap[0].max_recv_sge + 1;
	chain_recv(wr, 3);
	TRY(post_recv_fails(e->qp[0], wr, &wr[1], EINVAL, "good, bad, good"));
	TRY(to_state(e->qp[0], IBV_QPS_ERR));
	TRY(reap(e->cq[0], 1, &r));
	id = 3;
	TRY(flushed_exactly(&r, e->qp[0], true, &id, 1, NULL));
	return all_accounted(&r, 1);
}

/* RECVs posted in INIT are flushed by the move to ERR: once each, in order. */
static bool check_error_flush(struct env *e)
{
	static const uint64_t ids[] = { 21, 22, 23, 24, 25 };
	enum ibv_wc_opcode ops[5];
	struct ibv_recv_wr wr[5];
	struct reaped r;
	int i;

	TRY(make_env(e));
	TRY(to_state(e->qp[0], IBV_QPS_INIT));
	for (i = 0; i < 5; i++) {
		recv_wr(&wr[i], ids[i], 1 + i % 2);
		ops[i] = IBV_WC_RECV;
	}
	chain_recv(wr, 5);
	TRY(post_recv_ok(e->qp[0], wr, "5 RECVs in INIT"));
	TRY(to_state(e->qp[0], IBV_QPS_ERR));
	TRY(reap(e->cq[0], 5, &r));
	TRY(flushed_exactly(&r, e->qp[0], true, ids, 5, ops));
	return all_accounted(&r, 5);
}

/*
 * WRs posted to a QP in error are taken and complete with FLUSH_ERR, after
 * those flushed already, in order per queue: every opcode, solicited,
 * fenced, inline; unsignaled sends make no completion (DESIGN.md 5).
 */
static bool check_error_post(struct env *e)
{
	static const uint64_t rq_ids[] = { 31, 32, 33, 34 };
	struct ibv_send_wr swr[10];
	struct ibv_recv_wr rwr[4];
	uint64_t sq_ids[10];
	enum ibv_wc_opcode sq_ops[10], rq_ops[4];
	int ns = 0, nsig = 0, i;
	struct reaped r;

	TRY(make_cq(e, 0, false));
	TRY(make_cq(e, 1, false));
	TRY(make_qp(e, 0, 0, 1, false));
	TRY(to_state(e->qp[0], IBV_QPS_INIT));
	recv_wr(&rwr[0], rq_ids[0], 1);
	TRY(post_recv_ok(e->qp[0], rwr, "a RECV in INIT"));
	TRY(to_state(e->qp[0], IBV_QPS_ERR));

	for (i = 1; i < 4; i++)
		recv_wr(&rwr[i], rq_ids[i], i % 3);
	chain_recv(&rwr[1], 3);
	TRY(post_recv_ok(e->qp[0], &rwr[1], "3 RECVs in ERR"));
	for (i = 0; i < 4; i++)
		rq_ops[i] = IBV_WC_RECV;

	/* Signaled or not, each completes: in error, always (ibv_post_send(3)). */
#define SQ(op, sges, flags)							\
	do {									\
		send_wr(&swr[ns], 40 + ns, op, sges, flags);			\
		sq_ids[nsig] = 40 + ns;						\
		sq_ops[nsig++] = wc_opcode_of(op);				\
		ns++;								\
	} while (0)
	SQ(IBV_WR_SEND, 1, IBV_SEND_SIGNALED);
	SQ(IBV_WR_SEND, 2, IBV_SEND_SIGNALED | IBV_SEND_SOLICITED);
	SQ(IBV_WR_SEND, 1, 0);
	SQ(IBV_WR_SEND_WITH_INV, 1, IBV_SEND_SIGNALED);
	SQ(IBV_WR_RDMA_WRITE, 2, IBV_SEND_SIGNALED);
	SQ(IBV_WR_RDMA_WRITE, 1, 0);
	SQ(IBV_WR_RDMA_READ, 1, IBV_SEND_SIGNALED | IBV_SEND_FENCE);
	SQ(IBV_WR_SEND, 0, IBV_SEND_SIGNALED);
	if (e->cap[0].max_inline_data)
		SQ(IBV_WR_SEND, 1, IBV_SEND_SIGNALED | IBV_SEND_INLINE);
#undef SQ
	chain_send(swr, ns);
	TRY(post_send_ok(e->qp[0], swr, "sends of every kind in ERR"));

	TRY(reap(e->cq[1], 4, &r));
	TRY(flushed_exactly(&r, e->qp[0], true, rq_ids, 4, rq_ops));
	TRY(all_accounted(&r, 4));
	TRY(reap(e->cq[0], nsig, &r));
	TRY(flushed_exactly(&r, e->qp[0], false, sq_ids, nsig, sq_ops));
	return all_accounted(&r, nsig);
}

/* With sq_sig_all every send is signaled, so every one is flushed. */
static bool check_error_sig_all(struct env *e)
{
	static const uint64_t ids[] = { 51, 52, 53 };
	struct ibv_send_wr wr[3];
	struct reaped r;

	TRY(make_cq(e, 0, false));
	TRY(make_qp(e, 0, 0, 0, true));
	TRY(to_state(e->qp[0], IBV_QPS_INIT));
	TRY(to_state(e->qp[0], IBV_QPS_ERR));
	send_wr(&wr[0], ids[0], IBV_WR_SEND, 1, 0);
	send_wr(&wr[1], ids[1], IBV_WR_RDMA_WRITE, 1, 0);
	send_wr(&wr[2], ids[2], IBV_WR_SEND, 1, IBV_SEND_SIGNALED);
	chain_send(wr, 3);
	TRY(post_send_ok(e->qp[0], wr, "unsignaled sends on a sq_sig_all QP in ERR"));
	TRY(reap(e->cq[0], 3, &r));
	TRY(flushed_exactly(&r, e->qp[0], false, ids, 3, NULL));
	return all_accounted(&r, 3);
}

/* A send-side check on a QP in ERR, where vt3 and siw both take sends. */
static bool error_qp(struct env *e)
{
	TRY(make_env(e));
	TRY(to_state(e->qp[0], IBV_QPS_INIT));
	return to_state(e->qp[0], IBV_QPS_ERR);
}

static bool check_send_invalid(struct env *e)
{
	struct ibv_send_wr wr;

	TRY(error_qp(e));
	send_wr(&wr, 1, IBV_WR_SEND, 1, IBV_SEND_SIGNALED);
	wr.num_sge = dev_attr.max_sge + 1;
	TRY(post_send_fails(e->qp[0], &wr, &wr, EINVAL, "SEND with the device's max_sge + 1 SGEs"));
	send_wr(&wr, 2, IBV_WR_ATOMIC_FETCH_AND_ADD, 1, IBV_SEND_SIGNALED);
	TRY(post_send_fails(e->qp[0], &wr, &wr, EINVAL, "ATOMIC_FETCH_AND_ADD on iWARP"));
	send_wr(&wr, 3, IBV_WR_RDMA_WRITE_WITH_IMM, 1, IBV_SEND_SIGNALED);
	TRY(post_send_fails(e->qp[0], &wr, &wr, EINVAL, "RDMA_WRITE_WITH_IMM on iWARP"));
	return no_completions(e->cq[0], "after refused sends");
}

/* libvt3's own limits: the QP's SGEs, inline size, READ sink, lists. */
static bool check_send_invalid_vt3(struct env *e)
{
	struct ibv_send_wr wr[3];
	static char big[256];
	struct ibv_sge sge = { .addr = (uintptr_t)big };
	struct reaped r;
	uint64_t id;

	TRY(error_qp(e));
	send_wr(&wr[0], 1, IBV_WR_SEND, 1, IBV_SEND_SIGNALED);
	wr[0].num_sge = e->cap[0].max_send_sge + 1;
	TRY(post_send_fails(e->qp[0], wr, wr, EINVAL, "SEND with max_send_sge + 1 SGEs"));
	wr[0].num_sge = -1;
	TRY(post_send_fails(e->qp[0], wr, wr, EINVAL, "SEND with -1 SGEs"));
	send_wr(&wr[0], 2, IBV_WR_SEND, 1, IBV_SEND_SIGNALED | IBV_SEND_INLINE);
	sge.length = e->cap[0].max_inline_data + 1;
	wr[0].sg_list = &sge;
	TRY(post_send_fails(e->qp[0], wr, wr, EINVAL, "inline SEND of max_inline + 1 bytes"));
	send_wr(&wr[0], 3, IBV_WR_RDMA_READ, 1, IBV_SEND_SIGNALED | IBV_SEND_INLINE);
	TRY(post_send_fails(e->qp[0], wr, wr, EINVAL, "inline RDMA_READ"));
	if (dev_attr.max_sge_rd && dev_attr.max_sge_rd < (int)e->cap[0].max_send_sge) {
		send_wr(&wr[0], 4, IBV_WR_RDMA_READ, dev_attr.max_sge_rd + 1, IBV_SEND_SIGNALED);
		TRY(post_send_fails(e->qp[0], wr, wr, EINVAL, "RDMA_READ with max_sge_rd + 1 SGEs"));
	}
	/* An opcode of no iWARP QP (LOCAL_INV is libvt3's now: vt3-qpex). */
	send_wr(&wr[0], 5, IBV_WR_TSO, 0, IBV_SEND_SIGNALED);
	TRY(post_send_fails(e->qp[0], wr, wr, EINVAL, "TSO"));
	TRY(no_completions(e->cq[0], "after refused sends"));

	/* Good, bad, good: the first is posted (and flushed), *bad_wr the second. */
	send_wr(&wr[0], 6, IBV_WR_SEND, 1, IBV_SEND_SIGNALED);
	send_wr(&wr[1], 7, IBV_WR_SEND, 1, IBV_SEND_SIGNALED);
	send_wr(&wr[2], 8, IBV_WR_SEND, 1, IBV_SEND_SIGNALED);
	wr[1].num_sge = e->cap[0].max_send_sge + 1;
	chain_send(wr, 3);
	TRY(post_send_fails(e->qp[0], wr, &wr[1], EINVAL, "good, bad, good"));
	TRY(reap(e->cq[0], 1, &r));
	id = 6;
	TRY(flushed_exactly(&r, e->qp[0], false, &id, 1, NULL));
	return all_accounted(&r, 1);
}

/* Fills the SQ of a QP in ERR one signaled SEND at a time; returns how many it took. */
static bool fill_sq(struct env *e, uint64_t first_id, unsigned int *taken)
{
	unsigned int n = 0, limit = e->cap[0].max_send_wr + 64;
	struct ibv_send_wr wr, *bad;
	int ret;

	for (;;) {
		send_wr(&wr, first_id + n, IBV_WR_SEND, 1, IBV_SEND_SIGNALED);
		bad = NULL;
		ret = ibv_post_send(e->qp[0], &wr, &bad);
		if (ret)
			break;
		EXPECT(++n < limit, "the SQ took %u WRs and more (cap %u)", n,
		       e->cap[0].max_send_wr);
	}
	info("SQ took %u WRs (cap %u), then %s", n, e->cap[0].max_send_wr, err_name(ret));
	EXPECT(is_errno(ret, ENOMEM), "the full SQ refused with %s, not ENOMEM", err_name(ret));
	EXPECT(!is_vt3 || bad == &wr, "*bad_wr of the refused WR is %p, not %p",
	       (void *)bad, (void *)&wr);
	EXPECT(n >= e->cap[0].max_send_wr, "the SQ took %u WRs, fewer than its cap %u",
	       n, e->cap[0].max_send_wr);
	EXPECT(!is_vt3 || n == e->cap[0].max_send_wr, "the SQ took %u WRs, cap %u", n,
	       e->cap[0].max_send_wr);
	*taken = n;
	return true;
}

static bool check_send_full(struct env *e)
{
	unsigned int n;

	TRY(error_qp(e));
	return fill_sq(e, 100, &n);
}

/* Flushing frees the slots: a full SQ in ERR takes WRs again after the poll. */
static bool check_send_full_vt3(struct env *e)
{
	uint64_t ids[MAX_WC];
	unsigned int n, i, round;
	struct reaped r;

	TRY(error_qp(e));
	for (round = 0; round < 3; round++) {
		TRY(fill_sq(e, 1000 * (round + 1), &n));
		EXPECT(n <= MAX_WC, "SQ of %u", n);
		for (i = 0; i < n; i++)
			ids[i] = 1000 * (round + 1) + i;
		TRY(reap(e->cq[0], n, &r));
		TRY(flushed_exactly(&r, e->qp[0], false, ids, n, NULL));
		TRY(all_accounted(&r, n));
	}
	return true;
}

/*
 * RESET drops the outstanding WRs without completions; the QP is usable
 * again afterwards, and no longer in error.
 */
/*
 * A queue whose flush is complete is set aside by poll_cq (libvt3 does not
 * walk it again on every poll); a WR posted to it later must still be
 * flushed, on the next poll, and the other queue of the CQ too.
 */
static bool check_error_repost(struct env *e)
{
	static const uint64_t first[] = { 61 }, again_rq[] = { 62, 63 }, again_sq[] = { 64 };
	static const enum ibv_wc_opcode recv_ops[] = { IBV_WC_RECV, IBV_WC_RECV };
	static const enum ibv_wc_opcode send_ops[] = { IBV_WC_RDMA_WRITE };
	struct ibv_recv_wr rwr[2];
	struct ibv_send_wr swr;
	struct reaped r;
	int round;

	TRY(make_cq(e, 0, false));
	TRY(make_qp(e, 0, 0, 0, false));
	TRY(to_state(e->qp[0], IBV_QPS_INIT));
	recv_wr(&rwr[0], first[0], 1);
	TRY(post_recv_ok(e->qp[0], rwr, "a RECV in INIT"));
	TRY(to_state(e->qp[0], IBV_QPS_ERR));
	TRY(reap(e->cq[0], 1, &r));
	TRY(flushed_exactly(&r, e->qp[0], true, first, 1, recv_ops));
	TRY(all_accounted(&r, 1));
	/* Twice: the queues are set aside again after each flush. */
	for (round = 0; round < 2; round++) {
		TRY(no_completions(e->cq[0], "a flushed QP"));
		recv_wr(&rwr[0], again_rq[0] + 10 * round, 1);
		recv_wr(&rwr[1], again_rq[1] + 10 * round, 1);
		chain_recv(rwr, 2);
		TRY(post_recv_ok(e->qp[0], rwr, "2 RECVs after the flush"));
		send_wr(&swr, again_sq[0] + 10 * round, IBV_WR_RDMA_WRITE, 1, IBV_SEND_SIGNALED);
		TRY(post_send_ok(e->qp[0], &swr, "a WRITE after the flush"));
		TRY(reap(e->cq[0], 3, &r));
		{
			uint64_t rq[2] = { again_rq[0] + 10 * round, again_rq[1] + 10 * round };
			uint64_t sq[1] = { again_sq[0] + 10 * round };

			TRY(flushed_exactly(&r, e->qp[0], true, rq, 2, recv_ops));
			TRY(flushed_exactly(&r, e->qp[0], false, sq, 1, send_ops));
		}
		TRY(all_accounted(&r, 3));
	}
	return true;
}

/*
 * A QP destroyed in ERR before its flush was reaped: none of its
 * completions comes after ibv_destroy_qp() returned (DESIGN.md section 5;
 * mlx5 cleans its CQs the same way), while another QP's on the same CQ
 * still do.
 */
static bool check_destroy_flush(struct env *e)
{
	static const uint64_t keep_ids[] = { 81 };
	static const enum ibv_wc_opcode recv_ops[] = { IBV_WC_RECV };
	struct ibv_recv_wr rwr[3], keep;
	struct ibv_send_wr swr;
	struct ibv_qp *qp;
	struct reaped r;
	int i;

	TRY(make_cq(e, 0, false));
	TRY(make_qp(e, 0, 0, 0, false));
	TRY(make_qp(e, 1, 0, 0, false));
	TRY(to_state(e->qp[0], IBV_QPS_INIT));
	TRY(to_state(e->qp[1], IBV_QPS_INIT));
	for (i = 0; i < 3; i++)
		recv_wr(&rwr[i], 71 + i, 1);
	chain_recv(rwr, 3);
	TRY(post_recv_ok(e->qp[0], rwr, "3 RECVs in INIT"));
	recv_wr(&keep, keep_ids[0], 1);
	TRY(post_recv_ok(e->qp[1], &keep, "a RECV on the other QP"));
	TRY(to_state(e->qp[0], IBV_QPS_ERR));
	send_wr(&swr, 74, IBV_WR_RDMA_WRITE, 1, IBV_SEND_SIGNALED);
	TRY(post_send_ok(e->qp[0], &swr, "a WRITE in ERR"));
	TRY(to_state(e->qp[1], IBV_QPS_ERR));
	qp = e->qp[0];
	e->qp[0] = NULL;
	EXPECT(!ibv_destroy_qp(qp), "ibv_destroy_qp: %s", strerror(errno));
	TRY(reap(e->cq[0], 1, &r));
	TRY(flushed_exactly(&r, e->qp[1], true, keep_ids, 1, recv_ops));
	return all_accounted(&r, 1);
}

/* A send that completes in error always completes: unsignaled ones too. */
static bool check_error_unsignaled(struct env *e)
{
	static const uint64_t ids[] = { 91, 92, 93 };
	struct ibv_send_wr wr[3];
	struct reaped r;

	TRY(error_qp(e));
	send_wr(&wr[0], ids[0], IBV_WR_SEND, 1, 0);
	send_wr(&wr[1], ids[1], IBV_WR_RDMA_WRITE, 1, IBV_SEND_SIGNALED);
	send_wr(&wr[2], ids[2], IBV_WR_RDMA_WRITE, 1, 0);
	chain_send(wr, 3);
	TRY(post_send_ok(e->qp[0], wr, "unsignaled and signaled sends in ERR"));
	TRY(reap(e->cq[0], 3, &r));
	TRY(flushed_exactly(&r, e->qp[0], false, ids, 3, NULL));
	return all_accounted(&r, 3);
}

static bool check_reset_reuse(struct env *e)
{
	struct ibv_recv_wr wr[2];
	struct reaped r;
	uint64_t ids[2] = { 61, 62 };

	TRY(make_env(e));
	TRY(to_state(e->qp[0], IBV_QPS_INIT));
	recv_wr(&wr[0], 51, 1);
	recv_wr(&wr[1], 52, 1);
	chain_recv(wr, 2);
	TRY(post_recv_ok(e->qp[0], wr, "2 RECVs in INIT"));
	TRY(to_state(e->qp[0], IBV_QPS_ERR));
	TRY(to_state(e->qp[0], IBV_QPS_RESET));
	TRY(no_completions(e->cq[0], "WRs dropped by RESET"));
	TRY(to_state(e->qp[0], IBV_QPS_INIT));
	recv_wr(&wr[0], ids[0], 1);
	recv_wr(&wr[1], ids[1], 1);
	chain_recv(wr, 2);
	TRY(post_recv_ok(e->qp[0], wr, "2 RECVs in INIT after RESET"));
	TRY(no_completions(e->cq[0], "RECVs waiting in INIT after RESET"));
	TRY(to_state(e->qp[0], IBV_QPS_ERR));
	TRY(reap(e->cq[0], 2, &r));
	TRY(flushed_exactly(&r, e->qp[0], true, ids, 2, NULL));
	return all_accounted(&r, 2);
}

/* Two QPs on one CQ: the flush of one leaves the other alone. */
static bool check_flush_shared_cq(struct env *e)
{
	static const uint64_t a_ids[] = { 71, 72, 73 };
	struct ibv_recv_wr wr[3];
	struct reaped r;
	int i;

	TRY(make_cq(e, 0, false));
	TRY(make_qp(e, 0, 0, 0, false));
	TRY(make_qp(e, 1, 0, 0, false));
	TRY(to_state(e->qp[0], IBV_QPS_INIT));
	TRY(to_state(e->qp[1], IBV_QPS_INIT));
	for (i = 0; i < 3; i++)
		recv_wr(&wr[i], a_ids[i], 1);
	chain_recv(wr, 3);
	TRY(post_recv_ok(e->qp[0], wr, "3 RECVs on QP A"));
	for (i = 0; i < 3; i++)
		recv_wr(&wr[i], 80 + i, 1);
	chain_recv(wr, 3);
	TRY(post_recv_ok(e->qp[1], wr, "3 RECVs on QP B"));
	TRY(to_state(e->qp[0], IBV_QPS_ERR));
	TRY(reap(e->cq[0], 3, &r));
	TRY(flushed_exactly(&r, e->qp[0], true, a_ids, 3, NULL));
	return all_accounted(&r, 3);
}

/* Waits for one event on the env's channel; acks it. */
static bool wait_event(struct env *e, struct ibv_cq *want, int ms)
{
	struct pollfd pfd = { .fd = e->channel->fd, .events = POLLIN };
	struct ibv_cq *cq;
	void *cq_ctx;
	int ret;

	ret = poll(&pfd, 1, ms);
	EXPECT(ret == 1, "no completion event within %d ms", ms);
	EXPECT(!ibv_get_cq_event(e->channel, &cq, &cq_ctx), "ibv_get_cq_event: %s",
	       strerror(errno));
	ibv_ack_cq_events(cq, 1);
	EXPECT(cq == want, "event for CQ %p, not %p", (void *)cq, (void *)want);
	return true;
}

/* An armed CQ wakes its waiter when a QP on it goes to ERR with WRs to flush. */
static bool check_error_event(struct env *e)
{
	static const uint64_t ids[] = { 91, 92 };
	struct ibv_recv_wr wr[2];
	struct reaped r;

	TRY(make_cq(e, 0, true));
	TRY(make_qp(e, 0, 0, 0, false));
	TRY(to_state(e->qp[0], IBV_QPS_INIT));
	recv_wr(&wr[0], ids[0], 1);
	recv_wr(&wr[1], ids[1], 1);
	chain_recv(wr, 2);
	TRY(post_recv_ok(e->qp[0], wr, "2 RECVs in INIT"));
	EXPECT(!ibv_req_notify_cq(e->cq[0], 0), "ibv_req_notify_cq failed");
	TRY(to_state(e->qp[0], IBV_QPS_ERR));
	TRY(wait_event(e, e->cq[0], WAIT_MS));
	TRY(reap(e->cq[0], 2, &r));
	TRY(flushed_exactly(&r, e->qp[0], true, ids, 2, NULL));
	return all_accounted(&r, 2);
}

/* And when a WR is posted to a QP already in ERR and flushed (ib_drain_qp's way). */
static bool check_drain_event(struct env *e)
{
	struct ibv_send_wr wr;
	struct reaped r;
	uint64_t id = 99;

	TRY(make_cq(e, 0, true));
	TRY(make_qp(e, 0, 0, 0, false));
	TRY(to_state(e->qp[0], IBV_QPS_INIT));
	TRY(to_state(e->qp[0], IBV_QPS_ERR));
	TRY(no_completions(e->cq[0], "an empty QP in ERR"));
	EXPECT(!ibv_req_notify_cq(e->cq[0], 0), "ibv_req_notify_cq failed");
	send_wr(&wr, id, IBV_WR_SEND, 0, IBV_SEND_SIGNALED);
	TRY(post_send_ok(e->qp[0], &wr, "the drain SEND"));
	TRY(wait_event(e, e->cq[0], WAIT_MS));
	TRY(reap(e->cq[0], 1, &r));
	TRY(flushed_exactly(&r, e->qp[0], false, &id, 1, NULL));
	return all_accounted(&r, 1);
}

/* Arming a CQ with a flush already waiting raises the event at once. */
static bool check_arm_pending(struct env *e)
{
	struct ibv_send_wr wr;
	struct reaped r;
	uint64_t id = 98;

	TRY(make_cq(e, 0, true));
	TRY(make_qp(e, 0, 0, 0, false));
	TRY(to_state(e->qp[0], IBV_QPS_INIT));
	TRY(to_state(e->qp[0], IBV_QPS_ERR));
	send_wr(&wr, id, IBV_WR_SEND, 0, IBV_SEND_SIGNALED);
	TRY(post_send_ok(e->qp[0], &wr, "a SEND in ERR"));
	EXPECT(!ibv_req_notify_cq(e->cq[0], 0), "ibv_req_notify_cq failed");
	TRY(wait_event(e, e->cq[0], WAIT_MS));
	TRY(reap(e->cq[0], 1, &r));
	TRY(flushed_exactly(&r, e->qp[0], false, &id, 1, NULL));
	return all_accounted(&r, 1);
}

/*
 * The doorbell is rung outside the CQ's lock: a syscall must not hold up
 * the application's other threads polling the same CQ. The doorbell is a
 * post command without WRs (ibv_cmd_post_send/_recv with none); this
 * program defines both, which the provider's calls resolve to (an
 * executable's definition comes first), and passes them on to
 * libibverbs'. While doorbell_watch is set, a doorbell waits there until
 * a second thread has polled the CQ. Were the provider holding the CQ's
 * lock across it, that poll could not finish before the doorbell
 * returned; the wait is bounded so that the check ends either way.
 */
#define DOORBELL_WAIT_S		10

static struct {
	bool watch;
	struct ibv_cq *cq;
	int doorbells;		/* doorbells rung while watching */
	int polled;		/* polls that finished inside a doorbell */
	int polled_wcs;		/* what those polls returned */
	pthread_t poller;
	bool waiting;		/* the poll outlived its doorbell's deadline */
} doorbell_watch;

static void *poll_inside_doorbell(void *arg)
{
	struct ibv_wc wc;

	(void)arg;
	return (void *)(intptr_t)ibv_poll_cq(doorbell_watch.cq, 1, &wc);
}

/*
 * A doorbell rung while watching: another thread polls before it goes on.
 * A poll still waiting at the deadline waits for a lock the provider
 * holds: the check joins it once the provider's call returned.
 */
static void doorbell_rendezvous(void)
{
	struct timespec deadline;
	void *got;

	if (!doorbell_watch.watch)
		return;
	doorbell_watch.doorbells++;
	if (doorbell_watch.waiting || pthread_create(&doorbell_watch.poller, NULL, poll_inside_doorbell, NULL))
		return;
	clock_gettime(CLOCK_REALTIME, &deadline);
	deadline.tv_sec += DOORBELL_WAIT_S;
	if (pthread_timedjoin_np(doorbell_watch.poller, &got, &deadline)) {
		doorbell_watch.waiting = true;
		return;
	}
	doorbell_watch.polled++;
	doorbell_watch.polled_wcs += (int)(intptr_t)got;
}

int ibv_cmd_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr);
int ibv_cmd_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr);

int ibv_cmd_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr)
{
	static int (*real)(struct ibv_qp *, struct ibv_send_wr *, struct ibv_send_wr **);

	if (!real)
		real = (typeof(real))dlsym(RTLD_NEXT, "ibv_cmd_post_send");
	if (!wr)
		doorbell_rendezvous();
	return real ? real(qp, wr, bad_wr) : ENOSYS;
}

int ibv_cmd_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
	static int (*real)(struct ibv_qp *, struct ibv_recv_wr *, struct ibv_recv_wr **);

	if (!real)
		real = (typeof(real))dlsym(RTLD_NEXT, "ibv_cmd_post_recv");
	if (!wr)
		doorbell_rendezvous();
	return real ? real(qp, wr, bad_wr) : ENOSYS;
}

/* Arming with a flush waiting rings a doorbell; other threads may poll meanwhile. */
static bool check_doorbell_unlocked(struct env *e)
{
	struct ibv_send_wr wr;
	uint64_t id = 97;
	bool ok;

	TRY(make_cq(e, 0, true));
	TRY(make_qp(e, 0, 0, 0, false));
	TRY(to_state(e->qp[0], IBV_QPS_INIT));
	TRY(to_state(e->qp[0], IBV_QPS_ERR));
	send_wr(&wr, id, IBV_WR_SEND, 0, IBV_SEND_SIGNALED);
	TRY(post_send_ok(e->qp[0], &wr, "a SEND in ERR"));
	doorbell_watch = (typeof(doorbell_watch)){ .watch = true, .cq = e->cq[0] };
	ok = !ibv_req_notify_cq(e->cq[0], 0);
	doorbell_watch.watch = false;
	if (doorbell_watch.waiting)
		pthread_join(doorbell_watch.poller, NULL);	/* the lock is free now */
	EXPECT(ok, "ibv_req_notify_cq failed");
	EXPECT(doorbell_watch.doorbells == 1, "%d doorbells rung while arming, want 1", doorbell_watch.doorbells);
	EXPECT(doorbell_watch.polled == 1,
	       "a poll on another thread waited %d s for the doorbell's syscall: the CQ's lock is held across it",
	       DOORBELL_WAIT_S);
	EXPECT(doorbell_watch.polled_wcs == 1, "the poll inside the doorbell returned %d completions, want the flush (1)",
	       doorbell_watch.polled_wcs);
	TRY(wait_event(e, e->cq[0], WAIT_MS));
	return no_completions(e->cq[0], "after the flushed SEND was polled");
}

struct check {
	const char *name;
	bool (*fn)(struct env *e);
	/* NULL: generic verbs; else why it is libvt3's contract only. */
	const char *vt3_only;
	const char *what;
};

static const struct check checks[] = {
	{ "poll-empty", check_poll_empty, NULL, "a new CQ polls empty" },
	{ "reset-send", check_reset_send, NULL, "SEND in RESET is refused, nothing completes" },
	{ "reset-recv", check_reset_recv, "siw takes receive WRs in RESET",
	  "RECV in RESET is refused with EINVAL" },
	{ "init-send", check_init_send, NULL, "sends in INIT are refused, nothing completes" },
	{ "init-recv", check_init_recv, NULL, "RECVs in INIT are taken and wait" },
	{ "recv-full", check_recv_full, NULL, "the RQ takes max_recv_wr WRs, then ENOMEM at the first extra" },
	{ "recv-sge", check_recv_sge, NULL, "a RECV with too many SGEs is refused with EINVAL" },
	{ "recv-sge-vt3", check_recv_sge_vt3, "siw checks its own SGE maximum only",
	  "the QP's SGE limit; a list is refused at the bad WR, the ones before are posted" },
	{ "error-flush", check_error_flush, NULL,
	  "RECVs posted in INIT complete once each with WR_FLUSH_ERR, in order, on ERR" },
	{ "flush-shared-cq", check_flush_shared_cq, NULL, "the flush of one QP leaves another on its CQ alone" },
	{ "error-post", check_error_post, "siw leaves user WRs posted in ERROR in the ring",
	  "WRs of every kind posted in ERR are taken and flushed once each, per-queue order" },
	{ "error-sig-all", check_error_sig_all, "siw leaves user WRs posted in ERROR in the ring",
	  "on a sq_sig_all QP in ERR every send is flushed" },
	{ "send-invalid", check_send_invalid, NULL, "too many SGEs, atomics, immediate data: EINVAL" },
	{ "send-invalid-vt3", check_send_invalid_vt3, "siw checks its own limits only",
	  "the QP's SGE and inline limits, READ sink SGEs, inline READ, lists" },
	{ "send-full", check_send_full, NULL, "the SQ takes max_send_wr WRs, then ENOMEM" },
	{ "send-full-vt3", check_send_full_vt3, "siw leaves user WRs posted in ERROR in the ring",
	  "flushed WRs free their SQ slots: fill, reap, fill again" },
	{ "error-repost", check_error_repost, "siw leaves user WRs posted in ERROR in the ring",
	  "WRs posted to a QP whose flush was complete are flushed on the next poll, twice" },
	{ "destroy-flush", check_destroy_flush, "siw leaves user WRs posted in ERROR in the ring",
	  "nothing of a QP destroyed in ERR comes after the destroy; the CQ's other QP still flushes" },
	{ "error-unsignaled", check_error_unsignaled, "siw leaves user WRs posted in ERROR in the ring",
	  "unsignaled sends posted in ERR are flushed too, in order with the signaled ones" },
	{ "reset-reuse", check_reset_reuse, "QP reuse after RESET is libvt3's contract with vt3d",
	  "RESET drops WRs without completions; the QP then works and is not in error" },
	{ "error-event", check_error_event, NULL, "an armed CQ gets an event when its QP goes to ERR" },
	{ "drain-event", check_drain_event, "siw leaves user WRs posted in ERROR in the ring",
	  "a WR posted to a QP in ERR wakes an armed CQ" },
	{ "arm-pending", check_arm_pending, "siw leaves user WRs posted in ERROR in the ring",
	  "arming a CQ with a flush waiting raises the event at once" },
	{ "doorbell-unlocked", check_doorbell_unlocked, "the doorbell is libvt3's",
	  "the doorbell rung by arming leaves the CQ's lock free: another thread polls meanwhile" },
};

#define NUM_CHECKS (sizeof(checks) / sizeof(checks[0]))

static struct ibv_device *find_device(struct ibv_device **list, const char *name)
{
	int i;

	for (i = 0; list[i]; i++) {
		const char *n = ibv_get_device_name(list[i]);

		if (name ? !strcmp(n, name) : !strncmp(n, "vt3", 3))
			return list[i];
	}
	fprintf(stderr, "%s: no device %s; there are:", prog, name ? name : "vt3*");
	for (i = 0; list[i]; i++)
		fprintf(stderr, " %s", ibv_get_device_name(list[i]));
	fputc('\n', stderr);
	exit(1);
}

static bool selected(const char *only, const char *name)
{
	size_t len = strlen(name);
	const char *p = only;

	if (!only)
		return true;
	while ((p = strstr(p, name))) {
		if ((p == only || p[-1] == ',') && (p[len] == ',' || !p[len]))
			return true;
		p += len;
	}
	return false;
}

int main(int argc, char **argv)
{
	const char *dev_name = NULL, *only = NULL;
	bool all = false;
	unsigned int passed = 0, failed = 0, skipped = 0, i;
	struct ibv_device **list;
	int opt;

	while ((opt = getopt(argc, argv, "d:c:alvh")) != -1) {
		switch (opt) {
		case 'd':
			dev_name = optarg;
			break;
		case 'c':
			only = optarg;
			break;
		case 'a':
			all = true;
			break;
		case 'l':
			for (i = 0; i < NUM_CHECKS; i++)
				printf("%-18s %s%s\n", checks[i].name, checks[i].what,
				       checks[i].vt3_only ? " [vt3]" : "");
			return 0;
		case 'v':
			verbose = true;
			break;
		default:
			fprintf(stderr, "usage: %s [-d DEVICE] [-c CHECK[,CHECK...]] [-a] [-l] [-v]\n", prog);
			return opt == 'h' ? 0 : 2;
		}
	}
	setvbuf(stdout, NULL, _IOLBF, 0);

	list = ibv_get_device_list(NULL);
	if (!list) {
		fprintf(stderr, "%s: ibv_get_device_list: %s\n", prog, strerror(errno));
		return 1;
	}
	ctx = ibv_open_device(find_device(list, dev_name));
	if (!ctx || ibv_query_device(ctx, &dev_attr)) {
		fprintf(stderr, "%s: cannot open or query the device: %s\n", prog, strerror(errno));
		return 1;
	}
	/* Chelsio's vendor id and the T3 part vt3d reports (vt3_hw.h). */
	is_vt3 = dev_attr.vendor_id == 0x1425 && dev_attr.vendor_part_id == 0x0031;
	pd = ibv_alloc_pd(ctx);
	buf = aligned_alloc(4096, BUF_SIZE);
	if (!pd || !buf) {
		fprintf(stderr, "%s: ibv_alloc_pd or buffer: %s\n", prog, strerror(errno));
		return 1;
	}
	mr = ibv_reg_mr(pd, buf, BUF_SIZE, IBV_ACCESS_LOCAL_WRITE |
			IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	if (!mr) {
		fprintf(stderr, "%s: ibv_reg_mr: %s\n", prog, strerror(errno));
		return 1;
	}
	printf("%s: %s (%s): max_qp_wr %d, max_sge %d, max_sge_rd %d\n", prog,
	       ibv_get_device_name(ctx->device), is_vt3 ? "vt3" : "not vt3: generic checks only",
	       dev_attr.max_qp_wr, dev_attr.max_sge, dev_attr.max_sge_rd);

	for (i = 0; i < NUM_CHECKS; i++) {
		const struct check *c = &checks[i];
		struct env e = {};
		bool ok;

		if (!selected(only, c->name))
			continue;
		if (c->vt3_only && !is_vt3 && !all) {
			printf("skip %-18s %s\n", c->name, c->vt3_only);
			skipped++;
			continue;
		}
		fail_msg[0] = 0;
		ok = c->fn(&e);
		free_env(&e);
		if (ok) {
			printf("ok   %-18s %s\n", c->name, c->what);
			passed++;
		} else {
			printf("FAIL %-18s %s\n     %s\n", c->name, c->what, fail_msg);
			failed++;
		}
	}

	printf("%s: %s: %u passed, %u failed, %u skipped\n", prog,
	       ibv_get_device_name(ctx->device), passed, failed, skipped);
	ibv_dereg_mr(mr);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	free(buf);
	return failed ? 1 : 0;
}
