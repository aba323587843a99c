// SPDX-License-Identifier: GPL-2.0
/*
 * vt3_kcm: vt3.ko's connection paths as a kernel rdma_cm ULP sees them,
 * between two guests.
 *
 *   insmod vt3_kcm.ko server=1 [port=P]            listens on 0.0.0.0:P
 *   insmod vt3_kcm.ko addr=SERVER_IP [port=P]      the client
 *
 * The client first connects to a port nobody listens on (REJECTED), then
 * to the server: ESTABLISHED with the QP in RTS, `rounds` SENDs the server
 * echoes, a graceful disconnect (DISCONNECTED, QP in ERR). The server
 * accepts one connection, echoes what it receives and logs its result on
 * DISCONNECTED. After every connection's end (the refused connect too),
 * each side drains its QP with ib_drain_qp(), which must return, and
 * checks that the one receive still posted came back flushed
 * (IB_WC_WR_FLUSH_ERR) and nothing else did. Each side logs
 * "vt3_kcm: <role>: N passed, N failed"; unload the module afterwards.
 */
#include <linux/completion.h>
#include <linux/inet.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>

static bool server;
module_param(server, bool, 0444);
MODULE_PARM_DESC(server, "listen (1) or connect (0)");
static char *addr = "0.0.0.0";
module_param(addr, charp, 0444);
MODULE_PARM_DESC(addr, "server: address to listen on; client: the server's");
static ushort port = 7777;
module_param(port, ushort, 0444);
MODULE_PARM_DESC(port, "the server's port");
static ushort closed_port = 7778;
module_param(closed_port, ushort, 0444);
MODULE_PARM_DESC(closed_port, "a port nobody listens on");
static int rounds = 10;
module_param(rounds, int, 0444);
MODULE_PARM_DESC(rounds, "messages the client sends");

#define KCM_MSG		64
#define KCM_TIMEOUT	(60 * HZ)

static int passed, failed;

#define CHECK(cond, fmt, ...)						\
	({								\
		bool __ok = (cond);					\
		if (__ok)						\
			passed++;					\
		else							\
			failed++;					\
		pr_info("vt3_kcm: %s " fmt "\n", __ok ? "ok  " : "FAIL",\
			##__VA_ARGS__);					\
		__ok;							\
	})

struct kcm_conn {
	struct rdma_cm_id *id;
	struct ib_pd *pd;
	struct ib_cq *cq;
	struct ib_qp *qp;
	u8 *buf;			/* receive, then send buffer */
	u64 dma;
	struct ib_cqe recv_cqe;
	struct ib_cqe send_cqe;
	/* The last rdma_cm event, for the client's steps. */
	struct completion cm_done;
	enum rdma_cm_event_type event;
	int status;
	struct completion recv_done;
	struct completion disconnected;
	int received;
	int flushed_recv;		/* IB_WC_WR_FLUSH_ERR receives */
	int flushed_send;
	bool connected;
	struct work_struct drain_work;	/* server: drain after DISCONNECTED */
};

static struct kcm_conn *listener;	/* server: the listening id only */
static struct kcm_conn *conn;		/* the connection */

static void kcm_server_drain(struct work_struct *work);

static struct kcm_conn *kcm_alloc(void)
{
	struct kcm_conn *c = kzalloc(sizeof(*c), GFP_KERNEL);

	if (!c)
		return NULL;
	init_completion(&c->cm_done);
	init_completion(&c->recv_done);
	init_completion(&c->disconnected);
	INIT_WORK(&c->drain_work, kcm_server_drain);
	return c;
}

static int kcm_post_recv(struct kcm_conn *c)
{
	struct ib_sge sge = {
		.addr = c->dma,
		.length = KCM_MSG,
		.lkey = c->pd->local_dma_lkey,
	};
	struct ib_recv_wr wr = {
		.wr_cqe = &c->recv_cqe,
		.sg_list = &sge,
		.num_sge = 1,
	};

	return ib_post_recv(c->qp, &wr, NULL);
}

static int kcm_post_send(struct kcm_conn *c)
{
	struct ib_sge sge = {
		.addr = c->dma + KCM_MSG,
		.length = KCM_MSG,
		.lkey = c->pd->local_dma_lkey,
	};
	struct ib_send_wr wr = {
		.wr_cqe = &c->send_cqe,
		.sg_list = &sge,
		.num_sge = 1,
		.opcode = IB_WR_SEND,
		.send_flags = IB_SEND_SIGNALED,
	};

	ib_dma_sync_single_for_device(c->id->device, c->dma + KCM_MSG, KCM_MSG,
				      DMA_TO_DEVICE);
	return ib_post_send(c->qp, &wr, NULL);
}

static void kcm_send_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kcm_conn *c = cq->cq_context;

	if (wc->status == IB_WC_WR_FLUSH_ERR)
		c->flushed_send++;
	else if (wc->status != IB_WC_SUCCESS)
		CHECK(false, "send completion status %d", wc->status);
}

