// SPDX-License-Identifier: GPL-2.0
/*
 * vt3 control channel: commands to vt3d and its responses and events, as
 * Ethernet frames of EtherType VT3_ETHERTYPE on the netdev (vt3_hw.h).
 *
 * Synchronous commands are serialized per device (cmd_lock): vt3d answers
 * in well under a millisecond, and the control path is not a hot path.
 * Fire-and-forget frames (doorbells, CQ arming) bypass the lock; vt3d
 * answers them only on error (doorbell) or with a RESP nobody waits for
 * (arm), which is logged when it reports a failure.
 *
 * CQ events are handled in the RX softirq; connection and QP events go to
 * process context in arrival order (vt3_cm.c).
 */
#include <linux/etherdevice.h>
#include <linux/if_ether.h>
#include <linux/pkt_sched.h>
#include <linux/random.h>
#include <linux/skbuff.h>

#include "vt3.h"

static const char * const vt3_cmd_names[] = {
	[VT3_CMD_QUERY_DEVICE] = "QUERY_DEVICE",
	[VT3_CMD_QUERY_PORT] = "QUERY_PORT",
	[VT3_CMD_SET_ADDR] = "SET_ADDR",
	[VT3_CMD_ALLOC_PD] = "ALLOC_PD",
	[VT3_CMD_DEALLOC_PD] = "DEALLOC_PD",
	[VT3_CMD_REG_MR] = "REG_MR",
	[VT3_CMD_DEREG_MR] = "DEREG_MR",
	[VT3_CMD_CREATE_CQ] = "CREATE_CQ",
	[VT3_CMD_DESTROY_CQ] = "DESTROY_CQ",
	[VT3_CMD_ARM_CQ] = "ARM_CQ",
	[VT3_CMD_CREATE_QP] = "CREATE_QP",
	[VT3_CMD_MODIFY_QP] = "MODIFY_QP",
	[VT3_CMD_QUERY_QP] = "QUERY_QP",
	[VT3_CMD_DESTROY_QP] = "DESTROY_QP",
	[VT3_CMD_DOORBELL] = "DOORBELL",
	[VT3_CMD_RESET] = "RESET",
	[VT3_CMD_LISTEN] = "LISTEN",
	[VT3_CMD_UNLISTEN] = "UNLISTEN",
	[VT3_CMD_CONNECT] = "CONNECT",
	[VT3_CMD_ACCEPT] = "ACCEPT",
	[VT3_CMD_REJECT] = "REJECT",
	[VT3_CMD_DISCONNECT] = "DISCONNECT",
};

static const char * const vt3_status_names[] = {
	[VT3_OK] = "OK",
	[VT3_ERR_INVALID] = "INVALID",
	[VT3_ERR_NO_RESOURCE] = "NO_RESOURCE",
	[VT3_ERR_NOT_FOUND] = "NOT_FOUND",
	[VT3_ERR_BUSY] = "BUSY",
	[VT3_ERR_BAD_ADDRESS] = "BAD_ADDRESS",
	[VT3_ERR_UNSUPPORTED] = "UNSUPPORTED",
	[VT3_ERR_STATE] = "STATE",
};

static const char * const vt3_event_names[] = {
	[VT3_EV_CQ_COMPLETION] = "CQ_COMPLETION",
	[VT3_EV_CQ_ERROR] = "CQ_ERROR",
	[VT3_EV_QP] = "QP",
	[VT3_EV_DEVICE_FATAL] = "DEVICE_FATAL",
	[VT3_EV_CONNECT_REQUEST] = "CONNECT_REQUEST",
	[VT3_EV_CONNECT_REPLY] = "CONNECT_REPLY",
	[VT3_EV_ESTABLISHED] = "ESTABLISHED",
};

static const char * const vt3_qp_state_names[] = {
	[VT3_QPS_IDLE] = "IDLE",
	[VT3_QPS_RTS] = "RTS",
	[VT3_QPS_CLOSING] = "CLOSING",
	[VT3_QPS_TERMINATE] = "TERMINATE",
	[VT3_QPS_ERROR] = "ERROR",
};

static const char *vt3_name(const char * const *table, size_t n,
			    unsigned int v)
{
	return v < n && table[v] ? table[v] : "?";
}

