// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
/*
 * vt3-litmus: do a guest's atomics and fences hold against a host thread
 * that works on the same words of guest memory, as vt3d does on a QP's
 * status page while vt3.ko and libvt3 work on it?
 *
 *   vt3-litmus guest SECONDS       (in the guest, as root)
 *   vt3-litmus host PID PAGE NONCE (on the host: PID is the guest's QEMU)
 *
 * The guest locks one page, prints "page 0xGPA nonce N" (its guest-physical
 * address, from /proc/self/pagemap) and waits. The host maps the guest's
 * RAM (QEMU's memory-backend-memfd, through /proc/PID/fd) and checks the
 * page's nonce. Then two races, each for SECONDS of the guest's (the lock
 * race until a million guest entries, if 20 s more allow); the host runs
 * all along, so on a busy host both run at once for much of it:
 *
 *  adds  both add 1 to a counter with lock xadd: every add lands only if
 *        both sides' adds are atomic.
 *  lock  both take turns in Peterson's lock (store my flag and the turn,
 *        a full fence, load the other's flag: the store-load order of
 *        vt3's doorbell hand-off) and count their entries with a plain
 *        increment inside: no entry is lost and no side finds the other
 *        inside only if both sides' fences order their stores before
 *        their loads. The fence is libvt3's, __atomic_thread_fence
 *        (SEQ_CST), which GCC makes lock or $0 on the stack (Linux's
 *        smp_mb() is lock addl $0).
 *
 * The host prints "adds: host H, guest G, counter C, lost L" and
 * "lock: host H, guest G, counter C, lost L, overlaps O", and exits 0 iff
 * nothing was lost and nothing overlapped, 1 otherwise.
 *
 * Why a test: QEMU's TCG makes a guest's locked instructions host atomics
 * (and so fences) only for a machine of more than one possible CPU
 * (maxcpus > 1), and QEMU 7.2 its mfence a host fence only then too;
 * otherwise lock xadd is a plain load, add and store.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096u
#define GO_ADDS 0x61646421u
#define GO_LOCK 0x6c6f636bu
/* Give up on the other side after this long. */
#define WAIT_S 120
/* Entries the guest aims for in the lock race. */
#define LOCK_ENTRIES 1000000
enum { GUEST, HOST };

/* The shared page; each race's words have cache lines of their own. */
struct litmus {
	uint64_t nonce;
	uint32_t go;		/* host: GO_ADDS, then GO_LOCK */
	uint32_t guest_done;	/* guest: the race it finished */
	uint64_t guest_count;	/* its adds, then its lock entries */
	uint64_t guest_overlaps;
	uint8_t pad0[64 - 32];
	uint64_t counter;	/* adds: lock xadd by both */
	uint8_t pad1[64 - 8];
	uint32_t want[2];	/* lock: Peterson's */
	uint32_t turn;
	uint32_t owner;
	uint64_t entries;	/* plain increments inside the lock */
};

#define ONCE(x) (*(volatile __typeof__(x) *)&(x))

static double now_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static int die(const char *what)
{
	fprintf(stderr, "vt3-litmus: %s: %s\n", what, strerror(errno));
	return 2;
}

static bool wait_word(uint32_t *word, uint32_t value)
{
	double until = now_s() + WAIT_S;

	while (__atomic_load_n(word, __ATOMIC_ACQUIRE) != value)
		if (now_s() > until)
			return false;
	return true;
}

static void add_burst(struct litmus *l, uint64_t *adds)
{
	for (int i = 0; i < 4096; i++)
		__atomic_fetch_add(&l->counter, 1, __ATOMIC_SEQ_CST);
	*adds += 4096;
}

/*
 * One pass through Peterson's lock by @me; counts an entry, and an
 * overlap if the other side was found inside. Returns false if the other
 * side still held it at @deadline.
 */
