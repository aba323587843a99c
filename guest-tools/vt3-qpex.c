// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
/*
 * vt3-qpex: the extended verbs of libvt3 over a real connection: ibv_qp_ex
 * (ibv_wr_* posting), ibv_cq_ex (ibv_start_poll ... ibv_wc_read_*), parent
 * and thread domains, and an SRQ slot held by a completion its QP's
 * destroy discarded. librdmacm + libibverbs.
 *
 *   vt3-qpex --addr IP [--port P] [--timeout S] [-v]
 *
 * One process connects two QPs of one device to each other over rdma_cm
 * (the device's loopback, to IP, an address of the guest): the client QP,
 * created with ibv_create_qp_ex on a parent domain (a thread domain, and
 * allocators that count what libvt3 asks of them), posts with ibv_wr_*;
 * the server QP takes its receives from an SRQ on the same parent domain.
 * Both CQs are ibv_cq_ex and are polled with both APIs, alternately.
 *
 * Steps, each a check ("ok   NAME" / "FAIL NAME: why"):
 *  refuse-ops      create_qp_ex with an atomic, or SEND_WITH_IMM: EOPNOTSUPP
 *  refuse-wc       create_cq_ex with completion timestamps: EOPNOTSUPP
 *  empty           start_poll on an empty CQ: ENOENT
 *  allocators      the parent domain's alloc was asked for the client QP's
 *                  two shadows and the SRQ's slots, with vt3dv.h's types
 *  not-connected   a batch on a QP in RESET: wr_complete EINVAL
 *  batch           one batch, one wr_complete: SEND with one SGE, with 3,
 *                  inline, with an inline list, an unsignaled RDMA WRITE of
 *                  2 SGEs, an RDMA READ: exactly 5 send completions (wr_id,
 *                  opcode, status, qp_num) and 4 receives (wr_id, byte_len,
 *                  qp_num, src_qp 0, wc_flags 0), every byte intact
 *  mixed           16 SENDs in two batches, polled with ibv_poll_cq and
 *                  start/next/end_poll alternately: each wr_id exactly once
 *  abort           a batch of 2 SENDs aborted: nothing completes or
 *                  arrives; the next batch's one SEND alone does
 *  too-many-sges   a batch whose second SEND has max_send_sge + 1 SGEs:
 *                  wr_complete EINVAL, nothing of it posted
 *  inline-too-long a SEND of max_inline + 1 inline bytes: EINVAL, nothing
 *  read-inline     an RDMA READ flagged IBV_SEND_INLINE: EINVAL, nothing
 *  setter-first    a setter before any builder: EINVAL, nothing
 *  ring-full       a batch of more SENDs than the SQ holds: ENOMEM, nothing
 *  still-works     a batch after those: its SEND alone completes
 *  srq-arrived     the SRQ full, a SEND arrives (the armed server CQ's
 *                  event says so; nothing polled there)
 *  local-inv       ibv_wr_local_inv of an ordinary MR: vt3d refuses it,
 *                  once (IBV_WC_LOC_QP_OP_ERR, opcode IBV_WC_LOCAL_INV)
 *  srq-forget      the server QP destroyed with that receive unpolled: a
 *                  post to the full SRQ succeeds (the discarded completion
 *                  freed its slot)
 *  srq-full-again  the next post fails ENOMEM (full again); the destroyed
 *                  QP's completion never comes
 *  domain-free     every buffer the allocators gave is freed once, none
 *                  from the default allocator (IBV_ALLOCATOR_USE_DEFAULT)
 *  busy            the PD with a parent domain on it, the TD under the
 *                  parent domain: EBUSY; then all go
 * Then "vt3-qpex: N passed, N failed"; exit 1 on a failure.
 */
#include <errno.h>
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

#include <arpa/inet.h>
#include <netdb.h>

#define VT3_CHECK_PROG "vt3-qpex"
#include "vt3-check.h"

#include <infiniband/verbs.h>
#include <infiniband/vt3dv.h>
#include <rdma/rdma_cma.h>

#define MSG		256		/* bytes per message slot */
#define SLOTS		64		/* receive slots of the server's SRQ */
#define SQ_WR		32
#define CQ_DEPTH	256
#define RING_FULL_WRS	4096		/* more than any SQ vt3 makes */
#define WC_FLAGS	(IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM | \
			 IBV_WC_EX_WITH_QP_NUM | IBV_WC_EX_WITH_SRC_QP)
#define SEND_OPS	(IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_INV | \
			 IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_READ | \
			 IBV_QP_EX_WITH_LOCAL_INV)

static int timeout_s = 60;
static bool verbose;

/* ------------------------------------------------- the parent domain's allocator */

struct alloc_log {
	int qp_allocs, srq_asks, other;	/* calls of alloc, by type */
	int custom_live;		/* buffers we gave, not freed yet */
	int frees, bad_frees;		/* free calls; of buffers not ours */
	void *given[16];
};

static void *count_alloc(struct ibv_pd *pd, void *pd_context, size_t size,
			 size_t alignment, uint64_t type)
{
	struct alloc_log *log = pd_context;
	void *p;
	int i;

	(void)pd;
	if (type == VT3DV_RES_TYPE_SRQ) {
		/* The default allocator, asked for: libvt3 must not free it here. */
		log->srq_asks++;
		return IBV_ALLOCATOR_USE_DEFAULT;
	}
	if (type != VT3DV_RES_TYPE_QP) {
		log->other++;
		return NULL;
	}
	log->qp_allocs++;
	if (posix_memalign(&p, alignment < sizeof(void *) ? sizeof(void *) : alignment, size))
		return NULL;
	memset(p, 0, size);
	for (i = 0; i < 16; i++)
		if (!log->given[i]) {
			log->given[i] = p;
			break;
		}
	log->custom_live++;
	return p;
}

