// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
/*
 * wr-check: an rdma_cm program of the kind a ULP's test suite runs. A
 * client streams RDMA WRITEs into a server's buffer (its address and key
 * come with the server's accept), while the server keeps receives posted,
 * until the connection ends; then each side reports how many work
 * requests it posted, how many came back and how, and which events it
 * saw. (WRITEs, not SENDs: iWARP has no receiver-not-ready retry, so a
 * SEND stream needs credits, which a ULP has and this example does not.)
 *
 *   wr-check server PORT
 *   wr-check client ADDR PORT
 *
 * The client prints "FLOWING" once 200 WRITEs completed; both, at the end:
 *
 *   RESULT role=R posted=P completed=C ok=O flushed=F other=E
 *          duplicates=D cm_event=NAME async_event=NAME
 *
 * Exit status: 0 when every WR came back exactly once, 1 when one was
 * lost or came back twice, 2 when the connection could not be set up.
 */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#define DEPTH 64
#define MSG 4096
#define FLOWING_AFTER 200
/* Once the connection ended (one of its two events), the other event and
 * every flushed WR must be back by then. */
#define DRAIN_SECONDS 30
#define RUN_SECONDS 300

/* The server's buffer, in its accept's private data. */
struct remote {
	uint64_t addr;
	uint32_t rkey;
} __attribute__((packed));

struct state {
	const char *role;
	struct rdma_cm_id *id;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	char *buf;
	int client;
	struct remote peer; /* client: where its WRITEs go */
	uint64_t posted, completed, ok, flushed, other, duplicates;
	uint8_t *seen; /* completions per wr_id */
	uint64_t seen_len;
	const char *cm_event, *async_event;
	/* The connection's end reaches us twice, in either order: the CM's
	 * DISCONNECTED and the QP's error event. */
	int cm_ended, qp_ended;
};

static void die(const char *what)
{
	fprintf(stderr, "wr-check: %s: %s\n", what, strerror(errno));
	exit(2);
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static struct rdma_cm_event *expect(struct rdma_event_channel *ch, enum rdma_cm_event_type want)
{
	struct rdma_cm_event *ev;

	if (rdma_get_cm_event(ch, &ev))
		die("rdma_get_cm_event");
	if (ev->event != want) {
		fprintf(stderr, "wr-check: got %s (status %d), wanted %s\n", rdma_event_str(ev->event), ev->status,
			rdma_event_str(want));
		exit(2);
	}
	return ev;
}

static void set_nonblocking(int fd)
{
	if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK))
		die("fcntl");
}

/* Posts the next WR: a SEND (client) or a receive (server) of one slot. */
static int post_one(struct state *s)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)(s->buf + (s->posted % DEPTH) * MSG),
		.length = MSG,
		.lkey = s->mr->lkey,
	};
	int rc;

	if (s->posted == s->seen_len) {
		s->seen_len = s->seen_len ? 2 * s->seen_len : 4096;
		s->seen = realloc(s->seen, s->seen_len);
		if (!s->seen)
			die("realloc");
		memset(s->seen + s->posted, 0, s->seen_len - s->posted);
	}
	if (s->client) {
		struct ibv_send_wr wr = { .wr_id = s->posted, .sg_list = &sge, .num_sge = 1,
					  .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
					  .wr.rdma = { .remote_addr = s->peer.addr + (s->posted % DEPTH) * MSG,
						       .rkey = s->peer.rkey } };
		struct ibv_send_wr *bad;

		rc = ibv_post_send(s->id->qp, &wr, &bad);
	} else {
		struct ibv_recv_wr wr = { .wr_id = s->posted, .sg_list = &sge, .num_sge = 1 };
		struct ibv_recv_wr *bad;

		rc = ibv_post_recv(s->id->qp, &wr, &bad);
	}
	if (rc == 0)
		s->posted++;
	return rc;
}

