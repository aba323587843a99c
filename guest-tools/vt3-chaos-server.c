// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
/*
 * vt3-chaos server: the passive side of the soak (vt3-chaos.c's header
 * comment), on any iWARP device. One connection per client QP (user or
 * kernel: vt3_kchaos.ko talks to it too), each with its own buffers.
 */
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <arpa/inet.h>

#include "vt3-chaos.h"

#define SRV_CONNS	64
#define SRV_RECV(i)	((RSLOTS + 1 + (i)) * SLOT)
#define SRV_SEND(i)	(SRV_RECV(SRV_RQ) + (i) * RSLOT)
#define SRV_BUF		SRV_SEND(SRV_SQ)

struct sconn {
	struct rdma_cm_id *id;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_mr *mr;	/* its own SEND and receive buffers */
	struct ibv_mr *rmr;	/* what the client WRITEs and READs: another STag,
				 * so invalidating it fails only the client's access */
	uint8_t *buf;
	struct req_pd req;
	double act_at;		/* 0: nothing to do */
	uint32_t received, replied;
	int sq_out;
	bool established, bad_reported;
};

static struct sconn sconns[SRV_CONNS];
static unsigned long srv_accepted, srv_nbad, srv_bytes;

static void sconn_free(struct sconn *c, bool abort_conn)
{
	if (!c->id)
		return;
	if (!abort_conn)
		rdma_disconnect(c->id);
	if (c->id->qp)
		rdma_destroy_qp(c->id);
	if (c->mr)
		ibv_dereg_mr(c->mr);
	if (c->rmr)
		ibv_dereg_mr(c->rmr);
	if (c->cq)
		ibv_destroy_cq(c->cq);
	if (c->pd)
		ibv_dealloc_pd(c->pd);
	rdma_destroy_id(c->id);
	free(c->buf);
	memset(c, 0, sizeof(*c));
}

static int srv_post_recv(struct sconn *c, uint32_t n)
{
	struct ibv_sge sge = { .addr = (uintptr_t)c->buf + SRV_RECV(n % SRV_RQ),
			       .length = SLOT, .lkey = c->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = n, .sg_list = &sge, .num_sge = 1 }, *bad;

	return ibv_post_recv(c->id->qp, &wr, &bad);
}

