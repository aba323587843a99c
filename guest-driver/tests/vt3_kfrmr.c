// SPDX-License-Identifier: GPL-2.0
/*
 * vt3_kfrmr: fast registration (memory management extensions) as a kernel
 * ULP uses it, between two guests.
 *
 *   insmod vt3_kfrmr.ko server=1 [port=P]          the owner of the MRs
 *   insmod vt3_kfrmr.ko addr=SERVER_IP [port=P]    the peer
 *
 * The server owns fast-reg MRs (ib_alloc_mr, ib_map_mr_sg over three
 * separate pages, ib_update_fast_reg_key, IB_WR_REG_MR) and checks what
 * the peer's accesses do to them; the client is the peer. One connection
 * per scenario, the client naming it in its first message:
 *
 *  0  the client READs the server's MR into a fast-registered sink of its
 *     own, WRITEs it, and SEND_WITH_INVs it (the server's receive has
 *     IB_WC_WITH_INVALIDATE and the rkey); the server re-registers under
 *     a new key, the client WRITEs through it; LOCAL_INV on both sides;
 *     then the client WRITEs through the old rkey: the server's QP gets
 *     IB_EVENT_QP_ACCESS_ERR (TERMINATE) and nothing is placed.
 *  1  REG_MR then LOCAL_INV: the client's READ of it fails (ACCESS_ERR).
 *  2  SEND_WITH_INV of an ordinary MR (the PD's local_dma_lkey): the
 *     receive completes IB_WC_REM_INV_REQ_ERR, ACCESS_ERR.
 *  3  SEND_WITH_INV of a fast-reg MR of another PD: the same.
 *  4  REG_MR of a valid MR: IB_WC_LOC_QP_OP_ERR; a REG_MR and a LOCAL_INV
 *     posted after it are flushed (IB_WC_WR_FLUSH_ERR, their opcodes).
 *  5  the client's IB_WR_RDMA_READ_WITH_INV (what rdma_rw posts on iWARP,
 *     ex.invalidate_rkey naming the sink's previous key) into its fast-reg
 *     sink: the data is there and the sink invalid, so a second READ into
 *     it fails locally.
 *
 * The rules of 1-4 are the owner's (the device the server runs on). Each
 * side logs "vt3_kfrmr: <role>: N passed, N failed" (the server after
 * every connection, cumulative); unload the module afterwards.
 */
#include <linux/delay.h>
#include <linux/inet.h>
#include <linux/module.h>
#include <linux/scatterlist.h>
#include <linux/slab.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>

static bool server;
module_param(server, bool, 0444);
MODULE_PARM_DESC(server, "own the MRs and listen (1) or be the peer (0)");
static char *addr = "0.0.0.0";
module_param(addr, charp, 0444);
MODULE_PARM_DESC(addr, "server: address to listen on; client: the server's");
static ushort port = 7779;
module_param(port, ushort, 0444);
MODULE_PARM_DESC(port, "the server's port");

#define FR_PAGES	3
#define FR_LEN		(FR_PAGES * PAGE_SIZE)
#define FR_MAX_SG	8
#define FR_SCENARIOS	6
#define FR_TIMEOUT_MS	60000
#define FR_MAX_CONNS	8

static int passed, failed;

