// SPDX-License-Identifier: GPL-2.0
/*
 * vt3 memory: pages and page lists handed to vt3d (rings, status pages,
 * registered memory), their user mappings, and memory regions.
 *
 * vt3d addresses guest memory physically. Pages we allocate are described
 * by page_to_phys(); user memory by the DMA addresses of its pinned pages,
 * mapped through the netdev's DMA device, which equal physical addresses
 * because no IOMMU translates for it (vt3_attach() checks). A PBL is one
 * physically contiguous kmalloc() buffer, so vt3_limits.max_pbl_pages is
 * capped at KMALLOC_MAX_SIZE / 8 entries.
 */
#include <linux/mm.h>
#include <linux/slab.h>
#include <rdma/ib_umem.h>
#include <rdma/iter.h>

#include "vt3.h"

/* vt3_pages alive, all devices: a hw counter (mem_live), so tests see leaks. */
static atomic_long_t vt3_live = ATOMIC_LONG_INIT(0);

long vt3_pages_live(void)
{
	return atomic_long_read(&vt3_live);
}

static struct vt3_pages *vt3_pages_new(unsigned int npages)
{
	struct vt3_pages *mem;

	mem = kzalloc(struct_size(mem, pages, npages), GFP_KERNEL);
	if (!mem)
		return NULL;
	kref_init(&mem->ref);
	INIT_LIST_HEAD(&mem->orphan);
	atomic_long_inc(&vt3_live);
	return mem;
}

static void vt3_pages_release(struct kref *ref)
{
	struct vt3_pages *mem = container_of(ref, struct vt3_pages, ref);
	unsigned int i;

	if (mem->umem)
		ib_umem_release(mem->umem);
	for (i = 0; i < mem->npages; i++)
		__free_page(mem->pages[i]);
	kfree(mem->pbl);
	kfree(mem);
	atomic_long_dec(&vt3_live);
}

void vt3_pages_put(struct vt3_pages *mem)
{
	kref_put(&mem->ref, vt3_pages_release);
}

/*
 * Zeroed kernel pages for @bytes, with a PBL of VT3_PAGE_SIZE entries
 * when the device takes them as a page list (rings) rather than by one
 * address (status pages).
 */
static struct vt3_pages *vt3_pages_alloc(size_t bytes, bool with_pbl)
{
	const unsigned int per_page = PAGE_SIZE / VT3_PAGE_SIZE;
	unsigned int npages = DIV_ROUND_UP(bytes, PAGE_SIZE);
	struct vt3_pages *mem;
	unsigned int i, j;

	mem = vt3_pages_new(npages);
	if (!mem)
		return NULL;
	for (i = 0; i < npages; i++) {
		mem->pages[i] = alloc_page(GFP_KERNEL | __GFP_ZERO);
		if (!mem->pages[i])
			goto err;
		mem->npages++;
	}
	if (with_pbl) {
		mem->pbl_len = npages * per_page;
		mem->pbl = kmalloc_array(mem->pbl_len, sizeof(*mem->pbl),
					 GFP_KERNEL | __GFP_NOWARN);
		if (!mem->pbl)
			goto err;
		for (i = 0; i < npages; i++)
			for (j = 0; j < per_page; j++)
				mem->pbl[i * per_page + j] =
					cpu_to_le64(page_to_phys(mem->pages[i]) +
						    j * VT3_PAGE_SIZE);
	}
	return mem;
err:
	vt3_pages_put(mem);
	return NULL;
}

/* Kernel address of byte @offset of @mem (a kernel-owned ring). */
void *vt3_pages_slot(struct vt3_pages *mem, size_t offset)
{
	return page_address(mem->pages[offset >> PAGE_SHIFT]) +
	       offset_in_page(offset);
}

/*
 * vt3d did not confirm it forgot @mem: keep it (and our reference) until
 * it confirms a RESET or the NIC goes away (vt3_dealloc_driver()).
 */
static void vt3_orphan(struct vt3_dev *dev, struct vt3_pages *mem)
{
	spin_lock(&dev->orphan_lock);
	list_add_tail(&mem->orphan, &dev->orphans);
	dev->orphaned++;
	spin_unlock(&dev->orphan_lock);
}

unsigned int vt3_orphaned(struct vt3_dev *dev)
{
	unsigned int n;

	spin_lock(&dev->orphan_lock);
	n = dev->orphaned;
	spin_unlock(&dev->orphan_lock);
	return n;
}

