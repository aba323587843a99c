// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
/*
 * vt3-rereg: ibv_rereg_mr on vt3 (docs/rereg-mr.md). Two RC QPs
 * of one device paired by ibv_modify_qp (docs/modify-connect.md), each in
 * a user context of its own: a WRITEs into b's MR, b re-registers it.
 *
 *   vt3-rereg [--dev NAME] [--timeout S]
 *
 * Checks, in order:
 *  write        a's WRITE lands in b's first buffer
 *  rereg-trans  IBV_REREG_MR_CHANGE_TRANSLATION to a second buffer: 0,
 *               lkey and rkey unchanged
 *  new-range    a's WRITE through the same rkey at the new address lands
 *               in the second buffer; the first keeps what it had
 *  old-range    a's WRITE at the old address: both QPs get
 *               IBV_EVENT_QP_ACCESS_ERR (b sent a TERMINATE), neither
 *               buffer changes
 *  rereg-access IBV_REREG_MR_CHANGE_ACCESS to LOCAL_WRITE only: 0
 *  narrowed     (fresh QPs) a's WRITE is refused the same way, nothing
 *               changes
 *  rereg-pd     IBV_REREG_MR_CHANGE_PD | _ACCESS (rights back, another PD): 0
 *  other-pd     (fresh QPs) a's WRITE is refused the same way
 *  pd-back      the MR back in its PD (fresh QPs): a's WRITE lands
 *  busy         an MR with a type 1 window bound to it: ibv_rereg_mr
 *               fails with errno EBUSY (IBV_REREG_MR_ERR_CMD)
 *  unbound      once the window is deallocated, the same rereg succeeds
 * One line per check ("ok   NAME" / "FAIL NAME: why"), then
 * "vt3-rereg: N passed, N failed"; exit 1 on a failure.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#define VT3_CHECK_PROG "vt3-rereg"
#include "vt3-check.h"
#include "vt3-modify-pair.h"

#define BUF_SIZE	SIDE_BUF_SIZE
#define LEN		4096
#define REMOTE_RW	(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | \
			 IBV_ACCESS_REMOTE_READ)

/* Both QPs destroyed (if any) and made again, paired. */
static void fresh_pair(struct side *a, struct side *b)
{
	if (a->qp)
		ibv_destroy_qp(a->qp);
	if (b->qp)
		ibv_destroy_qp(b->qp);
	side_qp(a);
	side_qp(b);
	if (to_init(a->qp) || to_init(b->qp) ||
	    to_rtr(a->qp, b->qp->qp_num, NULL) || to_rts(a->qp) ||
	    to_rtr(b->qp, a->qp->qp_num, NULL) || to_rts(b->qp))
		die("pair");
}

static void fill(char *p, char seed)
{
	int i;

	for (i = 0; i < LEN; i++)
		p[i] = (char)(i * 7 + seed);
}

