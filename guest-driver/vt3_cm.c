// SPDX-License-Identifier: GPL-2.0
/*
 * vt3 connection management: the iw_cm verbs on vt3d's TCP offload engine.
 *
 * vt3d runs TCP and MPA itself, with the guest's IPv4 address and MAC, so
 * the driver's part is what only the guest knows or owns:
 *  - the address: VT3_CMD_SET_ADDR before the first LISTEN or CONNECT and
 *    whenever the netdev's primary IPv4 address or MAC changes;
 *  - the ports: each one vt3d uses is reserved in the guest's own TCP stack
 *    with a bound kernel socket (as iwpmd does), held as long as vt3d may
 *    use it, so guest TCP never takes it (IW_F_NO_PORT_MAP tells iw_cm
 *    that the ports it gives us are the ports on the wire);
 *  - the next hop of an active open: the guest's route and neighbour;
 *  - iw_cm events, made from vt3d's connection and QP events.
 *
 * A connection belongs to its QP once CONNECT or ACCEPT succeeded: the
 * QP holds the iw_cm_id (with a reference) and the state of what iw_cm
 * was told. qp->state_lock serializes everything that moves it: vt3d's
 * events, connect/accept, modify_qp/destroy_qp, the timeout, device loss.
 * So every connection gets its iw_cm events in order and exactly one
 * terminal event (a failed CONNECT_REPLY or CLOSE), after which the
 * references go; iw_cm blocks destroy until a connect or accept has its
 * outcome, and a QP's destroy waits for iw_cm's references, so neither
 * may be missed.
 *
 * vt3d's connection and QP events are handled in vt3_cm_event.c, in
 * arrival order, in process context.
 *
 * Listeners are on dev->listeners (dev->cm_lock). A connection request
 * goes to the listener of its local port; vt3d's conn_id becomes the
 * provider_data of the cm_id iw_cm creates for it, which accept and
 * reject hand back. rdma_cm puts a wildcard listen on every device, so a
 * wildcard listen vt3 cannot serve stays inactive here rather than fail
 * everybody's (siw's on the same netdev included).
 */
#include <linux/capability.h>
#include <linux/etherdevice.h>
#include <linux/inetdevice.h>
#include <linux/net.h>
#include <net/ipv6.h>
#include <net/neighbour.h>
#include <net/route.h>
#include <net/sock.h>

#include "vt3.h"
#include "vt3_cm.h"

/* ARP gives up after 3 probes 1 s apart: fail a little later. */
#define VT3_NEIGH_TIMEOUT_MS	5000
#define VT3_NEIGH_POLL_MS	10

static const char * const vt3_iw_event_names[] = {
	[IW_CM_EVENT_CONNECT_REQUEST] = "CONNECT_REQUEST",
	[IW_CM_EVENT_CONNECT_REPLY] = "CONNECT_REPLY",
	[IW_CM_EVENT_ESTABLISHED] = "ESTABLISHED",
	[IW_CM_EVENT_DISCONNECT] = "DISCONNECT",
	[IW_CM_EVENT_CLOSE] = "CLOSE",
};

static const char *vt3_iw_event_name(enum iw_cm_event_type type)
{
	return type < ARRAY_SIZE(vt3_iw_event_names) &&
	       vt3_iw_event_names[type] ? vt3_iw_event_names[type] : "?";
}

/* ------------------------------------------------------------------ */
/* The guest's address                                                 */

/* What vt3d should answer for: the netdev's MAC and primary IPv4. */
static void vt3_cm_current_addr(struct vt3_dev *dev,
				struct vt3_cmd_set_addr *addr)
{
	const struct in_ifaddr *ifa;
	struct in_device *in_dev;

	memset(addr, 0, sizeof(*addr));
	ether_addr_copy(addr->mac, dev->netdev->dev_addr);
	rcu_read_lock();
	in_dev = __in_dev_get_rcu(dev->netdev);
	if (in_dev) {
		in_dev_for_each_ifa_rcu(ifa, in_dev) {
			if (ifa->ifa_flags & IFA_F_SECONDARY)
				continue;
			addr->ipv4 = ifa->ifa_local;
			addr->prefix_len = ifa->ifa_prefixlen;
			break;
		}
	}
	rcu_read_unlock();
}

