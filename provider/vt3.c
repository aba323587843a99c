// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
/*
 * libvt3: device matching, context setup and the verbs table.
 */
#include <config.h>

#include <errno.h>
#include <stdlib.h>

#include "vt3.h"
#include "vt3dv.h"

static_assert(VT3DV_ABI_VERSION == VT3_ABI_VERSION,
	      "vt3dv.h names the kernel ABI this provider speaks");

static void vt3_free_context(struct ibv_context *ibctx)
{
	struct vt3_context *ctx =
		container_of(ibctx, struct vt3_context, ibv_ctx.context);

	vt3_qp_table_free(ctx);
	pthread_mutex_destroy(&ctx->qps_lock);
	verbs_uninit_context(&ctx->ibv_ctx);
	free(ctx);
}

static const struct verbs_context_ops vt3_ctx_ops = {
	.query_device_ex = vt3_query_device,
	.query_port = vt3_query_port,
	.alloc_pd = vt3_alloc_pd,
	.dealloc_pd = vt3_dealloc_pd,
	.alloc_parent_domain = vt3_alloc_parent_domain,
	.alloc_td = vt3_alloc_td,
	.dealloc_td = vt3_dealloc_td,
	.reg_mr = vt3_reg_mr,
	.rereg_mr = vt3_rereg_mr,
	.dereg_mr = vt3_dereg_mr,
	.import_pd = vt3_import_pd,
	.unimport_pd = vt3_unimport_pd,
	.import_mr = vt3_import_mr,
	.unimport_mr = vt3_unimport_mr,
	.alloc_mw = vt3_alloc_mw,
	.dealloc_mw = vt3_dealloc_mw,
	.bind_mw = vt3_bind_mw,
	.create_cq = vt3_create_cq,
	.create_cq_ex = vt3_create_cq_ex,
	.destroy_cq = vt3_destroy_cq,
	.poll_cq = vt3_poll_cq,
	.req_notify_cq = vt3_req_notify_cq,
	.create_qp = vt3_create_qp,
	.create_qp_ex = vt3_create_qp_ex,
	.modify_qp = vt3_modify_qp,
	.query_qp = vt3_query_qp,
	.destroy_qp = vt3_destroy_qp,
	.post_send = vt3_post_send,
	.post_recv = vt3_post_recv,
	.create_srq = vt3_create_srq,
	.modify_srq = vt3_modify_srq,
	.query_srq = vt3_query_srq,
	.destroy_srq = vt3_destroy_srq,
	.post_srq_recv = vt3_post_srq_recv,
	.async_event = vt3_async_event,
	.free_context = vt3_free_context,
};

/*
 * vt3.ko and this library must agree on the ring formats, not only on the
 * udata layout that the uverbs ABI version (checked at match time) covers.
 */
static int vt3_check_ucontext(struct verbs_context *vctx,
			      const struct vt3_alloc_ucontext_resp *resp)
{
	if (resp->abi_version != VT3_ABI_VERSION ||
	    resp->wqe_size != VT3_WQE_SIZE ||
	    resp->cqe_size != sizeof(struct vt3_cqe)) {
		verbs_err(vctx,
			  "libvt3: kernel ABI %u (WQE %u, CQE %u bytes), this library speaks %u (WQE %u, CQE %zu bytes)\n",
			  resp->abi_version, resp->wqe_size, resp->cqe_size,
			  VT3_ABI_VERSION, VT3_WQE_SIZE, sizeof(struct vt3_cqe));
		return EPROTO;
	}
	return 0;
}

/* Limits post_send checks that no udata carries. */
static int vt3_query_limits(struct vt3_context *ctx)
{
	struct ib_uverbs_ex_query_device_resp resp;
	size_t resp_size = sizeof(resp);
	struct ibv_device_attr_ex attr;
	int ret;

	ret = ibv_cmd_query_device_any(&ctx->ibv_ctx.context, NULL, &attr,
				       sizeof(attr), &resp, &resp_size);
	if (ret)
		return ret;
	/* 0 would mean no READ at all: take it as "no limit of its own". */
	ctx->max_sge_rd = attr.orig_attr.max_sge_rd ?: VT3_MAX_SGE;
	return 0;
}

