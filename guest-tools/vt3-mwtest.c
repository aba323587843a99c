// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
/*
 * vt3-mwtest: memory windows (docs/memory-windows.md) over real
 * connections. librdmacm + libibverbs.
 *
 *   vt3-mwtest owner [--port P] [--timeout S] [-v]
 *   vt3-mwtest peer --server IP [--port P] [--timeout S] [-v]
 *
 * The owner (the device under test: it binds the windows) listens; the
 * peer (any iWARP device: it only WRITEs, READs and sends with
 * invalidate) connects once per scenario, since a refused access ends
 * the connection. The peer sends first on each connection (an MPA
 * responder may not send before the initiator's first FPDU), then does
 * what the owner's commands (SENDs) say and answers each. One MR of 16 KiB
 * (LOCAL_WRITE | MW_BIND, no remote rights of its own) holds the windows:
 * [BUF + 4096, + 8192).
 *
 * Scenarios, and the checks of each side (owner: o, peer: p):
 *  type1         o: ibv_bind_mw of a type 1 window completes (IBV_WC_BIND_MW,
 *                   the rkey rotated); p: WRITE then READ through it, data
 *                   intact; o: the data is in the MR where the window is;
 *                   o: a zero-length bind unbinds it; p: a READ through it
 *                   fails: IBV_WC_WR_FLUSH_ERR and QP_ACCESS_ERR (vt3; siw,
 *                   which raises no event for a TERMINATE: any error), and
 *                   QP_ACCESS_ERR on the owner (it sent the TERMINATE)
 *  type2-local   o: IBV_WR_BIND_MW of a type 2 window; p: WRITE/READ;
 *                   o: IBV_WR_LOCAL_INV of it completes; p: READ fails, both
 *                   sides QP_ACCESS_ERR
 *  type2-remote  o: bind; p: WRITE/READ; p: SEND_WITH_INV of the rkey;
 *                   o: the receive has IBV_WC_WITH_INV and that rkey;
 *                   p: READ fails, both sides QP_ACCESS_ERR
 *  type1-remote  o: bind type 1; p: SEND_WITH_INV of it; o: the receive
 *                   completes with IBV_WC_REM_INV_REQ_ERR and QP_ACCESS_ERR
 *                   ("STag cannot be invalidated"); p: QP_ACCESS_ERR (vt3),
 *                   a receive flushed (siw)
 *  rules         o: ibv_dereg_mr of an MR with a bound window fails with
 *                   EBUSY, succeeds once the window is deallocated; a bind
 *                   over an MR without MW_BIND completes with
 *                   IBV_WC_MW_BIND_ERR and the QP goes to ERROR
 *                   (QP_REQ_ERR); an MW of type 3 is refused
 * One line per check ("ok   NAME" / "FAIL NAME: why"), then
 * "vt3-mwtest: N passed, N failed"; exit 1 on a failure.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <netdb.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#define VT3_CHECK_PROG "vt3-mwtest"
#include "vt3-check.h"

#define MAGIC		0x7674336du	/* "vt3m" */
#define BUF_SIZE	(16 << 10)
#define WIN_OFF		4096		/* the windows' range in the owner's MR */
#define WIN_LEN		8192
#define DATA_LEN	3000		/* what the peer WRITEs and READs back */
#define DATA_OFF	100		/* ... at this offset into the window */
#define MSG_OFF		(BUF_SIZE - 256)	/* control messages in BUF */
#define N_RECV		4

enum op { OP_HELLO = 1, OP_ACCESS, OP_READ_FAILS, OP_SEND_INV, OP_DONE, OP_ANSWER };

struct cmd {
	uint32_t magic;
	uint32_t op;
	uint32_t rkey;
	uint32_t ok;		/* OP_ANSWER */
	uint64_t addr;
};

static int timeout_s = 60;
static bool verbose;
/* The peer is a vt3 device: its statuses are checked exactly. */
static bool is_vt3;
static uint8_t pattern(uint32_t i)
{
	return (uint8_t)(i * 13 + 7);
}

/*
 * One side's connection: its id, CQs and the buffer of its MR. Sends and
 * receives complete on CQs of their own: a SEND's completion may come
 * after the receive of the peer's answer to it (siw writes it from its TX
 * thread), and a shared CQ would hand the receive to the sender.
 */
