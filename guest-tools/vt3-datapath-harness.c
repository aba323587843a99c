// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
/* vt3-datapath's harness: failing a check, resources, work requests and reaping completions. */
#include "vt3-datapath.h"

char fail_msg[512];

void failf(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(fail_msg, sizeof(fail_msg), fmt, ap);
	va_end(ap);
}

void info(const char *fmt, ...)
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


double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* An errno as the verbs return it; elsewhere siw's negative one too. */
bool is_errno(int ret, int want)
{
	return ret == want || (!is_vt3 && ret == -want);
}

const char *err_name(int ret)
{
	static char s[64];

	snprintf(s, sizeof(s), "%d (%s)", ret, ret ? strerror(ret < 0 ? -ret : ret) : "success");
	return s;
}

/* ------------------------------------------------------------------ */
/* Resources                                                           */

bool make_cq(struct env *e, int i, bool with_channel)
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
bool make_qp(struct env *e, int i, int scq, int rcq, bool sig_all)
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
bool make_env(struct env *e)
{
	TRY(make_cq(e, 0, false));
	return make_qp(e, 0, 0, 0, false);
}

void free_env(struct env *e)
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

const char *state_name(enum ibv_qp_state state)
{
	static const char *const names[] = {
		[IBV_QPS_RESET] = "RESET", [IBV_QPS_INIT] = "INIT",
		[IBV_QPS_RTR] = "RTR", [IBV_QPS_RTS] = "RTS",
		[IBV_QPS_SQD] = "SQD", [IBV_QPS_SQE] = "SQE",
		[IBV_QPS_ERR] = "ERR",
	};

	return state < sizeof(names) / sizeof(names[0]) ? names[state] : "?";
}

bool to_state(struct ibv_qp *qp, enum ibv_qp_state state)
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

void fill_sges(unsigned int slot, int n)
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

void recv_wr(struct ibv_recv_wr *wr, uint64_t id, int num_sge)
{
	fill_sges(id, num_sge);
	*wr = (struct ibv_recv_wr){
		.wr_id = id,
		.sg_list = sges[id % MAX_WC],
		.num_sge = num_sge,
	};
}

void send_wr(struct ibv_send_wr *wr, uint64_t id,
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

void chain_recv(struct ibv_recv_wr *wr, int n)
{
	int i;

	for (i = 0; i + 1 < n; i++)
		wr[i].next = &wr[i + 1];
}

void chain_send(struct ibv_send_wr *wr, int n)
{
	int i;

	for (i = 0; i + 1 < n; i++)
		wr[i].next = &wr[i + 1];
}

/* A post that must fail with @want (0: any error) at @want_bad. */
bool post_send_fails(struct ibv_qp *qp, struct ibv_send_wr *wr,
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

bool post_recv_fails(struct ibv_qp *qp, struct ibv_recv_wr *wr,
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

bool post_send_ok(struct ibv_qp *qp, struct ibv_send_wr *wr, const char *what)
{
	struct ibv_send_wr *bad = NULL;
	int ret = ibv_post_send(qp, wr, &bad);

	EXPECT(!ret, "%s: ibv_post_send: %s (bad_wr %p, first %p)", what,
	       err_name(ret), (void *)bad, (void *)wr);
	return true;
}

bool post_recv_ok(struct ibv_qp *qp, struct ibv_recv_wr *wr, const char *what)
{
	struct ibv_recv_wr *bad = NULL;
	int ret = ibv_post_recv(qp, wr, &bad);

	EXPECT(!ret, "%s: ibv_post_recv: %s (bad_wr %p, first %p)", what,
	       err_name(ret), (void *)bad, (void *)wr);
	return true;
}

/* ------------------------------------------------------------------ */
/* Completions                                                         */


/*
 * Polls @cq until @want completions came (then watches QUIET_MS more for
 * any that must not come) or WAIT_MS passed.
 */
bool reap(struct ibv_cq *cq, int want, struct reaped *r)
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

bool no_completions(struct ibv_cq *cq, const char *what)
{
	struct reaped r;

	TRY(reap(cq, 0, &r));
	EXPECT(r.n == 0, "%s: %d completion(s), the first wr_id %" PRIu64 " status %s",
	       what, r.n, r.wc[0].wr_id, ibv_wc_status_str(r.wc[0].status));
	return true;
}

/* The opcode a flushed WR of this kind reports (libvt3 fills it in). */
enum ibv_wc_opcode wc_opcode_of(enum ibv_wr_opcode op)
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
bool flushed_exactly(const struct reaped *r, struct ibv_qp *qp,
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
bool all_accounted(const struct reaped *r, int expected)
{
	EXPECT(r->n == expected, "%d completions, expected %d (an extra or a duplicate)",
	       r->n, expected);
	return true;
}

/* Waits for one event on the env's channel; acks it. */
bool wait_event(struct env *e, struct ibv_cq *want, int ms)
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
