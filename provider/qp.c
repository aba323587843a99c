// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
/*
 * libvt3 send and receive: WQEs go into the mapped SQ/RQ rings, the
 * producer index into the QP status page, and the doorbell (a zero-WR
 * post on the uverbs fd) is rung only when vt3d reports the queue idle.
 * That is the data-path issue; until then posting is refused, whole.
 */
#include <config.h>

#include <errno.h>

#include "vt3.h"

int vt3_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr,
		  struct ibv_send_wr **bad_wr)
{
	*bad_wr = wr;
	return EOPNOTSUPP;
}

int vt3_post_recv(struct ibv_qp *ibqp, struct ibv_recv_wr *wr,
		  struct ibv_recv_wr **bad_wr)
{
	*bad_wr = wr;
	return EOPNOTSUPP;
}
