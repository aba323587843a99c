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
 *
 * A session starts with the first contact (docs/security.md): a HELLO
 * and its answer under the provisioned key K, then a PROVE under the
 * session key Ks derived from both nonces. K comes from the firmware
 * configuration (QEMU -fw_cfg name=opt/vt3/key), read once.
 */
#include <linux/etherdevice.h>
#include <linux/fs.h>
#include <linux/if_vlan.h>
#include <linux/if_ether.h>
#include <linux/kmod.h>
#include <linux/module.h>
#include <linux/namei.h>
#include <linux/pkt_sched.h>
#include <linux/random.h>
#include <linux/skbuff.h>
#include <linux/string.h>

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
	[VT3_CMD_HELLO] = "HELLO",
	[VT3_CMD_ALLOC_MR] = "ALLOC_MR",
	[VT3_CMD_CREATE_SRQ] = "CREATE_SRQ",
	[VT3_CMD_MODIFY_SRQ] = "MODIFY_SRQ",
	[VT3_CMD_QUERY_SRQ] = "QUERY_SRQ",
	[VT3_CMD_DESTROY_SRQ] = "DESTROY_SRQ",
	[VT3_CMD_PAIR_QP] = "PAIR_QP",
	[VT3_CMD_ALLOC_MW] = "ALLOC_MW",
	[VT3_CMD_DEALLOC_MW] = "DEALLOC_MW",
	[VT3_CMD_REREG_MR] = "REREG_MR",
	[VT3_CMD_RESIZE_SRQ] = "RESIZE_SRQ",
	[VT3_CMD_PROVE] = "PROVE",
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
	[VT3_EV_SRQ_LIMIT] = "SRQ_LIMIT",
	[VT3_EV_SRQ_ERROR] = "SRQ_ERROR",
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
		/* A status we do not know: what vt3d did is unknown. */
		return -EPROTO;
	}
}

/*
 * Builds and queues one command frame with @counter, its MAC under @key;
 * any context with IRQs enabled.
 */