static void count_free(struct ibv_pd *pd, void *pd_context, void *ptr,
		       uint64_t type)
{
	struct alloc_log *log = pd_context;
	int i;

	(void)pd;
	(void)type;
	log->frees++;
	for (i = 0; i < 16; i++)
		if (log->given[i] == ptr) {
			log->given[i] = NULL;
			log->custom_live--;
			free(ptr);
			return;
		}
	log->bad_frees++;
}

/* -------------------------------------------------------------- the setup */

struct side {
	struct rdma_cm_id *id;
	struct ibv_qp *qp;
	struct ibv_qp_ex *qpx;		/* client only */
};

struct run {
	struct rdma_event_channel *ch;
	struct rdma_cm_id *listen;
	struct side client, server;
	struct ibv_context *ctx;
	struct ibv_pd *pd, *parent;
	struct ibv_td *td;
	struct alloc_log log;
	struct ibv_comp_channel *chan;
	struct ibv_cq_ex *ccq;		/* client: send and receive */
	struct ibv_cq_ex *scq;		/* server: send and receive, armed */
	struct ibv_srq *srq;
	uint32_t srq_max;
	int srq_posted;			/* SRQ WRs not yet completed */
	uint64_t next_recv;		/* wr_id of the next SRQ WR (1 up) */
	uint8_t *buf;			/* client: 16 slots, then server's SLOTS */
	struct ibv_mr *mr;
	struct ibv_qp_init_attr_ex cattr;	/* as created (caps granted) */
	bool poll_turn;			/* which API polls next */
};

#define CLIENT_SLOT(r, i)	((r)->buf + (size_t)(i) * MSG)
#define SERVER_SLOT(r, i)	((r)->buf + (size_t)(16 + (i)) * MSG)
#define TOTAL_SLOTS		(16 + SLOTS)

static struct rdma_cm_event *cm_next(struct run *r)
{
	struct pollfd p = { .fd = r->ch->fd, .events = POLLIN };
	struct rdma_cm_event *ev;

	if (poll(&p, 1, timeout_s * 1000) != 1) {
		errno = ETIMEDOUT;
		return NULL;
	}
	if (rdma_get_cm_event(r->ch, &ev))
		return NULL;
	if (verbose)
		printf("cm: %s (status %d)\n", rdma_event_str(ev->event), ev->status);
	return ev;
}

static void cm_expect(struct run *r, enum rdma_cm_event_type want)
{
	struct rdma_cm_event *ev = cm_next(r);

	if (!ev)
		die(rdma_event_str(want));
	if (ev->event != want) {
		printf("cm: %s (status %d), wanted %s\n", rdma_event_str(ev->event),
		       ev->status, rdma_event_str(want));
		errno = EPROTO;
		die(rdma_event_str(want));
	}
	rdma_ack_cm_event(ev);
}

static void post_srq(struct run *r, int n)
{
	int i;

	for (i = 0; i < n; i++) {
		uint64_t id = r->next_recv++;
		struct ibv_sge sge = {
			.addr = (uintptr_t)SERVER_SLOT(r, id % SLOTS),
			.length = MSG, .lkey = r->mr->lkey,
		};
		struct ibv_recv_wr wr = { .wr_id = id, .sg_list = &sge, .num_sge = 1 }, *bad;

		if (ibv_post_srq_recv(r->srq, &wr, &bad))
			die("ibv_post_srq_recv");
		r->srq_posted++;
	}
}

