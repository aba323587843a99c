// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
/*
 * vt3-import: a user context, PD and MR shared with another process
 * (ibv_import_device, ibv_import_pd, ibv_import_mr, ibv_unimport_*),
 * libvt3's import ops (provider/import.c) and vt3.ko's
 * (guest-driver/vt3_import.c). libibverbs only.
 *
 *   vt3-import [--dev NAME] [--timeout S]
 *
 * The creator opens the device, allocates a PD, registers a source MR
 * (filled with a pattern) and a sink MR, and creates a QP; then it execs
 * itself as the importer, handing on a dup of its uverbs fd, the PD and
 * source MR handles and keys. The importer, with no mapping of the
 * creator's memory (exec), imports the context, PD and MR, creates a CQ
 * and a QP on the imported PD, pairs its QP with the creator's by
 * ibv_modify_qp (docs/modify-connect.md) and posts an RDMA WRITE and a
 * SEND whose local SGEs are the imported MR's lkey over the creator's
 * addresses: the bytes can only come from the creator's pinned pages.
 * Checks, in the order they run:
 *  import-device  ibv_import_device() on the passed fd: vt3's device
 *  import-pd      ibv_import_pd(): the PD, with the creator's handle
 *  pd-not-a-pd    ibv_import_pd() of the MR's handle: EINVAL
 *  pd-no-handle   ibv_import_pd() of a handle nothing has: ENOENT
 *  import-mr      ibv_import_mr(): the creator's lkey, rkey and length
 *  mr-not-an-mr   ibv_import_mr() of the PD's handle: EINVAL
 *  pair           the importer's QP (on the imported PD, in the imported
 *                 context) paired with the creator's
 *  posted         the WRITE and the SEND complete successfully
 *  received       (the creator's) its RECV: the SEND's bytes, and the
 *                 WRITE's (three pages and more, unaligned) in its sink MR
 *  unimport       (the importer's, once the creator has checked) QP and CQ
 *                 destroyed, MR and PD unimported, context closed
 *  importer-exit  the importer exited 0 with its checks' counts
 *  creator-owns   unimporting left the creator's objects alive: its MRs
 *                 deregister and its PD deallocates (0 each)
 * One line per check ("ok   NAME" / "FAIL NAME: why"), then
 * "vt3-import: N passed, N failed"; exit 1 on a failure.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#define VT3_CHECK_PROG "vt3-import"
#include "vt3-check.h"

#define PAGE		4096
#define BUF_SIZE	(8 * PAGE)
/* The WRITE: more than three pages, starting and ending mid-page. */
#define WRITE_OFF	100
#define WRITE_LEN	(3 * PAGE + 17)
/* The SEND: the source's first bytes, into the sink's last page. */
#define MSG_LEN		64
#define RECV_OFF	(7 * PAGE)
#define CQ_DEPTH	16
#include "vt3-modify-pair.h"

/* What the creator hands on to the importer, as one argument. */
struct handoff {
	int cmd_fd, up_fd, down_fd;
	uint32_t pd_handle, mr_handle, lkey, rkey, qpn, sink_rkey;
	uint64_t length, src, sink;
};

#define HANDOFF_FMT "%d,%d,%d,%" SCNu32 ",%" SCNu32 ",%" SCNu32 ",%" SCNu32 \
		    ",%" SCNu32 ",%" SCNu32 ",%" SCNu64 ",%" SCNu64 ",%" SCNu64

/* Reads @len bytes of @fd within the timeout; false if they did not come. */
static bool read_within(int fd, void *buf, size_t len)
{
	struct pollfd pfd = { .fd = fd, .events = POLLIN };
	double end = now() + timeout_s;
	size_t got = 0;
	ssize_t n;

	while (got < len) {
		if (poll(&pfd, 1, 100) < 0 || now() > end)
			return false;
		if (!(pfd.revents & (POLLIN | POLLHUP)))
			continue;
		n = read(fd, (char *)buf + got, len - got);
		if (n <= 0)
			return false;
		got += n;
	}
	return true;
}

static void write_all(int fd, const void *buf, size_t len)
{
	if (write(fd, buf, len) != (ssize_t)len)
		die("pipe write");
}

