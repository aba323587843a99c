#!/usr/bin/env bash
# Deliberately broken builds must turn the suite red, for the right reason
# (docs/architecture.md §7.6). Each mutant is a patched copy of this checkout
# in a temp dir, with its own images, rdma-core build and cargo target dir
# (copies of the caches, so only what the patch touches is rebuilt; the shared
# caches are never written). Not part of CI: `./run-vm.sh mutants [NAME…]`.
#
#   skip-flush     libvt3 never flushes the last WR of a queue
#   double-flush   libvt3 delivers the last flush of a queue twice
#   cqe-after-err  vt3d writes a CQE for an outstanding receive after it set
#                  the QP's error flag
#   late-event-disarms  vt3.ko clears a CQ's 'armed' on every device CQ
#                  event, also one answering an older arm (the lost wake-up
#                  of issue 12: a later error kick is skipped)
#   no-freeze      libvt3 ignores VT3_CQ_F_FROZEN: after vt3.ko declared
#                  the device lost, CQEs vt3d still writes are taken and
#                  the flush trusts vt3d's consumer index
#   lost-flush-from-cons  vt3.ko flushes a lost device's kernel QPs from
#                  vt3d's consumer index (WQEs retired after the freeze
#                  never complete: the bug mute-commands found)
#   slot-by-cons   vt3.ko lets a kernel SQ's slots be reused once vt3d's
#                  consumer index passed them, before their CQEs were
#                  taken (a lost device's flush reads overwritten WQEs)
#   free-unknown   vt3.ko frees the memory of a command whose outcome is
#                  unknown (its reply lost) instead of keeping it as an
#                  orphan: vt3d may write into pages given back
#   fatal-before-flags  vt3.ko sends DEVICE_FATAL for a lost device before
#                  it sets the QPs' error flags (and holds the window open
#                  200 ms, as a busy guest might): libvt3 notes nothing
#                  when the event is read
#   close-withheld vt3.ko never sends the CLOSE of a connection ended while
#                  the device is being removed (iw_cm keeps its QP
#                  reference: a ULP's destroy_qp in its DEVICE_REMOVAL
#                  handler waits for ever)
#   srq-flush-on-error  libvt3 flushes a user SRQ's WQEs when one of its
#                  QPs fails (they belong to the other QPs)
#   ksrq-flush-on-error vt3.ko does the same to a kernel SRQ
#   srq-lost-unflushed  libvt3 never flushes a lost device's SRQ WQEs (the
#                  ones a QP had taken complete nowhere)
#   srq-lost-late-ignored libvt3 decides only at a QP's first error
#                  whether its queue flushes the SRQ after a device loss:
#                  QPs in error before the loss never flush it
#   ksrq-lost-unflushed vt3.ko does the same to a kernel SRQ
#   srq-flushed-on-error  srq-flush-on-error's patch, killed by the fault
#                  soak (chaos) instead of the SRQ conformance case
#   srq-completes-twice  libvt3 returns the CQE of one SRQ WQE in 61 twice
#   srq-post-lost  libvt3 drops one SRQ WR in 101 at ibv_post_srq_recv
#                  (success returned, the WQE never written): it never
#                  completes and is not left in the SRQ (the chaos run's
#                  drain of what the SRQ holds must miss it)
#   srq-no-last-wqe  vt3.ko never reports IB_EVENT_QP_LAST_WQE_REACHED
#   destroyed-qp-relinked  vt3.ko lets a device loss put a kernel QP back
#                  on its CQ's flush list after destroy_qp took it off
#                  (and holds the loss's QP reference 1 s before it takes
#                  the QP's lock, as a busy guest might): the freed QP's
#                  SQ is flushed again after destroy_qp returned
#   destroyed-qp-completes vt3.ko still delivers the flush completions a
#                  destroyed kernel QP owed, with wc->qp NULL (kernel ULPs
#                  dereference it)
#   flush-after-ring  vt3.ko returns flush completions only once a poll
#                  emptied the CQ's ring: ib_drain_qp starves while
#                  another QP keeps a shared CQ busy
#   rereg-keeps-pages  vt3d takes a re-registration's new translation
#                  (iova, length) but keeps the old pages
#   rereg-ignores-windows  the engine's rereg rules let an MR with bound
#                  windows be re-registered
#   rereg-ignores-access  the engine's rereg keeps the old rights
#   srq-resize-old-mask  libvt3's SRQ resize keeps the old ring's mask
#                  (posts land at index & (old depth - 1) of the new ring)
#   ksrq-resize-drops-slots  vt3.ko's resize of a kernel SRQ does not
#                  carry its slot records (WR ids, owed) to the new table:
#                  the receives posted before it never complete
#   resize-no-wqe-copy  vt3.ko's SRQ resize does not copy the WQEs into the
#                  new ring; it survives the system cases (vt3d had fetched
#                  every posted WQE before the resize), so it is not in
#                  ALL_MUTANTS (docs/srq-resize.md)
#   qp-calloc      libvt3 allocates its QP structs with calloc(): the
#                  vendor event names its QP by the low 32 bits of the
#                  address only, and two QPs 4 GiB apart share them
#   doorbell-under-lock libvt3 rings the doorbell (a syscall) of a queue
#                  owing a flush while it holds the CQ's lock: the
#                  application's other threads polling that CQ wait
#   srq-slot-kept  libvt3 keeps the SRQ slot of a receive completion its
#                  QP's destroy discarded (ibv_post_srq_recv ENOMEM with room)
#   wr-abort-posts libvt3's ibv_wr_abort publishes the batch like
#                  ibv_wr_complete
#   cq-ex-peeks    libvt3's ibv_start_poll/next_poll leave a successful
#                  completion in the ring: ibv_poll_cq returns it again
#   cq-ex-byte-len libvt3's ibv_wc_read_byte_len is one off
#   unimport-deregs  libvt3's ibv_unimport_mr deregisters the MR: the
#                  creator's MR is gone under it
#   import-pd-unchecked  libvt3's ibv_import_pd takes any handle without
#                  asking vt3.ko (a handle of an MR, or of nothing, "imported")
#   import-ctx-unchecked  vt3.ko answers an import's query of the context
#                  with zeroes: libvt3 must refuse the ABI it cannot check
#   toe-due-timers-only  vt3d's TOE queues a socket's timer only when it is
#                  due already: an idle connection's retransmission,
#                  keep-alive and user timeout never fire (a blackholed
#                  connection never times out)
#   gso-segment-size vt3d's udp uplink tells the kernel a UDP_SEGMENT size
#                  one octet larger than the frames of a run: the datagrams
#                  on the wire no longer hold one frame each (the udp pair)
#   hello-key-unchecked  vt3d answers a HELLO without checking its MAC
#                  under the provisioned key: a guest process that
#                  guesses gets challenges (docs/security.md, first contact)
#   hello-unproven  vt3d lets a HELLO alone end the live session (as v4
#                  did) and forgets the nonces it has seen: a sniffed
#                  HELLO replayed knocks the real driver's session over
#   watchdog-blind  vt3d's progress watchdog never reports a stall: a
#                  connection that stops with work waiting passes the
#                  health check
#   tap-segment-seq  vt3d's tap uplink gives every segment it cuts from a
#                  received TSO super-frame the super-frame's seq (the
#                  siw guest's TCP data arrives as duplicates and is sent
#                  again: 10-16 % of its segments, against 0-0.7 %)
#   lost-flush     libvt3 loses the first flush completion of a process (the
#                  flush passes the WR without returning it): VT3_WRCHECK
#                  must name it lost under rping's RST and under chaos
#                  (docs/wrcheck.md)
#   fabric-leak    the lab's hosts never delete their network namespaces
#                  (vt3lab/fabric.py): the bridges, taps and VXLAN devices
#                  in them outlive the lab
#   oversize-silent vt3d refuses a guest frame over its MTU without
#                  counting it (docs/hosts.md): the frame is lost unseen
#
# A mutant is KILLED when the cases fail and the failure report names the
# broken rule (REASON, a regex); SURVIVED when they pass; WRONG-REASON when
# they fail for something else. Exit 0 only when every mutant was killed.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=cache-dir.sh
source "$ROOT/tools/cache-dir.sh"
OUT=$ROOT/build/mutants

