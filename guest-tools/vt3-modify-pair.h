/* SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB */
/*
 * Two RC QPs of one device paired by ibv_modify_qp alone (RTR naming the
 * other's QPN, then RTS), as rdma-core's tests/ and ibv_rc_pingpong do
 * it (docs/modify-connect.md). Define VT3_PAIR_PORT and include
 * vt3-check.h (die()) before including.
 */
#ifndef VT3_MODIFY_PAIR_H
#define VT3_MODIFY_PAIR_H

#include <stdint.h>
#include <string.h>

#include <infiniband/verbs.h>

/* A context of the device named @name (NULL: the first one); dies if none. */
static inline struct ibv_context *open_device(const char *name)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_context *ctx = NULL;
	int i;

	if (!list)
		die("ibv_get_device_list");
	for (i = 0; list[i] && !ctx; i++)
		if (!name || !strcmp(ibv_get_device_name(list[i]), name))
			ctx = ibv_open_device(list[i]);
	ibv_free_device_list(list);
	if (!ctx)
		die("no such device");
	return ctx;
}

static inline int to_init(struct ibv_qp *qp)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT,
				 .port_num = VT3_PAIR_PORT,
				 .qp_access_flags = IBV_ACCESS_REMOTE_WRITE |
						    IBV_ACCESS_REMOTE_READ };

	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
			     IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

/* INIT -> RTR naming @dest, as ibv_rc_pingpong does (GRH with @dgid if set). */
static inline int to_rtr(struct ibv_qp *qp, uint32_t dest,
			 const union ibv_gid *dgid)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_RTR,
		.path_mtu = IBV_MTU_1024,
		.dest_qp_num = dest,
		.max_dest_rd_atomic = 1,
		.min_rnr_timer = 12,
		.ah_attr = { .port_num = VT3_PAIR_PORT },
	};

	if (dgid) {
		a.ah_attr.is_global = 1;
		a.ah_attr.grh.dgid = *dgid;
		a.ah_attr.grh.hop_limit = 1;
	}
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
			     IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
			     IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
}

static inline int to_rts(struct ibv_qp *qp)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_RTS, .timeout = 14,
				 .retry_cnt = 7, .rnr_retry = 7,
				 .max_rd_atomic = 1 };

	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT |
			     IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
			     IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

/* INIT, RTR naming @dest (no GRH), RTS; 0 or the first step's errno. */
static inline int pair_with(struct ibv_qp *qp, uint32_t dest)
{
	int ret = to_init(qp);

	if (!ret)
		ret = to_rtr(qp, dest, NULL);
	if (!ret)
		ret = to_rts(qp);
	return ret;
}

#endif /* VT3_MODIFY_PAIR_H */