/* Polls @cq for @n successful completions within the timeout. */
static int poll_success(struct ibv_cq *cq, int n, struct ibv_wc *last)
{
	double end = now() + timeout_s;
	int done = 0, got;

	while (done < n && now() < end) {
		got = ibv_poll_cq(cq, 1, last);
		if (got < 0 || (got && last->status != IBV_WC_SUCCESS))
			return -1;
		if (!got)
			usleep(1000);
		done += got;
	}
	return done;
}

static struct ibv_qp *create_qp(struct ibv_pd *pd, struct ibv_cq *cq)
{
	struct ibv_qp_init_attr attr = {
		.send_cq = cq,
		.recv_cq = cq,
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4,
			 .max_send_sge = 1, .max_recv_sge = 1 },
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &attr);

	if (!qp)
		die("ibv_create_qp");
	return qp;
}

static void check_refused(const void *obj, int want, const char *name)
{
	int err = errno;

	check(!obj && err == want, name, "%s (errno %d, %s), want NULL with %s",
	      obj ? "imported" : "refused", err, strerror(err), strerror(want));
}

static int post_write_and_send(struct ibv_qp *qp, const struct handoff *h,
			       uint32_t lkey)
{
	struct ibv_sge write_sge = { .addr = h->src + WRITE_OFF,
				     .length = WRITE_LEN, .lkey = lkey };
	struct ibv_sge send_sge = { .addr = h->src, .length = MSG_LEN,
				    .lkey = lkey };
	struct ibv_send_wr send = { .wr_id = 2, .sg_list = &send_sge,
				    .num_sge = 1, .opcode = IBV_WR_SEND,
				    .send_flags = IBV_SEND_SIGNALED };
	struct ibv_send_wr write = { .wr_id = 1, .next = &send,
				     .sg_list = &write_sge, .num_sge = 1,
				     .opcode = IBV_WR_RDMA_WRITE,
				     .send_flags = IBV_SEND_SIGNALED }, *bad;

	write.wr.rdma.remote_addr = h->sink + WRITE_OFF;
	write.wr.rdma.rkey = h->sink_rkey;
	return ibv_post_send(qp, &write, &bad);
}

/* The exec'd process: everything through the imported objects. */
static int importer(const char *arg)
{
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_mr *mr;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct handoff h;
	struct ibv_wc wc;
	int counts[2], ret, done;
	char go;

	if (sscanf(arg, HANDOFF_FMT, &h.cmd_fd, &h.up_fd, &h.down_fd,
		   &h.pd_handle, &h.mr_handle, &h.lkey, &h.rkey, &h.qpn,
		   &h.sink_rkey, &h.length, &h.src, &h.sink) != 12)
		die("bad --importer argument");

	ctx = ibv_import_device(h.cmd_fd);
	check(ctx && !strcmp(ibv_get_device_name(ctx->device), dev_name),
	      "import-device", "%s (%s)",
	      ctx ? ibv_get_device_name(ctx->device) : "no context",
	      strerror(errno));
	if (!ctx)
		die("ibv_import_device");

	pd = ibv_import_pd(ctx, h.pd_handle);
	check(pd && pd->handle == h.pd_handle && pd->context == ctx,
	      "import-pd", "%s (%s)", pd ? "wrong handle or context" : "refused",
	      strerror(errno));
	if (!pd)
		die("ibv_import_pd");
	check_refused(ibv_import_pd(ctx, h.mr_handle), EINVAL, "pd-not-a-pd");
	check_refused(ibv_import_pd(ctx, h.pd_handle + 0x10000), ENOENT,
		      "pd-no-handle");

	mr = ibv_import_mr(pd, h.mr_handle);
	check(mr && mr->lkey == h.lkey && mr->rkey == h.rkey &&
	      mr->length == h.length && mr->handle == h.mr_handle,
	      "import-mr", "lkey %#x rkey %#x length %zu (want %#x %#x %" PRIu64 ") %s",
	      mr ? mr->lkey : 0, mr ? mr->rkey : 0, mr ? mr->length : 0,
	      h.lkey, h.rkey, h.length, mr ? "" : strerror(errno));
	if (!mr)
		die("ibv_import_mr");
	check_refused(ibv_import_mr(pd, h.pd_handle), EINVAL, "mr-not-an-mr");

	cq = ibv_create_cq(ctx, CQ_DEPTH, NULL, NULL, 0);
	if (!cq)
		die("ibv_create_cq");
	qp = create_qp(pd, cq);
	write_all(h.up_fd, &qp->qp_num, sizeof(qp->qp_num));
	ret = pair_with(qp, h.qpn);
	check(!ret, "pair", "modify_qp: %s", strerror(ret));

	ret = ret ?: post_write_and_send(qp, &h, mr->lkey);
	done = ret ? 0 : poll_success(cq, 2, &wc);
	check(done == 2, "posted",
	      "post %s, %d of 2 completions (last: %s)", strerror(ret), done,
	      done < 0 ? ibv_wc_status_str(wc.status) : "-");
	/* Our lines first: the creator checks its RECV after this word. */
	write_all(h.up_fd, "p", 1);

	/* The creator has read its RECV and sink: our QP may go. */
	if (!read_within(h.down_fd, &go, 1))
		printf("     (no word from the creator)\n");
	ret = ibv_destroy_qp(qp) ?: ibv_destroy_cq(cq);
	ibv_unimport_mr(mr);
	ibv_unimport_pd(pd);
	ret = ret ?: ibv_close_device(ctx);
	check(!ret, "unimport", "%s", strerror(ret));

	counts[0] = passed;
	counts[1] = failed;
	write_all(h.up_fd, counts, sizeof(counts));
	return failed ? 1 : 0;
}

