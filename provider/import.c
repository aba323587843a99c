// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
/*
 * libvt3 import: a context, PD and MR of another process, taken over
 * through its uverbs fd (ibv_import_device(), ibv_import_pd(),
 * ibv_import_mr()), as the process that hands the fd on created them.
 *
 * A vt3 context maps nothing of its own: each CQ, QP and SRQ maps its
 * ring and status page when it is created, so what an importer creates
 * maps from the shared fd as its creator's objects did. What it must
 * re-derive is what the context's creation returned: vt3.ko answers
 * UVERBS_METHOD_QUERY_CONTEXT with the same struct vt3_alloc_ucontext_resp,
 * checked as at creation, and the device limits are queried again.
 *
 * Imported PDs and MRs are the creator's objects (one kernel object, two
 * handles onto it in user space): unimporting frees only our struct;
 * ibv_dealloc_pd()/ibv_dereg_mr() of either process destroys the object.
 * Asynchronous events of QPs the importer creates still reach the async
 * fd the context was created with (uverbs' default one), not the
 * importer's.
 */
#include <config.h>

#include <errno.h>
#include <stdlib.h>

#include <infiniband/cmd_ioctl.h>

#include "vt3.h"

struct verbs_context *vt3_import_context(struct ibv_device *ibdev, int cmd_fd)
{
	struct vt3_alloc_ucontext_resp resp = {};
	struct vt3_context *ctx;
	int ret;

	DECLARE_COMMAND_BUFFER_LINK(driver_attr, UVERBS_OBJECT_DEVICE,
				    UVERBS_METHOD_QUERY_CONTEXT, 1, NULL);

	ctx = vt3_context_alloc(ibdev, cmd_fd);
	if (!ctx)
		return NULL;

	fill_attr_out_ptr(driver_attr, VT3_ATTR_QUERY_CONTEXT_RESP_UCTX, &resp);
	/* EOPNOTSUPP from a vt3.ko without import support. */
	ret = ibv_cmd_query_context(&ctx->ibv_ctx.context, driver_attr);
	return vt3_context_setup(ctx, ret, &resp);
}

/* vt3.ko checks that @pd_handle names a live PD of this context. */
struct ibv_pd *vt3_import_pd(struct ibv_context *ibctx, uint32_t pd_handle)
{
	struct vt3_pd *pd;
	uint32_t pdn;
	int ret;

	DECLARE_COMMAND_BUFFER(cmd, UVERBS_OBJECT_PD, VT3_METHOD_PD_QUERY, 2);

	pd = calloc(1, sizeof(*pd));
	if (!pd)
		return NULL;

	fill_attr_in_obj(cmd, VT3_ATTR_QUERY_PD_HANDLE, pd_handle);
	fill_attr_out_ptr(cmd, VT3_ATTR_QUERY_PD_RESP_PDN, &pdn);
	ret = execute_ioctl(ibctx, cmd);
	if (ret) {
		free(pd);
		errno = ret;
		return NULL;
	}
	pd->ibv_pd.context = ibctx;
	pd->ibv_pd.handle = pd_handle;
	return &pd->ibv_pd;
}

void vt3_unimport_pd(struct ibv_pd *ibpd)
{
	free(to_vt3_pd(ibpd));
}

/* The core's UVERBS_METHOD_QUERY_MR: keys and length; the address is NULL. */
struct ibv_mr *vt3_import_mr(struct ibv_pd *pd, uint32_t mr_handle)
{
	struct verbs_mr *vmr;
	int ret;

	vmr = calloc(1, sizeof(*vmr));
	if (!vmr)
		return NULL;

	ret = ibv_cmd_query_mr(pd, vmr, mr_handle);
	if (ret) {
		free(vmr);
		errno = ret;
		return NULL;
	}
	return &vmr->ibv_mr;
}

void vt3_unimport_mr(struct ibv_mr *ibmr)
{
	free(verbs_get_mr(ibmr));
}
