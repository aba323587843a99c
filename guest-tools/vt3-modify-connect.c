// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
/*
 * vt3-modify-connect: two RC QPs of one device connected by ibv_modify_qp
 * alone (RTR naming the other's QPN, then RTS: no CM), as rdma-core's
 * tests/ and ibv_rc_pingpong connect them; vt3's extension for that
 * (docs/modify-connect.md). libibverbs only.
 *
 *   vt3-modify-connect [--dev NAME] [--timeout S]
 *
 * Each QP has a user context, PD, CQ and buffer of its own (as the suite's
 * resources have). Checks, in order:
 *  new-init     a new QP reports INIT (an RNIC's IDLE QP)
 *  refuse-self  RTR naming the QP itself: EINVAL
 *  refuse-qpn   RTR naming no QP of the device: EINVAL
 *  refuse-gid   RTR with a dgid other than the device's GID: ENETUNREACH
 *  refuse-rts   IB_QP_DEST_QPN on a move to RTS: EINVAL
 *  refuse-alone RTS after an RTR that named no peer: EINVAL
 *  wait         a SEND posted on RTS before the peer named it back
 *               neither completes nor fails
 *  pair         the peer's RTR (no GRH this time) and RTS: the waiting
 *               SEND arrives, intact; both QPs query RTS
 *  send-back    a SEND the other way
 *  write, read  RDMA WRITE into the peer's buffer, READ it back, checked
 *  destroy      destroying one QP: the other gets IBV_EVENT_QP_FATAL
 *               exactly once, its posted RECV completes exactly once with
 *               IBV_WC_WR_FLUSH_ERR, and it queries ERR
 *  to-err       a pair's QP moved to ERR: the same for its peer
 *  pending      a pair's QP destroyed right after the RTS that paired it
 *               (its connection may not be up yet): the same for its peer
 * One line per check ("ok   NAME" / "FAIL NAME: why"), then
 * "vt3-modify-connect: N passed, N failed"; exit 1 on a failure.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <poll.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#define VT3_CHECK_PROG "vt3-modify-connect"
#include "vt3-check.h"

#define BUF_SIZE	8192
#define MSG_LEN		100
#define CQ_DEPTH	64
#define PORT		1
#define VT3_PAIR_PORT	PORT
#include "vt3-modify-pair.h"

/* Unsent: how long a SEND must stay pending to count as waiting. */
#define WAIT_MS		300
/* After an async event: how long a second one is waited for. */
#define QUIET_MS	500

/* One QP and what it needs, in a user context of its own. */
struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	struct ibv_qp *qp;
	char *buf;
};

static const char *dev_name;
static int timeout_s = 30;
static long long now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
}

static void side_qp(struct side *s)
{
	struct ibv_qp_init_attr attr = {
		.send_cq = s->cq,
		.recv_cq = s->cq,
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16,
			 .max_send_sge = 1, .max_recv_sge = 1 },
	};

	s->qp = ibv_create_qp(s->pd, &attr);
	if (!s->qp)
		die("ibv_create_qp");
}

