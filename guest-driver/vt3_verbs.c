// SPDX-License-Identifier: GPL-2.0
/*
 * vt3 verbs: device and port queries, user contexts and their mmaps,
 * protection domains.
 */
#include <linux/etherdevice.h>
#include <linux/mm.h>
#include <rdma/ib_user_verbs.h>
#include <rdma/uverbs_ioctl.h>

#include "vt3.h"

/*
 * Input udata: vt3-abi.h defines no request structs, so whatever a
 * provider sends must be zeroes (room for future extension); false
 * otherwise.
 */
bool vt3_udata_in_ok(struct ib_udata *udata)
{
	return !udata || !udata->inlen ||
	       ib_is_udata_cleared(udata, 0, udata->inlen);
}

int vt3_query_device(struct ib_device *ibdev, struct ib_device_attr *attr,
		     struct ib_udata *udata)
{
	struct vt3_dev *dev = to_vt3_dev(ibdev);
	const struct vt3_limits *l = &dev->lim;

	if (udata && (udata->inlen || udata->outlen))
		return -EINVAL;

	memset(attr, 0, sizeof(*attr));
	attr->fw_ver = l->fw_ver;
	attr->sys_image_guid = ibdev->node_guid;
	attr->max_mr_size = l->max_mr_size;
	/* Every PBL we build lists VT3_PAGE_SIZE pages. */
	attr->page_size_cap = VT3_PAGE_SIZE;
	attr->vendor_id = l->vendor_id;
	attr->vendor_part_id = l->vendor_part_id;
	attr->hw_ver = l->hw_ver;
	attr->max_qp = l->max_qp;
	attr->max_qp_wr = l->max_qp_wr;
	/*
	 * Fast registration (alloc_mr, map_mr_sg, REG_MR, LOCAL_INV, remote
	 * invalidation) when vt3d offers it.
	 */
	if (l->max_fast_reg_pages) {
		attr->device_cap_flags |= IB_DEVICE_MEM_MGT_EXTENSIONS;
		attr->max_fast_reg_page_list_len = l->max_fast_reg_pages;
	}
	/* Memory windows: type 1 and type 2 (IB's 2B, bound to a QP). */
	if (l->max_mw) {
		attr->device_cap_flags |= IB_DEVICE_MEM_WINDOW |
					  IB_DEVICE_MEM_WINDOW_TYPE_2B;
		attr->max_mw = l->max_mw;
	}
	/* `rdma link del` may remove what `rdma link add` created. */
	attr->kernel_cap_flags = IBK_ALLOW_USER_UNREG;
	attr->max_send_sge = l->max_sge;
	attr->max_recv_sge = l->max_sge;
	attr->max_sge_rd = l->max_sge_rd;
	attr->max_cq = l->max_cq;
	attr->max_cqe = l->max_cqe;
	attr->max_mr = l->max_mr;
	attr->max_pd = l->max_pd;
	attr->max_qp_rd_atom = l->max_ird;
	attr->max_qp_init_rd_atom = l->max_ord;
	attr->max_res_rd_atom = l->max_qp * l->max_ird;
	/* Every entry of an SRQ ring is usable (vt3_srq.c); it grows. */
	attr->max_srq = l->max_srq;
	if (l->max_srq)
		attr->device_cap_flags |= IB_DEVICE_SRQ_RESIZE;
	attr->max_srq_wr = l->max_srq ? l->max_srq_wr : 0;
	attr->max_srq_sge = l->max_srq ? l->max_srq_sge : 0;
	attr->atomic_cap = IB_ATOMIC_NONE;
	return 0;
}

void vt3_get_dev_fw_str(struct ib_device *ibdev, char *str)
{
	u64 fw = to_vt3_dev(ibdev)->lim.fw_ver;

	snprintf(str, IB_FW_VERSION_NAME_MAX, "%u.%u.%u", (u32)(fw >> 32),
		 (u32)(fw >> 16) & 0xffff, (u32)fw & 0xffff);
}

/*
 * For iWARP, ib_query_port() pre-fills state from the netdev (ACTIVE only
 * with an IPv4 address); we report what vt3 can do: ACTIVE while the
 * netdev is up with its carrier on, which is when vt3d is reachable.
 */
int vt3_query_port(struct ib_device *ibdev, u32 port, struct ib_port_attr *attr)
{
	struct vt3_dev *dev = to_vt3_dev(ibdev);
	struct net_device *netdev = dev->netdev;
	int state = READ_ONCE(dev->port_state);

	memset(attr, 0, sizeof(*attr));
	attr->state = state;
	attr->phys_state = state == IB_PORT_ACTIVE ?
			   IB_PORT_PHYS_STATE_LINK_UP :
			   IB_PORT_PHYS_STATE_DISABLED;
	attr->max_mtu = ib_mtu_int_to_enum(netdev->max_mtu);
	attr->active_mtu = ib_mtu_int_to_enum(READ_ONCE(netdev->mtu));
	attr->gid_tbl_len = 1;
	attr->port_cap_flags = IB_PORT_CM_SUP | IB_PORT_DEVICE_MGMT_SUP;
	attr->max_msg_sz = dev->lim.max_msg_size;
	/*
	 * A virtual link has no speed of its own (ib_get_eth_speed() would
	 * log "speed is unknown" on every query): report a T3's 10 Gb/s.
	 */
	attr->active_speed = IB_SPEED_FDR10;
	attr->active_width = IB_WIDTH_1X;
	return 0;
}