static const char *vt3_cmd_name(unsigned int opcode)
{
	return vt3_name(vt3_cmd_names, ARRAY_SIZE(vt3_cmd_names), opcode);
}

static const char *vt3_status_name(unsigned int status)
{
	return vt3_name(vt3_status_names, ARRAY_SIZE(vt3_status_names),
			status);
}

const char *vt3_event_name(unsigned int event)
{
	return vt3_name(vt3_event_names, ARRAY_SIZE(vt3_event_names), event);
}

const char *vt3_qp_state_name(unsigned int state)
{
	return vt3_name(vt3_qp_state_names, ARRAY_SIZE(vt3_qp_state_names),
			state);
}

static int vt3_status_to_errno(unsigned int status)
{
	switch (status) {
	case VT3_OK:
		return 0;
	case VT3_ERR_INVALID:
	case VT3_ERR_STATE:
		return -EINVAL;
	case VT3_ERR_NO_RESOURCE:
		return -ENOMEM;
	case VT3_ERR_NOT_FOUND:
		return -ENOENT;
	case VT3_ERR_BUSY:
		return -EBUSY;
	case VT3_ERR_BAD_ADDRESS:
		return -EFAULT;
	case VT3_ERR_UNSUPPORTED:
		return -EOPNOTSUPP;
	default:
		return -EIO;
	}
}

/* Builds and queues one control frame; any context with IRQs enabled. */
static int vt3_ctrl_xmit(struct vt3_dev *dev, u16 opcode, u32 seq,
			 const void *payload, size_t len, gfp_t gfp)
{
	struct net_device *netdev = dev->netdev;
	struct vt3_ctrl_hdr *hdr;
	struct sk_buff *skb;
	int hlen = LL_RESERVED_SPACE(netdev);
	int rc;

	if (len > U16_MAX)
		return -EINVAL;
	skb = alloc_skb(hlen + sizeof(*hdr) + len + netdev->needed_tailroom,
			gfp);
	if (!skb)
		return -ENOMEM;
	skb_reserve(skb, hlen);
	skb_reset_network_header(skb);
	hdr = skb_put_zero(skb, sizeof(*hdr));
	hdr->version = VT3_CTRL_VERSION;
	hdr->type = VT3_MSG_CMD;
	hdr->opcode = cpu_to_le16(opcode);
	hdr->seq = cpu_to_le32(seq);
	hdr->len = cpu_to_le16(len);
	if (len)
		skb_put_data(skb, payload, len);

	skb->dev = netdev;
	skb->protocol = htons(VT3_ETHERTYPE);
	skb->priority = TC_PRIO_CONTROL;
	/* vt3d consumes every frame of this EtherType; dst is ourselves. */
	if (dev_hard_header(skb, netdev, VT3_ETHERTYPE, dev->mac, dev->mac,
			    skb->len) < 0) {
		kfree_skb(skb);
		return -EINVAL;
	}
	/*
	 * dev_queue_xmit() consumes the skb whatever it returns: a negative
	 * errno or a positive NET_XMIT_* code (congestion still sends).
	 */
	rc = dev_queue_xmit(skb);
	return rc > 0 ? net_xmit_errno(rc) : rc;
}

static bool vt3_ctrl_usable(struct vt3_dev *dev, int *err)
{
	if (READ_ONCE(dev->ctrl.lost)) {
		*err = -EIO;
		return false;
	}
	/*
	 * virtio_net moves frames only while the netdev is up, and the qdisc
	 * drops them while the carrier is off: fail at once instead of
	 * waiting for a timeout.
	 */
	if (!netif_running(dev->netdev) || !netif_carrier_ok(dev->netdev)) {
		*err = -ENETDOWN;
		return false;
	}
	return true;
}

static u32 vt3_ctrl_seq(struct vt3_ctrl *c)
{
	u32 seq;

	spin_lock_bh(&c->lock);
	seq = c->next_seq++;
	spin_unlock_bh(&c->lock);
	return seq;
}

