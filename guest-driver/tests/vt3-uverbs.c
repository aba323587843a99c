// SPDX-License-Identifier: GPL-2.0
/*
 * vt3-uverbs: drives vt3.ko's user-space verbs through the raw uverbs
 * write() ABI, without libibverbs or a provider, and checks what the
 * driver hands back (udata responses, mmaps, status pages).
 *
 *   vt3-uverbs check   create PD, MR, CQ, QP; map and inspect the rings;
 *                      walk QP states; doorbell and arm; bad arguments;
 *                      destroy everything. Exit 0 when all checks pass.
 *   vt3-uverbs hold    create the same objects, print "holding", then
 *                      sleep until killed (for rmmod with live objects).
 *   vt3-uverbs efault  create the same objects, print "creating", then a
 *                      QP whose response lands on a read-only page: the
 *                      driver's copy to user space fails after vt3d made
 *                      the QP, which must end in EFAULT with nothing left
 *                      that a device loss could still find. Lingers 3 s
 *                      (for the loss), then exits.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <rdma/ib_user_verbs.h>

#include "../include/vt3_hw.h"
#include "../include/uapi/vt3-abi.h"

/* enum ib_qp_state and attribute masks, as in the kernel. */
enum { QPS_RESET, QPS_INIT, QPS_RTR, QPS_RTS, QPS_SQD, QPS_SQE, QPS_ERR };
#define QP_STATE		(1 << 0)
#define QP_MAX_QP_RD_ATOMIC	(1 << 13)
#define QPT_RC			2
#define ACCESS_LOCAL_WRITE	1
#define ACCESS_REMOTE_WRITE	2
#define ACCESS_REMOTE_READ	4

static int failures;

#define CHECK(cond, ...)						\
	do {								\
		if (cond) {						\
			printf("ok   ");				\
		} else {						\
			printf("FAIL ");				\
			failures++;					\
		}							\
		printf(__VA_ARGS__);					\
		printf("\n");						\
	} while (0)

struct ctx {
	int fd;
	struct vt3_alloc_ucontext_resp uctx;
	uint32_t pd, mr, cq, qp;
	uint32_t pdn, lkey, cqn, qpn;
	struct vt3_create_cq_resp cqr;
	struct vt3_create_qp_resp qpr;
	struct ib_uverbs_create_qp_resp qpbase;
	void *cq_ring, *cq_status, *sq, *rq, *qp_status;
	char *buf;
};

/*
 * One legacy uverbs command: header, command struct, then the response
 * (core part + driver part) written to @resp. Returns 0 or -errno.
 */
static int cmd(int fd, uint32_t command, void *req, size_t req_len,
	       void *resp, size_t resp_len)
{
	char msg[sizeof(struct ib_uverbs_cmd_hdr) + 512];
	struct ib_uverbs_cmd_hdr *hdr = (void *)msg;
	size_t len = sizeof(*hdr) + req_len;

	if (resp)
		*(uint64_t *)req = (uintptr_t)resp;
	hdr->command = command;
	hdr->in_words = len / 4;
	hdr->out_words = resp_len / 4;
	memcpy(msg + sizeof(*hdr), req, req_len);
	if (write(fd, msg, len) != (ssize_t)len)
		return -errno;
	return 0;
}

static int open_vt3(void)
{
	char path[300], name[64];
	struct dirent *d;
	DIR *dir;
	FILE *f;
	int fd = -1;

	dir = opendir("/sys/class/infiniband_verbs");
	if (!dir)
		return -1;
	while ((d = readdir(dir))) {
		if (strncmp(d->d_name, "uverbs", 6))
			continue;
		snprintf(path, sizeof(path), "/sys/class/infiniband_verbs/%s/ibdev",
			 d->d_name);
		f = fopen(path, "r");
		if (!f)
			continue;
		if (fgets(name, sizeof(name), f) && !strncmp(name, "vt3", 3)) {
			snprintf(path, sizeof(path), "/dev/infiniband/%s",
				 d->d_name);
			fd = open(path, O_RDWR | O_CLOEXEC);
		}
		fclose(f);
		if (fd >= 0)
			break;
	}
	closedir(dir);
	return fd;
}

