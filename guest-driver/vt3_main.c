// SPDX-License-Identifier: GPL-2.0
/*
 * vt3.ko: module init/exit, netdev notifier, probe, and the ib_device's
 * life cycle.
 *
 * A vt3 RNIC is a virtio-net NIC whose backend is vt3d. The module probes
 * every netdev driven by virtio_net once it is up with its carrier on
 * (virtio_net moves no frames before that): it sends VT3_CMD_QUERY_DEVICE
 * and registers an iWARP ib_device "vt3_%d" when vt3d answers. The query
 * follows the HELLO/PROVE first-contact handshake that starts a session
 * with vt3d (vt3_ctrl_first_contact()). `rdma link add NAME type vt3
 * netdev DEV` does the same for any Ethernet netdev, by name. Probes run
 * on a workqueue, never in the notifier: they wait for an answer that the
 * RX path must be free to deliver.
 *
 * Teardown has one path: ib_unregister_device*() (netdev unregistered,
 * vt3d stopped answering, `rdma link del`, module unload) disassociates
 * user contexts and destroys every object through our destroy verbs; then
 * the core calls vt3_dealloc_driver(), which resets the device and stops
 * the control channel.
 *
 * Nothing attaches without the provisioned key (vt3_ctrl.c). A device
 * lost because vt3d stopped answering leaves its netdev probed again
 * (vt3_reprobe_start()): a vt3d that is back gets a new session and a new
 * ib_device.
 */
#include <linux/device.h>
#include <linux/dma-mapping.h>
#include <linux/etherdevice.h>
#include <linux/inetdevice.h>
#include <linux/iommu.h>
#include <linux/module.h>
#include <linux/rtnetlink.h>
#include <linux/string.h>
#include <net/addrconf.h>
#include <rdma/iw_cm.h>
#include <rdma/rdma_netlink.h>

#include "vt3.h"

unsigned int vt3_cmd_timeout_ms = 5000;
module_param_named(cmd_timeout_ms, vt3_cmd_timeout_ms, uint, 0644);
MODULE_PARM_DESC(cmd_timeout_ms,
		 "ms to wait for vt3d to answer a command before declaring it gone (default 5000)");

unsigned int vt3_probe_timeout_ms = 2000;
module_param_named(probe_timeout_ms, vt3_probe_timeout_ms, uint, 0644);
MODULE_PARM_DESC(probe_timeout_ms,
		 "ms to wait for each answer of vt3d while probing a netdev (default 2000)");

/* First contacts a probe tries, each with fresh nonces (vt3_ctrl.c). */
#define VT3_PROBE_TRIES		3

/*
 * vt3d reports the outcome of every CONNECT and ACCEPT (its TCP gives up
 * after 60 s, MPA after 10 s); this only bounds the wait when it lost
 * track, so that iw_cm, which blocks destroy until the outcome, cannot
 * hang.
 */
unsigned int vt3_cm_timeout_ms = 90000;
module_param_named(cm_timeout_ms, vt3_cm_timeout_ms, uint, 0644);
MODULE_PARM_DESC(cm_timeout_ms,
		 "ms to wait for vt3d to report the outcome of a connect or accept (default 90000)");

/* Local sanity caps on what vt3d advertises (it is not trusted either). */
#define VT3_MAX_DEPTH		BIT(16)
#define VT3_MAX_PBL_PAGES	(KMALLOC_MAX_SIZE / sizeof(__le64))
/* A fast-reg MR's page list: one kmalloc of at most 32 KiB. */
#define VT3_MAX_FAST_REG_PAGES	4096

static struct workqueue_struct *vt3_wq;

static void vt3_carrier_work(struct work_struct *work);
static void vt3_reprobe_start(struct net_device *netdev, const char *name);
static bool vt3_reprobe_stop(struct net_device *netdev);
struct workqueue_struct *vt3_cm_wq;

/* Serializes probes/attaches so one netdev never gets two ib_devices. */
static DEFINE_MUTEX(vt3_attach_lock);

/* Netdevs with a probe queued, so carrier flaps do not pile probes up. */
static DEFINE_SPINLOCK(vt3_probe_lock);
static LIST_HEAD(vt3_probe_list);

struct vt3_probe {
	struct work_struct work;
	struct list_head list;
	struct net_device *netdev;
	netdevice_tracker tracker;
};

static const struct ib_device_ops vt3_dev_ops;

static u32 vt3_clamp(u32 v, u32 cap)
{
	return min(v, cap);
}

/*
 * vt3d advertises entries (max_qp_wr, max_cqe) and accepts rings up to the
 * next power of two above them; we cap both at VT3_MAX_DEPTH.
 */
static u32 vt3_depth_for(u32 entries)
{
	return min_t(u64, roundup_pow_of_two((u64)entries + 1), VT3_MAX_DEPTH);
}

