// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
/*
 * vt3-flushtest: close, fault and flush conformance over a real connection
 * (docs/architecture.md §5, docs/events.md). librdmacm + libibverbs.
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
#include "vt3-flushtest.h"

int verbose;
int timeout_s = 60;
bool decoy;

double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

void vlog(const char *fmt, ...)
{
	va_list ap;

	if (!verbose)
		return;
	va_start(ap, fmt);
	fprintf(stderr, "  [%.3f] ", now());
	vfprintf(stderr, fmt, ap);
	va_end(ap);
}

const char *ev_name(int type)
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

int ev_parse(const char *s)
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
 * device completion, no flush (docs/architecture.md §5).
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