static void *map(int fd, uint64_t key, size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, key);

	return p == MAP_FAILED ? NULL : p;
}

static int get_context(struct ctx *c)
{
	struct {
		struct ib_uverbs_get_context_resp core;
		struct vt3_alloc_ucontext_resp drv;
	} resp = {};
	struct ib_uverbs_get_context req = {};
	int err;

	err = cmd(c->fd, IB_USER_VERBS_CMD_GET_CONTEXT, &req, sizeof(req),
		  &resp, sizeof(resp));
	c->uctx = resp.drv;
	return err;
}

static int alloc_pd(struct ctx *c)
{
	struct {
		struct ib_uverbs_alloc_pd_resp core;
		struct vt3_alloc_pd_resp drv;
	} resp = {};
	struct ib_uverbs_alloc_pd req = {};
	int err;

	err = cmd(c->fd, IB_USER_VERBS_CMD_ALLOC_PD, &req, sizeof(req), &resp,
		  sizeof(resp));
	c->pd = resp.core.pd_handle;
	c->pdn = resp.drv.pdn;
	return err;
}

static int reg_mr(struct ctx *c, void *addr, uint64_t len, uint32_t *handle,
		  uint32_t *lkey)
{
	struct ib_uverbs_reg_mr req = {
		.start = (uintptr_t)addr,
		.length = len,
		.hca_va = (uintptr_t)addr,
		.pd_handle = c->pd,
		.access_flags = ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE |
				ACCESS_REMOTE_READ,
	};
	struct ib_uverbs_reg_mr_resp resp = {};
	int err;

	err = cmd(c->fd, IB_USER_VERBS_CMD_REG_MR, &req, sizeof(req), &resp,
		  sizeof(resp));
	*handle = resp.mr_handle;
	*lkey = resp.lkey;
	return err;
}

static int create_cq(struct ctx *c, uint32_t cqe, uint32_t *handle,
		     struct vt3_create_cq_resp *drv)
{
	struct {
		struct ib_uverbs_create_cq_resp core;
		struct vt3_create_cq_resp drv;
	} resp = {};
	struct ib_uverbs_create_cq req = { .cqe = cqe, .comp_channel = -1 };
	int err;

	err = cmd(c->fd, IB_USER_VERBS_CMD_CREATE_CQ, &req, sizeof(req),
		  &resp, sizeof(resp));
	*handle = resp.core.cq_handle;
	*drv = resp.drv;
	return err;
}

struct create_qp_resp {
	struct ib_uverbs_create_qp_resp core;
	struct vt3_create_qp_resp drv;
};

static void create_qp_req(struct ctx *c, uint32_t wr, uint32_t sge,
			  struct ib_uverbs_create_qp *req)
{
	*req = (struct ib_uverbs_create_qp){
		.pd_handle = c->pd,
		.send_cq_handle = c->cq,
		.recv_cq_handle = c->cq,
		.max_send_wr = wr,
		.max_recv_wr = wr,
		.max_send_sge = sge,
		.max_recv_sge = sge,
		.max_inline_data = 32,
		.qp_type = QPT_RC,
	};
}

static int create_qp(struct ctx *c, uint32_t wr, uint32_t sge, uint32_t *handle)
{
	struct create_qp_resp resp = {};
	struct ib_uverbs_create_qp req;
	int err;

	create_qp_req(c, wr, sge, &req);
	err = cmd(c->fd, IB_USER_VERBS_CMD_CREATE_QP, &req, sizeof(req),
		  &resp, sizeof(resp));
	*handle = resp.core.qp_handle;
	c->qpbase = resp.core;
	c->qpr = resp.drv;
	return err;
}

static int modify_qp(struct ctx *c, int state)
{
	struct ib_uverbs_modify_qp req = {
		.qp_handle = c->qp,
		.attr_mask = QP_STATE,
		.qp_state = state,
	};

	return cmd(c->fd, IB_USER_VERBS_CMD_MODIFY_QP, &req, sizeof(req),
		   NULL, 0);
}

