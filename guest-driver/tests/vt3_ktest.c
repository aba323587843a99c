// SPDX-License-Identifier: GPL-2.0
/*
 * vt3_ktest: exercises vt3.ko's kernel-ULP paths (kernel PD with its DMA
 * MR, CQ, QP, posting, state changes) the way a kernel ULP would. On
 * load it runs against every vt3 device present and logs
 * "vt3_ktest: <dev>: N passed, N failed"; unload it afterwards.
 */
#include <linux/module.h>
#include <linux/slab.h>
#include <rdma/ib_verbs.h>

static int passed, failed;

#define CHECK(cond, fmt, ...)						\
	do {								\
		if (cond) {						\
			passed++;					\
			pr_info("vt3_ktest: ok   " fmt "\n", ##__VA_ARGS__); \
		} else {						\
			failed++;					\
			pr_info("vt3_ktest: FAIL " fmt "\n", ##__VA_ARGS__); \
		}							\
	} while (0)

static int vt3_ktest_modify(struct ib_qp *qp, enum ib_qp_state state)
{
	struct ib_qp_attr attr = { .qp_state = state };

	return ib_modify_qp(qp, &attr, IB_QP_STATE);
}

static void vt3_ktest_run(struct ib_device *dev)
{
	struct ib_qp_init_attr init = {}, qinit;
	const struct ib_recv_wr *bad_recv;
	const struct ib_send_wr *bad_send;
	struct ib_recv_wr rwr = {};
	struct ib_send_wr swr = {};
	struct ib_qp_attr qattr;
	struct ib_wc wc[8];
	int nsend, nrecv, nflush, n, last_recv, round;
	struct ib_sge sge;
	struct ib_pd *pd;
	struct ib_cq *cq;
	struct ib_qp *qp;
	u64 dma;
	void *buf;
	int err, i;

	pd = ib_alloc_pd(dev, 0);
	CHECK(!IS_ERR(pd), "%s: ib_alloc_pd (local_dma_lkey %#x)", dev->name,
	      IS_ERR(pd) ? 0 : pd->local_dma_lkey);
	if (IS_ERR(pd))
		return;
	/* Polled here: the WRs carry wr_ids, not wr_cqes. */
	cq = ib_alloc_cq(dev, NULL, 64, 0, IB_POLL_DIRECT);
	CHECK(!IS_ERR(cq), "ib_alloc_cq 64 (cqe %d)", IS_ERR(cq) ? 0 : cq->cqe);
	if (IS_ERR(cq))
		goto out_pd;

	init.qp_type = IB_QPT_RC;
	init.send_cq = cq;
	init.recv_cq = cq;
	init.sq_sig_type = IB_SIGNAL_REQ_WR;
	init.cap.max_send_wr = 16;
	init.cap.max_recv_wr = 16;
	init.cap.max_send_sge = 2;
	init.cap.max_recv_sge = 2;
	init.cap.max_inline_data = 16;
	qp = ib_create_qp(pd, &init);
	CHECK(IS_ERR(qp) && PTR_ERR(qp) == -EINVAL,
	      "kernel QP with inline data refused");
	if (!IS_ERR(qp))
		ib_destroy_qp(qp);
	init.cap.max_inline_data = 0;
	init.qp_type = IB_QPT_UD;
	qp = ib_create_qp(pd, &init);
	CHECK(IS_ERR(qp), "UD QP refused");
	if (!IS_ERR(qp))
		ib_destroy_qp(qp);
	init.qp_type = IB_QPT_RC;
	qp = ib_create_qp(pd, &init);
	CHECK(!IS_ERR(qp), "ib_create_qp RC (qpn %u, send wr %u)",
	      IS_ERR(qp) ? 0 : qp->qp_num, init.cap.max_send_wr);
	if (IS_ERR(qp))
		goto out_cq;

	buf = kzalloc(4096, GFP_KERNEL);
	dma = ib_dma_map_single(dev, buf, 4096, DMA_BIDIRECTIONAL);
	CHECK(!ib_dma_mapping_error(dev, dma) && dma == virt_to_phys(buf),
	      "DMA address is guest-physical");
	sge.addr = dma;
	sge.length = 4096;
	sge.lkey = pd->local_dma_lkey;

	rwr.wr_id = 1;
	rwr.sg_list = &sge;
	rwr.num_sge = 1;
	/* A new QP is INIT (an RNIC's IDLE); in RESET it takes no work. */
	err = vt3_ktest_modify(qp, IB_QPS_RESET);
	CHECK(!err, "INIT -> RESET (%d)", err);
	err = ib_post_recv(qp, &rwr, &bad_recv);
	CHECK(err == -EINVAL, "post_recv in RESET refused (%d)", err);
	err = vt3_ktest_modify(qp, IB_QPS_INIT);
	CHECK(!err, "RESET -> INIT (%d)", err);
	for (i = 0; i < 16; i++) {
		err = ib_post_recv(qp, &rwr, &bad_recv);
		if (err)
			break;
	}
	CHECK(i == 16, "16 receives posted (%d)", err);
	err = ib_post_recv(qp, &rwr, &bad_recv);
	CHECK(err == -ENOMEM && bad_recv == &rwr, "17th receive: ring full (%d)",
	      err);
	swr.wr_id = 2;
	swr.opcode = IB_WR_SEND;
	swr.send_flags = IB_SEND_SIGNALED;
	swr.sg_list = &sge;
	swr.num_sge = 1;
	err = ib_post_send(qp, &swr, &bad_send);
	CHECK(!err, "post_send SEND (%d)", err);
	swr.opcode = IB_WR_ATOMIC_CMP_AND_SWP;
	err = ib_post_send(qp, &swr, &bad_send);
	CHECK(err == -EINVAL && bad_send == &swr, "atomic WR refused (%d)", err);
	swr.opcode = IB_WR_SEND;
	swr.num_sge = 3;
	err = ib_post_send(qp, &swr, &bad_send);
	CHECK(err == -EINVAL, "3 SGEs on a 2-SGE QP refused (%d)", err);

	err = ib_query_qp(qp, &qattr, IB_QP_STATE | IB_QP_CAP, &qinit);
	CHECK(!err && qattr.qp_state == IB_QPS_INIT &&
	      qattr.cap.max_recv_wr == 16,
	      "query_qp: state %d recv wr %u", qattr.qp_state,
	      qattr.cap.max_recv_wr);
	err = ib_req_notify_cq(cq, IB_CQ_NEXT_COMP | IB_CQ_REPORT_MISSED_EVENTS);
	CHECK(err >= 0, "req_notify_cq (%d)", err);
	err = ib_poll_cq(cq, 4, wc);
	CHECK(err == 0, "nothing to poll (%d)", err);
	err = vt3_ktest_modify(qp, IB_QPS_RTS);
	CHECK(err, "INIT -> RTS refused without a connection (%d)", err);
	err = vt3_ktest_modify(qp, IB_QPS_ERR);
	CHECK(!err, "INIT -> ERR (%d)", err);

	/* The driver flushes kernel QPs: posts in ERR complete flushed. */
	rwr.wr_id = 3;
	err = ib_post_recv(qp, &rwr, &bad_recv);
	CHECK(err == -ENOMEM, "post_recv in ERR: the RQ is still full (%d)", err);
	swr.wr_id = 4;
	swr.num_sge = 1;
	swr.send_flags = 0;
	err = ib_post_send(qp, &swr, &bad_send);
	CHECK(!err, "unsignaled post_send in ERR accepted (%d)", err);
	err = ib_req_notify_cq(cq, IB_CQ_NEXT_COMP | IB_CQ_REPORT_MISSED_EVENTS);
	CHECK(err > 0, "flush completions reported as missed events (%d)", err);
	for (round = 0; round < 2; round++) {
		nsend = nrecv = nflush = 0;
		last_recv = 0;
		while ((n = ib_poll_cq(cq, ARRAY_SIZE(wc), wc)) > 0) {
			for (i = 0; i < n; i++) {
				nflush += wc[i].status == IB_WC_WR_FLUSH_ERR &&
					  wc[i].qp == qp;
				if (wc[i].opcode == IB_WC_RECV) {
					nrecv++;
					last_recv = wc[i].wr_id;
				} else if (wc[i].opcode == IB_WC_SEND) {
					nsend++;
				}
			}
		}
		if (round == 0) {
			CHECK(n == 0 && nsend == 2 && nrecv == 16 &&
			      nflush == 18,
			      "flushed: %d sends, %d receives, %d FLUSH_ERR (want 2, 16, 18)",
			      nsend, nrecv, nflush);
			/* Room again: */
			err = ib_post_recv(qp, &rwr, &bad_recv);
			CHECK(!err, "post_recv in ERR accepted (%d)", err);
		} else {
			CHECK(n == 0 && nsend == 0 && nrecv == 1 &&
			      nflush == 1 && last_recv == 3,
			      "flushed: %d sends, %d receives (wr %d), %d FLUSH_ERR (want 0, 1 (3), 1)",
			      nsend, nrecv, last_recv, nflush);
		}
	}
	err = ib_req_notify_cq(cq, IB_CQ_NEXT_COMP | IB_CQ_REPORT_MISSED_EVENTS);
	CHECK(err == 0, "nothing missed after the flush (%d)", err);

	/*
	 * A destroyed QP's completions are never delivered (ULPs dereference
	 * wc->qp): work it still owed goes with it.
	 */
	rwr.wr_id = 5;
	err = ib_post_recv(qp, &rwr, &bad_recv);
	CHECK(!err, "post_recv in ERR accepted (%d)", err);

	ib_dma_unmap_single(dev, dma, 4096, DMA_BIDIRECTIONAL);
	kfree(buf);
	err = ib_destroy_qp(qp);
	CHECK(!err, "ib_destroy_qp (%d)", err);
	n = ib_poll_cq(cq, ARRAY_SIZE(wc), wc);
	CHECK(n == 0, "nothing of the destroyed QP (%d)", n);
	n = ib_poll_cq(cq, ARRAY_SIZE(wc), wc);
	CHECK(n == 0, "nothing more (%d)", n);
out_cq:
	ib_free_cq(cq);
out_pd:
	ib_dealloc_pd(pd);
	pr_info("vt3_ktest: %s: %d passed, %d failed\n", dev->name, passed,
		failed);
}

static int vt3_ktest_add(struct ib_device *dev)
{
	if (!strncmp(dev->name, "vt3", 3))
		vt3_ktest_run(dev);
	return 0;
}

static void vt3_ktest_remove(struct ib_device *dev, void *data)
{
}

static struct ib_client vt3_ktest_client = {
	.name = "vt3_ktest",
	.add = vt3_ktest_add,
	.remove = vt3_ktest_remove,
};

static int __init vt3_ktest_init(void)
{
	return ib_register_client(&vt3_ktest_client);
}

static void __exit vt3_ktest_exit(void)
{
	ib_unregister_client(&vt3_ktest_client);
}

module_init(vt3_ktest_init);
module_exit(vt3_ktest_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("vt3.ko kernel-verbs test");
