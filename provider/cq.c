// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
/*
 * libvt3 completions: CQEs are read from the mapped ring (vt3d produces,
 * we consume and publish our consumer index in the CQ status page), and
 * QPs in error are flushed here (DESIGN.md §5). Reaping is the data-path
 * issue; until then polling fails rather than report phantom completions.
 */
#include <config.h>

#include <errno.h>

#include "vt3.h"

int vt3_poll_cq(struct ibv_cq *ibcq, int num_entries, struct ibv_wc *wc)
{
	return -EOPNOTSUPP;
}

/* Arming is a kernel command (VT3_CMD_ARM_CQ): nothing for us to map. */
int vt3_req_notify_cq(struct ibv_cq *ibcq, int solicited_only)
{
	return ibv_cmd_req_notify_cq(ibcq, solicited_only);
}