static void vt3_set_limits(struct vt3_dev *dev, const struct vt3_device_attr *a,
			   u32 max_msg_size)
{
	struct vt3_limits *l = &dev->lim;

	l->fw_ver = le64_to_cpu(a->fw_ver);
	l->max_mr_size = le64_to_cpu(a->max_mr_size);
	l->page_size_cap = le64_to_cpu(a->page_size_cap);
	l->vendor_id = le32_to_cpu(a->vendor_id);
	l->vendor_part_id = le32_to_cpu(a->vendor_part_id);
	l->hw_ver = le32_to_cpu(a->hw_ver);
	l->max_qp = vt3_clamp(le32_to_cpu(a->max_qp), INT_MAX);
	l->max_qp_wr = vt3_clamp(le32_to_cpu(a->max_qp_wr), VT3_MAX_DEPTH);
	l->max_qp_depth = vt3_depth_for(l->max_qp_wr);
	l->max_sge = vt3_clamp(le32_to_cpu(a->max_sge), VT3_MAX_SGE);
	l->max_sge_rd = vt3_clamp(le32_to_cpu(a->max_sge_rd), l->max_sge);
	l->max_cq = vt3_clamp(le32_to_cpu(a->max_cq), INT_MAX);
	l->max_cqe = vt3_clamp(le32_to_cpu(a->max_cqe), VT3_MAX_DEPTH - 1);
	l->max_cq_depth = vt3_depth_for(l->max_cqe);
	l->max_mr = vt3_clamp(le32_to_cpu(a->max_mr), INT_MAX);
	l->max_pd = vt3_clamp(le32_to_cpu(a->max_pd), INT_MAX);
	l->max_ord = vt3_clamp(le32_to_cpu(a->max_qp_rd_atom), U8_MAX);
	l->max_ird = vt3_clamp(le32_to_cpu(a->max_qp_init_rd_atom), U8_MAX);
	l->max_inline = vt3_clamp(le32_to_cpu(a->max_inline), VT3_MAX_INLINE);
	l->max_pbl_pages = vt3_clamp(le32_to_cpu(a->max_pbl_pages),
				     VT3_MAX_PBL_PAGES);
	l->max_fast_reg_pages = vt3_clamp(le32_to_cpu(a->max_fast_reg_pages),
					  VT3_MAX_FAST_REG_PAGES);
	l->max_srq = vt3_clamp(le32_to_cpu(a->max_srq), INT_MAX);
	l->max_srq_wr = vt3_clamp(le32_to_cpu(a->max_srq_wr), VT3_MAX_DEPTH);
	l->max_srq_depth = vt3_depth_for(l->max_srq_wr);
	l->max_srq_sge = vt3_clamp(le32_to_cpu(a->max_srq_sge), VT3_MAX_SGE);
	l->max_mw = vt3_clamp(le32_to_cpu(a->max_mw), INT_MAX);
	/* An SRQ that holds nothing is no SRQ. */
	if (!l->max_srq_wr)
		l->max_srq = 0;
	/* The largest region whose PBL is sure to fit, however aligned. */
	l->max_mr_size = min_t(u64, l->max_mr_size,
			       (u64)(l->max_pbl_pages ? l->max_pbl_pages - 1 : 0)
			       << VT3_PAGE_SHIFT);
	l->max_msg_size = max_msg_size;
}

/*
 * Starts a session (@tries first contacts) and asks vt3d who it is; fails
 * when nothing answers on this netdev.
 */
static int vt3_dev_query(struct vt3_dev *dev, unsigned int tries)
{
	struct vt3_device_attr attr;
	struct vt3_port_attr port;
	u32 max_msg_size = U32_MAX;
	int err;

	err = vt3_ctrl_first_contact(dev, tries, vt3_probe_timeout_ms);
	if (err)
		return err;
	err = vt3_cmd_timeout(dev, VT3_CMD_QUERY_DEVICE, NULL, 0, &attr,
			      sizeof(attr), vt3_probe_timeout_ms);
	if (err)
		return err;
	if (!(le64_to_cpu(attr.page_size_cap) & VT3_PAGE_SIZE)) {
		netdev_err(dev->netdev,
			   "vt3: device page sizes %#llx lack %u: not attaching\n",
			   le64_to_cpu(attr.page_size_cap), VT3_PAGE_SIZE);
		return -EOPNOTSUPP;
	}
	/*
	 * Whatever vt3d still holds for this guest (a previous instance of
	 * the driver that lost contact with it, a kexec) is stale now: the
	 * PROVE dropped it with the old session; RESET makes sure.
	 */
	err = vt3_cmd(dev, VT3_CMD_RESET, NULL, 0, NULL, 0);
	if (err)
		return err;
	err = vt3_cmd_timeout(dev, VT3_CMD_QUERY_PORT, NULL, 0, &port,
			      sizeof(port), vt3_probe_timeout_ms);
	if (!err && le32_to_cpu(port.max_msg_size))
		max_msg_size = le32_to_cpu(port.max_msg_size);
	else if (err)
		netdev_warn(dev->netdev, "vt3: QUERY_PORT failed (%d)\n", err);
	vt3_set_limits(dev, &attr, max_msg_size);
	return 0;
}

/*
 * The device that DMA-maps for the RNIC: the first ancestor of the netdev
 * that can do DMA - for virtio-net the virtio PCI function. Kernel ULPs
 * then hand us addresses the device understands, and ib_umem_get() maps
 * user memory through it. NULL when there is none or an IOMMU translates
 * for it (its DMA addresses would not be guest-physical).
 */
static struct device *vt3_dma_device(struct net_device *netdev)
{
	struct device *d;

	for (d = netdev->dev.parent; d; d = d->parent) {
		if (d->dma_parms && d->dma_mask)
			break;
	}
	if (!d) {
		netdev_err(netdev, "vt3: no DMA-capable parent device\n");
		return NULL;
	}
	if (device_iommu_mapped(d)) {
		netdev_err(netdev,
			   "vt3: %s is behind an IOMMU; vt3d needs guest-physical addresses\n",
			   dev_name(d));
		return NULL;
	}
	return d;
}

