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
#include "vt3-modify-pair.h"

#define MSG_LEN		100

/* Unsent: how long a SEND must stay pending to count as waiting. */
#define WAIT_MS		300
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

static bool completes(struct side *s, uint64_t wr_id, enum ibv_wc_opcode op,
		      uint32_t len, const char *name)
{
	struct ibv_wc wc;

	if (!poll_one(s->cq, &wc, timeout_s * 1000)) {
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

/*
 * The peer of @s went away with a RECV of @s posted (WR 900): QP_FATAL
 * exactly once, that RECV flushed exactly once, the QP in ERR.
 */
static void check_survivor(struct side *s, const char *name)
{
	int fatal = qp_events(s, IBV_EVENT_QP_FATAL, timeout_s * 1000);
	struct ibv_wc wc;
	int flushed = 0, other = 0, state;

	while (poll_one(s->cq, &wc, QUIET_MS)) {
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
	struct side a = {}, b = {};
	union ibv_gid gid;
	struct ibv_wc wc;
	int c, state_a, state_b;

	pair_options(argc, argv);
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
	check(!poll_one(a.cq, &wc, WAIT_MS) && !poll_one(b.cq, &wc, 0), "wait",
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