void vt3_free_orphans(struct vt3_dev *dev)
{
	struct vt3_pages *mem, *next;
	LIST_HEAD(list);

	spin_lock(&dev->orphan_lock);
	list_splice_init(&dev->orphans, &list);
	dev->orphaned = 0;
	spin_unlock(&dev->orphan_lock);
	list_for_each_entry_safe(mem, next, &list, orphan) {
		list_del(&mem->orphan);
		vt3_pages_put(mem);
	}
}

/*
 * Allocates a ring or status page; for user objects (@uctx) also an mmap
 * entry, whose key goes to *@key. The entry holds its own reference on
 * the pages: a mapping may outlive the object.
 */
int vt3_queue_mem_alloc(struct vt3_dev *dev, struct ib_ucontext *uctx,
			struct vt3_queue_mem *q, size_t bytes, bool with_pbl,
			u64 *key)
{
	struct vt3_mmap_entry *entry;
	int err;

	q->mem = vt3_pages_alloc(bytes, with_pbl);
	if (!q->mem)
		return -ENOMEM;
	if (!uctx)
		return 0;

	entry = kzalloc(sizeof(*entry), GFP_KERNEL);
	if (!entry) {
		err = -ENOMEM;
		goto err_pages;
	}
	kref_get(&q->mem->ref);
	entry->mem = q->mem;
	err = rdma_user_mmap_entry_insert(uctx, &entry->rdma,
					  (size_t)q->mem->npages << PAGE_SHIFT);
	if (err) {
		vt3_pages_put(q->mem);
		kfree(entry);
		goto err_pages;
	}
	q->mmap = entry;
	*key = rdma_user_mmap_get_offset(&entry->rdma);
	return 0;

err_pages:
	vt3_pages_put(q->mem);
	q->mem = NULL;
	return err;
}

/*
 * Drops the object's hold on a ring/status page. @device_forgot: vt3d
 * confirmed it no longer uses it; otherwise it is orphaned.
 */
void vt3_queue_mem_release(struct vt3_dev *dev, struct vt3_queue_mem *q,
			   bool device_forgot)
{
	if (!q->mem)
		return;
	if (q->mmap) {
		/* New mmaps fail from now on; vt3_mmap_free() drops its ref. */
		rdma_user_mmap_entry_remove(&q->mmap->rdma);
		q->mmap = NULL;
	}
	if (device_forgot)
		vt3_pages_put(q->mem);
	else
		vt3_orphan(dev, q->mem);
	q->mem = NULL;
}

int vt3_access(int ib_access, u32 *access)
{
	/* No atomics in iWARP; no on-demand paging. */
	if (ib_access & ~(IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE |
			  IB_ACCESS_REMOTE_READ | IB_ACCESS_MW_BIND |
			  IB_ACCESS_OPTIONAL))
		return -EOPNOTSUPP;
	*access = 0;
	if (ib_access & IB_ACCESS_LOCAL_WRITE)
		*access |= VT3_ACCESS_LOCAL_WRITE;
	if (ib_access & IB_ACCESS_REMOTE_WRITE)
		*access |= VT3_ACCESS_REMOTE_WRITE;
	if (ib_access & IB_ACCESS_REMOTE_READ)
		*access |= VT3_ACCESS_REMOTE_READ;
	if (ib_access & IB_ACCESS_MW_BIND)
		*access |= VT3_ACCESS_MW_BIND;
	return 0;
}

/* Registers @mem (NULL: a DMA MR); on failure @mem is released or kept. */
static struct ib_mr *vt3_reg_mr(struct vt3_pd *pd, struct vt3_cmd_reg_mr *req,
				struct vt3_pages *mem)
{
	struct vt3_dev *dev = to_vt3_dev(pd->ibpd.device);
	struct vt3_resp_handle resp;
	struct vt3_mr *mr;
	int err;

	mr = kzalloc(sizeof(*mr), GFP_KERNEL);
	if (!mr) {
		if (mem)
			vt3_pages_put(mem);
		return ERR_PTR(-ENOMEM);
	}
	req->pdn = cpu_to_le32(pd->pdn);
	err = vt3_cmd(dev, VT3_CMD_REG_MR, req, sizeof(*req), &resp,
		      sizeof(resp));
	if (err) {
		kfree(mr);
		/* vt3d may have registered it: the pages stay (vt3_refused). */
		if (mem && !vt3_refused(err))
			vt3_orphan(dev, mem);
		else if (mem)
			vt3_pages_put(mem);
		return ERR_PTR(err);
	}
	mr->mem = mem;
	mr->ibmr.lkey = le32_to_cpu(resp.handle);
	mr->ibmr.rkey = mr->ibmr.lkey;
	return &mr->ibmr;
}