static int vt3_port_state(struct net_device *netdev)
{
	return netif_running(netdev) && netif_carrier_ok(netdev) ?
	       IB_PORT_ACTIVE : IB_PORT_DOWN;
}

static struct vt3_dev *vt3_dev_create(struct net_device *netdev)
{
	struct ib_device *ibdev;
	struct vt3_dev *dev;

	dev = ib_alloc_device(vt3_dev, ibdev);
	if (!dev)
		return NULL;
	ibdev = &dev->ibdev;
	netdev_hold(netdev, &dev->netdev_tracker, GFP_KERNEL);
	dev->netdev = netdev;
	ether_addr_copy(dev->mac, netdev->dev_addr);
	dev->port_state = vt3_port_state(netdev);
	xa_init(&dev->cq_xa);
	xa_init(&dev->qp_xa);
	xa_init_flags(&dev->srq_xa, XA_FLAGS_LOCK_IRQ);
	spin_lock_init(&dev->orphan_lock);
	INIT_LIST_HEAD(&dev->orphans);
	vt3_ctrl_init(dev);
	vt3_cm_init(dev);
	INIT_DELAYED_WORK(&dev->carrier_work, vt3_carrier_work);

	ibdev->node_type = RDMA_NODE_RNIC;
	ibdev->phys_port_cnt = 1;
	ibdev->num_comp_vectors = 1;
	memcpy(ibdev->node_desc, VT3_NODE_DESC, sizeof(VT3_NODE_DESC));
	addrconf_addr_eui48((u8 *)&ibdev->node_guid, dev->mac);
	/*
	 * Zero-WR post_send/post_recv are the user doorbells
	 * (docs/architecture.md §3); the provider arms CQs through the kernel.
	 */
	ibdev->uverbs_cmd_mask |= BIT_ULL(IB_USER_VERBS_CMD_POST_SEND) |
				  BIT_ULL(IB_USER_VERBS_CMD_POST_RECV) |
				  BIT_ULL(IB_USER_VERBS_CMD_POST_SRQ_RECV) |
				  BIT_ULL(IB_USER_VERBS_CMD_REQ_NOTIFY_CQ);
	/* vt3d's TOE owns its ports; iwpmd must not remap them. */
	ibdev->iw_driver_flags = IW_F_NO_PORT_MAP;
	strscpy(ibdev->iw_ifname, netdev->name, sizeof(ibdev->iw_ifname));
	ib_set_device_ops(ibdev, &vt3_dev_ops);
	ibdev->driver_def = vt3_uapi_defs;
	return dev;
}

/*
 * Probes @netdev (@tries first contacts) and registers an ib_device for
 * it. @name is the ib name (a "%d" pattern allowed). Caller holds
 * vt3_attach_lock and loaded the key (vt3_probe_netdev()).
 */
/*
 * Under QEMU's TCG, a machine of one possible CPU gets plain loads and
 * stores for this guest's locked instructions (and QEMU 7.2 no mfence):
 * the fences of the doorbell hand-off then order nothing against vt3d,
 * and a queue can stall with a WQE posted (docs/user-guide.md, "Under
 * TCG"). Nothing here can mend that: say what the machine needs.
 */
static void vt3_check_machine(struct vt3_dev *dev)
{
#ifdef CONFIG_X86
	u32 eax, sig[3];

	if (num_possible_cpus() > 1 || !boot_cpu_has(X86_FEATURE_HYPERVISOR))
		return;
	cpuid(0x40000000, &eax, &sig[0], &sig[1], &sig[2]);
	if (memcmp(sig, "TCGTCGTCGTCG", sizeof(sig)))
		return;
	ibdev_warn(&dev->ibdev,
		   "QEMU TCG with one possible CPU does not make this guest's atomics atomic against vt3d: doorbells can be lost; give the machine maxcpus=2 or more (-smp 1,maxcpus=2)\n");
#endif
}

static int vt3_attach(struct net_device *netdev, const char *name,
		      unsigned int tries)
{
	struct device *dma_dev;
	struct ib_device *ibdev;
	struct vt3_dev *dev;
	bool gone;
	int err;

	lockdep_assert_held(&vt3_attach_lock);
	ibdev = ib_device_get_by_netdev(netdev, VT3_DRIVER_ID);
	if (ibdev) {
		ib_device_put(ibdev);
		return -EEXIST;
	}
	if (netdev->type != ARPHRD_ETHER)
		return -EINVAL;
	if (vt3_port_state(netdev) != IB_PORT_ACTIVE)
		return -ENETDOWN;
	dma_dev = vt3_dma_device(netdev);
	if (!dma_dev)
		return -EOPNOTSUPP;
	if (!vt3_key_ready()) {
		vt3_key_report_missing(netdev);
		return -ENOKEY;
	}

	dev = vt3_dev_create(netdev);
	if (!dev)
		return -ENOMEM;
	/* From here on ib_dealloc_device() -> vt3_dealloc_driver() unwinds. */
	vt3_ctrl_start(dev);
	err = vt3_dev_query(dev, tries);
	if (err) {
		netdev_dbg(netdev, "vt3: no vt3d answered the probe (%d)\n", err);
		goto err_dealloc;
	}
	err = ib_device_set_netdev(&dev->ibdev, netdev, 1);
	if (err)
		goto err_dealloc;
	WRITE_ONCE(dev->attached, true);
	err = ib_register_device(&dev->ibdev, name, dma_dev);
	if (err) {
		netdev_err(netdev, "vt3: ib_register_device failed (%d)\n", err);
		goto err_dealloc;
	}
	/*
	 * NETDEV_UNREGISTER (sent under RTNL) may have come while we probed,
	 * before the notifier could find the ib_device: check under RTNL.
	 */
	rtnl_lock();
	gone = netdev->reg_state != NETREG_REGISTERED;
	rtnl_unlock();
	if (gone) {
		ib_unregister_device(&dev->ibdev);
		return -ENODEV;
	}
	ibdev_info(&dev->ibdev, "vt3 RNIC on %s: %u QPs, %u CQs, %u MRs\n",
		   netdev->name, dev->lim.max_qp, dev->lim.max_cq,
		   dev->lim.max_mr);
	vt3_check_machine(dev);
	if (vt3_reprobe_stop(netdev))
		ibdev_info(&dev->ibdev, "vt3d is back on %s\n", netdev->name);
	return 0;

err_dealloc:
	ib_dealloc_device(&dev->ibdev);
	return err;
}