static void srv_bad(struct sconn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void srv_bad(struct sconn *c, const char *fmt, ...)
{
	va_list ap;

	srv_nbad++;
	if (c->bad_reported)
		return;
	c->bad_reported = true;
	printf("SERVER BAD seed %" PRIu64 " qp %u: ", c->req.seed, c->req.qpi);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
}

static void srv_check_recv(struct sconn *c, const struct ibv_wc *wc)
{
	const uint8_t *p = c->buf + SRV_RECV(wc->wr_id % SRV_RQ);
	struct msg_hdr h;
	int bad;

	memcpy(&h, p, sizeof(h));
	if (wc->byte_len < HDR || h.magic != MAGIC || h.qpi != c->req.qpi || h.tag != T_CSEND ||
	    h.len != wc->byte_len) {
		srv_bad(c, "SEND %u: header magic %#x qpi %u tag %u len %u, byte_len %u", c->received,
			h.magic, h.qpi, h.tag, h.len, wc->byte_len);
		return;
	}
	if (h.seq != c->received) {
		srv_bad(c, "SEND seq %u arrived as receive %u (lost or reordered)", h.seq, c->received);
		return;
	}
	bad = verify(p, hash(c->req.seed, c->req.qpi, T_CSEND, h.seq), HDR, h.len);
	if (bad >= 0)
		srv_bad(c, "SEND %u: byte %d wrong", h.seq, bad);
	srv_bytes += h.len;
}

/* Answers each received SEND with one of ours, while the SQ has room. */
static void srv_reply(struct sconn *c)
{
	while (c->replied < c->received && c->sq_out < SRV_SQ - 1) {
		unsigned int len = reply_len(c->req.seed, c->req.qpi, c->replied,
					     c->req.flags & REQ_BIG_REPLIES);
		uint8_t *p = c->buf + SRV_SEND(c->replied % SRV_SQ);
		struct msg_hdr h = { .magic = MAGIC, .qpi = c->req.qpi, .len = len,
				     .seq = c->replied, .tag = T_REPLY };
		struct ibv_sge sge = { .addr = (uintptr_t)p, .length = len, .lkey = c->mr->lkey };
		struct ibv_send_wr wr = { .wr_id = c->replied, .sg_list = &sge, .num_sge = 1,
					  .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED }, *bad;

		memcpy(p, &h, sizeof(h));
		fill(p, hash(c->req.seed, c->req.qpi, T_REPLY, c->replied), HDR, len);
		if (ibv_post_send(c->id->qp, &wr, &bad))
			return;		/* in error: the connection is ending */
		c->replied++;
		c->sq_out++;
	}
}

static void srv_poll(struct sconn *c)
{
	struct ibv_wc wc[16];
	int n, i;

	while ((n = ibv_poll_cq(c->cq, 16, wc)) > 0) {
		for (i = 0; i < n; i++) {
			if (wc[i].opcode & IBV_WC_RECV) {
				if (wc[i].status != IBV_WC_SUCCESS)
					continue;
				srv_check_recv(c, &wc[i]);
				c->received++;
				srv_post_recv(c, wc[i].wr_id + SRV_RQ);
			} else {
				c->sq_out--;
			}
		}
	}
	srv_reply(c);
}

static struct sconn *sconn_of(struct rdma_cm_id *id)
{
	int i;

	for (i = 0; i < SRV_CONNS; i++)
		if (sconns[i].id == id)
			return &sconns[i];
	return NULL;
}

static void sconn_setup(struct rdma_cm_event *ev)
{
	struct ibv_qp_init_attr attr = {
		.cap = { .max_send_wr = SRV_SQ, .max_recv_wr = SRV_RQ,
			 .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC, .sq_sig_all = 1,
	};
	struct rdma_conn_param param = { .responder_resources = ORD, .initiator_depth = ORD };
	struct rep_pd rep = { .magic = MAGIC };
	struct sconn *c = sconn_of(NULL);
	uint32_t i;

	if (!c || ev->param.conn.private_data_len < REQ_PD_V1_LEN) {
		fprintf(stderr, "server: %s\n", c ? "connect without our private data" : "too many connections");
		rdma_reject(ev->id, NULL, 0);
		rdma_destroy_id(ev->id);
		return;
	}
	c->id = ev->id;
	memcpy(&c->req, ev->param.conn.private_data,
	       ev->param.conn.private_data_len < sizeof(c->req) ? ev->param.conn.private_data_len : sizeof(c->req));
	c->buf = calloc(1, SRV_BUF);
	c->pd = c->buf ? ibv_alloc_pd(c->id->verbs) : NULL;
	c->cq = c->pd ? ibv_create_cq(c->id->verbs, SRV_RQ + SRV_SQ, NULL, NULL, 0) : NULL;
	c->rmr = c->cq ? ibv_reg_mr(c->pd, c->buf, SRV_RECV(0), IBV_ACCESS_LOCAL_WRITE |
				    IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ) : NULL;
	c->mr = c->rmr ? ibv_reg_mr(c->pd, c->buf + SRV_RECV(0), SRV_BUF - SRV_RECV(0),
				    IBV_ACCESS_LOCAL_WRITE) : NULL;
	attr.send_cq = attr.recv_cq = c->cq;
	if (c->req.magic != MAGIC || !c->mr || rdma_create_qp(c->id, c->pd, &attr)) {
		perror("server: setup");
		rdma_reject(c->id, NULL, 0);
		sconn_free(c, true);
		return;
	}
	/* What a READ of a place never written returns. */
	fill(c->buf + RSLOTS * SLOT, hash(c->req.seed, c->req.qpi, T_STATIC, 0), 0, SLOT);
	for (i = 0; i < SRV_RQ; i++)
		srv_post_recv(c, i);
	rep.qpn = c->id->qp->qp_num;
	rep.addr = (uintptr_t)c->buf;
	rep.rkey = c->rmr->rkey;
	param.private_data = &rep;
	param.private_data_len = sizeof(rep);
	if (rdma_accept(c->id, &param)) {
		perror("server: rdma_accept");
		sconn_free(c, true);
		return;
	}
	srv_accepted++;
	vlog("server: accepted qp %u (seed %" PRIu64 " qpi %u action %u)\n", rep.qpn,
	     c->req.seed, c->req.qpi, c->req.action);
}

static volatile sig_atomic_t srv_stop;

static void srv_on_term(int sig)
{
	(void)sig;
	srv_stop = 1;
}

int run_server(int port)
{
	struct rdma_event_channel *ch;
	struct rdma_cm_id *listen_id;
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons(port) };
	double idle_since = now();
	int i;

	signal(SIGTERM, srv_on_term);
	ch = rdma_create_event_channel();
	if (!ch || rdma_create_id(ch, &listen_id, NULL, RDMA_PS_TCP) ||
	    rdma_bind_addr(listen_id, (struct sockaddr *)&sin) || rdma_listen(listen_id, 64)) {
		perror("server: listen");
		return 2;
	}
	printf("SERVER LISTENING %d\n", port);
	fflush(stdout);
	while (!srv_stop) {
		struct pollfd pfd = { .fd = ch->fd, .events = POLLIN };
		struct rdma_cm_event *ev;
		bool any = false;

		for (i = 0; i < SRV_CONNS; i++) {
			struct sconn *c = &sconns[i];

			if (!c->id)
				continue;
			any = true;
			if (c->established && c->cq)
				srv_poll(c);
			if (c->act_at && now() >= c->act_at) {
				vlog("server: qp %u action %u\n", c->req.qpi, c->req.action);
				c->act_at = 0;
				if (c->req.action == ACT_CLOSE)
					rdma_disconnect(c->id);
				else
					sconn_free(c, true);	/* RST */
			}
		}
		if (any)
			idle_since = now();
		else if (now() - idle_since > timeout_s)
			break;
		if (poll(&pfd, 1, any ? 1 : 50) <= 0 || rdma_get_cm_event(ch, &ev))
			continue;
		vlog("server: cm event %s\n", rdma_event_str(ev->event));
		if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST) {
			struct rdma_cm_event copy = *ev;

			/* The private data lives until the ack: setup first. */
			sconn_setup(&copy);
			rdma_ack_cm_event(ev);
			continue;
		}
		{
			struct sconn *c = sconn_of(ev->id);
			enum rdma_cm_event_type type = ev->event;

			rdma_ack_cm_event(ev);
			if (!c)
				continue;
			if (type == RDMA_CM_EVENT_ESTABLISHED) {
				c->established = true;
				if (c->req.action != ACT_NONE)
					c->act_at = now() + c->req.act_ms / 1000.0;
			} else if (type == RDMA_CM_EVENT_DISCONNECTED ||
				   type == RDMA_CM_EVENT_CONNECT_ERROR ||
				   type == RDMA_CM_EVENT_DEVICE_REMOVAL) {
				if (c->established && c->cq)
					srv_poll(c);
				sconn_free(c, false);
			}
		}
	}
	for (i = 0; i < SRV_CONNS; i++)
		sconn_free(&sconns[i], false);
	printf("SERVER done: %lu accepted, %lu bad, %lu bytes checked\n", srv_accepted, srv_nbad, srv_bytes);
	rdma_destroy_id(listen_id);
	rdma_destroy_event_channel(ch);
	return srv_stop ? 143 : 0;
}