struct side {
	struct rdma_event_channel *ch;
	struct rdma_cm_id *listen, *id;
	struct ibv_pd *pd;
	struct ibv_cq *scq, *rcq;
	struct ibv_mr *mr;
	uint8_t *buf;
};

static struct rdma_cm_event *cm_wait(struct side *s, enum rdma_cm_event_type want)
{
	struct pollfd p = { .fd = s->ch->fd, .events = POLLIN };
	struct rdma_cm_event *ev;

	if (poll(&p, 1, timeout_s * 1000) != 1) {
		errno = ETIMEDOUT;
		return NULL;
	}
	if (rdma_get_cm_event(s->ch, &ev))
		return NULL;
	if (ev->event != want) {
		printf("cm: %s (status %d), wanted %s\n", rdma_event_str(ev->event),
		       ev->status, rdma_event_str(want));
		rdma_ack_cm_event(ev);
		errno = EPROTO;
		return NULL;
	}
	return ev;
}

static int make_qp(struct side *s, struct rdma_cm_id *id)
{
	struct ibv_qp_init_attr attr = {
		.send_cq = s->scq, .recv_cq = s->rcq,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};

	return rdma_create_qp(id, s->pd, &attr);
}

static int post_recv(struct side *s, uint64_t wr_id)
{
	struct ibv_sge sge = { (uintptr_t)(s->buf + MSG_OFF + 64 + 32 * (wr_id % N_RECV)),
			       sizeof(struct cmd), s->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1 }, *bad;

	return ibv_post_recv(s->id->qp, &wr, &bad);
}

/* The next completion on @cq within the timeout: 1, or 0 (none). */
static int next_wc(struct ibv_cq *cq, struct ibv_wc *wc)
{
	double end = now() + timeout_s;
	int n;

	while (now() < end) {
		n = ibv_poll_cq(cq, 1, wc);
		if (n)
			return n == 1;
		usleep(500);
	}
	return 0;
}

/* The next async event of the QP within @secs (others are acked and said). */
static bool qp_event(struct side *s, enum ibv_event_type want, double secs)
{
	struct pollfd p = { .fd = s->id->verbs->async_fd, .events = POLLIN };
	struct ibv_async_event ev;
	double end = now() + secs;
	bool found = false;
	int flags = fcntl(p.fd, F_GETFL);

	fcntl(p.fd, F_SETFL, flags | O_NONBLOCK);
	while (!found && now() < end) {
		if (poll(&p, 1, 100) != 1)
			continue;
		if (ibv_get_async_event(s->id->verbs, &ev))
			continue;
		found = ev.event_type == want && ev.element.qp == s->id->qp;
		if (verbose || !found)
			printf("async event: %s\n", ibv_event_type_str(ev.event_type));
		ibv_ack_async_event(&ev);
	}
	return found;
}