static void kcm_recv_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct kcm_conn *c = cq->cq_context;

	if (wc->status != IB_WC_SUCCESS) {
		if (wc->status == IB_WC_WR_FLUSH_ERR)
			c->flushed_recv++;
		else
			CHECK(false, "receive completion status %d", wc->status);
		return;
	}
	ib_dma_sync_single_for_cpu(c->id->device, c->dma, KCM_MSG,
				   DMA_FROM_DEVICE);
	c->received++;
	if (server) {
		/* Echo, and be ready for the next one. */
		memcpy(c->buf + KCM_MSG, c->buf, KCM_MSG);
		if (kcm_post_recv(c) || kcm_post_send(c))
			CHECK(false, "server: echo %d posted", c->received);
	}
	complete(&c->recv_done);
}

/* PD, CQ, QP and the buffer of a connection's id; one receive posted. */
static int kcm_setup(struct kcm_conn *c)
{
	struct ib_device *dev = c->id->device;
	struct ib_qp_init_attr attr = {
		.qp_type = IB_QPT_RC,
		.sq_sig_type = IB_SIGNAL_REQ_WR,
		.cap = {
			.max_send_wr = 4,
			.max_recv_wr = 4,
			.max_send_sge = 1,
			.max_recv_sge = 1,
		},
	};
	int err;

	c->pd = ib_alloc_pd(dev, 0);
	if (IS_ERR(c->pd)) {
		err = PTR_ERR(c->pd);
		c->pd = NULL;
		return err;
	}
	c->cq = ib_alloc_cq(dev, c, 16, 0, IB_POLL_WORKQUEUE);
	if (IS_ERR(c->cq)) {
		err = PTR_ERR(c->cq);
		c->cq = NULL;
		return err;
	}
	c->buf = kzalloc(2 * KCM_MSG, GFP_KERNEL);
	if (!c->buf)
		return -ENOMEM;
	c->dma = ib_dma_map_single(dev, c->buf, 2 * KCM_MSG,
				   DMA_BIDIRECTIONAL);
	if (ib_dma_mapping_error(dev, c->dma)) {
		kfree(c->buf);
		c->buf = NULL;
		return -ENOMEM;
	}
	c->recv_cqe.done = kcm_recv_done;
	c->send_cqe.done = kcm_send_done;
	attr.send_cq = c->cq;
	attr.recv_cq = c->cq;
	err = rdma_create_qp(c->id, c->pd, &attr);
	if (err)
		return err;
	c->qp = c->id->qp;
	return kcm_post_recv(c);
}

/* Everything but the id, whose owner destroys it. */
static void kcm_teardown(struct kcm_conn *c)
{
	if (c->qp)
		rdma_destroy_qp(c->id);
	c->qp = NULL;
	if (c->cq)
		ib_free_cq(c->cq);
	c->cq = NULL;
	if (c->buf) {
		ib_dma_unmap_single(c->id->device, c->dma, 2 * KCM_MSG,
				    DMA_BIDIRECTIONAL);
		kfree(c->buf);
	}
	c->buf = NULL;
	if (c->pd)
		ib_dealloc_pd(c->pd);
	c->pd = NULL;
}

static int kcm_qp_state(struct kcm_conn *c)
{
	struct ib_qp_init_attr init;
	struct ib_qp_attr attr;
	int err;

	err = ib_query_qp(c->qp, &attr, IB_QP_STATE, &init);
	return err ? err : attr.qp_state;
}

/*
 * ib_drain_qp() after the connection ended: it returns (it hangs or warns
 * when the driver does not flush), and the receive still posted came back
 * with IB_WC_WR_FLUSH_ERR, exactly once.
 */
static void kcm_drain(struct kcm_conn *c, const char *role)
{
	ib_drain_qp(c->qp);
	CHECK(c->flushed_recv == 1 && c->flushed_send == 0,
	      "%s: drained: %d receive(s), %d send(s) flushed (want 1, 0)",
	      role, c->flushed_recv, c->flushed_send);
	CHECK(kcm_qp_state(c) == IB_QPS_ERR, "%s: QP in ERR after the drain",
	      role);
}

