// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
/*
 * vt3-flushtest: what its parts share (vt3-flushtest.c describes the tool).
 * The client/server protocol travels in rdma_cm private data.
 */
#ifndef VT3_FLUSHTEST_H
#define VT3_FLUSHTEST_H

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/mman.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

/* The vendor event of vt3 (infiniband/vt3dv.h), without needing the header. */
#define EV_LLP_CLOSE_COMPLETE	0x8001

#define MAGIC		0x76743366u	/* "vt3f" */
#define BUF_SIZE	(64 << 10)
#define MSG_SIZE	64
#define N_RECV		4
#define N_WRITE		2
#define CQ_DEPTH	64
#define CQ_SMALL	4		/* overflow: vt3 rounds to a ring of 8 */
#define N_OVERFLOW	24

/* Server actions, chosen by the client. */
enum action {
	ACT_NONE,
	ACT_DISCONNECT,		/* rdma_disconnect */
	ACT_ABORT,		/* destroy QP and id with the connection up */
	ACT_SEND,		/* one SEND to the client */
	ACT_WRITE_BADSTAG,	/* RDMA WRITE with a wrong key in the STag */
	ACT_WRITE,		/* a valid RDMA WRITE to the client's buffer */
};

struct req_pd {			/* client -> server, in the connect */
	uint32_t magic;
	uint32_t action;
	uint64_t addr;
	uint32_t rkey;
	uint32_t len;
	uint32_t delay_ms;	/* act this long after the "go" */
	uint32_t reserved;
};

struct rep_pd {			/* server -> client, in the accept */
	uint32_t magic;
	uint32_t qpn;
	uint64_t addr;
	uint32_t rkey;
	uint32_t len;
};

/* ---------------------------------------------------------------- client */

enum queue { SQ, RQ };

/* What each posted WR may end as. */
enum expect {
	X_FLUSH,		/* exactly once, FLUSH_ERR */
	X_OK_OR_FLUSH,		/* exactly once, SUCCESS or FLUSH_ERR */
	X_ERROR,		/* exactly once, an error other than FLUSH_ERR */
	X_MAYBE,		/* at most once, SUCCESS or FLUSH_ERR (overflow) */
	X_UNSIGNALED,		/* at most once and never SUCCESS: FLUSH_ERR if the
				   device had not retired it, or its own error */
};

#define MAX_WR	64

struct wrec {
	uint64_t wr_id;
	enum queue q;
	enum expect x;
	int seen;
	enum ibv_wc_status status;
};

struct scenario {
	const char *name;
	const char *what;
	enum action action;	/* server's */
	bool go;		/* send the server its "go" */
	bool local_close;	/* rdma_disconnect ourselves after READY */
	bool bad_wqe;
	bool overflow;
	bool host;		/* the fault comes from the host */
	uint32_t delay_ms;	/* the server acts this long after the "go" */
	const char *events;	/* expected on vt3, as for --expect */
};

struct client {
	const struct scenario *sc;
	const char *style;
	int expect[4];
	int nexpect;
	struct rdma_event_channel *ch;
	struct rdma_cm_id *id;
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_comp_channel *cch;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	char *buf;
	struct rep_pd peer;
	struct wrec wr[MAX_WR];
	int nwr;
	bool flushed[2];
	uint64_t last_flush[2];
	int got_ev[8];
	int nev;
	double t_fault, t_event, t_first_flush;
	int cq_events_unacked;
	uint32_t qpn;
	/* cm thread */
	pthread_t cm_thread;
	bool cm_running;
	volatile bool cm_stop;
	volatile bool cm_disconnected;
	bool qp_destroyed;
	struct ibv_qp *decoy;		/* --decoy-qp */
	char err[512];
};

/* vt3-flushtest.c: options and helpers */
extern int verbose;
extern int timeout_s;
extern bool decoy;
double now(void);
void vlog(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
const char *ev_name(int type);
int ev_parse(const char *s);

/* vt3-flushtest-spread.c: calloc() 4 GiB apart while set (--decoy-qp) */
extern __thread bool spread_on;

/* vt3-flushtest-server.c */
int run_server(const char *bind_ip, int port);

/* vt3-flushtest-account.c: posting WRs and accounting for completions and events */
void cfail(struct client *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int post_recv(struct client *c, enum expect x);
int post_send(struct client *c, enum ibv_wr_opcode op, bool signaled, uint32_t lkey, enum expect x);
bool all_done(struct client *c);
int poll_some(struct client *c);
bool events_complete(struct client *c);
int read_event(struct client *c, int ms);

#endif