static int send_cmd(struct side *s, uint32_t op, uint32_t rkey, uint64_t addr, uint32_t ok,
		    uint32_t invalidate)
{
	struct cmd *c = (struct cmd *)(s->buf + MSG_OFF);
	struct ibv_sge sge = { (uintptr_t)c, sizeof(*c), s->mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 0xc0, .sg_list = &sge, .num_sge = 1,
				  .opcode = invalidate ? IBV_WR_SEND_WITH_INV : IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;
	struct ibv_wc wc;

	*c = (struct cmd){ MAGIC, op, rkey, ok, addr };
	wr.invalidate_rkey = invalidate;
	/*
	 * libsiw (rdma-core 55) sends wr.rdma.rkey as the STag to invalidate,
	 * not invalidate_rkey: give it both (a SEND uses neither otherwise).
	 */
	wr.wr.rdma.rkey = invalidate;
	if (ibv_post_send(s->id->qp, &wr, &bad))
		return -1;
	if (!next_wc(s->scq, &wc) || wc.status != IBV_WC_SUCCESS || wc.wr_id != 0xc0) {
		printf("send of command %u: %s\n", op, ibv_wc_status_str(wc.status));
		return -1;
	}
	return 0;
}

/* The next command received (its completion in *wc), or NULL. */
static const struct cmd *recv_cmd(struct side *s, struct ibv_wc *wc)
{
	const struct cmd *c;

	if (!next_wc(s->rcq, wc) || wc->opcode != IBV_WC_RECV)
		return NULL;
	c = (const struct cmd *)(s->buf + MSG_OFF + 64 + 32 * (wc->wr_id % N_RECV));
	if (wc->status != IBV_WC_SUCCESS || c->magic != MAGIC)
		return NULL;
	post_recv(s, wc->wr_id);
	return c;
}

/* ---------------------------------------------------------------- owner */

static struct ibv_mw *mw1, *mw2;

/* A bind's completion: status @want with IBV_WC_BIND_MW. */
static bool bind_done(struct side *s, enum ibv_wc_status want, const char *name)
{
	struct ibv_wc wc;

	if (!next_wc(s->scq, &wc)) {
		check(false, name, "no completion");
		return false;
	}
	check(wc.status == want && wc.opcode == IBV_WC_BIND_MW && wc.wr_id == 0xb1, name,
	      "wr_id %#" PRIx64 " opcode %d status %s, want BIND_MW %s", wc.wr_id, wc.opcode,
	      ibv_wc_status_str(wc.status), ibv_wc_status_str(want));
	return wc.status == want;
}

static bool bind_type1(struct side *s, uint64_t length, const char *name)
{
	struct ibv_mw_bind bind = {
		.wr_id = 0xb1, .send_flags = IBV_SEND_SIGNALED,
		.bind_info = { .mr = length ? s->mr : NULL, .addr = length ? (uintptr_t)s->buf + WIN_OFF : 0,
			       .length = length,
			       .mw_access_flags = length ? IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ : 0 },
	};
	uint32_t before = mw1->rkey;
	int ret = ibv_bind_mw(s->id->qp, mw1, &bind);

	if (ret) {
		check(false, name, "ibv_bind_mw: %s", strerror(ret));
		return false;
	}
	if (mw1->rkey == before) {
		check(false, name, "the rkey did not rotate");
		return false;
	}
	return bind_done(s, IBV_WC_SUCCESS, name);
}

/* IBV_WR_BIND_MW of @mw over @mr (the window's range); returns the rkey or 0. */
static uint32_t bind_type2(struct side *s, struct ibv_mw *mw, struct ibv_mr *mr, enum ibv_wc_status want,
			   const char *name)
{
	struct ibv_send_wr wr = { .wr_id = 0xb1, .opcode = IBV_WR_BIND_MW, .send_flags = IBV_SEND_SIGNALED }, *bad;

	wr.bind_mw.mw = mw;
	wr.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
	wr.bind_mw.bind_info = (struct ibv_mw_bind_info){
		.mr = mr, .addr = (uintptr_t)mr->addr + WIN_OFF, .length = WIN_LEN,
		.mw_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_LOCAL_WRITE,
	};
	if (ibv_post_send(s->id->qp, &wr, &bad)) {
		check(false, name, "ibv_post_send(BIND_MW): %s", strerror(errno));
		return 0;
	}
	if (!bind_done(s, want, name))
		return 0;
	mw->rkey = wr.bind_mw.rkey;	/* what ibv_bind_mw does for type 1 */
	return wr.bind_mw.rkey;
}

/* The peer WRITEs and READs through @rkey; the data must be in our MR. */
static void owner_access(struct side *s, uint32_t rkey, const char *name)
{
	uint64_t addr = (uintptr_t)s->buf + WIN_OFF + DATA_OFF;
	struct ibv_wc wc;
	const struct cmd *c;
	uint32_t i, bad = 0;

	memset(s->buf + WIN_OFF, 0, WIN_LEN);
	if (send_cmd(s, OP_ACCESS, rkey, addr, 0, 0)) {
		check(false, name, "command not sent");
		return;
	}
	c = recv_cmd(s, &wc);
	for (i = 0; i < DATA_LEN; i++)
		bad += s->buf[WIN_OFF + DATA_OFF + i] != pattern(i);
	check(c && c->op == OP_ANSWER && c->ok && !bad, name,
	      "peer answered %s, %u octets differ in the MR", c ? (c->ok ? "ok" : "failed") : "nothing", bad);
}

/* The peer READs through @rkey, which must fail: QP_ACCESS_ERR here. */
static void owner_read_fails(struct side *s, uint32_t rkey, const char *name)
{
	if (send_cmd(s, OP_READ_FAILS, rkey, (uintptr_t)s->buf + WIN_OFF, 0, 0)) {
		check(false, name, "command not sent");
		return;
	}
	check(qp_event(s, IBV_EVENT_QP_ACCESS_ERR, timeout_s), name, "no QP_ACCESS_ERR on the owner's QP");
}

static void owner_scenario(struct side *s, int n)
{
	struct ibv_send_wr inv = { .wr_id = 0x1e, .opcode = IBV_WR_LOCAL_INV, .send_flags = IBV_SEND_SIGNALED }, *bad;
	struct ibv_wc wc;
	const struct cmd *c;
	uint32_t rkey;

	switch (n) {
	case 0:
		if (!bind_type1(s, WIN_LEN, "type1-bind"))
			return;
		owner_access(s, mw1->rkey, "type1-access");
		if (!bind_type1(s, 0, "type1-unbind"))
			return;
		owner_read_fails(s, mw1->rkey, "type1-after-unbind");
		return;
	case 1:
		rkey = bind_type2(s, mw2, s->mr, IBV_WC_SUCCESS, "type2-bind");
		if (!rkey)
			return;
		owner_access(s, rkey, "type2-access");
		inv.invalidate_rkey = rkey;
		if (ibv_post_send(s->id->qp, &inv, &bad) || !next_wc(s->scq, &wc)) {
			check(false, "type2-local-inv", "LOCAL_INV not completed");
			return;
		}
		check(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_LOCAL_INV, "type2-local-inv",
		      "opcode %d status %s", wc.opcode, ibv_wc_status_str(wc.status));
		owner_read_fails(s, rkey, "type2-after-local-inv");
		return;
	case 2:
		rkey = bind_type2(s, mw2, s->mr, IBV_WC_SUCCESS, "type2-rebind");
		if (!rkey)
			return;
		owner_access(s, rkey, "type2-access-again");
		if (send_cmd(s, OP_SEND_INV, rkey, 0, 0, 0))
			return;
		c = recv_cmd(s, &wc);
		check(c && wc.wc_flags & IBV_WC_WITH_INV && wc.invalidated_rkey == rkey, "type2-remote-inv",
		      "status %s, flags %#x, invalidated %#x, want %#x", ibv_wc_status_str(wc.status),
		      wc.wc_flags, wc.invalidated_rkey, rkey);
		owner_read_fails(s, rkey, "type2-after-remote-inv");
		return;
	case 3:
		if (!bind_type1(s, WIN_LEN, "type1-rebind"))
			return;
		if (send_cmd(s, OP_SEND_INV, mw1->rkey, 0, 0, 0))
			return;
		check(next_wc(s->rcq, &wc) && wc.status == IBV_WC_REM_INV_REQ_ERR && wc.opcode == IBV_WC_RECV,
		      "type1-remote-inv-refused", "receive: status %s", ibv_wc_status_str(wc.status));
		check(qp_event(s, IBV_EVENT_QP_ACCESS_ERR, timeout_s), "type1-remote-inv-event",
		      "no QP_ACCESS_ERR on the owner's QP");
		return;
	default:
		break;
	}
	/* rules: an MR with a bound window stays; a bind without MW_BIND fails. */
	{
		struct ibv_mr *mr2 = ibv_reg_mr(s->pd, s->buf, BUF_SIZE, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
		struct ibv_mr *plain = ibv_reg_mr(s->pd, s->buf, BUF_SIZE, IBV_ACCESS_LOCAL_WRITE);
		struct ibv_mw *w = ibv_alloc_mw(s->pd, IBV_MW_TYPE_2);
		struct ibv_qp_attr attr;
		struct ibv_qp_init_attr init;
		int ret;

		if (!mr2 || !plain || !w)
			die("rules: ibv_reg_mr / ibv_alloc_mw");
		if (!bind_type2(s, w, mr2, IBV_WC_SUCCESS, "rules-bind"))
			return;
		ret = ibv_dereg_mr(mr2);
		check(ret == EBUSY, "rules-dereg-busy", "ibv_dereg_mr with a bound window: %d (%s), want EBUSY",
		      ret, strerror(ret));
		check(ibv_dealloc_mw(w) == 0 && (ret != EBUSY || ibv_dereg_mr(mr2) == 0), "rules-dealloc-dereg",
		      "ibv_dealloc_mw, then ibv_dereg_mr failed");
		errno = 0;
		w = ibv_alloc_mw(s->pd, 3);
		check(!w && errno, "rules-type3", "ibv_alloc_mw(type 3) %s", w ? "succeeded" : "failed without errno");
		/* Last: the QP goes to ERROR, and the peer's receives flush. */
		w = ibv_alloc_mw(s->pd, IBV_MW_TYPE_2);
		if (!w)
			die("ibv_alloc_mw");
		bind_type2(s, w, plain, IBV_WC_MW_BIND_ERR, "rules-bind-err");
		check(qp_event(s, IBV_EVENT_QP_REQ_ERR, timeout_s), "rules-bind-err-event", "no QP_REQ_ERR");
		/*
		 * vt3d's QP passes through TERMINATE (reported as SQE) while its
		 * TERMINATE goes out and the connection ends, which a siw peer
		 * takes its time over: ERR within the timeout.
		 */
		for (int i = 0; i < timeout_s * 10; i++) {
			memset(&attr, 0, sizeof(attr));
			ret = ibv_query_qp(s->id->qp, &attr, IBV_QP_STATE, &init);
			if (ret || attr.qp_state == IBV_QPS_ERR)
				break;
			usleep(100000);
		}
		check(!ret && attr.qp_state == IBV_QPS_ERR, "rules-bind-err-qp",
		      "ibv_query_qp: %d (%s), QP state %d, want ERR", ret, strerror(ret), attr.qp_state);
		ibv_dealloc_mw(w);
		ibv_dereg_mr(plain);
	}
}

#define SCENARIOS 5

static void owner(const char *port)
{
	struct rdma_cm_event *pending = NULL;
	struct side s = {};
	struct addrinfo *ai;
	struct rdma_cm_event *ev;
	int n;

	s.ch = rdma_create_event_channel();
	if (!s.ch || rdma_create_id(s.ch, &s.listen, NULL, RDMA_PS_TCP))
		die("rdma_create_id");
	if (getaddrinfo(NULL, port, &(struct addrinfo){ .ai_flags = AI_PASSIVE, .ai_family = AF_INET }, &ai) ||
	    rdma_bind_addr(s.listen, ai->ai_addr) || rdma_listen(s.listen, 4))
		die("rdma_listen");
	freeaddrinfo(ai);
	printf("listening on port %s\n", port);
	fflush(stdout);
	for (n = 0; n < SCENARIOS; n++) {
		/* The peer may ask for the next connection while we drain the last. */
		ev = pending ? pending : cm_wait(&s, RDMA_CM_EVENT_CONNECT_REQUEST);
		pending = NULL;
		if (!ev)
			die("connect request");
		s.id = ev->id;
		rdma_ack_cm_event(ev);
		if (!s.pd) {
			s.pd = ibv_alloc_pd(s.id->verbs);
			s.scq = s.pd ? ibv_create_cq(s.id->verbs, 32, NULL, NULL, 0) : NULL;
			s.rcq = s.scq ? ibv_create_cq(s.id->verbs, 32, NULL, NULL, 0) : NULL;
			s.buf = s.rcq ? aligned_alloc(4096, BUF_SIZE) : NULL;
			s.mr = s.buf ? ibv_reg_mr(s.pd, s.buf, BUF_SIZE,
						  IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND) : NULL;
			mw1 = s.mr ? ibv_alloc_mw(s.pd, IBV_MW_TYPE_1) : NULL;
			mw2 = mw1 ? ibv_alloc_mw(s.pd, IBV_MW_TYPE_2) : NULL;
			if (!mw2)
				die("PD, CQ, MR (MW_BIND) and windows");
		}
		if (make_qp(&s, s.id))
			die("rdma_create_qp");
		for (int i = 0; i < N_RECV; i++)
			post_recv(&s, i);
		if (rdma_accept(s.id, &(struct rdma_conn_param){ .responder_resources = 1, .initiator_depth = 1 }))
			die("rdma_accept");
		ev = cm_wait(&s, RDMA_CM_EVENT_ESTABLISHED);
		if (!ev)
			die("established");
		rdma_ack_cm_event(ev);
		{
			struct ibv_wc wc;
			const struct cmd *hello = recv_cmd(&s, &wc);

			if (!hello || hello->op != OP_HELLO)
				die("the peer's hello");
		}
		owner_scenario(&s, n);
		rdma_disconnect(s.id);
		rdma_destroy_qp(s.id);
		rdma_destroy_id(s.id);
		/* Whatever the CM says now (DISCONNECTED, TIMEWAIT_EXIT) is of the old id. */
		{
			struct pollfd p = { .fd = s.ch->fd, .events = POLLIN };

			while (poll(&p, 1, 200) == 1 && !rdma_get_cm_event(s.ch, &ev)) {
				if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST) {
					pending = ev;
					break;
				}
				rdma_ack_cm_event(ev);
			}
		}
		/* Completions of the old QP (flushed receives) are not the next one's. */
		{
			struct ibv_wc wc[8];

			while (ibv_poll_cq(s.scq, 8, wc) > 0 || ibv_poll_cq(s.rcq, 8, wc) > 0)
				;
		}
	}
	if (ibv_dealloc_mw(mw1) || ibv_dealloc_mw(mw2) || ibv_dereg_mr(s.mr))
		check(false, "cleanup", "ibv_dealloc_mw / ibv_dereg_mr failed");
	ibv_destroy_cq(s.rcq);
	ibv_destroy_cq(s.scq);
	ibv_dealloc_pd(s.pd);
}

/* ---------------------------------------------------------------- peer */

static int peer_rdma(struct side *s, enum ibv_wr_opcode op, uint32_t rkey, uint64_t addr, uint32_t off,
		     struct ibv_wc *wc)
{
	struct ibv_sge sge = { (uintptr_t)s->buf + off, DATA_LEN, s->mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 0xd0 + op, .sg_list = &sge, .num_sge = 1, .opcode = op,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;

	wr.wr.rdma.rkey = rkey;
	wr.wr.rdma.remote_addr = addr;
	if (ibv_post_send(s->id->qp, &wr, &bad))
		return -1;
	return next_wc(s->scq, wc) ? 0 : -1;
}

/* One scenario's connection: commands until DONE or the connection ends. */
static void peer_scenario(struct side *s, int n)
{
	static const char *const fails[] = { "type1-peer-read-fails", "type2-local-peer-read-fails",
					     "type2-remote-peer-read-fails", "type1-remote-inv-peer" };
	const struct cmd *c;
	struct ibv_wc wc;
	uint32_t i, bad;

	if (send_cmd(s, OP_HELLO, 0, 0, 0, 0))
		die("hello");
	while ((c = recv_cmd(s, &wc))) {
		struct cmd cmd = *c;

		switch (cmd.op) {
		case OP_ACCESS:
			for (i = 0; i < DATA_LEN; i++)
				s->buf[i] = pattern(i);
			memset(s->buf + 4096, 0, DATA_LEN);
			bad = peer_rdma(s, IBV_WR_RDMA_WRITE, cmd.rkey, cmd.addr, 0, &wc) || wc.status;
			bad |= peer_rdma(s, IBV_WR_RDMA_READ, cmd.rkey, cmd.addr, 4096, &wc) || wc.status;
			bad |= memcmp(s->buf, s->buf + 4096, DATA_LEN) != 0;
			check(!bad, "peer-access", "WRITE/READ through %#x: %s", cmd.rkey, ibv_wc_status_str(wc.status));
			if (send_cmd(s, OP_ANSWER, 0, 0, !bad, 0))
				return;
			break;
		case OP_READ_FAILS:
			/*
			 * The owner refuses the READ with a TERMINATE: vt3 flushes
			 * the READ (the device writes no CQE after the error);
			 * another device may complete it with its own error.
			 */
			wc.status = IBV_WC_SUCCESS;
			peer_rdma(s, IBV_WR_RDMA_READ, cmd.rkey, cmd.addr, 4096, &wc);
			check(is_vt3 ? wc.status == IBV_WC_WR_FLUSH_ERR &&
					       qp_event(s, IBV_EVENT_QP_ACCESS_ERR, timeout_s) :
				       wc.status != IBV_WC_SUCCESS,
			      fails[n], "READ through %#x: %s; or no QP_ACCESS_ERR", cmd.rkey,
			      ibv_wc_status_str(wc.status));
			if (verbose)
				printf("peer: READ through %#x: %s\n", cmd.rkey, ibv_wc_status_str(wc.status));
			return;
		case OP_SEND_INV:
			if (send_cmd(s, OP_ANSWER, 0, 0, 1, cmd.rkey))
				return;
			if (n == 3 && is_vt3) {
				check(qp_event(s, IBV_EVENT_QP_ACCESS_ERR, timeout_s), fails[n],
				      "no QP_ACCESS_ERR after the refused invalidation");
				return;
			}
			if (n == 3) {
				/* siw raises no event for a TERMINATE: its receives flush. */
				check(next_wc(s->rcq, &wc) && wc.status == IBV_WC_WR_FLUSH_ERR, fails[n],
				      "no receive flushed after the refused invalidation: %s",
				      ibv_wc_status_str(wc.status));
				return;
			}
			break;
		case OP_DONE:
			return;
		default:
			printf("peer: unknown command %u\n", cmd.op);
			return;
		}
	}
}

static void peer(const char *server, const char *port)
{
	struct side s = {};
	struct rdma_cm_event *ev;
	struct addrinfo *ai;
	int n;

	s.ch = rdma_create_event_channel();
	if (!s.ch || getaddrinfo(server, port, &(struct addrinfo){ .ai_family = AF_INET }, &ai))
		die("peer: address");
	for (n = 0; n < SCENARIOS; n++) {
		if (rdma_create_id(s.ch, &s.id, NULL, RDMA_PS_TCP) ||
		    rdma_resolve_addr(s.id, NULL, ai->ai_addr, 2000))
			die("rdma_resolve_addr");
		ev = cm_wait(&s, RDMA_CM_EVENT_ADDR_RESOLVED);
		if (!ev)
			die("address resolved");
		rdma_ack_cm_event(ev);
		if (rdma_resolve_route(s.id, 2000) || !(ev = cm_wait(&s, RDMA_CM_EVENT_ROUTE_RESOLVED)))
			die("route resolved");
		rdma_ack_cm_event(ev);
		if (!s.pd) {
			s.pd = ibv_alloc_pd(s.id->verbs);
			s.scq = s.pd ? ibv_create_cq(s.id->verbs, 32, NULL, NULL, 0) : NULL;
			s.rcq = s.scq ? ibv_create_cq(s.id->verbs, 32, NULL, NULL, 0) : NULL;
			s.buf = s.rcq ? aligned_alloc(4096, BUF_SIZE) : NULL;
			s.mr = s.buf ? ibv_reg_mr(s.pd, s.buf, BUF_SIZE, IBV_ACCESS_LOCAL_WRITE) : NULL;
			if (!s.mr)
				die("PD, CQ, MR");
			is_vt3 = !strncmp(ibv_get_device_name(s.id->verbs->device), "vt3", 3);
		}
		if (make_qp(&s, s.id))
			die("rdma_create_qp");
		for (int i = 0; i < N_RECV; i++)
			post_recv(&s, i);
		if (rdma_connect(s.id, &(struct rdma_conn_param){ .responder_resources = 1, .initiator_depth = 1 }))
			die("rdma_connect");
		ev = cm_wait(&s, RDMA_CM_EVENT_ESTABLISHED);
		if (!ev)
			die("established");
		rdma_ack_cm_event(ev);
		peer_scenario(&s, n);
		rdma_disconnect(s.id);
		rdma_destroy_qp(s.id);
		rdma_destroy_id(s.id);
		{
			struct ibv_wc wc[8];
			struct pollfd p = { .fd = s.ch->fd, .events = POLLIN };

			while (poll(&p, 1, 200) == 1 && !rdma_get_cm_event(s.ch, &ev))
				rdma_ack_cm_event(ev);
			while (ibv_poll_cq(s.scq, 8, wc) > 0 || ibv_poll_cq(s.rcq, 8, wc) > 0)
				;
		}
	}
	freeaddrinfo(ai);
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "server", required_argument, NULL, 's' },
		{ "port", required_argument, NULL, 'p' },
		{ "timeout", required_argument, NULL, 't' },
		{ "verbose", no_argument, NULL, 'v' },
		{}
	};
	const char *server = NULL, *port = "7481";
	int c;

	while ((c = getopt_long(argc, argv, "s:p:t:v", opts, NULL)) != -1) {
		switch (c) {
		case 's': server = optarg; break;
		case 'p': port = optarg; break;
		case 't': timeout_s = atoi(optarg); break;
		case 'v': verbose = true; break;
		default: goto usage;
		}
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (optind + 1 == argc && !strcmp(argv[optind], "owner"))
		owner(port);
	else if (optind + 1 == argc && !strcmp(argv[optind], "peer") && server)
		peer(server, port);
	else
		goto usage;
	return check_summary();
usage:
	fprintf(stderr, "usage: vt3-mwtest owner [--port P] [--timeout S] [-v]\n"
			"       vt3-mwtest peer --server IP [--port P] [--timeout S] [-v]\n");
	return 2;
}