/* Tells vt3d the address unless it knows it already. */
int vt3_cm_sync_addr(struct vt3_dev *dev)
{
	struct vt3_cmd_set_addr addr;
	int err;

	lockdep_assert_held(&dev->cm_lock);
	vt3_cm_current_addr(dev, &addr);
	if (dev->addr_sent && !memcmp(&addr, &dev->addr, sizeof(addr)))
		return 0;
	err = vt3_cmd(dev, VT3_CMD_SET_ADDR, &addr, sizeof(addr), NULL, 0);
	if (err)
		return err;
	dev->addr = addr;
	dev->addr_sent = true;
	ibdev_dbg(&dev->ibdev, "address %pI4/%u %pM\n", &addr.ipv4,
		  addr.prefix_len, addr.mac);
	return 0;
}

static void vt3_cm_addr_work(struct work_struct *work)
{
	struct vt3_dev *dev = container_of(work, struct vt3_dev, addr_work);
	int err;

	mutex_lock(&dev->cm_lock);
	err = vt3_cm_sync_addr(dev);
	mutex_unlock(&dev->cm_lock);
	/* The next LISTEN or CONNECT tries again. */
	if (err)
		ibdev_dbg(&dev->ibdev, "SET_ADDR failed (%d)\n", err);
}

/* An address of the netdev changed (notifiers, under RTNL). */
void vt3_cm_addr_changed(struct vt3_dev *dev)
{
	queue_work(vt3_cm_wq, &dev->addr_work);
}

/* ------------------------------------------------------------------ */
/* Ports and routes in the guest                                       */

/*
 * Reserves @sin's port in the guest's TCP stack (port 0: an ephemeral
 * one, written back) with a bound socket that never listens: guest TCP
 * then neither picks the port for its own connections nor lets a socket
 * bind it. A listener's socket allows address reuse, so that a listener
 * of the guest's own stack may still take the port: that is siw's
 * (SO_REUSEADDR too) when a wildcard rdma_listen reaches both devices.
 * A wildcard one is tied to our netdev, as siw ties its own.
 */
int vt3_port_reserve(struct vt3_dev *dev, struct sockaddr_in *sin,
		     bool listener, struct socket **sockp)
{
	struct sockaddr_in bound;
	struct socket *sock;
	int err;

	err = sock_create_kern(dev_net(dev->netdev), AF_INET, SOCK_STREAM,
			       IPPROTO_TCP, &sock);
	if (err)
		return err;
	if (listener)
		sock_set_reuseaddr(sock->sk);
	if (!sin->sin_addr.s_addr) {
		err = sock_bindtoindex(sock->sk, dev->netdev->ifindex, true);
		if (err)
			goto fail;
	}
	err = kernel_bind(sock, (struct sockaddr *)sin, sizeof(*sin));
	if (err)
		goto fail;
	if (!sin->sin_port) {
		err = kernel_getsockname(sock, (struct sockaddr *)&bound);
		if (err < 0)
			goto fail;
		sin->sin_port = bound.sin_port;
	}
	*sockp = sock;
	return 0;

fail:
	sock_release(sock);
	return err;
}

/*
 * The MAC of the next hop from @saddr to @daddr: the peer's or the
 * gateway's, through our netdev only (vt3d has no other way out).
 * Resolution is started when the neighbour is not known yet and waited
 * for; it normally is known, as rdma_resolve_addr() resolved it. To
 * @saddr itself (a loopback connection, which the TOE keeps inside) it
 * is our own MAC; other local addresses are not the TOE's.
 */
static int vt3_cm_next_hop(struct vt3_dev *dev, __be32 saddr, __be32 daddr,
			   u8 *mac)
{
	struct net_device *netdev = dev->netdev;
	struct flowi4 fl4 = { .daddr = daddr, .saddr = saddr };
	unsigned long deadline;
	struct neighbour *neigh;
	struct rtable *rt;
	int err = 0;
	u8 nud;

	if (daddr == saddr) {
		ether_addr_copy(mac, netdev->dev_addr);
		return 0;
	}
	rt = ip_route_output_key(dev_net(netdev), &fl4);
	if (IS_ERR(rt))
		return PTR_ERR(rt);
	if (rt->dst.dev != netdev || rt->rt_type != RTN_UNICAST) {
		err = -ENETUNREACH;
		goto out_rt;
	}
	neigh = dst_neigh_lookup(&rt->dst, &daddr);
	if (!neigh) {
		err = -ENOMEM;
		goto out_rt;
	}
	/* Starts resolution, or re-confirms a stale entry, in the background. */
	neigh_event_send(neigh, NULL);
	deadline = jiffies + msecs_to_jiffies(VT3_NEIGH_TIMEOUT_MS);
	for (;;) {
		nud = READ_ONCE(neigh->nud_state);
		if (nud & NUD_VALID)
			break;
		if (nud & NUD_FAILED || time_after(jiffies, deadline)) {
			err = -EHOSTUNREACH;
			goto out;
		}
		msleep(VT3_NEIGH_POLL_MS);
	}
	neigh_ha_snapshot(mac, neigh, netdev);
out:
	neigh_release(neigh);
out_rt:
	ip_rt_put(rt);
	return err;
}