#define CHECK(cond, fmt, ...)						\
	({								\
		bool __ok = (cond);					\
		if (__ok)						\
			passed++;					\
		else							\
			failed++;					\
		pr_info("vt3_kfrmr: %s " fmt "\n", __ok ? "ok  " : "FAIL",\
			##__VA_ARGS__);					\
		__ok;							\
	})

enum fr_op { FR_HELLO = 1, FR_EXPOSE, FR_WRITTEN, FR_STALE };

struct fr_msg {
	u32 op;
	u32 scenario;
	u32 rkey;
	u32 len;
	u64 iova;
};

/* A work request's completion, reaped by polling the (direct) CQ. */
struct fr_wait {
	struct ib_cqe cqe;
	struct ib_wc wc;
	bool done;
};

struct fr_conn {
	struct rdma_cm_id *id;
	struct ib_pd *pd;
	struct ib_cq *cq;
	struct ib_qp *qp;
	struct fr_msg *msg;		/* [0] receive, [1] send */
	u64 msg_dma;
	struct page *pages[FR_PAGES];
	struct scatterlist sg[FR_PAGES];
	int nents;			/* mapped sg entries */
	struct ib_mr *mr;		/* fast-reg MR over pages[] */
	struct fr_wait recv, send, op;
	struct fr_msg in;		/* the last message received */
	struct ib_wc in_wc;		/* and its completion */
	/* rdma_cm and QP events. */
	struct completion cm_done;
	enum rdma_cm_event_type event;
	int status;
	struct completion disconnected;
	struct completion qp_event_done;
	enum ib_event_type qp_event;
	struct work_struct work;	/* server: the scenario */
};

static struct rdma_cm_id *listen_id;
static struct fr_conn *conns[FR_MAX_CONNS];
static DEFINE_MUTEX(conns_lock);

static void fr_done(struct ib_cq *cq, struct ib_wc *wc)
{
	struct fr_wait *w = container_of(wc->wr_cqe, struct fr_wait, cqe);

	w->wc = *wc;
	w->done = true;
}

static void fr_arm(struct fr_wait *w)
{
	memset(w, 0, sizeof(*w));
	w->cqe.done = fr_done;
}

/* Polls until @w completed; false on a timeout. */
static bool fr_wait_wc(struct fr_conn *c, struct fr_wait *w)
{
	unsigned long deadline = jiffies + msecs_to_jiffies(FR_TIMEOUT_MS);

	while (!w->done) {
		ib_process_cq_direct(c->cq, 16);
		if (w->done)
			break;
		if (time_after(jiffies, deadline))
			return false;
		usleep_range(500, 1000);
	}
	return true;
}

static bool fr_wait_ok(struct fr_conn *c, struct fr_wait *w,
		       enum ib_wc_opcode opcode)
{
	return fr_wait_wc(c, w) && w->wc.status == IB_WC_SUCCESS &&
	       w->wc.opcode == opcode;
}

static int fr_post_recv(struct fr_conn *c)
{
	struct ib_sge sge = {
		.addr = c->msg_dma,
		.length = sizeof(struct fr_msg),
		.lkey = c->pd->local_dma_lkey,
	};
	struct ib_recv_wr wr = {
		.wr_cqe = &c->recv.cqe,
		.sg_list = &sge,
		.num_sge = 1,
	};

	fr_arm(&c->recv);
	return ib_post_recv(c->qp, &wr, NULL);
}

/* Waits for the next message; reposts the receive. NULL on failure. */
static struct fr_msg *fr_recv(struct fr_conn *c, u32 op)
{
	if (!fr_wait_wc(c, &c->recv) || c->recv.wc.status != IB_WC_SUCCESS)
		return NULL;
	ib_dma_sync_single_for_cpu(c->id->device, c->msg_dma, sizeof(c->in),
				   DMA_FROM_DEVICE);
	c->in = c->msg[0];
	c->in_wc = c->recv.wc;		/* the repost clears c->recv */
	if (c->in.op != op || fr_post_recv(c))
		return NULL;
	return &c->in;
}

/* A SEND (or SEND_WITH_INV of @inv) of @m; waits for its completion. */
static bool fr_send(struct fr_conn *c, const struct fr_msg *m, u32 inv)
{
	struct ib_sge sge = {
		.addr = c->msg_dma + sizeof(*m),
		.length = sizeof(*m),
		.lkey = c->pd->local_dma_lkey,
	};
	struct ib_send_wr wr = {
		.wr_cqe = &c->send.cqe,
		.sg_list = &sge,
		.num_sge = 1,
		.opcode = inv ? IB_WR_SEND_WITH_INV : IB_WR_SEND,
		.send_flags = IB_SEND_SIGNALED,
		.ex.invalidate_rkey = inv,
	};

	c->msg[1] = *m;
	ib_dma_sync_single_for_device(c->id->device, wr.sg_list->addr,
				      sizeof(*m), DMA_TO_DEVICE);
	fr_arm(&c->send);
	return !ib_post_send(c->qp, &wr, NULL) &&
	       fr_wait_ok(c, &c->send, IB_WC_SEND);
}

/* Posts IB_WR_REG_MR of @mr under a rotated key (signaled, on c->op). */
static int fr_post_reg(struct fr_conn *c, struct ib_mr *mr, int access)
{
	struct ib_reg_wr wr = {
		.wr = {
			.wr_cqe = &c->op.cqe,
			.opcode = IB_WR_REG_MR,
			.send_flags = IB_SEND_SIGNALED,
		},
		.mr = mr,
		.access = access,
	};

	ib_update_fast_reg_key(mr, ib_inc_rkey(mr->rkey));
	wr.key = mr->rkey;
	fr_arm(&c->op);
	return ib_post_send(c->qp, &wr.wr, NULL);
}

/* ib_map_mr_sg over the pages, then REG_MR; true when it completed. */
static bool fr_register(struct fr_conn *c, struct ib_mr *mr, int access)
{
	int n = ib_map_mr_sg(mr, c->sg, c->nents, NULL, PAGE_SIZE);

	if (n != c->nents || mr->length != FR_LEN)
		return false;
	return !fr_post_reg(c, mr, access) &&
	       fr_wait_ok(c, &c->op, IB_WC_REG_MR);
}

static int fr_post_local_inv(struct fr_conn *c, u32 rkey)
{
	struct ib_send_wr wr = {
		.wr_cqe = &c->op.cqe,
		.opcode = IB_WR_LOCAL_INV,
		.send_flags = IB_SEND_SIGNALED,
		.ex.invalidate_rkey = rkey,
	};

	fr_arm(&c->op);
	return ib_post_send(c->qp, &wr, NULL);
}

/* An RDMA WRITE or READ of @len at (@local, @lkey) to/from the peer's rkey. */
static int fr_post_rdma(struct fr_conn *c, enum ib_wr_opcode opcode,
			u64 local, u32 lkey, u32 len, u32 rkey, u64 remote)
{
	struct ib_sge sge = {
		.addr = local,
		.length = len,
		.lkey = lkey,
	};
	struct ib_rdma_wr wr = {
		.wr = {
			.wr_cqe = &c->op.cqe,
			.sg_list = &sge,
			.num_sge = 1,
			.opcode = opcode,
			.send_flags = IB_SEND_SIGNALED,
		},
		.remote_addr = remote,
		.rkey = rkey,
	};

	fr_arm(&c->op);
	return ib_post_send(c->qp, &wr.wr, NULL);
}

/* Byte @i of pattern @seed. */
static u8 fr_pattern(u8 seed, size_t i)
{
	return (u8)(i * 131 + seed + i / PAGE_SIZE);
}

/* Syncs the mapped pages for the device (@cpu false) or the CPU. */
static void fr_sync(struct fr_conn *c, bool cpu)
{
	struct scatterlist *sg;
	int i;

	for_each_sg(c->sg, sg, c->nents, i) {
		if (cpu)
			ib_dma_sync_single_for_cpu(c->id->device,
						   sg_dma_address(sg),
						   sg_dma_len(sg),
						   DMA_BIDIRECTIONAL);
		else
			ib_dma_sync_single_for_device(c->id->device,
						      sg_dma_address(sg),
						      sg_dma_len(sg),
						      DMA_BIDIRECTIONAL);
	}
}

static void fr_fill(struct fr_conn *c, u8 seed, size_t from, size_t len)
{
	size_t i;

	for (i = from; i < from + len; i++)
		((u8 *)page_address(c->pages[i / PAGE_SIZE]))[i % PAGE_SIZE] =
			fr_pattern(seed, i);
	fr_sync(c, false);
}

static bool fr_holds(struct fr_conn *c, u8 seed, size_t from, size_t len)
{
	size_t i;

	fr_sync(c, true);
	for (i = from; i < from + len; i++)
		if (((u8 *)page_address(c->pages[i / PAGE_SIZE]))[i % PAGE_SIZE] !=
		    fr_pattern(seed, i))
			return false;
	return true;
}

static bool fr_wait_qp_event(struct fr_conn *c, enum ib_event_type want)
{
	if (!wait_for_completion_timeout(&c->qp_event_done,
					 msecs_to_jiffies(FR_TIMEOUT_MS)))
		return false;
	return c->qp_event == want;
}

static void fr_qp_event(struct ib_event *event, void *context)
{
	struct fr_conn *c = context;

	pr_info("vt3_kfrmr: QP event %s (%d)\n", ib_event_msg(event->event),
		event->event);
	if (!completion_done(&c->qp_event_done)) {
		c->qp_event = event->event;
		complete(&c->qp_event_done);
	}
}

static void fr_server_work(struct work_struct *work);

static struct fr_conn *fr_alloc(void)
{
	struct fr_conn *c = kzalloc(sizeof(*c), GFP_KERNEL);

	if (!c)
		return NULL;
	init_completion(&c->cm_done);
	init_completion(&c->disconnected);
	init_completion(&c->qp_event_done);
	INIT_WORK(&c->work, fr_server_work);
	return c;
}

/* PD, direct CQ, QP, message buffers, three pages and a fast-reg MR. */
static int fr_setup(struct fr_conn *c)
{
	struct ib_device *dev = c->id->device;
	struct ib_qp_init_attr attr = {
		.qp_type = IB_QPT_RC,
		.sq_sig_type = IB_SIGNAL_REQ_WR,
		.event_handler = fr_qp_event,
		.qp_context = c,
		.cap = {
			.max_send_wr = 16,
			.max_recv_wr = 4,
			.max_send_sge = 1,
			.max_recv_sge = 1,
		},
	};
	int i, err;

	c->pd = ib_alloc_pd(dev, 0);
	if (IS_ERR(c->pd)) {
		err = PTR_ERR(c->pd);
		c->pd = NULL;
		return err;
	}
	c->cq = ib_alloc_cq(dev, c, 32, 0, IB_POLL_DIRECT);
	if (IS_ERR(c->cq)) {
		err = PTR_ERR(c->cq);
		c->cq = NULL;
		return err;
	}
	c->msg = kzalloc(2 * sizeof(*c->msg), GFP_KERNEL);
	if (!c->msg)
		return -ENOMEM;
	c->msg_dma = ib_dma_map_single(dev, c->msg, 2 * sizeof(*c->msg),
				       DMA_BIDIRECTIONAL);
	if (ib_dma_mapping_error(dev, c->msg_dma)) {
		kfree(c->msg);
		c->msg = NULL;
		return -ENOMEM;
	}
	/* Separate pages: the MR's page list has several entries. */
	sg_init_table(c->sg, FR_PAGES);
	for (i = 0; i < FR_PAGES; i++) {
		c->pages[i] = alloc_page(GFP_KERNEL | __GFP_ZERO);
		if (!c->pages[i])
			return -ENOMEM;
		sg_set_page(&c->sg[i], c->pages[i], PAGE_SIZE, 0);
	}
	c->nents = ib_dma_map_sg(dev, c->sg, FR_PAGES, DMA_BIDIRECTIONAL);
	if (!c->nents)
		return -ENOMEM;
	c->mr = ib_alloc_mr(c->pd, IB_MR_TYPE_MEM_REG, FR_MAX_SG);
	if (IS_ERR(c->mr)) {
		err = PTR_ERR(c->mr);
		c->mr = NULL;
		return err;
	}
	attr.send_cq = c->cq;
	attr.recv_cq = c->cq;
	err = rdma_create_qp(c->id, c->pd, &attr);
	if (err)
		return err;
	c->qp = c->id->qp;
	return fr_post_recv(c);
}

/* Everything but the id: drained first, so no completion is left. */
static void fr_teardown(struct fr_conn *c)
{
	struct ib_device *dev = c->id->device;
	int i;

	if (c->qp) {
		ib_drain_qp(c->qp);
		rdma_destroy_qp(c->id);
	}
	c->qp = NULL;
	if (c->mr)
		ib_dereg_mr(c->mr);
	c->mr = NULL;
	if (c->nents)
		ib_dma_unmap_sg(dev, c->sg, FR_PAGES, DMA_BIDIRECTIONAL);
	c->nents = 0;
	for (i = 0; i < FR_PAGES; i++) {
		if (c->pages[i])
			__free_page(c->pages[i]);
		c->pages[i] = NULL;
	}
	if (c->msg) {
		ib_dma_unmap_single(dev, c->msg_dma, 2 * sizeof(*c->msg),
				    DMA_BIDIRECTIONAL);
		kfree(c->msg);
	}
	c->msg = NULL;
	if (c->cq)
		ib_free_cq(c->cq);
	c->cq = NULL;
	if (c->pd)
		ib_dealloc_pd(c->pd);
	c->pd = NULL;
}

static bool fr_wait_disconnected(struct fr_conn *c)
{
	return wait_for_completion_timeout(&c->disconnected,
					   msecs_to_jiffies(FR_TIMEOUT_MS));
}

#define ALL_ACCESS (IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_READ | \
		    IB_ACCESS_REMOTE_WRITE)