/* Called by the core once the device is unregistered, or on unwind. */
static void vt3_dealloc_driver(struct ib_device *ibdev)
{
	struct vt3_dev *dev = to_vt3_dev(ibdev);
	bool device_forgot = false;
	int err;

	if (dev->attached && !READ_ONCE(dev->ctrl.lost)) {
		/*
		 * Every object was destroyed through our verbs already; RESET
		 * also covers those whose destroy command failed.
		 */
		err = vt3_cmd(dev, VT3_CMD_RESET, NULL, 0, NULL, 0);
		if (!err)
			device_forgot = true;
		else
			netdev_warn(dev->netdev, "vt3: RESET failed (%d)\n", err);
	}
	cancel_delayed_work_sync(&dev->carrier_work);
	vt3_ctrl_stop(dev);
	vt3_cm_stop(dev);
	/*
	 * Memory whose destroy vt3d never confirmed can be given back only
	 * when vt3d confirmed the RESET, or when the NIC itself is going
	 * away (its backend stops with it). Otherwise leaking it is the only
	 * safe choice: vt3d might still write into it.
	 */
	if (device_forgot || dev->netdev->reg_state != NETREG_REGISTERED)
		vt3_free_orphans(dev);
	else if (!list_empty(&dev->orphans))
		netdev_warn(dev->netdev,
			    "vt3: leaking memory vt3d may still use\n");
	xa_destroy(&dev->cq_xa);
	xa_destroy(&dev->qp_xa);
	xa_destroy(&dev->srq_xa);
	if (dev->reprobe)
		vt3_reprobe_start(dev->netdev, dev_name(&ibdev->dev));
	netdev_put(dev->netdev, &dev->netdev_tracker);
}

/*
 * IB_EVENT_DEVICE_FATAL, once, while the device is registered (the core
 * flushes its event work when it unregisters). Any context.
 */
void vt3_device_fatal_event(struct vt3_dev *dev)
{
	struct ib_event ev = {
		.device = &dev->ibdev,
		.element.port_num = 1,
		.event = IB_EVENT_DEVICE_FATAL,
	};

	if (!ib_device_try_get(&dev->ibdev))
		return;
	if (!atomic_xchg(&dev->fatal, 1)) {
		ibdev_err(&dev->ibdev, "device fatal\n");
		ib_dispatch_event(&ev);
	}
	ib_device_put(&dev->ibdev);
}

/*
 * vt3d stopped answering: every CQ freezes, every QP goes to error and
 * every connection ends (no event will come for them), then consumers get
 * IB_EVENT_DEVICE_FATAL (so whoever flushes on it finds the QPs in
 * error), and then the device is unregistered: all asynchronously, in
 * that order (vt3_cm.c's lost work), as we may be inside a verb of this
 * very device.
 */
void vt3_device_lost(struct vt3_dev *dev)
{
	vt3_cm_device_lost(dev);
}

static void vt3_port_event(struct vt3_dev *dev, enum ib_event_type type)
{
	struct ib_event ev = {
		.device = &dev->ibdev,
		.element.port_num = 1,
		.event = type,
	};

	ib_dispatch_event(&ev);
}

/* How long the carrier may stay away before vt3d counts as gone. */
#define VT3_CARRIER_GRACE_MS	5000

/*
 * The carrier of a running virtio-net NIC under vt3d goes away when the
 * vhost-user backend does (QEMU marks the link down): vt3d was killed or
 * lost its frontend, and no command can reach it (the qdisc drops frames
 * while the carrier is off), so no event will ever come from it either.
 * If the carrier stays away, the device is lost: every consumer gets
 * IB_EVENT_DEVICE_FATAL and every QP its flush (docs/architecture.md
 * §5 and §10, "device lost"). A returning carrier probes the device anew.
 */
static void vt3_carrier_work(struct work_struct *work)
{
	struct vt3_dev *dev = container_of(to_delayed_work(work),
					   struct vt3_dev, carrier_work);

	if (!netif_running(dev->netdev) || netif_carrier_ok(dev->netdev) ||
	    READ_ONCE(dev->ctrl.lost) || !READ_ONCE(dev->attached))
		return;
	ibdev_err(&dev->ibdev, "carrier gone for %u ms: vt3d is gone\n",
		  VT3_CARRIER_GRACE_MS);
	WRITE_ONCE(dev->ctrl.lost, true);
	vt3_device_lost(dev);
}