static void setup(struct run *r, const char *addr, const char *port)
{
	struct ibv_parent_domain_init_attr pda = {};
	struct ibv_td_init_attr tda = {};
	struct ibv_cq_init_attr_ex cqa = { .cqe = CQ_DEPTH, .wc_flags = WC_FLAGS };
	struct ibv_srq_init_attr sa = { .attr = { .max_wr = SLOTS, .max_sge = 1 } };
	struct ibv_srq_attr sq_attr;
	struct addrinfo *ai;

	r->ch = rdma_create_event_channel();
	if (!r->ch)
		die("rdma_create_event_channel");
	if (getaddrinfo(addr, port, NULL, &ai))
		die("getaddrinfo");
	if (rdma_create_id(r->ch, &r->listen, NULL, RDMA_PS_TCP) ||
	    rdma_bind_addr(r->listen, ai->ai_addr) || rdma_listen(r->listen, 2))
		die("listen");
	if (rdma_create_id(r->ch, &r->client.id, NULL, RDMA_PS_TCP) ||
	    rdma_resolve_addr(r->client.id, NULL, ai->ai_addr, 5000))
		die("rdma_resolve_addr");
	freeaddrinfo(ai);
	cm_expect(r, RDMA_CM_EVENT_ADDR_RESOLVED);
	if (rdma_resolve_route(r->client.id, 5000))
		die("rdma_resolve_route");
	cm_expect(r, RDMA_CM_EVENT_ROUTE_RESOLVED);
	r->ctx = r->client.id->verbs;

	r->pd = ibv_alloc_pd(r->ctx);
	r->td = ibv_alloc_td(r->ctx, &tda);
	if (!r->pd || !r->td)
		die("ibv_alloc_pd/td");
	pda.pd = r->pd;
	pda.td = r->td;
	pda.comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS |
			IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
	pda.alloc = count_alloc;
	pda.free = count_free;
	pda.pd_context = &r->log;
	r->parent = ibv_alloc_parent_domain(r->ctx, &pda);
	if (!r->parent)
		die("ibv_alloc_parent_domain");

	r->buf = aligned_alloc(4096, TOTAL_SLOTS * MSG);
	if (!r->buf)
		die("buffer");
	memset(r->buf, 0, TOTAL_SLOTS * MSG);
	/* Registered through the parent domain: the kernel sees its PD. */
	r->mr = ibv_reg_mr(r->parent, r->buf, TOTAL_SLOTS * MSG,
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			   IBV_ACCESS_REMOTE_READ);
	if (!r->mr)
		die("ibv_reg_mr");

	r->ccq = ibv_create_cq_ex(r->ctx, &cqa);
	if (!r->ccq)
		die("ibv_create_cq_ex (client)");
	r->chan = ibv_create_comp_channel(r->ctx);
	if (!r->chan)
		die("ibv_create_comp_channel");
	cqa.channel = r->chan;
	cqa.comp_mask = IBV_CQ_INIT_ATTR_MASK_PD;
	cqa.parent_domain = r->parent;
	r->scq = ibv_create_cq_ex(r->ctx, &cqa);
	if (!r->scq)
		die("ibv_create_cq_ex (server, on the parent domain)");

	sa.attr.max_wr = SLOTS;
	r->srq = ibv_create_srq(r->parent, &sa);
	if (!r->srq)
		die("ibv_create_srq");
	if (ibv_query_srq(r->srq, &sq_attr))
		die("ibv_query_srq");
	r->srq_max = sq_attr.max_wr;
	r->next_recv = 1;
	post_srq(r, 16);

	r->cattr = (struct ibv_qp_init_attr_ex){
		.send_cq = ibv_cq_ex_to_cq(r->ccq),
		.recv_cq = ibv_cq_ex_to_cq(r->ccq),
		.cap = { .max_send_wr = SQ_WR, .max_recv_wr = 1,
			 .max_send_sge = 4, .max_recv_sge = 1,
			 .max_inline_data = 64 },
		.qp_type = IBV_QPT_RC,
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.pd = r->parent,
		.send_ops_flags = SEND_OPS,
	};
	if (rdma_create_qp_ex(r->client.id, &r->cattr))
		die("rdma_create_qp_ex (client)");
	r->client.qp = r->client.id->qp;
	r->client.qpx = ibv_qp_to_qp_ex(r->client.qp);
	if (!r->client.qpx)
		die("ibv_qp_to_qp_ex");
	if (verbose)
		printf("client QP %u: max_send_sge %u max_inline %u; SRQ max_wr %u\n",
		       r->client.qp->qp_num, r->cattr.cap.max_send_sge,
		       r->cattr.cap.max_inline_data, r->srq_max);
}

static void connect_both(struct run *r)
{
	struct rdma_conn_param param = { .responder_resources = 1, .initiator_depth = 1 };
	struct rdma_cm_event *ev;
	int established = 0;

	if (rdma_connect(r->client.id, &param))
		die("rdma_connect");
	while (established < 2) {
		ev = cm_next(r);
		if (!ev)
			die("connection events");
		if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST) {
			struct ibv_qp_init_attr_ex sattr = {
				.send_cq = ibv_cq_ex_to_cq(r->scq),
				.recv_cq = ibv_cq_ex_to_cq(r->scq),
				.srq = r->srq,
				.cap = { .max_send_wr = 4, .max_send_sge = 1 },
				.qp_type = IBV_QPT_RC,
				.comp_mask = IBV_QP_INIT_ATTR_PD,
				.pd = r->parent,
			};

			r->server.id = ev->id;
			if (rdma_create_qp_ex(r->server.id, &sattr))
				die("rdma_create_qp_ex (server)");
			r->server.qp = r->server.id->qp;
			if (rdma_accept(r->server.id, &param))
				die("rdma_accept");
		} else if (ev->event == RDMA_CM_EVENT_ESTABLISHED) {
			established++;
		} else {
			printf("cm: %s (status %d) while connecting\n",
			       rdma_event_str(ev->event), ev->status);
			errno = EPROTO;
			die("connect");
		}
		rdma_ack_cm_event(ev);
	}
}

/* ---------------------------------------------------------------- polling */

struct wc {
	uint64_t wr_id;
	enum ibv_wc_status status;
	enum ibv_wc_opcode opcode;
	uint32_t byte_len, qp_num, src_qp, inv_rkey;
	unsigned int wc_flags;
};

/* Up to @max completions with ibv_start_poll/next_poll/end_poll. */
static int poll_ex(struct ibv_cq_ex *cq, int max, struct wc *out)
{
	struct ibv_poll_cq_attr attr = {};
	int n = 0, ret;

	ret = ibv_start_poll(cq, &attr);
	if (ret == ENOENT)
		return 0;
	if (ret)
		return -ret;
	do {
		out[n] = (struct wc){
			.wr_id = cq->wr_id,
			.status = cq->status,
			.opcode = ibv_wc_read_opcode(cq),
			.byte_len = ibv_wc_read_byte_len(cq),
			.qp_num = ibv_wc_read_qp_num(cq),
			.src_qp = ibv_wc_read_src_qp(cq),
			.wc_flags = ibv_wc_read_wc_flags(cq),
			.inv_rkey = ibv_wc_read_invalidated_rkey(cq),
		};
		n++;
	} while (n < max && !(ret = ibv_next_poll(cq)));
	ibv_end_poll(cq);
	return ret && ret != ENOENT ? -ret : n;
}

