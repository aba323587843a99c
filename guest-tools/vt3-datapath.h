// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
/* vt3-datapath: what the checks share with their harness (vt3-datapath.c describes the tool). */
#ifndef VT3_DATAPATH_H
#define VT3_DATAPATH_H

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <fcntl.h>
#include <dlfcn.h>
#include <pthread.h>
#include <infiniband/verbs.h>

#define BUF_SIZE	(64 << 10)
#define QP_WRS		16
#define QP_SGES		2
#define QP_INLINE	64
#define MAX_WC		1024
/* How long a completion may take to show up (siw flushes in the kernel). */
#define WAIT_MS		3000
/* How long to watch for completions that must not come. */
#define QUIET_MS	300

/* The device under test (vt3-datapath.c). */
extern const char *prog;
extern bool verbose;
extern struct ibv_context *ctx;
extern struct ibv_device_attr dev_attr;
extern struct ibv_pd *pd;
extern struct ibv_mr *mr;
extern char *buf;
extern bool is_vt3;

/* What one check created: the harness destroys it, whatever happened. */
struct env {
	struct ibv_comp_channel *channel;
	struct ibv_cq *cq[2];
	struct ibv_qp *qp[2];
	struct ibv_qp_cap cap[2];	/* as granted */
};

struct reaped {
	struct ibv_wc wc[MAX_WC];
	int n;
};

/* In a check: fail it with a message and return. */
#define EXPECT(cond, ...)			\
	do {					\
		if (!(cond)) {			\
			failf(__VA_ARGS__);	\
			return false;		\
		}				\
	} while (0)

/* Or fail it when a helper already said why. */
#define TRY(call)				\
	do {					\
		if (!(call))			\
			return false;		\
	} while (0)

/* vt3-datapath-harness.c: resources, work requests, completions */
extern char fail_msg[512];
void failf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
double now_ms(void);
bool is_errno(int ret, int want);
const char *err_name(int ret);
bool make_cq(struct env *e, int i, bool with_channel);
bool make_qp(struct env *e, int i, int scq, int rcq, bool sig_all);
bool make_env(struct env *e);
void free_env(struct env *e);
const char *state_name(enum ibv_qp_state state);
bool to_state(struct ibv_qp *qp, enum ibv_qp_state state);
void fill_sges(unsigned int slot, int n);
void recv_wr(struct ibv_recv_wr *wr, uint64_t id, int num_sge);
void send_wr(struct ibv_send_wr *wr, uint64_t id,
	     enum ibv_wr_opcode opcode, int num_sge, unsigned int flags);
void chain_recv(struct ibv_recv_wr *wr, int n);
void chain_send(struct ibv_send_wr *wr, int n);
bool post_send_fails(struct ibv_qp *qp, struct ibv_send_wr *wr,
		     struct ibv_send_wr *want_bad, int want,
		     const char *what);
bool post_recv_fails(struct ibv_qp *qp, struct ibv_recv_wr *wr,
		     struct ibv_recv_wr *want_bad, int want,
		     const char *what);
bool post_send_ok(struct ibv_qp *qp, struct ibv_send_wr *wr, const char *what);
bool post_recv_ok(struct ibv_qp *qp, struct ibv_recv_wr *wr, const char *what);
bool reap(struct ibv_cq *cq, int want, struct reaped *r);
bool no_completions(struct ibv_cq *cq, const char *what);
enum ibv_wc_opcode wc_opcode_of(enum ibv_wr_opcode op);
bool flushed_exactly(const struct reaped *r, struct ibv_qp *qp,
		     bool recv, const uint64_t *ids, int n,
		     const enum ibv_wc_opcode *opcodes);
bool all_accounted(const struct reaped *r, int expected);
bool wait_event(struct env *e, struct ibv_cq *want, int ms);

/* vt3-datapath-doorbell.c */
bool check_doorbell_unlocked(struct env *e);

#endif