# CASES[name]: the cases that must kill it (default: the flush matrix's;
# MUTANT_CASES="CASE..." runs others instead).
# ENV[name]: environment for its run (e.g. a chaos plan).
# FILE2/ANCHOR2/REPLACEMENT2[name]: a second patch, for a mutant whose bug
# spans two places (e.g. a race and the sleep that widens its window).
declare -A FILE ANCHOR REPLACEMENT FILE2 ANCHOR2 REPLACEMENT2 REASON CASES ENV
DEFAULT_CASES="flush-datapath flush-local flush-rst"
FILE[skip-flush]=provider/cq.c
ANCHOR[skip-flush]='		wq->flush_pos++;
		wc[n++] = (struct ibv_wc){'
REPLACEMENT[skip-flush]='		wq->flush_pos++;
		if (wq->flush_pos == wq->prod) /* MUTANT */
			continue;
		wc[n++] = (struct ibv_wc){'
REASON[skip-flush]='missing wr_id|not every WR completed|WR[s]? without a completion'

FILE[double-flush]=provider/cq.c
ANCHOR[double-flush]='			.qp_num = wq->qp->ibv_qp.qp_num,
		};'
REPLACEMENT[double-flush]='			.qp_num = wq->qp->ibv_qp.qp_num,
		};
		if (n < num && wq->flush_pos == wq->prod) { /* MUTANT */
			wc[n] = wc[n - 1];
			n++;
		}'
REASON[double-flush]='completed twice|duplicate|an extra'

FILE[cqe-after-err]=device/src/rnic/datapath.rs
ANCHOR[cqe-after-err]='        publish_state(mem, qp.status_addr, to);'
REPLACEMENT[cqe-after-err]='        publish_state(mem, qp.status_addr, to);
        // MUTANT: the first outstanding receive completes after the error flag.
        let late = (to == QpState::Error && qp.rq_work.consumed != qp.rq_work.fetched)
            .then(|| qp.rq.entry_addr(qp.rq_work.consumed))
            .flatten()
            .and_then(|a| mem.read_obj::<RqWqe>(a).ok())
            .map(|w| (qp.recv_cqn, w.wr_id.to_native()));
        if let Some((cqn, wr_id)) = late {
            let c = Completion { qpn, queue: WorkQueue::Recv, wr_id, opcode: engine::WcOpcode::Recv,
                status: WcStatus::Success, byte_len: 0, invalidated_stag: None, solicited: false, signaled: true };
            self.post_cqe(mem, cqn, &wqe::cqe(&c, qp.rq_work.consumed), false);
        }
        let Some(qp) = self.qps.get_mut(qpn) else { return };'
REASON[cqe-after-err]='completed twice|after a FLUSH_ERR|order or duplicate|an extra'

FILE[late-event-disarms]=guest-driver/vt3_cq.c
ANCHOR[late-event-disarms]='		 * completion event at worst, which consumers tolerate.
		 */
		vt3_cq_notify(cq);'
REPLACEMENT[late-event-disarms]='		 * completion event at worst, which consumers tolerate.
		 */
		atomic_set(&cq->armed, 0); /* MUTANT */
		vt3_cq_notify(cq);'
REASON[late-event-disarms]='the error kick never came|hangs in ib_drain_qp'
CASES[late-event-disarms]=kchaos

