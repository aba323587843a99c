/* SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB */
/*
 * VT3_WRCHECK=1: libvt3 accounts for every WR posted and every completion
 * it hands back, and reports the WRs that never completed or completed
 * twice (docs/wrcheck.md). Off, each hook is one test of a pointer that
 * stays NULL: nothing is allocated and the paths are otherwise unchanged.
 */
#ifndef VT3_WRCHECK_H
#define VT3_WRCHECK_H

#include <stdbool.h>
#include <stdint.h>

#include <ccan/list.h>

struct vt3_qp;
struct vt3_srq;
struct vt3_wq;

/* How many wr_ids of lost and of duplicated WRs a report lists. */
#define VT3_WRCHECK_IDS	16

/* What happened to the WRs of one queue (one report's numbers). */
struct vt3_wrcheck_counts {
	uint64_t posted;
	uint64_t completed;		/* WRs handed back once (flushes included) */
	uint64_t flushed;		/* of those, completions the provider's flush made */
	uint64_t lost;			/* passed by the provider without a completion it owed */
	uint64_t duplicated;		/* completions beyond a WR's first */
	uint64_t unpolled;		/* owed, still waiting at destroy or exit */
	uint64_t unsignaled;		/* retired without a completion, none owed */
	uint64_t reset;			/* dropped by a modify to RESET */
	unsigned int nlost, ndup;
	uint64_t lost_ids[VT3_WRCHECK_IDS];
	uint64_t dup_ids[VT3_WRCHECK_IDS];
};

/*
 * One posted WR, by its free-running queue index (seq): the same wr_id
 * may be posted again, the same seq not until the ring wrapped.
 */
struct vt3_wrcheck_rec {
	uint64_t wr_id;
	uint32_t seq;
	uint8_t flags;			/* VT3_WRC_* */
	uint8_t ncomp;			/* completions handed back */
};

/*
 * One queue's records. An SQ or RQ keeps twice its depth: the provider
 * reuses a slot once its WR is at most depth behind the tail, so a post
 * never overwrites a record the poll side has yet to judge. An SRQ keeps
 * its depth: its slots are free only once the provider said so.
 * retired (SQ/RQ, under the CQ's lock): every WR before it was passed.
 */
struct vt3_wrcheck_q {
	struct vt3_wrcheck_counts n;
	struct vt3_wrcheck_rec *rec;
	uint32_t size;			/* power of two */
	uint32_t retired;
	uint32_t flush_from;		/* where the queue's flush began */
	bool flushing;
};

/* One QP (sq, rq) or SRQ (q[0]) under watch. */
struct vt3_wrcheck {
	struct list_node entry;		/* the process's list, for the exit report */
	struct vt3_qp *qp;
	struct vt3_srq *srq;
	struct vt3_wrcheck_q q[2];
};

bool vt3_wrcheck_enabled(void);
void vt3_wrcheck_qp_create(struct vt3_qp *qp);
void vt3_wrcheck_qp_destroy(struct vt3_qp *qp);
void vt3_wrcheck_posted(struct vt3_wq *wq, uint32_t start);
void vt3_wrcheck_completed(struct vt3_wq *wq, uint32_t idx, uint64_t wr_id,
			   bool flush);
void vt3_wrcheck_flush_begins(struct vt3_wq *wq);
void vt3_wrcheck_flushed_to(struct vt3_wq *wq);
void vt3_wrcheck_reset(struct vt3_wq *wq);
void vt3_wrcheck_srq_create(struct vt3_srq *srq);
void vt3_wrcheck_srq_destroy(struct vt3_srq *srq);
void vt3_wrcheck_srq_posted(struct vt3_srq *srq, uint32_t start);
void vt3_wrcheck_srq_completed(struct vt3_srq *srq, uint32_t idx,
			       bool returned, bool flush);
void vt3_wrcheck_srq_resized(struct vt3_srq *srq, uint32_t depth);

#endif /* VT3_WRCHECK_H */