/* a WRITEs LEN bytes of pattern @seed to @to through @rkey; 0 or errno. */
static int write_to(struct side *a, char seed, void *to, uint32_t rkey)
{
	struct ibv_sge sge = { .addr = (uintptr_t)a->buf, .length = LEN,
			       .lkey = a->mr->lkey };
	struct ibv_send_wr wr = { .wr_id = (uint8_t)seed, .sg_list = &sge,
				  .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;

	fill(a->buf, seed);
	wr.wr.rdma.remote_addr = (uintptr_t)to;
	wr.wr.rdma.rkey = rkey;
	return ibv_post_send(a->qp, &wr, &bad);
}

/* The WRITE of @seed completed successfully and @to holds its pattern. */
static void landed(struct side *a, char seed, const char *to,
		   const char *name)
{
	char want[LEN];
	struct ibv_wc wc;

	fill(want, seed);
	if (!poll_one(a->cq, &wc, timeout_s * 1000)) {
		check(false, name, "no completion of the WRITE in %d s",
		      timeout_s);
		return;
	}
	check(wc.status == IBV_WC_SUCCESS && !memcmp(to, want, LEN), name,
	      "WRITE %s, target %s", ibv_wc_status_str(wc.status),
	      memcmp(to, want, LEN) ? "differs" : "intact");
}

/*
 * a's WRITE was refused by b: QP_ACCESS_ERR once on each side, and
 * neither of b's buffers changed from @buf1/@buf2.
 */
static void refused(struct side *a, struct side *b, const char *buf1,
		    const char *buf2, const char *saved1, const char *saved2,
		    const char *name)
{
	int eb = qp_events(b, IBV_EVENT_QP_ACCESS_ERR, timeout_s * 1000);
	int ea = qp_events(a, IBV_EVENT_QP_ACCESS_ERR, timeout_s * 1000);
	bool same = !memcmp(buf1, saved1, BUF_SIZE) &&
		    !memcmp(buf2, saved2, BUF_SIZE);

	check(eb == 1 && ea == 1 && same, name,
	      "QP_ACCESS_ERR %d at b, %d at a (want 1, 1); b's memory %s",
	      eb, ea, same ? "unchanged" : "CHANGED");
}

static int rereg(struct ibv_mr *mr, int flags, struct ibv_pd *pd, void *addr,
		 size_t len, int access)
{
	int rc;

	errno = 0;
	rc = ibv_rereg_mr(mr, flags, pd, addr, len, access);
	return rc ? (errno ? errno : -rc) : 0;
}

int main(int argc, char **argv)
{
	static char saved1[BUF_SIZE], saved2[BUF_SIZE];
	struct side a = {}, b = {};
	uint32_t lkey, rkey;
	struct ibv_pd *pd2;
	struct ibv_mr *mr2;
	struct ibv_mw *mw;
	char *buf1, *buf2;
	struct ibv_wc wc;
	int rc;

	pair_options(argc, argv);
	side_open(&a);
	side_open(&b);
	buf1 = b.buf;
	buf2 = page_buffer();
	fresh_pair(&a, &b);

	if (write_to(&a, 1, buf1, b.mr->rkey))
		die("post WRITE");
	landed(&a, 1, buf1, "write");

	lkey = b.mr->lkey;
	rkey = b.mr->rkey;
	rc = rereg(b.mr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, buf2, BUF_SIZE, 0);
	check(!rc && b.mr->lkey == lkey && b.mr->rkey == rkey, "rereg-trans",
	      "ibv_rereg_mr: %d (%s), keys %#x/%#x were %#x/%#x", rc,
	      strerror(rc), b.mr->lkey, b.mr->rkey, lkey, rkey);
	memcpy(saved1, buf1, BUF_SIZE);
	if (write_to(&a, 2, buf2, rkey))
		die("post WRITE");
	landed(&a, 2, buf2, "new-range");
	check(!memcmp(buf1, saved1, BUF_SIZE), "new-range",
	      "the old buffer changed");

	memcpy(saved2, buf2, BUF_SIZE);
	if (write_to(&a, 3, buf1, rkey))
		die("post WRITE");
	refused(&a, &b, buf1, buf2, saved1, saved2, "old-range");

	rc = rereg(b.mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
		   IBV_ACCESS_LOCAL_WRITE);
	check(!rc, "rereg-access", "ibv_rereg_mr: %d (%s)", rc, strerror(rc));
	fresh_pair(&a, &b);
	if (write_to(&a, 4, buf2, rkey))
		die("post WRITE");
	refused(&a, &b, buf1, buf2, saved1, saved2, "narrowed");

	pd2 = ibv_alloc_pd(b.ctx);
	if (!pd2)
		die("second PD");
	rc = rereg(b.mr, IBV_REREG_MR_CHANGE_PD | IBV_REREG_MR_CHANGE_ACCESS,
		   pd2, NULL, 0, REMOTE_RW);
	check(!rc, "rereg-pd", "ibv_rereg_mr: %d (%s)", rc, strerror(rc));
	fresh_pair(&a, &b);
	if (write_to(&a, 5, buf2, rkey))
		die("post WRITE");
	refused(&a, &b, buf1, buf2, saved1, saved2, "other-pd");

	rc = rereg(b.mr, IBV_REREG_MR_CHANGE_PD, b.pd, NULL, 0, 0);
	fresh_pair(&a, &b);
	if (rc || write_to(&a, 6, buf2, rkey))
		check(false, "pd-back", "ibv_rereg_mr: %d (%s)", rc,
		      strerror(rc));
	else
		landed(&a, 6, buf2, "pd-back");

	/* A type 1 window over part of a second MR of b, bound on b's QP. */
	mr2 = ibv_reg_mr(b.pd, buf1, BUF_SIZE,
			 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	mw = mr2 ? ibv_alloc_mw(b.pd, IBV_MW_TYPE_1) : NULL;
	if (!mw)
		die("MR with MW_BIND, window");
	{
		struct ibv_mw_bind bind = {
			.wr_id = 7, .send_flags = IBV_SEND_SIGNALED,
			.bind_info = { .mr = mr2, .addr = (uintptr_t)buf1,
				       .length = 256,
				       .mw_access_flags = IBV_ACCESS_REMOTE_WRITE },
		};

		if (ibv_bind_mw(b.qp, mw, &bind) ||
		    !poll_one(b.cq, &wc, timeout_s * 1000) ||
		    wc.status != IBV_WC_SUCCESS)
			die("bind the window");
	}
	rc = rereg(mr2, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
		   IBV_ACCESS_LOCAL_WRITE);
	check(rc == EBUSY, "busy", "ibv_rereg_mr: %d (%s), want EBUSY", rc,
	      strerror(rc));
	if (ibv_dealloc_mw(mw))
		die("ibv_dealloc_mw");
	rc = rereg(mr2, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
		   IBV_ACCESS_LOCAL_WRITE);
	check(!rc, "unbound", "ibv_rereg_mr: %d (%s)", rc, strerror(rc));

	ibv_dereg_mr(mr2);
	ibv_dealloc_pd(pd2);
	side_close(&a);
	b.buf = buf2;	/* what b's MR names now */
	side_close(&b);
	free(buf1);
	return check_summary();
}