FILE[no-freeze]=provider/cq.c
ANCHOR[no-freeze]='	return vt3_load_acquire(&cq->status->flags) & VT3_CQ_F_FROZEN;'
REPLACEMENT[no-freeze]='	return false; /* MUTANT */'
REASON[no-freeze]='after a FLUSH_ERR|completed twice|out of posting order|lost: no completion'
CASES[no-freeze]=chaos
ENV[no-freeze]='VT3_CHAOS_PLAN=1:mute-commands;1:mute-commands;1:mute-commands;1:mute-commands'

FILE[close-withheld]=guest-driver/vt3_cm.c
ANCHOR[close-withheld]='	if (owed) {'
REPLACEMENT[close-withheld]='	if (owed && 0) { /* MUTANT */'
REASON[close-withheld]='no answer within [0-9]+ s to: rmmod vt3'
CASES[close-withheld]=kchaos
ENV[close-withheld]='VT3_CHAOS_PLAN=1:rmmod'

FILE[lost-flush-from-cons]=guest-driver/vt3_flush.c
ANCHOR[lost-flush-from-cons]='	return cq->frozen || READ_ONCE(to_vt3_dev(qp->ibqp.device)->ctrl.lost);'
REPLACEMENT[lost-flush-from-cons]='	return false; /* MUTANT */'
REASON[lost-flush-from-cons]='WRs without a completion'
CASES[lost-flush-from-cons]=kchaos
ENV[lost-flush-from-cons]='VT3_CHAOS_PLAN=1:mute-commands;1:mute-commands'

FILE[slot-by-cons]=guest-driver/vt3_qp.c
ANCHOR[slot-by-cons]='	cons = flushing ? qp->sq_flush : smp_load_acquire(&qp->sq_done);'
REPLACEMENT[slot-by-cons]='	cons = flushing ? qp->sq_flush : le32_to_cpu(smp_load_acquire(&st->sq_cons)); /* MUTANT */'
REASON[slot-by-cons]='WRs without a completion|twice|duplicate|not posted'
CASES[slot-by-cons]=kchaos
ENV[slot-by-cons]='VT3_CHAOS_PLAN=1:mute-commands;1:mute-commands;1:mute-commands'

FILE[free-unknown]=guest-driver/vt3_mem.c
ANCHOR[free-unknown]='	list_add_tail(&mem->orphan, &dev->orphans);
	dev->orphaned++;'
REPLACEMENT[free-unknown]='	spin_unlock(&dev->orphan_lock);
	vt3_pages_put(mem); /* MUTANT */
	return;'
REASON[free-unknown]='kept .* orphans over'
CASES[free-unknown]=unknown-outcome

