// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
/*
 * libvt3 protection domains, parent domains and thread domains.
 *
 * A parent domain is a PD to the kernel (it carries its protection
 * domain's handle, ibv_initialize_parent_domain()) and, to us, the
 * allocator of the buffers the provider allocates itself for a QP or SRQ
 * created on it: the QP's send and receive shadows, the SRQ's slots
 * (vt3dv.h: VT3DV_RES_TYPE_*). The rings and status pages are vt3.ko's,
 * mapped from the uverbs fd: no allocator can place them.
 *
 * A thread domain is accepted and changes no locking: the SQ and RQ
 * locks are not the posting thread's alone (poll_cq takes them to flush,
 * from whatever thread polls the CQ), so mlx5's lock-free thread domain
 * would not be safe here, and an uncontended spin lock costs little
 * beside a WQE's copy into the ring.
 */
#include <config.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "vt3.h"

struct ibv_pd *vt3_alloc_pd(struct ibv_context *ibctx)
{
	struct uvt3_alloc_pd_resp resp = {};
	struct ibv_alloc_pd cmd = {};
	struct vt3_pd *pd;
	int ret;

	pd = calloc(1, sizeof(*pd));
	if (!pd)
		return NULL;

	ret = ibv_cmd_alloc_pd(ibctx, &pd->ibv_pd, &cmd, sizeof(cmd),
			       &resp.ibv_resp, sizeof(resp));
	if (ret) {
		free(pd);
		errno = ret;
		return NULL;
	}
	return &pd->ibv_pd;
}

struct ibv_pd *vt3_alloc_parent_domain(struct ibv_context *ibctx,
				       struct ibv_parent_domain_init_attr *attr)
{
	struct vt3_pd *parent, *protection;

	if (!check_comp_mask(attr->comp_mask,
			     IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS |
			     IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT)) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	if (!attr->pd || attr->pd->context != ibctx ||
	    to_vt3_pd(attr->pd)->protection ||
	    (attr->td && attr->td->context != ibctx) ||
	    ((attr->comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS) &&
	     (!attr->alloc || !attr->free))) {
		errno = EINVAL;
		return NULL;
	}
	parent = calloc(1, sizeof(*parent));
	if (!parent)
		return NULL;
	protection = to_vt3_pd(attr->pd);
	parent->protection = protection;
	ibv_initialize_parent_domain(&parent->ibv_pd, &protection->ibv_pd);
	__atomic_add_fetch(&protection->refs, 1, __ATOMIC_RELAXED);
	if (attr->td) {
		parent->td = attr->td;
		__atomic_add_fetch(&container_of(attr->td, struct vt3_td, ibv_td)->refs,
				   1, __ATOMIC_RELAXED);
	}
	if (attr->comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS) {
		parent->alloc = attr->alloc;
		parent->free = attr->free;
	}
	if (attr->comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT)
		parent->pd_context = attr->pd_context;
	return &parent->ibv_pd;
}

/* EBUSY while parent domains use the PD, or objects the parent domain. */
int vt3_dealloc_pd(struct ibv_pd *ibpd)
{
	struct vt3_pd *pd = to_vt3_pd(ibpd);
	int ret;

	if (__atomic_load_n(&pd->refs, __ATOMIC_ACQUIRE))
		return EBUSY;
	if (pd->protection) {
		__atomic_sub_fetch(&pd->protection->refs, 1, __ATOMIC_RELEASE);
		if (pd->td)
			__atomic_sub_fetch(&container_of(pd->td, struct vt3_td,
							 ibv_td)->refs,
					   1, __ATOMIC_RELEASE);
		free(pd);
		return 0;
	}
	ret = ibv_cmd_dealloc_pd(ibpd);
	if (ret)
		return ret;
	free(pd);
	return 0;
}

struct ibv_td *vt3_alloc_td(struct ibv_context *ibctx,
			    struct ibv_td_init_attr *attr)
{
	struct vt3_td *td;

	if (attr->comp_mask) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	td = calloc(1, sizeof(*td));
	if (!td)
		return NULL;
	td->ibv_td.context = ibctx;
	return &td->ibv_td;
}

int vt3_dealloc_td(struct ibv_td *ibtd)
{
	struct vt3_td *td = container_of(ibtd, struct vt3_td, ibv_td);

	if (__atomic_load_n(&td->refs, __ATOMIC_ACQUIRE))
		return EBUSY;
	free(td);
	return 0;
}

/*
 * The parent domain @pd is, held for an object created on it (NULL: a
 * plain PD, nothing to hold); vt3_domain_put() when the object goes.
 */
struct vt3_pd *vt3_domain_get(struct ibv_pd *pd)
{
	struct vt3_pd *domain = pd ? to_vt3_pd(pd) : NULL;

	if (!domain || !domain->protection)
		return NULL;
	__atomic_add_fetch(&domain->refs, 1, __ATOMIC_RELAXED);
	return domain;
}

void vt3_domain_put(struct vt3_pd *domain)
{
	if (domain)
		__atomic_sub_fetch(&domain->refs, 1, __ATOMIC_RELEASE);
}

/*
 * A zeroed buffer of the provider's own for an object of @domain (NULL:
 * no parent domain): from its allocator if it has one and that does not
 * answer IBV_ALLOCATOR_USE_DEFAULT, else calloc(). *@custom: whether
 * the allocator gave it (its free callback takes only those).
 */
void *vt3_buf_calloc(struct vt3_pd *domain, size_t num, size_t size,
		     uint64_t type, bool *custom)
{
	size_t len;
	void *p;

	*custom = false;
	if (__builtin_mul_overflow(num, size, &len)) {
		errno = ENOMEM;
		return NULL;
	}
	if (!domain || !domain->alloc)
		return calloc(1, len);
	p = domain->alloc(&domain->ibv_pd, domain->pd_context, len, 64, type);
	if (p == IBV_ALLOCATOR_USE_DEFAULT)
		return calloc(1, len);
	if (!p) {
		errno = ENOMEM;
		return NULL;
	}
	*custom = true;
	/* The allocator is to zero it; a buffer the flush reads must be. */
	memset(p, 0, len);
	return p;
}

void vt3_buf_free(struct vt3_pd *domain, void *ptr, uint64_t type, bool custom)
{
	if (custom)
		domain->free(&domain->ibv_pd, domain->pd_context, ptr, type);
	else
		free(ptr);
}
