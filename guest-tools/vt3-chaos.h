/* SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB */
/*
 * vt3-chaos: what its parts share (vt3-chaos.c: the plan, the client and
 * its accounting; vt3-chaos-server.c: the passive side; vt3-chaos-srq.c:
 * the client's shared receive queues). The header comment of vt3-chaos.c
 * describes the tool.
 */
#ifndef VT3_CHAOS_H
#define VT3_CHAOS_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

/* The vendor event of vt3 (infiniband/vt3dv.h), without needing the header. */
#define EV_LLP_CLOSE_COMPLETE	0x8001

#define MAGIC		0x76743363u	/* "vt3c" */
#define MAX_QPS		16
#define MAX_CQS		4
#define SQ_DEPTH	32
#define RQ_DEPTH	32
#define MAX_WR		16384		/* per queue and QP in one run */
#define SLOT		256		/* bytes per buffer slot */
#define RSLOT		3072		/* bytes of a receive slot for a reply (REQ_BIG_REPLIES) */
#define QP_BUF		(2 * NSLOT * SLOT + NSLOT * RSLOT)	/* a client QP's buffer */
#define NSLOT		64		/* local slots of each kind (> 2 queue depths) */
#define RSLOTS		1024		/* remote WRITE slots per connection */
#define RECENT		(RSLOTS / 2)	/* a READ reads back a WRITE this recent */
#define SRV_RQ		96		/* > RQ_DEPTH: every client SEND finds one */
#define SRV_SQ		96
#define HDR		16
#define ORD		4

/* Byte-pattern tags: what a buffer's bytes derive from besides the seed. */
enum tag { T_LEN = 1, T_OP, T_CSEND, T_REPLY, T_WRITE, T_STATIC, T_PLAN };

/* ------------------------------------------------------------- common */

extern int verbose;
extern int timeout_s;

