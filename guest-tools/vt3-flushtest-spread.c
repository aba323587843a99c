// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
#include "vt3-flushtest.h"

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

__thread bool spread_on;
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
