// SPDX-License-Identifier: GPL-2.0
/*
 * vt3_kforge: frames that claim to come from vt3d, put straight into the
 * receive path of a vt3 device's netdev (as a forwarding device, a bridge
 * or a hostile peer would deliver them): a forged DEVICE_FATAL event, a
 * genuine answer of vt3d captured and delivered again, a captured answer
 * with one byte of its header changed, and a forged answer to a HELLO
 * (first contact, vt3_hw.h) while none is waiting, which would start a
 * session of the forger's if taken. vt3.ko must refuse them all
 * (hw_counters ctrl_refused_mac 2, ctrl_refused_replay 1,
 * ctrl_refused_hello 1; the test reads those) and carry on. On load it
 * runs against every vt3 device and logs
 * "vt3_kforge: <dev>: N passed, N failed" (7 checks); unload it
 * afterwards.
 */
#include <linux/delay.h>
#include <linux/etherdevice.h>
#include <linux/module.h>
#include <linux/netdevice.h>
#include <linux/random.h>
#include <linux/skbuff.h>
#include <rdma/ib_verbs.h>

#include "../include/vt3_hw.h"

static int passed, failed;
static atomic_t fatal_events;

#define CHECK(cond, fmt, ...)						\
	do {								\
		if (cond) {						\
			passed++;					\
			pr_info("vt3_kforge: ok   " fmt "\n", ##__VA_ARGS__); \
		} else {						\
			failed++;					\
			pr_info("vt3_kforge: FAIL " fmt "\n", ##__VA_ARGS__); \
		}							\
	} while (0)

/* Catches the first control frame vt3d sends to @netdev. */
struct vt3_kforge_tap {
	struct packet_type pt;
	spinlock_t lock;
	struct sk_buff *caught;
};

static int vt3_kforge_tap_rcv(struct sk_buff *skb, struct net_device *netdev,
			      struct packet_type *pt,
			      struct net_device *orig_dev)
{
	struct vt3_kforge_tap *tap = container_of(pt, struct vt3_kforge_tap, pt);

	if (skb->protocol == htons(VT3_ETHERTYPE) &&
	    skb->pkt_type == PACKET_HOST) {
		spin_lock(&tap->lock);
		if (!tap->caught)
			tap->caught = skb_copy(skb, GFP_ATOMIC);
		spin_unlock(&tap->lock);
	}
	kfree_skb(skb);
	return 0;
}

/* Delivers @skb (data at the Ethernet header) as if @netdev received it. */
static void vt3_kforge_deliver(struct net_device *netdev, struct sk_buff *skb)
{
	skb->dev = netdev;
	skb->protocol = eth_type_trans(skb, netdev);
	netif_rx(skb);
}

/* A DEVICE_FATAL event with a made-up counter and MAC. */
static struct sk_buff *vt3_kforge_fatal(struct net_device *netdev)
{
	struct vt3_ctrl_hdr *hdr;
	struct sk_buff *skb;
	struct ethhdr *eth;

	skb = alloc_skb(NET_IP_ALIGN + ETH_HLEN + sizeof(*hdr) +
			VT3_CTRL_MAC_LEN, GFP_KERNEL);
	if (!skb)
		return NULL;
	skb_reserve(skb, NET_IP_ALIGN);
	eth = skb_put(skb, ETH_HLEN);
	ether_addr_copy(eth->h_dest, netdev->dev_addr);
	ether_addr_copy(eth->h_source, netdev->dev_addr);
	eth->h_proto = htons(VT3_ETHERTYPE);
	hdr = skb_put_zero(skb, sizeof(*hdr));
	hdr->version = VT3_CTRL_VERSION;
	hdr->type = VT3_MSG_EVENT;
	hdr->opcode = cpu_to_le16(VT3_EV_DEVICE_FATAL);
	hdr->counter = cpu_to_le64(1000000);
	get_random_bytes(skb_put(skb, VT3_CTRL_MAC_LEN), VT3_CTRL_MAC_LEN);
	return skb;
}

/*
 * A RESP HELLO (counter 0, nonces and MAC made up) to no HELLO: vt3.ko
 * sent its HELLO at attach and waits for none now.
 */
static struct sk_buff *vt3_kforge_hello(struct net_device *netdev)
{
	struct vt3_resp_hello *resp;
	struct vt3_ctrl_hdr *hdr;
	struct sk_buff *skb;
	struct ethhdr *eth;

	skb = alloc_skb(NET_IP_ALIGN + ETH_HLEN + sizeof(*hdr) +
			sizeof(*resp) + VT3_CTRL_MAC_LEN, GFP_KERNEL);
	if (!skb)
		return NULL;
	skb_reserve(skb, NET_IP_ALIGN);
	eth = skb_put(skb, ETH_HLEN);
	ether_addr_copy(eth->h_dest, netdev->dev_addr);
	ether_addr_copy(eth->h_source, netdev->dev_addr);
	eth->h_proto = htons(VT3_ETHERTYPE);
	hdr = skb_put_zero(skb, sizeof(*hdr));
	hdr->version = VT3_CTRL_VERSION;
	hdr->type = VT3_MSG_RESP;
	hdr->opcode = cpu_to_le16(VT3_CMD_HELLO);
	hdr->seq = cpu_to_le32(get_random_u32());
	hdr->len = cpu_to_le16(sizeof(*resp));
	resp = skb_put(skb, sizeof(*resp));
	get_random_bytes(resp, sizeof(*resp));
	get_random_bytes(skb_put(skb, VT3_CTRL_MAC_LEN), VT3_CTRL_MAC_LEN);
	return skb;
}

static void vt3_kforge_event(struct ib_event_handler *h, struct ib_event *ev)
{
	if (ev->event == IB_EVENT_DEVICE_FATAL)
		atomic_inc(&fatal_events);
}

static void vt3_kforge_run(struct ib_device *dev)
{
	struct vt3_kforge_tap tap = {};
	struct ib_event_handler handler;
	struct net_device *netdev;
	struct sk_buff *skb, *changed;
	struct ib_pd *pd;

	/* vt3.ko names its netdev there (iWARP devices do). */
	netdev = dev_get_by_name(&init_net, dev->iw_ifname);
	CHECK(netdev, "%s: its netdev %s", dev->name, dev->iw_ifname);
	if (!netdev)
		return;
	INIT_IB_EVENT_HANDLER(&handler, dev, vt3_kforge_event);
	ib_register_event_handler(&handler);

	/* A genuine answer: ALLOC_PD's response, caught on its way in. */
	spin_lock_init(&tap.lock);
	tap.pt.type = htons(ETH_P_ALL);
	tap.pt.dev = netdev;
	tap.pt.func = vt3_kforge_tap_rcv;
	dev_add_pack(&tap.pt);
	pd = ib_alloc_pd(dev, 0);
	dev_remove_pack(&tap.pt);	/* synchronizes with the tap */
	CHECK(!IS_ERR(pd), "ib_alloc_pd");
	if (!IS_ERR(pd))
		ib_dealloc_pd(pd);
	skb = tap.caught;
	CHECK(skb, "caught vt3d's answer");

	changed = skb ? skb_copy(skb, GFP_KERNEL) : NULL;
	if (skb) {
		skb_push(skb, ETH_HLEN);
		vt3_kforge_deliver(netdev, skb);		/* replayed */
	}
	if (changed) {
		/* The response's status, OK -> an error. */
		changed->data[offsetof(struct vt3_ctrl_hdr, status)] ^= 1;
		skb_push(changed, ETH_HLEN);
		vt3_kforge_deliver(netdev, changed);	/* modified */
	}
	skb = vt3_kforge_fatal(netdev);
	CHECK(skb, "forged DEVICE_FATAL built");
	if (skb)
		vt3_kforge_deliver(netdev, skb);
	skb = vt3_kforge_hello(netdev);
	CHECK(skb, "forged HELLO answer built");
	if (skb)
		vt3_kforge_deliver(netdev, skb);
	msleep(200);			/* netif_rx delivers in softirq */

	CHECK(atomic_read(&fatal_events) == 0, "no DEVICE_FATAL (%d)",
	      atomic_read(&fatal_events));
	pd = ib_alloc_pd(dev, 0);
	CHECK(!IS_ERR(pd), "the session goes on: ib_alloc_pd (%d)",
	      PTR_ERR_OR_ZERO(pd));
	if (!IS_ERR(pd))
		ib_dealloc_pd(pd);
	ib_unregister_event_handler(&handler);
	dev_put(netdev);
	pr_info("vt3_kforge: %s: %d passed, %d failed\n", dev->name, passed,
		failed);
}

static int vt3_kforge_add(struct ib_device *dev)
{
	if (!strncmp(dev->name, "vt3", 3))
		vt3_kforge_run(dev);
	return 0;
}

static void vt3_kforge_remove(struct ib_device *dev, void *data)
{
}

static struct ib_client vt3_kforge_client = {
	.name = "vt3_kforge",
	.add = vt3_kforge_add,
	.remove = vt3_kforge_remove,
};

static int __init vt3_kforge_init(void)
{
	return ib_register_client(&vt3_kforge_client);
}

static void __exit vt3_kforge_exit(void)
{
	ib_unregister_client(&vt3_kforge_client);
}

module_init(vt3_kforge_init);
module_exit(vt3_kforge_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("vt3.ko refuses control frames vt3d did not send");
