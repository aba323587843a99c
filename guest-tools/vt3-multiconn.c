// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
/*
 * vt3-multiconn: many concurrent rdma_cm connections, each moving verified
 * data. One thread per connection on both sides, all connecting at once.
 * Per round the client SENDs a message whose every byte derives from
 * (connection, round); the server checks it, RDMA WRITEs it back into the
 * client's buffer (rkey exchanged in the first message), then SENDs a
 * short ack; the client checks the written bytes. Completions are waited
 * for on completion channels (req_notify_cq + ibv_get_cq_event), so the
 * CQ event path is exercised as well. Every work request carries a wr_id
 * naming (connection, round, message): each completion must be the one
 * expected next on its queue, with that wr_id, its opcode and its QP.
 *
 * Usage: vt3-multiconn -s                 [-p PORT] [-n CONNS] [-r ROUNDS] [-m BYTES]
 *        vt3-multiconn -c SERVER_ADDRESS  [-p PORT] [-n CONNS] [-r ROUNDS] [-m BYTES]
 * Both sides need the same -n/-r/-m. Prints one line per failed connection
 * and "vt3-multiconn: server|client: N connections, R rounds, B bytes
 * verified, F failed in S s"; exit status 0 only when every connection
 * moved every round correctly. Every wait is bounded (-t SECONDS, default
 * 120), so a lost completion fails instead of hanging.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

#define MAX_CONNS	256
#define ACK_SIZE	16

struct hello {
	uint64_t addr;		/* client's write buffer */
	uint32_t rkey;
	uint32_t conn;		/* the client's connection number */
};

struct conn {
	unsigned int index;
	struct rdma_cm_id *id;
	uint8_t *msg;		/* SEND payload (client) / receive buffer (server) */
	uint8_t *wbuf;		/* WRITE target (client) / source (server) */
	uint8_t ack[ACK_SIZE];
	struct ibv_mr *msg_mr, *wbuf_mr, *ack_mr;
	uint64_t remote_addr;
	uint32_t remote_rkey;
	char error[160];
	uint64_t verified;
};

static const char *prog = "vt3-multiconn";
static const char *port = "7474";
static unsigned int nconns = 64, rounds = 20, msg_size = 4096, timeout_s = 120;

static void fail(struct conn *c, const char *what, int err)
{
	if (!c->error[0])
		snprintf(c->error, sizeof(c->error), "%s: %s", what, strerror(err));
}

/* What each work request is, in its wr_id with the connection and round. */
enum wr_kind { WR_HELLO = 1, WR_HELLO_ACK, WR_MSG, WR_ACK, WR_WRITE };

static uint64_t wr_id(const struct conn *c, unsigned int round, enum wr_kind kind)
{
	return (uint64_t)c->index << 40 | (uint64_t)round << 8 | kind;
}

#define CTX(c, round, kind) ((void *)(uintptr_t)wr_id(c, round, kind))

static uint8_t pattern(unsigned int conn, unsigned int round, size_t i)
{
	return (uint8_t)(conn * 131 + round * 17 + i * 7 + (i >> 8));
}

/* Waits for one completion on cq (through its channel), bounded. */
static int wait_wc(struct conn *c, struct ibv_cq *cq, struct ibv_wc *wc)
{
	struct timespec start, now;

	clock_gettime(CLOCK_MONOTONIC, &start);
	for (;;) {
		int n = ibv_poll_cq(cq, 1, wc);

		if (n < 0)
			return EIO;
		if (n == 1)
			return wc->status == IBV_WC_SUCCESS ? 0 : EIO;
		if (ibv_req_notify_cq(cq, 0))
			return EIO;
		/* A completion may have landed before the arm took effect. */
		n = ibv_poll_cq(cq, 1, wc);
		if (n < 0)
			return EIO;
		if (n == 1)
			return wc->status == IBV_WC_SUCCESS ? 0 : EIO;
		struct pollfd pfd = { .fd = cq->channel->fd, .events = POLLIN };

		clock_gettime(CLOCK_MONOTONIC, &now);
		long left = (long)timeout_s * 1000 - ((now.tv_sec - start.tv_sec) * 1000 +
						     (now.tv_nsec - start.tv_nsec) / 1000000);
		if (left <= 0 || poll(&pfd, 1, (int)left) <= 0) {
			snprintf(c->error, sizeof(c->error), "no completion within %u s", timeout_s);
			return ETIMEDOUT;
		}
		struct ibv_cq *ev_cq;
		void *ev_ctx;

		if (ibv_get_cq_event(cq->channel, &ev_cq, &ev_ctx))
			return EIO;
		ibv_ack_cq_events(ev_cq, 1);
	}
}

