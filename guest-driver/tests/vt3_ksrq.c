// SPDX-License-Identifier: GPL-2.0
/*
 * vt3_ksrq: a kernel SRQ as a kernel ULP uses one (ib_create_srq,
 * ib_post_srq_recv, QPs created with init_attr.srq), over two connections
 * from a vt3-srqtest peer (guest-tools/vt3-srqtest.c, "peer" mode).
 *
 *   insmod vt3_ksrq.ko [port=P] [msgs=N] [lost=1]  (returns when the run ended)
 *
 * It listens on 0.0.0.0:P; for the first connection request it creates a
 * PD, an IB_POLL_DIRECT CQ per direction and one SRQ on the request's
 * device, posts SRQ_POSTED receives into it, and accepts two connections
 * whose QPs take their receives from it; the peer sends message 0 on each
 * as soon as it is connected (an MPA responder may not send first). Then
 * it asks the peer (a SEND on
 * QP 2, vt3-srqtest's control message) for N SENDs on each QP and checks
 * each receive completion: its wr_id is one of ours and completes once,
 * wc->qp is the QP the message was sent on, in order per QP, the data is
 * intact; the SRQ is resized (IB_SRQ_MAX_WR) while the peer sends,
 * refused below what is posted; destroy while the QPs use the SRQ is
 * refused (-EBUSY); each QP
 * moved to ERR reports IB_EVENT_QP_LAST_WQE_REACHED once, and their error
 * flushes none of the SRQ's receives still posted; after the QPs are
 * destroyed, nothing more completes (the receives left in the SRQ
 * complete nowhere) and the SRQ is destroyed. With lost=1 it logs
 * "vt3_ksrq: READY-LOST" after the receives and waits for the host to make
 * the device fatal (vt3d ctl fault device-fatal): IB_EVENT_DEVICE_FATAL,
 * LAST_WQE_REACHED on both QPs, a post after the loss is taken, and every
 * SRQ receive not completed (those never taken, that one too) completes
 * once with IB_WC_WR_FLUSH_ERR, all on one of the QPs (vt3_hw.h's
 * device-loss rule), nothing more after. Logs
 * "vt3_ksrq: N passed, N failed".
 */
#include <linux/completion.h>
#include <linux/delay.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>

static ushort port = 7476;
module_param(port, ushort, 0444);
MODULE_PARM_DESC(port, "the port to listen on");
static int msgs = 10;
module_param(msgs, int, 0444);
MODULE_PARM_DESC(msgs, "SENDs the peer makes on each QP (at most 15)");
static bool lost;
module_param(lost, bool, 0444);
MODULE_PARM_DESC(lost, "wait for the device to be made fatal, then check the SRQ's flush");

/* vt3-srqtest's wire format. */
#define MAGIC		0x76743373u
#define MSG_SIZE	256
#define CTRL_SEND	1
#define CTRL_DONE	2
#define SRQ_WR		64
#define SRQ_POSTED	32
#define LOST_POSTED	2		/* posted after the loss (lost=1) */
#define KSRQ_TIMEOUT	(60 * HZ)

struct ksrq_ctrl {
	__u32 magic;
	__u32 op;
	__u32 n[2];
};

struct ksrq_msg {
	__u32 magic;
	__u32 qp;
	__u32 seq;
	__u32 len;
};

static int passed, failed;