double now(void);
void vlog(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static inline uint64_t mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

static inline uint64_t hash(uint64_t seed, unsigned int qpi, enum tag tag, uint32_t idx)
{
	return mix(seed ^ mix(((uint64_t)qpi << 40) ^ ((uint64_t)tag << 32) ^ idx));
}

/* Byte i of the message (seed, qpi, tag, idx). */
static inline uint8_t pat(uint64_t base, unsigned int i)
{
	return (uint8_t)((base >> ((i & 7) * 8)) + (i >> 3) * 151);
}

static inline void fill(uint8_t *p, uint64_t base, unsigned int from, unsigned int len)
{
	unsigned int i;

	for (i = from; i < len; i++)
		p[i] = pat(base, i);
}

/* Index of the first wrong byte, or -1. */
static inline int verify(const uint8_t *p, uint64_t base, unsigned int from, unsigned int len)
{
	unsigned int i;

	for (i = from; i < len; i++)
		if (p[i] != pat(base, i))
			return i;
	return -1;
}

/* SEND messages start with this header; the rest is the pattern. */
struct msg_hdr {
	uint32_t magic;
	uint16_t qpi;
	uint16_t len;
	uint32_t seq;
	uint32_t tag;
};

/*
 * With REQ_BIG_REPLIES (the client's QPs on an SRQ) replies are up to
 * RSLOT bytes, about half of them two or three DDP segments at MTU 1500:
 * a fault can then cut one in the middle and leave an SRQ WQE taken and
 * not finished (the rule "a QP's error flushes only the WQE it had taken"
 * needs one). Otherwise (and in the kernel client, vt3_kchaos.c, which
 * has its own copy of this) every reply fits a SLOT.
 */
static inline unsigned int reply_len(uint64_t seed, unsigned int qpi, uint32_t seq, bool big)
{
	uint64_t h = hash(seed, qpi, T_REPLY, seq ^ 0x80000000u);

	return HDR + h % ((big ? RSLOT : SLOT) - HDR + 1);
}

enum action { ACT_NONE, ACT_CLOSE, ACT_ABORT };

struct req_pd {			/* client -> server, in the connect */
	uint32_t magic;
	uint32_t qpi;
	uint64_t seed;
	uint32_t action;
	uint32_t act_ms;	/* after ESTABLISHED */
	/* The kernel client's request ends here (REQ_PD_V1_LEN). */
	uint32_t flags;		/* REQ_* */
	uint32_t reserved;
};

#define REQ_PD_V1_LEN	offsetof(struct req_pd, flags)
#define REQ_BIG_REPLIES	1u	/* replies up to RSLOT bytes (reply_len) */

struct rep_pd {			/* server -> client, in the accept */
	uint32_t magic;
	uint32_t qpn;
	uint64_t addr;		/* RSLOTS WRITE slots, then the static slot */
	uint32_t rkey;
	uint32_t reserved;
};

/* The server (vt3-chaos-server.c). */
int run_server(int port);

/* ---------------------------------------------------------------- faults */

enum who { LOCAL, PEER, HOST };
enum scope {
	S_QP,		/* one QP: the others must see no error until the end */
	S_NOEVENT,	/* no QP may see an error until the end */
	S_ALL,		/* every QP ends: QP_FATAL each */
	S_DEVICE,	/* DEVICE_FATAL */
};

/* Expected first error event of the target QP (bit masks). */
#define E_FATAL		(1u << 0)
#define E_REQ		(1u << 1)
#define E_ACCESS	(1u << 2)
#define E_CLOSE		(1u << 3)
#define E_DEVICE	(1u << 4)
#define E_ANY_QP	(E_FATAL | E_REQ | E_ACCESS | E_CLOSE)

struct fault {
	const char *name;
	enum who who;
	enum scope scope;
	unsigned int expect;	/* the target's first event: E_* mask; 0: by args */
	bool destructive;	/* the rest of the batch has no device or peer */
};

#define N_FAULTS	20
extern const struct fault faults[N_FAULTS];

/* ------------------------------------------------------------------ plan */

#define MAX_SRQS	2
#define SRQ_DEPTH	64		/* WRs kept posted on an SRQ */
#define SRQ_SLOTS	(4 * SRQ_DEPTH)	/* receive buffers of an SRQ */
#define MAX_SRQ_WR	(4 * MAX_WR)	/* per SRQ in one run */

enum style { ST_POLL, ST_POST, ST_ASYNC, ST_MIXED };

struct plan {
	uint64_t seed;
	int fault;
	int side;		/* 0: the peer's vt3d/QP, 1: ours */
	int target;		/* QP index */
	int nqp, ncq, nworkers;
	int send_cq[MAX_QPS], recv_cq[MAX_QPS];
	bool cq_event[MAX_CQS];	/* reaped by the cq-event thread, else busy-polled */
	enum style style[MAX_QPS];
	int sig_every[MAX_QPS];
	double duration, fault_at;	/* s after the traffic starts */
	int a1, a2, a3;
	int nsrq;		/* 0: every QP has its own receive queue */
	int srq[MAX_QPS];	/* the QP's SRQ, -1: its own receive queue */
};

/* vt3-chaos-plan.c */
extern const char *const style_names[];
int fault_find(const char *name);
void make_plan(struct plan *p, uint64_t seed, const int *allowed, int nallowed, int duration_ms);
unsigned int plan_expect(const struct plan *p);

/* ---------------------------------------------------------------- client */

enum queue { SQ, RQ, SRQ_Q };	/* SRQ_Q: wr_id's QP field is the SRQ's index */
enum op { OP_SEND, OP_WRITE, OP_READ, OP_RECV };

struct wrec {
	uint8_t op;
	uint8_t signaled;
	uint8_t seen;
	uint8_t status;
	uint16_t len;
	int32_t src;		/* READ: the WRITE it reads back; -1 the static slot */
	uint32_t seq;		/* SEND: its number among the QP's SENDs */
	uint8_t after_err;	/* posted when the QP was known to be in error */
	uint8_t unposted;	/* SRQ: its ibv_post_srq_recv failed */
	int8_t by;		/* SRQ: the QP it completed on; -2 the drain QP */
	uint32_t by_qpn;	/* SRQ: its wc.qp_num */
};

struct wq {
	struct wrec *w;
	uint32_t posted;	/* records 0..posted-1 (atomic: pollers read it) */
	uint32_t next;		/* completions so far came for indexes < next */
	uint32_t discarded;	/* the QP was destroyed: from here on nothing is owed */
	uint32_t after_err;	/* WRs posted to it in error (bounded) */
	volatile bool flushed;
	unsigned long ok, flush, err, silent;
};

struct cq {
	struct ibv_cq *cq;
	pthread_mutex_t lock;	/* poll + accounting in one step: order checks hold */
	bool event;
	int unacked;
};

/*
 * A shared receive queue and its books. Several threads post to it at
 * once (no lock of ours around ibv_post_srq_recv): a record is reserved
 * by an atomic index first. Its completions come on the receive CQs of
 * its QPs, out of index order: accounted under its own lock.
 */
struct srq {
	int idx;
	struct client *c;
	struct ibv_srq *srq;
	struct ibv_mr *mr;
	uint8_t *buf;		/* SRQ_SLOTS receive slots */
	struct wrec *w;
	uint32_t reserved;	/* records 0..reserved-1 handed out (atomic) */
	uint32_t done;		/* records completed or never posted (atomic) */
	uint32_t posted_ok;	/* WRs posted (atomic) */
	uint32_t credits;	/* SENDs its QPs may make: <= posted_ok (atomic) */
	uint32_t after_err;	/* WRs posted after the device was lost (atomic) */
	pthread_mutex_t lock;	/* accounting */
	int nqp;
	unsigned long enomem;	/* posts refused: the slot at the producer index was busy */
	unsigned long ok, flush, err, left, dropped;
	unsigned long taken;	/* of flush + err: the WQE a QP had taken when it failed */
};

struct qp {
	int idx;
	struct client *c;
	struct rdma_cm_id *id;
	struct ibv_qp *qp;
	uint32_t qpn;
	struct ibv_mr *mr;
	uint8_t *buf;		/* NSLOT source, NSLOT READ (SLOT each), NSLOT receive slots (RSLOT) */
	struct rep_pd peer;
	struct cq *scq, *rcq;
	struct srq *srq;	/* NULL: its receives are its own RQ's */
	enum style style;
	int sig_every;
	pthread_mutex_t lock;	/* posting: index order == ring order */
	struct wq q[2];
	uint32_t nsend;		/* SENDs posted */
	uint32_t nrecv_ok;	/* receives completed with SUCCESS */
	int32_t last_write;
	volatile bool destroyed;	/* ibv_destroy_qp returned */
	volatile bool gone;	/* destroyed or never to be posted to again */
	volatile bool cm_closed;
	volatile int first_event;	/* E_* bit, 0: none yet */
	double first_event_at;
	int nevents;
	bool fenced;
	/* SRQ QPs: what its share of the SRQ showed (under its rcq's lock) */
	int last_wqe;			/* LAST_WQE_REACHED events read */
	volatile bool last_wqe_polled;	/* its CQ polled after LAST_WQE_REACHED */
	int srq_unsuccessful;		/* SRQ WRs completed here, not SUCCESS */
	int srq_flushed;		/* of them, WR_FLUSH_ERR */
	bool aborted;			/* destroyed before LAST_WQE_REACHED */
	uint32_t nrecv_other;		/* SRQ WRs completed here in error */
};

struct client {
	struct plan plan;
	int run;
	struct rdma_event_channel *ch;
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_comp_channel *cch;
	struct cq cqs[MAX_CQS];
	struct qp qps[MAX_QPS];
	struct srq srqs[MAX_SRQS];
	int nqp;
	bool lost_run;			/* the device is lost: its SRQs are flushed */
	bool removed_run;		/* the fault removes the device (rmmod) */
	int may_fail;			/* before the end: this QP may fail; -1 none, -2 any */
	struct sockaddr_storage local;	/* our address (the SRQ's drain connects to it) */
	volatile bool stop_post;	/* the end: posters stop */
	volatile bool stop;		/* threads end */
	volatile bool ending;		/* error events from here on are ours */
	volatile bool device_fatal;
	double t0, t_end;
	pthread_mutex_t err_lock;
	char err[1024];
	int nerr;
	unsigned long events[6];	/* FATAL REQ ACCESS CLOSE DEVICE other */
	unsigned long last_wqe_events;
	unsigned long cq_wakeups, fallback_polls;
};

void cfail(struct client *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
uint64_t make_wr_id(struct client *c, int qpi, enum queue q, uint32_t idx);
struct qp *qp_of_num(struct client *c, uint32_t qpn);
void check_reply(struct client *c, struct qp *qp, const uint8_t *p, const struct ibv_wc *wc,
		 const char *what, uint32_t idx);
int poll_cq(struct client *c, struct cq *cq, int *device_cqes);

static inline uint32_t load(const uint32_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
static inline void store(uint32_t *p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }

/* vt3-chaos-work.c: posting and accounting */
extern const char *const op_names[];
extern bool signaled_flush_only;
int post_recv(struct qp *qp);
int post_send(struct qp *qp, enum op op, bool signaled, uint32_t lkey);
void post_some(struct qp *qp);

/* vt3-chaos-threads.c */
struct worker {
	struct client *c;
	int n;
	pthread_t t;
};

unsigned int ev_bit(int type);
const char *ev_bits_str(unsigned int m, char *buf, size_t len);
void *worker_thread(void *arg);
void *async_thread(void *arg);
void *cq_event_thread(void *arg);
void *cm_thread(void *arg);

/* vt3-chaos-srq.c */
int srq_create(struct client *c, struct srq *s);
void srq_post_some(struct srq *s);
bool srq_send_credit(struct srq *s);
void srq_account(struct client *c, struct cq *cq, const struct ibv_wc *wc, const bool was_destroyed[]);
void srq_last_wqe(struct client *c, struct qp *qp);
bool srq_accounted(struct client *c);
void srq_check_last_wqe(struct client *c);
void srq_end(struct client *c, struct srq *s);
void srq_counts(struct client *c, char *buf, size_t len);

#endif