/*
 * Waits for the next completion of one queue: it must be the work request
 * expected next there (wr_id), of its opcode, on this connection's QP.
 * Names what went wrong in the error.
 */
static int wait_queue(struct conn *c, bool recv, struct ibv_wc *wc, uint64_t want,
		      enum ibv_wc_opcode opcode)
{
	const char *q = recv ? "receive" : "send";
	int err = wait_wc(c, recv ? c->id->recv_cq : c->id->send_cq, wc);

	if (err) {
		if (!c->error[0])
			snprintf(c->error, sizeof(c->error), "%s completion: status %s", q,
				 ibv_wc_status_str(wc->status));
		return err;
	}
	if (wc->wr_id != want || wc->opcode != opcode || wc->qp_num != c->id->qp->qp_num) {
		snprintf(c->error, sizeof(c->error),
			 "%s completion: wr_id %#" PRIx64 " opcode %d qp %u, expected %#" PRIx64
			 " opcode %d qp %u", q, wc->wr_id, wc->opcode, wc->qp_num, want, opcode,
			 c->id->qp->qp_num);
		return EIO;
	}
	return 0;
}

#define wait_recv(c, wc, r, kind) wait_queue(c, true, wc, wr_id(c, r, kind), IBV_WC_RECV)
#define wait_send(c, wc, r, kind) wait_queue(c, false, wc, wr_id(c, r, kind), IBV_WC_SEND)
#define wait_write(c, wc, r) wait_queue(c, false, wc, wr_id(c, r, WR_WRITE), IBV_WC_RDMA_WRITE)

static int register_buffers(struct conn *c)
{
	c->msg = calloc(1, msg_size);
	c->wbuf = calloc(1, msg_size);
	if (!c->msg || !c->wbuf)
		return ENOMEM;
	c->msg_mr = rdma_reg_msgs(c->id, c->msg, msg_size);
	c->ack_mr = rdma_reg_msgs(c->id, c->ack, ACK_SIZE);
	c->wbuf_mr = ibv_reg_mr(c->id->pd, c->wbuf, msg_size,
				IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!c->msg_mr || !c->ack_mr || !c->wbuf_mr)
		return errno ? errno : ENOMEM;
	return 0;
}

static void release(struct conn *c)
{
	if (c->msg_mr)
		rdma_dereg_mr(c->msg_mr);
	if (c->ack_mr)
		rdma_dereg_mr(c->ack_mr);
	if (c->wbuf_mr)
		ibv_dereg_mr(c->wbuf_mr);
	if (c->id)
		rdma_destroy_ep(c->id);
	free(c->msg);
	free(c->wbuf);
}

static void init_attr(struct ibv_qp_init_attr *attr)
{
	memset(attr, 0, sizeof(*attr));
	attr->cap.max_send_wr = attr->cap.max_recv_wr = 4;
	attr->cap.max_send_sge = attr->cap.max_recv_sge = 1;
	attr->qp_type = IBV_QPT_RC;
	attr->sq_sig_all = 1;
}

/* ---- client ---- */

static const char *server_addr;