static void vt3_cm_set_port(struct sockaddr_storage *ss, __be16 port)
{
	if (ss->ss_family == AF_INET)
		((struct sockaddr_in *)ss)->sin_port = port;
	else if (ss->ss_family == AF_INET6)
		((struct sockaddr_in6 *)ss)->sin6_port = port;
}

void vt3_cm_sockaddr(struct sockaddr_storage *ss,
		     const struct vt3_sockaddr *addr)
{
	struct sockaddr_in *sin = (struct sockaddr_in *)ss;

	memset(ss, 0, sizeof(*ss));
	sin->sin_family = AF_INET;
	sin->sin_addr.s_addr = addr->ipv4;
	sin->sin_port = addr->port;
}

/* ------------------------------------------------------------------ */
/* A QP's connection                                                   */

int vt3_cm_upcall(struct iw_cm_id *cm_id, struct iw_cm_event *ev)
{
	int err;

	ibdev_dbg(cm_id->device, "iw_cm %s (%d)\n",
		  vt3_iw_event_name(ev->event), ev->status);
	err = cm_id->event_handler(cm_id, ev);
	if (err)
		ibdev_warn_ratelimited(cm_id->device,
				       "iw_cm took no %s event (%d)\n",
				       vt3_iw_event_name(ev->event), err);
	return err;
}

/*
 * IRD/ORD: vt3d gives ours (negotiated, or for a request what we need and
 * may use); rdma_cm takes an iw_cm event's ird as the initiator depth (our
 * ORD, bounded by the peer's IRD) and its ord as the responder resources
 * (our IRD, the peer's ORD), as iw_cxgb4 reports them.
 */
void vt3_cm_ird_ord(struct iw_cm_event *ev, const struct vt3_cm_ev *c)
{
	ev->ird = min_t(u32, c->ord, U8_MAX);
	ev->ord = min_t(u32, c->ird, U8_MAX);
}

/* An event of @qp's connection (iw_cm copies CONNECT_REPLY's private data). */
void vt3_conn_upcall(struct vt3_qp *qp, enum iw_cm_event_type type,
		     int status, const struct vt3_cm_ev *c)
{
	struct iw_cm_event ev = { .event = type, .status = status };

	/* A pair connected by modify_qp (vt3_pair.c) has no iw_cm to tell. */
	if (!qp->cm_id)
		return;
	memcpy(&ev.local_addr, &qp->laddr, sizeof(qp->laddr));
	memcpy(&ev.remote_addr, &qp->raddr, sizeof(qp->raddr));
	if (c) {
		vt3_cm_ird_ord(&ev, c);
		if (type == IW_CM_EVENT_CONNECT_REPLY && c->pd_len) {
			ev.private_data = (void *)c->pd;
			/* iw_cm carries no more than 255 bytes. */
			ev.private_data_len = min_t(u16, c->pd_len, U8_MAX);
		}
	}
	vt3_cm_upcall(qp->cm_id, &ev);
}

static void vt3_conn_bind(struct vt3_qp *qp, struct iw_cm_id *cm_id,
			  enum vt3_conn_state state,
			  const struct sockaddr_storage *laddr,
			  const struct sockaddr_storage *raddr)
{
	unsigned long timeout = msecs_to_jiffies(vt3_cm_timeout_ms);

	lockdep_assert_held(&qp->state_lock);
	cm_id->add_ref(cm_id);
	qp->cm_id = cm_id;
	qp->conn = state;
	memcpy(&qp->laddr, laddr, sizeof(qp->laddr));
	memcpy(&qp->raddr, raddr, sizeof(qp->raddr));
	qp->cm_deadline = jiffies + timeout;
	mod_delayed_work(vt3_cm_wq, &qp->cm_timer, timeout);
}

void vt3_conn_release(struct vt3_qp *qp)
{
	struct iw_cm_id *cm_id = qp->cm_id;

	lockdep_assert_held(&qp->state_lock);
	/* Not _sync: this may be the timer; it re-checks under the lock. */
	cancel_delayed_work(&qp->cm_timer);
	if (qp->port) {
		sock_release(qp->port);
		qp->port = NULL;
	}
	qp->cm_id = NULL;
	qp->conn = VT3_CONN_NONE;
	if (cm_id)
		cm_id->rem_ref(cm_id);
}

/*
 * The connection is over: the QP is in error for its consumer, iw_cm gets
 * the terminal event it is owed in the state it knows, and the
 * connection's references go.
 */