/* Up to @max completions with ibv_poll_cq. */
static int poll_legacy(struct ibv_cq_ex *cq, int max, struct wc *out)
{
	struct ibv_wc wc[8];
	int n, i;

	n = ibv_poll_cq(ibv_cq_ex_to_cq(cq), max < 8 ? max : 8, wc);
	for (i = 0; i < n; i++)
		out[i] = (struct wc){
			.wr_id = wc[i].wr_id, .status = wc[i].status,
			.opcode = wc[i].opcode, .byte_len = wc[i].byte_len,
			.qp_num = wc[i].qp_num, .src_qp = wc[i].src_qp,
			.wc_flags = wc[i].wc_flags,
			.inv_rkey = wc[i].invalidated_rkey,
		};
	return n;
}

/*
 * Exactly @want completions from @cq within the timeout (the two APIs
 * take turns, at most 2 a turn), then @quiet_ms with none more. Returns
 * how many came (more than @want: the extra ones too, up to @max).
 */
static int collect(struct run *r, struct ibv_cq_ex *cq, int want, int max,
		   struct wc *out, int quiet_ms)
{
	double end = now() + timeout_s;
	int n = 0, got;

	while (n < max) {
		int room = max - n < 2 ? max - n : 2;

		r->poll_turn = !r->poll_turn;
		got = r->poll_turn ? poll_ex(cq, room, out + n) :
				     poll_legacy(cq, room, out + n);
		if (got < 0) {
			printf("poll: %s\n", strerror(-got));
			return n;
		}
		n += got;
		if (got)
			continue;
		if (n >= want) {
			if (quiet_ms <= 0)
				break;
			usleep(quiet_ms * 1000);
			quiet_ms = 0;
			continue;
		}
		if (now() > end)
			break;
		usleep(1000);
	}
	return n;
}

/* A message in client slot @slot: its number and a pattern of it. */
static void fill(uint8_t *p, uint32_t len, uint32_t seq)
{
	uint32_t i;

	for (i = 0; i < len; i++)
		p[i] = (uint8_t)(seq * 37 + i * 11 + 5);
}

static bool filled(const uint8_t *p, uint32_t len, uint32_t seq)
{
	uint32_t i;

	for (i = 0; i < len; i++)
		if (p[i] != (uint8_t)(seq * 37 + i * 11 + 5))
			return false;
	return true;
}

/* The receive of wr_id @id: its slot holds message @seq of @len bytes. */
static bool recv_ok(struct run *r, const struct wc *wc, uint32_t len, uint32_t seq)
{
	return wc->status == IBV_WC_SUCCESS && wc->opcode == IBV_WC_RECV &&
	       wc->byte_len == len && wc->qp_num == r->server.qp->qp_num &&
	       wc->src_qp == 0 && wc->wc_flags == 0 &&
	       filled(SERVER_SLOT(r, wc->wr_id % SLOTS), len, seq);
}

/*
 * @n SRQ WRs completed: as many new ones, so every SEND finds one (a
 * SEND without a receive WR is a protocol error on iWARP).
 */
static void note_recvs(struct run *r, int n)
{
	r->srq_posted -= n;
	post_srq(r, n);
}

/* One signaled SEND of @len bytes at @addr, a batch of its own: wr_complete's status. */
static int send_one(struct ibv_qp_ex *qpx, uint32_t lkey, uint64_t wr_id,
		    void *addr, uint32_t len)
{
	ibv_wr_start(qpx);
	qpx->wr_id = wr_id;
	qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(qpx);
	ibv_wr_set_sge(qpx, lkey, (uintptr_t)addr, len);
	return ibv_wr_complete(qpx);
}

/*
 * send_one of message @seq (client slot @seq, @len bytes): it alone
 * completes and arrives, intact.
 */
static void check_one_send(struct run *r, const char *name, uint64_t wr_id,
			   uint32_t seq, uint32_t len)
{
	struct wc sw[4], rw[4];
	int ret, ns, nr;

	fill(CLIENT_SLOT(r, seq), len, seq);
	ret = send_one(r->client.qpx, r->mr->lkey, wr_id, CLIENT_SLOT(r, seq), len);
	ns = collect(r, r->ccq, 1, 4, sw, 300);
	nr = collect(r, r->scq, 1, 4, rw, 100);
	note_recvs(r, nr);
	check(!ret && ns == 1 && sw[0].wr_id == wr_id && sw[0].status == IBV_WC_SUCCESS &&
	      nr == 1 && recv_ok(r, &rw[0], len, seq), name,
	      "wr_complete %s, %d sends (want 1: %" PRIu64 "), %d receives (want 1 of %u bytes)",
	      strerror(ret), ns, wr_id, nr, len);
}

/* ---------------------------------------------------------------- the steps */