FILE[fatal-before-flags]=guest-driver/vt3_cm.c
ANCHOR[fatal-before-flags]='	vt3_cq_freeze_all(dev);
	while ((qp = vt3_qp_get_next(dev, &qpn))) {'
REPLACEMENT[fatal-before-flags]='	vt3_cq_freeze_all(dev);
	vt3_device_fatal_event(dev); /* MUTANT */
	msleep(200);
	while ((qp = vt3_qp_get_next(dev, &qpn))) {'
REASON[fatal-before-flags]='not every WR completed|completions came only'
CASES[fatal-before-flags]=flush-vt3d-killed

FILE[srq-flush-on-error]=provider/qp.c
ANCHOR[srq-flush-on-error]='	wq->srq_lost = wq->recv && wq->qp->srq && wq->flush_at_done;'
REPLACEMENT[srq-flush-on-error]='	wq->srq_lost = wq->recv && wq->qp->srq; /* MUTANT */'
REASON[srq-flush-on-error]='FAIL no-flush: [0-9]+ completions after the error'
CASES[srq-flush-on-error]=srq

# The soak's SRQ runs: a fixed first seed whose 6 runs put QPs on SRQs.
CHAOS_SRQ_ENV='VT3_CHAOS_SEED=5000 VT3_CHAOS_PLAN=6:'
FILE[srq-flushed-on-error]=${FILE[srq-flush-on-error]}
ANCHOR[srq-flushed-on-error]=${ANCHOR[srq-flush-on-error]}
REPLACEMENT[srq-flushed-on-error]=${REPLACEMENT[srq-flush-on-error]}
REASON[srq-flushed-on-error]='its SRQ WR #[0-9]+ in error: a QP.s error flushes nothing of its SRQ'
CASES[srq-flushed-on-error]=chaos
ENV[srq-flushed-on-error]=$CHAOS_SRQ_ENV

FILE[srq-completes-twice]=provider/cq.c
ANCHOR[srq-completes-twice]='			wc[n++].wr_id = wr_id;'
REPLACEMENT[srq-completes-twice]='			wc[n++].wr_id = wr_id;
			if ((cqe->flags & VT3_CQE_SRQ) && n < num && le32toh(cqe->wqe_idx) % 61 == 60) { /* MUTANT */
				wc[n] = wc[n - 1];
				n++;
			}'
REASON[srq-completes-twice]='srq[0-9] wr [0-9]+ completed twice'
CASES[srq-completes-twice]=chaos
ENV[srq-completes-twice]=$CHAOS_SRQ_ENV

FILE[srq-post-lost]=provider/srq.c
ANCHOR[srq-post-lost]='		vt3_fill_recv_wqe(wqe, wr);'
REPLACEMENT[srq-post-lost]='		if ((uint32_t)wr->wr_id % 101 == 100) /* MUTANT: never written */
			continue;
		vt3_fill_recv_wqe(wqe, wr);'
REASON[srq-post-lost]='never completed and not in the SRQ: lost|never completed after the device was lost'
CASES[srq-post-lost]=chaos
ENV[srq-post-lost]=$CHAOS_SRQ_ENV

FILE[srq-no-last-wqe]=guest-driver/vt3_qp.c
ANCHOR[srq-no-last-wqe]='	vt3_qp_ib_event(qp, IB_EVENT_QP_LAST_WQE_REACHED);'
REPLACEMENT[srq-no-last-wqe]='	/* MUTANT: never reported */'
REASON[srq-no-last-wqe]='no LAST_WQE_REACHED \(a QP of srq'
CASES[srq-no-last-wqe]=chaos
ENV[srq-no-last-wqe]=$CHAOS_SRQ_ENV

FILE[ksrq-flush-on-error]=guest-driver/vt3_flush.c
ANCHOR[ksrq-flush-on-error]='	    (!qp->ibqp.srq || vt3_cons_untrusted(qp, rcq))) {'
REPLACEMENT[ksrq-flush-on-error]='	    (1 || !qp->ibqp.srq || vt3_cons_untrusted(qp, rcq))) { /* MUTANT */'
REASON[ksrq-flush-on-error]='FAIL no SRQ receive flushed by the QPs'
CASES[ksrq-flush-on-error]=vt3-ksrq

FILE[srq-lost-unflushed]=provider/cq.c
ANCHOR[srq-lost-unflushed]='			if (wq->srq_lost)'
REPLACEMENT[srq-lost-unflushed]='			if (0 && wq->srq_lost) /* MUTANT */'
REASON[srq-lost-unflushed]='FAIL lost-flush: 0 of'
CASES[srq-lost-unflushed]=srq-device-fatal

FILE[srq-lost-late-ignored]=provider/qp.c
ANCHOR[srq-lost-late-ignored]='		if (!wq->srq_lost && wq->recv && wq->qp->srq &&'
REPLACEMENT[srq-lost-late-ignored]='		if (0 && !wq->srq_lost && wq->recv && wq->qp->srq && /* MUTANT */'
REASON[srq-lost-late-ignored]='FAIL lost-flush: 0 of'
CASES[srq-lost-late-ignored]=srq-device-fatal-errored

FILE[ksrq-lost-unflushed]=guest-driver/vt3_srq.c
ANCHOR[ksrq-lost-unflushed]='	if (vt3_srq_flushes_here(srq, qp)) {'
REPLACEMENT[ksrq-lost-unflushed]='	if (0 && vt3_srq_flushes_here(srq, qp)) { /* MUTANT */'
REASON[ksrq-lost-unflushed]='FAIL 0 of [0-9]+ SRQ receives flushed once'
CASES[ksrq-lost-unflushed]=vt3-ksrq-device-fatal

FILE[destroyed-qp-relinked]=guest-driver/vt3_flush.c
ANCHOR[destroyed-qp-relinked]='	if (!qp->sq_flushing && !qp->destroyed) {'
REPLACEMENT[destroyed-qp-relinked]='	if (!qp->sq_flushing) { /* MUTANT */'
FILE2[destroyed-qp-relinked]=guest-driver/vt3_cm.c
ANCHOR2[destroyed-qp-relinked]='	while ((qp = vt3_qp_get_next(dev, &qpn))) {
		mutex_lock(&qp->state_lock);
		vt3_qp_enter_error(qp);'
REPLACEMENT2[destroyed-qp-relinked]='	while ((qp = vt3_qp_get_next(dev, &qpn))) {
		msleep(1000); /* MUTANT: a busy guest between the reference and the lock */
		mutex_lock(&qp->state_lock);
		vt3_qp_enter_error(qp);'
REASON[destroyed-qp-relinked]='after ib_destroy_qp returned|completed twice|list_(add|del) corruption|BUG: kernel NULL pointer dereference|BUG: unable to handle|general protection fault'
CASES[destroyed-qp-relinked]=kchaos
ENV[destroyed-qp-relinked]='VT3_CHAOS_PLAN=1:device-fatal;1:device-fatal;1:device-fatal;1:device-fatal'

FILE[destroyed-qp-completes]=guest-driver/vt3_flush.c
ANCHOR[destroyed-qp-completes]='/* Up to @num flush completions of @cq'"'"'s QPs; cq->lock held. */
int vt3_qp_poll_flush(struct vt3_cq *cq, int num, struct ib_wc *wc)
{
	struct vt3_qp *qp;
	int n = 0;

	lockdep_assert_held(&cq->lock);'
REPLACEMENT[destroyed-qp-completes]='/* MUTANT: a destroyed QP'"'"'s flush completions, kept on its CQ, wc->qp NULL. */
struct vt3_mutant_orphan {
	struct list_head node;
	struct vt3_cq *cq;
	struct ib_wc wc;
};
static LIST_HEAD(vt3_mutant_orphans);
static DEFINE_SPINLOCK(vt3_mutant_lock);

static void vt3_mutant_orphan_add(struct vt3_cq *cq, struct ib_wc *wc, int n)
{
	struct vt3_mutant_orphan *o;
	int i;

	for (i = 0; i < n; i++) {
		o = kmalloc(sizeof(*o), GFP_ATOMIC);
		if (!o)
			return;
		o->cq = cq;
		o->wc = wc[i];
		o->wc.qp = NULL;
		spin_lock(&vt3_mutant_lock);
		list_add_tail(&o->node, &vt3_mutant_orphans);
		spin_unlock(&vt3_mutant_lock);
	}
}

static void vt3_mutant_orphan_flush(struct vt3_qp *qp, struct vt3_cq *scq,
				    struct vt3_cq *rcq)
{
	struct ib_wc wc[4];
	int n;

	if (qp->sq_flushing && !qp->sq_flush_at_done)
		while ((n = vt3_flush_sq(qp, ARRAY_SIZE(wc), wc)) > 0)
			vt3_mutant_orphan_add(scq, wc, n);
	if (qp->rq_flushing && !qp->rq_flush_at_done && !qp->ibqp.srq)
		while ((n = vt3_flush_rq(qp, ARRAY_SIZE(wc), wc)) > 0)
			vt3_mutant_orphan_add(rcq, wc, n);
}

/* Up to @num flush completions of @cq'"'"'s QPs; cq->lock held. */
int vt3_qp_poll_flush(struct vt3_cq *cq, int num, struct ib_wc *wc)
{
	struct vt3_mutant_orphan *o, *tmp;
	struct vt3_qp *qp;
	int n = 0;

	lockdep_assert_held(&cq->lock);
	spin_lock(&vt3_mutant_lock);
	list_for_each_entry_safe(o, tmp, &vt3_mutant_orphans, node) {
		if (n == num)
			break;
		if (o->cq != cq)
			continue;
		wc[n++] = o->wc;
		list_del(&o->node);
		kfree(o);
	}
	spin_unlock(&vt3_mutant_lock);
	if (n == num)
		return n;'
FILE2[destroyed-qp-completes]=guest-driver/vt3_flush.c
ANCHOR2[destroyed-qp-completes]='	spin_lock(&qp->sq_lock);
	spin_lock_nested(&qp->rq_lock, SINGLE_DEPTH_NESTING);
	qp->destroyed = true;'
REPLACEMENT2[destroyed-qp-completes]='	vt3_mutant_orphan_flush(qp, scq, rcq); /* MUTANT */
	spin_lock(&qp->sq_lock);
	spin_lock_nested(&qp->rq_lock, SINGLE_DEPTH_NESTING);
	qp->destroyed = true;'
REASON[destroyed-qp-completes]='FAIL nothing of the destroyed QP'
CASES[destroyed-qp-completes]=verbs

FILE[flush-after-ring]=guest-driver/vt3_cq.c
ANCHOR[flush-after-ring]='	n = vt3_qp_poll_flush(cq, num, wc);
	rcu_read_lock();'
REPLACEMENT[flush-after-ring]='	rcu_read_lock(); /* MUTANT: flush completions only once the ring is drained */'
FILE2[flush-after-ring]=guest-driver/vt3_cq.c
ANCHOR2[flush-after-ring]='	smp_store_release(&st->cons, cpu_to_le32(cq->cons));
	spin_unlock_irqrestore(&cq->lock, flags);
	return n;'
REPLACEMENT2[flush-after-ring]='	smp_store_release(&st->cons, cpu_to_le32(cq->cons));
	if (n < num && cq->cons == prod) /* MUTANT */
		n += vt3_qp_poll_flush(cq, num - n, wc + n);
	spin_unlock_irqrestore(&cq->lock, flags);
	return n;'
REASON[flush-after-ring]='ib_drain_qp starved'
CASES[flush-after-ring]=kchaos
ENV[flush-after-ring]='VT3_CHAOS_PLAN=1:disconnect'


FILE[doorbell-under-lock]=provider/cq.c
ANCHOR[doorbell-under-lock]='		if (pending) {
			ring = wq;
			__atomic_add_fetch(&cq->ringing, 1, __ATOMIC_ACQ_REL);
			break;
		}'
REPLACEMENT[doorbell-under-lock]='		if (pending) {
			vt3_wq_doorbell(wq); /* MUTANT: under cq->lock */
			break;
		}'
REASON[doorbell-under-lock]="the CQ's lock is held across it"
CASES[doorbell-under-lock]=flush-datapath

FILE[qp-calloc]=provider/verbs.c
ANCHOR[qp-calloc]='	qp = vt3_qp_alloc();'
REPLACEMENT[qp-calloc]='	qp = calloc(1, sizeof(*qp)); /* MUTANT: anywhere in the address space */'
REASON[qp-calloc]='ibv_destroy_qp (of the decoy QP )?hangs|element.qp .* is not our QP'
CASES[qp-calloc]=flush-decoy-qp

FILE[no-pair]=device/src/rnic/pairing.rs
ANCHOR[no-pair]='            Some(PairRequest { peer: asked, port: listen_port }) if asked == qpn => {'
REPLACEMENT[no-pair]='            Some(PairRequest { peer: asked, port: listen_port }) if asked == qpn && qpn == u32::MAX => { // MUTANT: never paired'
REASON[no-pair]='FAIL pair: no completion of WR 1'
CASES[no-pair]=modify-connect

FILE[toe-due-timers-only]=iwarp/src/toe/smol/mod.rs
ANCHOR[toe-due-timers-only]='        let at = match (self.iface.poll_at(now, &entry.set), release_at) {'
REPLACEMENT[toe-due-timers-only]='        let at = match (self.iface.poll_at(now, &entry.set).filter(|&at| at <= now), release_at) { // MUTANT'
REASON[toe-due-timers-only]='timeout +[a-z-]+ +FAIL'
CASES[toe-due-timers-only]=flush-blackhole

FILE[srq-slot-kept]=provider/cq.c
ANCHOR[srq-slot-kept]='	if (srq && prod - cq->cons <= cq->depth)'
REPLACEMENT[srq-slot-kept]='	if (0 && srq && prod - cq->cons <= cq->depth) /* MUTANT */'
REASON[srq-slot-kept]='FAIL srq-forget'
CASES[srq-slot-kept]=qpex

FILE[wr-abort-posts]=provider/qp_ex.c
ANCHOR[wr-abort-posts]='	vt3_wq_post_end(&qp->sq, qp->sq.prod, qp->batch.error);'
REPLACEMENT[wr-abort-posts]='	uint32_t start = qp->sq.prod; /* MUTANT */

	qp->sq.prod = qp->batch.next;
	vt3_wq_post_end(&qp->sq, start, qp->batch.error);'
REASON[wr-abort-posts]='FAIL abort: an aborted batch made'
CASES[wr-abort-posts]=qpex

FILE[cq-ex-peeks]=provider/cq_ex.c
ANCHOR[cq-ex-peeks]='	if (!n)
		return ENOENT;'
REPLACEMENT[cq-ex-peeks]='	if (!n)
		return ENOENT;
	if (cq->cur.status == IBV_WC_SUCCESS) /* MUTANT */
		cq->cons--;'
REASON[cq-ex-peeks]='FAIL mixed: .* [1-9][0-9]* twice'
CASES[cq-ex-peeks]=qpex

FILE[cq-ex-byte-len]=provider/cq_ex.c
ANCHOR[cq-ex-byte-len]='	return vt3_cq_of_ex(cqx)->cur.byte_len;'
REPLACEMENT[cq-ex-byte-len]='	return vt3_cq_of_ex(cqx)->cur.byte_len + 1; /* MUTANT */'
REASON[cq-ex-byte-len]='FAIL batch: [1-9][0-9]* wrong'
CASES[cq-ex-byte-len]=qpex

FILE[rereg-keeps-pages]=iwarp/src/tpt.rs
ANCHOR[rereg-keeps-pages]='            Some(backing) if rereg.change & REREG_TRANSLATION != 0 => Some(std::mem::replace(&mut mr.backing, backing)),'
REPLACEMENT[rereg-keeps-pages]='            Some(backing) if rereg.change & REREG_TRANSLATION != 0 => Some(backing), // MUTANT: the old pages stay'
REASON[rereg-keeps-pages]='FAIL new-range'
CASES[rereg-keeps-pages]=rereg

FILE[rereg-ignores-windows]=iwarp/src/engine/rereg.rs
ANCHOR[rereg-ignores-windows]='    if windows_bound > 0 {'
REPLACEMENT[rereg-ignores-windows]='    if windows_bound > usize::MAX - 1 { // MUTANT: bound windows do not matter'
REASON[rereg-ignores-windows]='FAIL busy'
CASES[rereg-ignores-windows]=rereg

FILE[rereg-ignores-access]=iwarp/src/engine/rereg.rs
ANCHOR[rereg-ignores-access]='    if rereg.change & REREG_ACCESS != 0 {
        next.access = rereg.new.access;'
REPLACEMENT[rereg-ignores-access]='    if rereg.change & REREG_ACCESS != 0 && rereg.change == 0 { // MUTANT: the rights stay
        next.access = rereg.new.access;'
REASON[rereg-ignores-access]='FAIL narrowed'
CASES[rereg-ignores-access]=rereg
FILE[unimport-deregs]=provider/import.c
ANCHOR[unimport-deregs]='	free(verbs_get_mr(ibmr));'
REPLACEMENT[unimport-deregs]='	ibv_cmd_dereg_mr(verbs_get_mr(ibmr)); /* MUTANT: the shared MR destroyed */
	free(verbs_get_mr(ibmr));'
REASON[unimport-deregs]='FAIL creator-owns'
CASES[unimport-deregs]=import

FILE[import-pd-unchecked]=provider/import.c
ANCHOR[import-pd-unchecked]='	ret = execute_ioctl(ibctx, cmd);'
REPLACEMENT[import-pd-unchecked]='	ret = 0 && execute_ioctl(ibctx, cmd); /* MUTANT: any handle taken */'
REASON[import-pd-unchecked]='FAIL pd-not-a-pd'
CASES[import-pd-unchecked]=import

FILE[import-ctx-unchecked]=guest-driver/vt3_import.c
ANCHOR[import-ctx-unchecked]='	vt3_ucontext_resp(to_vt3_dev(ibuc->device), &resp);'
REPLACEMENT[import-ctx-unchecked]='	memset(&resp, 0, sizeof(resp)); /* MUTANT */'
REASON[import-ctx-unchecked]='FAIL import-device'
CASES[import-ctx-unchecked]=import
FILE[gso-segment-size]=device/src/uplink/gso.rs
ANCHOR[gso-segment-size]='                    segment,
                };'
REPLACEMENT[gso-segment-size]='                    segment: segment + 1, // MUTANT
                };'