void vt3_conn_end(struct vt3_qp *qp, int status)
{
	bool removing = READ_ONCE(to_vt3_dev(qp->ibqp.device)->removing);

	lockdep_assert_held(&qp->state_lock);
	if (qp->conn == VT3_CONN_NONE)
		return;
	vt3_qp_enter_error(qp);
	switch (qp->conn) {
	case VT3_CONN_CONNECTING:
		vt3_conn_upcall(qp, IW_CM_EVENT_CONNECT_REPLY, status, NULL);
		break;
	case VT3_CONN_ACCEPTING:
		/* iw_cm has no way out of an accept but ESTABLISHED. */
		vt3_conn_upcall(qp, IW_CM_EVENT_ESTABLISHED, 0, NULL);
		fallthrough;
	default:
		/*
		 * A device being removed: rdma_cm tells its consumers
		 * DEVICE_REMOVAL next; a CLOSE now would reach them first, as
		 * a DISCONNECTED, as if the peer had ended it. It is owed
		 * still: it is what makes iw_cm drop its QP reference, which
		 * destroy_qp waits for (a ULP destroys its QPs in its
		 * DEVICE_REMOVAL handler, before the id), so it goes out then,
		 * when rdma_cm drops it. Connects and accepts still get their
		 * outcome: iw_cm waits for it.
		 */
		if (removing && qp->cm_id && !qp->destroying &&
		    !qp->close_owed) {
			qp->close_owed = qp->cm_id;
			qp->close_owed->add_ref(qp->close_owed);
			break;
		}
		vt3_conn_upcall(qp, IW_CM_EVENT_CLOSE, status, NULL);
		break;
	}
	vt3_conn_release(qp);
}

/* Ends the connection with an RST (best effort: it ends here anyway). */
void vt3_cm_abort(struct vt3_qp *qp, int status)
{
	struct vt3_dev *dev = to_vt3_dev(qp->ibqp.device);
	struct vt3_cmd_disconnect req = {
		.qpn = cpu_to_le32(qp->qpn),
		.abort = cpu_to_le32(1),
	};
	int err;

	lockdep_assert_held(&qp->state_lock);
	if (qp->conn == VT3_CONN_NONE)
		return;
	err = vt3_cmd(dev, VT3_CMD_DISCONNECT, &req, sizeof(req), NULL, 0);
	if (err)
		ibdev_dbg(&dev->ibdev, "QP %u: abortive DISCONNECT: %d\n",
			  qp->qpn, err);
	vt3_conn_end(qp, status);
}

/* RTS -> SQD: FIN once the SQ is sent; CLOSE follows vt3d's event. */
int vt3_cm_disconnect(struct vt3_qp *qp)
{
	struct vt3_dev *dev = to_vt3_dev(qp->ibqp.device);
	struct vt3_cmd_disconnect req = { .qpn = cpu_to_le32(qp->qpn) };
	int err;

	lockdep_assert_held(&qp->state_lock);
	err = vt3_cmd(dev, VT3_CMD_DISCONNECT, &req, sizeof(req), NULL, 0);
	if (!err && qp->conn == VT3_CONN_UP)
		qp->conn = VT3_CONN_CLOSING;
	return err;
}

/* vt3d never told the outcome of a CONNECT or ACCEPT. */
static void vt3_cm_timeout(struct work_struct *work)
{
	struct vt3_qp *qp = container_of(to_delayed_work(work), struct vt3_qp,
					 cm_timer);

	mutex_lock(&qp->state_lock);
	if ((qp->conn == VT3_CONN_CONNECTING ||
	     qp->conn == VT3_CONN_ACCEPTING) &&
	    time_after_eq(jiffies, qp->cm_deadline)) {
		ibdev_warn(qp->ibqp.device,
			   "QP %u: no connection outcome from vt3d in %u ms\n",
			   qp->qpn, vt3_cm_timeout_ms);
		vt3_cm_abort(qp, -ETIMEDOUT);
	}
	mutex_unlock(&qp->state_lock);
}

void vt3_cm_qp_init(struct vt3_qp *qp)
{
	qp->conn = VT3_CONN_NONE;
	INIT_DELAYED_WORK(&qp->cm_timer, vt3_cm_timeout);
}

