// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
/*
 * vt3-chaos: the faults it can inject and the plan of a run, all drawn
 * from the seed (everything but timing).
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include "vt3-chaos.h"
const struct fault faults[N_FAULTS] = {
	{ "disconnect",		LOCAL,	S_QP,		E_CLOSE | E_FATAL, false },
	{ "abort",		LOCAL,	S_QP,		0, false },
	{ "bad-wqe",		LOCAL,	S_QP,		E_REQ, false },
	{ "peer-close",		PEER,	S_QP,		E_CLOSE | E_FATAL, false },
	{ "peer-abort",		PEER,	S_QP,		E_FATAL, false },
	{ "rst",		HOST,	S_QP,		E_FATAL, false },
	{ "fin",		HOST,	S_QP,		E_CLOSE | E_FATAL, false },
	{ "blackhole",		HOST,	S_QP,		E_FATAL, false },
	{ "drop",		HOST,	S_NOEVENT,	0, false },
	{ "delay",		HOST,	S_NOEVENT,	0, false },
	{ "corrupt-crc",	HOST,	S_QP,		E_FATAL, false },
	{ "terminate",		HOST,	S_QP,		0, false },
	{ "invalidate-stag",	HOST,	S_QP,		0, false },
	{ "device-fatal",	HOST,	S_DEVICE,	E_DEVICE,	true },
	{ "peer-killed",	HOST,	S_ALL,		E_FATAL,	true },
	{ "peer-vt3d-killed",	HOST,	S_ALL,		E_FATAL,	true },
	{ "vt3d-killed",	HOST,	S_DEVICE,	E_DEVICE,	true },
	{ "rmmod",		HOST,	S_DEVICE,	E_DEVICE,	true },
	{ "mute-commands",	HOST,	S_DEVICE,	E_DEVICE,	true },
	{ "split",		HOST,	S_NOEVENT,	0, false },
};
_Static_assert(sizeof(faults) / sizeof(faults[0]) == N_FAULTS && sizeof(faults[N_FAULTS - 1].name),
	       "N_FAULTS names every fault");

/* Registered TERMINATE codes (docs/vt3d-ctl.md): layer, etype, ecode. */
static const uint8_t terminates[][3] = {
	{ 0, 0, 0x00 }, { 0, 1, 0x00 }, { 0, 1, 0x02 }, { 0, 2, 0x06 }, { 0, 2, 0xff },
	{ 1, 0, 0x00 }, { 1, 1, 0x00 }, { 1, 2, 0x01 }, { 1, 2, 0x02 }, { 2, 0, 0x02 },
	{ 2, 0, 0x01 },
};

int fault_find(const char *name)
{
	int i;

	for (i = 0; i < N_FAULTS; i++)
		if (!strcmp(faults[i].name, name))
			return i;
	return -1;
}

/* ------------------------------------------------------------------ plan */

const char *const style_names[] = { "poll", "post", "async", "mixed" };

static uint64_t rng_next(uint64_t *s)
{
	*s = mix(*s);
	return *s;
}

static int rnd(uint64_t *s, int n)
{
	return (int)(rng_next(s) % (uint64_t)n);
}

static void plan_srqs(struct plan *p, uint64_t seed);

/* Everything but timing from the seed; the fault is drawn first from the
 * allowed list, so --faults F with one F keeps the rest of the plan. */
void make_plan(struct plan *p, uint64_t seed, const int *allowed, int nallowed, int duration_ms)
{
	uint64_t s = hash(seed, 0, T_PLAN, 0);
	int i;

	memset(p, 0, sizeof(*p));
	p->seed = seed;
	p->fault = allowed[rnd(&s, nallowed)];
	p->side = rnd(&s, 2);
	p->nqp = 4 + rnd(&s, MAX_QPS - 3);
	p->ncq = 1 + rnd(&s, MAX_CQS);
	p->nworkers = 1 + rnd(&s, 2);
	p->target = rnd(&s, p->nqp);
	for (i = 0; i < p->ncq; i++)
		p->cq_event[i] = rnd(&s, 3) == 0;
	for (i = 0; i < p->nqp; i++) {
		p->send_cq[i] = rnd(&s, p->ncq);
		/* About a third with a receive CQ of their own choice. */
		p->recv_cq[i] = rnd(&s, 3) ? p->send_cq[i] : rnd(&s, p->ncq);
		p->style[i] = rnd(&s, 4);
		p->sig_every[i] = 1 + rnd(&s, 4);
	}
	p->duration = duration_ms * (0.75 + rnd(&s, 51) / 100.0) / 1000.0;
	p->fault_at = p->duration * (0.1 + rnd(&s, 71) / 100.0);
	if (!strcmp(faults[p->fault].name, "drop")) {
		p->a1 = 5 + rnd(&s, 26);	/* percent */
		p->a2 = 1 + rnd(&s, 1000);	/* its seed */
	} else if (!strcmp(faults[p->fault].name, "delay")) {
		p->a1 = 10 + rnd(&s, 191);	/* ms */
	} else if (!strcmp(faults[p->fault].name, "split")) {
		p->a1 = 1 + rnd(&s, 8);		/* tail octets: 1-3 cut the CRC */
		p->a2 = 1 + rnd(&s, 20);	/* hold ms */
	} else if (!strcmp(faults[p->fault].name, "terminate")) {
		const uint8_t *t = terminates[rnd(&s, sizeof(terminates) / sizeof(terminates[0]))];

		p->a1 = t[0], p->a2 = t[1], p->a3 = t[2];
	}
	plan_srqs(p, seed);
}

/*
 * Shared receive queues, from a stream of their own (the rest of a plan
 * is what the seed drew before SRQs existed): half of the runs put a
 * random subset of their QPs, a quarter of those all of them, on one or
 * two SRQs; QPs of different receive CQs share one.
 */
static void plan_srqs(struct plan *p, uint64_t seed)
{
	uint64_t s = hash(seed, 0, T_PLAN, 1);
	int used[MAX_SRQS] = {}, i, n = 0;
	bool all;

	for (i = 0; i < p->nqp; i++)
		p->srq[i] = -1;
	if (rnd(&s, 2))
		return;
	p->nsrq = 1 + rnd(&s, MAX_SRQS);
	all = rnd(&s, 4) == 0;
	for (i = 0; i < p->nqp; i++)
		if (all || rnd(&s, 2))
			p->srq[i] = rnd(&s, p->nsrq);
	/* SRQs numbered in their QPs' order, none without a QP. */
	for (i = 0; i < MAX_SRQS; i++)
		used[i] = -1;
	for (i = 0; i < p->nqp; i++) {
		if (p->srq[i] < 0)
			continue;
		if (used[p->srq[i]] < 0)
			used[p->srq[i]] = n++;
		p->srq[i] = used[p->srq[i]];
	}
	if (!n)
		p->srq[rnd(&s, p->nqp)] = n++;
	p->nsrq = n;
}

/* The target's first error event for this fault. */
unsigned int plan_expect(const struct plan *p)
{
	const struct fault *f = &faults[p->fault];

	if (f->expect)
		return f->expect;
	if (!strcmp(f->name, "terminate")) {
		if (p->a1 == 2 || p->a2 == 0)
			return E_FATAL;
		return p->a2 == 1 ? E_ACCESS : E_REQ;
	}
	if (!strcmp(f->name, "invalidate-stag"))
		/* The peer's STag: the peer detects the access (QP_ACCESS_ERR);
		 * ours: our WQEs or the peer's SENDs into it fail locally. */
		return p->side ? E_FATAL | E_REQ | E_ACCESS : E_ACCESS;
	return 0;
}