static struct ibv_mr *reg(struct ibv_pd *pd, void *buf, int access)
{
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, BUF_SIZE, access);

	if (!mr)
		die("ibv_reg_mr");
	return mr;
}

static pid_t spawn_importer(const char *self, const struct handoff *h)
{
	char dev_arg[64], timeout_arg[16], arg[256];
	pid_t pid;

	snprintf(dev_arg, sizeof(dev_arg), "%s", dev_name);
	snprintf(timeout_arg, sizeof(timeout_arg), "%d", timeout_s);
	snprintf(arg, sizeof(arg), HANDOFF_FMT, h->cmd_fd, h->up_fd, h->down_fd,
		 h->pd_handle, h->mr_handle, h->lkey, h->rkey, h->qpn,
		 h->sink_rkey, h->length, h->src, h->sink);
	fflush(stdout);
	pid = fork();
	if (pid < 0)
		die("fork");
	if (!pid) {
		execl(self, self, "--dev", dev_arg, "--timeout", timeout_arg,
		      "--importer", arg, (char *)NULL);
		die("exec");
	}
	return pid;
}

/* The importer's check counts, then its exit status. */
static void reap_importer(pid_t pid, int up_fd)
{
	int counts[2] = { 0, 0 }, status = -1;
	bool counted = read_within(up_fd, counts, sizeof(counts));

	if (waitpid(pid, &status, 0) != pid)
		status = -1;
	passed += counts[0];
	failed += counts[1];
	check(counted && WIFEXITED(status) && !WEXITSTATUS(status),
	      "importer-exit", "counts %s, wait status %#x",
	      counted ? "read" : "missing", status);
}