static int query_qp(struct ctx *c, struct ib_uverbs_query_qp_resp *resp)
{
	struct ib_uverbs_query_qp req = { .qp_handle = c->qp,
					  .attr_mask = QP_STATE };

	memset(resp, 0, sizeof(*resp));
	return cmd(c->fd, IB_USER_VERBS_CMD_QUERY_QP, &req, sizeof(req), resp,
		   sizeof(*resp));
}

static int destroy(int fd, uint32_t command, uint32_t handle)
{
	struct {
		uint64_t response;
		uint32_t handle;
		uint32_t reserved;
	} req = { .handle = handle };
	uint64_t resp[2] = {};

	switch (command) {
	case IB_USER_VERBS_CMD_DEALLOC_PD:
	case IB_USER_VERBS_CMD_DEREG_MR:
		/* No response: the handle is the first field. */
		return cmd(fd, command, &handle, sizeof(handle), NULL, 0);
	default:
		return cmd(fd, command, &req, sizeof(req), resp, sizeof(resp));
	}
}

/* PD, MR, CQ and QP, each mapped and checked. */
static void create_all(struct ctx *c)
{
	struct vt3_cq_status *cs;
	struct vt3_qp_status *qs;
	int err;

	err = get_context(c);
	CHECK(!err, "GET_CONTEXT (%d)", err);
	CHECK(c->uctx.abi_version == VT3_ABI_VERSION &&
	      c->uctx.wqe_size == VT3_WQE_SIZE &&
	      c->uctx.cqe_size == sizeof(struct vt3_cqe) &&
	      c->uctx.max_inline <= VT3_MAX_INLINE,
	      "ucontext resp: abi %u wqe %u cqe %u inline %u",
	      c->uctx.abi_version, c->uctx.wqe_size, c->uctx.cqe_size,
	      c->uctx.max_inline);

	err = alloc_pd(c);
	CHECK(!err, "ALLOC_PD (%d): pdn %u", err, c->pdn);

	/* An odd start and length: the PBL must cover partial pages. */
	c->buf = aligned_alloc(4096, 5 * 4096);
	memset(c->buf, 0xab, 5 * 4096);
	err = reg_mr(c, c->buf + 100, 3 * 4096 + 7, &c->mr, &c->lkey);
	CHECK(!err, "REG_MR (%d): stag %#x", err, c->lkey);

	err = create_cq(c, 100, &c->cq, &c->cqr);
	CHECK(!err && c->cqr.depth == 128 &&
	      c->cqr.ring_size == 128 * sizeof(struct vt3_cqe),
	      "CREATE_CQ 100 (%d): cqn %u depth %u ring %u bytes", err,
	      c->cqr.cqn, c->cqr.depth, c->cqr.ring_size);
	c->cq_ring = map(c->fd, c->cqr.ring_key, c->cqr.ring_size);
	c->cq_status = map(c->fd, c->cqr.status_key, 4096);
	CHECK(c->cq_ring && c->cq_status, "mmap CQ ring and status page");
	if (c->cq_status) {
		cs = c->cq_status;
		CHECK(cs->prod == 0 && cs->cons == 0 && cs->flags == 0,
		      "CQ status page starts empty");
	}

	err = create_qp(c, 50, 2, &c->qp);
	CHECK(!err && c->qpr.sq_depth == 64 && c->qpr.rq_depth == 64 &&
	      c->qpr.sq_size == 64 * VT3_WQE_SIZE &&
	      c->qpr.qpn == c->qpbase.qpn &&
	      c->qpbase.max_send_wr == 64 && c->qpbase.max_inline_data ==
	      c->uctx.max_inline,
	      "CREATE_QP 50 WRs (%d): qpn %u sq %u rq %u, caps wr %u inline %u",
	      err, c->qpr.qpn, c->qpr.sq_depth, c->qpr.rq_depth,
	      c->qpbase.max_send_wr, c->qpbase.max_inline_data);
	c->sq = map(c->fd, c->qpr.sq_key, c->qpr.sq_size);
	c->rq = map(c->fd, c->qpr.rq_key, c->qpr.rq_size);
	c->qp_status = map(c->fd, c->qpr.status_key, 4096);
	CHECK(c->sq && c->rq && c->qp_status, "mmap SQ, RQ and status page");
	if (c->qp_status) {
		qs = c->qp_status;
		CHECK(qs->state == VT3_QPS_IDLE && !(qs->flags & VT3_QP_F_ERROR),
		      "QP status page: state %u flags %#x", qs->state,
		      qs->flags);
	}
}

