// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
#include "vt3-datapath.h"

/*
 * The doorbell is rung outside the CQ's lock: a syscall must not hold up
 * the application's other threads polling the same CQ. The doorbell is a
 * post command without WRs (ibv_cmd_post_send/_recv with none); this
 * program defines both, which the provider's calls resolve to (an
 * executable's definition comes first), and passes them on to
 * libibverbs'. While doorbell_watch is set, a doorbell waits there until
 * a second thread has polled the CQ. Were the provider holding the CQ's
 * lock across it, that poll could not finish before the doorbell
 * returned; the wait is bounded so that the check ends either way.
 */
#define DOORBELL_WAIT_S		10

static struct {
	bool watch;
	struct ibv_cq *cq;
	int doorbells;		/* doorbells rung while watching */
	int polled;		/* polls that finished inside a doorbell */
	int polled_wcs;		/* what those polls returned */
	pthread_t poller;
	bool waiting;		/* the poll outlived its doorbell's deadline */
} doorbell_watch;

static void *poll_inside_doorbell(void *arg)
{
	struct ibv_wc wc;

	(void)arg;
	return (void *)(intptr_t)ibv_poll_cq(doorbell_watch.cq, 1, &wc);
}

/*
 * A doorbell rung while watching: another thread polls before it goes on.
 * A poll still waiting at the deadline waits for a lock the provider
 * holds: the check joins it once the provider's call returned.
 */
static void doorbell_rendezvous(void)
{
	struct timespec deadline;
	void *got;

	if (!doorbell_watch.watch)
		return;
	doorbell_watch.doorbells++;
	if (doorbell_watch.waiting || pthread_create(&doorbell_watch.poller, NULL, poll_inside_doorbell, NULL))
		return;
	clock_gettime(CLOCK_REALTIME, &deadline);
	deadline.tv_sec += DOORBELL_WAIT_S;
	if (pthread_timedjoin_np(doorbell_watch.poller, &got, &deadline)) {
		doorbell_watch.waiting = true;
		return;
	}
	doorbell_watch.polled++;
	doorbell_watch.polled_wcs += (int)(intptr_t)got;
}

int ibv_cmd_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr);
int ibv_cmd_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr);

int ibv_cmd_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr)
{
	static int (*real)(struct ibv_qp *, struct ibv_send_wr *, struct ibv_send_wr **);

	if (!real)
		real = (typeof(real))dlsym(RTLD_NEXT, "ibv_cmd_post_send");
	if (!wr)
		doorbell_rendezvous();
	return real ? real(qp, wr, bad_wr) : ENOSYS;
}

int ibv_cmd_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
	static int (*real)(struct ibv_qp *, struct ibv_recv_wr *, struct ibv_recv_wr **);

	if (!real)
		real = (typeof(real))dlsym(RTLD_NEXT, "ibv_cmd_post_recv");
	if (!wr)
		doorbell_rendezvous();
	return real ? real(qp, wr, bad_wr) : ENOSYS;
}

/* Arming with a flush waiting rings a doorbell; other threads may poll meanwhile. */
bool check_doorbell_unlocked(struct env *e)
{
	struct ibv_send_wr wr;
	uint64_t id = 97;
	bool ok;

	TRY(make_cq(e, 0, true));
	TRY(make_qp(e, 0, 0, 0, false));
	TRY(to_state(e->qp[0], IBV_QPS_INIT));
	TRY(to_state(e->qp[0], IBV_QPS_ERR));
	send_wr(&wr, id, IBV_WR_SEND, 0, IBV_SEND_SIGNALED);
	TRY(post_send_ok(e->qp[0], &wr, "a SEND in ERR"));
	doorbell_watch = (typeof(doorbell_watch)){ .watch = true, .cq = e->cq[0] };
	ok = !ibv_req_notify_cq(e->cq[0], 0);
	doorbell_watch.watch = false;
	if (doorbell_watch.waiting)
		pthread_join(doorbell_watch.poller, NULL);	/* the lock is free now */
	EXPECT(ok, "ibv_req_notify_cq failed");
	EXPECT(doorbell_watch.doorbells == 1, "%d doorbells rung while arming, want 1", doorbell_watch.doorbells);
	EXPECT(doorbell_watch.polled == 1,
	       "a poll on another thread waited %d s for the doorbell's syscall: the CQ's lock is held across it",
	       DOORBELL_WAIT_S);
	EXPECT(doorbell_watch.polled_wcs == 1, "the poll inside the doorbell returned %d completions, want the flush (1)",
	       doorbell_watch.polled_wcs);
	TRY(wait_event(e, e->cq[0], WAIT_MS));
	return no_completions(e->cq[0], "after the flushed SEND was polled");
}