static void vt3_port_update(struct vt3_dev *dev)
{
	struct net_device *netdev = dev->netdev;
	int state = vt3_port_state(netdev);

	if (state == READ_ONCE(dev->port_state))
		return;
	WRITE_ONCE(dev->port_state, state);
	vt3_port_event(dev, state == IB_PORT_ACTIVE ? IB_EVENT_PORT_ACTIVE :
						      IB_EVENT_PORT_ERR);
	/* Carrier loss, not an administrative down. */
	if (netif_running(netdev) && !netif_carrier_ok(netdev))
		queue_delayed_work(vt3_wq, &dev->carrier_work,
				   msecs_to_jiffies(VT3_CARRIER_GRACE_MS));
}

/* The netdevs probed automatically: virtio-net NICs. */
static bool vt3_candidate(struct net_device *netdev)
{
	struct device *parent = netdev->dev.parent;

	return parent && parent->driver &&
	       !strcmp(parent->driver->name, "virtio_net");
}

/*
 * Attaches @netdev (vt3_attach()), the key loaded first: that may open
 * a file and run modprobe, so no lock is held here.
 */
static int vt3_probe_netdev(struct net_device *netdev, const char *name,
			    unsigned int tries)
{
	int err;

	vt3_key_load();
	mutex_lock(&vt3_attach_lock);
	err = vt3_attach(netdev, name, tries);
	mutex_unlock(&vt3_attach_lock);
	return err;
}

static void vt3_probe_work(struct work_struct *work)
{
	struct vt3_probe *p = container_of(work, struct vt3_probe, work);
	int err;

	spin_lock(&vt3_probe_lock);
	list_del(&p->list);
	spin_unlock(&vt3_probe_lock);

	err = vt3_probe_netdev(p->netdev, "vt3_%d", VT3_PROBE_TRIES);
	if (err && err != -EEXIST && err != -ENETDOWN)
		netdev_dbg(p->netdev, "vt3: probe failed (%d)\n", err);
	netdev_put(p->netdev, &p->tracker);
	kfree(p);
}

/* Queues a probe of @netdev unless one is queued already. RTNL held. */
static void vt3_queue_probe(struct net_device *netdev)
{
	struct vt3_probe *p;

	spin_lock(&vt3_probe_lock);
	list_for_each_entry(p, &vt3_probe_list, list) {
		if (p->netdev == netdev) {
			spin_unlock(&vt3_probe_lock);
			return;
		}
	}
	spin_unlock(&vt3_probe_lock);

	p = kzalloc(sizeof(*p), GFP_KERNEL);
	if (!p)
		return;
	INIT_WORK(&p->work, vt3_probe_work);
	p->netdev = netdev;
	netdev_hold(netdev, &p->tracker, GFP_KERNEL);
	/* Only the notifier adds, under RTNL: no duplicate since the check. */
	spin_lock(&vt3_probe_lock);
	list_add(&p->list, &vt3_probe_list);
	spin_unlock(&vt3_probe_lock);
	queue_work(vt3_wq, &p->work);
}

/*
 * Probing again after a loss (vt3_hw.h): when vt3d stopped answering and
 * the device was unregistered for it (vt3_cm.c's lost work), its netdev
 * gets a first contact every VT3_REPROBE_FAST_MS for VT3_REPROBE_FAST_FOR_MS,
 * then every VT3_REPROBE_SLOW_MS, for as long as it takes. Re-probing
 * ends when a device is attached to the netdev (by it or another probe),
 * the netdev is unregistered or the module unloaded. A device the admin
 * removed (`rdma link del`), or that went with its netdev or the module,
 * was not lost: its netdev is not probed again.
 */
#define VT3_REPROBE_FAST_MS	2000
#define VT3_REPROBE_FAST_FOR_MS	30000
#define VT3_REPROBE_SLOW_MS	10000

struct vt3_reprobe {
	struct delayed_work work;
	struct list_head list;		/* on vt3_reprobe_list while armed */
	bool armed;			/* under vt3_reprobe_lock */
	struct net_device *netdev;
	netdevice_tracker tracker;
	unsigned long lost_at;		/* jiffies */
	char name[IB_DEVICE_NAME_MAX];	/* the lost device's */
};

static DEFINE_SPINLOCK(vt3_reprobe_lock);
static LIST_HEAD(vt3_reprobe_list);
static bool vt3_unloading;		/* under vt3_reprobe_lock */

static struct vt3_reprobe *vt3_reprobe_find(struct net_device *netdev)
{
	struct vt3_reprobe *r;

	lockdep_assert_held(&vt3_reprobe_lock);
	list_for_each_entry(r, &vt3_reprobe_list, list) {
		if (r->netdev == netdev)
			return r;
	}
	return NULL;
}

static void vt3_reprobe_free(struct vt3_reprobe *r)
{
	netdev_put(r->netdev, &r->tracker);
	kfree(r);
}

/*
 * Disarms @r (vt3_reprobe_lock held). Returns whether the caller frees
 * it: its work was pending and will not run. Otherwise the work is
 * running and frees it when it finds it disarmed.
 */
static bool vt3_reprobe_disarm(struct vt3_reprobe *r)
{
	lockdep_assert_held(&vt3_reprobe_lock);
	list_del(&r->list);
	r->armed = false;
	return cancel_delayed_work(&r->work);
}