int vt3_cmd_timeout(struct vt3_dev *dev, enum vt3_cmd opcode,
		    const void *req, size_t req_len, void *resp,
		    size_t resp_len, unsigned int timeout_ms)
{
	struct vt3_ctrl *c = &dev->ctrl;
	unsigned long left = 1;
	bool answered;
	u32 seq;
	int err;

	mutex_lock(&c->cmd_lock);
	if (!vt3_ctrl_usable(dev, &err))
		goto out;

	spin_lock_bh(&c->lock);
	seq = c->next_seq++;
	c->waiting = true;
	c->wait_seq = seq;
	c->wait_opcode = opcode;
	c->resp = resp;
	c->resp_len = resp_len;
	c->result = -EIO;
	reinit_completion(&c->done);
	spin_unlock_bh(&c->lock);

	err = vt3_ctrl_xmit(dev, opcode, seq, req, req_len, GFP_KERNEL);
	if (!err)
		left = wait_for_completion_timeout(&c->done,
						   msecs_to_jiffies(timeout_ms));

	spin_lock_bh(&c->lock);
	answered = !c->waiting;
	c->waiting = false;
	c->resp = NULL;
	if (answered)
		err = c->result;
	spin_unlock_bh(&c->lock);

	if (!left && !answered) {
		err = -ETIMEDOUT;
		if (READ_ONCE(dev->attached)) {
			ibdev_err(&dev->ibdev,
				  "%s (seq %u) not answered in %u ms: vt3d is gone\n",
				  vt3_cmd_name(opcode), seq, timeout_ms);
			WRITE_ONCE(c->lost, true);
			vt3_device_lost(dev);
		}
	}
out:
	mutex_unlock(&c->cmd_lock);
	return err;
}

int vt3_cmd(struct vt3_dev *dev, enum vt3_cmd opcode, const void *req,
	    size_t req_len, void *resp, size_t resp_len)
{
	return vt3_cmd_timeout(dev, opcode, req, req_len, resp, resp_len,
			       vt3_cmd_timeout_ms);
}

/* Commands that name one object and return nothing. */
int vt3_cmd_handle(struct vt3_dev *dev, enum vt3_cmd opcode, u32 handle)
{
	struct vt3_cmd_handle req = { .handle = cpu_to_le32(handle) };

	return vt3_cmd(dev, opcode, &req, sizeof(req), NULL, 0);
}

/*
 * A command nobody waits for (doorbell, arm). Callable from any context
 * with IRQs enabled; dev_queue_xmit() must not run with IRQs off.
 */
int vt3_post(struct vt3_dev *dev, enum vt3_cmd opcode, const void *req,
	     size_t req_len)
{
	int err;

	if (!vt3_ctrl_usable(dev, &err))
		return err;
	return vt3_ctrl_xmit(dev, opcode, vt3_ctrl_seq(&dev->ctrl), req,
			     req_len, GFP_ATOMIC);
}

static void vt3_ctrl_resp(struct vt3_dev *dev, const struct vt3_ctrl_hdr *hdr,
			  const void *payload, size_t len)
{
	struct vt3_ctrl *c = &dev->ctrl;
	u16 opcode = le16_to_cpu(hdr->opcode);
	u16 status = le16_to_cpu(hdr->status);
	u32 seq = le32_to_cpu(hdr->seq);
	bool matched = false;

	spin_lock(&c->lock);
	if (c->waiting && c->wait_seq == seq && c->wait_opcode == opcode) {
		matched = true;
		if (status != VT3_OK) {
			c->result = vt3_status_to_errno(status);
		} else if (len < c->resp_len) {
			c->result = -EPROTO;
		} else {
			/* Longer answers are from a newer vt3d: keep ours. */
			if (c->resp_len)
				memcpy(c->resp, payload, c->resp_len);
			c->result = 0;
		}
		c->waiting = false;
		complete(&c->done);
	}
	spin_unlock(&c->lock);

	if (status != VT3_OK)
		ibdev_dbg(&dev->ibdev, "%s (seq %u): %s\n", vt3_cmd_name(opcode),
			  seq, vt3_status_name(status));
	if (matched)
		return;
	if (status != VT3_OK)
		ibdev_warn_ratelimited(&dev->ibdev,
				       "%s (seq %u) failed: %s\n",
				       vt3_cmd_name(opcode), seq,
				       vt3_status_name(status));
	else if (opcode != VT3_CMD_ARM_CQ)
		/* Late answer to a command that timed out. */
		ibdev_dbg(&dev->ibdev, "unexpected %s response (seq %u)\n",
			  vt3_cmd_name(opcode), seq);
}