#define CHECK(cond, fmt, ...)						\
	({								\
		bool __ok = (cond);					\
		if (__ok)						\
			passed++;					\
		else							\
			failed++;					\
		pr_info("vt3_ksrq: %s " fmt "\n", __ok ? "ok  " : "FAIL",\
			##__VA_ARGS__);					\
		__ok;							\
	})

struct ksrq {
	struct rdma_cm_id *listen;
	struct rdma_cm_id *id[2];
	struct ib_qp *qp[2];
	int nconn;
	struct completion established;	/* both connections up */
	struct ib_pd *pd;
	struct ib_cq *rcq, *scq;
	struct ib_srq *srq;
	u8 *buf;			/* SRQ_POSTED slots, then the control message */
	u64 dma;
	u8 done[SRQ_POSTED + LOST_POSTED + 1];	/* completions per wr_id */
	atomic_t last_wqe[2];
	struct ib_event_handler fatal_handler;
	struct completion fatal;
	int setup_err;
};

static struct ksrq ks;

static size_t ksrq_buf_len(void)
{
	return (size_t)(SRQ_POSTED + 1) * MSG_SIZE;
}

static void ksrq_qp_event(struct ib_event *ev, void *ctx)
{
	long q = (long)ctx;

	if (ev->event == IB_EVENT_QP_LAST_WQE_REACHED && ev->element.qp == ks.qp[q])
		atomic_inc(&ks.last_wqe[q]);
	else
		pr_info("vt3_ksrq: QP %ld: event %s\n", q + 1, ib_event_msg(ev->event));
}

static void ksrq_dev_event(struct ib_event_handler *h, struct ib_event *ev)
{
	if (ev->event == IB_EVENT_DEVICE_FATAL)
		complete(&ks.fatal);
}

static void ksrq_srq_event(struct ib_event *ev, void *ctx)
{
	pr_info("vt3_ksrq: SRQ event %s\n", ib_event_msg(ev->event));
}

/* PD, CQs, the SRQ with SRQ_POSTED receives: on the first request's device. */
static int ksrq_setup(struct ib_device *dev)
{
	struct ib_srq_init_attr init = {
		.event_handler = ksrq_srq_event,
		.srq_type = IB_SRQT_BASIC,
		.attr = { .max_wr = SRQ_WR, .max_sge = 1 },
	};
	struct ib_srq_attr attr;
	int i, err;

	ks.pd = ib_alloc_pd(dev, 0);
	if (IS_ERR(ks.pd))
		return PTR_ERR(ks.pd);
	ks.rcq = ib_alloc_cq(dev, NULL, 64, 0, IB_POLL_DIRECT);
	if (IS_ERR(ks.rcq))
		return PTR_ERR(ks.rcq);
	ks.scq = ib_alloc_cq(dev, NULL, 16, 0, IB_POLL_DIRECT);
	if (IS_ERR(ks.scq))
		return PTR_ERR(ks.scq);
	ks.buf = kzalloc(ksrq_buf_len(), GFP_KERNEL);
	if (!ks.buf)
		return -ENOMEM;
	ks.dma = ib_dma_map_single(dev, ks.buf, ksrq_buf_len(), DMA_BIDIRECTIONAL);
	if (ib_dma_mapping_error(dev, ks.dma)) {
		kfree(ks.buf);
		ks.buf = NULL;
		return -ENOMEM;
	}
	ks.srq = ib_create_srq(ks.pd, &init);
	if (!CHECK(!IS_ERR(ks.srq), "ib_create_srq on %s (%ld)", dev->name,
		   IS_ERR(ks.srq) ? PTR_ERR(ks.srq) : 0)) {
		err = PTR_ERR(ks.srq);
		ks.srq = NULL;
		return err;
	}
	err = ib_query_srq(ks.srq, &attr);
	CHECK(!err && attr.max_wr >= SRQ_WR && attr.max_sge >= 1 && init.attr.max_wr >= SRQ_WR,
	      "ib_query_srq (%d): max_wr %u, max_sge %u", err, attr.max_wr, attr.max_sge);
	for (i = 1; i <= SRQ_POSTED; i++) {
		struct ib_sge sge = {
			.addr = ks.dma + (u64)(i - 1) * MSG_SIZE,
			.length = MSG_SIZE,
			.lkey = ks.pd->local_dma_lkey,
		};
		struct ib_recv_wr wr = { .wr_id = i, .sg_list = &sge, .num_sge = 1 };

		err = ib_post_srq_recv(ks.srq, &wr, NULL);
		if (err)
			break;
	}
	CHECK(!err, "ib_post_srq_recv of %d receives (%d)", SRQ_POSTED, err);
	return err;
}

static int ksrq_request(struct rdma_cm_id *id)
{
	struct rdma_conn_param param = { .responder_resources = 1, .initiator_depth = 1 };
	struct ib_qp_init_attr attr = {
		.qp_type = IB_QPT_RC,
		.sq_sig_type = IB_SIGNAL_REQ_WR,
		.cap = { .max_send_wr = 4, .max_send_sge = 1 },
		.event_handler = ksrq_qp_event,
	};
	int q = ks.nconn, err;

	if (q >= 2)
		return -EBUSY;
	if (!q) {
		err = ksrq_setup(id->device);
		if (err) {
			ks.setup_err = err;
			complete(&ks.established);
			return err;
		}
	}
	attr.qp_context = (void *)(long)q;
	attr.send_cq = ks.scq;
	attr.recv_cq = ks.rcq;
	attr.srq = ks.srq;
	err = rdma_create_qp(id, ks.pd, &attr);
	CHECK(!err, "QP %d on the SRQ (%d)", q + 1, err);
	if (err)
		return err;
	ks.id[q] = id;
	ks.qp[q] = id->qp;
	ks.nconn++;
	err = rdma_accept(id, &param);
	if (err) {
		rdma_destroy_qp(id);
		ks.id[q] = NULL;
		ks.qp[q] = NULL;
	}
	return err;
}

static int ksrq_handler(struct rdma_cm_id *id, struct rdma_cm_event *ev)
{
	pr_info("vt3_ksrq: event %s (%d)\n", rdma_event_msg(ev->event), ev->status);
	switch (ev->event) {
	case RDMA_CM_EVENT_CONNECT_REQUEST:
		/* An error destroys the id (rdma_cm). */
		return ksrq_request(id);
	case RDMA_CM_EVENT_ESTABLISHED:
		if (id == ks.id[1])
			complete(&ks.established);
		break;
	default:
		break;
	}
	return 0;
}

static void fill_ctrl(u32 op, u32 n1, u32 n2)
{
	struct ksrq_ctrl *c = (struct ksrq_ctrl *)(ks.buf + SRQ_POSTED * MSG_SIZE);

	c->magic = MAGIC;
	c->op = op;
	c->n[0] = n1;
	c->n[1] = n2;
}

/* A control message on QP 2, and its send completion. */
static int ksrq_ctrl(u32 op, u32 n1, u32 n2)
{
	struct ib_device *dev = ks.id[1]->device;
	struct ib_sge sge = {
		.addr = ks.dma + SRQ_POSTED * MSG_SIZE,
		.length = sizeof(struct ksrq_ctrl),
		.lkey = ks.pd->local_dma_lkey,
	};
	struct ib_send_wr wr = {
		.wr_id = 0xc0,
		.sg_list = &sge,
		.num_sge = 1,
		.opcode = IB_WR_SEND,
		.send_flags = IB_SEND_SIGNALED,
	};
	unsigned long end = jiffies + KSRQ_TIMEOUT;
	struct ib_wc wc;
	int err, n;

	fill_ctrl(op, n1, n2);
	ib_dma_sync_single_for_device(dev, sge.addr, sge.length, DMA_TO_DEVICE);
	err = ib_post_send(ks.qp[1], &wr, NULL);
	if (err)
		return err;
	while (time_before(jiffies, end)) {
		n = ib_poll_cq(ks.scq, 1, &wc);
		if (n == 1)
			return wc.status == IB_WC_SUCCESS && wc.wr_id == 0xc0 ? 0 : -EIO;
		msleep(1);
	}
	return -ETIMEDOUT;
}

static bool intact(const u8 *buf, u32 q, u32 seq)
{
	const struct ksrq_msg *m = (const struct ksrq_msg *)buf;
	u32 i;

	if (m->magic != MAGIC || m->qp != q || m->seq != seq || m->len != MSG_SIZE)
		return false;
	for (i = sizeof(*m); i < MSG_SIZE; i++)
		if (buf[i] != (u8)(i * 7 + q * 31 + seq * 13))
			return false;
	return true;
}

/* lost=1: the device is made fatal under the SRQ (vt3_hw.h device loss). */
static void ksrq_lost(void)
{
	int want = SRQ_POSTED - 2 * msgs - 2 + LOST_POSTED;
	int got = 0, flushed = 0, dup = 0, on[2] = { 0, 0 }, n, i, err = 0;
	unsigned long end;
	struct ib_wc wc[8];
	bool fatal;

	INIT_IB_EVENT_HANDLER(&ks.fatal_handler, ks.pd->device, ksrq_dev_event);
	ib_register_event_handler(&ks.fatal_handler);
	pr_info("vt3_ksrq: READY-LOST\n");
	fatal = wait_for_completion_timeout(&ks.fatal, KSRQ_TIMEOUT);
	/* vt3.ko raises LAST_WQE_REACHED per QP, then DEVICE_FATAL. */
	msleep(200);
	CHECK(fatal && atomic_read(&ks.last_wqe[0]) == 1 &&
	      atomic_read(&ks.last_wqe[1]) == 1,
	      "DEVICE_FATAL, LAST_WQE_REACHED on both QPs (%d, %d)",
	      atomic_read(&ks.last_wqe[0]), atomic_read(&ks.last_wqe[1]));
	/* Two more, into the slots of WRs that completed (1 and 2). */
	for (i = 0; i < LOST_POSTED && !err; i++) {
		struct ib_sge sge = {
			.addr = ks.dma + (u64)i * MSG_SIZE,
			.length = MSG_SIZE,
			.lkey = ks.pd->local_dma_lkey,
		};
		struct ib_recv_wr wr = { .wr_id = SRQ_POSTED + 1 + i, .sg_list = &sge, .num_sge = 1 };

		err = ib_post_srq_recv(ks.srq, &wr, NULL);
	}
	CHECK(!err, "ib_post_srq_recv after the loss (%d)", err);
	end = jiffies + KSRQ_TIMEOUT;
	while (got < want && time_before(jiffies, end)) {
		n = ib_poll_cq(ks.rcq, ARRAY_SIZE(wc), wc);
		if (!n)
			msleep(1);
		for (i = 0; i < n; i++, got++) {
			u64 id = wc[i].wr_id;

			if (id < 1 || id > SRQ_POSTED + LOST_POSTED || ks.done[id]++)
				dup++;
			if (wc[i].status == IB_WC_WR_FLUSH_ERR)
				flushed++;
			if (wc[i].qp == ks.qp[0])
				on[0]++;
			else if (wc[i].qp == ks.qp[1])
				on[1]++;
		}
	}
	CHECK(got == want && flushed == want && !dup && (on[0] == want || on[1] == want),
	      "%d of %d SRQ receives flushed once (%d FLUSH_ERR, %d unknown/twice), all on one QP (%d, %d)",
	      got, want, flushed, dup, on[0], on[1]);
	msleep(1000);
	n = ib_poll_cq(ks.rcq, ARRAY_SIZE(wc), wc);
	for (i = 1, got = 0; i <= SRQ_POSTED + LOST_POSTED; i++)
		got += ks.done[i] == 1;
	CHECK(n == 0 && got == SRQ_POSTED + LOST_POSTED,
	      "nothing more (%d); %d of %d receives completed exactly once", n, got,
	      SRQ_POSTED + LOST_POSTED);
	ib_unregister_event_handler(&ks.fatal_handler);
}

/*
 * Resize while the peer sends (IB_SRQ_MAX_WR): below the receives posted
 * and not completed is -EINVAL; twice the size is taken, and the
 * receives posted before complete once each (the checks that follow).
 */
static void ksrq_resize(void)
{
	struct ib_srq_attr attr = { .max_wr = SRQ_POSTED - 1 };
	int err;

	err = ib_modify_srq(ks.srq, &attr, IB_SRQ_MAX_WR);
	CHECK(err == -EINVAL, "resize to %d with %d posted refused (%d)",
	      SRQ_POSTED - 1, SRQ_POSTED, err);
	attr.max_wr = 2 * SRQ_WR;
	err = ib_modify_srq(ks.srq, &attr, IB_SRQ_MAX_WR);
	if (!err) {
		memset(&attr, 0, sizeof(attr));
		err = ib_query_srq(ks.srq, &attr);
	}
	CHECK(!err && attr.max_wr >= 2 * SRQ_WR,
	      "resize to %d while the peer sends (%d): max_wr %u", 2 * SRQ_WR,
	      err, attr.max_wr);
}

static void ksrq_run(void)
{
	unsigned long end;
	int got = 0, bad = 0, dup = 0, wrongqp = 0, n, q, i, err;
	u32 seq[2] = { 0, 0 };
	struct ib_wc wc[8];

	err = ib_destroy_srq_user(ks.srq, NULL);
	CHECK(err == -EBUSY, "destroy of the SRQ while 2 QPs use it refused (%d)", err);
	if (!err) {
		ks.srq = NULL;
		return;
	}
	err = ksrq_ctrl(CTRL_SEND, msgs, msgs);
	if (!CHECK(!err, "control SEND to the peer (%d)", err))
		return;
	ksrq_resize();
	end = jiffies + KSRQ_TIMEOUT;
	while (got < 2 * msgs + 2 && time_before(jiffies, end)) {
		n = ib_poll_cq(ks.rcq, ARRAY_SIZE(wc), wc);
		if (!n)
			msleep(1);
		for (i = 0; i < n; i++, got++) {
			u64 id = wc[i].wr_id;

			q = wc[i].qp == ks.qp[0] ? 0 : wc[i].qp == ks.qp[1] ? 1 : -1;
			if (id < 1 || id > SRQ_POSTED + LOST_POSTED || ks.done[id]++) {
				dup++;
				pr_info("vt3_ksrq: wr_id %llu: unknown or twice\n", id);
				continue;
			}
			if (q < 0) {
				wrongqp++;
				continue;
			}
			ib_dma_sync_single_for_cpu(ks.id[0]->device,
						   ks.dma + (id - 1) * MSG_SIZE, MSG_SIZE,
						   DMA_FROM_DEVICE);
			if (wc[i].status != IB_WC_SUCCESS || wc[i].opcode != IB_WC_RECV ||
			    wc[i].byte_len != MSG_SIZE ||
			    !intact(ks.buf + (id - 1) * MSG_SIZE, q, seq[q])) {
				bad++;
				pr_info("vt3_ksrq: wr_id %llu on QP %d: status %d, %u bytes, not message %u\n",
					id, q + 1, wc[i].status, wc[i].byte_len, seq[q]);
			}
			seq[q]++;
		}
	}
	CHECK(got == 2 * msgs + 2 && seq[0] == msgs + 1 && seq[1] == msgs + 1 && !bad && !dup &&
	      !wrongqp,
	      "%d of %d receives from the SRQ: QP 1 %u, QP 2 %u in order, %d bad, %d unknown/twice, %d wrong wc->qp",
	      got, 2 * msgs + 2, seq[0], seq[1], bad, dup, wrongqp);
	if (lost)
		ksrq_lost();
	else
		CHECK(!ksrq_ctrl(CTRL_DONE, 0, 0), "control DONE to the peer");
}

/* QPs to ERR (one LAST_WQE_REACHED each), destroyed; nothing completes after. */
static void ksrq_teardown(void)
{
	struct ib_qp_attr attr = { .qp_state = IB_QPS_ERR };
	unsigned long end;
	struct ib_wc wc;
	int q, n = 0, err;

	for (q = 0; q < 2; q++) {
		if (!ks.id[q])
			continue;
		rdma_disconnect(ks.id[q]);
		ib_modify_qp(ks.qp[q], &attr, IB_QP_STATE);
	}
	if (ks.id[0] && ks.id[1]) {
		end = jiffies + 10 * HZ;
		while (time_before(jiffies, end) &&
		       (atomic_read(&ks.last_wqe[0]) < 1 || atomic_read(&ks.last_wqe[1]) < 1))
			msleep(20);
		msleep(500);
		CHECK(atomic_read(&ks.last_wqe[0]) == 1 && atomic_read(&ks.last_wqe[1]) == 1,
		      "QP_LAST_WQE_REACHED once per QP (%d, %d)",
		      atomic_read(&ks.last_wqe[0]), atomic_read(&ks.last_wqe[1]));
		/* A QP error leaves the SRQ's WRs to the SRQ (vt3_hw.h). */
		end = jiffies + HZ;
		while (time_before(jiffies, end)) {
			n += ib_poll_cq(ks.rcq, 1, &wc);
			msleep(10);
		}
		CHECK(n == 0, "no SRQ receive flushed by the QPs' error (%d completions)", n);
		n = 0;
	}
	for (q = 0; q < 2; q++)
		if (ks.id[q])
			rdma_destroy_qp(ks.id[q]);
	if (ks.rcq) {
		n = ib_poll_cq(ks.rcq, 1, &wc);
		if (ks.srq)
			CHECK(n == 0, "no completion after the QPs were destroyed (%d)", n);
	}
	if (ks.srq) {
		err = ib_destroy_srq_user(ks.srq, NULL);
		CHECK(!err, "ib_destroy_srq with %d receives never taken (%d)",
		      SRQ_POSTED - 2 * msgs - 2, err);
	}
	for (q = 0; q < 2; q++)
		if (ks.id[q])
			rdma_destroy_id(ks.id[q]);
	if (ks.buf) {
		ib_dma_unmap_single(ks.pd->device, ks.dma, ksrq_buf_len(), DMA_BIDIRECTIONAL);
		kfree(ks.buf);
	}
	if (!IS_ERR_OR_NULL(ks.scq))
		ib_free_cq(ks.scq);
	if (!IS_ERR_OR_NULL(ks.rcq))
		ib_free_cq(ks.rcq);
	if (!IS_ERR_OR_NULL(ks.pd))
		ib_dealloc_pd(ks.pd);
}

static int __init ksrq_init(void)
{
	struct sockaddr_in src = { .sin_family = AF_INET, .sin_port = htons(port) };
	int err;

	if (msgs < 1 || 2 * msgs + 2 > SRQ_POSTED)
		return -EINVAL;
	init_completion(&ks.established);
	init_completion(&ks.fatal);
	ks.listen = rdma_create_id(&init_net, ksrq_handler, NULL, RDMA_PS_TCP, IB_QPT_RC);
	if (IS_ERR(ks.listen))
		return PTR_ERR(ks.listen);
	err = rdma_bind_addr(ks.listen, (struct sockaddr *)&src);
	if (!err)
		err = rdma_listen(ks.listen, 4);
	if (err) {
		rdma_destroy_id(ks.listen);
		return err;
	}
	pr_info("vt3_ksrq: listening on port %u\n", port);
	if (!wait_for_completion_timeout(&ks.established, KSRQ_TIMEOUT))
		CHECK(false, "two connections in time (%d)", ks.nconn);
	else if (!ks.setup_err)
		ksrq_run();
	/* No new connection from here on. */
	rdma_destroy_id(ks.listen);
	ksrq_teardown();
	pr_info("vt3_ksrq: %d passed, %d failed\n", passed, failed);
	return 0;
}

static void __exit ksrq_exit(void)
{
}

module_init(ksrq_init);
module_exit(ksrq_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("vt3.ko kernel SRQ test (kernel rdma_cm ULP, vt3-srqtest peer)");
