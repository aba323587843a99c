/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The kernel APIs vt3.ko uses that differ between the kernels it builds
 * against (Debian 12's 6.1 and 6.12, and those in between). Every
 * LINUX_VERSION_CODE test of the driver is here, so the rest of it reads
 * like code for one kernel; each wrapper is named after what it does.
 */
#ifndef VT3_COMPAT_H
#define VT3_COMPAT_H

#include <linux/mm.h>
#include <linux/version.h>
#include <rdma/ib_verbs.h>
#include <rdma/uverbs_ioctl.h>

/*
 * <asm/unaligned.h> became <linux/unaligned.h> in 6.12; the old name is
 * gone, so include whichever this kernel has.
 */
#if KERNEL_VERSION(6, 12, 0) <= LINUX_VERSION_CODE
#include <linux/unaligned.h>
#else
#include <asm/unaligned.h>
#endif

/*
 * vm_flags is read-only since 6.3 (VMA flag changes go through helpers
 * that assert the mmap lock is held for writing); before, it was a plain
 * field. The core calls ->mmap with that lock held either way.
 */
static inline void vt3_vma_clear_flags(struct vm_area_struct *vma,
				       vm_flags_t flags)
{
#if KERNEL_VERSION(6, 3, 0) <= LINUX_VERSION_CODE
	vm_flags_clear(vma, flags);
#else
	vma->vm_flags &= ~flags;
#endif
}

/*
 * ib_device_ops.create_cq gets the whole uverbs attribute bundle since
 * 6.11 (NULL for a kernel CQ), the driver's udata alone before. vt3's
 * create_cq takes a struct vt3_create_cq_attrs * and asks
 * VT3_CREATE_CQ_UDATA() for its udata (NULL for a kernel CQ on both).
 */
#if KERNEL_VERSION(6, 11, 0) <= LINUX_VERSION_CODE
#define vt3_create_cq_attrs uverbs_attr_bundle
#define VT3_CREATE_CQ_UDATA(attrs) ((attrs) ? &(attrs)->driver_udata : NULL)
#else
#define vt3_create_cq_attrs ib_udata
#define VT3_CREATE_CQ_UDATA(attrs) (attrs)
#endif

#endif /* VT3_COMPAT_H */
