// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
/*
 * vt3-wrcheck-idle: a program that leaves work behind, for libvt3's
 * VT3_WRCHECK (docs/wrcheck.md). It posts receives to an RC QP in INIT
 * (no connection needed) and to an SRQ, all with one wr_id, and destroys
 * both without polling: what wrcheck must call unpolled, never lost.
 *
 *   vt3-wrcheck-idle [RECV [SRQ]]     (defaults 5 and 3; the first vt3 device)
 *
 * Prints "qp_num Q recv N srq H posted M" and exits 0, or says what
 * failed and exits 1.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <infiniband/verbs.h>

#define WR_ID 7		/* every WR the same: wrcheck must not key on it */

static int fail(const char *what, int err)
{
	fprintf(stderr, "vt3-wrcheck-idle: %s: %s\n", what, strerror(err));
	return 1;
}

static struct ibv_context *open_vt3(void)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_context *ctx = NULL;
	int i;

	for (i = 0; list && list[i]; i++)
		if (!strncmp(ibv_get_device_name(list[i]), "vt3", 3)) {
			ctx = ibv_open_device(list[i]);
			break;
		}
	if (list)
		ibv_free_device_list(list);
	return ctx;
}

static int post_recvs(struct ibv_qp *qp, struct ibv_srq *srq, int n)
{
	struct ibv_recv_wr wr = { .wr_id = WR_ID }, *bad;
	int i, ret;

	for (i = 0; i < n; i++) {
		ret = qp ? ibv_post_recv(qp, &wr, &bad) :
			   ibv_post_srq_recv(srq, &wr, &bad);
		if (ret)
			return ret;
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct ibv_srq_init_attr srq_attr = { .attr = { .max_sge = 1 } };
	struct ibv_qp_attr attr = {
		.qp_state = IBV_QPS_INIT,
		.qp_access_flags = IBV_ACCESS_LOCAL_WRITE,
	};
	struct ibv_qp_init_attr qp_attr = { .qp_type = IBV_QPT_RC };
	int nrecv = argc > 1 ? atoi(argv[1]) : 5;
	int nsrq = argc > 2 ? atoi(argv[2]) : 3;
	int ret;
	struct ibv_context *ctx;
	struct ibv_qp *qp;
	struct ibv_srq *srq;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	uint32_t qpn, srqh;

	ctx = open_vt3();
	if (!ctx)
		return fail("no vt3 device to open", errno ?: ENODEV);
	pd = ibv_alloc_pd(ctx);
	cq = pd ? ibv_create_cq(ctx, 64, NULL, NULL, 0) : NULL;
	if (!cq)
		return fail("PD or CQ", errno);
	qp_attr.send_cq = cq;
	qp_attr.recv_cq = cq;
	qp_attr.cap.max_send_wr = 4;
	qp_attr.cap.max_recv_wr = nrecv;
	qp_attr.cap.max_send_sge = 1;
	qp_attr.cap.max_recv_sge = 1;
	qp = ibv_create_qp(pd, &qp_attr);
	if (!qp)
		return fail("ibv_create_qp", errno);
	ret = ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_ACCESS_FLAGS);
	if (ret)
		return fail("ibv_modify_qp to INIT", ret);
	ret = post_recvs(qp, NULL, nrecv);
	if (ret)
		return fail("ibv_post_recv", ret);
	srq_attr.attr.max_wr = nsrq;
	srq = ibv_create_srq(pd, &srq_attr);
	if (!srq)
		return fail("ibv_create_srq", errno);
	ret = post_recvs(NULL, srq, nsrq);
	if (ret)
		return fail("ibv_post_srq_recv", ret);
	qpn = qp->qp_num;
	srqh = srq->handle;
	/* Nothing polled: the receives are still owed when their queues go. */
	ret = ibv_destroy_qp(qp);
	if (ret)
		return fail("ibv_destroy_qp", ret);
	ret = ibv_destroy_srq(srq);
	if (ret)
		return fail("ibv_destroy_srq", ret);
	if (ibv_destroy_cq(cq) || ibv_dealloc_pd(pd) || ibv_close_device(ctx))
		return fail("teardown", errno);
	printf("qp_num %u recv %d srq %u posted %d\n", qpn, nrecv, srqh, nsrq);
	return 0;
}