struct vt3_context *vt3_context_alloc(struct ibv_device *ibdev, int cmd_fd)
{
	struct vt3_context *ctx;

	return verbs_init_and_alloc_context(ibdev, cmd_fd, ctx, ibv_ctx,
					    to_vt3_dev(ibdev)->driver_id);
}

/*
 * Sets up @ctx from the kernel's @resp (of its creation or its import);
 * NULL with errno set, @ctx freed, if that fails or @err says it did.
 */
struct verbs_context *vt3_context_setup(struct vt3_context *ctx, int err,
					const struct vt3_alloc_ucontext_resp *resp)
{
	if (!err)
		err = vt3_check_ucontext(&ctx->ibv_ctx, resp);
	if (!err)
		err = vt3_query_limits(ctx);
	if (err) {
		verbs_uninit_context(&ctx->ibv_ctx);
		free(ctx);
		errno = err;
		return NULL;
	}

	pthread_mutex_init(&ctx->qps_lock, NULL);
	list_head_init(&ctx->qps);
	ctx->wrcheck = vt3_wrcheck_enabled();
	verbs_set_ops(&ctx->ibv_ctx, &vt3_ctx_ops);
	return &ctx->ibv_ctx;
}

static struct verbs_context *vt3_alloc_context(struct ibv_device *ibdev,
					       int cmd_fd, void *private_data)
{
	struct uvt3_alloc_ucontext_resp resp = {};
	struct ibv_get_context cmd = {};
	struct vt3_context *ctx;
	int ret;

	ctx = vt3_context_alloc(ibdev, cmd_fd);
	if (!ctx)
		return NULL;

	ret = ibv_cmd_get_context(&ctx->ibv_ctx, &cmd, sizeof(cmd),
				  &resp.ibv_resp, sizeof(resp));
	return vt3_context_setup(ctx, ret, &resp.drv);
}

static struct verbs_device *vt3_device_alloc(struct verbs_sysfs_dev *sysfs_dev)
{
	struct vt3_device *dev;

	dev = calloc(1, sizeof(*dev));
	if (!dev)
		return NULL;

	dev->driver_id = sysfs_dev->driver_id;
	return &dev->ibv_dev;
}

static void vt3_device_free(struct verbs_device *vdev)
{
	free(container_of(vdev, struct vt3_device, ibv_dev));
}

/*
 * vt3.ko reports driver id RDMA_DRIVER_CXGB3: a T3 look-alike, and an id no
 * other provider claims since cxgb3 left rdma-core. libibverbs tries
 * driver ids before names, and an id survives `rdma dev set NAME name X`.
 * Should the kernel report RDMA_DRIVER_UNKNOWN instead, the device name
 * prefix "vt3" (ib devices vt3_0, vt3_1, ...) still finds us.
 */
static const struct verbs_match_ent vt3_match_table[] = {
	VERBS_DRIVER_ID(RDMA_DRIVER_CXGB3),
	VERBS_NAME_MATCH("vt3", NULL),
	{}
};

static const struct verbs_device_ops vt3_dev_ops = {
	.name = "vt3",
	/* The per-device uverbs ABI, i.e. vt3.ko's ib_device_ops.uverbs_abi_ver. */
	.match_min_abi_version = VT3_ABI_VERSION,
	.match_max_abi_version = VT3_ABI_VERSION,
	.match_table = vt3_match_table,
	.alloc_device = vt3_device_alloc,
	.uninit_device = vt3_device_free,
	.alloc_context = vt3_alloc_context,
	.import_context = vt3_import_context,
};

PROVIDER_DRIVER(vt3, vt3_dev_ops);