/* destroy_qp: a connection still up is aborted first. */
void vt3_cm_qp_destroy(struct vt3_qp *qp)
{
	struct iw_cm_id *owed;

	mutex_lock(&qp->state_lock);
	qp->destroying = true;
	vt3_cm_abort(qp, -ECONNRESET);
	owed = qp->close_owed;
	qp->close_owed = NULL;
	if (owed) {
		struct iw_cm_event ev = { .event = IW_CM_EVENT_CLOSE,
					  .status = -ECONNRESET };

		memcpy(&ev.local_addr, &qp->laddr, sizeof(qp->laddr));
		memcpy(&ev.remote_addr, &qp->raddr, sizeof(qp->raddr));
		vt3_cm_upcall(owed, &ev);
		owed->rem_ref(owed);
	}
	mutex_unlock(&qp->state_lock);
	cancel_delayed_work_sync(&qp->cm_timer);
}

/*
 * The device is lost or reported itself dead (docs/architecture.md §5): it
 * writes nothing more that counts, so every QP goes to error here (flags
 * set by the driver, kernel QPs flushed, CQs kicked), every connection
 * ends with @status (vt3d will report none), and consumers get
 * IB_EVENT_DEVICE_FATAL once.
 */
void vt3_cm_end_all(struct vt3_dev *dev, int status)
{
	unsigned long qpn = 0;
	struct vt3_qp *qp;

	/* First: no CQE vt3d might still write is taken after a flush. */
	vt3_cq_freeze_all(dev);
	while ((qp = vt3_qp_get_next(dev, &qpn))) {
		mutex_lock(&qp->state_lock);
		vt3_qp_enter_error(qp);
		vt3_conn_end(qp, status);
		/* It takes no more SRQ WQEs: vt3d cannot say so any more. */
		vt3_qp_last_wqe(qp);
		mutex_unlock(&qp->state_lock);
		vt3_qp_put(qp);
		qpn++;
	}
	vt3_device_fatal_event(dev);
}

static void vt3_cm_lost_work(struct work_struct *work)
{
	struct vt3_dev *dev = container_of(work, struct vt3_dev, lost_work);
	/*
	 * Unless it is being unregistered already (rmmod, NIC gone, `rdma
	 * link del`). Then it is not probed again either, even when vt3d
	 * went silent during that teardown (vt3_cm_going_away() set
	 * removing before any of its commands could time out).
	 */
	bool unregister = ib_device_try_get(&dev->ibdev);
	bool admin_removing = READ_ONCE(dev->removing);

	/*
	 * Either way the device is unregistered next, so its connections
	 * end as a removed device's do: rdma_cm's consumers hear
	 * DEVICE_REMOVAL, not first a DISCONNECTED as if the peer had ended
	 * them (vt3_conn_end() owes the CLOSE until the QP is destroyed).
	 */
	WRITE_ONCE(dev->removing, true);
	vt3_cm_end_all(dev, -EIO);
	if (unregister) {
		/* Read by vt3_dealloc_driver(), which the unregister runs. */
		dev->reprobe = !admin_removing;
		ib_unregister_device_queued(&dev->ibdev);
		ib_device_put(&dev->ibdev);
	}
}

/*
 * The device is going away (rmmod, the NIC leaving) while vt3d still
 * answers: every QP goes to error through vt3d (which publishes its last
 * CQEs, then the flags), then consumers get DEVICE_FATAL, while user
 * contexts are still there to flush on it. A lost device had all that
 * done already (vt3_cm_end_all).
 */
void vt3_cm_going_away(struct vt3_dev *dev)
{
	struct ib_qp_attr attr = { .qp_state = IB_QPS_ERR };
	unsigned long qpn = 0;
	struct vt3_qp *qp;

	WRITE_ONCE(dev->removing, true);
	if (READ_ONCE(dev->ctrl.lost))
		return;
	/* The NIC is down already (it is leaving): vt3d cannot be told. */
	if (!netif_running(dev->netdev) || !netif_carrier_ok(dev->netdev)) {
		vt3_cm_end_all(dev, -ENODEV);
		return;
	}
	while ((qp = vt3_qp_get_next(dev, &qpn))) {
		enum ib_qp_state state = READ_ONCE(qp->ib_state);

		if (state != IB_QPS_ERR && state != IB_QPS_RESET)
			vt3_modify_qp(&qp->ibqp, &attr, IB_QP_STATE, NULL);
		vt3_qp_put(qp);
		qpn++;
	}
	vt3_device_fatal_event(dev);
}

/* vt3d stopped answering (any context: a command may hold a QP's lock). */
void vt3_cm_device_lost(struct vt3_dev *dev)
{
	queue_work(vt3_cm_wq, &dev->lost_work);
}

/* ------------------------------------------------------------------ */
/* iw_cm verbs                                                         */

static int vt3_cm_check_param(struct vt3_dev *dev,
			      const struct iw_cm_conn_param *param)
{
	if (param->private_data_len > VT3_MAX_PRIVATE_DATA ||
	    param->ird > dev->lim.max_ird || param->ord > dev->lim.max_ord)
		return -EINVAL;
	return 0;
}

