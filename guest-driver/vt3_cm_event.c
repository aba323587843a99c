// SPDX-License-Identifier: GPL-2.0
/*
 * vt3d's connection and QP events, made into iw_cm and QP events.
 *
 * They reach the RX handler in softirq; vt3_cm_queue_event() queues the
 * skb as it is (no allocation there) and one work item per device
 * handles them in arrival order in process context, under the QP's
 * state_lock like everything else that moves a connection (vt3_cm.c).
 */
#include <linux/skbuff.h>

#include "vt3.h"
#include "vt3_cm.h"

/* Events waiting for process context; more means vt3d floods us. */
#define VT3_EV_QUEUE_MAX	4096

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

void vt3_cm_event_work(struct work_struct *work)
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