/* ------------------------------------------------------------ server */

static void fr_expose(struct fr_conn *c, u32 scenario, u32 rkey, u64 iova)
{
	struct fr_msg m = {
		.op = FR_EXPOSE, .scenario = scenario, .rkey = rkey,
		.len = FR_LEN, .iova = iova,
	};

	if (!fr_send(c, &m, 0))
		CHECK(false, "server: scenario %u: EXPOSE sent", scenario);
}

static void fr_server_positive(struct fr_conn *c)
{
	struct fr_msg stale = { .op = FR_STALE };
	struct fr_msg *m;
	u32 first;
	int n;

	n = ib_map_mr_sg(c->mr, c->sg, c->nents, NULL, PAGE_SIZE);
	CHECK(n == c->nents && c->mr->length == FR_LEN && c->mr->iova,
	      "server: ib_map_mr_sg mapped %d of %d entries, %llu octets",
	      n, c->nents, c->mr->length);
	fr_fill(c, 0xa1, 0, FR_LEN);
	CHECK(!fr_post_reg(c, c->mr, ALL_ACCESS) &&
	      fr_wait_ok(c, &c->op, IB_WC_REG_MR),
	      "server: IB_WR_REG_MR completes IB_WC_REG_MR (status %d)",
	      c->op.wc.status);
	first = c->mr->rkey;
	fr_expose(c, 0, first, c->mr->iova);

	/* The client READs, WRITEs, then SEND_WITH_INVs our rkey. */
	m = fr_recv(c, FR_WRITTEN);
	CHECK(m && c->in_wc.wc_flags & IB_WC_WITH_INVALIDATE &&
	      c->in_wc.ex.invalidate_rkey == first,
	      "server: the receive says IB_WC_WITH_INVALIDATE of %#x", first);
	CHECK(fr_holds(c, 0xb2, 0, FR_LEN),
	      "server: the client's WRITE placed through the page list");

	/* Re-registered under a new key; the client WRITEs through it. */
	CHECK(fr_register(c, c->mr, ALL_ACCESS) && c->mr->rkey != first &&
	      (c->mr->rkey & ~0xffu) == (first & ~0xffu),
	      "server: re-registered under key %#x (was %#x)", c->mr->rkey,
	      first);
	fr_expose(c, 0, c->mr->rkey, c->mr->iova);
	m = fr_recv(c, FR_WRITTEN);
	CHECK(m && fr_holds(c, 0xc3, 100, 64) && fr_holds(c, 0xb2, 0, 100),
	      "server: WRITE through the new key placed");
	CHECK(!fr_post_local_inv(c, c->mr->rkey) &&
	      fr_wait_ok(c, &c->op, IB_WC_LOCAL_INV),
	      "server: IB_WR_LOCAL_INV completes IB_WC_LOCAL_INV (status %d)",
	      c->op.wc.status);

	/* The old key, invalidated by the peer and rotated since. */
	stale.rkey = first;
	stale.iova = c->mr->iova;
	if (!fr_send(c, &stale, 0))
		CHECK(false, "server: STALE sent");
	CHECK(fr_wait_qp_event(c, IB_EVENT_QP_ACCESS_ERR),
	      "server: the WRITE through the old rkey: IB_EVENT_QP_ACCESS_ERR (%d)",
	      c->qp_event);
	CHECK(fr_holds(c, 0xb2, 0, 100), "server: nothing placed through it");
}

