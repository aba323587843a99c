// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
/* vt3-flushtest's server: the passive side, on any iWARP device. */
#include "vt3-flushtest.h"

struct sconn {
	struct rdma_cm_id *id;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	char *buf;
	struct req_pd req;
	bool disconnected;
	double act_at;		/* the "go" came: act then (0: not yet) */
};

static void sconn_free(struct sconn *c, bool abort_conn)
{
	if (!c->id)
		return;
	if (!abort_conn && !c->disconnected)
		rdma_disconnect(c->id);
	if (c->id->qp)
		rdma_destroy_qp(c->id);
	if (c->mr)
		ibv_dereg_mr(c->mr);
	if (c->cq)
		ibv_destroy_cq(c->cq);
	if (c->pd)
		ibv_dealloc_pd(c->pd);
	rdma_destroy_id(c->id);
	free(c->buf);
	memset(c, 0, sizeof(*c));
}

static int sconn_setup(struct sconn *c, struct rdma_cm_event *ev)
{
	struct ibv_qp_init_attr attr = {
		.cap = { .max_send_wr = 16, .max_recv_wr = 16,
			 .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};
	struct rdma_conn_param param = {
		.responder_resources = 1, .initiator_depth = 1,
	};
	struct rep_pd rep = { .magic = MAGIC, .len = BUF_SIZE };
	int i;

	c->id = ev->id;
	if (ev->param.conn.private_data_len >= sizeof(c->req))
		memcpy(&c->req, ev->param.conn.private_data, sizeof(c->req));
	if (c->req.magic != MAGIC) {
		fprintf(stderr, "server: connect without our private data\n");
		rdma_reject(c->id, NULL, 0);
		rdma_destroy_id(c->id);
		c->id = NULL;
		return -1;
	}
	c->buf = calloc(1, BUF_SIZE);
	c->pd = ibv_alloc_pd(c->id->verbs);
	c->cq = c->pd ? ibv_create_cq(c->id->verbs, CQ_DEPTH, NULL, NULL, 0) : NULL;
	c->mr = c->cq ? ibv_reg_mr(c->pd, c->buf, BUF_SIZE,
				   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
				   IBV_ACCESS_REMOTE_READ) : NULL;
	attr.send_cq = attr.recv_cq = c->cq;
	if (!c->mr || rdma_create_qp(c->id, c->pd, &attr)) {
		perror("server: setup");
		rdma_reject(c->id, NULL, 0);
		sconn_free(c, true);
		return -1;
	}
	for (i = 0; i < 8; i++) {
		struct ibv_sge sge = { .addr = (uintptr_t)c->buf + i * MSG_SIZE,
				       .length = MSG_SIZE, .lkey = c->mr->lkey };
		struct ibv_recv_wr wr = { .wr_id = i, .sg_list = &sge, .num_sge = 1 }, *bad;

		if (ibv_post_recv(c->id->qp, &wr, &bad))
			perror("server: post_recv");
	}
	rep.qpn = c->id->qp->qp_num;
	rep.addr = (uintptr_t)c->buf;
	rep.rkey = c->mr->rkey;
	param.private_data = &rep;
	param.private_data_len = sizeof(rep);
	if (rdma_accept(c->id, &param)) {
		perror("server: rdma_accept");
		sconn_free(c, true);
		return -1;
	}
	printf("SERVER ACCEPTED %u action %u\n", rep.qpn, c->req.action);
	fflush(stdout);
	return 0;
}

/* The client's "go" arrived: do what it asked. Returns true if aborted. */
static bool sconn_act(struct sconn *c)
{
	struct ibv_sge sge = { .addr = (uintptr_t)c->buf + BUF_SIZE / 2,
			       .length = MSG_SIZE, .lkey = c->mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 100, .sg_list = &sge, .num_sge = 1,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;

	printf("SERVER GO action %u\n", c->req.action);
	fflush(stdout);
	switch (c->req.action) {
	case ACT_DISCONNECT:
		rdma_disconnect(c->id);
		break;
	case ACT_ABORT:
		sconn_free(c, true);
		return true;
	case ACT_SEND:
		wr.opcode = IBV_WR_SEND;
		if (ibv_post_send(c->id->qp, &wr, &bad))
			perror("server: post_send");
		break;
	case ACT_WRITE_BADSTAG:
	case ACT_WRITE:
		wr.opcode = IBV_WR_RDMA_WRITE;
		wr.wr.rdma.remote_addr = c->req.addr;
		wr.wr.rdma.rkey = c->req.rkey;
		/* Same index, another key: an invalid STag (RFC 5040). */
		if (c->req.action == ACT_WRITE_BADSTAG)
			wr.wr.rdma.rkey ^= 0x5a;
		if (ibv_post_send(c->id->qp, &wr, &bad))
			perror("server: post_send");
		break;
	default:
		break;
	}
	return false;
}

int run_server(const char *bind_ip, int port)
{
	struct rdma_event_channel *ch;
	struct rdma_cm_id *listen_id;
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons(port) };
	struct sconn c = {};
	double idle_since = now();

	if (bind_ip && inet_pton(AF_INET, bind_ip, &sin.sin_addr) != 1) {
		fprintf(stderr, "server: bad address %s\n", bind_ip);
		return 2;
	}
	ch = rdma_create_event_channel();
	if (!ch || rdma_create_id(ch, &listen_id, NULL, RDMA_PS_TCP) ||
	    rdma_bind_addr(listen_id, (struct sockaddr *)&sin) ||
	    rdma_listen(listen_id, 4)) {
		perror("server: listen");
		return 2;
	}
	printf("SERVER LISTENING %d\n", port);
	fflush(stdout);
	for (;;) {
		struct pollfd pfd = { .fd = ch->fd, .events = POLLIN };
		struct rdma_cm_event *ev;
		struct ibv_wc wc[8];
		int n, i;

		if (!c.id && now() - idle_since > timeout_s) {
			printf("SERVER idle for %d s: exiting\n", timeout_s);
			break;
		}
		if (c.cq) {
			n = ibv_poll_cq(c.cq, 8, wc);
			for (i = 0; i < n; i++) {
				vlog("server: wc wr_id %" PRIu64 " status %s\n",
				     wc[i].wr_id, ibv_wc_status_str(wc[i].status));
				if (wc[i].status == IBV_WC_SUCCESS &&
				    wc[i].opcode == IBV_WC_RECV && !c.act_at)
					c.act_at = now() + c.req.delay_ms / 1000.0;
			}
			if (c.act_at > 0 && now() >= c.act_at) {
				c.act_at = -1;
				if (sconn_act(&c))
					idle_since = now();
			}
		}
		if (poll(&pfd, 1, 20) <= 0)
			continue;
		if (rdma_get_cm_event(ch, &ev))
			continue;
		vlog("server: cm event %s\n", rdma_event_str(ev->event));
		switch (ev->event) {
		case RDMA_CM_EVENT_CONNECT_REQUEST:
			if (c.id) {
				rdma_reject(ev->id, NULL, 0);
				rdma_ack_cm_event(ev);
				break;
			}
			{
				struct rdma_cm_event copy = *ev;

				rdma_ack_cm_event(ev);
				sconn_setup(&c, &copy);
			}
			break;
		case RDMA_CM_EVENT_DISCONNECTED:
		case RDMA_CM_EVENT_CONNECT_ERROR:
		case RDMA_CM_EVENT_UNREACHABLE:
		case RDMA_CM_EVENT_REJECTED:
		case RDMA_CM_EVENT_DEVICE_REMOVAL:
			if (ev->id == c.id) {
				c.disconnected = ev->event != RDMA_CM_EVENT_DISCONNECTED;
				rdma_ack_cm_event(ev);
				if (!c.disconnected)
					rdma_disconnect(c.id);
				c.disconnected = true;
				printf("SERVER CLOSED\n");
				fflush(stdout);
				sconn_free(&c, false);
				idle_since = now();
			} else {
				rdma_ack_cm_event(ev);
			}
			break;
		default:
			rdma_ack_cm_event(ev);
			break;
		}
	}
	rdma_destroy_id(listen_id);
	rdma_destroy_event_channel(ch);
	return 0;
}