# Every datagram after a run's first holds the tail of one frame and the
# head of the next: the guest drops them, WRITEs crawl on retransmissions.
REASON[gso-segment-size]='ib_write_bw .*iterations, 0\.0 Mpps|ib_write_bw .*(client|server) exit'
CASES[gso-segment-size]=udp-uplink-vt3-siw

FILE[tap-segment-seq]=device/src/uplink/tso.rs
ANCHOR[tap-segment-seq]='            let seq_j = seq.wrapping_add(u32::try_from(j * mss).unwrap_or(0));'
REPLACEMENT[tap-segment-seq]='            let seq_j = seq.wrapping_add(u32::try_from(j * mss).unwrap_or(0) * 0); // MUTANT'
# The receiver keeps the first segment of each super-frame only.
REASON[tap-segment-seq]='segments retransmitted|nc -N 10\.77\.0\.1 5001|received \['
CASES[tap-segment-seq]=tap-uplink-vt3-siw

FILE[srq-resize-old-mask]=provider/srq.c
ANCHOR[srq-resize-old-mask]='	srq->depth = want;
	ring = NULL;'
REPLACEMENT[srq-resize-old-mask]='	ring = NULL; /* MUTANT: srq->depth (the mask) stays */'
REASON[srq-resize-old-mask]='FAIL resize-'
CASES[srq-resize-old-mask]=srq

