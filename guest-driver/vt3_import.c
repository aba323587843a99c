// SPDX-License-Identifier: GPL-2.0
/*
 * vt3 import support: what a second process needs to take over a user
 * context and its objects through the shared uverbs fd (ibv_import_device,
 * ibv_import_pd; ibv_import_mr needs nothing of ours, the core's
 * UVERBS_METHOD_QUERY_MR reads the ib_mr). Every handle is resolved by the
 * core in the fd's own object table, so a process reaches only the
 * objects of the context it holds the fd of.
 */
#define UVERBS_MODULE_NAME vt3_ib
#include <rdma/uverbs_ioctl.h>
#include <rdma/uverbs_named_ioctl.h>

#include "vt3.h"

/*
 * UVERBS_METHOD_QUERY_CONTEXT: the core reports the comp vectors, then
 * asks us; without this op it answers EOPNOTSUPP (import refused).
 */
int vt3_query_ucontext(struct ib_ucontext *ibuc,
		       struct uverbs_attr_bundle *attrs)
{
	struct vt3_alloc_ucontext_resp resp;

	vt3_ucontext_resp(to_vt3_dev(ibuc->device), &resp);
	return uverbs_copy_to_struct_or_zero(attrs,
					     VT3_ATTR_QUERY_CONTEXT_RESP_UCTX,
					     &resp, sizeof(resp));
}

ADD_UVERBS_ATTRIBUTES_SIMPLE(vt3_query_context, UVERBS_OBJECT_DEVICE,
			     UVERBS_METHOD_QUERY_CONTEXT,
			     UVERBS_ATTR_PTR_OUT(VT3_ATTR_QUERY_CONTEXT_RESP_UCTX,
						 UVERBS_ATTR_STRUCT(struct vt3_alloc_ucontext_resp,
								    max_inline),
						 UA_OPTIONAL));

/* An importer learns that its PD handle names a live PD, and its pdn. */
static int UVERBS_HANDLER(VT3_METHOD_PD_QUERY)(struct uverbs_attr_bundle *attrs)
{
	struct ib_pd *pd = uverbs_attr_get_obj(attrs, VT3_ATTR_QUERY_PD_HANDLE);
	u32 pdn = to_vt3_pd(pd)->pdn;

	return uverbs_copy_to(attrs, VT3_ATTR_QUERY_PD_RESP_PDN, &pdn,
			      sizeof(pdn));
}

DECLARE_UVERBS_NAMED_METHOD(VT3_METHOD_PD_QUERY,
			    UVERBS_ATTR_IDR(VT3_ATTR_QUERY_PD_HANDLE, UVERBS_OBJECT_PD,
					    UVERBS_ACCESS_READ, UA_MANDATORY),
			    UVERBS_ATTR_PTR_OUT(VT3_ATTR_QUERY_PD_RESP_PDN, UVERBS_ATTR_TYPE(u32),
						UA_MANDATORY));

ADD_UVERBS_METHODS(vt3_pd, UVERBS_OBJECT_PD,
		   &UVERBS_METHOD(VT3_METHOD_PD_QUERY));

const struct uapi_definition vt3_uapi_defs[] = {
	UAPI_DEF_CHAIN_OBJ_TREE(UVERBS_OBJECT_DEVICE, &vt3_query_context),
	UAPI_DEF_CHAIN_OBJ_TREE(UVERBS_OBJECT_PD, &vt3_pd),
	{},
};