static void step_refusals(struct run *r)
{
	struct ibv_qp_init_attr_ex a = r->cattr;
	struct ibv_cq_init_attr_ex cqa = {
		.cqe = 16,
		.wc_flags = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP,
	};
	struct ibv_qp *qp;
	struct ibv_cq_ex *cq;
	struct wc wc;
	int e1, e2;

	a.pd = r->pd;
	a.send_ops_flags = SEND_OPS | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP;
	errno = 0;
	qp = ibv_create_qp_ex(r->ctx, &a);
	e1 = errno;
	if (qp)
		ibv_destroy_qp(qp);
	a.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;
	errno = 0;
	qp = ibv_create_qp_ex(r->ctx, &a);
	e2 = errno;
	if (qp)
		ibv_destroy_qp(qp);
	check(e1 == EOPNOTSUPP && e2 == EOPNOTSUPP, "refuse-ops",
	      "atomic: %s, SEND_WITH_IMM: %s (want EOPNOTSUPP)", strerror(e1), strerror(e2));

	errno = 0;
	cq = ibv_create_cq_ex(r->ctx, &cqa);
	e1 = errno;
	if (cq)
		ibv_destroy_cq(ibv_cq_ex_to_cq(cq));
	check(!cq && e1 == EOPNOTSUPP, "refuse-wc", "create_cq_ex with timestamps: %s",
	      cq ? "created" : strerror(e1));

	check(poll_ex(r->ccq, 1, &wc) == 0 && ibv_start_poll(r->ccq, &(struct ibv_poll_cq_attr){}) == ENOENT,
	      "empty", "start_poll on an empty CQ did not say ENOENT");
}

static void step_not_connected(struct run *r)
{
	struct ibv_qp_init_attr_ex a = r->cattr;
	struct ibv_qp_ex *qpx;
	struct ibv_qp *qp;
	struct wc wc[2];
	int ret;

	a.pd = r->pd;
	a.send_ops_flags = IBV_QP_EX_WITH_SEND;
	qp = ibv_create_qp_ex(r->ctx, &a);
	if (!qp)
		die("ibv_create_qp_ex (unconnected)");
	qpx = ibv_qp_to_qp_ex(qp);
	ret = send_one(qpx, r->mr->lkey, 900, CLIENT_SLOT(r, 0), 8);
	check(ret == EINVAL && collect(r, r->ccq, 0, 2, wc, 100) == 0,
	      "not-connected", "wr_complete on a QP in RESET: %s (want EINVAL)", strerror(ret));
	if (ibv_destroy_qp(qp))
		die("ibv_destroy_qp (unconnected)");
}

static void step_allocators(struct run *r)
{
	/* Client QP: its SQ and RQ shadows; SRQ slots (the default allocator). */
	check(r->log.qp_allocs == 2 && r->log.srq_asks == 1 && r->log.other == 0 &&
	      r->log.custom_live == 2 && r->log.frees == 0, "allocators",
	      "QP buffers %d (want 2), SRQ asks %d (want 1), other %d, live %d, frees %d",
	      r->log.qp_allocs, r->log.srq_asks, r->log.other, r->log.custom_live, r->log.frees);
}