FILE[lost-flush]=provider/cq.c
ANCHOR[lost-flush]='		wq->flush_pos++;
		wc[n++] = (struct ibv_wc){'
REPLACEMENT[lost-flush]='		static int lost; /* MUTANT */

		wq->flush_pos++;
		if (!__atomic_fetch_add(&lost, 1, __ATOMIC_RELAXED))
			continue;
		wc[n++] = (struct ibv_wc){'
REASON[lost-flush]='wrcheck on rping [a-z]+ after the RST: [0-9]+ WR\(s\) lost|VT3_WRCHECK, rping [a-z]+: WRs lost'
CASES[lost-flush]="wrcheck chaos-rping"

FILE[fabric-leak]=vt3lab/fabric.py
ANCHOR[fabric-leak]='    subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)'
REPLACEMENT[fabric-leak]='    return  # MUTANT: the namespace stays'
REASON[fabric-leak]='left behind: \[.namespace vt3f'
CASES[fabric-leak]=hosts-cleanup

FILE[oversize-silent]=device/src/nic/mod.rs
ANCHOR[oversize-silent]='        let before = self.stats.tx_dropped_oversize.fetch_add(n, Ordering::Relaxed);'
REPLACEMENT[oversize-silent]='        let before = self.stats.tx_dropped_oversize.fetch_add(0, Ordering::Relaxed); // MUTANT'
REASON[oversize-silent]='vt3d vm1 counted 0 oversize frames, want the 3 pings'
CASES[oversize-silent]=hosts-mtu

FILE[ksrq-resize-drops-slots]=guest-driver/vt3_srq.c
ANCHOR[ksrq-resize-drops-slots]='		if (slots && srq->slots[idx & (srq->depth - 1)].idx == idx)'
REPLACEMENT[ksrq-resize-drops-slots]='		if (0 && slots && srq->slots[idx & (srq->depth - 1)].idx == idx) /* MUTANT */'
REASON[ksrq-resize-drops-slots]='vt3_ksrq: FAIL 0 of 22 receives'
CASES[ksrq-resize-drops-slots]=vt3-ksrq

FILE[resize-no-wqe-copy]=guest-driver/vt3_srq.c
ANCHOR[resize-no-wqe-copy]='		       VT3_WQE_SIZE);
		if (slots && srq->slots'
REPLACEMENT[resize-no-wqe-copy]='		       VT3_WQE_SIZE * 0); /* MUTANT: no WQE copied */
		if (slots && srq->slots'
REASON[resize-no-wqe-copy]='FAIL resize-|vt3_ksrq: FAIL'
CASES[resize-no-wqe-copy]='srq vt3-ksrq'

FILE[hello-key-unchecked]=device/src/control/auth.rs
ANCHOR[hello-key-unchecked]='        if m.hdr.counter.to_native() != 0 || mac(&self.key, m.covered) != m.mac {'
REPLACEMENT[hello-key-unchecked]='        if m.hdr.counter.to_native() != 0 { // MUTANT: the key is not checked'
REASON[hello-key-unchecked]='answered the attacker|refusal counters moved'
CASES[hello-key-unchecked]=ctrl-forgery

FILE[watchdog-blind]=device/src/rnic/watchdog.rs
ANCHOR[watchdog-blind]='                if !w.reported && now - w.since >= patience {'
REPLACEMENT[watchdog-blind]='                if false && !w.reported && now - w.since >= patience { // MUTANT'
REASON[watchdog-blind]='counted no stall'
CASES[watchdog-blind]=health-sees-a-stall

FILE[hello-unproven]=device/src/control/mod.rs
ANCHOR[hello-unproven]='                Ok(ctrl) => Outcome::Reply(build_frame(guest, guest, &ctrl)),'
REPLACEMENT[hello-unproven]='                Ok(ctrl) => {
                    // MUTANT: an unproven HELLO ends the live session.
                    rnic.reset();
                    self.session = None;
                    Outcome::Reply(build_frame(guest, guest, &ctrl))
                }'
FILE2[hello-unproven]=device/src/control/auth.rs
ANCHOR2[hello-unproven]='        if self.recent.iter().any(|c| c.driver_nonce == hello.driver_nonce) {'
REPLACEMENT2[hello-unproven]='        if false && self.recent.iter().any(|c| c.driver_nonce == hello.driver_nonce) { // MUTANT'
REASON[hello-unproven]='answered the attacker|refusal counters moved|perftest under attack|made a session|sessions began during the attack'
CASES[hello-unproven]=ctrl-forgery

ALL_MUTANTS=(skip-flush double-flush cqe-after-err late-event-disarms no-freeze close-withheld lost-flush-from-cons slot-by-cons
	free-unknown fatal-before-flags srq-flush-on-error ksrq-flush-on-error srq-lost-unflushed ksrq-lost-unflushed
	srq-flushed-on-error srq-completes-twice srq-post-lost srq-no-last-wqe
	destroyed-qp-relinked destroyed-qp-completes flush-after-ring qp-calloc doorbell-under-lock no-pair
	srq-slot-kept wr-abort-posts cq-ex-peeks cq-ex-byte-len rereg-keeps-pages rereg-ignores-windows rereg-ignores-access)
# SRQ resize (provider/srq.c, guest-driver/vt3_srq.c).
ALL_MUTANTS+=(srq-resize-old-mask ksrq-resize-drops-slots)
# A device lost under SRQ QPs already in error (provider/qp.c).
ALL_MUTANTS+=(srq-lost-late-ignored)
# VT3_WRCHECK's own proof (provider/wrcheck.c).
ALL_MUTANTS+=(lost-flush)
# The import path (provider/import.c, guest-driver/vt3_import.c).
ALL_MUTANTS+=(unimport-deregs import-pd-unchecked import-ctx-unchecked)
# The TOE's timer queue (iwarp/src/toe/smol/mod.rs).
ALL_MUTANTS+=(toe-due-timers-only)
# The udp uplink's GSO (device/src/uplink/gso.rs).
ALL_MUTANTS+=(gso-segment-size)
# The tap uplink's segmentation of received super-frames (device/src/uplink/tso.rs).
ALL_MUTANTS+=(tap-segment-seq)
# The first contact (device/src/control/).
ALL_MUTANTS+=(hello-key-unchecked hello-unproven watchdog-blind)
# Across hosts (vt3lab/fabric.py, device/src/nic/mod.rs).
ALL_MUTANTS+=(fabric-leak oversize-silent)

log() { printf '[mutants] %s\n' "$*" >&2; }

# patch FILE ANCHOR REPLACEMENT: the anchor replaced, or a clear error when
# it moved.
patch_file() {
	ANCHOR=$2 REPLACEMENT=$3 /usr/bin/python3 - "$1" <<'PY'
import os, sys
path = sys.argv[1]
src = open(path).read()
anchor, repl = os.environ["ANCHOR"], os.environ["REPLACEMENT"]
if src.count(anchor) != 1:
    sys.exit(f"mutants: the anchor is not in {path} exactly once: update tools/mutants.sh")
open(path, "w").write(src.replace(anchor, repl))
PY
}

# mutate NAME DIR: the mutant's patch (and its second one, if any).
mutate() {
	local name=$1 dir=$2
	patch_file "$dir/${FILE[$name]}" "${ANCHOR[$name]}" "${REPLACEMENT[$name]}" || return 1
	[ -z "${FILE2[$name]:-}" ] ||
		patch_file "$dir/${FILE2[$name]}" "${ANCHOR2[$name]}" "${REPLACEMENT2[$name]}"
}

run_mutant() {
	local name=$1 dir out
	dir=$(mktemp -d "${TMPDIR:-/tmp}/vt3-mutant-$name.XXXXXX")
	out=$OUT/$name
	rm -rf "$out" && mkdir -p "$out"
	log "$name: copying the checkout and the caches to $dir"
	(cd "$ROOT" && git ls-files -z | xargs -0 cp --parents -t "$dir")
	mutate "$name" "$dir" || return 2
	mkdir -p "$dir/images" "$dir/target"
	# The overlays are rebuilt from the mutant's tree: copying them (the
	# pyverbs one is ~110 MB) would only be thrown away.
	(cd "$VT3_CACHE/images" && find . -mindepth 1 -maxdepth 1 \
		! -name initramfs-vt3.cpio ! -name initramfs-pyverbs.cpio \
		-exec cp -a -t "$dir/images/" {} +)
	cp -a "$VT3_CACHE/rdma-core" "$dir/rdma-core"
	cp -a "$VT3_CACHE/target/release" "$dir/target/"
	# MUTANT_CASES: other cases to kill it with (a new case's proof).
	local cases=${MUTANT_CASES:-${CASES[$name]:-$DEFAULT_CASES}}
	log "$name: $cases with the mutant (log: $out/run.log)"
	local rc=0
	# The first failure is enough; two styles keep a mutant that makes
	# every run wait for its timeout short. ENV and the cases are lists of
	# words: split on purpose.
	# shellcheck disable=SC2086
	(cd "$dir" && export ${ENV[$name]:-VT3_MUTANT=$name} && VT3_IMAGES=$dir/images VT3_RDMA_CORE_WORK=$dir/rdma-core CARGO_TARGET_DIR=$dir/target \
		VT3_RESULTS=$dir/build/test-results VT3_FLUSH_STYLES=events,poll VT3_PYTEST_ARGS=--maxfail=1 \
		./run-vm.sh test $cases) >"$out/run.log" 2>&1 || rc=$?
	cp -a "$dir/build/test-results/." "$out/" 2>/dev/null || true
	local reasons
	reasons=$(cat "$out"/system/*/failure-*.txt 2>/dev/null | grep -E "^E .*(FAIL|Error)" | head -n 20 || true)
	if [ "$rc" -eq 0 ]; then
		RESULT[$name]="SURVIVED: $(tail -n 1 "$out/run.log")"
	elif grep -qE "${REASON[$name]}" "$out/run.log" "$out"/system/*/failure-*.txt 2>/dev/null; then
		RESULT[$name]="KILLED: $(tail -n 1 "$out/run.log"); reason: $(grep -ohE "${REASON[$name]}[^\"]{0,80}" "$out/run.log" "$out"/system/*/failure-*.txt 2>/dev/null | head -n 1)"
	else
		RESULT[$name]="WRONG-REASON: $(tail -n 1 "$out/run.log"); first failures: $(printf '%s' "$reasons" | head -n 3 | tr '\n' ' ')"
	fi
	rm -rf "$dir"
}

# --check-anchors: every mutant's patch still applies (its anchors are in
# their files exactly once), without building anything: the lint stage
# runs it, so a refactor that moves an anchor fails the check, not a
# mutants run months later.
if [ "${1:-}" = --check-anchors ]; then
	bad=0
	for n in "${ALL_MUTANTS[@]}"; do
		for k in "" 2; do
			if [ -z "$k" ]; then
				file=${FILE[$n]:-} anchor=${ANCHOR[$n]:-}
			else
				file=${FILE2[$n]:-} anchor=${ANCHOR2[$n]:-}
			fi
			[ -n "$file" ] || continue
			count=$(ANCHOR=$anchor /usr/bin/python3 -c 'import os, sys; print(open(sys.argv[1]).read().count(os.environ["ANCHOR"]))' "$ROOT/$file")
			[ "$count" = 1 ] || { log "$n: anchor$k found $count times in $file"; bad=$((bad + 1)); }
		done
	done
	echo "mutants: ${#ALL_MUTANTS[@]} mutants, $bad anchors not found exactly once"
	[ "$bad" -eq 0 ]
	exit
fi

declare -A RESULT
names=("$@")
[ ${#names[@]} -gt 0 ] || names=("${ALL_MUTANTS[@]}")
for n in "${names[@]}"; do
	[ -n "${FILE[$n]:-}" ] || { log "unknown mutant $n (${ALL_MUTANTS[*]})"; exit 2; }
	run_mutant "$n" || RESULT[$n]="ERROR: could not build the mutant"
done
killed=0
for n in "${names[@]}"; do
	printf '%-14s %s\n' "$n" "${RESULT[$n]}"
	[[ ${RESULT[$n]} == KILLED* ]] && killed=$((killed + 1))
done
echo "$killed of ${#names[@]} mutants killed"
[ "$killed" -eq ${#names[@]} ]