static void fr_server_scenario(struct fr_conn *c, u32 scenario)
{
	struct ib_pd *pd2;
	struct ib_mr *mr2;

	switch (scenario) {
	case 0:
		fr_server_positive(c);
		break;
	case 1:
		CHECK(fr_register(c, c->mr, ALL_ACCESS),
		      "server: 1: registered");
		CHECK(!fr_post_local_inv(c, c->mr->rkey) &&
		      fr_wait_ok(c, &c->op, IB_WC_LOCAL_INV),
		      "server: 1: LOCAL_INV");
		fr_expose(c, 1, c->mr->rkey, c->mr->iova);
		CHECK(fr_wait_qp_event(c, IB_EVENT_QP_ACCESS_ERR),
		      "server: 1: READ after LOCAL_INV: IB_EVENT_QP_ACCESS_ERR (%d)",
		      c->qp_event);
		break;
	case 2:
	case 3:
		pd2 = NULL;
		mr2 = NULL;
		if (scenario == 3) {
			pd2 = ib_alloc_pd(c->id->device, 0);
			mr2 = IS_ERR(pd2) ? ERR_CAST(pd2) :
			      ib_alloc_mr(pd2, IB_MR_TYPE_MEM_REG, FR_MAX_SG);
		}
		if (IS_ERR(mr2)) {
			CHECK(false, "server: 3: a fast-reg MR of another PD");
		} else {
			fr_expose(c, scenario,
				  mr2 ? mr2->rkey : c->pd->local_dma_lkey, 0);
			CHECK(fr_wait_wc(c, &c->recv) &&
			      c->recv.wc.status == IB_WC_REM_INV_REQ_ERR &&
			      !(c->recv.wc.wc_flags & IB_WC_WITH_INVALIDATE),
			      "server: %u: SEND_WITH_INV of %s: IB_WC_REM_INV_REQ_ERR (%d)",
			      scenario, mr2 ? "another PD's MR" : "an ordinary MR",
			      c->recv.wc.status);
			CHECK(fr_wait_qp_event(c, IB_EVENT_QP_ACCESS_ERR),
			      "server: %u: IB_EVENT_QP_ACCESS_ERR (%d)", scenario,
			      c->qp_event);
		}
		if (!IS_ERR_OR_NULL(mr2))
			ib_dereg_mr(mr2);
		if (!IS_ERR_OR_NULL(pd2))
			ib_dealloc_pd(pd2);
		break;
	case 5:
		fr_fill(c, 0xe5, 0, FR_LEN);
		CHECK(fr_register(c, c->mr, ALL_ACCESS),
		      "server: 5: registered");
		fr_expose(c, 5, c->mr->rkey, c->mr->iova);
		break;
	case 4:
		CHECK(fr_register(c, c->mr, ALL_ACCESS),
		      "server: 4: registered");
		/* Valid still: refused, the QP in error. */
		CHECK(!fr_post_reg(c, c->mr, ALL_ACCESS) && fr_wait_wc(c, &c->op) &&
		      c->op.wc.status == IB_WC_LOC_QP_OP_ERR &&
		      c->op.wc.opcode == IB_WC_REG_MR,
		      "server: 4: REG_MR of a valid MR: IB_WC_LOC_QP_OP_ERR (%d)",
		      c->op.wc.status);
		/* Posted in error: flushed, with their own opcodes. */
		CHECK(!fr_post_reg(c, c->mr, ALL_ACCESS) && fr_wait_wc(c, &c->op) &&
		      c->op.wc.status == IB_WC_WR_FLUSH_ERR &&
		      c->op.wc.opcode == IB_WC_REG_MR,
		      "server: 4: REG_MR in error flushed (%d, opcode %d)",
		      c->op.wc.status, c->op.wc.opcode);
		CHECK(!fr_post_local_inv(c, c->mr->rkey) && fr_wait_wc(c, &c->op) &&
		      c->op.wc.status == IB_WC_WR_FLUSH_ERR &&
		      c->op.wc.opcode == IB_WC_LOCAL_INV,
		      "server: 4: LOCAL_INV in error flushed (%d, opcode %d)",
		      c->op.wc.status, c->op.wc.opcode);
		break;
	}
}