static void *client_conn(void *arg)
{
	struct conn *c = arg;
	struct rdma_addrinfo hints = { .ai_port_space = RDMA_PS_TCP }, *res;
	struct ibv_qp_init_attr attr;
	struct ibv_wc wc;
	struct hello hello;
	int err;

	err = rdma_getaddrinfo(server_addr, port, &hints, &res);
	if (err) {
		fail(c, "rdma_getaddrinfo", errno);
		return NULL;
	}
	init_attr(&attr);
	err = rdma_create_ep(&c->id, res, NULL, &attr);
	rdma_freeaddrinfo(res);
	if (err) {
		fail(c, "rdma_create_ep", errno);
		return NULL;
	}
	if ((err = register_buffers(c))) {
		fail(c, "register", err);
		return NULL;
	}
	/* The server's ack for the connection's hello. */
	if (rdma_post_recv(c->id, CTX(c, 0, WR_HELLO_ACK), c->ack, ACK_SIZE, c->ack_mr) ||
	    rdma_connect(c->id, NULL)) {
		fail(c, "connect", errno);
		return NULL;
	}
	hello = (struct hello){ .addr = (uintptr_t)c->wbuf, .rkey = c->wbuf_mr->rkey,
				.conn = c->index };
	memcpy(c->msg, &hello, sizeof(hello));
	if (rdma_post_send(c->id, CTX(c, 0, WR_HELLO), c->msg, sizeof(hello), c->msg_mr, 0) ||
	    wait_send(c, &wc, 0, WR_HELLO) || wait_recv(c, &wc, 0, WR_HELLO_ACK))
		return fail(c, "hello", EIO), NULL;

	for (unsigned int r = 0; r < rounds; r++) {
		for (size_t i = 0; i < msg_size; i++)
			c->msg[i] = pattern(c->index, r, i);
		memset(c->wbuf, 0, msg_size);
		if (rdma_post_recv(c->id, CTX(c, r, WR_ACK), c->ack, ACK_SIZE, c->ack_mr) ||
		    rdma_post_send(c->id, CTX(c, r, WR_MSG), c->msg, msg_size, c->msg_mr, 0)) {
			fail(c, "post", errno);
			break;
		}
		if (wait_send(c, &wc, r, WR_MSG) || wait_recv(c, &wc, r, WR_ACK))
			break;
		/* The ack follows the server's WRITE on the same stream. */
		for (size_t i = 0; i < msg_size; i++) {
			if (c->wbuf[i] != pattern(c->index, r, i)) {
				snprintf(c->error, sizeof(c->error),
					 "round %u: written-back byte %zu is %#x, expected %#x",
					 r, i, c->wbuf[i], pattern(c->index, r, i));
				break;
			}
		}
		if (c->error[0])
			break;
		c->verified += msg_size;
	}
	rdma_disconnect(c->id);
	return NULL;
}

/* ---- server ---- */

static void *server_conn(void *arg)
{
	struct conn *c = arg;
	struct ibv_wc wc;
	struct hello hello;
	unsigned int client;

	/* accept_all posted the receive for the hello. */
	if (wait_recv(c, &wc, 0, WR_HELLO))
		return fail(c, "hello", EIO), NULL;
	if (wc.byte_len != sizeof(hello)) {
		snprintf(c->error, sizeof(c->error), "hello of %u bytes", wc.byte_len);
		return NULL;
	}
	memcpy(&hello, c->msg, sizeof(hello));
	client = hello.conn;
	c->remote_addr = hello.addr;
	c->remote_rkey = hello.rkey;
	if (rdma_post_recv(c->id, CTX(c, 0, WR_MSG), c->msg, msg_size, c->msg_mr) ||
	    rdma_post_send(c->id, CTX(c, 0, WR_HELLO_ACK), c->ack, ACK_SIZE, c->ack_mr, 0) ||
	    wait_send(c, &wc, 0, WR_HELLO_ACK))
		return fail(c, "hello ack", EIO), NULL;

	for (unsigned int r = 0; r < rounds; r++) {
		if (wait_recv(c, &wc, r, WR_MSG))
			break;
		if (wc.byte_len != msg_size) {
			snprintf(c->error, sizeof(c->error), "round %u: %u bytes received", r,
				 wc.byte_len);
			break;
		}
		for (size_t i = 0; i < msg_size; i++) {
			if (c->msg[i] != pattern(client, r, i)) {
				snprintf(c->error, sizeof(c->error),
					 "round %u: received byte %zu is %#x, expected %#x", r, i,
					 c->msg[i], pattern(client, r, i));
				break;
			}
		}
		if (c->error[0])
			break;
		c->verified += msg_size;
		memcpy(c->wbuf, c->msg, msg_size);
		if (r + 1 < rounds &&
		    rdma_post_recv(c->id, CTX(c, r + 1, WR_MSG), c->msg, msg_size, c->msg_mr)) {
			fail(c, "post recv", errno);
			break;
		}
		if (rdma_post_write(c->id, CTX(c, r, WR_WRITE), c->wbuf, msg_size, c->wbuf_mr, 0,
				    c->remote_addr, c->remote_rkey) ||
		    wait_write(c, &wc, r) ||
		    rdma_post_send(c->id, CTX(c, r, WR_ACK), c->ack, ACK_SIZE, c->ack_mr, 0) ||
		    wait_send(c, &wc, r, WR_ACK)) {
			fail(c, "write back", EIO);
			break;
		}
	}
	/* The client disconnects after its last check. */
	struct rdma_cm_event *event;

	if (rdma_get_cm_event(c->id->channel, &event) == 0)
		rdma_ack_cm_event(event);
	return NULL;
}

