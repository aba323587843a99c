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
#include "vt3-datapath.h"

const char *prog = "vt3-datapath";
bool verbose;

/* The device under test. */
struct ibv_context *ctx;
struct ibv_device_attr dev_attr;
struct ibv_pd *pd;
struct ibv_mr *mr;
char *buf;
bool is_vt3;

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
 * fenced, inline; unsignaled sends make no completion
 * (docs/architecture.md §5).
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
 * completions comes after ibv_destroy_qp() returned (docs/architecture.md §5;
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