static void fr_server_work(struct work_struct *work)
{
	struct fr_conn *c = container_of(work, struct fr_conn, work);
	struct fr_msg *m = fr_recv(c, FR_HELLO);

	if (m && m->scenario < FR_SCENARIOS)
		fr_server_scenario(c, m->scenario);
	else
		CHECK(false, "server: the client's HELLO");
	/* Every scenario ends the connection: the error's, or the client's. */
	if (!fr_wait_disconnected(c))
		CHECK(false, "server: DISCONNECTED in time");
	fr_teardown(c);
	pr_info("vt3_kfrmr: server: %d passed, %d failed\n", passed, failed);
}

static int fr_handler(struct rdma_cm_id *id, struct rdma_cm_event *event);

static int fr_server_request(struct rdma_cm_id *id)
{
	struct rdma_conn_param param = {
		.responder_resources = 1,
		.initiator_depth = 1,
	};
	struct fr_conn *c;
	int i, err;

	c = fr_alloc();
	if (!c)
		return -ENOMEM;
	c->id = id;
	id->context = c;
	mutex_lock(&conns_lock);
	for (i = 0; i < FR_MAX_CONNS && conns[i]; i++)
		;
	if (i < FR_MAX_CONNS)
		conns[i] = c;
	mutex_unlock(&conns_lock);
	err = i < FR_MAX_CONNS ? fr_setup(c) : -EBUSY;
	if (!err)
		err = rdma_accept(id, &param);
	if (err) {
		CHECK(false, "server: accept (%d)", err);
		fr_teardown(c);
		mutex_lock(&conns_lock);
		if (i < FR_MAX_CONNS)
			conns[i] = NULL;
		mutex_unlock(&conns_lock);
		kfree(c);
		return err;	/* rdma_cm destroys the id */
	}
	return 0;
}

