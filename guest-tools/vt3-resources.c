// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
/*
 * vt3-resources: create and destroy verbs resources in a loop, checking
 * every call. Each iteration allocates a PD, registers MRs of several sizes,
 * creates and arms two CQs, creates two RC QPs and queries their caps, then
 * destroys everything in reverse order. It finds leaks and broken error paths in provider,
 * kernel driver and device, and works on any device (siw0 as a reference).
 *
 * Usage: vt3-resources [-d DEVICE] [-n ITERATIONS] [-v]
 *   -d DEVICE      ib device (default: the first whose name starts with "vt3")
 *   -n ITERATIONS  default 10000
 *   -v             a progress line every 1000 iterations
 * Exit status 0 when every call succeeded; otherwise 1 with the failing
 * call and errno on stderr.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include <infiniband/verbs.h>

#define NUM_MRS		5
#define NUM_CQS		2
#define NUM_QPS		2

/* Sizes and how the buffer is obtained: odd malloc addresses and mmap pages. */
static const struct {
	size_t size;
	bool use_mmap;
	const char *name;
} mr_specs[NUM_MRS] = {
	{ 1, false, "1 B" },
	{ 4096, false, "4 KiB" },
	{ 64 << 10, false, "64 KiB" },
	{ 1 << 20, true, "1 MiB" },
	{ 8 << 20, true, "8 MiB" },
};

static const int cq_depths[NUM_CQS] = { 16, 1024 };

static const char *prog = "vt3-resources";
static unsigned long iteration;
static uint64_t objects;

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "%s: ", prog);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}

/* A failed verb: which one, in which iteration, and why. */
static void fail(const char *call, int err)
{
	die("iteration %lu: %s failed: %s (errno %d)", iteration, call,
	    strerror(err), err);
}

static struct ibv_device *find_device(struct ibv_device **list,
				      const char *name)
{
	int i;

	for (i = 0; list[i]; i++) {
		const char *n = ibv_get_device_name(list[i]);

		if (name ? !strcmp(n, name) : !strncmp(n, "vt3", 3))
			return list[i];
	}
	fprintf(stderr, "%s: no device %s; there are:", prog,
		name ? name : "vt3*");
	for (i = 0; list[i]; i++)
		fprintf(stderr, " %s", ibv_get_device_name(list[i]));
	fputc('\n', stderr);
	exit(1);
}