/* Ports an active open tries when the TOE still holds the first ones. */
#define VT3_PORT_TRIES	8

int vt3_iw_connect(struct iw_cm_id *cm_id, struct iw_cm_conn_param *param)
{
	struct vt3_dev *dev = to_vt3_dev(cm_id->device);
	struct sockaddr_storage laddr, raddr;
	struct sockaddr_in *lsin = (struct sockaddr_in *)&laddr;
	struct sockaddr_in *rsin = (struct sockaddr_in *)&raddr;
	struct socket *port = NULL, *tried[VT3_PORT_TRIES];
	struct vt3_cmd_connect *req;
	int err, tries = 0;
	bool pick_port;
	struct vt3_qp *qp;
	__be32 guest_ip;

	/* The addresses on the wire: with IW_F_NO_PORT_MAP, cm_id's own. */
	laddr = cm_id->m_local_addr;
	raddr = cm_id->m_remote_addr;
	if (laddr.ss_family != AF_INET || raddr.ss_family != AF_INET)
		return -EAFNOSUPPORT;
	if (!rsin->sin_port)
		return -EINVAL;
	err = vt3_cm_check_param(dev, param);
	if (err)
		return err;

	mutex_lock(&dev->cm_lock);
	err = vt3_cm_sync_addr(dev);
	guest_ip = dev->addr.ipv4;
	mutex_unlock(&dev->cm_lock);
	if (err)
		return err;
	/* The TOE sends from the primary address only. */
	if (!guest_ip || (lsin->sin_addr.s_addr &&
			  lsin->sin_addr.s_addr != guest_ip))
		return -EADDRNOTAVAIL;
	lsin->sin_addr.s_addr = guest_ip;

	req = kzalloc(sizeof(*req), GFP_KERNEL);
	if (!req)
		return -ENOMEM;
	err = vt3_cm_next_hop(dev, guest_ip, rsin->sin_addr.s_addr,
			      req->next_hop);
	if (err)
		goto out_req;
	pick_port = !lsin->sin_port;
	err = vt3_port_reserve(dev, lsin, false, &port);
	if (err)
		goto out_req;
	qp = vt3_qp_get(dev, param->qpn);
	if (!qp) {
		err = -EINVAL;
		goto out_port;
	}

	req->local.ipv4 = guest_ip;
	req->local.port = lsin->sin_port;
	req->remote.ipv4 = rsin->sin_addr.s_addr;
	req->remote.port = rsin->sin_port;
	req->pd_len = cpu_to_le16(param->private_data_len);
	req->qpn = cpu_to_le32(qp->qpn);
	req->ird = cpu_to_le32(param->ird);
	req->ord = cpu_to_le32(param->ord);
	if (param->private_data_len)
		memcpy(req->private_data, param->private_data,
		       param->private_data_len);

	mutex_lock(&qp->state_lock);
	/* Nor a QP whose RTR named a peer (vt3_pair.c). */
	if (qp->conn != VT3_CONN_NONE || qp->pair_named) {
		err = -EBUSY;
		goto out_unlock;
	}
	err = vt3_cmd(dev, VT3_CMD_CONNECT, req, sizeof(*req), NULL, 0);
	/*
	 * The TOE may still hold a connection from that port which the guest
	 * stack already let go of (it ended under the TOE, in TIME_WAIT
	 * there): another one, as connect(2) would pick. The ports tried stay
	 * reserved until then, so none comes back.
	 */
	for (tries = 0; err == -EBUSY && pick_port && tries < VT3_PORT_TRIES;
	     tries++) {
		tried[tries] = port;
		lsin->sin_port = 0;
		port = NULL;
		err = vt3_port_reserve(dev, lsin, false, &port);
		if (err)
			break;
		req->local.port = lsin->sin_port;
		err = vt3_cmd(dev, VT3_CMD_CONNECT, req, sizeof(*req), NULL, 0);
	}
	while (tries--)
		sock_release(tried[tries]);
	if (err)
		goto out_unlock;
	if (pick_port) {
		/* The cm_id's user reads the port it got here. */
		vt3_cm_set_port(&cm_id->local_addr, lsin->sin_port);
		vt3_cm_set_port(&cm_id->m_local_addr, lsin->sin_port);
	}
	vt3_conn_bind(qp, cm_id, VT3_CONN_CONNECTING, &laddr, &raddr);
	qp->port = port;
	port = NULL;
	ibdev_dbg(&dev->ibdev, "QP %u: connecting %pISpc -> %pISpc\n", qp->qpn,
		  &laddr, &raddr);
out_unlock:
	mutex_unlock(&qp->state_lock);
	vt3_qp_put(qp);
out_port:
	if (port)
		sock_release(port);
out_req:
	kfree(req);
	return err;
}