static int fr_handler(struct rdma_cm_id *id, struct rdma_cm_event *event)
{
	struct fr_conn *c = id->context;

	pr_info("vt3_kfrmr: event %s (%d)\n", rdma_event_msg(event->event),
		event->status);
	if (server && event->event == RDMA_CM_EVENT_CONNECT_REQUEST)
		return fr_server_request(id);
	if (!c)
		return 0;
	c->event = event->event;
	c->status = event->status;
	if (event->event == RDMA_CM_EVENT_ESTABLISHED && server)
		queue_work(system_long_wq, &c->work);
	if (event->event == RDMA_CM_EVENT_DISCONNECTED)
		complete(&c->disconnected);
	complete(&c->cm_done);
	return 0;
}

/* ------------------------------------------------------------ client */

static bool fr_wait_cm(struct fr_conn *c, enum rdma_cm_event_type want)
{
	if (!wait_for_completion_timeout(&c->cm_done,
					 msecs_to_jiffies(FR_TIMEOUT_MS)))
		return false;
	reinit_completion(&c->cm_done);
	return c->event == want;
}

/* The client's part of scenario 0; the MR is its READ sink. */
static void fr_client_positive(struct fr_conn *c, struct fr_msg *m)
{
	struct fr_msg done = { .op = FR_WRITTEN };
	u32 rkey = m->rkey;
	u64 iova = m->iova;

	/* iWARP: the sink of a READ is a registered STag (remote write). */
	CHECK(fr_register(c, c->mr, IB_ACCESS_LOCAL_WRITE |
			  IB_ACCESS_REMOTE_WRITE),
	      "client: its READ sink fast-registered");
	CHECK(!fr_post_rdma(c, IB_WR_RDMA_READ, c->mr->iova, c->mr->lkey,
			    FR_LEN, rkey, iova) &&
	      fr_wait_ok(c, &c->op, IB_WC_RDMA_READ),
	      "client: READ through the server's STag %#x (status %d)", rkey,
	      c->op.wc.status);
	CHECK(fr_holds(c, 0xa1, 0, FR_LEN),
	      "client: READ data placed through its own fast-reg sink");
	fr_fill(c, 0xb2, 0, FR_LEN);
	CHECK(!fr_post_rdma(c, IB_WR_RDMA_WRITE, c->mr->iova, c->mr->lkey,
			    FR_LEN, rkey, iova) &&
	      fr_wait_ok(c, &c->op, IB_WC_RDMA_WRITE),
	      "client: WRITE through it (status %d)", c->op.wc.status);
	CHECK(fr_send(c, &done, rkey), "client: SEND_WITH_INV of %#x", rkey);
	m = fr_recv(c, FR_EXPOSE);
	CHECK(m && m->rkey != rkey, "client: a new rkey %#x", m ? m->rkey : 0);
	if (!m)
		return;
	fr_fill(c, 0xc3, 100, 64);
	CHECK(!fr_post_rdma(c, IB_WR_RDMA_WRITE, c->mr->iova + 100, c->mr->lkey,
			    64, m->rkey, m->iova + 100) &&
	      fr_wait_ok(c, &c->op, IB_WC_RDMA_WRITE) && fr_send(c, &done, 0),
	      "client: WRITE through the new rkey");
	CHECK(!fr_post_local_inv(c, c->mr->rkey) &&
	      fr_wait_ok(c, &c->op, IB_WC_LOCAL_INV),
	      "client: LOCAL_INV of its sink");
	m = fr_recv(c, FR_STALE);
	if (m) {
		/*
		 * From our pages by DMA address (the sink MR is invalid now);
		 * whatever its local completion, the server refuses it.
		 */
		fr_fill(c, 0xd4, 0, 64);
		if (!fr_post_rdma(c, IB_WR_RDMA_WRITE, sg_dma_address(&c->sg[0]),
				  c->pd->local_dma_lkey, 64, m->rkey, m->iova))
			fr_wait_wc(c, &c->op);
	}
}