static void check(struct ctx *c)
{
	struct ib_uverbs_query_qp_resp qa;
	struct vt3_create_cq_resp cqr;
	struct vt3_qp_status *qs = c->qp_status;
	uint32_t h, lkey;
	int err;

	if (!c->qp_status || !c->cq_status) {
		printf("FAIL setup failed: no further checks\n");
		failures++;
		return;
	}
	/* Limits and bad arguments. */
	err = create_cq(c, 1u << 30, &h, &cqr);
	CHECK(err == -EINVAL, "CREATE_CQ 2^30 entries refused (%d)", err);
	err = create_cq(c, 0, &h, &cqr);
	CHECK(err == -EINVAL, "CREATE_CQ 0 entries refused (%d)", err);
	err = reg_mr(c, c->buf, 0, &h, &lkey);
	CHECK(err == -EINVAL, "REG_MR of 0 bytes refused (%d)", err);
	err = reg_mr(c, (void *)16, 4096, &h, &lkey);
	CHECK(err == -EFAULT, "REG_MR of unmapped memory refused (%d)", err);
	{
		uint32_t saved = c->qp;

		err = create_qp(c, 1u << 24, 1, &h);
		CHECK(err == -EINVAL, "CREATE_QP 2^24 WRs refused (%d)", err);
		err = create_qp(c, 8, VT3_MAX_SGE + 1, &h);
		CHECK(err == -EINVAL, "CREATE_QP %d SGEs refused (%d)",
		      VT3_MAX_SGE + 1, err);
		c->qp = saved;
	}
	CHECK(map(c->fd, c->cqr.ring_key, c->cqr.ring_size + 4096) == NULL,
	      "mmap larger than the CQ ring refused");
	CHECK(map(c->fd, 0x7000000, 4096) == NULL, "mmap of a bad key refused");

	/* QP states. */
	err = query_qp(c, &qa);
	/* A new QP is INIT (an RNIC's IDLE), as cxgb4 reports it. */
	CHECK(!err && qa.qp_state == QPS_INIT && qa.max_send_wr == 64,
	      "QUERY_QP (%d): state %u sq %u", err, qa.qp_state,
	      qa.max_send_wr);
	err = modify_qp(c, QPS_INIT);
	CHECK(!err, "INIT -> INIT (%d)", err);
	err = modify_qp(c, QPS_RTR);
	CHECK(!err, "INIT -> RTR (%d)", err);
	err = modify_qp(c, QPS_RTS);
	CHECK(err == -EINVAL, "RTR -> RTS refused without a connection (%d)",
	      err);
	err = modify_qp(c, QPS_SQD);
	CHECK(err == -EINVAL, "RTR -> SQD refused (%d)", err);
	err = modify_qp(c, QPS_ERR);
	CHECK(!err && qs->state == VT3_QPS_ERROR &&
	      (qs->flags & VT3_QP_F_ERROR) &&
	      (((struct vt3_cq_status *)c->cq_status)->flags & VT3_CQ_F_ERROR),
	      "RTR -> ERR (%d): status state %u flags %#x, CQ flags %#x",
	      err, qs->state, qs->flags,
	      ((struct vt3_cq_status *)c->cq_status)->flags);
	err = query_qp(c, &qa);
	CHECK(!err && qa.qp_state == QPS_ERR, "QUERY_QP: state %u",
	      qa.qp_state);
	err = modify_qp(c, QPS_RESET);
	CHECK(!err && qs->state == VT3_QPS_IDLE, "ERR -> RESET (%d): state %u",
	      err, qs->state);
	err = modify_qp(c, QPS_INIT);
	CHECK(!err, "RESET -> INIT (%d)", err);
	err = modify_qp(c, 42);
	CHECK(err == -EINVAL, "state 42 refused (%d)", err);

	/* Doorbells (zero-WR posts) and arming. */
	{
		struct ib_uverbs_post_send ps = {
			.qp_handle = c->qp,
			.wqe_size = sizeof(struct ib_uverbs_send_wr),
		};
		struct ib_uverbs_post_send_resp psr;
		struct ib_uverbs_req_notify_cq rn = { .cq_handle = c->cq };

		err = cmd(c->fd, IB_USER_VERBS_CMD_POST_SEND, &ps, sizeof(ps),
			  &psr, sizeof(psr));
		CHECK(!err, "SQ doorbell (%d)", err);
		err = cmd(c->fd, IB_USER_VERBS_CMD_POST_RECV, &ps, sizeof(ps),
			  &psr, sizeof(psr));
		CHECK(!err, "RQ doorbell (%d)", err);
		err = cmd(c->fd, IB_USER_VERBS_CMD_REQ_NOTIFY_CQ, &rn,
			  sizeof(rn), NULL, 0);
		CHECK(!err, "REQ_NOTIFY_CQ (%d)", err);
	}

	/* The PD is busy while the MR and QP live: destroy in order. */
	err = destroy(c->fd, IB_USER_VERBS_CMD_DESTROY_QP, c->qp);
	CHECK(!err, "DESTROY_QP (%d)", err);
	CHECK(qs->state == VT3_QPS_IDLE,
	      "a mapping outlives its QP (state %u)", qs->state);
	err = destroy(c->fd, IB_USER_VERBS_CMD_DESTROY_CQ, c->cq);
	CHECK(!err, "DESTROY_CQ (%d)", err);
	err = destroy(c->fd, IB_USER_VERBS_CMD_DEREG_MR, c->mr);
	CHECK(!err, "DEREG_MR (%d)", err);
	err = destroy(c->fd, IB_USER_VERBS_CMD_DEALLOC_PD, c->pd);
	CHECK(!err, "DEALLOC_PD (%d)", err);
}

