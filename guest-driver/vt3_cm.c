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
 * vt3d's events reach the RX handler in softirq. Those for connections
 * and QPs are queued as they are (the skb: no allocation there) and one
 * work item per device handles them in arrival order in process context.
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

/* Events waiting for process context; more means vt3d floods us. */
#define VT3_EV_QUEUE_MAX	4096

/* ARP gives up after 3 probes 1 s apart: fail a little later. */
#define VT3_NEIGH_TIMEOUT_MS	5000
#define VT3_NEIGH_POLL_MS	10

struct vt3_listener {
	struct list_head list;		/* dev->listeners */
	struct iw_cm_id *cm_id;		/* referenced */
	struct socket *port;		/* the reservation; NULL: none */
	bool serving;			/* vt3d listens (else inactive here) */
	struct vt3_sockaddr addr;	/* as LISTEN named it */
};

/* vt3_event_cm, parsed. */
struct vt3_cm_ev {
	u32 conn_id;
	u32 qpn;
	u32 status;
	u32 ird;
	u32 ord;
	struct vt3_sockaddr local;
	struct vt3_sockaddr remote;
	const u8 *pd;
	u16 pd_len;
};

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

static void vt3_cm_sockaddr(struct sockaddr_storage *ss,
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

static int vt3_cm_upcall(struct iw_cm_id *cm_id, struct iw_cm_event *ev)
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
static void vt3_cm_ird_ord(struct iw_cm_event *ev, const struct vt3_cm_ev *c)
{
	ev->ird = min_t(u32, c->ord, U8_MAX);
	ev->ord = min_t(u32, c->ird, U8_MAX);
}

/* An event of @qp's connection (iw_cm copies CONNECT_REPLY's private data). */
static void vt3_conn_upcall(struct vt3_qp *qp, enum iw_cm_event_type type,
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

static void vt3_conn_release(struct vt3_qp *qp)
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
static void vt3_conn_end(struct vt3_qp *qp, int status)
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
static void vt3_cm_end_all(struct vt3_dev *dev, int status)
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

static int vt3_cm_reject(struct vt3_dev *dev, u32 conn_id, const void *pdata,
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

/* ------------------------------------------------------------------ */
/* vt3d's events                                                       */

static struct vt3_listener *vt3_listener_find(struct vt3_dev *dev,
					      const struct vt3_sockaddr *local)
{
	struct vt3_listener *l;

	list_for_each_entry(l, &dev->listeners, list) {
		if (l->serving && l->addr.port == local->port &&
		    (!l->addr.ipv4 || l->addr.ipv4 == local->ipv4))
			return l;
	}
	return NULL;
}

static void vt3_cm_conn_request(struct vt3_dev *dev, const struct vt3_cm_ev *c)
{
	struct iw_cm_event ev = {
		.event = IW_CM_EVENT_CONNECT_REQUEST,
		.provider_data = (void *)(uintptr_t)c->conn_id,
	};
	struct vt3_sockaddr local = c->local;
	struct vt3_listener *l;
	int err = -ENOENT;

	mutex_lock(&dev->cm_lock);
	/* rdma_cm finds the device by the address: it must be a real one. */
	if (!local.ipv4)
		local.ipv4 = dev->addr.ipv4;
	l = vt3_listener_find(dev, &local);
	if (l) {
		vt3_cm_ird_ord(&ev, c);
		vt3_cm_sockaddr(&ev.local_addr, &local);
		vt3_cm_sockaddr(&ev.remote_addr, &c->remote);
		if (c->pd_len) {
			ev.private_data = (void *)c->pd;
			ev.private_data_len = min_t(u16, c->pd_len, U8_MAX);
		}
		/* -ENOMEM: the listener's backlog is full. */
		err = vt3_cm_upcall(l->cm_id, &ev);
	}
	if (err) {
		ibdev_dbg(&dev->ibdev,
			  "rejecting connection %u to port %u (%d)\n",
			  c->conn_id, ntohs(local.port), err);
		err = vt3_cm_reject(dev, c->conn_id, NULL, 0);
		if (err)
			ibdev_dbg(&dev->ibdev, "REJECT %u: %d\n", c->conn_id,
				  err);
	}
	mutex_unlock(&dev->cm_lock);
}

/* vt3d reports a positive errno; anything else would be its bug. */
static int vt3_cm_status(u32 status)
{
	if (!status)
		return 0;
	return status <= MAX_ERRNO ? -(int)status : -EPROTO;
}

static void vt3_cm_connect_reply(struct vt3_qp *qp, const struct vt3_cm_ev *c)
{
	int status = vt3_cm_status(c->status);

	if (qp->conn != VT3_CONN_CONNECTING && qp->conn != VT3_CONN_PAIRING) {
		ibdev_dbg(qp->ibqp.device, "QP %u: CONNECT_REPLY ignored\n",
			  qp->qpn);
		return;
	}
	if (status) {
		vt3_qp_enter_error(qp);
		/* Only the QP can tell a pair's consumer (no CM event). */
		if (qp->conn == VT3_CONN_PAIRING)
			vt3_qp_ib_event(qp, IB_EVENT_QP_FATAL);
		vt3_conn_upcall(qp, IW_CM_EVENT_CONNECT_REPLY, status, c);
		vt3_conn_release(qp);
		return;
	}
	cancel_delayed_work(&qp->cm_timer);
	if (qp->conn == VT3_CONN_PAIRING) {
		/* Up: the consumer moved it to RTS already. */
		qp->conn = VT3_CONN_UP;
		return;
	}
	qp->conn = VT3_CONN_UP;
	WRITE_ONCE(qp->ib_state, IB_QPS_RTS);
	vt3_conn_upcall(qp, IW_CM_EVENT_CONNECT_REPLY, 0, c);
}

static void vt3_cm_established(struct vt3_qp *qp, const struct vt3_cm_ev *c)
{
	if (qp->conn == VT3_CONN_PAIRING) {
		qp->conn = VT3_CONN_UP;
		return;
	}
	if (qp->conn != VT3_CONN_ACCEPTING) {
		ibdev_dbg(qp->ibqp.device, "QP %u: ESTABLISHED ignored\n",
			  qp->qpn);
		return;
	}
	cancel_delayed_work(&qp->cm_timer);
	qp->conn = VT3_CONN_UP;
	WRITE_ONCE(qp->ib_state, IB_QPS_RTS);
	vt3_conn_upcall(qp, IW_CM_EVENT_ESTABLISHED, 0, c);
}

/* TERMINATE detail is layer << 12 | etype << 8 | ecode (RFC 5040). */
static enum ib_event_type vt3_terminate_event(u32 detail)
{
	u32 layer = detail >> 12 & 0xf;
	u32 etype = detail >> 8 & 0xf;

	/* RDMAP (0) and DDP (1): etype 1 protection, 2 operation errors. */
	if (layer <= 1 && etype == 1)
		return IB_EVENT_QP_ACCESS_ERR;
	if (layer <= 1 && etype == 2)
		return IB_EVENT_QP_REQ_ERR;
	return IB_EVENT_QP_FATAL;
}

/*
 * VT3_EV_QP: the end of the connection (docs/architecture.md §5), or the
 * peer's FIN. Events for a connection the driver already ended (an abort
 * it asked for) are late and dropped.
 */
static void vt3_cm_qp_event(struct vt3_qp *qp, u32 code, u32 detail)
{
	enum ib_event_type ibev = IB_EVENT_QP_FATAL;
	bool has_ibev = true;
	int status;

	ibdev_dbg(qp->ibqp.device, "QP %u event %u detail %#x\n", qp->qpn,
		  code, detail);
	switch (code) {
	case VT3_QPE_LAST_WQE_REACHED:
		/*
		 * After the error's own event (vt3d sends it later, and
		 * events are handled in order), whether or not a connection
		 * is still known: the consumer of an SRQ QP waits for it.
		 */
		vt3_qp_last_wqe(qp);
		return;
	case VT3_QPE_PEER_CLOSE:
		if (qp->conn == VT3_CONN_UP) {
			qp->conn = VT3_CONN_CLOSING;
			WRITE_ONCE(qp->ib_state, IB_QPS_SQD);
			vt3_conn_upcall(qp, IW_CM_EVENT_DISCONNECT, 0, NULL);
		}
		return;
	case VT3_QPE_CLOSE_COMPLETE:
		status = 0;
		if (detail)
			/* SQ work was outstanding: it is lost. */
			ibev = IB_EVENT_QP_FATAL;
		else if (qp->user)
			/*
			 * The vendor event (vt3-abi.h): libvt3 turns it back
			 * into a QP event. A kernel QP's work is flushed by
			 * the driver: it needs none.
			 */
			ibev = (enum ib_event_type)VT3_EVENT_LLP_CLOSE_COMPLETE;
		else
			has_ibev = false;
		break;
	case VT3_QPE_RESET:
		status = -ECONNRESET;
		break;
	case VT3_QPE_TIMEOUT:
		status = -ETIMEDOUT;
		break;
	case VT3_QPE_TERMINATE_RECEIVED:
		status = -ECONNRESET;
		ibev = vt3_terminate_event(detail);
		break;
	case VT3_QPE_TERMINATE_SENT:
		status = -ECONNABORTED;
		ibev = vt3_terminate_event(detail);
		break;
	case VT3_QPE_BAD_WQE:
		/*
		 * vt3d sends a TERMINATE and reports nothing more: the
		 * connection ends here for iw_cm too.
		 */
		status = -ECONNABORTED;
		ibev = IB_EVENT_QP_REQ_ERR;
		break;
	default:
		ibdev_warn_ratelimited(qp->ibqp.device,
				       "QP %u: unknown event code %u\n",
				       qp->qpn, code);
		return;
	}
	if (qp->conn == VT3_CONN_NONE)
		return;
	vt3_qp_enter_error(qp);
	if (has_ibev)
		vt3_qp_ib_event(qp, ibev);
	/*
	 * A clean close leaves the QP IDLE in vt3d, which reports no
	 * LAST_WQE_REACHED then; it takes no more SRQ WQEs all the same.
	 */
	if (code == VT3_QPE_CLOSE_COMPLETE)
		vt3_qp_last_wqe(qp);
	vt3_conn_end(qp, status);
}

/* Parses a vt3_event_cm in place: the skb's data is not aligned. */
static int vt3_cm_parse(const void *payload, size_t len, struct vt3_cm_ev *c)
{
	const struct vt3_event_cm *raw = payload;
	const size_t head = offsetof(struct vt3_event_cm, private_data);

	if (len < head)
		return -EPROTO;
	c->conn_id = get_unaligned_le32(&raw->conn_id);
	c->qpn = get_unaligned_le32(&raw->qpn);
	c->status = get_unaligned_le32(&raw->status);
	c->ird = get_unaligned_le32(&raw->ird);
	c->ord = get_unaligned_le32(&raw->ord);
	c->pd_len = get_unaligned_le16(&raw->pd_len);
	memcpy(&c->local, &raw->local, sizeof(c->local));
	memcpy(&c->remote, &raw->remote, sizeof(c->remote));
	c->pd = raw->private_data;
	if (c->pd_len > VT3_MAX_PRIVATE_DATA || len < head + c->pd_len)
		return -EPROTO;
	return 0;
}

static void vt3_cm_event(struct vt3_dev *dev, u16 type, const void *payload,
			 size_t len)
{
	struct vt3_event ev;
	struct vt3_cm_ev c;
	struct vt3_qp *qp;
	u32 qpn;

	switch (type) {
	case VT3_EV_QP:
		if (len < sizeof(ev))
			goto bad;
		memcpy(&ev, payload, sizeof(ev));
		qpn = le32_to_cpu(ev.handle);
		break;
	case VT3_EV_CONNECT_REQUEST:
	case VT3_EV_CONNECT_REPLY:
	case VT3_EV_ESTABLISHED:
		if (vt3_cm_parse(payload, len, &c))
			goto bad;
		if (type == VT3_EV_CONNECT_REQUEST) {
			vt3_cm_conn_request(dev, &c);
			return;
		}
		qpn = c.qpn;
		break;
	case VT3_EV_SRQ_LIMIT:
	case VT3_EV_SRQ_ERROR:
		if (len < sizeof(ev))
			goto bad;
		memcpy(&ev, payload, sizeof(ev));
		vt3_srq_event(dev, type, &ev);
		return;
	case VT3_EV_DEVICE_FATAL:
		if (len < sizeof(ev))
			goto bad;
		memcpy(&ev, payload, sizeof(ev));
		ibdev_err_ratelimited(&dev->ibdev,
				      "vt3d reports a fatal device error (code %u)\n",
				      le32_to_cpu(ev.code));
		vt3_cm_end_all(dev, -EIO);
		return;
	default:
		ibdev_warn_ratelimited(&dev->ibdev,
				       "unknown event %u dropped\n", type);
		return;
	}

	qp = vt3_qp_get(dev, qpn);
	if (!qp) {
		ibdev_dbg(&dev->ibdev, "%s event for no QP %u\n",
			  vt3_event_name(type), qpn);
		return;
	}
	mutex_lock(&qp->state_lock);
	if (type == VT3_EV_QP)
		vt3_cm_qp_event(qp, le32_to_cpu(ev.code),
				le32_to_cpu(ev.detail));
	else if (type == VT3_EV_CONNECT_REPLY)
		vt3_cm_connect_reply(qp, &c);
	else
		vt3_cm_established(qp, &c);
	mutex_unlock(&qp->state_lock);
	vt3_qp_put(qp);
	return;

bad:
	ibdev_warn_ratelimited(&dev->ibdev,
			       "malformed %s event (%zu bytes) dropped\n",
			       vt3_event_name(type), len);
}

static void vt3_cm_event_work(struct work_struct *work)
{
	struct vt3_dev *dev = container_of(work, struct vt3_dev, ev_work);
	const struct vt3_ctrl_hdr *hdr;
	struct sk_buff *skb;

	while ((skb = skb_dequeue(&dev->ev_queue))) {
		/* vt3_ctrl_rcv() checked the header and pulled the payload. */
		hdr = (const struct vt3_ctrl_hdr *)skb->data;
		vt3_cm_event(dev, le16_to_cpu(hdr->opcode), hdr + 1,
			     le16_to_cpu(hdr->len));
		consume_skb(skb);
		cond_resched();
	}
}

/* From the RX handler (softirq): takes @skb over. */
void vt3_cm_queue_event(struct vt3_dev *dev, struct sk_buff *skb)
{
	if (skb_queue_len(&dev->ev_queue) >= VT3_EV_QUEUE_MAX) {
		ibdev_warn_ratelimited(&dev->ibdev,
				       "event queue full: event dropped\n");
		kfree_skb(skb);
		return;
	}
	skb_queue_tail(&dev->ev_queue, skb);
	queue_work(vt3_cm_wq, &dev->ev_work);
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