/* Scenario 5: READ_WITH_INV of the sink, which is invalid afterwards. */
static void fr_client_read_inv(struct fr_conn *c, struct fr_msg *m)
{
	struct ib_sge sge;
	struct ib_rdma_wr wr = {
		.wr = {
			.wr_cqe = &c->op.cqe,
			.sg_list = &sge,
			.num_sge = 1,
			.opcode = IB_WR_RDMA_READ_WITH_INV,
			.send_flags = IB_SEND_SIGNALED,
		},
		.remote_addr = m->iova,
		.rkey = m->rkey,
	};

	/*
	 * As rdma_rw posts it: ex.invalidate_rkey is filled in before the
	 * registration rotates the key, so it is the previous one; what is
	 * invalidated is the sink SGE's STag (siw and iw_cxgb4 alike).
	 */
	wr.wr.ex.invalidate_rkey = c->mr->lkey;
	CHECK(fr_register(c, c->mr, IB_ACCESS_LOCAL_WRITE |
			  IB_ACCESS_REMOTE_WRITE),
	      "client: 5: its READ sink fast-registered");
	sge.addr = c->mr->iova;
	sge.length = FR_LEN;
	sge.lkey = c->mr->lkey;
	fr_arm(&c->op);
	CHECK(!ib_post_send(c->qp, &wr.wr, NULL) &&
	      fr_wait_ok(c, &c->op, IB_WC_RDMA_READ),
	      "client: 5: IB_WR_RDMA_READ_WITH_INV completes (status %d)",
	      c->op.wc.status);
	CHECK(fr_holds(c, 0xe5, 0, FR_LEN), "client: 5: its data placed");
	CHECK(!fr_post_rdma(c, IB_WR_RDMA_READ, c->mr->iova, c->mr->lkey, 64,
			    m->rkey, m->iova) && fr_wait_wc(c, &c->op) &&
	      c->op.wc.status != IB_WC_SUCCESS,
	      "client: 5: the sink was invalidated: a READ into it fails (%d)",
	      c->op.wc.status);
	/* A local error: whether the device ends the connection or not. */
	rdma_disconnect(c->id);
}