static void side_open(struct side *s)
{
	s->ctx = open_device(dev_name);
	s->pd = ibv_alloc_pd(s->ctx);
	s->cq = s->pd ? ibv_create_cq(s->ctx, CQ_DEPTH, NULL, NULL, 0) : NULL;
	s->buf = calloc(1, BUF_SIZE);
	if (!s->cq || !s->buf)
		die("PD/CQ/buffer");
	s->mr = ibv_reg_mr(s->pd, s->buf, BUF_SIZE, IBV_ACCESS_LOCAL_WRITE |
			   IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	if (!s->mr)
		die("ibv_reg_mr");
	/* Events are waited for with poll(). */
	if (fcntl(s->ctx->async_fd, F_SETFL,
		  fcntl(s->ctx->async_fd, F_GETFL) | O_NONBLOCK))
		die("O_NONBLOCK");
	side_qp(s);
}

static void side_close(struct side *s)
{
	if (s->qp)
		ibv_destroy_qp(s->qp);
	ibv_dereg_mr(s->mr);
	ibv_destroy_cq(s->cq);
	ibv_dealloc_pd(s->pd);
	ibv_close_device(s->ctx);
	free(s->buf);
}

static int to_state(struct ibv_qp *qp, enum ibv_qp_state state)
{
	struct ibv_qp_attr a = { .qp_state = state };

	return ibv_modify_qp(qp, &a, IBV_QP_STATE);
}

static int qp_state(struct ibv_qp *qp)
{
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr init;

	if (ibv_query_qp(qp, &a, IBV_QP_STATE, &init))
		return -errno;
	return a.qp_state;
}

/* A refusal is the errno ibv_modify_qp returns (it sets errno too). */
static void check_refused(int rc, int want, const char *name)
{
	check(rc == want, name, "ibv_modify_qp returned %d (%s), want %d (%s)",
	      rc, strerror(rc), want, strerror(want));
}

static int post_send(struct side *s, enum ibv_wr_opcode op, uint64_t wr_id,
		     uint32_t offset, uint32_t len, const struct side *peer,
		     uint32_t remote_offset)
{
	struct ibv_sge sge = { .addr = (uintptr_t)s->buf + offset,
			       .length = len, .lkey = s->mr->lkey };
	struct ibv_send_wr wr = { .wr_id = wr_id, .sg_list = &sge,
				  .num_sge = 1, .opcode = op,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;

	if (peer) {
		wr.wr.rdma.remote_addr = (uintptr_t)peer->buf + remote_offset;
		wr.wr.rdma.rkey = peer->mr->rkey;
	}
	return ibv_post_send(s->qp, &wr, &bad);
}

static int post_recv(struct side *s, uint64_t wr_id, uint32_t offset)
{
	struct ibv_sge sge = { .addr = (uintptr_t)s->buf + offset,
			       .length = MSG_LEN, .lkey = s->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = wr_id, .sg_list = &sge,
				  .num_sge = 1 }, *bad;

	return ibv_post_recv(s->qp, &wr, &bad);
}

/*
 * Polls @s's CQ for up to @ms for one completion; 1 with *@wc filled, 0
 * if none came.
 */
static int poll_one(struct side *s, struct ibv_wc *wc, int ms)
{
	long long end = now_ms() + ms;
	int n;

	do {
		n = ibv_poll_cq(s->cq, 1, wc);
		if (n)
			return n < 0 ? 0 : 1;
		usleep(1000);
	} while (now_ms() < end);
	return 0;
}

static bool completes(struct side *s, uint64_t wr_id, enum ibv_wc_opcode op,
		      uint32_t len, const char *name)
{
	struct ibv_wc wc;

	if (!poll_one(s, &wc, timeout_s * 1000)) {
		check(false, name, "no completion of WR %llu in %d s",
		      (unsigned long long)wr_id, timeout_s);
		return false;
	}
	if (wc.wr_id != wr_id || wc.status != IBV_WC_SUCCESS ||
	    wc.opcode != op || (op & IBV_WC_RECV && wc.byte_len != len)) {
		check(false, name, "WR %llu: %s, opcode %d, %u bytes (want WR %llu, success, opcode %d, %u bytes)",
		      (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status),
		      wc.opcode, wc.byte_len, (unsigned long long)wr_id, op, len);
		return false;
	}
	return true;
}

/* Async events of @s's context for @ms: how many were QP_FATAL of its QP. */
static int fatal_events(struct side *s, int ms)
{
	struct pollfd pfd = { .fd = s->ctx->async_fd, .events = POLLIN };
	long long end = now_ms() + ms;
	struct ibv_async_event ev;
	int fatal = 0, left;

	while ((left = end - now_ms()) > 0) {
		if (poll(&pfd, 1, left) <= 0)
			continue;
		while (!ibv_get_async_event(s->ctx, &ev)) {
			if (ev.event_type == IBV_EVENT_QP_FATAL &&
			    ev.element.qp == s->qp)
				fatal++;
			else
				printf("     (event %s)\n",
				       ibv_event_type_str(ev.event_type));
			ibv_ack_async_event(&ev);
			/* The first one came: from now on only a second counts. */
			end = now_ms() + QUIET_MS;
		}
	}
	return fatal;
}

/*
 * The peer of @s went away with a RECV of @s posted (WR 900): QP_FATAL
 * exactly once, that RECV flushed exactly once, the QP in ERR.
 */
static void check_survivor(struct side *s, const char *name)
{
	int fatal = fatal_events(s, timeout_s * 1000);
	struct ibv_wc wc;
	int flushed = 0, other = 0, state;

	while (poll_one(s, &wc, QUIET_MS)) {
		if (wc.wr_id == 900 && wc.status == IBV_WC_WR_FLUSH_ERR)
			flushed++;
		else
			other++;
	}
	state = qp_state(s->qp);
	check(fatal == 1 && flushed == 1 && !other && state == IBV_QPS_ERR,
	      name, "%d QP_FATAL, RECV flushed %d times, %d other completions, QP state %d (want 1, 1, 0, ERR)",
	      fatal, flushed, other, state);
}

/* Both QPs to RTS, naming each other; @a first, with a GRH, @b without. */
static bool pair_up(struct side *a, struct side *b, const union ibv_gid *gid)
{
	return !to_init(a->qp) && !to_init(b->qp) &&
	       !to_rtr(a->qp, b->qp->qp_num, gid) && !to_rts(a->qp) &&
	       !to_rtr(b->qp, a->qp->qp_num, NULL) && !to_rts(b->qp);
}

static void refusals(struct side *a, struct side *b, const union ibv_gid *gid)
{
	union ibv_gid other = *gid;

	if (to_init(a->qp))
		die("INIT");
	check_refused(to_rtr(a->qp, a->qp->qp_num, gid), EINVAL, "refuse-self");
	check_refused(to_rtr(a->qp, 0xfff0f0, gid), EINVAL, "refuse-qpn");
	other.raw[5] ^= 0x80;
	check_refused(to_rtr(a->qp, b->qp->qp_num, &other), ENETUNREACH,
		      "refuse-gid");
	{
		struct ibv_qp_attr at = { .qp_state = IBV_QPS_RTS,
					  .dest_qp_num = b->qp->qp_num };

		check_refused(ibv_modify_qp(a->qp, &at, IBV_QP_STATE |
					    IBV_QP_DEST_QPN), EINVAL,
			      "refuse-rts");
	}
	{
		struct ibv_qp_attr at = { .qp_state = IBV_QPS_RTR };

		if (ibv_modify_qp(a->qp, &at, IBV_QP_STATE))
			die("plain RTR");
		check_refused(to_rts(a->qp), EINVAL, "refuse-alone");
	}
	/* Back to a fresh start for the pair. */
	if (to_state(a->qp, IBV_QPS_RESET))
		die("RESET");
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "dev", required_argument, NULL, 'd' },
		{ "timeout", required_argument, NULL, 't' },
		{}
	};
	struct side a = {}, b = {};
	union ibv_gid gid;
	struct ibv_wc wc;
	int c, state_a, state_b;

	while ((c = getopt_long(argc, argv, "d:t:", opts, NULL)) != -1) {
		switch (c) {
		case 'd':
			dev_name = optarg;
			break;
		case 't':
			timeout_s = atoi(optarg);
			break;
		default:
			fprintf(stderr, "usage: vt3-modify-connect [--dev NAME] [--timeout S]\n");
			return 2;
		}
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	side_open(&a);
	side_open(&b);
	if (ibv_query_gid(a.ctx, PORT, 0, &gid))
		die("ibv_query_gid");
	state_a = qp_state(a.qp);
	check(state_a == IBV_QPS_INIT, "new-init", "a new QP is in state %d",
	      state_a);
	refusals(&a, &b, &gid);

	/* a asks for b: its SEND waits for b to ask back. */
	memset(a.buf, 'a', MSG_LEN);
	if (to_init(a.qp) || to_init(b.qp) || post_recv(&b, 1, 0) ||
	    to_rtr(a.qp, b.qp->qp_num, &gid) || to_rts(a.qp))
		die("a: INIT, RTR, RTS");
	if (post_send(&a, IBV_WR_SEND, 2, 0, MSG_LEN, NULL, 0))
		die("a: post SEND");
	check(!poll_one(&a, &wc, WAIT_MS) && !poll_one(&b, &wc, 0), "wait",
	      "a completion before the peer named the QP back: WR %llu %s",
	      (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status));

	if (to_rtr(b.qp, a.qp->qp_num, NULL) || to_rts(b.qp))
		die("b: RTR, RTS");
	if (completes(&b, 1, IBV_WC_RECV, MSG_LEN, "pair") &&
	    completes(&a, 2, IBV_WC_SEND, MSG_LEN, "pair")) {
		state_a = qp_state(a.qp);
		state_b = qp_state(b.qp);
		check(!memcmp(a.buf, b.buf, MSG_LEN) && state_a == IBV_QPS_RTS &&
		      state_b == IBV_QPS_RTS, "pair",
		      "data %s, states %d %d", memcmp(a.buf, b.buf, MSG_LEN) ?
		      "differs" : "intact", state_a, state_b);
	}

	memset(b.buf + 512, 'b', MSG_LEN);
	if (post_recv(&a, 3, 512) ||
	    post_send(&b, IBV_WR_SEND, 4, 512, MSG_LEN, NULL, 0))
		die("post SEND b -> a");
	if (completes(&a, 3, IBV_WC_RECV, MSG_LEN, "send-back") &&
	    completes(&b, 4, IBV_WC_SEND, MSG_LEN, "send-back"))
		check(!memcmp(a.buf + 512, b.buf + 512, MSG_LEN), "send-back",
		      "data differs");

	for (c = 0; c < 4096; c++)
		a.buf[1024 + c] = (char)(c * 7 + 1);
	if (post_send(&a, IBV_WR_RDMA_WRITE, 5, 1024, 4096, &b, 4096))
		die("post WRITE");
	if (completes(&a, 5, IBV_WC_RDMA_WRITE, 0, "write"))
		check(!memcmp(a.buf + 1024, b.buf + 4096, 4096), "write",
		      "the peer's buffer differs");
	if (post_send(&a, IBV_WR_RDMA_READ, 6, 6144, 2048, &b, 4096))
		die("post READ");
	if (completes(&a, 6, IBV_WC_RDMA_READ, 0, "read"))
		check(!memcmp(a.buf + 6144, b.buf + 4096, 2048), "read",
		      "what was read differs");

	/* Teardown: a destroyed, b hears of it once. */
	if (post_recv(&b, 900, 0))
		die("post RECV 900");
	if (ibv_destroy_qp(a.qp))
		die("destroy a");
	a.qp = NULL;
	check_survivor(&b, "destroy");

	/* A fresh pair; the first moved to ERR. */
	ibv_destroy_qp(b.qp);
	side_qp(&a);
	side_qp(&b);
	if (!pair_up(&a, &b, &gid) || post_recv(&b, 900, 0) ||
	    post_send(&a, IBV_WR_SEND, 7, 0, MSG_LEN, NULL, 0))
		die("second pair");
	/* Up, once a's SEND arrived (in b's RECV 900). */
	if (completes(&b, 900, IBV_WC_RECV, MSG_LEN, "to-err") &&
	    !post_recv(&b, 900, 0) && !to_state(a.qp, IBV_QPS_ERR))
		check_survivor(&b, "to-err");
	ibv_destroy_qp(a.qp);
	ibv_destroy_qp(b.qp);

	/* A pair destroyed before its connection can come up. */
	side_qp(&a);
	side_qp(&b);
	if (!pair_up(&b, &a, &gid) || post_recv(&b, 900, 0))
		die("third pair");
	if (ibv_destroy_qp(a.qp))
		die("destroy a (pending)");
	a.qp = NULL;
	check_survivor(&b, "pending");

	side_close(&a);
	side_close(&b);
	return check_summary();
}