/* Stops re-probing @netdev; returns whether it was. Any process context. */
static bool vt3_reprobe_stop(struct net_device *netdev)
{
	struct vt3_reprobe *r;
	bool free;

	spin_lock(&vt3_reprobe_lock);
	r = vt3_reprobe_find(netdev);
	free = r && vt3_reprobe_disarm(r);
	spin_unlock(&vt3_reprobe_lock);
	if (free)
		vt3_reprobe_free(r);
	return r;
}

static void vt3_reprobe_work(struct work_struct *work)
{
	struct vt3_reprobe *r = container_of(to_delayed_work(work),
					     struct vt3_reprobe, work);
	unsigned long start = jiffies, next;
	const char *name = r->name;
	struct ib_device *ibdev;
	int err;

	/* The lost device's name if it is free, else the first free one. */
	ibdev = ib_device_get_by_name(r->name, RDMA_DRIVER_UNKNOWN);
	if (ibdev) {
		ib_device_put(ibdev);
		name = "vt3_%d";
	}
	/* One first contact: a new one each period, with fresh nonces. */
	err = vt3_probe_netdev(r->netdev, name, 1);

	spin_lock(&vt3_reprobe_lock);
	if (r->armed && err != -EEXIST &&
	    r->netdev->reg_state == NETREG_REGISTERED) {
		next = start + msecs_to_jiffies(time_before(start, r->lost_at +
				msecs_to_jiffies(VT3_REPROBE_FAST_FOR_MS)) ?
				VT3_REPROBE_FAST_MS : VT3_REPROBE_SLOW_MS);
		queue_delayed_work(vt3_wq, &r->work, time_after(next, jiffies) ?
				   next - jiffies : 0);
		spin_unlock(&vt3_reprobe_lock);
		return;
	}
	if (r->armed) {
		list_del(&r->list);
		r->armed = false;
	}
	spin_unlock(&vt3_reprobe_lock);
	vt3_reprobe_free(r);
}

/*
 * The device @name of @netdev was lost and is gone (vt3_dealloc_driver):
 * probe the netdev again until vt3d answers. Process context.
 */
static void vt3_reprobe_start(struct net_device *netdev, const char *name)
{
	struct vt3_reprobe *r;
	bool armed = false;

	r = kzalloc(sizeof(*r), GFP_KERNEL);
	if (!r)
		return;
	INIT_DELAYED_WORK(&r->work, vt3_reprobe_work);
	netdev_hold(netdev, &r->tracker, GFP_KERNEL);
	r->netdev = netdev;
	r->lost_at = jiffies;
	strscpy(r->name, name, sizeof(r->name));

	/*
	 * The netdev's unregistration marks it before its notifier stops
	 * re-probing (under this lock): either we see the mark or it sees
	 * us.
	 */
	spin_lock(&vt3_reprobe_lock);
	if (!vt3_unloading && netdev->reg_state == NETREG_REGISTERED &&
	    !vt3_reprobe_find(netdev)) {
		r->armed = true;
		armed = true;
		list_add(&r->list, &vt3_reprobe_list);
		queue_delayed_work(vt3_wq, &r->work,
				   msecs_to_jiffies(VT3_REPROBE_FAST_MS));
	}
	spin_unlock(&vt3_reprobe_lock);
	if (!armed) {
		vt3_reprobe_free(r);
		return;
	}
	netdev_info(netdev,
		    "vt3: %s lost: probing for vt3d every %u s, every %u s after %u s, until it answers\n",
		    name, VT3_REPROBE_FAST_MS / 1000, VT3_REPROBE_SLOW_MS / 1000,
		    VT3_REPROBE_FAST_FOR_MS / 1000);
}

/* Module unload: no re-probe runs after this but those running now. */
static void vt3_reprobe_stop_all(void)
{
	struct vt3_reprobe *r, *tmp;
	LIST_HEAD(idle);

	spin_lock(&vt3_reprobe_lock);
	vt3_unloading = true;
	list_for_each_entry_safe(r, tmp, &vt3_reprobe_list, list) {
		if (vt3_reprobe_disarm(r))
			list_add(&r->list, &idle);
	}
	spin_unlock(&vt3_reprobe_lock);
	list_for_each_entry_safe(r, tmp, &idle, list)
		vt3_reprobe_free(r);
}

static int vt3_netdev_event(struct notifier_block *nb, unsigned long event,
			    void *arg)
{
	struct net_device *netdev = netdev_notifier_info_to_dev(arg);
	struct ib_device *ibdev;
	struct vt3_dev *dev;

	/* A netdev going away is not probed again (its device is gone). */
	if (event == NETDEV_UNREGISTER)
		vt3_reprobe_stop(netdev);
	ibdev = ib_device_get_by_netdev(netdev, VT3_DRIVER_ID);
	if (!ibdev) {
		if ((event == NETDEV_REGISTER || event == NETDEV_UP ||
		     event == NETDEV_CHANGE) && vt3_candidate(netdev) &&
		    vt3_port_state(netdev) == IB_PORT_ACTIVE)
			vt3_queue_probe(netdev);
		return NOTIFY_DONE;
	}

	dev = to_vt3_dev(ibdev);
	switch (event) {
	case NETDEV_UP:
	case NETDEV_DOWN:
	case NETDEV_CHANGE:
		vt3_port_update(dev);
		break;
	case NETDEV_CHANGEADDR:
		/* The GID is the MAC: have the core re-read it. */
		ether_addr_copy(dev->mac, netdev->dev_addr);
		vt3_port_event(dev, IB_EVENT_GID_CHANGE);
		vt3_cm_addr_changed(dev);
		break;
	case NETDEV_CHANGENAME:
		strscpy(ibdev->iw_ifname, netdev->name, sizeof(ibdev->iw_ifname));
		break;
	case NETDEV_UNREGISTER:
		ib_unregister_device_queued(ibdev);
		break;
	default:
		break;
	}
	ib_device_put(ibdev);
	return NOTIFY_DONE;
}