static void fr_client_scenario(struct fr_conn *c, u32 scenario)
{
	struct fr_msg hello = { .op = FR_HELLO, .scenario = scenario };
	struct fr_msg *m;

	if (!fr_send(c, &hello, 0)) {
		CHECK(false, "client: %u: HELLO sent", scenario);
		return;
	}
	/* 4 is the server's alone: it exposes nothing. */
	m = scenario == 4 ? NULL : fr_recv(c, FR_EXPOSE);
	if (scenario != 4 && !m) {
		CHECK(false, "client: %u: EXPOSE received", scenario);
		return;
	}
	switch (scenario) {
	case 0:
		fr_client_positive(c, m);
		break;
	case 1:
		/* A READ into pages of our own (a local DMA address). */
		CHECK(!fr_post_rdma(c, IB_WR_RDMA_READ, sg_dma_address(&c->sg[0]),
				    c->pd->local_dma_lkey, 64, m->rkey, m->iova) &&
		      fr_wait_wc(c, &c->op) &&
		      c->op.wc.status != IB_WC_SUCCESS,
		      "client: 1: READ of an invalidated STag fails (%d)",
		      c->op.wc.status);
		break;
	case 2:
	case 3:
		fr_send(c, &hello, m->rkey);
		break;
	case 5:
		fr_client_read_inv(c, m);
		break;
	}
	CHECK(fr_wait_disconnected(c), "client: %u: the server ended it",
	      scenario);
}

static void fr_client(void)
{
	struct sockaddr_in dst = { .sin_family = AF_INET };
	struct rdma_conn_param param = {
		.responder_resources = 1,
		.initiator_depth = 1,
	};
	struct fr_conn *c;
	u32 scenario;

	if (!in4_pton(addr, -1, (u8 *)&dst.sin_addr.s_addr, -1, NULL)) {
		CHECK(false, "client: address %s", addr);
		return;
	}
	dst.sin_port = htons(port);
	for (scenario = 0; scenario < FR_SCENARIOS; scenario++) {
		c = fr_alloc();
		if (!c)
			break;
		c->id = rdma_create_id(&init_net, fr_handler, c, RDMA_PS_TCP,
				       IB_QPT_RC);
		if (IS_ERR(c->id)) {
			kfree(c);
			break;
		}
		if (rdma_resolve_addr(c->id, NULL, (struct sockaddr *)&dst,
				      5000) ||
		    !fr_wait_cm(c, RDMA_CM_EVENT_ADDR_RESOLVED) ||
		    rdma_resolve_route(c->id, 5000) ||
		    !fr_wait_cm(c, RDMA_CM_EVENT_ROUTE_RESOLVED) ||
		    fr_setup(c) || rdma_connect(c->id, &param) ||
		    !fr_wait_cm(c, RDMA_CM_EVENT_ESTABLISHED)) {
			CHECK(false, "client: %u: connected (event %d)",
			      scenario, c->event);
		} else {
			fr_client_scenario(c, scenario);
		}
		fr_teardown(c);
		rdma_destroy_id(c->id);
		kfree(c);
	}
	pr_info("vt3_kfrmr: client: %d passed, %d failed\n", passed, failed);
}

static int fr_server(void)
{
	struct sockaddr_in src = {
		.sin_family = AF_INET,
		.sin_port = htons(port),
	};
	int err;

	if (!in4_pton(addr, -1, (u8 *)&src.sin_addr.s_addr, -1, NULL))
		return -EINVAL;
	listen_id = rdma_create_id(&init_net, fr_handler, NULL, RDMA_PS_TCP,
				   IB_QPT_RC);
	if (IS_ERR(listen_id))
		return PTR_ERR(listen_id);
	err = rdma_bind_addr(listen_id, (struct sockaddr *)&src);
	if (!err)
		err = rdma_listen(listen_id, 4);
	if (err)
		rdma_destroy_id(listen_id);
	return err;
}

static int __init fr_init(void)
{
	if (server)
		return fr_server();
	fr_client();
	return 0;
}

static void __exit fr_exit(void)
{
	int i;

	if (!server)
		return;
	rdma_destroy_id(listen_id);
	for (i = 0; i < FR_MAX_CONNS; i++) {
		struct fr_conn *c = conns[i];

		if (!c)
			continue;
		if (!completion_done(&c->disconnected))
			rdma_disconnect(c->id);
		complete(&c->disconnected);
		flush_work(&c->work);
		fr_teardown(c);
		rdma_destroy_id(c->id);
		kfree(c);
	}
}

module_init(fr_init);
module_exit(fr_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("vt3.ko fast registration test (kernel ULP)");