static int poll_completions(struct state *s)
{
	struct ibv_wc wc[32];
	int n = ibv_poll_cq(s->cq, 32, wc);

	if (n < 0) {
		fprintf(stderr, "wr-check: ibv_poll_cq failed\n");
		exit(2);
	}
	for (int i = 0; i < n; i++) {
		uint64_t id = wc[i].wr_id;

		if (id >= s->posted) {
			fprintf(stderr, "wr-check: completion of wr_id %llu, never posted\n", (unsigned long long)id);
			s->other++;
			continue;
		}
		if (s->seen[id]++) {
			s->duplicates++;
			continue;
		}
		s->completed++;
		if (wc[i].status == IBV_WC_SUCCESS)
			s->ok++;
		else if (wc[i].status == IBV_WC_WR_FLUSH_ERR)
			s->flushed++;
		else
			s->other++;
		/* Keep the queue full while the connection is up. */
		if (wc[i].status == IBV_WC_SUCCESS && !s->cm_ended && !s->qp_ended)
			post_one(s);
	}
	return n;
}

/* The QP's error events by their verbs names (ibv_event_type_str has spaces). */
static const char *async_name(enum ibv_event_type type)
{
	static char other[32];

	switch (type) {
	case IBV_EVENT_QP_FATAL:
		return "QP_FATAL";
	case IBV_EVENT_QP_REQ_ERR:
		return "QP_REQ_ERR";
	case IBV_EVENT_QP_ACCESS_ERR:
		return "QP_ACCESS_ERR";
	case IBV_EVENT_DEVICE_FATAL:
		return "DEVICE_FATAL";
	case IBV_EVENT_CQ_ERR:
		return "CQ_ERR";
	default:
		snprintf(other, sizeof(other), "EVENT_%#x", (unsigned int)type);
		return other;
	}
}

static int poll_events(struct state *s, struct rdma_event_channel *ch)
{
	struct rdma_cm_event *ev;
	struct ibv_async_event aev;
	int got = 0;

	while (rdma_get_cm_event(ch, &ev) == 0) {
		if (!strcmp(s->cm_event, "none"))
			s->cm_event = rdma_event_str(ev->event);
		if (ev->event == RDMA_CM_EVENT_DISCONNECTED || ev->event == RDMA_CM_EVENT_DEVICE_REMOVAL)
			s->cm_ended = 1;
		rdma_ack_cm_event(ev);
		got = 1;
	}
	while (ibv_get_async_event(s->id->verbs, &aev) == 0) {
		if (!strcmp(s->async_event, "none"))
			s->async_event = async_name(aev.event_type);
		s->qp_ended = 1;
		ibv_ack_async_event(&aev);
		got = 1;
	}
	return got;
}