/*
 * All guest-physical memory, for kernel ULPs: the core makes one per
 * kernel PD for its local_dma_lkey. Addresses in their SGEs are DMA
 * addresses of our DMA device, i.e. guest-physical.
 *
 * The core asks remote rights on it only for a PD made with
 * IB_PD_UNSAFE_GLOBAL_RKEY (its rkey then opens all of guest RAM to the
 * peer); vt3d grants them only with VT3_MR_UNSAFE_GLOBAL_RKEY, which only
 * such a PD sends. Any other remote rights are refused (VT3_ERR_INVALID).
 */
struct ib_mr *vt3_get_dma_mr(struct ib_pd *ibpd, int ib_access)
{
	struct vt3_cmd_reg_mr req = {
		/* The whole address space; vt3d checks against guest RAM. */
		.length = cpu_to_le64(U64_MAX),
	};
	u32 access, flags = VT3_MR_DMA;
	int err;

	err = vt3_access(ib_access, &access);
	if (err)
		return ERR_PTR(err);
	if (ibpd->flags & IB_PD_UNSAFE_GLOBAL_RKEY)
		flags |= VT3_MR_UNSAFE_GLOBAL_RKEY;
	req.access = cpu_to_le32(access);
	req.flags = cpu_to_le32(flags);
	return vt3_reg_mr(to_vt3_pd(ibpd), &req, NULL);
}

/*
 * Pins [@start, @start + @length) of the caller and builds its PBL; the
 * registration's translation goes to @req (iova @virt, length, PBL,
 * npages, page_offset).
 */
static struct vt3_pages *vt3_pin_user(struct vt3_dev *dev, u64 start,
				      u64 length, u64 virt, int ib_access,
				      struct vt3_cmd_reg_mr *req)
{
	struct ib_block_iter biter;
	struct vt3_pages *mem;
	struct ib_umem *umem;
	size_t npages, i = 0;
	int err;

	if (!length || length > dev->lim.max_mr_size)
		return ERR_PTR(-EINVAL);
	mem = vt3_pages_new(0);
	if (!mem)
		return ERR_PTR(-ENOMEM);
	umem = ib_umem_get(&dev->ibdev, start, length, ib_access);
	if (IS_ERR(umem)) {
		err = PTR_ERR(umem);
		goto err_mem;
	}
	mem->umem = umem;
	npages = ib_umem_num_dma_blocks(umem, VT3_PAGE_SIZE);
	if (!npages || npages > dev->lim.max_pbl_pages) {
		err = -EINVAL;
		goto err_mem;
	}
	mem->pbl = kmalloc_array(npages, sizeof(*mem->pbl),
				 GFP_KERNEL | __GFP_NOWARN);
	if (!mem->pbl) {
		err = -ENOMEM;
		goto err_mem;
	}
	mem->pbl_len = npages;
	rdma_umem_for_each_dma_block(umem, &biter, VT3_PAGE_SIZE)
		mem->pbl[i++] = cpu_to_le64(rdma_block_iter_dma_address(&biter));

	req->iova = cpu_to_le64(virt);
	req->length = cpu_to_le64(length);
	req->pbl_addr = cpu_to_le64(virt_to_phys(mem->pbl));
	req->npages = cpu_to_le32(npages);
	/* Where the region starts in its first PBL page. */
	req->page_offset = cpu_to_le32(ib_umem_offset(umem) &
				       (VT3_PAGE_SIZE - 1));
	return mem;

err_mem:
	vt3_pages_put(mem);
	return ERR_PTR(err);
}

struct ib_mr *vt3_reg_user_mr(struct ib_pd *ibpd, u64 start, u64 length,
			      u64 virt, int ib_access, struct ib_udata *udata)
{
	struct vt3_cmd_reg_mr req = {};
	struct vt3_pages *mem;
	struct ib_mr *ibmr;
	u32 access;
	int err;

	if (!vt3_udata_in_ok(udata))
		return ERR_PTR(-EINVAL);
	err = vt3_access(ib_access, &access);
	if (err)
		return ERR_PTR(err);
	mem = vt3_pin_user(to_vt3_dev(ibpd->device), start, length, virt,
			   ib_access, &req);
	if (IS_ERR(mem))
		return ERR_CAST(mem);
	req.access = cpu_to_le32(access);
	/* Consumes mem on failure. */
	ibmr = vt3_reg_mr(to_vt3_pd(ibpd), &req, mem);
	if (!IS_ERR(ibmr))
		to_vt3_mr(ibmr)->ib_access = ib_access;
	return ibmr;
}