static struct notifier_block vt3_netdev_nb = {
	.notifier_call = vt3_netdev_event,
};

/* vt3d's TOE answers for the netdev's primary IPv4 address: keep it told. */
static int vt3_inetaddr_event(struct notifier_block *nb, unsigned long event,
			      void *arg)
{
	const struct in_ifaddr *ifa = arg;
	struct ib_device *ibdev;

	ibdev = ib_device_get_by_netdev(ifa->ifa_dev->dev, VT3_DRIVER_ID);
	if (!ibdev)
		return NOTIFY_DONE;
	vt3_cm_addr_changed(to_vt3_dev(ibdev));
	ib_device_put(ibdev);
	return NOTIFY_DONE;
}

static struct notifier_block vt3_inetaddr_nb = {
	.notifier_call = vt3_inetaddr_event,
};

static int vt3_newlink(const char *name, struct net_device *netdev)
{
	int err;

	err = vt3_probe_netdev(netdev, name, VT3_PROBE_TRIES);
	/* Tell `rdma link add` what was wrong, not just "timed out". */
	return err == -ETIMEDOUT ? -ENODEV : err;
}

static struct rdma_link_ops vt3_link_ops = {
	.type = "vt3",
	.newlink = vt3_newlink,
};

/*
 * hw_counters of the device: control frames refused (vt3_ctrl.c), then
 * memory (vt3_mem.c): vt3_pages alive (module-wide) and those kept as
 * orphans because vt3d never confirmed it forgot them.
 */
enum { VT3_STAT_MEM_LIVE = VT3_REFUSED_MAX, VT3_STAT_MEM_ORPHANED, VT3_STATS_MAX };

static const struct rdma_stat_desc vt3_hw_stats[VT3_STATS_MAX] = {
	[VT3_REFUSED_SHORT] = { .name = "ctrl_refused_short" },
	[VT3_REFUSED_VERSION] = { .name = "ctrl_refused_version" },
	[VT3_REFUSED_TYPE] = { .name = "ctrl_refused_type" },
	[VT3_REFUSED_NO_SESSION] = { .name = "ctrl_refused_no_session" },
	[VT3_REFUSED_MAC] = { .name = "ctrl_refused_mac" },
	[VT3_REFUSED_REPLAY] = { .name = "ctrl_refused_replay" },
	[VT3_REFUSED_HELLO] = { .name = "ctrl_refused_hello" },
	[VT3_STAT_MEM_LIVE] = { .name = "mem_live" },
	[VT3_STAT_MEM_ORPHANED] = { .name = "mem_orphaned" },
};

static struct rdma_hw_stats *vt3_alloc_hw_device_stats(struct ib_device *ibdev)
{
	return rdma_alloc_hw_stats_struct(vt3_hw_stats, VT3_STATS_MAX,
					  RDMA_HW_STATS_DEFAULT_LIFESPAN);
}

static int vt3_get_hw_stats(struct ib_device *ibdev,
			    struct rdma_hw_stats *stats, u32 port, int index)
{
	struct vt3_dev *dev = to_vt3_dev(ibdev);
	int i;

	for (i = 0; i < VT3_REFUSED_MAX; i++)
		stats->value[i] = atomic64_read(&dev->ctrl.refused[i]);
	stats->value[VT3_STAT_MEM_LIVE] = vt3_pages_live();
	stats->value[VT3_STAT_MEM_ORPHANED] = vt3_orphaned(dev);
	return VT3_STATS_MAX;
}