/* Posts with ibv_wr_*: every op, SGE lists, inline, one wr_complete. */
static void step_batch(struct run *r)
{
	struct ibv_qp_ex *qpx = r->client.qpx;
	uint32_t lkey = r->mr->lkey, rkey = r->mr->rkey;
	struct ibv_sge three[3], two[2];
	struct ibv_data_buf bufs[2];
	uint8_t inl[40], inl_a[20], inl_b[30];
	struct wc sw[8], rw[8];
	uint8_t *wsrc, *wdst, *rsrc, *rdst;
	int ns, nr, i, ret, bad = 0;

	/* Message 0: 100 bytes in slot 0. Message 1: 3 pieces, slots 1-3. */
	fill(CLIENT_SLOT(r, 0), 100, 0);
	fill(r->buf + 4 * MSG, 200, 1);		/* scratch, cut in 3 below */
	memcpy(CLIENT_SLOT(r, 1), r->buf + 4 * MSG, 50);
	memcpy(CLIENT_SLOT(r, 2), r->buf + 4 * MSG + 50, 70);
	memcpy(CLIENT_SLOT(r, 3), r->buf + 4 * MSG + 120, 80);
	three[0] = (struct ibv_sge){ (uintptr_t)CLIENT_SLOT(r, 1), 50, lkey };
	three[1] = (struct ibv_sge){ (uintptr_t)CLIENT_SLOT(r, 2), 70, lkey };
	three[2] = (struct ibv_sge){ (uintptr_t)CLIENT_SLOT(r, 3), 80, lkey };
	fill(inl, sizeof(inl), 2);
	fill(r->buf + 5 * MSG, 50, 3);
	memcpy(inl_a, r->buf + 5 * MSG, 20);
	memcpy(inl_b, r->buf + 5 * MSG + 20, 30);
	bufs[0] = (struct ibv_data_buf){ inl_a, sizeof(inl_a) };
	bufs[1] = (struct ibv_data_buf){ inl_b, sizeof(inl_b) };
	/* WRITE: 2 SGEs (slots 6, 7) to server slot SLOTS-1; READ it back to slot 8. */
	wsrc = CLIENT_SLOT(r, 6);
	fill(wsrc, 60, 4);
	fill(CLIENT_SLOT(r, 7), 40, 5);
	two[0] = (struct ibv_sge){ (uintptr_t)wsrc, 60, lkey };
	two[1] = (struct ibv_sge){ (uintptr_t)CLIENT_SLOT(r, 7), 40, lkey };
	wdst = SERVER_SLOT(r, SLOTS - 1);
	rsrc = wdst;
	rdst = CLIENT_SLOT(r, 8);
	memset(wdst, 0, MSG);
	memset(rdst, 0, MSG);

	ibv_wr_start(qpx);
	qpx->wr_flags = IBV_SEND_SIGNALED;
	qpx->wr_id = 10;
	ibv_wr_send(qpx);
	ibv_wr_set_sge(qpx, lkey, (uintptr_t)CLIENT_SLOT(r, 0), 100);
	qpx->wr_id = 11;
	ibv_wr_send(qpx);
	ibv_wr_set_sge_list(qpx, 3, three);
	qpx->wr_id = 12;
	ibv_wr_send(qpx);
	ibv_wr_set_inline_data(qpx, inl, sizeof(inl));
	qpx->wr_id = 13;
	ibv_wr_send(qpx);
	ibv_wr_set_inline_data_list(qpx, 2, bufs);
	qpx->wr_id = 14;
	qpx->wr_flags = 0;		/* unsignaled: no completion */
	ibv_wr_rdma_write(qpx, rkey, (uintptr_t)wdst);
	ibv_wr_set_sge_list(qpx, 2, two);
	qpx->wr_id = 15;
	qpx->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_FENCE;
	ibv_wr_rdma_read(qpx, rkey, (uintptr_t)rsrc);
	ibv_wr_set_sge(qpx, lkey, (uintptr_t)rdst, 100);
	ret = ibv_wr_complete(qpx);
	if (ret) {
		check(false, "batch", "wr_complete: %s", strerror(ret));
		return;
	}

	ns = collect(r, r->ccq, 5, 8, sw, 300);
	nr = collect(r, r->scq, 4, 8, rw, 100);
	note_recvs(r, nr);
	if (ns != 5 || nr != 4) {
		check(false, "batch", "%d send completions (want 5), %d receives (want 4)", ns, nr);
		return;
	}
	for (i = 0; i < 5; i++) {
		uint64_t want = i < 4 ? 10 + i : 15;
		enum ibv_wc_opcode op = i < 4 ? IBV_WC_SEND : IBV_WC_RDMA_READ;

		if (sw[i].wr_id != want || sw[i].status != IBV_WC_SUCCESS ||
		    sw[i].opcode != op || sw[i].qp_num != r->client.qp->qp_num) {
			printf("send completion %d: wr_id %" PRIu64 " status %s opcode %d qp %u\n",
			       i, sw[i].wr_id, ibv_wc_status_str(sw[i].status), sw[i].opcode, sw[i].qp_num);
			bad++;
		}
	}
	/* The SRQ hands out its WRs in order: 1, 2, 3, 4. */
	if (!recv_ok(r, &rw[0], 100, 0))
		bad++, printf("receive 0 wrong (len %u)\n", rw[0].byte_len);
	if (!recv_ok(r, &rw[1], 200, 1))
		bad++, printf("receive 1 wrong (len %u)\n", rw[1].byte_len);
	if (!recv_ok(r, &rw[2], sizeof(inl), 2))
		bad++, printf("receive 2 (inline) wrong (len %u)\n", rw[2].byte_len);
	if (!recv_ok(r, &rw[3], 50, 3))
		bad++, printf("receive 3 (inline list) wrong (len %u)\n", rw[3].byte_len);
	if (memcmp(wdst, wsrc, 60) || !filled(wdst + 60, 40, 5))
		bad++, printf("RDMA WRITE of 2 SGEs did not land\n");
	if (memcmp(rdst, rsrc, 100))
		bad++, printf("RDMA READ brought back other bytes\n");
	check(!bad, "batch", "%d wrong (above)", bad);
}

/* 16 SENDs, polled with both APIs in turn: each wr_id once. */
static void step_mixed(struct run *r)
{
	struct ibv_qp_ex *qpx = r->client.qpx;
	uint8_t seen[16] = {};
	struct wc sw[20], rw[20];
	int ns, nr, i, b, ret = 0, dup = 0, other = 0;

	fill(CLIENT_SLOT(r, 9), 64, 9);
	for (b = 0; b < 2; b++) {
		ibv_wr_start(qpx);
		qpx->wr_flags = IBV_SEND_SIGNALED;
		for (i = 0; i < 8; i++) {
			qpx->wr_id = 100 + b * 8 + i;
			ibv_wr_send(qpx);
			ibv_wr_set_sge(qpx, r->mr->lkey, (uintptr_t)CLIENT_SLOT(r, 9), 64);
		}
		ret = ret ? ret : ibv_wr_complete(qpx);
	}
	ns = collect(r, r->ccq, 16, 20, sw, 300);
	nr = collect(r, r->scq, 16, 20, rw, 100);
	note_recvs(r, nr);
	for (i = 0; i < ns; i++) {
		uint64_t k = sw[i].wr_id - 100;

		if (k >= 16 || sw[i].status != IBV_WC_SUCCESS || sw[i].opcode != IBV_WC_SEND)
			other++;
		else if (seen[k]++)
			dup++;
	}
	for (i = 0; i < nr; i++)
		if (!recv_ok(r, &rw[i], 64, 9))
			other++;
	check(!ret && ns == 16 && nr == 16 && !dup && !other, "mixed",
	      "wr_complete %s; %d sends (want 16), %d receives (want 16), %d twice, %d wrong",
	      strerror(ret), ns, nr, dup, other);
}