/*
 * ibv_rereg_mr (docs/rereg-mr.md): the TPT entry changes in
 * place and lkey/rkey stay. A new range is pinned before the command and
 * the old one unpinned only once vt3d answered: until then it may still
 * place data there. NULL tells the core the MR was changed in place.
 */
struct ib_mr *vt3_rereg_user_mr(struct ib_mr *ibmr, int flags, u64 start,
				u64 length, u64 virt, int ib_access,
				struct ib_pd *ibpd, struct ib_udata *udata)
{
	struct vt3_dev *dev = to_vt3_dev(ibmr->device);
	struct vt3_mr *mr = to_vt3_mr(ibmr);
	struct vt3_cmd_rereg_mr req = {};
	struct vt3_cmd_reg_mr trans = {};
	struct vt3_pages *mem = NULL;
	int pin_access = mr->ib_access;
	u32 access;
	int err;

	if (!vt3_udata_in_ok(udata))
		return ERR_PTR(-EINVAL);
	/* Only user MRs over pinned pages (not DMA, not fast-reg). */
	if (mr->fast_reg || !mr->mem || !mr->mem->umem)
		return ERR_PTR(-EINVAL);
	req.stag = cpu_to_le32(ibmr->lkey);
	if (flags & IB_MR_REREG_ACCESS) {
		err = vt3_access(ib_access, &access);
		if (err)
			return ERR_PTR(err);
		req.access = cpu_to_le32(access);
		req.change |= cpu_to_le32(VT3_REREG_ACCESS);
		pin_access = ib_access;
		/*
		 * Writable now, pinned read-only: the same range again, pinned
		 * for writing (vt3d's writes must not land in a page a later
		 * copy-on-write replaces).
		 */
		if (!(flags & IB_MR_REREG_TRANS) && !mr->mem->umem->writable &&
		    ib_access_writable(ib_access)) {
			flags |= IB_MR_REREG_TRANS;
			start = mr->mem->umem->address;
			length = mr->mem->umem->length;
			virt = ibmr->iova;
		}
	}
	if (flags & IB_MR_REREG_PD) {
		req.pdn = cpu_to_le32(to_vt3_pd(ibpd)->pdn);
		req.change |= cpu_to_le32(VT3_REREG_PD);
	}
	if (flags & IB_MR_REREG_TRANS) {
		mem = vt3_pin_user(dev, start, length, virt, pin_access, &trans);
		if (IS_ERR(mem))
			return ERR_CAST(mem);
		req.iova = trans.iova;
		req.length = trans.length;
		req.pbl_addr = trans.pbl_addr;
		req.npages = trans.npages;
		req.page_offset = trans.page_offset;
		req.change |= cpu_to_le32(VT3_REREG_TRANSLATION);
	}
	err = vt3_cmd(dev, VT3_CMD_REREG_MR, &req, sizeof(req), NULL, 0);
	if (err) {
		/* Unanswered: vt3d may use the new pages (the old stay the MR's). */
		if (mem && !vt3_refused(err))
			vt3_orphan(dev, mem);
		else if (mem)
			vt3_pages_put(mem);
		return ERR_PTR(err);
	}
	if (mem) {
		vt3_pages_put(mr->mem);
		mr->mem = mem;
	}
	mr->ib_access = pin_access;
	return NULL;
}

/*
 * Fast registration (docs/architecture.md §3.3): an empty, invalid TPT
 * entry of the PD for up to @max_num_sg pages, filled by IB_WR_REG_MR
 * from the page list map_mr_sg builds here.
 */
struct ib_mr *vt3_alloc_mr(struct ib_pd *ibpd, enum ib_mr_type type,
			   u32 max_num_sg)
{
	struct vt3_dev *dev = to_vt3_dev(ibpd->device);
	struct vt3_cmd_alloc_mr req = {};
	struct vt3_resp_handle resp;
	struct vt3_pages *mem;
	struct vt3_mr *mr;
	int err;

	if (type != IB_MR_TYPE_MEM_REG)
		return ERR_PTR(-EINVAL);
	if (!max_num_sg || max_num_sg > dev->lim.max_fast_reg_pages)
		return ERR_PTR(-EINVAL);
	mr = kzalloc(sizeof(*mr), GFP_KERNEL);
	mem = vt3_pages_new(0);
	if (!mr || !mem) {
		err = -ENOMEM;
		goto err;
	}
	/* One physically contiguous list, as every PBL (see the top). */
	mem->pbl = kcalloc(max_num_sg, sizeof(*mem->pbl), GFP_KERNEL);
	if (!mem->pbl) {
		err = -ENOMEM;
		goto err;
	}
	mem->pbl_len = max_num_sg;
	req.pdn = cpu_to_le32(to_vt3_pd(ibpd)->pdn);
	req.max_pages = cpu_to_le32(max_num_sg);
	err = vt3_cmd(dev, VT3_CMD_ALLOC_MR, &req, sizeof(req), &resp,
		      sizeof(resp));
	/*
	 * vt3d reads the list only while it executes a REG_MR naming it, and
	 * none was posted: it may go whatever the outcome.
	 */
	if (err)
		goto err;
	mr->mem = mem;
	mr->fast_reg = true;
	mr->ibmr.lkey = le32_to_cpu(resp.handle);
	mr->ibmr.rkey = mr->ibmr.lkey;
	return &mr->ibmr;
err:
	if (mem)
		vt3_pages_put(mem);
	kfree(mr);
	return ERR_PTR(err);
}