static int creator(const char *self)
{
	struct ibv_context *ctx = open_device();
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = pd ? ibv_create_cq(ctx, CQ_DEPTH, NULL, NULL, 0) : NULL;
	unsigned char *src = aligned_alloc(PAGE, BUF_SIZE);
	unsigned char *sink = aligned_alloc(PAGE, BUF_SIZE);
	struct ibv_mr *src_mr, *sink_mr;
	int up[2], down[2], ret, i;
	struct ibv_recv_wr rwr = { .wr_id = 7, .num_sge = 1 }, *bad;
	struct ibv_sge rsge;
	struct ibv_qp *qp;
	struct handoff h;
	struct ibv_wc wc;
	uint32_t qpn;
	char posted;
	pid_t pid;

	if (!cq || !src || !sink)
		die("PD/CQ/buffers");
	for (i = 0; i < BUF_SIZE; i++)
		src[i] = (i * 7 + 3) ^ (i >> 8);
	memset(sink, 0, BUF_SIZE);
	src_mr = reg(pd, src, IBV_ACCESS_LOCAL_WRITE);
	sink_mr = reg(pd, sink, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	qp = create_qp(pd, cq);
	rsge = (struct ibv_sge){ .addr = (uintptr_t)sink + RECV_OFF,
				 .length = MSG_LEN, .lkey = sink_mr->lkey };
	rwr.sg_list = &rsge;
	/* A RESET QP takes no RECV (EINVAL): INIT first, RTR once paired. */
	errno = to_init(qp) ?: ibv_post_recv(qp, &rwr, &bad);
	if (errno)
		die("INIT and ibv_post_recv");
	if (pipe(up) || pipe(down))
		die("pipe");
	/* A dead importer's pipe is a check's failure, not our end. */
	signal(SIGPIPE, SIG_IGN);

	/* dup(): the new fd has no FD_CLOEXEC, the exec'd importer keeps it. */
	h = (struct handoff){
		.cmd_fd = dup(ctx->cmd_fd), .up_fd = up[1], .down_fd = down[0],
		.pd_handle = pd->handle, .mr_handle = src_mr->handle,
		.lkey = src_mr->lkey, .rkey = src_mr->rkey,
		.qpn = qp->qp_num, .sink_rkey = sink_mr->rkey,
		.length = BUF_SIZE, .src = (uintptr_t)src,
		.sink = (uintptr_t)sink,
	};
	if (h.cmd_fd < 0)
		die("dup");
	pid = spawn_importer(self, &h);
	close(h.cmd_fd);
	close(up[1]);
	close(down[0]);

	if (!read_within(up[0], &qpn, sizeof(qpn))) {
		check(false, "received", "the importer sent no QPN");
	} else {
		ret = to_rtr(qp, qpn, NULL) ?: to_rts(qp);
		if (ret)
			printf("     (creator's pair: %s)\n", strerror(ret));
		if (!read_within(up[0], &posted, 1))
			printf("     (the importer did not report its posts)\n");
		ret = ret ? -1 : poll_success(cq, 1, &wc);
		check(ret == 1 && wc.wr_id == 7 && wc.opcode == IBV_WC_RECV &&
		      wc.byte_len == MSG_LEN &&
		      !memcmp(sink + RECV_OFF, src, MSG_LEN) &&
		      !memcmp(sink + WRITE_OFF, src + WRITE_OFF, WRITE_LEN) &&
		      !sink[WRITE_OFF - 1] && !sink[WRITE_OFF + WRITE_LEN],
		      "received",
		      "%d RECV completions (%s, %u bytes), message %s, WRITE's bytes %s",
		      ret, ret ? ibv_wc_status_str(wc.status) : "-", wc.byte_len,
		      memcmp(sink + RECV_OFF, src, MSG_LEN) ? "wrong" : "right",
		      memcmp(sink + WRITE_OFF, src + WRITE_OFF, WRITE_LEN) ?
		      "wrong" : "right");
	}
	/* Best effort: an importer that died early reads nothing. */
	if (write(down[1], "g", 1) != 1)
		printf("     (the importer is gone)\n");
	reap_importer(pid, up[0]);

	ret = ibv_destroy_qp(qp) ?: ibv_destroy_cq(cq);
	if (ret)
		printf("     (destroying the creator's QP/CQ: %s)\n", strerror(ret));
	ret = ibv_dereg_mr(src_mr) ?: ibv_dereg_mr(sink_mr) ?: ibv_dealloc_pd(pd);
	check(!ret, "creator-owns", "dereg/dealloc: %s", strerror(ret));
	ibv_close_device(ctx);
	free(src);
	free(sink);
	return check_summary();
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "dev", required_argument, NULL, 'd' },
		{ "timeout", required_argument, NULL, 't' },
		{ "importer", required_argument, NULL, 'i' },
		{}
	};
	const char *handoff = NULL;
	int c;

	while ((c = getopt_long(argc, argv, "d:t:", opts, NULL)) != -1) {
		switch (c) {
		case 'd':
			dev_name = optarg;
			break;
		case 't':
			timeout_s = atoi(optarg);
			break;
		case 'i':
			handoff = optarg;
			break;
		default:
			fprintf(stderr, "usage: vt3-import [--dev NAME] [--timeout S]\n");
			return 2;
		}
	}
	if (!dev_name)
		dev_name = "vt3_0";
	/* /proc/self/exe: the importer is this very program. */
	return handoff ? importer(handoff) : creator("/proc/self/exe");
}
