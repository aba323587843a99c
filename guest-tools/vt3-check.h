/* SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB */
/*
 * The check lines of a vt3 guest test program, as the full-system cases
 * read them: "ok   NAME" or "FAIL NAME: why", one a check, then
 * "PROG: N passed, N failed". Define VT3_CHECK_PROG (the program's name)
 * before including; the counters are the including program's own.
 */
#ifndef VT3_CHECK_H
#define VT3_CHECK_H

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int passed, failed;

static inline __attribute__((format(printf, 3, 4)))
void check(bool ok, const char *name, const char *fmt, ...)
{
	va_list ap;

	if (ok) {
		passed++;
		printf("ok   %s\n", name);
	} else {
		failed++;
		printf("FAIL %s: ", name);
		va_start(ap, fmt);
		vprintf(fmt, ap);
		va_end(ap);
		printf("\n");
	}
	fflush(stdout);
}

/* The closing line; the exit status it calls for. */
static inline int check_summary(void)
{
	printf(VT3_CHECK_PROG ": %d passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}

/* A step without which nothing more can be checked: a failure, the end. */
static inline __attribute__((noreturn)) void die(const char *what)
{
	printf("FAIL setup: %s: %s\n", what, strerror(errno));
	failed++;
	exit(check_summary());
}

static inline double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

#endif /* VT3_CHECK_H */
