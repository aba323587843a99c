// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
/*
 * vt3-flushtest: close, fault and flush conformance over a real connection
 * (DESIGN.md section 5, docs/events.md). librdmacm + libibverbs.
 *
 *   vt3-flushtest server [--port P] [--bind IP] [--timeout S]
 *   vt3-flushtest client --server IP [--port P] --scenario S[,S...]
 *                        --style Y[,Y...] [--timeout S] [--expect EV[,EV...]]
 *                        [--grace S] [--decoy-qp] [-v]
 *   vt3-flushtest list
 *
 * The server is the passive side and runs on any iWARP device (vt3 or siw):
 * it accepts one connection at a time, hands the client a buffer (address,
 * rkey) and its QP number in the accept's private data, and does to the
 * connection what the client's private data asks once the client's "go"
 * SEND arrives (disconnect, abort, a SEND, a WRITE with a bad STag), then
 * waits for the disconnect and accepts the next one.
 *
 * The client is the side under test. Per scenario x style it connects,
 * posts work that cannot all complete (receives the server never matches,
 * signaled WRITEs, an unsignaled WRITE, scenario-specific WRs), prints
 * "READY <qpn> <peer qpn> <rkey> <scenario> <style>" and waits (bounded) for the fault: its own
 * action, the server's, or one injected from the host (vt3d ctl fault ...,
 * killing vt3d). Then, in the given style:
 *   events    only reaps async events (ibv_get_async_event) until the
 *             expected ones came, then polls the completions
 *   poll      only polls the CQ until every WR is accounted for
 *   post      waits for the QP to leave RTS (ibv_query_qp), posts a new
 *             receive and a new signaled WRITE (they must complete with
 *             IBV_WC_WR_FLUSH_ERR), then polls
 *   cq-event  blocks in ibv_get_cq_event on an armed CQ (must wake), polls,
 *             re-arms, until every WR is accounted for
 *   idle      waits for the QP to leave RTS, does nothing, destroys the QP
 *             (must not hang)
 * Each style may flush only through its own trigger (VT3_FLUSH_TRIGGERS:
 * events the async event, post a post, the others a poll). After every
 * ibv_destroy_qp() the CQ is drained: nothing of that QP may come.
 * Checks: every WR completes exactly once (wr_id accounting), with an
 * allowed status; per queue, every device completion before the first
 * FLUSH_ERR and the flushes in posting order; unsignaled sends complete
 * only with an error (FLUSH_ERR when not retired); the expected async events arrive with element.qp
 * (element.cq) right; nothing waits unbounded; ibv_destroy_qp returns.
 * One line per combination, "N passed, N failed" last; exit 1 on a failure.
 */
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

static int verbose;
static int timeout_s = 60;
static bool decoy;

/*
 * --decoy-qp: before each test QP, a decoy QP on the same PD and CQ, both
 * created while calloc() hands out memory 4 GiB apart at equal low 32
 * bits. This program defines calloc() and free(), which every library in
 * it resolves to, and passes them on to glibc's outside those windows.
 * libibverbs gives the provider a vendor event's QP handle (the QP's
 * address) in 32 bits only: a provider that allocated its QPs with
 * calloc() would take the test QP's LLP_CLOSE_COMPLETE for the decoy's
 * (created first, found first), and both destroys would hang.
 */
#define SPREAD_BASE	0x100000000000ull
#define SPREAD_STRIDE	(1ull << 32)
#define SPREAD_SLOTS	256

extern void *__libc_calloc(size_t n, size_t size);
extern void __libc_free(void *p);

static __thread bool spread_on;
static pthread_mutex_t spread_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
	void *p;
	size_t len;
} spread[SPREAD_SLOTS];
static unsigned int spread_next;