/* vt3d's conn_id of a connection request, from its cm_id. */
static u32 vt3_cm_conn_id(const struct iw_cm_id *cm_id)
{
	return (uintptr_t)cm_id->provider_data;
}

int vt3_iw_accept(struct iw_cm_id *cm_id, struct iw_cm_conn_param *param)
{
	struct vt3_dev *dev = to_vt3_dev(cm_id->device);
	struct vt3_cmd_accept *req;
	struct vt3_qp *qp;
	int err;

	err = vt3_cm_check_param(dev, param);
	if (err)
		return err;
	qp = vt3_qp_get(dev, param->qpn);
	if (!qp)
		return -EINVAL;
	req = kzalloc(sizeof(*req), GFP_KERNEL);
	if (!req) {
		err = -ENOMEM;
		goto out_qp;
	}
	req->conn_id = cpu_to_le32(vt3_cm_conn_id(cm_id));
	req->qpn = cpu_to_le32(qp->qpn);
	req->ird = cpu_to_le32(param->ird);
	req->ord = cpu_to_le32(param->ord);
	req->pd_len = cpu_to_le16(param->private_data_len);
	if (param->private_data_len)
		memcpy(req->private_data, param->private_data,
		       param->private_data_len);

	mutex_lock(&qp->state_lock);
	if (qp->conn != VT3_CONN_NONE || qp->pair_named) {
		err = -EBUSY;
		goto out_unlock;
	}
	/* ESTABLISHED may come before the answer: it waits for the lock. */
	err = vt3_cmd(dev, VT3_CMD_ACCEPT, req, sizeof(*req), NULL, 0);
	if (err)
		goto out_unlock;
	vt3_conn_bind(qp, cm_id, VT3_CONN_ACCEPTING, &cm_id->m_local_addr,
		      &cm_id->m_remote_addr);
	ibdev_dbg(&dev->ibdev, "QP %u: accepted connection %u\n", qp->qpn,
		  vt3_cm_conn_id(cm_id));
out_unlock:
	mutex_unlock(&qp->state_lock);
	kfree(req);
out_qp:
	vt3_qp_put(qp);
	return err;
}

int vt3_cm_reject(struct vt3_dev *dev, u32 conn_id, const void *pdata,
		  u8 pdata_len)
{
	struct vt3_cmd_reject *req;
	int err;

	req = kzalloc(sizeof(*req), GFP_KERNEL);
	if (!req)
		return -ENOMEM;
	req->conn_id = cpu_to_le32(conn_id);
	req->pd_len = cpu_to_le16(pdata_len);
	if (pdata_len)
		memcpy(req->private_data, pdata, pdata_len);
	err = vt3_cmd(dev, VT3_CMD_REJECT, req, sizeof(*req), NULL, 0);
	kfree(req);
	return err;
}

int vt3_iw_reject(struct iw_cm_id *cm_id, const void *pdata, u8 pdata_len)
{
	return vt3_cm_reject(to_vt3_dev(cm_id->device), vt3_cm_conn_id(cm_id),
			     pdata, pdata_len);
}

/* Reserves the port, tells vt3d to listen. */
static int vt3_listen_start(struct vt3_dev *dev, struct vt3_listener *l,
			    struct sockaddr_in *sin, int backlog)
{
	struct vt3_cmd_listen req = {};
	struct socket *port;
	int err;

	lockdep_assert_held(&dev->cm_lock);
	err = vt3_cm_sync_addr(dev);
	if (err)
		return err;
	if (sin->sin_addr.s_addr && sin->sin_addr.s_addr != dev->addr.ipv4)
		return -EADDRNOTAVAIL;
	err = vt3_port_reserve(dev, sin, true, &port);
	if (err == -EADDRINUSE && sin->sin_port &&
	    ns_capable(dev_net(dev->netdev)->user_ns, CAP_NET_ADMIN)) {
		/*
		 * A listener of the guest's own TCP holds the port: LIO's iSCSI
		 * portal, which an iSER portal on the same address always
		 * comes with. As on a T3, whose listening servers steer the
		 * port's SYNs to the adapter, vt3d takes the connections the
		 * wire brings to it and the guest's listener gets none. Only
		 * for a privileged caller (configfs, root's rdma_listen): an
		 * unprivileged one must not take a guest service's port.
		 */
		ibdev_info(&dev->ibdev,
			   "listening on port %u beside a listener of the guest's TCP: connections from the wire to it come to this device\n",
			   ntohs(sin->sin_port));
		port = NULL;
		err = 0;
	}
	if (err)
		return err;
	req.local.ipv4 = sin->sin_addr.s_addr;
	req.local.port = sin->sin_port;
	req.backlog = cpu_to_le32(backlog);
	err = vt3_cmd(dev, VT3_CMD_LISTEN, &req, sizeof(req), NULL, 0);
	if (err) {
		if (port)
			sock_release(port);
		return err;
	}
	l->port = port;
	l->serving = true;
	l->addr = req.local;
	return 0;
}