static int vt3_set_page(struct ib_mr *ibmr, u64 addr)
{
	struct vt3_mr *mr = to_vt3_mr(ibmr);

	if (mr->npages >= mr->mem->pbl_len)
		return -ENOMEM;
	/* A DMA address of our DMA device: guest-physical (see the top). */
	mr->mem->pbl[mr->npages++] = cpu_to_le64(addr);
	return 0;
}

/*
 * The ULP maps a fast-reg MR only while it is invalid and no REG_MR of it
 * is outstanding (the verbs' rule), so vt3d is not reading the list now.
 */
int vt3_map_mr_sg(struct ib_mr *ibmr, struct scatterlist *sg, int sg_nents,
		  unsigned int *sg_offset)
{
	struct vt3_mr *mr = to_vt3_mr(ibmr);

	if (!mr->fast_reg || ibmr->page_size != VT3_PAGE_SIZE)
		return -EINVAL;
	mr->npages = 0;
	return ib_sg_to_pages(ibmr, sg, sg_nents, sg_offset, vt3_set_page);
}

int vt3_dereg_mr(struct ib_mr *ibmr, struct ib_udata *udata)
{
	struct vt3_dev *dev = to_vt3_dev(ibmr->device);
	struct vt3_mr *mr = to_vt3_mr(ibmr);
	int err;

	err = vt3_cmd_handle(dev, VT3_CMD_DEREG_MR, ibmr->lkey);
	/*
	 * Memory windows are bound to it (docs/memory-windows.md): the
	 * verbs refuse, and the MR stays whole (rxe does the same).
	 */
	if (err == -EBUSY)
		return err;
	if (err)
		ibdev_dbg(ibmr->device, "DEREG_MR %#x: %d\n", ibmr->lkey, err);
	/* The pinned pages and the PBL stay until vt3d surely forgot them. */
	if (mr->mem) {
		if (vt3_forgot(err))
			vt3_pages_put(mr->mem);
		else
			vt3_orphan(dev, mr->mem);
	}
	kfree(mr);
	return 0;
}

/*
 * Memory windows (docs/memory-windows.md): an unbound TPT entry of the
 * PD. Binds are work requests (libvt3 posts them), so the window's
 * current key is known only to the application; DEALLOC_MW names the
 * index and vt3d takes any key.
 */
int vt3_alloc_mw(struct ib_mw *ibmw, struct ib_udata *udata)
{
	struct vt3_dev *dev = to_vt3_dev(ibmw->device);
	struct vt3_cmd_alloc_mw req = {};
	struct vt3_resp_handle resp;
	int err;

	if (udata && (udata->inlen || udata->outlen))
		return -EINVAL;
	switch (ibmw->type) {
	case IB_MW_TYPE_1:
		req.mw_type = cpu_to_le32(VT3_MW_TYPE_1);
		break;
	case IB_MW_TYPE_2:
		req.mw_type = cpu_to_le32(VT3_MW_TYPE_2);
		break;
	default:
		return -EINVAL;
	}
	req.pdn = cpu_to_le32(to_vt3_pd(ibmw->pd)->pdn);
	err = vt3_cmd(dev, VT3_CMD_ALLOC_MW, &req, sizeof(req), &resp,
		      sizeof(resp));
	if (err)
		return err;
	ibmw->rkey = le32_to_cpu(resp.handle);
	return 0;
}

int vt3_dealloc_mw(struct ib_mw *ibmw)
{
	int err = vt3_cmd_handle(to_vt3_dev(ibmw->device), VT3_CMD_DEALLOC_MW,
				 ibmw->rkey);

	/* Nothing of the guest's is held for a window: it may go regardless. */
	if (err)
		ibdev_dbg(ibmw->device, "DEALLOC_MW %#x: %d\n", ibmw->rkey, err);
	return 0;
}