static void kcm_server_drain(struct work_struct *work)
{
	struct kcm_conn *c = container_of(work, struct kcm_conn, drain_work);

	kcm_drain(c, "server");
	pr_info("vt3_kcm: server: %d passed, %d failed\n", passed, failed);
}

static void kcm_conn_param(struct rdma_conn_param *param)
{
	memset(param, 0, sizeof(*param));
	param->responder_resources = 1;
	param->initiator_depth = 1;
	param->private_data = "vt3_kcm";
	param->private_data_len = 8;
}

static int kcm_server_request(struct rdma_cm_id *id,
			      struct rdma_cm_event *event)
{
	struct rdma_conn_param param;
	struct kcm_conn *c;
	int err;

	CHECK(event->param.conn.private_data_len >= 8 &&
	      !memcmp(event->param.conn.private_data, "vt3_kcm", 8),
	      "server: request on %s with the client's private data",
	      id->device->name);
	if (conn)
		return -EBUSY;
	c = kcm_alloc();
	if (!c)
		return -ENOMEM;
	c->id = id;
	id->context = c;
	err = kcm_setup(c);
	if (!err) {
		kcm_conn_param(&param);
		err = rdma_accept(id, &param);
	}
	CHECK(!err, "server: accept (%d)", err);
	if (err) {
		kcm_teardown(c);
		kfree(c);
		return err;	/* rdma_cm destroys the id */
	}
	conn = c;
	return 0;
}

static int kcm_handler(struct rdma_cm_id *id, struct rdma_cm_event *event)
{
	struct kcm_conn *c = id->context;

	pr_info("vt3_kcm: event %s (%d)\n", rdma_event_msg(event->event),
		event->status);
	if (server && event->event == RDMA_CM_EVENT_CONNECT_REQUEST)
		return kcm_server_request(id, event);
	c->event = event->event;
	c->status = event->status;
	switch (event->event) {
	case RDMA_CM_EVENT_ESTABLISHED:
		c->connected = true;
		if (server)
			CHECK(kcm_qp_state(c) == IB_QPS_RTS,
			      "server: QP in RTS once established");
		else
			CHECK(event->param.conn.private_data_len >= 8 &&
			      !memcmp(event->param.conn.private_data,
				      "vt3_kcm", 8),
			      "client: the server's private data");
		break;
	case RDMA_CM_EVENT_DISCONNECTED:
		if (server) {
			CHECK(c->received == rounds,
			      "server: %d messages echoed", c->received);
			/* ib_drain_qp() blocks: not in the rdma_cm handler. */
			schedule_work(&c->drain_work);
		}
		complete(&c->disconnected);
		break;
	default:
		break;
	}
	complete(&c->cm_done);
	return 0;
}

/* Waits for the next rdma_cm event; false on a timeout. */
static bool kcm_wait(struct kcm_conn *c, enum rdma_cm_event_type want)
{
	if (!wait_for_completion_timeout(&c->cm_done, KCM_TIMEOUT)) {
		CHECK(false, "client: no %s in time", rdma_event_msg(want));
		return false;
	}
	reinit_completion(&c->cm_done);
	return CHECK(c->event == want, "client: %s (got %s, status %d)",
		     rdma_event_msg(want), rdma_event_msg(c->event), c->status);
}

/* A connection up to ROUTE_RESOLVED, with its QP. */
static struct kcm_conn *kcm_client_prepare(struct sockaddr_in *dst)
{
	struct kcm_conn *c = kcm_alloc();

	if (!c)
		return NULL;
	c->id = rdma_create_id(&init_net, kcm_handler, c, RDMA_PS_TCP,
			       IB_QPT_RC);
	if (IS_ERR(c->id)) {
		kfree(c);
		return NULL;
	}
	if (rdma_resolve_addr(c->id, NULL, (struct sockaddr *)dst, 5000) ||
	    !kcm_wait(c, RDMA_CM_EVENT_ADDR_RESOLVED) ||
	    rdma_resolve_route(c->id, 5000) ||
	    !kcm_wait(c, RDMA_CM_EVENT_ROUTE_RESOLVED))
		goto fail;
	CHECK(!strncmp(c->id->device->name, "vt3", 3), "client: on %s",
	      c->id->device->name);
	if (!CHECK(!kcm_setup(c), "client: PD, CQ, QP"))
		goto fail;
	return c;

fail:
	kcm_teardown(c);
	rdma_destroy_id(c->id);
	kfree(c);
	return NULL;
}