void *calloc(size_t n, size_t size)
{
	size_t len;
	void *want, *p;

	if (!spread_on || !n || size > (1u << 20) / n)
		return __libc_calloc(n, size);
	len = (n * size + 4095) & ~(size_t)4095;
	pthread_mutex_lock(&spread_lock);
	for (; spread_next < SPREAD_SLOTS; spread_next++) {
		want = (void *)(uintptr_t)(SPREAD_BASE + spread_next * SPREAD_STRIDE);
		p = mmap(want, len, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
		if (p == want) {
			spread[spread_next].p = p;
			spread[spread_next++].len = len;
			pthread_mutex_unlock(&spread_lock);
			return p;	/* zeroed by mmap */
		}
		if (p != MAP_FAILED)
			munmap(p, len);
	}
	pthread_mutex_unlock(&spread_lock);
	return __libc_calloc(n, size);
}

void free(void *p)
{
	unsigned int i;

	if ((uintptr_t)p >= SPREAD_BASE &&
	    (uintptr_t)p < SPREAD_BASE + SPREAD_SLOTS * SPREAD_STRIDE) {
		pthread_mutex_lock(&spread_lock);
		for (i = 0; i < SPREAD_SLOTS; i++)
			if (spread[i].p == p) {
				munmap(p, spread[i].len);
				spread[i].p = NULL;
			}
		pthread_mutex_unlock(&spread_lock);
		return;
	}
	__libc_free(p);
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void vlog(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void vlog(const char *fmt, ...)
{
	va_list ap;

	if (!verbose)
		return;
	va_start(ap, fmt);
	fprintf(stderr, "  [%.3f] ", now());
	vfprintf(stderr, fmt, ap);
	va_end(ap);
}

static const char *ev_name(int type)
{
	if (type == EV_LLP_CLOSE_COMPLETE)
		return "LLP_CLOSE_COMPLETE";
	switch (type) {
	case IBV_EVENT_QP_FATAL: return "QP_FATAL";
	case IBV_EVENT_QP_REQ_ERR: return "QP_REQ_ERR";
	case IBV_EVENT_QP_ACCESS_ERR: return "QP_ACCESS_ERR";
	case IBV_EVENT_CQ_ERR: return "CQ_ERR";
	case IBV_EVENT_DEVICE_FATAL: return "DEVICE_FATAL";
	case IBV_EVENT_COMM_EST: return "COMM_EST";
	case IBV_EVENT_PORT_ACTIVE: return "PORT_ACTIVE";
	case IBV_EVENT_PORT_ERR: return "PORT_ERR";
	default: return "?";
	}
}

static int ev_parse(const char *s)
{
	static const int all[] = { EV_LLP_CLOSE_COMPLETE, IBV_EVENT_QP_FATAL,
		IBV_EVENT_QP_REQ_ERR, IBV_EVENT_QP_ACCESS_ERR, IBV_EVENT_CQ_ERR,
		IBV_EVENT_DEVICE_FATAL };
	unsigned int i;

	for (i = 0; i < sizeof(all) / sizeof(all[0]); i++)
		if (!strcmp(s, ev_name(all[i])))
			return all[i];
	if (!strcmp(s, "none"))
		return -2;
	return -1;
}

/* ---------------------------------------------------------------- server */

struct sconn {
	struct rdma_cm_id *id;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	char *buf;
	struct req_pd req;
	bool disconnected;
	double act_at;		/* the "go" came: act then (0: not yet) */
};

static void sconn_free(struct sconn *c, bool abort_conn)
{
	if (!c->id)
		return;
	if (!abort_conn && !c->disconnected)
		rdma_disconnect(c->id);
	if (c->id->qp)
		rdma_destroy_qp(c->id);
	if (c->mr)
		ibv_dereg_mr(c->mr);
	if (c->cq)
		ibv_destroy_cq(c->cq);
	if (c->pd)
		ibv_dealloc_pd(c->pd);
	rdma_destroy_id(c->id);
	free(c->buf);
	memset(c, 0, sizeof(*c));
}

static int sconn_setup(struct sconn *c, struct rdma_cm_event *ev)
{
	struct ibv_qp_init_attr attr = {
		.cap = { .max_send_wr = 16, .max_recv_wr = 16,
			 .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};
	struct rdma_conn_param param = {
		.responder_resources = 1, .initiator_depth = 1,
	};
	struct rep_pd rep = { .magic = MAGIC, .len = BUF_SIZE };
	int i;

	c->id = ev->id;
	if (ev->param.conn.private_data_len >= sizeof(c->req))
		memcpy(&c->req, ev->param.conn.private_data, sizeof(c->req));
	if (c->req.magic != MAGIC) {
		fprintf(stderr, "server: connect without our private data\n");
		rdma_reject(c->id, NULL, 0);
		rdma_destroy_id(c->id);
		c->id = NULL;
		return -1;
	}
	c->buf = calloc(1, BUF_SIZE);
	c->pd = ibv_alloc_pd(c->id->verbs);
	c->cq = c->pd ? ibv_create_cq(c->id->verbs, CQ_DEPTH, NULL, NULL, 0) : NULL;
	c->mr = c->cq ? ibv_reg_mr(c->pd, c->buf, BUF_SIZE,
				   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
				   IBV_ACCESS_REMOTE_READ) : NULL;
	attr.send_cq = attr.recv_cq = c->cq;
	if (!c->mr || rdma_create_qp(c->id, c->pd, &attr)) {
		perror("server: setup");
		rdma_reject(c->id, NULL, 0);
		sconn_free(c, true);
		return -1;
	}
	for (i = 0; i < 8; i++) {
		struct ibv_sge sge = { .addr = (uintptr_t)c->buf + i * MSG_SIZE,
				       .length = MSG_SIZE, .lkey = c->mr->lkey };
		struct ibv_recv_wr wr = { .wr_id = i, .sg_list = &sge, .num_sge = 1 }, *bad;

		if (ibv_post_recv(c->id->qp, &wr, &bad))
			perror("server: post_recv");
	}
	rep.qpn = c->id->qp->qp_num;
	rep.addr = (uintptr_t)c->buf;
	rep.rkey = c->mr->rkey;
	param.private_data = &rep;
	param.private_data_len = sizeof(rep);
	if (rdma_accept(c->id, &param)) {
		perror("server: rdma_accept");
		sconn_free(c, true);
		return -1;
	}
	printf("SERVER ACCEPTED %u action %u\n", rep.qpn, c->req.action);
	fflush(stdout);
	return 0;
}

/* The client's "go" arrived: do what it asked. Returns true if aborted. */
static bool sconn_act(struct sconn *c)
{
	struct ibv_sge sge = { .addr = (uintptr_t)c->buf + BUF_SIZE / 2,
			       .length = MSG_SIZE, .lkey = c->mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 100, .sg_list = &sge, .num_sge = 1,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;

	printf("SERVER GO action %u\n", c->req.action);
	fflush(stdout);
	switch (c->req.action) {
	case ACT_DISCONNECT:
		rdma_disconnect(c->id);
		break;
	case ACT_ABORT:
		sconn_free(c, true);
		return true;
	case ACT_SEND:
		wr.opcode = IBV_WR_SEND;
		if (ibv_post_send(c->id->qp, &wr, &bad))
			perror("server: post_send");
		break;
	case ACT_WRITE_BADSTAG:
	case ACT_WRITE:
		wr.opcode = IBV_WR_RDMA_WRITE;
		wr.wr.rdma.remote_addr = c->req.addr;
		wr.wr.rdma.rkey = c->req.rkey;
		/* Same index, another key: an invalid STag (RFC 5040). */
		if (c->req.action == ACT_WRITE_BADSTAG)
			wr.wr.rdma.rkey ^= 0x5a;
		if (ibv_post_send(c->id->qp, &wr, &bad))
			perror("server: post_send");
		break;
	default:
		break;
	}
	return false;
}

static int run_server(const char *bind_ip, int port)
{
	struct rdma_event_channel *ch;
	struct rdma_cm_id *listen_id;
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons(port) };
	struct sconn c = {};
	double idle_since = now();

	if (bind_ip && inet_pton(AF_INET, bind_ip, &sin.sin_addr) != 1) {
		fprintf(stderr, "server: bad address %s\n", bind_ip);
		return 2;
	}
	ch = rdma_create_event_channel();
	if (!ch || rdma_create_id(ch, &listen_id, NULL, RDMA_PS_TCP) ||
	    rdma_bind_addr(listen_id, (struct sockaddr *)&sin) ||
	    rdma_listen(listen_id, 4)) {
		perror("server: listen");
		return 2;
	}
	printf("SERVER LISTENING %d\n", port);
	fflush(stdout);
	for (;;) {
		struct pollfd pfd = { .fd = ch->fd, .events = POLLIN };
		struct rdma_cm_event *ev;
		struct ibv_wc wc[8];
		int n, i;

		if (!c.id && now() - idle_since > timeout_s) {
			printf("SERVER idle for %d s: exiting\n", timeout_s);
			break;
		}
		if (c.cq) {
			n = ibv_poll_cq(c.cq, 8, wc);
			for (i = 0; i < n; i++) {
				vlog("server: wc wr_id %" PRIu64 " status %s\n",
				     wc[i].wr_id, ibv_wc_status_str(wc[i].status));
				if (wc[i].status == IBV_WC_SUCCESS &&
				    wc[i].opcode == IBV_WC_RECV && !c.act_at)
					c.act_at = now() + c.req.delay_ms / 1000.0;
			}
			if (c.act_at > 0 && now() >= c.act_at) {
				c.act_at = -1;
				if (sconn_act(&c))
					idle_since = now();
			}
		}
		if (poll(&pfd, 1, 20) <= 0)
			continue;
		if (rdma_get_cm_event(ch, &ev))
			continue;
		vlog("server: cm event %s\n", rdma_event_str(ev->event));
		switch (ev->event) {
		case RDMA_CM_EVENT_CONNECT_REQUEST:
			if (c.id) {
				rdma_reject(ev->id, NULL, 0);
				rdma_ack_cm_event(ev);
				break;
			}
			{
				struct rdma_cm_event copy = *ev;

				rdma_ack_cm_event(ev);
				sconn_setup(&c, &copy);
			}
			break;
		case RDMA_CM_EVENT_DISCONNECTED:
		case RDMA_CM_EVENT_CONNECT_ERROR:
		case RDMA_CM_EVENT_UNREACHABLE:
		case RDMA_CM_EVENT_REJECTED:
		case RDMA_CM_EVENT_DEVICE_REMOVAL:
			if (ev->id == c.id) {
				c.disconnected = ev->event != RDMA_CM_EVENT_DISCONNECTED;
				rdma_ack_cm_event(ev);
				if (!c.disconnected)
					rdma_disconnect(c.id);
				c.disconnected = true;
				printf("SERVER CLOSED\n");
				fflush(stdout);
				sconn_free(&c, false);
				idle_since = now();
			} else {
				rdma_ack_cm_event(ev);
			}
			break;
		default:
			rdma_ack_cm_event(ev);
			break;
		}
	}
	rdma_destroy_id(listen_id);
	rdma_destroy_event_channel(ch);
	return 0;
}

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

static const struct scenario scenarios[] = {
	{ "local-close", "we rdma_disconnect", ACT_NONE, false, true, false, false, false,
	  0, "LLP_CLOSE_COMPLETE" },
	{ "peer-close", "the server rdma_disconnects", ACT_DISCONNECT, true, false, false, false, false,
	  0, "LLP_CLOSE_COMPLETE" },
	{ "peer-abort", "the server destroys QP and id, connection up (RST)", ACT_ABORT, true, false, false, false, false,
	  0, "QP_FATAL" },
	{ "bad-stag", "the server WRITEs with an invalid STag", ACT_WRITE_BADSTAG, true, false, false, false, false,
	  0, "QP_ACCESS_ERR" },
	{ "bad-wqe", "we post a WRITE with an invalid lkey", ACT_NONE, false, false, true, false, false,
	  0, "QP_REQ_ERR" },
	{ "cq-overflow", "24 signaled WRITEs on a CQ of 4, then we disconnect", ACT_NONE, false, true, false, true, false,
	  0, "CQ_ERR,LLP_CLOSE_COMPLETE" },
	/* Faults from the host (vt3d ctl fault, killing vt3d): --expect overrides. */
	{ "rst", "host: vt3d ctl fault rst", ACT_NONE, false, false, false, false, true,
	  0, "QP_FATAL" },
	{ "fin", "host: vt3d ctl fault fin (peer FIN), we disconnect on DISCONNECTED", ACT_NONE, false, false, false, false, true,
	  0, "LLP_CLOSE_COMPLETE" },
	{ "timeout", "host: blackhole or the peer's vt3d killed", ACT_NONE, false, false, false, false, true,
	  0, "QP_FATAL" },
	{ "terminate", "host: TERMINATE from the peer (--expect by etype)", ACT_NONE, false, false, false, false, true,
	  0, "QP_FATAL" },
	{ "crc", "host: corrupt-crc on the peer, the server SENDs 3 s later", ACT_SEND, true, false, false, false, true,
	  3000, "QP_FATAL" },
	{ "stag", "host: invalidate-stag of our buffer, the server WRITEs 3 s later", ACT_WRITE, true, false, false, false, true,
	  3000, "QP_ACCESS_ERR" },
	{ "device-fatal", "host: our vt3d killed or fault device-fatal", ACT_NONE, false, false, false, false, true,
	  0, "DEVICE_FATAL" },
};

static const char *const styles[] = { "events", "poll", "post", "cq-event", "idle" };

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

static void cfail(struct client *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void cfail(struct client *c, const char *fmt, ...)
{
	va_list ap;
	size_t len = strlen(c->err);

	if (len)
		len += snprintf(c->err + len, sizeof(c->err) - len, "; ");
	if (len >= sizeof(c->err))
		return;
	va_start(ap, fmt);
	vsnprintf(c->err + len, sizeof(c->err) - len, fmt, ap);
	va_end(ap);
}

static struct wrec *wrec_add(struct client *c, enum queue q, enum expect x)
{
	struct wrec *r = &c->wr[c->nwr];

	r->wr_id = 0x1000 * (q + 1) + c->nwr;
	r->q = q;
	r->x = x;
	c->nwr++;
	return r;
}

static int post_recv(struct client *c, enum expect x)
{
	struct wrec *r = wrec_add(c, RQ, x);
	struct ibv_sge sge = { .addr = (uintptr_t)c->buf + (c->nwr % 16) * 1024,
			       .length = 1024, .lkey = c->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = r->wr_id, .sg_list = &sge, .num_sge = 1 }, *bad;
	int ret = ibv_post_recv(c->id->qp, &wr, &bad);

	if (ret) {
		cfail(c, "post_recv: %s", strerror(ret));
		c->nwr--;
	}
	return ret;
}

static int post_send(struct client *c, enum ibv_wr_opcode op, bool signaled,
		     uint32_t lkey, enum expect x)
{
	struct wrec *r = wrec_add(c, SQ, x);
	struct ibv_sge sge = { .addr = (uintptr_t)c->buf + BUF_SIZE / 2,
			       .length = MSG_SIZE, .lkey = lkey };
	struct ibv_send_wr wr = { .wr_id = r->wr_id, .sg_list = &sge, .num_sge = 1,
				  .opcode = op,
				  .send_flags = signaled ? IBV_SEND_SIGNALED : 0 }, *bad;
	int ret;

	if (op == IBV_WR_RDMA_WRITE) {
		wr.wr.rdma.remote_addr = c->peer.addr + 4096;
		wr.wr.rdma.rkey = c->peer.rkey;
	}
	ret = ibv_post_send(c->id->qp, &wr, &bad);
	if (ret) {
		cfail(c, "post_send: %s", strerror(ret));
		c->nwr--;
	}
	return ret;
}

static struct wrec *wrec_find(struct client *c, uint64_t wr_id)
{
	int i;

	for (i = 0; i < c->nwr; i++)
		if (c->wr[i].wr_id == wr_id)
			return &c->wr[i];
	return NULL;
}

static void account(struct client *c, const struct ibv_wc *wc)
{
	struct wrec *r = wrec_find(c, wc->wr_id);
	bool flush = wc->status == IBV_WC_WR_FLUSH_ERR;

	vlog("wc wr_id %#" PRIx64 " %s opcode %d\n", wc->wr_id,
	     ibv_wc_status_str(wc->status), wc->opcode);
	if (!r) {
		cfail(c, "completion of unknown wr_id %#" PRIx64, wc->wr_id);
		return;
	}
	if (r->seen++) {
		cfail(c, "wr_id %#" PRIx64 " completed twice (%s, then %s)", wc->wr_id,
		      ibv_wc_status_str(r->status), ibv_wc_status_str(wc->status));
		return;
	}
	r->status = wc->status;
	if (wc->qp_num != c->qpn)
		cfail(c, "wr_id %#" PRIx64 ": qp_num %u, want %u", wc->wr_id, wc->qp_num, c->qpn);
	if (flush) {
		if (!c->flushed[r->q] && !c->t_first_flush)
			c->t_first_flush = now();
		if (c->flushed[r->q] && wc->wr_id < c->last_flush[r->q])
			cfail(c, "%s flushes out of posting order", r->q == SQ ? "SQ" : "RQ");
		c->flushed[r->q] = true;
		c->last_flush[r->q] = wc->wr_id;
	} else if (c->flushed[r->q]) {
		cfail(c, "wr_id %#" PRIx64 " device completion (%s) after a FLUSH_ERR on the %s",
		      wc->wr_id, ibv_wc_status_str(wc->status), r->q == SQ ? "SQ" : "RQ");
	}
	switch (r->x) {
	case X_FLUSH:
		if (!flush)
			cfail(c, "wr_id %#" PRIx64 ": %s, want WR_FLUSH_ERR", wc->wr_id,
			      ibv_wc_status_str(wc->status));
		break;
	case X_OK_OR_FLUSH:
	case X_MAYBE:
		if (!flush && wc->status != IBV_WC_SUCCESS)
			cfail(c, "wr_id %#" PRIx64 ": %s", wc->wr_id, ibv_wc_status_str(wc->status));
		break;
	case X_ERROR:
		if (flush || wc->status == IBV_WC_SUCCESS)
			cfail(c, "wr_id %#" PRIx64 ": %s, want its own error", wc->wr_id,
			      ibv_wc_status_str(wc->status));
		break;
	case X_UNSIGNALED:
		if (wc->status == IBV_WC_SUCCESS)
			cfail(c, "unsignaled wr_id %#" PRIx64 " completed with %s", wc->wr_id,
			      ibv_wc_status_str(wc->status));
		break;
	}
}

/* Every WR that owes a completion has one. */
static bool all_done(struct client *c)
{
	int i;

	for (i = 0; i < c->nwr; i++)
		if (c->wr[i].x != X_MAYBE && c->wr[i].x != X_UNSIGNALED && !c->wr[i].seen)
			return false;
	return true;
}

static int poll_some(struct client *c)
{
	struct ibv_wc wc[16];
	int n, i, total = 0;

	do {
		n = ibv_poll_cq(c->cq, 16, wc);
		if (n < 0) {
			cfail(c, "ibv_poll_cq: %d", n);
			return n;
		}
		for (i = 0; i < n; i++)
			account(c, &wc[i]);
		total += n;
	} while (n > 0);
	return total;
}

static bool expected_event(struct client *c, int type)
{
	int i;

	for (i = 0; i < c->nexpect; i++)
		if (c->expect[i] == type)
			return true;
	return false;
}

static bool events_complete(struct client *c)
{
	int i, j;

	for (i = 0; i < c->nexpect; i++) {
		for (j = 0; j < c->nev; j++)
			if (c->got_ev[j] == c->expect[i])
				break;
		if (j == c->nev)
			return false;
	}
	return true;
}

/* Reads one async event within ms; checks its element. */
static int read_event(struct client *c, int ms)
{
	struct pollfd pfd = { .fd = c->ctx->async_fd, .events = POLLIN };
	struct ibv_async_event ev;
	int type;

	if (poll(&pfd, 1, ms) <= 0)
		return 0;
	if (ibv_get_async_event(c->ctx, &ev))
		return 0;
	type = ev.event_type;
	vlog("async event %s (%#x)\n", ev_name(type), type);
	if (!c->t_event && expected_event(c, type))
		c->t_event = now();
	switch (type) {
	case EV_LLP_CLOSE_COMPLETE:
	case IBV_EVENT_QP_FATAL:
	case IBV_EVENT_QP_REQ_ERR:
	case IBV_EVENT_QP_ACCESS_ERR:
		if (ev.element.qp != c->id->qp)
			cfail(c, "%s: element.qp %p is not our QP %p", ev_name(type),
			      (void *)ev.element.qp, (void *)c->id->qp);
		break;
	case IBV_EVENT_CQ_ERR:
		if (ev.element.cq != c->cq)
			cfail(c, "CQ_ERR: element.cq %p is not our CQ %p",
			      (void *)ev.element.cq, (void *)c->cq);
		break;
	default:
		break;
	}
	if (c->nev < 8)
		c->got_ev[c->nev++] = type;
	ibv_ack_async_event(&ev);
	return 1;
}

static void *cm_thread(void *arg)
{
	struct client *c = arg;

	while (!c->cm_stop) {
		struct pollfd pfd = { .fd = c->ch->fd, .events = POLLIN };
		struct rdma_cm_event *ev;

		if (poll(&pfd, 1, 50) <= 0)
			continue;
		if (rdma_get_cm_event(c->ch, &ev))
			continue;
		vlog("cm event %s status %d\n", rdma_event_str(ev->event), ev->status);
		if (ev->event == RDMA_CM_EVENT_DISCONNECTED ||
		    ev->event == RDMA_CM_EVENT_DEVICE_REMOVAL) {
			c->cm_disconnected = true;
			/* As every rdma_cm application does: complete the close. */
			rdma_disconnect(c->id);
		}
		rdma_ack_cm_event(ev);
	}
	return NULL;
}

static int cm_wait(struct client *c, enum rdma_cm_event_type want, int ms,
		   struct rdma_cm_event *copy)
{
	struct pollfd pfd = { .fd = c->ch->fd, .events = POLLIN };
	struct rdma_cm_event *ev;

	if (poll(&pfd, 1, ms) <= 0) {
		cfail(c, "no %s within %d ms", rdma_event_str(want), ms);
		return -1;
	}
	if (rdma_get_cm_event(c->ch, &ev)) {
		cfail(c, "rdma_get_cm_event: %s", strerror(errno));
		return -1;
	}
	if (ev->event != want) {
		cfail(c, "%s (status %d), want %s", rdma_event_str(ev->event),
		      ev->status, rdma_event_str(want));
		rdma_ack_cm_event(ev);
		return -1;
	}
	if (copy) {
		*copy = *ev;
		if (ev->param.conn.private_data_len >= sizeof(c->peer))
			memcpy(&c->peer, ev->param.conn.private_data, sizeof(c->peer));
	}
	rdma_ack_cm_event(ev);
	return 0;
}

static bool qp_left_rts(struct client *c)
{
	struct ibv_qp_attr attr;
	struct ibv_qp_init_attr init;

	if (ibv_query_qp(c->id->qp, &attr, IBV_QP_STATE, &init))
		return true;	/* device gone */
	return attr.qp_state == IBV_QPS_ERR || attr.qp_state == IBV_QPS_RESET;
}

/* Waits for the QP to leave RTS without touching its queues. */
static bool wait_error(struct client *c, double until)
{
	while (now() < until) {
		if (qp_left_rts(c))
			return true;
		usleep(20000);
	}
	return false;
}

static int client_connect(struct client *c, const char *server, int port)
{
	struct addrinfo *ai, hints = { .ai_family = AF_INET };
	struct ibv_qp_init_attr attr = {
		.cap = { .max_send_wr = 32, .max_recv_wr = 16,
			 .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};
	struct rdma_conn_param param = { .responder_resources = 1, .initiator_depth = 1,
					 .retry_count = 7 };
	struct req_pd req = { .magic = MAGIC, .action = c->sc->action, .len = BUF_SIZE,
			      .delay_ms = c->sc->delay_ms };
	char portstr[16];
	int i;

	snprintf(portstr, sizeof(portstr), "%d", port);
	if (getaddrinfo(server, portstr, &hints, &ai)) {
		cfail(c, "cannot resolve %s", server);
		return -1;
	}
	c->ch = rdma_create_event_channel();
	if (!c->ch || rdma_create_id(c->ch, &c->id, c, RDMA_PS_TCP)) {
		cfail(c, "rdma_create_id: %s", strerror(errno));
		freeaddrinfo(ai);
		return -1;
	}
	if (rdma_resolve_addr(c->id, NULL, ai->ai_addr, 5000) ||
	    cm_wait(c, RDMA_CM_EVENT_ADDR_RESOLVED, 10000, NULL) ||
	    rdma_resolve_route(c->id, 5000) ||
	    cm_wait(c, RDMA_CM_EVENT_ROUTE_RESOLVED, 10000, NULL)) {
		freeaddrinfo(ai);
		cfail(c, "resolve %s", server);
		return -1;
	}
	freeaddrinfo(ai);
	c->ctx = c->id->verbs;
	c->buf = calloc(1, BUF_SIZE);
	c->pd = ibv_alloc_pd(c->ctx);
	c->cch = ibv_create_comp_channel(c->ctx);
	c->cq = c->cch ? ibv_create_cq(c->ctx, c->sc->overflow ? CQ_SMALL : CQ_DEPTH,
				       NULL, c->cch, 0) : NULL;
	c->mr = c->pd ? ibv_reg_mr(c->pd, c->buf, BUF_SIZE, IBV_ACCESS_LOCAL_WRITE |
				   IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ) : NULL;
	attr.send_cq = attr.recv_cq = c->cq;
	if (!c->pd || !c->cq || !c->mr) {
		cfail(c, "verbs setup: %s", strerror(errno));
		return -1;
	}
	if (decoy) {
		struct ibv_qp_init_attr dattr = attr;

		spread_on = true;
		c->decoy = ibv_create_qp(c->pd, &dattr);
		spread_on = false;
		if (!c->decoy) {
			cfail(c, "the decoy QP: %s", strerror(errno));
			return -1;
		}
	}
	spread_on = decoy;
	i = rdma_create_qp(c->id, c->pd, &attr);
	spread_on = false;
	if (i) {
		cfail(c, "rdma_create_qp: %s", strerror(errno));
		return -1;
	}
	if (decoy)
		vlog("decoy QP %u at %p, test QP %u at %p: low 32 bits %s\n", c->decoy->qp_num,
		     (void *)c->decoy, c->id->qp->qp_num, (void *)c->id->qp,
		     (uint32_t)(uintptr_t)c->decoy == (uint32_t)(uintptr_t)c->id->qp ? "equal" : "differ");
	if (!strcmp(c->style, "cq-event") && ibv_req_notify_cq(c->cq, 0)) {
		cfail(c, "ibv_req_notify_cq");
		return -1;
	}
	/* Receives from INIT on: they wait for a SEND that never comes. */
	for (i = 0; i < N_RECV; i++)
		if (post_recv(c, c->sc->action == ACT_SEND ? X_OK_OR_FLUSH : X_FLUSH))
			return -1;
	req.addr = (uintptr_t)c->buf;
	req.rkey = c->mr->rkey;
	param.private_data = &req;
	param.private_data_len = sizeof(req);
	if (rdma_connect(c->id, &param)) {
		cfail(c, "rdma_connect: %s", strerror(errno));
		return -1;
	}
	{
		struct rdma_cm_event copy;

		if (cm_wait(c, RDMA_CM_EVENT_ESTABLISHED, 30000, &copy))
			return -1;
	}
	c->qpn = c->id->qp->qp_num;
	if (c->peer.magic != MAGIC) {
		cfail(c, "the server sent no buffer (not vt3-flushtest server?)");
		return -1;
	}
	return 0;
}

static void client_post_work(struct client *c)
{
	int i;

	for (i = 0; i < N_WRITE; i++)
		post_send(c, IBV_WR_RDMA_WRITE, true, c->mr->lkey, X_OK_OR_FLUSH);
	post_send(c, IBV_WR_RDMA_WRITE, false, c->mr->lkey, X_UNSIGNALED);
	if (c->sc->overflow)
		for (i = 0; i < N_OVERFLOW; i++)
			post_send(c, IBV_WR_RDMA_WRITE, true, c->mr->lkey, X_MAYBE);
	if (c->sc->bad_wqe) {
		/* Its own error completion, then everything after it flushed. */
		c->t_fault = now();
		post_send(c, IBV_WR_RDMA_WRITE, true, c->mr->lkey ^ 0x5a00, X_ERROR);
		post_send(c, IBV_WR_RDMA_WRITE, true, c->mr->lkey, X_OK_OR_FLUSH);
	}
}

/* Runs the style until every WR is accounted for or the time is up. */
static void client_reap(struct client *c, double until)
{
	const char *s = c->style;

	if (!strcmp(s, "events")) {
		while (!events_complete(c) && now() < until)
			read_event(c, 100);
		if (!events_complete(c))
			cfail(c, "expected events did not all arrive");
		/* The flush was noted when the event was read: all there now. */
		poll_some(c);
		if (!all_done(c)) {
			double t = now();

			while (!all_done(c) && now() < t + 2)
				poll_some(c);
			if (all_done(c))
				cfail(c, "completions came only %.3f s after the event",
				      now() - t);
		}
	} else if (!strcmp(s, "poll")) {
		while (!all_done(c) && now() < until) {
			if (!poll_some(c))
				usleep(1000);
		}
	} else if (!strcmp(s, "post")) {
		if (!wait_error(c, until)) {
			cfail(c, "QP still RTS after %d s", timeout_s);
			return;
		}
		post_recv(c, X_FLUSH);
		post_send(c, IBV_WR_RDMA_WRITE, true, c->mr->lkey, X_FLUSH);
		/* A WR that completes in error always completes (ibv_post_send(3)). */
		post_send(c, IBV_WR_RDMA_WRITE, false, c->mr->lkey, X_FLUSH);
		while (!all_done(c) && now() < until) {
			if (!poll_some(c))
				usleep(1000);
		}
	} else if (!strcmp(s, "cq-event")) {
		while (!all_done(c) && now() < until) {
			struct pollfd pfd = { .fd = c->cch->fd, .events = POLLIN };
			struct ibv_cq *ecq;
			void *ectx;
			int ms = (int)((until - now()) * 1000);

			if (poll(&pfd, 1, ms > 0 ? ms : 0) <= 0) {
				cfail(c, "ibv_get_cq_event did not wake");
				break;
			}
			if (ibv_get_cq_event(c->cch, &ecq, &ectx)) {
				cfail(c, "ibv_get_cq_event: %s", strerror(errno));
				break;
			}
			c->cq_events_unacked++;
			vlog("cq event\n");
			if (ibv_req_notify_cq(c->cq, 0))
				cfail(c, "re-arm failed");
			poll_some(c);
		}
	} else if (!strcmp(s, "idle")) {
		if (!wait_error(c, until))
			cfail(c, "QP still RTS after %d s", timeout_s);
		/* Let vt3.ko's events queue up unread. */
		usleep(500000);
	}
	if (strcmp(s, "idle") && strcmp(s, "events")) {
		/* The events this style did not wait for must be there too. */
		double t = now();

		while (!events_complete(c) && now() < t + 5)
			read_event(c, 100);
		if (!events_complete(c))
			cfail(c, "expected events did not all arrive");
	}
}

struct destroy_arg {
	struct rdma_cm_id *id;
	volatile bool done;
};

static void *destroy_thread(void *arg)
{
	struct destroy_arg *d = arg;

	rdma_destroy_qp(d->id);
	d->done = true;
	return NULL;
}

/* ibv_destroy_qp under a watchdog: a hang is a failure, not a stuck test. */
static void destroy_qp_bounded(struct client *c)
{
	static struct destroy_arg d;
	pthread_t t;
	double until = now() + 20;

	d.id = c->id;
	d.done = false;
	pthread_create(&t, NULL, destroy_thread, &d);
	while (!d.done && now() < until)
		usleep(10000);
	if (!d.done) {
		printf("%-13s %-9s FAIL: ibv_destroy_qp hangs (20 s)\n", c->sc->name, c->style);
		fflush(stdout);
		_exit(1);
	}
	pthread_join(t, NULL);
	c->qp_destroyed = true;
}

static void *destroy_decoy_thread(void *arg)
{
	struct client *c = arg;

	if (ibv_destroy_qp(c->decoy))
		cfail(c, "ibv_destroy_qp of the decoy: %s", strerror(errno));
	return NULL;
}

/* The decoy goes after the test QP, under the same watchdog. */
static void destroy_decoy_bounded(struct client *c)
{
	static volatile bool done;
	pthread_t t;
	double until = now() + 20;

	done = false;
	if (pthread_create(&t, NULL, destroy_decoy_thread, c)) {
		cfail(c, "no thread for the decoy's destroy");
		return;
	}
	while (pthread_tryjoin_np(t, NULL) && !(done = now() >= until))
		usleep(10000);
	if (done) {
		printf("%-13s %-9s FAIL: ibv_destroy_qp of the decoy QP hangs (20 s)\n", c->sc->name, c->style);
		fflush(stdout);
		_exit(1);
	}
	c->decoy = NULL;
}

/* Before the QP goes: the thread may call rdma_disconnect() on it. */
static void stop_cm(struct client *c)
{
	if (!c->cm_running)
		return;
	c->cm_stop = true;
	pthread_join(c->cm_thread, NULL);
	c->cm_running = false;
}

static void client_teardown(struct client *c)
{
	stop_cm(c);
	if (c->id && c->id->qp)
		destroy_qp_bounded(c);
	if (c->decoy)
		destroy_decoy_bounded(c);
	if (c->cq_events_unacked)
		ibv_ack_cq_events(c->cq, c->cq_events_unacked);
	if (c->id)
		rdma_destroy_id(c->id);
	if (c->mr)
		ibv_dereg_mr(c->mr);
	if (c->cq && ibv_destroy_cq(c->cq))
		cfail(c, "ibv_destroy_cq failed");
	if (c->cch)
		ibv_destroy_comp_channel(c->cch);
	if (c->pd)
		ibv_dealloc_pd(c->pd);
	if (c->ch)
		rdma_destroy_event_channel(c->ch);
	free(c->buf);
}

static void summary(struct client *c, char *out, size_t len)
{
	int ok = 0, flush = 0, err = 0, lost = 0, i;
	size_t n;

	for (i = 0; i < c->nwr; i++) {
		if (!c->wr[i].seen)
			lost += c->wr[i].x != X_UNSIGNALED;
		else if (c->wr[i].status == IBV_WC_SUCCESS)
			ok++;
		else if (c->wr[i].status == IBV_WC_WR_FLUSH_ERR)
			flush++;
		else
			err++;
	}
	n = snprintf(out, len, "%d WRs: %d ok, %d flushed, %d error, %d none; events", c->nwr,
		     ok, flush, err, lost);
	for (i = 0; i < c->nev && n < len; i++)
		n += snprintf(out + n, len - n, " %s", ev_name(c->got_ev[i]));
	if (!c->nev && n < len)
		n += snprintf(out + n, len - n, " -");
	/* Only the events style waits for the event as it comes. */
	if (c->t_event && !strcmp(c->style, "events") && n < len)
		n += snprintf(out + n, len - n, "; event %.3f s after %s", c->t_event - c->t_fault,
			      c->sc->go ? "the server acted" : c->sc->host ? "READY" : "the fault");
}

/* "EV,EV" (or "none") into c->expect; -1 on an unknown name. */
static int parse_events(struct client *c, const char *list)
{
	char *copy = strdup(list), *tok, *save;
	int e, ret = 0;

	c->nexpect = 0;
	for (tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		e = ev_parse(tok);
		if (e == -1) {
			fprintf(stderr, "unknown event %s\n", tok);
			ret = -1;
			break;
		}
		if (e != -2 && c->nexpect < 4)
			c->expect[c->nexpect++] = e;
	}
	free(copy);
	return ret;
}

/* The flush trigger a style relies on (idle: any, it reaps nothing). */
static const char *trigger_of(const char *style)
{
	if (!strcmp(style, "events"))
		return "event";
	if (!strcmp(style, "post"))
		return "post";
	if (!strcmp(style, "idle"))
		return "event,poll,post";
	return "poll";
}

/*
 * After ibv_destroy_qp() returned, the CQ holds nothing of the QP: no
 * device completion, no flush (DESIGN.md section 5).
 */
static void drain_after_destroy(struct client *c)
{
	struct ibv_wc wc[16];
	double until = now() + 0.5;
	int n, i;

	while (now() < until) {
		n = ibv_poll_cq(c->cq, 16, wc);
		if (n < 0) {
			cfail(c, "ibv_poll_cq after destroy: %d", n);
			return;
		}
		for (i = 0; i < n; i++)
			cfail(c, "wr_id %#" PRIx64 " (%s) completed after ibv_destroy_qp returned",
			      wc[i].wr_id, ibv_wc_status_str(wc[i].status));
		if (!n)
			usleep(10000);
	}
}

static bool run_client_one(const struct scenario *sc, const char *style,
			   const char *expect, const char *server, int port,
			   double grace)
{
	struct client *c = calloc(1, sizeof(*c));
	char sum[256];
	double until;
	bool pass;

	c->sc = sc;
	c->style = style;
	/*
	 * libvt3 notes a flush on the first of three triggers (an async
	 * event, a poll, a post); each style may use only its own, so a
	 * broken trigger fails its style instead of hiding behind another.
	 * Other providers ignore the variable.
	 */
	setenv("VT3_FLUSH_TRIGGERS", trigger_of(style), 1);
	parse_events(c, expect ? expect : sc->events);
	/* Idle reads no events: nothing to expect there. */
	if (!strcmp(style, "idle"))
		c->nexpect = 0;

	if (client_connect(c, server, port))
		goto out;
	client_post_work(c);
	if (c->err[0])
		goto out;
	/* Let the WRITEs land (their CQEs wait in the CQ: device before flush). */
	usleep(grace * 1e6);
	c->cm_running = !pthread_create(&c->cm_thread, NULL, cm_thread, c);
	printf("READY %u %u %#x %s %s\n", c->id->qp->qp_num, c->peer.qpn, c->mr->rkey,
	       sc->name, style);
	fflush(stdout);
	if (!sc->bad_wqe)
		c->t_fault = now();
	/* The server acts on our "go" (after the delay we asked for). */
	if (sc->go) {
		post_send(c, IBV_WR_SEND, true, c->mr->lkey, X_OK_OR_FLUSH);
		c->t_fault = now() + sc->delay_ms / 1000.0;
	}
	if (sc->local_close && !sc->overflow)
		rdma_disconnect(c->id);
	if (sc->overflow) {
		/* The CQ overflowed by now; end the connection ourselves. */
		usleep(1000000);
		c->t_fault = now();
		rdma_disconnect(c->id);
	}
	until = now() + timeout_s;
	client_reap(c, until);
	if (strcmp(style, "idle") && !all_done(c))
		cfail(c, "not every WR completed within %d s", timeout_s);
out:
	stop_cm(c);
	if (c->id && c->id->qp) {
		destroy_qp_bounded(c);
		drain_after_destroy(c);
	}
	client_teardown(c);
	summary(c, sum, sizeof(sum));
	pass = !c->err[0];
	printf("%-13s %-9s %s: %s%s%s\n", sc->name, style, pass ? "ok" : "FAIL", sum,
	       pass ? "" : " -- ", c->err);
	fflush(stdout);
	free(c);
	return pass;
}

static const struct scenario *find_scenario(const char *name)
{
	unsigned int i;

	for (i = 0; i < sizeof(scenarios) / sizeof(scenarios[0]); i++)
		if (!strcmp(scenarios[i].name, name))
			return &scenarios[i];
	return NULL;
}

static bool valid_style(const char *s)
{
	unsigned int i;

	for (i = 0; i < sizeof(styles) / sizeof(styles[0]); i++)
		if (!strcmp(styles[i], s))
			return true;
	return false;
}

static void usage(void)
{
	unsigned int i;

	fprintf(stderr,
		"usage: vt3-flushtest server [--port P] [--bind IP] [--timeout S] [-v]\n"
		"       vt3-flushtest client --server IP [--port P] --scenario S[,S..] --style Y[,Y..]\n"
		"                     [--timeout S] [--grace S] [--expect EV[,EV..]|none] [--decoy-qp] [-v]\n"
		"       vt3-flushtest list\n"
		"styles: events poll post cq-event idle\nscenarios:\n");
	for (i = 0; i < sizeof(scenarios) / sizeof(scenarios[0]); i++)
		fprintf(stderr, "  %-13s %s\n", scenarios[i].name, scenarios[i].what);
	fprintf(stderr, "events: LLP_CLOSE_COMPLETE QP_FATAL QP_REQ_ERR QP_ACCESS_ERR CQ_ERR DEVICE_FATAL\n");
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "port", required_argument, NULL, 'p' },
		{ "bind", required_argument, NULL, 'b' },
		{ "server", required_argument, NULL, 's' },
		{ "scenario", required_argument, NULL, 'S' },
		{ "style", required_argument, NULL, 'Y' },
		{ "timeout", required_argument, NULL, 't' },
		{ "grace", required_argument, NULL, 'g' },
		{ "expect", required_argument, NULL, 'e' },
		{ "verbose", no_argument, NULL, 'v' },
		{ "decoy-qp", no_argument, NULL, 'D' },
		{}
	};
	const char *role, *bind_ip = NULL, *server = NULL;
	char *scen_list = NULL, *style_list = NULL, *expect_list = NULL;
	int port = 7471, passed = 0, failed = 0, opt;
	double grace = 0.5;
	char *s, *save, *sc_tok, *sc_save;

	if (argc < 2) {
		usage();
		return 2;
	}
	role = argv[1];
	if (!strcmp(role, "list")) {
		usage();
		return 0;
	}
	optind = 2;
	while ((opt = getopt_long(argc, argv, "p:b:s:S:Y:t:g:e:vD", opts, NULL)) != -1) {
		switch (opt) {
		case 'p': port = atoi(optarg); break;
		case 'b': bind_ip = optarg; break;
		case 's': server = optarg; break;
		case 'S': scen_list = strdup(optarg); break;
		case 'Y': style_list = strdup(optarg); break;
		case 't': timeout_s = atoi(optarg); break;
		case 'g': grace = atof(optarg); break;
		case 'e': expect_list = strdup(optarg); break;
		case 'v': verbose = 1; break;
		case 'D': decoy = true; break;
		default: usage(); return 2;
		}
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (!strcmp(role, "server"))
		return run_server(bind_ip, port);
	if (strcmp(role, "client") || !server || !scen_list || !style_list) {
		usage();
		return 2;
	}
	if (expect_list) {
		struct client probe = {};

		if (parse_events(&probe, expect_list))
			return 2;
	}
	for (sc_tok = strtok_r(scen_list, ",", &sc_save); sc_tok;
	     sc_tok = strtok_r(NULL, ",", &sc_save)) {
		const struct scenario *sc = find_scenario(sc_tok);
		char *styles_copy = strdup(style_list);

		if (!sc) {
			fprintf(stderr, "unknown scenario %s\n", sc_tok);
			return 2;
		}
		for (s = strtok_r(styles_copy, ",", &save); s; s = strtok_r(NULL, ",", &save)) {
			if (!valid_style(s)) {
				fprintf(stderr, "unknown style %s\n", s);
				return 2;
			}
			if (run_client_one(sc, s, expect_list, server, port, grace))
				passed++;
			else
				failed++;
		}
		free(styles_copy);
	}
	printf("vt3-flushtest: %d passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}