int vt3_get_port_immutable(struct ib_device *ibdev, u32 port,
			   struct ib_port_immutable *immutable)
{
	immutable->gid_tbl_len = 1;
	immutable->core_cap_flags = RDMA_CORE_PORT_IWARP;
	return 0;
}

/* iWARP has no GIDs on the wire; the core wants one: the MAC, as siw. */
int vt3_query_gid(struct ib_device *ibdev, u32 port, int idx, union ib_gid *gid)
{
	if (idx)
		return -EINVAL;
	memset(gid, 0, sizeof(*gid));
	ether_addr_copy(gid->raw, to_vt3_dev(ibdev)->mac);
	return 0;
}

/* What a provider checks of a context: at its creation and at an import. */
void vt3_ucontext_resp(struct vt3_dev *dev, struct vt3_alloc_ucontext_resp *resp)
{
	*resp = (struct vt3_alloc_ucontext_resp) {
		.abi_version = VT3_ABI_VERSION,
		.wqe_size = VT3_WQE_SIZE,
		.cqe_size = sizeof(struct vt3_cqe),
		.max_inline = dev->lim.max_inline,
	};
}

int vt3_alloc_ucontext(struct ib_ucontext *ibuc, struct ib_udata *udata)
{
	struct vt3_alloc_ucontext_resp resp;

	vt3_ucontext_resp(to_vt3_dev(ibuc->device), &resp);
	if (!vt3_udata_in_ok(udata) || udata->outlen < sizeof(resp))
		return -EINVAL;
	return ib_copy_to_udata(udata, &resp, sizeof(resp));
}

/* Objects and mmap entries are torn down by the core before this. */
void vt3_dealloc_ucontext(struct ib_ucontext *ibuc)
{
}

/*
 * Device removal with live user contexts: the core has already zapped
 * every mapping of ours (later faults get the zero page) and will destroy
 * every object; vt3 holds nothing else per context.
 */
void vt3_disassociate_ucontext(struct ib_ucontext *ibuc)
{
}

int vt3_mmap(struct ib_ucontext *ibuc, struct vm_area_struct *vma)
{
	struct rdma_user_mmap_entry *rdma;
	struct vt3_mmap_entry *entry;
	int err;

	if (vma->vm_flags & VM_EXEC)
		return -EPERM;
	rdma = rdma_user_mmap_entry_get(ibuc, vma);
	if (!rdma)
		return -EINVAL;
	entry = to_vt3_mmap(rdma);
	vt3_vma_clear_flags(vma, VM_MAYEXEC);
	/* Fails with -ENXIO when the VMA is larger than the object. */
	err = vm_map_pages_zero(vma, entry->mem->pages, entry->mem->npages);
	rdma_user_mmap_entry_put(rdma);
	return err;
}

/* The last reference to an entry is gone: so is its hold on the pages. */
void vt3_mmap_free(struct rdma_user_mmap_entry *rdma)
{
	struct vt3_mmap_entry *entry = to_vt3_mmap(rdma);

	vt3_pages_put(entry->mem);
	kfree(entry);
}

int vt3_alloc_pd(struct ib_pd *ibpd, struct ib_udata *udata)
{
	struct vt3_dev *dev = to_vt3_dev(ibpd->device);
	struct vt3_pd *pd = to_vt3_pd(ibpd);
	struct vt3_alloc_pd_resp uresp = {};
	struct vt3_resp_handle resp;
	int err;

	if (udata && (!vt3_udata_in_ok(udata) ||
		      udata->outlen < sizeof(uresp)))
		return -EINVAL;
	err = vt3_cmd(dev, VT3_CMD_ALLOC_PD, NULL, 0, &resp, sizeof(resp));
	if (err)
		return err;
	pd->pdn = le32_to_cpu(resp.handle);
	if (udata) {
		uresp.pdn = pd->pdn;
		err = ib_copy_to_udata(udata, &uresp, sizeof(uresp));
		if (err) {
			vt3_cmd_handle(dev, VT3_CMD_DEALLOC_PD, pd->pdn);
			return err;
		}
	}
	return 0;
}

/*
 * Destroy verbs return 0 whatever vt3d says: the core cannot undo a
 * destroy (and warns when one fails during device removal). A PD holds
 * no guest memory, so nothing needs to be kept when vt3d did not answer.
 */
int vt3_dealloc_pd(struct ib_pd *ibpd, struct ib_udata *udata)
{
	struct vt3_pd *pd = to_vt3_pd(ibpd);
	int err;

	err = vt3_cmd_handle(to_vt3_dev(ibpd->device), VT3_CMD_DEALLOC_PD,
			     pd->pdn);
	if (err)
		ibdev_dbg(ibpd->device, "DEALLOC_PD %u: %d\n", pd->pdn, err);
	return 0;
}