static void step_abort(struct run *r)
{
	struct ibv_qp_ex *qpx = r->client.qpx;
	struct wc sw[4], rw[4];
	int ns, nr;

	ibv_wr_start(qpx);
	qpx->wr_flags = IBV_SEND_SIGNALED;
	qpx->wr_id = 200;
	ibv_wr_send(qpx);
	ibv_wr_set_sge(qpx, r->mr->lkey, (uintptr_t)CLIENT_SLOT(r, 0), 10);
	qpx->wr_id = 201;
	ibv_wr_send(qpx);
	ibv_wr_set_sge(qpx, r->mr->lkey, (uintptr_t)CLIENT_SLOT(r, 0), 11);
	ibv_wr_abort(qpx);
	ns = collect(r, r->ccq, 0, 4, sw, 300);
	nr = collect(r, r->scq, 0, 4, rw, 100);
	if (ns || nr) {
		note_recvs(r, nr);
		check(false, "abort", "an aborted batch made %d send completions, %d receives", ns, nr);
		return;
	}
	check_one_send(r, "abort", 202, 10, 33);
}

/* A failed batch: wr_complete's errno, and nothing of it completes. */
static void expect_refused(struct run *r, const char *name, int ret, int want)
{
	struct wc sw[4], rw[4];
	int ns = collect(r, r->ccq, 0, 4, sw, 200);
	int nr = collect(r, r->scq, 0, 4, rw, 50);

	note_recvs(r, nr);
	check(ret == want && !ns && !nr, name, "wr_complete: %s (want %s); %d send completions, %d receives (want none)",
	      strerror(ret), strerror(want), ns, nr);
}

static void step_negative(struct run *r)
{
	struct ibv_qp_ex *qpx = r->client.qpx;
	uint32_t lkey = r->mr->lkey;
	struct ibv_sge many[8];
	uint8_t big[256];
	int i, ret;

	for (i = 0; i < 8; i++)
		many[i] = (struct ibv_sge){ (uintptr_t)CLIENT_SLOT(r, i), 8, lkey };

	ibv_wr_start(qpx);
	qpx->wr_flags = IBV_SEND_SIGNALED;
	qpx->wr_id = 300;
	ibv_wr_send(qpx);
	ibv_wr_set_sge(qpx, lkey, (uintptr_t)CLIENT_SLOT(r, 0), 8);
	qpx->wr_id = 301;
	ibv_wr_send(qpx);
	ibv_wr_set_sge_list(qpx, r->cattr.cap.max_send_sge + 1, many);
	expect_refused(r, "too-many-sges", ibv_wr_complete(qpx), EINVAL);

	memset(big, 7, sizeof(big));
	ibv_wr_start(qpx);
	qpx->wr_id = 302;
	ibv_wr_send(qpx);
	ibv_wr_set_inline_data(qpx, big, r->cattr.cap.max_inline_data + 1);
	expect_refused(r, "inline-too-long", ibv_wr_complete(qpx), EINVAL);

	ibv_wr_start(qpx);
	qpx->wr_id = 303;
	qpx->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	ibv_wr_rdma_read(qpx, r->mr->rkey, (uintptr_t)SERVER_SLOT(r, 0));
	ibv_wr_set_sge(qpx, lkey, (uintptr_t)CLIENT_SLOT(r, 0), 8);
	expect_refused(r, "read-inline", ibv_wr_complete(qpx), EINVAL);

	ibv_wr_start(qpx);
	qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_set_sge(qpx, lkey, (uintptr_t)CLIENT_SLOT(r, 0), 8);
	qpx->wr_id = 304;
	ibv_wr_send(qpx);
	ibv_wr_set_sge(qpx, lkey, (uintptr_t)CLIENT_SLOT(r, 0), 8);
	expect_refused(r, "setter-first", ibv_wr_complete(qpx), EINVAL);

	ibv_wr_start(qpx);
	for (i = 0; i < RING_FULL_WRS; i++) {
		qpx->wr_id = 1000 + i;
		ibv_wr_send(qpx);
		ibv_wr_set_sge(qpx, lkey, (uintptr_t)CLIENT_SLOT(r, 0), 8);
	}
	ret = ibv_wr_complete(qpx);
	expect_refused(r, "ring-full", ret, ENOMEM);

	check_one_send(r, "still-works", 305, 11, 21);
}

/* Waits for the armed server CQ's event; false on the timeout. */
static bool wait_cq_event(struct run *r)
{
	struct pollfd p = { .fd = r->chan->fd, .events = POLLIN };
	struct ibv_cq *cq;
	void *ctx;

	if (poll(&p, 1, timeout_s * 1000) != 1)
		return false;
	if (ibv_get_cq_event(r->chan, &cq, &ctx))
		return false;
	ibv_ack_cq_events(cq, 1);
	return cq == ibv_cq_ex_to_cq(r->scq);
}

/*
 * The SRQ full; a SEND lands in its oldest WR and its completion waits
 * unpolled (the armed CQ's event says it is there). Then LOCAL_INV
 * through qp_ex of an ordinary MR's key: the builder reaches vt3d, which
 * refuses it (only fast-registered STags are invalidated) with
 * IBV_WC_LOC_QP_OP_ERR, and the client QP goes into error. Then the
 * server QP is destroyed, which discards its receive completion: its SRQ
 * slot is free again for exactly one post.
 */