/*
 * A CREATE_QP whose response page is read-only: vt3d creates the QP, the
 * driver's ib_copy_to_udata() fails, and the driver must destroy it again
 * before anyone (a device loss walking the QPs) could have found it.
 */
static void create_qp_efault(struct ctx *c)
{
	void *ro = mmap(NULL, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS,
			-1, 0);
	struct ib_uverbs_create_qp req;
	int err;

	create_qp_req(c, 16, 1, &req);
	CHECK(ro != MAP_FAILED, "a read-only page for the response");
	if (ro == MAP_FAILED)
		return;
	printf("creating\n");
	err = cmd(c->fd, IB_USER_VERBS_CMD_CREATE_QP, &req, sizeof(req), ro,
		  sizeof(struct create_qp_resp));
	CHECK(err == -EFAULT,
	      "CREATE_QP with an unwritable response (%d): EFAULT", err);
	sleep(3);
}

int main(int argc, char **argv)
{
	struct ctx c = {};
	const char *mode = argc > 1 ? argv[1] : "check";

	setvbuf(stdout, NULL, _IOLBF, 0);
	c.fd = open_vt3();
	if (c.fd < 0) {
		printf("FAIL no vt3 uverbs device\n");
		return 1;
	}
	create_all(&c);
	if (!strcmp(mode, "efault")) {
		create_qp_efault(&c);
		printf("%d failure(s)\n", failures);
		return failures ? 1 : 0;
	}
	if (!strcmp(mode, "hold")) {
		printf("holding\n");
		for (;;)
			pause();
	}
	check(&c);
	printf("%d failure(s)\n", failures);
	return failures ? 1 : 0;
}