static bool lock_pass(struct litmus *l, int me, double deadline, uint64_t *overlaps)
{
	int other = !me;
	unsigned spins = 0;
	uint64_t v;

	ONCE(l->want[me]) = 1;
	ONCE(l->turn) = other;
	/* The store-load order under test. */
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	while (ONCE(l->want[other]) && ONCE(l->turn) == (uint32_t)other) {
		/*
		 * The other side may wait for this core to run: the host's
		 * half yields it; the guest's sleeps, so that its vCPU halts
		 * (a yield in the guest keeps the host's core busy).
		 */
		if (++spins % 256 == 0) {
			if (me == HOST)
				sched_yield();
			else
				nanosleep(&(struct timespec){ .tv_nsec = 20000 }, NULL);
		}
		if (spins % 65536 == 0 && now_s() > deadline)
			return false;
	}
	ONCE(l->owner) = me;
	v = ONCE(l->entries);
	ONCE(l->entries) = v + 1;
	if (ONCE(l->owner) != (uint32_t)me)
		(*overlaps)++;
	__asm__ __volatile__("" ::: "memory");
	ONCE(l->want[me]) = 0;
	return true;
}

static int guest(double seconds)
{
	uint64_t entry, frame, adds = 0, entries = 0, overlaps = 0;
	struct litmus *l;
	double until;
	int fd;

	l = mmap(NULL, PAGE, PROT_READ | PROT_WRITE,
		 MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	if (l == MAP_FAILED)
		return die("mmap");
	if (mlock(l, PAGE))
		return die("mlock");
	memset(l, 0, PAGE);
	if (getrandom(&l->nonce, sizeof(l->nonce), 0) != sizeof(l->nonce))
		return die("getrandom");
	fd = open("/proc/self/pagemap", O_RDONLY);
	if (fd < 0)
		return die("/proc/self/pagemap");
	if (pread(fd, &entry, sizeof(entry),
		  (uintptr_t)l / PAGE * sizeof(entry)) != sizeof(entry))
		return die("pagemap read");
	close(fd);
	/* Bit 63: present; bits 0-54: the frame (0 without CAP_SYS_ADMIN). */
	frame = entry & ((UINT64_C(1) << 55) - 1);
	if (!(entry >> 63) || !frame) {
		fprintf(stderr, "vt3-litmus: no frame for the page (run as root)\n");
		return 2;
	}
	printf("page 0x%" PRIx64 " nonce %" PRIu64 "\n", frame * PAGE, l->nonce);
	fflush(stdout);

	if (!wait_word(&l->go, GO_ADDS)) {
		fprintf(stderr, "vt3-litmus: no go from the host in %d s\n", WAIT_S);
		return 2;
	}
	until = now_s() + seconds;
	do
		add_burst(l, &adds);
	while (now_s() < until);
	ONCE(l->guest_count) = adds;
	__atomic_store_n(&l->guest_done, GO_ADDS, __ATOMIC_RELEASE);

	if (!wait_word(&l->go, GO_LOCK)) {
		fprintf(stderr, "vt3-litmus: no second go from the host in %d s\n", WAIT_S);
		return 2;
	}
	/* At least a million entries if the host's load allows (20 s more). */
	until = now_s() + seconds;
	do {
		for (int i = 0; i < 1024; i++, entries++)
			if (!lock_pass(l, GUEST, until + WAIT_S, &overlaps)) {
				fprintf(stderr, "vt3-litmus: the host held the lock for %d s\n", WAIT_S);
				return 2;
			}
	} while (now_s() < until || (entries < LOCK_ENTRIES && now_s() < until + 20));
	ONCE(l->guest_count) = entries;
	ONCE(l->guest_overlaps) = overlaps;
	__atomic_store_n(&l->guest_done, GO_LOCK, __ATOMIC_RELEASE);
	printf("guest adds %" PRIu64 ", lock entries %" PRIu64 ", overlaps %" PRIu64 "\n",
	       adds, entries, overlaps);
	return 0;
}
/* The largest memfd QEMU @pid holds: the guest's RAM. */
static int guest_ram(const char *pid, off_t *size)
{
	char dir[64], path[PATH_MAX + 64], target[PATH_MAX];
	struct dirent *d;
	int best = -1;
	DIR *fds;

	snprintf(dir, sizeof(dir), "/proc/%s/fd", pid);
	fds = opendir(dir);
	if (!fds)
		return -1;
	*size = 0;
	while ((d = readdir(fds))) {
		struct stat st;
		ssize_t n;
		int fd;

		snprintf(path, sizeof(path), "%s/%s", dir, d->d_name);
		n = readlink(path, target, sizeof(target) - 1);
		if (n < 0)
			continue;
		target[n] = '\0';
		if (strncmp(target, "/memfd:", 7))
			continue;
		fd = open(path, O_RDWR);
		if (fd < 0)
			continue;
		if (fstat(fd, &st) || st.st_size <= *size) {
			close(fd);
			continue;
		}
		if (best >= 0)
			close(best);
		best = fd;
		*size = st.st_size;
	}
	closedir(fds);
	return best;
}

/* What a race left: "NAME: host H, guest G, counter C, lost L". */
static int64_t report(const char *name, uint64_t host, uint64_t guest, uint64_t counter)
{
	int64_t lost = (int64_t)(host + guest - counter);

	printf("%s: host %" PRIu64 ", guest %" PRIu64 ", counter %" PRIu64 ", lost %" PRId64,
	       name, host, guest, counter, lost);
	return lost;
}

static int host(const char *pid, uint64_t gpa, uint64_t nonce)
{
	uint64_t adds = 0, entries = 0, overlaps = 0, guest_overlaps;
	int64_t adds_lost, entries_lost;
	struct litmus *l;
	double until;
	off_t size;
	int fd;

	fd = guest_ram(pid, &size);
	if (fd < 0) {
		fprintf(stderr, "vt3-litmus: QEMU %s has no memfd RAM\n", pid);
		return 2;
	}
	/* q35 below 2.75 GiB of RAM: guest-physical address == offset. */
	if (gpa % PAGE || gpa + PAGE > (uint64_t)size) {
		fprintf(stderr, "vt3-litmus: page 0x%" PRIx64 " is outside the %jd bytes of RAM\n",
			gpa, (intmax_t)size);
		return 2;
	}
	l = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, gpa);
	if (l == MAP_FAILED)
		return die("mmap of the guest's RAM");
	if (l->nonce != nonce) {
		fprintf(stderr, "vt3-litmus: page 0x%" PRIx64 " holds nonce %" PRIu64 ", not %" PRIu64 "\n",
			gpa, l->nonce, nonce);
		return 2;
	}

	until = now_s() + WAIT_S;
	__atomic_store_n(&l->go, GO_ADDS, __ATOMIC_RELEASE);
	while (__atomic_load_n(&l->guest_done, __ATOMIC_ACQUIRE) != GO_ADDS) {
		add_burst(l, &adds);
		if (now_s() > until) {
			fprintf(stderr, "vt3-litmus: the guest did not finish its adds in %d s\n", WAIT_S);
			return 2;
		}
	}
	adds_lost = report("adds", adds, ONCE(l->guest_count),
			   __atomic_load_n(&l->counter, __ATOMIC_SEQ_CST));
	printf("\n");

	until = now_s() + WAIT_S;
	__atomic_store_n(&l->go, GO_LOCK, __ATOMIC_RELEASE);
	while (__atomic_load_n(&l->guest_done, __ATOMIC_ACQUIRE) != GO_LOCK) {
		for (int i = 0; i < 1024; i++, entries++)
			if (!lock_pass(l, HOST, until, &overlaps)) {
				fprintf(stderr, "vt3-litmus: the guest held the lock for %d s\n", WAIT_S);
				return 2;
			}
		if (now_s() > until) {
			fprintf(stderr, "vt3-litmus: the guest did not finish its lock passes in %d s\n", WAIT_S);
			return 2;
		}
	}
	guest_overlaps = ONCE(l->guest_overlaps);
	entries_lost = report("lock", entries, ONCE(l->guest_count), ONCE(l->entries));
	printf(", overlaps %" PRIu64 "\n", overlaps + guest_overlaps);
	return adds_lost == 0 && entries_lost == 0 && overlaps + guest_overlaps == 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
	if (argc == 3 && !strcmp(argv[1], "guest"))
		return guest(strtod(argv[2], NULL));
	if (argc == 5 && !strcmp(argv[1], "host"))
		return host(argv[2], strtoull(argv[3], NULL, 0), strtoull(argv[4], NULL, 0));
	fprintf(stderr, "usage: vt3-litmus guest SECONDS | host QEMU_PID PAGE NONCE\n");
	return 2;
}