/* Returns whether it took @skb over. */
static bool vt3_ctrl_event(struct vt3_dev *dev, const struct vt3_ctrl_hdr *hdr,
			   const void *payload, size_t len, struct sk_buff *skb)
{
	u16 type = le16_to_cpu(hdr->opcode);
	struct vt3_event ev;

	/* Events before the ib_device exists concern nothing of ours. */
	if (!READ_ONCE(dev->attached))
		return false;

	switch (type) {
	case VT3_EV_CQ_COMPLETION:
	case VT3_EV_CQ_ERROR:
		if (len < sizeof(ev)) {
			ibdev_warn_ratelimited(&dev->ibdev,
					       "short %s event (%zu bytes) dropped\n",
					       vt3_event_name(type), len);
			return false;
		}
		memcpy(&ev, payload, sizeof(ev));
		vt3_cq_event(dev, type, &ev);
		return false;
	default:
		/* Lengths are checked where the payload is parsed. */
		vt3_cm_queue_event(dev, skb);
		return true;
	}
}

/*
 * RX handler for VT3_ETHERTYPE, bound to our netdev only. Runs in softirq
 * under rcu_read_lock(), which vt3_destroy_cq() relies on. Nothing in the
 * frame is trusted.
 */
static int vt3_ctrl_rcv(struct sk_buff *skb, struct net_device *netdev,
			struct packet_type *pt, struct net_device *orig_dev)
{
	struct vt3_dev *dev = container_of(pt, struct vt3_dev, ptype);
	const struct vt3_ctrl_hdr *hdr;
	size_t len;

	skb = skb_share_check(skb, GFP_ATOMIC);
	if (!skb)
		return NET_RX_DROP;
	/*
	 * Only frames that came in on our netdev (not through an upper
	 * device's other slave) and were addressed to our MAC are vt3d's.
	 */
	if (orig_dev != dev->netdev || skb->pkt_type != PACKET_HOST)
		goto drop;
	if (!pskb_may_pull(skb, sizeof(*hdr)))
		goto drop;
	hdr = (const struct vt3_ctrl_hdr *)skb->data;
	len = le16_to_cpu(hdr->len);
	if (hdr->version != VT3_CTRL_VERSION) {
		ibdev_warn_ratelimited(&dev->ibdev,
				       "control frame version %u dropped\n",
				       hdr->version);
		goto drop;
	}
	/* Ethernet padding may follow the payload: more is fine. */
	if (skb->len < sizeof(*hdr) + len ||
	    !pskb_may_pull(skb, sizeof(*hdr) + len))
		goto drop;
	hdr = (const struct vt3_ctrl_hdr *)skb->data;

	switch (hdr->type) {
	case VT3_MSG_RESP:
		vt3_ctrl_resp(dev, hdr, hdr + 1, len);
		break;
	case VT3_MSG_EVENT:
		if (vt3_ctrl_event(dev, hdr, hdr + 1, len, skb))
			return NET_RX_SUCCESS;
		break;
	default:
		goto drop;
	}
	consume_skb(skb);
	return NET_RX_SUCCESS;
drop:
	kfree_skb(skb);
	return NET_RX_DROP;
}

void vt3_ctrl_init(struct vt3_dev *dev)
{
	struct vt3_ctrl *c = &dev->ctrl;

	mutex_init(&c->cmd_lock);
	spin_lock_init(&c->lock);
	init_completion(&c->done);
	/*
	 * A random start: late answers meant for an earlier instance on
	 * this netdev (one that gave up waiting) must not match ours.
	 */
	c->next_seq = get_random_u32();
}

/* Starts receiving on dev->netdev. */
void vt3_ctrl_start(struct vt3_dev *dev)
{
	dev->ptype.type = htons(VT3_ETHERTYPE);
	dev->ptype.dev = dev->netdev;
	dev->ptype.func = vt3_ctrl_rcv;
	dev_add_pack(&dev->ptype);
	dev->ptype_added = true;
}

/* After this returns no RX handler runs for dev (dev_remove_pack syncs). */
void vt3_ctrl_stop(struct vt3_dev *dev)
{
	if (!dev->ptype_added)
		return;
	dev_remove_pack(&dev->ptype);
	dev->ptype_added = false;
}