static void kcm_client_free(struct kcm_conn *c)
{
	kcm_teardown(c);
	rdma_destroy_id(c->id);
	kfree(c);
}

static void kcm_client(void)
{
	struct sockaddr_in dst = { .sin_family = AF_INET };
	struct rdma_conn_param param;
	struct kcm_conn *c;
	int i, err;

	if (!in4_pton(addr, -1, (u8 *)&dst.sin_addr.s_addr, -1, NULL)) {
		CHECK(false, "client: address %s", addr);
		return;
	}
	kcm_conn_param(&param);

	/* Nobody listens: the peer's TCP answers with an RST. */
	dst.sin_port = htons(closed_port);
	c = kcm_client_prepare(&dst);
	if (!c)
		return;
	err = rdma_connect(c->id, &param);
	if (CHECK(!err, "client: connect to port %u (%d)", closed_port, err) &&
	    kcm_wait(c, RDMA_CM_EVENT_REJECTED))
		kcm_drain(c, "client (refused)");
	kcm_client_free(c);

	dst.sin_port = htons(port);
	c = kcm_client_prepare(&dst);
	if (!c)
		return;
	err = rdma_connect(c->id, &param);
	if (!CHECK(!err, "client: connect (%d)", err) ||
	    !kcm_wait(c, RDMA_CM_EVENT_ESTABLISHED))
		goto out;
	CHECK(kcm_qp_state(c) == IB_QPS_RTS, "client: QP in RTS");
	for (i = 0; i < rounds; i++) {
		memset(c->buf + KCM_MSG, 'a' + i % 26, KCM_MSG);
		if (kcm_post_recv(c) || kcm_post_send(c)) {
			CHECK(false, "client: message %d posted", i);
			break;
		}
		if (!wait_for_completion_timeout(&c->recv_done, KCM_TIMEOUT)) {
			CHECK(false, "client: echo %d in time", i);
			break;
		}
		if (c->buf[0] != 'a' + i % 26 ||
		    memcmp(c->buf, c->buf + KCM_MSG, KCM_MSG)) {
			CHECK(false, "client: echo %d matches", i);
			break;
		}
	}
	CHECK(i == rounds, "client: %d of %d echoes", i, rounds);
	err = rdma_disconnect(c->id);
	CHECK(!err, "client: disconnect (%d)", err);
	if (kcm_wait(c, RDMA_CM_EVENT_DISCONNECTED)) {
		CHECK(kcm_qp_state(c) == IB_QPS_ERR, "client: QP in ERR");
		kcm_drain(c, "client");
	}
out:
	kcm_client_free(c);
	pr_info("vt3_kcm: client: %d passed, %d failed\n", passed, failed);
}

static int kcm_server(void)
{
	struct sockaddr_in src = {
		.sin_family = AF_INET,
		.sin_port = htons(port),
	};
	int err;

	if (!in4_pton(addr, -1, (u8 *)&src.sin_addr.s_addr, -1, NULL))
		return -EINVAL;
	listener = kcm_alloc();
	if (!listener)
		return -ENOMEM;
	listener->id = rdma_create_id(&init_net, kcm_handler, listener,
				      RDMA_PS_TCP, IB_QPT_RC);
	if (IS_ERR(listener->id)) {
		err = PTR_ERR(listener->id);
		goto fail;
	}
	err = rdma_bind_addr(listener->id, (struct sockaddr *)&src);
	if (!err)
		err = rdma_listen(listener->id, 4);
	if (!err)
		return 0;
	rdma_destroy_id(listener->id);
fail:
	kfree(listener);
	listener = NULL;
	return err;
}

static int __init kcm_init(void)
{
	if (server)
		return kcm_server();
	kcm_client();
	return 0;
}

static void __exit kcm_exit(void)
{
	if (!server)
		return;
	rdma_destroy_id(listener->id);
	kfree(listener);
	if (conn) {
		if (conn->connected && !completion_done(&conn->disconnected))
			rdma_disconnect(conn->id);
		flush_work(&conn->drain_work);
		kcm_teardown(conn);
		rdma_destroy_id(conn->id);
		kfree(conn);
	}
}

module_init(kcm_init);
module_exit(kcm_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("vt3.ko connection test (kernel rdma_cm ULP)");
