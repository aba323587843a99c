// SPDX-License-Identifier: GPL-2.0
/*
 * QPs of one vt3 device connected by ibv_modify_qp, a vt3 extension for
 * test suites and one-VM setups (docs/modify-connect.md): rdma-core's
 * tests/ and ibv_rc_pingpong-style programs connect two RC QPs by hand,
 * INIT -> RTR naming the peer's QPN (IB_QP_DEST_QPN, with the device's
 * own GID or no GRH) -> RTS, without a CM. An iWARP QP runs only over a
 * connection, so the RTS of such a QP asks vt3d (VT3_CMD_PAIR_QP) for one
 * to its peer; once both asked, vt3d makes it inside its TOE loopback as
 * an rdma_cm loopback connection, and the QPs' events come as for one
 * (vt3_cm.c, with no iw_cm_id: conn PAIRING, then UP). Work posted at RTS
 * waits in the rings until the connection is up. A failed attempt is a
 * QP_FATAL, as a reset connection is.
 *
 * Refused, in modify_qp: a kernel QP (EOPNOTSUPP: kernel ULPs connect
 * through iw_cm), a QP in an iw_cm connection or its attempt (EISCONN),
 * a dgid other than the device's own GID (ENETUNREACH: other hosts are
 * reached through rdma_cm), a QPN that is this QP's own or no user QP of
 * this device (EINVAL); at RTS, no IPv4 address on the netdev
 * (EADDRNOTAVAIL) or vt3d's refusal (EINVAL: the peer went away or is
 * connected; EBUSY: no free port). QPs of different user contexts may
 * pair: both must name each other, so neither is connected against its
 * consumer's will. iw_cm refuses a QP whose RTR named a peer (EBUSY).
 */
#include "vt3.h"

/* Ports tried when the TOE still holds the first ones (TIME_WAIT). */
#define VT3_PAIR_PORT_TRIES	4

static bool vt3_pair_own_gid(struct vt3_dev *dev, const union ib_gid *dgid)
{
	union ib_gid own;

	vt3_query_gid(&dev->ibdev, 1, 0, &own);
	return !memcmp(&own, dgid, sizeof(own));
}

/* RTR with IB_QP_DEST_QPN: the QP names its peer. state_lock held. */
int vt3_pair_name(struct vt3_qp *qp, const struct ib_qp_attr *attr, int mask)
{
	struct vt3_dev *dev = to_vt3_dev(qp->ibqp.device);
	struct vt3_qp *peer;
	bool user;

	lockdep_assert_held(&qp->state_lock);
	if (!qp->user)
		return -EOPNOTSUPP;
	if (qp->conn != VT3_CONN_NONE)
		return -EISCONN;
	if (mask & IB_QP_AV &&
	    rdma_ah_get_ah_flags(&attr->ah_attr) & IB_AH_GRH &&
	    !vt3_pair_own_gid(dev, &rdma_ah_read_grh(&attr->ah_attr)->dgid))
		return -ENETUNREACH;
	if (attr->dest_qp_num == qp->qpn)
		return -EINVAL;
	peer = vt3_qp_get(dev, attr->dest_qp_num);
	if (!peer)
		return -EINVAL;
	user = peer->user;
	vt3_qp_put(peer);
	if (!user)
		return -EINVAL;
	qp->pair_named = true;
	qp->pair_qpn = attr->dest_qp_num;
	return 0;
}

/*
 * RTS of a QP that named its peer: VT3_CMD_PAIR_QP from a port reserved
 * in the guest's stack (held until the connection ends, as CONNECT's).
 * state_lock held.
 */
int vt3_pair_connect(struct vt3_qp *qp)
{
	struct vt3_dev *dev = to_vt3_dev(qp->ibqp.device);
	struct vt3_cmd_pair_qp req = {
		.qpn = cpu_to_le32(qp->qpn),
		.peer_qpn = cpu_to_le32(qp->pair_qpn),
	};
	struct sockaddr_in sin = { .sin_family = AF_INET };
	struct socket *port = NULL, *tried[VT3_PAIR_PORT_TRIES];
	int err, tries;

	lockdep_assert_held(&qp->state_lock);
	mutex_lock(&dev->cm_lock);
	err = vt3_cm_sync_addr(dev);
	sin.sin_addr.s_addr = dev->addr.ipv4;
	mutex_unlock(&dev->cm_lock);
	if (err)
		return err;
	if (!sin.sin_addr.s_addr)
		return -EADDRNOTAVAIL;
	for (tries = 0; tries < VT3_PAIR_PORT_TRIES; tries++) {
		sin.sin_port = 0;
		err = vt3_port_reserve(dev, &sin, false, &port);
		if (err)
			break;
		req.port = sin.sin_port;
		err = vt3_cmd(dev, VT3_CMD_PAIR_QP, &req, sizeof(req), NULL, 0);
		if (err != -EBUSY)
			break;
		/* Held until the next one is reserved, so it is not picked again. */
		tried[tries] = port;
		port = NULL;
	}
	while (tries-- > 0)
		sock_release(tried[tries]);
	if (err) {
		if (port)
			sock_release(port);
		/* The peer went away since the RTR: no QP of the device. */
		return err == -ENOENT ? -EINVAL : err;
	}
	qp->port = port;
	qp->laddr = sin;
	qp->conn = VT3_CONN_PAIRING;
	return 0;
}