static const struct ib_device_ops vt3_dev_ops = {
	.owner = THIS_MODULE,
	.driver_id = VT3_DRIVER_ID,
	.uverbs_abi_ver = VT3_ABI_VERSION,

	.alloc_hw_device_stats = vt3_alloc_hw_device_stats,
	.alloc_mr = vt3_alloc_mr,
	.alloc_mw = vt3_alloc_mw,
	.get_hw_stats = vt3_get_hw_stats,
	.alloc_pd = vt3_alloc_pd,
	.alloc_ucontext = vt3_alloc_ucontext,
	.create_cq = vt3_create_cq,
	.create_qp = vt3_create_qp,
	.create_srq = vt3_create_srq,
	.dealloc_driver = vt3_dealloc_driver,
	.dealloc_mw = vt3_dealloc_mw,
	.dealloc_pd = vt3_dealloc_pd,
	.dealloc_ucontext = vt3_dealloc_ucontext,
	.dereg_mr = vt3_dereg_mr,
	.destroy_cq = vt3_destroy_cq,
	.destroy_qp = vt3_destroy_qp,
	.destroy_srq = vt3_destroy_srq,
	.disassociate_ucontext = vt3_disassociate_ucontext,
	.get_dev_fw_str = vt3_get_dev_fw_str,
	.get_dma_mr = vt3_get_dma_mr,
	.get_port_immutable = vt3_get_port_immutable,
	.iw_accept = vt3_iw_accept,
	.iw_add_ref = vt3_iw_add_ref,
	.iw_connect = vt3_iw_connect,
	.iw_create_listen = vt3_iw_create_listen,
	.iw_destroy_listen = vt3_iw_destroy_listen,
	.iw_get_qp = vt3_iw_get_qp,
	.iw_reject = vt3_iw_reject,
	.iw_rem_ref = vt3_iw_rem_ref,
	.map_mr_sg = vt3_map_mr_sg,
	.mmap = vt3_mmap,
	.mmap_free = vt3_mmap_free,
	.modify_qp = vt3_modify_qp,
	.modify_srq = vt3_modify_srq,
	.poll_cq = vt3_poll_cq,
	.post_recv = vt3_post_recv,
	.post_send = vt3_post_send,
	.post_srq_recv = vt3_post_srq_recv,
	.query_device = vt3_query_device,
	.query_gid = vt3_query_gid,
	.query_port = vt3_query_port,
	.query_qp = vt3_query_qp,
	.query_srq = vt3_query_srq,
	.query_ucontext = vt3_query_ucontext,
	.reg_user_mr = vt3_reg_user_mr,
	.rereg_user_mr = vt3_rereg_user_mr,
	.req_notify_cq = vt3_req_notify_cq,

	INIT_RDMA_OBJ_SIZE(ib_cq, vt3_cq, ibcq),
	INIT_RDMA_OBJ_SIZE(ib_mw, vt3_mw, ibmw),
	INIT_RDMA_OBJ_SIZE(ib_pd, vt3_pd, ibpd),
	INIT_RDMA_OBJ_SIZE(ib_qp, vt3_qp, ibqp),
	INIT_RDMA_OBJ_SIZE(ib_srq, vt3_srq, ibsrq),
	INIT_RDMA_OBJ_SIZE(ib_ucontext, vt3_ucontext, ibuc),
};

/*
 * vt3 is an ib client of its own devices too: registered after ib_uverbs
 * (a module it depends on), it is removed before it when a device goes,
 * so QPs go to error and DEVICE_FATAL is raised while user contexts can
 * still see both (vt3_cm_going_away()).
 */
static int vt3_client_add(struct ib_device *ibdev)
{
	return ibdev->ops.driver_id == VT3_DRIVER_ID ? 0 : -EOPNOTSUPP;
}

static void vt3_client_remove(struct ib_device *ibdev, void *data)
{
	if (ibdev->ops.driver_id == VT3_DRIVER_ID)
		vt3_cm_going_away(to_vt3_dev(ibdev));
}

static struct ib_client vt3_client = {
	.name = "vt3",
	.add = vt3_client_add,
	.remove = vt3_client_remove,
};

static int __init vt3_init(void)
{
	int err = -ENOMEM;

	vt3_wq = alloc_workqueue("vt3", WQ_UNBOUND, 0);
	if (!vt3_wq)
		return -ENOMEM;
	vt3_cm_wq = alloc_workqueue("vt3_cm", WQ_UNBOUND, 0);
	if (!vt3_cm_wq)
		goto err_wq;
	/* Before the probes; they try again if it is not there yet. */
	vt3_key_load();
	err = ib_register_client(&vt3_client);
	if (err)
		goto err_cm_wq;
	err = register_inetaddr_notifier(&vt3_inetaddr_nb);
	if (err)
		goto err_client;
	/* Replays REGISTER/UP for existing netdevs: that queues their probes. */
	err = register_netdevice_notifier(&vt3_netdev_nb);
	if (err)
		goto err_inetaddr;
	rdma_link_register(&vt3_link_ops);
	/* NICs that are up are attached when insmod returns. */
	flush_workqueue(vt3_wq);
	return 0;

err_inetaddr:
	unregister_inetaddr_notifier(&vt3_inetaddr_nb);
err_client:
	ib_unregister_client(&vt3_client);
err_cm_wq:
	destroy_workqueue(vt3_cm_wq);
err_wq:
	destroy_workqueue(vt3_wq);
	vt3_key_wipe();
	return err;
}

static void __exit vt3_exit(void)
{
	rdma_link_unregister(&vt3_link_ops);
	unregister_netdevice_notifier(&vt3_netdev_nb);
	unregister_inetaddr_notifier(&vt3_inetaddr_nb);
	/*
	 * No probe gets queued any more, nor a re-probe armed (a device
	 * lost from here on is not probed again); the running ones finish.
	 */
	vt3_reprobe_stop_all();
	destroy_workqueue(vt3_wq);
	/* Disassociates user contexts, destroys every object, RESETs. */
	ib_unregister_driver(VT3_DRIVER_ID);
	ib_unregister_client(&vt3_client);
	/* Each device cancelled its connection work when it went. */
	destroy_workqueue(vt3_cm_wq);
	vt3_key_wipe();
}

module_init(vt3_init);
module_exit(vt3_exit);

MODULE_AUTHOR("vt3 authors");
MODULE_DESCRIPTION("vt3 virtual T3-class iWARP RNIC (RDMA function over virtio-net)");
MODULE_LICENSE("GPL");
MODULE_ALIAS_RDMA_LINK("vt3");
/* The provisioned key is a file of qemu_fw_cfg's (vt3_key_load()). */
MODULE_SOFTDEP("pre: qemu_fw_cfg");