static void setup_qp(struct state *s)
{
	struct ibv_qp_init_attr attr = {
		.cap = { .max_send_wr = DEPTH, .max_recv_wr = DEPTH, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};

	s->pd = ibv_alloc_pd(s->id->verbs);
	s->cq = s->pd ? ibv_create_cq(s->id->verbs, 2 * DEPTH, NULL, NULL, 0) : NULL;
	if (!s->cq)
		die("ibv_alloc_pd/ibv_create_cq");
	attr.send_cq = attr.recv_cq = s->cq;
	if (rdma_create_qp(s->id, s->pd, &attr))
		die("rdma_create_qp");
	s->buf = calloc(DEPTH, MSG);
	s->mr = s->buf ? ibv_reg_mr(s->pd, s->buf, DEPTH * MSG, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)
		       : NULL;
	if (!s->mr)
		die("ibv_reg_mr");
}

int main(int argc, char **argv)
{
	struct state s = { .cm_event = "none", .async_event = "none" };
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_conn_param param = { .initiator_depth = 1, .responder_resources = 1, .retry_count = 7 };
	struct rdma_cm_id *listener = NULL;
	struct rdma_cm_event *ev;
	int flowing = 0;
	double deadline, drained_by = 0;

	if (argc < 3 || (strcmp(argv[1], "server") && strcmp(argv[1], "client")) ||
	    (!strcmp(argv[1], "client") && argc < 4)) {
		fprintf(stderr, "usage: wr-check server PORT | wr-check client ADDR PORT\n");
		return 2;
	}
	if (!ch)
		die("rdma_create_event_channel");
	s.client = !strcmp(argv[1], "client");
	s.role = argv[1];
	if (s.client) {
		struct addrinfo *ai;

		if (getaddrinfo(argv[2], argv[3], NULL, &ai))
			die("getaddrinfo");
		if (rdma_create_id(ch, &s.id, NULL, RDMA_PS_TCP) || rdma_resolve_addr(s.id, NULL, ai->ai_addr, 5000))
			die("rdma_resolve_addr");
		freeaddrinfo(ai);
		rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED));
		if (rdma_resolve_route(s.id, 5000))
			die("rdma_resolve_route");
		rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED));
		setup_qp(&s);
		if (rdma_connect(s.id, &param))
			die("rdma_connect");
		ev = expect(ch, RDMA_CM_EVENT_ESTABLISHED);
		if (ev->param.conn.private_data_len < sizeof(s.peer)) {
			fprintf(stderr, "wr-check: the server sent no buffer (%u octets of private data)\n",
				ev->param.conn.private_data_len);
			return 2;
		}
		memcpy(&s.peer, ev->param.conn.private_data, sizeof(s.peer));
		rdma_ack_cm_event(ev);
	} else {
		struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons(atoi(argv[2])) };

		if (rdma_create_id(ch, &listener, NULL, RDMA_PS_TCP) ||
		    rdma_bind_addr(listener, (struct sockaddr *)&sin) || rdma_listen(listener, 1))
			die("rdma_listen");
		printf("LISTENING\n");
		fflush(stdout);
		ev = expect(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
		s.id = ev->id;
		rdma_ack_cm_event(ev);
		setup_qp(&s);
		while (s.posted < DEPTH)
			if (post_one(&s))
				die("ibv_post_recv");
		struct remote mine = { .addr = (uintptr_t)s.buf, .rkey = s.mr->rkey };

		param.private_data = &mine;
		param.private_data_len = sizeof(mine);
		if (rdma_accept(s.id, &param))
			die("rdma_accept");
		rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ESTABLISHED));
	}
	set_nonblocking(ch->fd);
	set_nonblocking(s.id->verbs->async_fd);
	if (s.client)
		while (s.posted < DEPTH)
			if (post_one(&s))
				die("ibv_post_send");

	deadline = now() + RUN_SECONDS;
	while (now() < deadline) {
		int busy = poll_completions(&s) | poll_events(&s, ch);

		if (s.client && !flowing && s.ok >= FLOWING_AFTER) {
			flowing = 1;
			printf("FLOWING\n");
			fflush(stdout);
		}
		if ((s.cm_ended || s.qp_ended) && !drained_by)
			drained_by = now() + DRAIN_SECONDS;
		if (s.cm_ended && s.qp_ended && s.completed == s.posted)
			break;
		if (drained_by && now() > drained_by)
			break;
		if (!busy)
			usleep(1000);
	}
	printf("RESULT role=%s posted=%llu completed=%llu ok=%llu flushed=%llu other=%llu duplicates=%llu "
	       "cm_event=%s async_event=%s\n",
	       s.role, (unsigned long long)s.posted, (unsigned long long)s.completed, (unsigned long long)s.ok,
	       (unsigned long long)s.flushed, (unsigned long long)s.other, (unsigned long long)s.duplicates,
	       s.cm_event, s.async_event);
	fflush(stdout);
	if (s.completed != s.posted)
		fprintf(stderr, "wr-check: not every WR completed: %llu of %llu\n", (unsigned long long)s.completed,
			(unsigned long long)s.posted);
	rdma_disconnect(s.id);
	rdma_destroy_qp(s.id);
	ibv_dereg_mr(s.mr);
	ibv_destroy_cq(s.cq);
	ibv_dealloc_pd(s.pd);
	rdma_destroy_id(s.id);
	if (listener)
		rdma_destroy_id(listener);
	rdma_destroy_event_channel(ch);
	free(s.buf);
	free(s.seen);
	return s.completed == s.posted && !s.duplicates ? 0 : 1;
}