int vt3_iw_create_listen(struct iw_cm_id *cm_id, int backlog)
{
	struct vt3_dev *dev = to_vt3_dev(cm_id->device);
	const struct sockaddr_storage *ss = &cm_id->m_local_addr;
	struct sockaddr_in sin = { .sin_family = AF_INET };
	const struct sockaddr_in6 *sin6;
	struct vt3_listener *l;
	__be16 port;
	bool wildcard;
	int err;

	switch (ss->ss_family) {
	case AF_INET:
		memcpy(&sin, ss, sizeof(sin));
		wildcard = !sin.sin_addr.s_addr;
		break;
	case AF_INET6:
		/* vt3 is IPv4 only: a dual-stack wildcard is an IPv4 one. */
		sin6 = (const struct sockaddr_in6 *)ss;
		if (!ipv6_addr_any(&sin6->sin6_addr))
			return -EAFNOSUPPORT;
		sin.sin_port = sin6->sin6_port;
		wildcard = true;
		break;
	default:
		return -EAFNOSUPPORT;
	}
	port = sin.sin_port;

	l = kzalloc(sizeof(*l), GFP_KERNEL);
	if (!l)
		return -ENOMEM;
	l->cm_id = cm_id;
	mutex_lock(&dev->cm_lock);
	if (ss->ss_family == AF_INET6 && cm_id->afonly)
		err = -EAFNOSUPPORT;
	else
		err = vt3_listen_start(dev, l, &sin, backlog);
	if (err && !wildcard) {
		mutex_unlock(&dev->cm_lock);
		kfree(l);
		return err;
	}
	if (err)
		ibdev_warn(&dev->ibdev,
			   "wildcard listen on port %u: not served by this device (%d)\n",
			   ntohs(port), err);
	if (!err && !port) {
		/* The cm_id's user reads the port it got here. */
		vt3_cm_set_port(&cm_id->local_addr, sin.sin_port);
		vt3_cm_set_port(&cm_id->m_local_addr, sin.sin_port);
	}
	list_add_tail(&l->list, &dev->listeners);
	cm_id->provider_data = l;
	cm_id->add_ref(cm_id);
	mutex_unlock(&dev->cm_lock);
	ibdev_dbg(&dev->ibdev, "listening on %pISpc%s\n", ss,
		  l->serving ? "" : " (inactive)");
	return 0;
}

int vt3_iw_destroy_listen(struct iw_cm_id *cm_id)
{
	struct vt3_dev *dev = to_vt3_dev(cm_id->device);
	struct vt3_listener *l = cm_id->provider_data;
	struct vt3_cmd_listen req = {};
	int err;

	mutex_lock(&dev->cm_lock);
	list_del(&l->list);
	if (l->serving) {
		/* vt3d drops the requests still pending on it. */
		req.local = l->addr;
		err = vt3_cmd(dev, VT3_CMD_UNLISTEN, &req, sizeof(req), NULL,
			      0);
		if (err)
			ibdev_dbg(&dev->ibdev, "UNLISTEN port %u: %d\n",
				  ntohs(l->addr.port), err);
		if (l->port)
			sock_release(l->port);
	}
	mutex_unlock(&dev->cm_lock);
	cm_id->rem_ref(cm_id);
	kfree(l);
	return 0;
}

void vt3_cm_init(struct vt3_dev *dev)
{
	mutex_init(&dev->cm_lock);
	INIT_LIST_HEAD(&dev->listeners);
	skb_queue_head_init(&dev->ev_queue);
	INIT_WORK(&dev->ev_work, vt3_cm_event_work);
	INIT_WORK(&dev->addr_work, vt3_cm_addr_work);
	INIT_WORK(&dev->lost_work, vt3_cm_lost_work);
}

/*
 * The device is unregistered (every QP and listener is gone) and no RX
 * handler runs any more: nothing queues work now.
 */
void vt3_cm_stop(struct vt3_dev *dev)
{
	cancel_work_sync(&dev->ev_work);
	cancel_work_sync(&dev->addr_work);
	cancel_work_sync(&dev->lost_work);
	skb_queue_purge(&dev->ev_queue);
}