static int accept_all(struct conn *conns)
{
	struct rdma_addrinfo hints = { .ai_flags = RAI_PASSIVE, .ai_port_space = RDMA_PS_TCP },
			     *res;
	struct ibv_qp_init_attr attr;
	struct rdma_cm_id *listen_id;

	if (rdma_getaddrinfo(NULL, port, &hints, &res)) {
		perror("rdma_getaddrinfo");
		return 1;
	}
	init_attr(&attr);
	if (rdma_create_ep(&listen_id, res, NULL, &attr)) {
		perror("rdma_create_ep");
		return 1;
	}
	rdma_freeaddrinfo(res);
	if (rdma_listen(listen_id, (int)nconns)) {
		perror("rdma_listen");
		return 1;
	}
	printf("%s: listening on port %s for %u connections\n", prog, port, nconns);
	fflush(stdout);
	for (unsigned int i = 0; i < nconns; i++) {
		struct conn *c = &conns[i];
		int err;

		c->index = i;
		if (rdma_get_request(listen_id, &c->id)) {
			perror("rdma_get_request");
			return 1;
		}
		/* rdma_get_request gives a synchronous id with its own event
		 * channel: rdma_accept returns once established, and the
		 * connection's thread waits for its own DISCONNECTED there. */
		/* The client sends its hello as soon as it is connected: an
		 * iWARP SEND with no receive posted is a fatal DDP error. */
		if ((err = register_buffers(c)) ||
		    rdma_post_recv(c->id, CTX(c, 0, WR_HELLO), c->msg, msg_size, c->msg_mr) ||
		    rdma_accept(c->id, NULL)) {
			fprintf(stderr, "%s: accept %u: %s\n", prog, i, strerror(err ? err : errno));
			return 1;
		}
	}
	rdma_destroy_ep(listen_id);
	return 0;
}

static void usage(void)
{
	fprintf(stderr, "usage: %s -s | -c SERVER [-p PORT] [-n CONNS] [-r ROUNDS] [-m BYTES] "
		"[-t SECONDS]\n", prog);
	exit(2);
}

int main(int argc, char **argv)
{
	bool server = false;
	struct conn *conns;
	pthread_t *threads;
	struct timespec t0, t1;
	unsigned int failed = 0;
	uint64_t verified = 0;
	int opt;

	while ((opt = getopt(argc, argv, "sc:p:n:r:m:t:")) != -1) {
		switch (opt) {
		case 's': server = true; break;
		case 'c': server_addr = optarg; break;
		case 'p': port = optarg; break;
		case 'n': nconns = (unsigned int)strtoul(optarg, NULL, 0); break;
		case 'r': rounds = (unsigned int)strtoul(optarg, NULL, 0); break;
		case 'm': msg_size = (unsigned int)strtoul(optarg, NULL, 0); break;
		case 't': timeout_s = (unsigned int)strtoul(optarg, NULL, 0); break;
		default: usage();
		}
	}
	if (server == !!server_addr || !nconns || nconns > MAX_CONNS || !rounds ||
	    msg_size < sizeof(struct hello) || msg_size > (64u << 20) || !timeout_s)
		usage();
	conns = calloc(nconns, sizeof(*conns));
	threads = calloc(nconns, sizeof(*threads));
	if (!conns || !threads)
		return 1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	if (server && accept_all(conns))
		return 1;
	for (unsigned int i = 0; i < nconns; i++) {
		conns[i].index = i;
		if (pthread_create(&threads[i], NULL, server ? server_conn : client_conn,
				   &conns[i])) {
			fprintf(stderr, "%s: pthread_create failed\n", prog);
			return 1;
		}
	}
	for (unsigned int i = 0; i < nconns; i++)
		pthread_join(threads[i], NULL);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	for (unsigned int i = 0; i < nconns; i++) {
		struct conn *c = &conns[i];

		if (!c->error[0] && c->verified != (uint64_t)rounds * msg_size)
			snprintf(c->error, sizeof(c->error), "verified %" PRIu64 " of %" PRIu64
				 " bytes", c->verified, (uint64_t)rounds * msg_size);
		if (c->error[0]) {
			printf("%s: connection %u: %s\n", prog, i, c->error);
			failed++;
		}
		verified += c->verified;
		release(c);
	}
	printf("%s: %s: %u connections, %u rounds, %" PRIu64 " bytes verified, %u failed in %.1f s\n",
	       prog, server ? "server" : "client", nconns, rounds, verified, failed,
	       (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9);
	free(conns);
	free(threads);
	return failed ? 1 : 0;
}