static int vt3_ctrl_send(struct vt3_dev *dev, u16 opcode, u32 seq,
			 u64 counter, const siphash_key_t *key,
			 const void *payload, size_t len, gfp_t gfp)
{
	struct net_device *netdev = dev->netdev;
	struct vt3_ctrl_hdr *hdr;
	struct sk_buff *skb;
	int hlen = LL_RESERVED_SPACE(netdev);
	int rc;

	if (len > U16_MAX)
		return -EINVAL;
	skb = alloc_skb(hlen + sizeof(*hdr) + len + VT3_CTRL_MAC_LEN +
			netdev->needed_tailroom, gfp);
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
	hdr->counter = cpu_to_le64(counter);
	if (len)
		skb_put_data(skb, payload, len);
	put_unaligned_le64(siphash(hdr, sizeof(*hdr) + len, key),
			   skb_put(skb, VT3_CTRL_MAC_LEN));

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

/* A command of the session: the next counter, the MAC under Ks. */
static int vt3_ctrl_xmit(struct vt3_dev *dev, u16 opcode, u32 seq,
			 const void *payload, size_t len, gfp_t gfp)
{
	struct vt3_ctrl *c = &dev->ctrl;

	return vt3_ctrl_send(dev, opcode, seq, atomic64_inc_return(&c->sent),
			     &c->key, payload, len, gfp);
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

/*
 * Arms the wait for the RESP of @opcode to the command about to be sent;
 * returns that command's seq. cmd_lock held.
 */
static u32 vt3_wait_begin(struct vt3_ctrl *c, enum vt3_cmd opcode,
			  void *resp, size_t resp_len)
{
	u32 seq;

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
	return seq;
}

/*
 * Waits for the answer to the command sent (@err: how its sending went).
 * Returns the result, -ETIMEDOUT when nothing answered in time.
 */
static int vt3_wait_end(struct vt3_ctrl *c, int err, unsigned int timeout_ms)
{
	unsigned long left = 1;
	bool answered;

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
	return !left && !answered ? -ETIMEDOUT : err;
}

/* One command of the session and the wait for its answer; cmd_lock held. */
static int vt3_cmd_once(struct vt3_dev *dev, enum vt3_cmd opcode,
			const void *req, size_t req_len, void *resp,
			size_t resp_len, unsigned int timeout_ms, u32 *seqp)
{
	struct vt3_ctrl *c = &dev->ctrl;
	int err;

	*seqp = vt3_wait_begin(c, opcode, resp, resp_len);
	err = vt3_ctrl_xmit(dev, opcode, *seqp, req, req_len, GFP_KERNEL);
	return vt3_wait_end(c, err, timeout_ms);
}

/* Extra probes before a silent vt3d counts as gone (a slow host stalls). */
#define VT3_LIVENESS_PROBES	2

int vt3_cmd_timeout(struct vt3_dev *dev, enum vt3_cmd opcode,
		    const void *req, size_t req_len, void *resp,
		    size_t resp_len, unsigned int timeout_ms)
{
	struct vt3_ctrl *c = &dev->ctrl;
	struct vt3_port_attr port;
	int err, i, probe = -ETIMEDOUT;
	u32 seq, pseq;

	mutex_lock(&c->cmd_lock);
	if (!vt3_ctrl_usable(dev, &err))
		goto out;
	err = vt3_cmd_once(dev, opcode, req, req_len, resp, resp_len,
			   timeout_ms, &seq);
	if (err != -ETIMEDOUT || !READ_ONCE(dev->attached))
		goto out;
	/*
	 * No answer. Declaring the device lost freezes every CQ and puts
	 * every QP in error without vt3d's word, so first ask whether it is
	 * there at all: if it answers, only this command's outcome is
	 * unknown (its caller keeps what it handed over, vt3_refused()).
	 */
	for (i = 0; i < VT3_LIVENESS_PROBES && probe == -ETIMEDOUT; i++)
		probe = vt3_cmd_once(dev, VT3_CMD_QUERY_PORT, NULL, 0, &port,
				     sizeof(port), timeout_ms, &pseq);
	if (probe != -ETIMEDOUT) {
		ibdev_warn(&dev->ibdev,
			   "%s (seq %u) not answered in %u ms, but vt3d answers: outcome unknown\n",
			   vt3_cmd_name(opcode), seq, timeout_ms);
		goto out;
	}
	ibdev_err(&dev->ibdev,
		  "%s (seq %u) and %d probes not answered in %u ms each: vt3d is gone\n",
		  vt3_cmd_name(opcode), seq, VT3_LIVENESS_PROBES, timeout_ms);
	WRITE_ONCE(c->lost, true);
	vt3_device_lost(dev);
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

static void vt3_refuse(struct vt3_dev *dev, enum vt3_refusal why)
{
	atomic64_inc(&dev->ctrl.refused[why]);
}

/* Takes @counter once, within the window below the highest taken. */
static bool vt3_ctrl_take_counter(struct vt3_ctrl *c, u64 counter)
{
	u64 behind;

	lockdep_assert_held(&c->lock);
	if (counter > c->rx_highest) {
		behind = counter - c->rx_highest;
		c->rx_seen = behind >= VT3_CTRL_REPLAY_WINDOW ?
			     0 : c->rx_seen << behind;
		c->rx_seen |= 1;
		c->rx_highest = counter;
		return true;
	}
	behind = c->rx_highest - counter;
	if (behind >= VT3_CTRL_REPLAY_WINDOW || c->rx_seen & BIT_ULL(behind))
		return false;
	c->rx_seen |= BIT_ULL(behind);
	return true;
}

/*
 * Whether a frame is vt3d's, of this session, and new: its MAC (after the
 * @len payload bytes, linear) matches Ks and its counter was not taken
 * before. Anything else is counted and dropped, unanswered.
 */
static bool vt3_ctrl_authentic(struct vt3_dev *dev,
			       const struct vt3_ctrl_hdr *hdr, size_t len)
{
	struct vt3_ctrl *c = &dev->ctrl;
	u64 mac = get_unaligned_le64((const u8 *)(hdr + 1) + len);
	enum vt3_refusal why = VT3_REFUSED_MAX;

	spin_lock(&c->lock);
	if (!c->keyed)
		why = VT3_REFUSED_NO_SESSION;
	else if (siphash(hdr, sizeof(*hdr) + len, &c->key) != mac)
		why = VT3_REFUSED_MAC;
	else if (!vt3_ctrl_take_counter(c, le64_to_cpu(hdr->counter)))
		why = VT3_REFUSED_REPLAY;
	spin_unlock(&c->lock);
	if (why == VT3_REFUSED_MAX)
		return true;
	vt3_refuse(dev, why);
	return false;
}

/* The provisioned key K, once loaded (vt3_key_load); fixed from then on. */
static siphash_key_t vt3_key;
static bool vt3_key_loaded;
static int vt3_key_err = -ENOENT;	/* why it is not; under vt3_key_lock */
static DEFINE_MUTEX(vt3_key_lock);

static bool vt3_insecure_no_key;
module_param_named(insecure_no_key, vt3_insecure_no_key, bool, 0444);
MODULE_PARM_DESC(insecure_no_key,
		 "run without a provisioned key (K all zeros, as vt3d --insecure-no-key): any guest process can drive vt3d (default 0)");

/*
 * First contact, step 2 (vt3_hw.h): vt3d's answer to the HELLO waiting,
 * taken only with that HELLO's seq and nonce, counter 0, status OK, the
 * exact length and the MAC under K. Any other HELLO answer (none waiting,
 * a late one to an earlier HELLO, a forgery) is counted and dropped.
 * Returns whether it was taken.
 */
static bool vt3_ctrl_hello_resp(struct vt3_dev *dev,
				const struct vt3_ctrl_hdr *hdr, size_t len)
{
	const struct vt3_resp_hello *resp = (const void *)(hdr + 1);
	u64 mac = get_unaligned_le64((const u8 *)(hdr + 1) + len);
	struct vt3_ctrl *c = &dev->ctrl;
	bool taken = false;

	spin_lock(&c->lock);
	if (c->waiting && c->wait_opcode == VT3_CMD_HELLO &&
	    c->wait_seq == le32_to_cpu(hdr->seq) && !hdr->status &&
	    !hdr->counter && len == sizeof(*resp) &&
	    siphash(hdr, sizeof(*hdr) + len, &vt3_key) == mac &&
	    !memcmp(resp->driver_nonce, c->hello_nonce, VT3_NONCE_LEN)) {
		memcpy(c->resp, resp, sizeof(*resp));
		c->result = 0;
		c->waiting = false;
		complete(&c->done);
		taken = true;
	}
	spin_unlock(&c->lock);
	if (!taken)
		vt3_refuse(dev, VT3_REFUSED_HELLO);
	return taken;
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
	 * device's other slave), untagged and addressed to our MAC, can be
	 * vt3d's; which of them are is for the MAC to say.
	 *
	 * vt3d never sends a tagged control frame (vt3_hw.h), so a tagged
	 * one is not ours at all: ignored, not counted as a refusal (anyone
	 * on a VLAN could move the counters otherwise). The core strips a
	 * tag before it reaches us: a frame of a VLAN device comes with
	 * skb->dev that device, one with a VLAN id no device takes as
	 * PACKET_OTHERHOST; a tag left in place (or an unstripped VLAN
	 * EtherType) is checked too. A priority tag (VLAN id 0) leaves no
	 * trace once stripped: such a frame is taken as untagged.
	 */
	if (orig_dev != dev->netdev || skb->pkt_type != PACKET_HOST ||
	    is_vlan_dev(netdev) || skb_vlan_tag_present(skb) ||
	    eth_type_vlan(skb->protocol))
		goto drop;
	if (!pskb_may_pull(skb, sizeof(*hdr))) {
		vt3_refuse(dev, VT3_REFUSED_SHORT);
		goto drop;
	}
	hdr = (const struct vt3_ctrl_hdr *)skb->data;
	len = le16_to_cpu(hdr->len);
	if (hdr->version != VT3_CTRL_VERSION) {
		vt3_refuse(dev, VT3_REFUSED_VERSION);
		ibdev_warn_ratelimited(&dev->ibdev,
				       "control frame of protocol v%u refused: vt3.ko speaks v%u (vt3.ko and vt3d must come from the same release)\n",
				       hdr->version, VT3_CTRL_VERSION);
		goto drop;
	}
	/* Ethernet padding may follow the MAC: more is fine. */
	if (skb->len < sizeof(*hdr) + len + VT3_CTRL_MAC_LEN ||
	    !pskb_may_pull(skb, sizeof(*hdr) + len + VT3_CTRL_MAC_LEN)) {
		vt3_refuse(dev, VT3_REFUSED_SHORT);
		goto drop;
	}
	hdr = (const struct vt3_ctrl_hdr *)skb->data;
	/* First contact: under K, not of any session. */
	if (hdr->type == VT3_MSG_RESP &&
	    le16_to_cpu(hdr->opcode) == VT3_CMD_HELLO) {
		if (!vt3_ctrl_hello_resp(dev, hdr, len))
			goto drop;
		consume_skb(skb);
		return NET_RX_SUCCESS;
	}
	if (!vt3_ctrl_authentic(dev, hdr, len))
		goto drop;

	switch (hdr->type) {
	case VT3_MSG_RESP:
		vt3_ctrl_resp(dev, hdr, hdr + 1, len);
		break;
	case VT3_MSG_EVENT:
		if (vt3_ctrl_event(dev, hdr, hdr + 1, len, skb))
			return NET_RX_SUCCESS;
		break;
	default:
		vt3_refuse(dev, VT3_REFUSED_TYPE);
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

/* ------------------------------------------------------------------ */
/* The provisioned key                                                 */

#define VT3_FW_CFG_DIR		"/sys/firmware/qemu_fw_cfg"
#define VT3_KEY_PATH		VT3_FW_CFG_DIR "/by_name/" VT3_FW_CFG_KEY "/raw"

/* Reads K into @raw (VT3_KEY_LEN + 1 bytes): exactly VT3_KEY_LEN or none. */
static int vt3_key_read(u8 *raw)
{
	struct file *f;
	ssize_t n = 0;
	loff_t pos = 0;
	size_t got = 0;

	f = filp_open(VT3_KEY_PATH, O_RDONLY, 0);
	if (IS_ERR(f))
		return PTR_ERR(f);
	/* One byte more than a key: a longer file is no key either. */
	while (got <= VT3_KEY_LEN) {
		n = kernel_read(f, raw + got, VT3_KEY_LEN + 1 - got, &pos);
		if (n <= 0)
			break;
		got += n;
	}
	filp_close(f, NULL);
	if (n < 0)
		return n;
	return got == VT3_KEY_LEN ? 0 : -EINVAL;
}

/* Whether qemu_fw_cfg's files are there (the module loaded, or built in). */
static bool vt3_fw_cfg_present(void)
{
	struct path path;

	if (kern_path(VT3_FW_CFG_DIR, LOOKUP_FOLLOW, &path))
		return false;
	path_put(&path);
	return true;
}

/*
 * Loads K unless it is loaded already: the firmware configuration file
 * QEMU's -fw_cfg name=opt/vt3/key gives the guest, or all zeros with
 * insecure_no_key. It opens a file and may run modprobe for qemu_fw_cfg
 * (Debian builds it as a module): call it with no lock held (module
 * init, before a probe). Returns 0 when K is there, -ENOKEY otherwise.
 */
int vt3_key_load(void)
{
	u8 raw[VT3_KEY_LEN + 1];
	int err = 0;

	if (vt3_key_ready())
		return 0;
	mutex_lock(&vt3_key_lock);
	if (vt3_key_loaded)
		goto out;
	if (vt3_insecure_no_key) {
		memset(&vt3_key, 0, sizeof(vt3_key));
		pr_warn("vt3: insecure_no_key=1: running unauthenticated, any guest process can drive vt3d (vt3d must run with --insecure-no-key)\n");
	} else {
		/* -EINVAL: the file is not VT3_KEY_LEN bytes long. */
		err = vt3_key_read(raw);
		/* Not there yet: load qemu_fw_cfg (bounded: modprobe). */
		if (err == -ENOENT && !vt3_fw_cfg_present() &&
		    !request_module("qemu_fw_cfg"))
			err = vt3_key_read(raw);
		if (!err) {
			vt3_key.key[0] = get_unaligned_le64(raw);
			vt3_key.key[1] = get_unaligned_le64(raw + 8);
		}
		memzero_explicit(raw, sizeof(raw));
		WRITE_ONCE(vt3_key_err, err);
		if (err)
			goto out;
	}
	/* Readers test the flag, then read the key without the mutex. */
	smp_store_release(&vt3_key_loaded, true);
out:
	mutex_unlock(&vt3_key_lock);
	return err ? -ENOKEY : 0;
}

bool vt3_key_ready(void)
{
	/* Pairs with vt3_key_load's release: K is read after the flag. */
	return smp_load_acquire(&vt3_key_loaded);
}

/* Once per module load: what the VM lacks, and the way out. */
void vt3_key_report_missing(struct net_device *netdev)
{
	pr_err_once("vt3: no key for %s in %s (%pe), not attaching: give the VM the key file of `vt3d serve --key-file KEYFILE` (QEMU: -fw_cfg name=%s,file=KEYFILE; libvirt: <sysinfo type='fwcfg'><entry name='%s' file='KEYFILE'/></sysinfo>), or run both unauthenticated: vt3d --insecure-no-key and vt3.ko insecure_no_key=1\n",
		    netdev->name, VT3_KEY_PATH, ERR_PTR(READ_ONCE(vt3_key_err)),
		    VT3_FW_CFG_KEY, VT3_FW_CFG_KEY);
}

/* Module unload: no device is left to use K. */
void vt3_key_wipe(void)
{
	memzero_explicit(&vt3_key, sizeof(vt3_key));
	WRITE_ONCE(vt3_key_loaded, false);
}

/* ------------------------------------------------------------------ */
/* First contact (docs/security.md)                                   */

/*
 * Steps 1 and 2: a HELLO with a fresh nonce, counter 0, MAC under K, and
 * vt3d's answer for that nonce (vt3_ctrl_hello_resp) into @resp.
 */
static int vt3_hello(struct vt3_dev *dev, struct vt3_resp_hello *resp,
		     unsigned int timeout_ms)
{
	struct vt3_ctrl *c = &dev->ctrl;
	struct vt3_cmd_hello req;
	u32 seq;
	int err;

	get_random_bytes(req.driver_nonce, sizeof(req.driver_nonce));
	/* Read by the RX path only while the wait below is armed. */
	memcpy(c->hello_nonce, req.driver_nonce, VT3_NONCE_LEN);
	seq = vt3_wait_begin(c, VT3_CMD_HELLO, resp, sizeof(*resp));
	err = vt3_ctrl_send(dev, VT3_CMD_HELLO, seq, 0, &vt3_key, &req,
			    sizeof(req), GFP_KERNEL);
	return vt3_wait_end(c, err, timeout_ms);
}

/* Step 3: Ks = SipHash(K, label | driver nonce | device nonce), twice. */
static void vt3_session_key(const struct vt3_resp_hello *hello,
			    siphash_key_t *ks)
{
	struct vt3_kdf_input in = {};

	BUILD_BUG_ON(sizeof(VT3_KDF_LABEL_K0) > sizeof(in.label) ||
		     sizeof(VT3_KDF_LABEL_K1) > sizeof(in.label));
	memcpy(in.driver_nonce, hello->driver_nonce, VT3_NONCE_LEN);
	memcpy(in.device_nonce, hello->device_nonce, VT3_NONCE_LEN);
	memcpy(in.label, VT3_KDF_LABEL_K0, sizeof(VT3_KDF_LABEL_K0));
	ks->key[0] = siphash(&in, sizeof(in), &vt3_key);
	memset(in.label, 0, sizeof(in.label));
	memcpy(in.label, VT3_KDF_LABEL_K1, sizeof(VT3_KDF_LABEL_K1));
	ks->key[1] = siphash(&in, sizeof(in), &vt3_key);
}

/*
 * A new session under @ks: frames sent count from 1 again (the PROVE is
 * the first), and the replay window starts over with counter 0 taken
 * (it is first contact's, never a session frame's).
 */
static void vt3_session_start(struct vt3_ctrl *c, const siphash_key_t *ks)
{
	spin_lock_bh(&c->lock);
	c->key = *ks;
	c->keyed = true;
	atomic64_set(&c->sent, 0);
	c->rx_highest = 0;
	c->rx_seen = 1;
	spin_unlock_bh(&c->lock);
}

/* A session that was not proven: nothing more is taken under its key. */
static void vt3_session_end(struct vt3_ctrl *c)
{
	spin_lock_bh(&c->lock);
	c->keyed = false;
	memzero_explicit(&c->key, sizeof(c->key));
	spin_unlock_bh(&c->lock);
}

/*
 * Steps 3 and 4: the PROVE, the session's first command (counter 1, MAC
 * under Ks). vt3d answers it under Ks only once it took the proof and
 * made this session its own: that answer, counter 1, is its first frame.
 */
static int vt3_prove(struct vt3_dev *dev, const struct vt3_resp_hello *hello,
		     unsigned int timeout_ms)
{
	struct vt3_ctrl *c = &dev->ctrl;
	struct vt3_cmd_prove req;
	u32 seq;
	int err;

	memcpy(req.driver_nonce, hello->driver_nonce, VT3_NONCE_LEN);
	memcpy(req.device_nonce, hello->device_nonce, VT3_NONCE_LEN);
	err = vt3_cmd_once(dev, VT3_CMD_PROVE, &req, sizeof(req), NULL, 0,
			   timeout_ms, &seq);
	if (err)
		return err;
	spin_lock_bh(&c->lock);
	if (c->rx_highest != 1)
		err = -EPROTO;
	spin_unlock_bh(&c->lock);
	return err;
}

/*
 * Starts a session with vt3d: up to @tries first contacts, each with
 * fresh nonces (vt3d refuses a nonce it has seen), each step waiting up
 * to @timeout_ms. Only when vt3d answered the PROVE is the device ours.
 */
int vt3_ctrl_first_contact(struct vt3_dev *dev, unsigned int tries,
			   unsigned int timeout_ms)
{
	struct vt3_ctrl *c = &dev->ctrl;
	struct vt3_resp_hello hello;
	siphash_key_t ks;
	int err = -ETIMEDOUT;

	if (!vt3_key_ready())
		return -ENOKEY;
	mutex_lock(&c->cmd_lock);
	while (tries-- && vt3_ctrl_usable(dev, &err)) {
		err = vt3_hello(dev, &hello, timeout_ms);
		if (err)
			continue;
		vt3_session_key(&hello, &ks);
		vt3_session_start(c, &ks);
		memzero_explicit(&ks, sizeof(ks));
		err = vt3_prove(dev, &hello, timeout_ms);
		if (!err)
			break;
		netdev_dbg(dev->netdev, "vt3: PROVE failed (%d)\n", err);
		vt3_session_end(c);
	}
	mutex_unlock(&c->cmd_lock);
	return err;
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

/*
 * After this returns no RX handler runs for dev (dev_remove_pack syncs),
 * and Ks is wiped: the device sends nothing more.
 */
void vt3_ctrl_stop(struct vt3_dev *dev)
{
	if (dev->ptype_added) {
		dev_remove_pack(&dev->ptype);
		dev->ptype_added = false;
	}
	vt3_session_end(&dev->ctrl);
}