static void step_srq_forget(struct run *r)
{
	struct ibv_qp_ex *qpx = r->client.qpx;
	struct ibv_recv_wr wr = { .num_sge = 1 }, *bad;
	struct ibv_sge sge = { (uintptr_t)SERVER_SLOT(r, 0), MSG, r->mr->lkey };
	struct wc sw[4], rw[4];
	int ret, ret2, ns, nr;
	bool event;

	wr.sg_list = &sge;
	post_srq(r, r->srq_max - r->srq_posted);
	if (ibv_req_notify_cq(ibv_cq_ex_to_cq(r->scq), 0))
		die("ibv_req_notify_cq");
	ret = send_one(qpx, r->mr->lkey, 400, CLIENT_SLOT(r, 0), 16);
	event = wait_cq_event(r);
	ns = collect(r, r->ccq, 1, 4, sw, 0);
	check(!ret && event && ns == 1 && sw[0].wr_id == 400 && sw[0].status == IBV_WC_SUCCESS,
	      "srq-arrived", "wr_complete %s, CQ event %s, %d send completions (want 1: 400)",
	      strerror(ret), event ? "came" : "missing", ns);

	ibv_wr_start(qpx);
	qpx->wr_id = 600;
	qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_local_inv(qpx, r->mr->lkey);
	ret = ibv_wr_complete(qpx);
	ns = collect(r, r->ccq, 1, 4, sw, 300);
	check(!ret && ns == 1 && sw[0].wr_id == 600 && sw[0].opcode == IBV_WC_LOCAL_INV &&
	      sw[0].status == IBV_WC_LOC_QP_OP_ERR && sw[0].qp_num == r->client.qp->qp_num,
	      "local-inv", "wr_complete %s; %d completions (want 1: 600, LOCAL_INV, LOC_QP_OP_ERR): wr_id %" PRIu64 " opcode %d status %s",
	      strerror(ret), ns, ns ? sw[0].wr_id : 0, ns ? (int)sw[0].opcode : -1,
	      ns ? ibv_wc_status_str(sw[0].status) : "-");

	/* The server side goes, its receive completion unpolled. */
	rdma_disconnect(r->server.id);
	rdma_destroy_qp(r->server.id);
	r->server.qp = NULL;

	wr.wr_id = 500;
	ret2 = ibv_post_srq_recv(r->srq, &wr, &bad);
	check(ret2 == 0, "srq-forget",
	      "a post to the full SRQ after its QP's destroy discarded a completion: %s (want success)",
	      strerror(ret2));
	wr.wr_id = 501;
	ret2 = ibv_post_srq_recv(r->srq, &wr, &bad);
	nr = collect(r, r->scq, 0, 4, rw, 300);
	check(ret2 == ENOMEM && nr == 0, "srq-full-again",
	      "the next post: %s (want ENOMEM: the SRQ is full); %d completions of the destroyed QP (want 0)",
	      strerror(ret2), nr);
}

static void teardown(struct run *r)
{
	int e_pd, e_td, ok = 1;

	rdma_destroy_qp(r->client.id);
	rdma_destroy_id(r->client.id);
	rdma_destroy_id(r->server.id);
	if (ibv_destroy_srq(r->srq))
		ok = 0, printf("ibv_destroy_srq failed\n");
	/* The server QP's two shadows came from it too. */
	check(r->log.qp_allocs == 4 && r->log.custom_live == 0 && r->log.frees == 4 &&
	      r->log.bad_frees == 0, "domain-free",
	      "%d QP buffers given (want 4), %d not freed, %d free calls (want 4), %d of buffers we did not give",
	      r->log.qp_allocs, r->log.custom_live, r->log.frees, r->log.bad_frees);

	if (ibv_dereg_mr(r->mr))
		ok = 0, printf("ibv_dereg_mr failed\n");
	if (ibv_destroy_cq(ibv_cq_ex_to_cq(r->scq)) || ibv_destroy_cq(ibv_cq_ex_to_cq(r->ccq)))
		ok = 0, printf("ibv_destroy_cq failed\n");
	ibv_destroy_comp_channel(r->chan);
	e_pd = ibv_dealloc_pd(r->pd);
	e_td = ibv_dealloc_td(r->td);
	if (ibv_dealloc_pd(r->parent) || ibv_dealloc_td(r->td) || ibv_dealloc_pd(r->pd))
		ok = 0, printf("dealloc of the parent domain, TD or PD failed\n");
	check(ok && e_pd == EBUSY && e_td == EBUSY, "busy",
	      "dealloc of the PD under a parent domain: %s, of its TD: %s (want EBUSY)",
	      strerror(e_pd), strerror(e_td));
	rdma_destroy_id(r->listen);
	rdma_destroy_event_channel(r->ch);
	free(r->buf);
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "addr", required_argument, NULL, 'a' },
		{ "port", required_argument, NULL, 'p' },
		{ "timeout", required_argument, NULL, 't' },
		{ "verbose", no_argument, NULL, 'v' },
		{}
	};
	const char *addr = NULL, *port = "7476";
	struct run r = {};
	int c;

	while ((c = getopt_long(argc, argv, "a:p:t:v", opts, NULL)) != -1) {
		switch (c) {
		case 'a': addr = optarg; break;
		case 'p': port = optarg; break;
		case 't': timeout_s = atoi(optarg); break;
		case 'v': verbose = true; break;
		default:
			fprintf(stderr, "usage: vt3-qpex --addr IP [--port P] [--timeout S] [-v]\n");
			return 2;
		}
	}
	if (!addr) {
		fprintf(stderr, "vt3-qpex: --addr is required\n");
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);

	setup(&r, addr, port);
	step_refusals(&r);
	step_allocators(&r);
	step_not_connected(&r);
	connect_both(&r);
	step_batch(&r);
	step_mixed(&r);
	step_abort(&r);
	step_negative(&r);
	step_srq_forget(&r);
	teardown(&r);
	return check_summary();
}