static void *alloc_buffer(int i)
{
	void *p;

	if (mr_specs[i].use_mmap) {
		p = mmap(NULL, mr_specs[i].size, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (p == MAP_FAILED)
			die("mmap(%s): %s", mr_specs[i].name, strerror(errno));
	} else {
		/* One byte more, used from offset 1: a misaligned start. */
		p = malloc(mr_specs[i].size + 1);
		if (!p)
			die("malloc(%s): %s", mr_specs[i].name, strerror(errno));
		p = (char *)p + 1;
	}
	/* Touch every page: registration must work on populated memory too. */
	memset(p, 0xa5, mr_specs[i].size);
	return p;
}

static uint32_t min_u32(uint32_t a, uint32_t b)
{
	return a < b ? a : b;
}

/*
 * Caps of the two QPs: a small one, and one at the device's limits (WRs
 * capped at 1024 so that one iteration stays cheap on any device).
 */
static void qp_caps(const struct ibv_device_attr *dev, int i,
		    struct ibv_qp_cap *cap)
{
	uint32_t wr = i ? min_u32(dev->max_qp_wr, 1024) : min_u32(dev->max_qp_wr, 16);
	uint32_t sge = i ? (uint32_t)dev->max_sge : min_u32(dev->max_sge, 1);

	memset(cap, 0, sizeof(*cap));
	cap->max_send_wr = wr;
	cap->max_recv_wr = wr;
	cap->max_send_sge = sge;
	cap->max_recv_sge = sge;
}

static void check_caps(const char *what, const struct ibv_qp_cap *got,
		       const struct ibv_qp_cap *want)
{
	if (got->max_send_wr < want->max_send_wr ||
	    got->max_recv_wr < want->max_recv_wr ||
	    got->max_send_sge < want->max_send_sge ||
	    got->max_recv_sge < want->max_recv_sge)
		die("iteration %lu: %s: caps %u/%u WRs, %u/%u SGEs are below the requested %u/%u, %u/%u",
		    iteration, what, got->max_send_wr, got->max_recv_wr,
		    got->max_send_sge, got->max_recv_sge, want->max_send_wr,
		    want->max_recv_wr, want->max_send_sge, want->max_recv_sge);
}

static void one_iteration(struct ibv_context *ctx,
			  const struct ibv_device_attr *dev, void **bufs)
{
	struct ibv_mr *mrs[NUM_MRS];
	struct ibv_cq *cqs[NUM_CQS];
	struct ibv_qp *qps[NUM_QPS];
	struct ibv_pd *pd;
	char call[64];
	int i, ret;

	pd = ibv_alloc_pd(ctx);
	if (!pd)
		fail("ibv_alloc_pd", errno);
	objects++;

	for (i = 0; i < NUM_MRS; i++) {
		snprintf(call, sizeof(call), "ibv_reg_mr(%s)", mr_specs[i].name);
		mrs[i] = ibv_reg_mr(pd, bufs[i], mr_specs[i].size,
				    IBV_ACCESS_LOCAL_WRITE |
				    IBV_ACCESS_REMOTE_WRITE |
				    IBV_ACCESS_REMOTE_READ);
		if (!mrs[i])
			fail(call, errno);
		if (mrs[i]->addr != bufs[i] || mrs[i]->length != mr_specs[i].size)
			die("iteration %lu: %s returned addr %p length %zu", iteration,
			    call, mrs[i]->addr, mrs[i]->length);
		objects++;
	}

	for (i = 0; i < NUM_CQS; i++) {
		int depth = cq_depths[i] < dev->max_cqe ? cq_depths[i] : dev->max_cqe;

		snprintf(call, sizeof(call), "ibv_create_cq(%d)", depth);
		cqs[i] = ibv_create_cq(ctx, depth, NULL, NULL, 0);
		if (!cqs[i])
			fail(call, errno);
		if (cqs[i]->cqe < depth)
			die("iteration %lu: %s gave %d entries", iteration, call,
			    cqs[i]->cqe);
		objects++;
		/* Destroying an armed CQ is a path of its own. */
		ret = ibv_req_notify_cq(cqs[i], i);
		if (ret)
			fail("ibv_req_notify_cq", ret);
	}

	for (i = 0; i < NUM_QPS; i++) {
		struct ibv_qp_init_attr init = {
			.send_cq = cqs[i],
			.recv_cq = cqs[NUM_CQS - 1],
			.qp_type = IBV_QPT_RC,
		};
		struct ibv_qp_init_attr qinit;
		struct ibv_qp_attr attr;
		struct ibv_qp_cap want;

		qp_caps(dev, i, &want);
		init.cap = want;
		snprintf(call, sizeof(call), "ibv_create_qp(RC, %u WRs, %u SGEs)",
			 want.max_send_wr, want.max_send_sge);
		qps[i] = ibv_create_qp(pd, &init);
		if (!qps[i])
			fail(call, errno);
		objects++;
		check_caps(call, &init.cap, &want);

		ret = ibv_query_qp(qps[i], &attr, IBV_QP_CAP, &qinit);
		if (ret)
			fail("ibv_query_qp", ret);
		check_caps("ibv_query_qp", &attr.cap, &want);
	}

	for (i = NUM_QPS - 1; i >= 0; i--) {
		ret = ibv_destroy_qp(qps[i]);
		if (ret)
			fail("ibv_destroy_qp", ret);
	}
	for (i = NUM_CQS - 1; i >= 0; i--) {
		ret = ibv_destroy_cq(cqs[i]);
		if (ret)
			fail("ibv_destroy_cq", ret);
	}
	for (i = NUM_MRS - 1; i >= 0; i--) {
		ret = ibv_dereg_mr(mrs[i]);
		if (ret)
			fail("ibv_dereg_mr", ret);
	}
	ret = ibv_dealloc_pd(pd);
	if (ret)
		fail("ibv_dealloc_pd", ret);
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	unsigned long iterations = 10000;
	const char *dev_name = NULL;
	struct ibv_device_attr dev;
	struct ibv_device **list;
	struct ibv_context *ctx;
	void *bufs[NUM_MRS];
	bool verbose = false;
	double t0;
	char *end;
	int i, opt, ret;

	while ((opt = getopt(argc, argv, "d:n:vh")) != -1) {
		switch (opt) {
		case 'd':
			dev_name = optarg;
			break;
		case 'n':
			errno = 0;
			iterations = strtoul(optarg, &end, 10);
			if (errno || *end || !*optarg)
				die("-n wants a number, not '%s'", optarg);
			break;
		case 'v':
			verbose = true;
			break;
		default:
			fprintf(stderr, "usage: %s [-d DEVICE] [-n ITERATIONS] [-v]\n", prog);
			return opt == 'h' ? 0 : 2;
		}
	}

	list = ibv_get_device_list(NULL);
	if (!list)
		die("ibv_get_device_list failed: %s", strerror(errno));
	ctx = ibv_open_device(find_device(list, dev_name));
	if (!ctx)
		die("ibv_open_device failed: %s", strerror(errno));
	ret = ibv_query_device(ctx, &dev);
	if (ret)
		die("ibv_query_device failed: %s", strerror(ret));
	printf("%s: %s: max_qp_wr %d, max_sge %d, max_cqe %d, max_mr_size %" PRIu64 "\n",
	       prog, ibv_get_device_name(ctx->device), dev.max_qp_wr,
	       dev.max_sge, dev.max_cqe, dev.max_mr_size);

	for (i = 0; i < NUM_MRS; i++)
		bufs[i] = alloc_buffer(i);

	t0 = now();
	for (iteration = 0; iteration < iterations; iteration++) {
		one_iteration(ctx, &dev, bufs);
		if (verbose && (iteration + 1) % 1000 == 0)
			printf("%s: %lu iterations, %.1f s\n", prog,
			       iteration + 1, now() - t0);
	}

	printf("%s: %lu iterations, 0 errors, %" PRIu64 " objects created in %.1f s\n",
	       prog, iterations, objects, now() - t0);

	if (ibv_close_device(ctx))
		die("ibv_close_device failed: %s", strerror(errno));
	ibv_free_device_list(list);
	return 0;
}
