/* SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB */
/*
 * Two RC QPs of one device connected by ibv_modify_qp alone (RTR naming
 * the other's QPN, then RTS), vt3's extension (docs/modify-connect.md):
 * each side in a user context of its own (as rdma-core's tests/ make
 * them), and the polling of completions and async events the programs
 * that pair them share. Include after vt3-check.h.
 */
#ifndef VT3_MODIFY_PAIR_H
#define VT3_MODIFY_PAIR_H

#include <fcntl.h>
#include <getopt.h>
#include <poll.h>
#include <stdint.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#define PORT		1
/* Each side's buffer, page-aligned, registered for local and remote access. */
#define SIDE_BUF_SIZE	8192
/* After an async event: how long a second one is waited for. */
#define QUIET_MS	500

/* One QP and what it needs, in a user context of its own. */
struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	struct ibv_qp *qp;
	char *buf;
};

static const char *dev_name;
static int timeout_s = 30;

/*
 * The options every such program takes, [--dev NAME] [--timeout S]; a
 * usage line and exit status 2 on anything else. Output line-buffered.
 */
static inline void pair_options(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "dev", required_argument, NULL, 'd' },
		{ "timeout", required_argument, NULL, 't' },
		{}
	};
	int c;

	while ((c = getopt_long(argc, argv, "d:t:", opts, NULL)) != -1) {
		switch (c) {
		case 'd':
			dev_name = optarg;
			break;
		case 't':
			timeout_s = atoi(optarg);
			break;
		default:
			fprintf(stderr, "usage: " VT3_CHECK_PROG " [--dev NAME] [--timeout S]\n");
			exit(2);
		}
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
}

static inline long long now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
}

static inline struct ibv_context *open_device(void)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_context *ctx = NULL;
	int i;

	if (!list)
		die("ibv_get_device_list");
	for (i = 0; list[i] && !ctx; i++)
		if (!dev_name || !strcmp(ibv_get_device_name(list[i]), dev_name))
			ctx = ibv_open_device(list[i]);
	ibv_free_device_list(list);
	if (!ctx)
		die("no such device");
	return ctx;
}

static inline int to_init(struct ibv_qp *qp)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = PORT,
				 .qp_access_flags = IBV_ACCESS_REMOTE_WRITE |
						    IBV_ACCESS_REMOTE_READ };

	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
			     IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

/* INIT -> RTR naming @dest, as ibv_rc_pingpong does (GRH with @dgid if set). */
static inline int to_rtr(struct ibv_qp *qp, uint32_t dest, const union ibv_gid *dgid)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_RTR,
		.path_mtu = IBV_MTU_1024,
		.dest_qp_num = dest,
		.max_dest_rd_atomic = 1,
		.min_rnr_timer = 12,
		.ah_attr = { .port_num = PORT },
	};

	if (dgid) {
		a.ah_attr.is_global = 1;
		a.ah_attr.grh.dgid = *dgid;
		a.ah_attr.grh.hop_limit = 1;
	}
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
			     IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
			     IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
}

static inline int to_rts(struct ibv_qp *qp)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_RTS, .timeout = 14,
				 .retry_cnt = 7, .rnr_retry = 7,
				 .max_rd_atomic = 1 };

	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT |
			     IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
			     IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

/* INIT, RTR naming @dest (no GRH), RTS; 0 or the first step's errno. */
static inline int pair_with(struct ibv_qp *qp, uint32_t dest)
{
	int ret = to_init(qp);

	if (!ret)
		ret = to_rtr(qp, dest, NULL);
	if (!ret)
		ret = to_rts(qp);
	return ret;
}

static inline int to_state(struct ibv_qp *qp, enum ibv_qp_state state)
{
	struct ibv_qp_attr a = { .qp_state = state };

	return ibv_modify_qp(qp, &a, IBV_QP_STATE);
}

static inline int qp_state(struct ibv_qp *qp)
{
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr init;

	if (ibv_query_qp(qp, &a, IBV_QP_STATE, &init))
		return -errno;
	return a.qp_state;
}

/*
 * Polls @cq for up to @ms for one completion; 1 with *@wc filled, 0 if
 * none came.
 */
static inline int poll_one(struct ibv_cq *cq, struct ibv_wc *wc, int ms)
{
	long long end = now_ms() + ms;
	int n;

	do {
		n = ibv_poll_cq(cq, 1, wc);
		if (n)
			return n < 0 ? 0 : 1;
		usleep(1000);
	} while (now_ms() < end);
	return 0;
}

static inline void side_qp(struct side *s)
{
	struct ibv_qp_init_attr attr = {
		.send_cq = s->cq,
		.recv_cq = s->cq,
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16,
			 .max_send_sge = 1, .max_recv_sge = 1 },
	};

	s->qp = ibv_create_qp(s->pd, &attr);
	if (!s->qp)
		die("ibv_create_qp");
}

/* A zeroed, page-aligned buffer of SIDE_BUF_SIZE. */
static inline char *page_buffer(void)
{
	void *p;

	if (posix_memalign(&p, 4096, SIDE_BUF_SIZE))
		die("posix_memalign");
	memset(p, 0, SIDE_BUF_SIZE);
	return p;
}

static inline void side_open(struct side *s)
{
	s->ctx = open_device();
	s->pd = ibv_alloc_pd(s->ctx);
	s->cq = s->pd ? ibv_create_cq(s->ctx, 64, NULL, NULL, 0) : NULL;
	if (!s->cq)
		die("PD/CQ");
	s->buf = page_buffer();
	s->mr = ibv_reg_mr(s->pd, s->buf, SIDE_BUF_SIZE, IBV_ACCESS_LOCAL_WRITE |
			   IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	if (!s->mr)
		die("ibv_reg_mr");
	/* Events are waited for with poll(). */
	if (fcntl(s->ctx->async_fd, F_SETFL,
		  fcntl(s->ctx->async_fd, F_GETFL) | O_NONBLOCK))
		die("O_NONBLOCK");
	side_qp(s);
}

static inline void side_close(struct side *s)
{
	if (s->qp)
		ibv_destroy_qp(s->qp);
	ibv_dereg_mr(s->mr);
	ibv_destroy_cq(s->cq);
	ibv_dealloc_pd(s->pd);
	ibv_close_device(s->ctx);
	free(s->buf);
}

/*
 * Async events of @s's context for up to @ms (QUIET_MS after the last
 * one): how many were @type of its QP; the others are printed.
 */
static inline int qp_events(struct side *s, enum ibv_event_type type, int ms)
{
	struct pollfd pfd = { .fd = s->ctx->async_fd, .events = POLLIN };
	long long end = now_ms() + ms;
	struct ibv_async_event ev;
	int n = 0, left;

	while ((left = end - now_ms()) > 0) {
		if (poll(&pfd, 1, left) <= 0)
			continue;
		while (!ibv_get_async_event(s->ctx, &ev)) {
			if (ev.event_type == type && ev.element.qp == s->qp)
				n++;
			else
				printf("     (event %s)\n",
				       ibv_event_type_str(ev.event_type));
			ibv_ack_async_event(&ev);
			/* The first one came: from now on only a second counts. */
			end = now_ms() + QUIET_MS;
		}
	}
	return n;
}

#endif /* VT3_MODIFY_PAIR_H */
