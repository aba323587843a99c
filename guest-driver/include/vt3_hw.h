/* SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB) */
/*
 * vt3_hw.h - the vt3 device interface: control frames between vt3.ko and
 * vt3d, work queue and completion queue entries, status pages.
 *
 * Single source of truth: vt3.ko and libvt3 include this file; vt3d
 * mirrors it in device/src/abi.rs, and a cargo test compiles this header
 * and compares the size and every field offset of every struct.
 *
 * All multi-byte fields are little endian. Every struct has a fixed size
 * (checked with static asserts at the end); reserved fields are zero.
 *
 * Control channel
 * ---------------
 * Ethernet frames of EtherType VT3_ETHERTYPE through the virtio-net netdev
 * vt3d backs. After the 14-byte Ethernet header comes a struct
 * vt3_ctrl_hdr, `len` bytes of payload and a MAC (below). The driver sends VT3_MSG_CMD
 * frames (destination: the netdev's own MAC) and vt3d answers each with one
 * VT3_MSG_RESP carrying the same `seq` and `opcode`, plus the response
 * payload when status is VT3_OK. vt3d sends VT3_MSG_EVENT frames on its own.
 * vt3d consumes every VT3_ETHERTYPE frame from the guest and never forwards
 * one to the uplink; it drops those arriving from the uplink; it never drops
 * its own frames to the guest (they wait while the RX ring is full).
 *
 * Who may drive the device (authentication)
 * -----------------------------------------
 * Threat model: any guest process may send and sniff raw frames on the NIC
 * (a packet socket needs only CAP_NET_RAW, which containers have), the
 * frames vt3.ko and vt3d exchange included, and may fill most of guest RAM
 * with data of its choice. It cannot read kernel memory or the firmware
 * configuration (root only). Guest-physical addresses are NOT secrets: they
 * cross the wire and repeat across boots. Only vt3.ko may command vt3d and
 * only vt3d may send vt3.ko responses and events, so no frame is trusted
 * for what it says; authority rests on a key that never appears on the
 * wire nor in memory a user can read:
 *
 * - Provisioned key. The launcher gives each guest a random 128-bit key
 *   K (VT3_KEY_LEN raw bytes, k0 and k1 little endian) out of band: to
 *   vt3d (`vt3d serve --key-file F`, F made 0600 if missing) and to the
 *   guest kernel through QEMU's firmware configuration device
 *   (`-fw_cfg name=VT3_FW_CFG_KEY,file=F`; libvirt: <sysinfo
 *   type='fwcfg'>), which vt3.ko reads from the qemu_fw_cfg module's
 *   sysfs file (mode 0400, root only). Without a key vt3d refuses to start
 *   and vt3.ko refuses to attach, each with a log line saying what to add,
 *   unless both are told to run unauthenticated (vt3d --insecure-no-key,
 *   vt3.ko insecure_no_key=1: K is all zeros, and any guest process can
 *   drive the device).
 * - First contact: a mutual proof of K with fresh nonces from both sides.
 *   1. vt3.ko sends VT3_CMD_HELLO (struct vt3_cmd_hello: a random driver
 *      nonce), counter 0, MAC under K.
 *   2. vt3d answers VT3_MSG_RESP HELLO (struct vt3_resp_hello: the driver
 *      nonce and a random device nonce), counter 0, MAC under K. vt3.ko
 *      takes it only for the nonce it is waiting for: vt3d proved K.
 *   3. Both derive the session key Ks (struct vt3_kdf_input, below):
 *      Ks.k0 = SipHash(K, VT3_KDF_LABEL_K0 | nonces),
 *      Ks.k1 = SipHash(K, VT3_KDF_LABEL_K1 | nonces).
 *      vt3.ko sends VT3_CMD_PROVE (struct vt3_cmd_prove: both nonces) as
 *      the first frame of the new session: counter 1, MAC under Ks.
 *   4. vt3d takes a PROVE only for a challenge it issued, not yet used and
 *      at most VT3_CHALLENGE_TTL_MS old; then, and only then, the new
 *      session replaces the old one (vt3d drops every object of the old
 *      session, as VT3_CMD_RESET) and vt3d answers under Ks.
 *   Ks never crosses the wire. A replayed HELLO gets the challenge it got
 *   before (or, once that was used, is refused); a replayed PROVE names a
 *   used challenge; a forged HELLO or PROVE fails its MAC. None of them
 *   touches the live session. vt3d counts refused HELLOs and PROVEs and
 *   takes at most a bucket of VT3_HELLO_BURST refusals, refilled at
 *   VT3_HELLO_RATE a second; past it HELLOs and PROVEs are dropped
 *   unchecked (ctrl_refused_hello_limited). Residual risk: a process that
 *   floods HELLOs delays a *new* session (probe, reload, vt3d restart)
 *   while the flood lasts; it cannot start one, learn K or Ks, or disturb
 *   a live session. Guest root (who can read K or load modules) is the
 *   kernel's equal and outside this model.
 * - Every frame of a session, both ways, carries a counter (in
 *   vt3_ctrl_hdr) and a MAC right after the `len` payload bytes:
 *   SipHash-2-4 with Ks over the header and the payload, little endian.
 *   Counters start at 1 and grow by one per frame sent in each direction;
 *   a receiver takes each counter once, within a window of
 *   VT3_CTRL_REPLAY_WINDOW below the highest it took (frames of several
 *   CPUs may overtake each other on the way). The type is covered, so a
 *   command cannot be reflected as an answer.
 * - Anything that fails these checks is refused: counted (vt3d ctl stats:
 *   ctrl_refused_*; vt3.ko: hw_counters ctrl_refused_*), never answered,
 *   and without effect on the session. A frame of another
 *   VT3_CTRL_VERSION is refused the same way, with a log line naming both
 *   versions. Control frames carry no VLAN tag: vt3d drops a frame of
 *   this EtherType under any number of tags from the uplink and the
 *   guest, and vt3.ko ignores tagged ones.
 * - When vt3d stops answering, vt3.ko declares the device lost
 *   (IB_EVENT_DEVICE_FATAL, every WR flushed, the ib_device unregistered)
 *   and keeps probing the netdev: a vt3d that is back gets a new session
 *   and a new ib_device.
 *
 * Guest memory
 * ------------
 * Rings and registered memory are described to the device by page lists:
 * a guest-physical array of __le64 page addresses (the PBL), each page
 * VT3_PAGE_SIZE long. Every address, length, index and count the guest
 * gives is validated by vt3d against guest memory and these limits.
 *
 * Rings and ordering
 * ------------------
 * SQ and RQ: rings of fixed-size WQEs, depth a power of two. Producer: the
 * provider (user QPs) or vt3.ko (kernel QPs), which writes WQE i at slot
 * i % depth and then stores the new producer index in the QP status page
 * with release semantics (smp_store_release / __atomic release). Consumer:
 * vt3d, which reads the producer index with acquire semantics, then the
 * WQEs, and publishes its consumer index (release) when a WQE's slot may be
 * reused.
 * CQ: a ring of struct vt3_cqe, depth a power of two. Producer: vt3d, which
 * writes the CQE and then the producer index in the CQ status page
 * (release). Consumer: the provider or vt3.ko, which reads the producer
 * index (acquire), the CQEs, then stores its consumer index (release). vt3d
 * never writes past consumer + depth: that is an overflow, reported with
 * VT3_CQ_F_OVERFLOW and a VT3_EV_CQ_ERROR event instead.
 * Indices are free-running 32-bit counters (wrap at 2^32); slot = index &
 * (depth - 1). They are not reset by state changes (ERROR -> IDLE keeps them).
 * For each work queue, vt3d writes CQEs in WQE order (the SQ's signaled
 * WQEs, the RQ's WQEs), and each CQE names its WQE (wqe_idx, the WQE's
 * free-running index in its queue), so a flush knows which WQEs already
 * completed. sq_cons/rq_cons count WQEs vt3d has retired (signaled or
 * not); they are published before the CQE. After a QP's error, the WQEs
 * to flush are [cons, prod) of each queue (every WQE, signaled or not).
 * A WQE's slot is free for the producer once the consumer took the CQE of
 * that WQE or of a later one of its queue (as on hardware that frees SQ
 * slots by the CQE's WQE counter), not when vt3d's consumer index passes
 * it: should the device be lost, the CQEs vt3d writes after the freeze
 * are never read (VT3_CQ_F_FROZEN), vt3d's consumer index is not
 * trusted, and what was not seen completing must still be in the ring
 * to be flushed: [index after the last CQE taken, prod).
 * MODIFY_QP ERROR -> IDLE sets cons = prod and clears VT3_QP_F_ERROR: send
 * it only after the flush. After a clean close the QP is IDLE but its
 * rings are not read again until that ERROR -> IDLE reset.
 * WQEs with unknown flag bits, an opcode above VT3_WR_READ_INV, or more SGEs or
 * inline bytes than the QP allows complete with VT3_WC_LOC_QP_OP_ERR.
 *
 * Errors: when a QP goes to ERROR, vt3d first publishes its last CQE for
 * that QP (CQ producer index), then sets VT3_QP_F_ERROR in the QP status
 * page and VT3_CQ_F_ERROR in its CQs' status pages, then sends the event.
 * A consumer that sees an error flag has therefore seen every device CQE
 * of that QP once it reads the producer index. The flags stay set until
 * the QP is destroyed (CQ: until it is destroyed).
 *
 * Doorbells
 * ---------
 * A producer stores its new index (release), issues a full barrier, then
 * reads VT3_QP_F_SQ_IDLE / VT3_QP_F_RQ_IDLE; only if set does it send
 * VT3_CMD_DOORBELL. vt3d keeps the flag clear while it reads the ring, and
 * after a queue gave it work, for a short adaptive window (at most 1 ms)
 * during which it polls the producer index itself: posts then need no
 * doorbell. vt3d sets the IDLE flag, issues a full barrier and re-reads
 * the producer index before it stops polling a queue, so a WQE posted in
 * between is never missed: of the two stores (index, flag), one side sees
 * the other's. A clear flag is only a hint to skip the doorbell; a
 * doorbell rung anyway is harmless.
 *
 * Arming
 * ------
 * VT3_CMD_ARM_CQ may be sent without waiting for its response. When vt3d
 * processes it and the CQ already holds unconsumed CQEs (prod != cons), it
 * sends VT3_EV_CQ_COMPLETION at once, so a completion written just before
 * the arm is never lost. An armed CQ produces one event, then is disarmed.
 *
 * Page lists are copied by vt3d while it executes the command: the driver
 * may free a PBL buffer once the response arrived. A DMA MR
 * (VT3_MR_DMA) is sent with iova 0 and length U64_MAX: it covers all guest
 * memory, bounds being those of guest RAM.
 *
 * Fast registration (FRMR)
 * ------------------------
 * VT3_CMD_ALLOC_MR makes an empty TPT entry of a PD for at most max_pages
 * pages (<= vt3_device_attr.max_fast_reg_pages), in the invalid state; its
 * STag (index << 8 | key) is the answer. The entry is filled by a
 * VT3_WR_REG_MR work request (struct vt3_reg_mr_wqe) on the SQ of a QP of
 * the same PD, executed in SQ order when vt3d reaches it: the entry must be
 * invalid, the WQE's STag must name it by index and carry a new key (key
 * rotation: the key differs from the entry's current one, so the old STag
 * names nothing from then on), npages <= max_pages, page_shift is
 * VT3_PAGE_SHIFT, and length fits the pages after iova's offset into the
 * first one. vt3d copies the page list (npages __le64 at pbl_addr) while it
 * executes the WQE: the driver may reuse the buffer once the WQE retired
 * (sq_cons past it; its completion, if signaled). A REG_MR that breaks a
 * rule completes with VT3_WC_LOC_QP_OP_ERR and the QP goes to ERROR, as a
 * bad WQE (docs/architecture.md §5), leaving the entry as it was.
 * VT3_WR_LOCAL_INV (invalidate_stag: a fast-reg MR of the QP's PD, current
 * key) makes the entry invalid, in SQ order; invalidating an invalid entry
 * is allowed (the verbs say so). VT3_WR_READ_INV is a READ that does the
 * same to its invalidate_stag (normally the sink's, IB_WR_RDMA_READ_WITH_INV)
 * once its last response was placed, before its completion (VT3_WC_READ);
 * an invalidate_stag it may not invalidate is refused before the READ goes
 * out (VT3_WC_LOC_QP_OP_ERR). The peer's Send with Invalidate does the
 * same on receive (the CQE has VT3_CQE_INVALIDATED and invalidated_stag),
 * but only for a fast-reg MR of the QP's PD: an STag the peer may not
 * invalidate is a TERMINATE "STag cannot be invalidated" (RFC 5040: RDMAP
 * remote operation 0/2/09 for an STag naming nothing, remote protection
 * 0/1/09 for another PD's or an ordinary MR), and that receive completes
 * with VT3_WC_REM_INV_REQ_ERR. MRs of VT3_CMD_REG_MR are never invalidated
 * by either. VT3_CMD_DEREG_MR frees a fast-reg entry in any state, named
 * by its index under any key (a REG_MR refused or flushed leaves the
 * driver's key one vt3d never took).
 *
 * Memory windows
 * --------------
 * VT3_CMD_ALLOC_MW makes an unbound window of a PD (an entry of the TPT's
 * index space; its STag is the answer); VT3_CMD_DEALLOC_MW frees it, bound
 * or not, named by index under any key. A VT3_WR_BIND_MW (struct
 * vt3_bind_mw_wqe) binds it, in SQ order, on a QP of the window's PD: the
 * WQE's type is the window's; a type 2 window must be unbound (free or
 * invalidated), a type 1 window may be rebound at any time; the key is
 * rotated (differs from the current one); for a nonzero length, mr_stag
 * names a valid MR (not a window) of the QP's PD, registered with
 * VT3_ACCESS_MW_BIND (and VT3_ACCESS_LOCAL_WRITE if the window grants
 * REMOTE_WRITE), and [addr, addr + length) lies within it. A zero-length
 * bind names no MR: it unbinds a type 1 window and binds a type 2 one to
 * nothing. A refused bind completes with VT3_WC_MW_BIND_ERR and the QP
 * goes to ERROR (a bad WQE, docs/architecture.md §5), the window as it was.
 * Only the peer reaches memory through a window's STag (as an lkey it is
 * invalid), checked as through an MR (state, PD, rights, bounds) and, for
 * type 2, only on the QP that bound it ("STag not associated with RDMAP
 * stream" otherwise: DDP 1/1/02 for a WRITE, RDMAP 0/1/03 for a READ
 * source, the codes of another PD's STag).
 * VT3_WR_LOCAL_INV and the peer's Send with Invalidate
 * invalidate a type 2 window of the QP's PD; a type 1 window cannot be
 * invalidated either way (LOCAL_INV: VT3_WC_LOC_QP_OP_ERR; the peer's:
 * TERMINATE 0/1/09, as an ordinary MR). VT3_CMD_DEREG_MR of an MR with
 * valid windows bound to it answers VT3_ERR_BUSY.
 *
 * Re-registration
 * ---------------
 * VT3_CMD_REREG_MR (ibv_rereg_mr) changes an MR of VT3_CMD_REG_MR with a
 * page list in place: its translation (iova, length and a new page list,
 * copied as REG_MR's), its PD, its rights, or several at once. The entry
 * keeps its index and its key, so lkey and rkey stay what they were.
 * vt3d executes it between two placements: an access checked before it
 * is placed through the old registration, every later one through the
 * new; when the answer arrives vt3d reads nothing of the old pages any
 * more, so the driver unpins them then. Refused: a DMA or fast-reg MR or
 * a window (INVALID), an MR with valid windows bound to it (BUSY: the
 * verbs' rule), no change or unknown bits, unknown rights, a translation
 * that does not fit its pages (INVALID), a PD that does not exist
 * (NOT_FOUND). A refused REREG_MR leaves the MR as it was.
 *
 * Shared receive queues (SRQ)
 * ---------------------------
 * VT3_CMD_CREATE_SRQ makes a ring of vt3_rq_wqe of a PD and its status
 * page (struct vt3_srq_status); QPs created with its srqn (same PD, no RQ
 * ring of their own) take their receive WQEs from it, in SRQ order: the
 * ring is one pool and whichever QP receives the next Send takes the
 * next WQE. Producer: the provider or vt3.ko, as for an RQ (prod with
 * release, then the doorbell protocol with VT3_SRQ_F_IDLE and
 * VT3_CMD_DOORBELL queues = VT3_DB_SRQ naming the srqn). vt3d copies
 * WQEs out of the ring ahead of need, at most depth beyond cons; `cons`
 * counts WQEs taken by QPs (a QP takes a WQE when the first DDP segment
 * of a Send arrives) and is published with release once taken: the slot
 * is free for the producer then, since vt3d no longer reads it. A
 * producer index more than depth ahead of cons breaks the ring: vt3d
 * reads nothing more from it, sets VT3_SRQ_F_ERROR and sends
 * VT3_EV_SRQ_ERROR (the QPs attached are not touched).
 * The limit: armed at create (limit != 0) or by MODIFY_SRQ with
 * VT3_SRQ_MODIFY_ARM, the SRQ sends VT3_EV_SRQ_LIMIT once when a QP's
 * take leaves fewer than `limit` WQEs posted and not taken (prod - cons),
 * and is disarmed (the verbs' rule; checked on takes, as siw and rxe do).
 * A receive CQE of an SRQ WQE carries the QP's qpn, VT3_CQE_SRQ, and the
 * WQE's SRQ index in wqe_idx; CQEs of one QP come in the order the QP took
 * its WQEs, not in SRQ order across QPs.
 * A QP error (or the end of a connection) does not flush or consume SRQ
 * WQEs: they stay for the other QPs. The one WQE a failing QP had taken
 * for a Send not complete yet belongs to that QP: vt3d completes it with
 * VT3_WC_WR_FLUSH_ERR (VT3_CQE_SRQ) on the QP's receive CQ before the
 * error flag, the only flush CQE vt3d ever writes (it alone knows which
 * SRQ WQE that was). Then VT3_QPE_LAST_WQE_REACHED follows the QP's error
 * event. A malformed SRQ WQE fails the QP that takes it, as a malformed RQ
 * WQE would. VT3_CMD_DESTROY_SRQ is refused (BUSY) while a QP uses it;
 * WQEs still in the SRQ then complete nowhere (the verbs' rule).
 * The consumer side (vt3.ko for kernel SRQs, libvt3 for user SRQs)
 * frees an SRQ slot for the producer only once it took the CQE of the
 * WQE in it (wqe_idx names it exactly), which is never before vt3d's
 * cons passed it: so prod - cons <= depth holds, and the consumer always
 * knows which SRQ WQEs have not completed.
 * Device lost (VT3_CQ_F_FROZEN; vt3d gone): vt3d cannot write the flush
 * CQE of the WQE a failing QP had taken, and its cons is not trusted, so
 * the consumer cannot tell a WQE a QP took from one still in the pool.
 * Every SRQ WQE whose CQE was not taken by then completes once with
 * WR_FLUSH_ERR, on the receive CQ of the first QP of the SRQ whose flush
 * runs (that QP is the completion's QP), after that CQ's CQEs up to the
 * freeze; a device CQE of an SRQ WQE met after that flush is dropped (its
 * WR completed with the flush), and WQEs posted later are flushed the
 * same way. With no QP attached they complete nowhere (as on destroy).
 * So every SRQ WR completes at most once, and exactly once unless it was
 * never taken and the SRQ is destroyed.
 * Resize (ibv_modify_srq with IBV_SRQ_MAX_WR): VT3_CMD_RESIZE_SRQ gives
 * the SRQ a new ring of a depth at least the current one; indices stay
 * free running and a WQE keeps its index, so it sits at index &
 * (depth - 1) of whichever ring is current, and a CQE's wqe_idx names the
 * same WR before and after. The driver (owner of both rings) copies every
 * WQE of [prod - old depth, prod) from the old ring to the new one before
 * it sends the command; the producer posts nothing meanwhile (libvt3
 * holds the SRQ's lock across the modify; vt3.ko writes kernel posts
 * into both rings until vt3d answered). vt3d switches between two
 * commands, so it reads WQEs it did not fetch yet, [fetched, prod), from
 * the new ring from then on; the WQEs it already fetched and the one a
 * QP holds are copies and not affected, prod, cons, the status page, the
 * limit and the QPs stay. After the answer vt3d reads nothing of the old
 * ring: the driver frees it then. A smaller depth, a bad page list, or a
 * ring of an SRQ marked broken is refused (the SRQ as it was).
 *
 * Limits: max_cqe and max_qp_wr count usable entries; rings have a depth of
 * the next power of two above. fw_ver is major << 32 | minor << 16 | sub.
 * Events are addressed to the guest MAC that proved the session.
 */
#ifndef VT3_HW_H
#define VT3_HW_H

#ifdef __KERNEL__
#include <linux/types.h>
#else
#include <linux/types.h>
#include <stdint.h>
#endif

#define VT3_ETHERTYPE		0x88B5
#define VT3_CTRL_VERSION	5
#define VT3_CTRL_REPLAY_WINDOW	64
/* First contact (see "Who may drive the device"). */
#define VT3_KEY_LEN		16
#define VT3_NONCE_LEN		16
#define VT3_FW_CFG_KEY		"opt/vt3/key"
#define VT3_CHALLENGE_TTL_MS	10000
#define VT3_HELLO_BURST		64
#define VT3_HELLO_RATE		16
#define VT3_KDF_LABEL_K0	"vt3 session k0"	/* zero-padded to 16 */
#define VT3_KDF_LABEL_K1	"vt3 session k1"
#define VT3_PAGE_SHIFT		12
#define VT3_PAGE_SIZE		(1u << VT3_PAGE_SHIFT)

/* Device identity reported by VT3_CMD_QUERY_DEVICE. */
#define VT3_VENDOR_ID		0x1425	/* Chelsio's PCI vendor id: a T3 look-alike */
#define VT3_VENDOR_PART_ID	0x0031	/* T3-class */

/* ------------------------------------------------------------------ */
/* Control frames                                                      */

enum vt3_msg_type {
	VT3_MSG_CMD = 1,
	VT3_MSG_RESP = 2,
	VT3_MSG_EVENT = 3,
};

struct vt3_ctrl_hdr {
	__u8	version;	/* VT3_CTRL_VERSION */
	__u8	type;		/* enum vt3_msg_type */
	__le16	opcode;		/* enum vt3_cmd, or enum vt3_event_type for events */
	__le32	seq;		/* CMD: chosen by the driver; RESP: copied */
	__le16	status;		/* RESP: enum vt3_status; otherwise 0 */
	__le16	len;		/* payload bytes after this header */
	__le32	reserved;
	__le64	counter;	/* frames sent this session in this direction */
};

/* After the `len` payload bytes: __le64 mac (VT3_CTRL_MAC_LEN bytes). */
#define VT3_CTRL_MAC_LEN	8

enum vt3_cmd {
	VT3_CMD_QUERY_DEVICE = 1,	/* -> vt3_device_attr */
	VT3_CMD_QUERY_PORT = 2,		/* -> vt3_port_attr */
	VT3_CMD_SET_ADDR = 3,		/* vt3_cmd_set_addr */
	VT3_CMD_ALLOC_PD = 4,		/* -> vt3_resp_handle (pdn) */
	VT3_CMD_DEALLOC_PD = 5,		/* vt3_cmd_handle (pdn) */
	VT3_CMD_REG_MR = 6,		/* vt3_cmd_reg_mr -> vt3_resp_handle (stag) */
	VT3_CMD_DEREG_MR = 7,		/* vt3_cmd_handle (stag) */
	VT3_CMD_CREATE_CQ = 8,		/* vt3_cmd_create_cq -> vt3_resp_handle (cqn) */
	VT3_CMD_DESTROY_CQ = 9,		/* vt3_cmd_handle (cqn) */
	VT3_CMD_ARM_CQ = 10,		/* vt3_cmd_arm_cq */
	VT3_CMD_CREATE_QP = 11,		/* vt3_cmd_create_qp -> vt3_resp_handle (qpn) */
	VT3_CMD_MODIFY_QP = 12,		/* vt3_cmd_modify_qp */
	VT3_CMD_QUERY_QP = 13,		/* vt3_cmd_handle (qpn) -> vt3_qp_attr */
	VT3_CMD_DESTROY_QP = 14,	/* vt3_cmd_handle (qpn) */
	VT3_CMD_DOORBELL = 15,		/* vt3_cmd_doorbell; answered only on error */
	VT3_CMD_RESET = 16,		/* drop every resource of this guest */
	/* Connection management (the iw_cm verbs): */
	VT3_CMD_LISTEN = 17,		/* vt3_cmd_listen */
	VT3_CMD_UNLISTEN = 18,		/* vt3_cmd_listen (same local address) */
	VT3_CMD_CONNECT = 19,		/* vt3_cmd_connect; outcome: VT3_EV_CONNECT_REPLY */
	VT3_CMD_ACCEPT = 20,		/* vt3_cmd_accept; then VT3_EV_ESTABLISHED */
	VT3_CMD_REJECT = 21,		/* vt3_cmd_reject */
	VT3_CMD_DISCONNECT = 22,	/* vt3_cmd_disconnect */
	VT3_CMD_HELLO = 23,		/* vt3_cmd_hello -> vt3_resp_hello (under K) */
	VT3_CMD_ALLOC_MR = 24,		/* vt3_cmd_alloc_mr -> vt3_resp_handle (stag) */
	/* Shared receive queues (see "Shared receive queues" above): */
	VT3_CMD_CREATE_SRQ = 25,	/* vt3_cmd_create_srq -> vt3_resp_handle (srqn) */
	VT3_CMD_MODIFY_SRQ = 26,	/* vt3_cmd_modify_srq */
	VT3_CMD_QUERY_SRQ = 27,		/* vt3_cmd_handle (srqn) -> vt3_srq_attr */
	VT3_CMD_DESTROY_SRQ = 28,	/* vt3_cmd_handle (srqn); BUSY while QPs use it */
	/* vt3 extension: QPs of this device connected by modify_qp (below): */
	VT3_CMD_PAIR_QP = 29,		/* vt3_cmd_pair_qp; then as CONNECT/ACCEPT */
	/* Memory windows (see "Memory windows" above): */
	VT3_CMD_ALLOC_MW = 30,		/* vt3_cmd_alloc_mw -> vt3_resp_handle (stag) */
	VT3_CMD_DEALLOC_MW = 31,	/* vt3_cmd_handle (stag, any key) */
	/* Re-registration (see "Re-registration" above): */
	VT3_CMD_REREG_MR = 32,		/* vt3_cmd_rereg_mr */
	/* SRQ resize (see "Shared receive queues" above): */
	VT3_CMD_RESIZE_SRQ = 33,	/* vt3_cmd_resize_srq */
	/* First contact, step 3: the new session's first frame: */
	VT3_CMD_PROVE = 34,		/* vt3_cmd_prove (under Ks) */
};

enum vt3_status {
	VT3_OK = 0,
	VT3_ERR_INVALID = 1,		/* malformed command or argument */
	VT3_ERR_NO_RESOURCE = 2,	/* a device limit would be exceeded */
	VT3_ERR_NOT_FOUND = 3,		/* no such handle */
	VT3_ERR_BUSY = 4,		/* still referenced (e.g. PD with MRs) */
	VT3_ERR_BAD_ADDRESS = 5,	/* guest address/length outside guest RAM */
	VT3_ERR_UNSUPPORTED = 6,	/* unknown opcode or version */
	VT3_ERR_STATE = 7,		/* transition not allowed in this state */
};

/* VT3_CMD_QUERY_DEVICE response: the advertised and enforced limits. */
struct vt3_device_attr {
	__le64	fw_ver;
	__le64	max_mr_size;
	__le64	page_size_cap;
	__le32	vendor_id;
	__le32	vendor_part_id;
	__le32	hw_ver;
	__le32	max_qp;
	__le32	max_qp_wr;
	__le32	max_sge;
	__le32	max_sge_rd;
	__le32	max_cq;
	__le32	max_cqe;
	__le32	max_mr;
	__le32	max_pd;
	__le32	max_qp_rd_atom;		/* ORD */
	__le32	max_qp_init_rd_atom;	/* IRD */
	__le32	max_inline;
	__le32	max_pbl_pages;		/* pages one PBL may list */
	__le32	max_fast_reg_pages;	/* VT3_CMD_ALLOC_MR max_pages; 0: no FRMR */
	__le32	max_srq;		/* 0: no SRQs */
	__le32	max_srq_wr;		/* usable entries, as max_qp_wr */
	__le32	max_srq_sge;
	__le32	max_mw;			/* windows share the TPT with MRs */
};

struct vt3_port_attr {
	__le32	max_msg_size;
	__le32	mtu;			/* uplink MTU vt3d carries */
	__le32	link_up;		/* 1 while vt3d has an uplink */
	__le32	reserved;
};

/*
 * VT3_CMD_SET_ADDR: the guest's address on this netdev (IPv4 for now). The
 * TOE answers for this address: the driver sends it before the first
 * LISTEN or CONNECT and whenever the address changes. A change drops the
 * offloaded connections and listeners; 0.0.0.0 stops offload.
 */
struct vt3_cmd_set_addr {
	__u8	mac[6];
	__u8	prefix_len;
	__u8	reserved;
	__be32	ipv4;
};

/* First contact, step 1 (frame counter 0, MAC under K). */
struct vt3_cmd_hello {
	__u8	driver_nonce[VT3_NONCE_LEN];
};

/* Step 2: vt3d's answer (counter 0, MAC under K). */
struct vt3_resp_hello {
	__u8	driver_nonce[VT3_NONCE_LEN];
	__u8	device_nonce[VT3_NONCE_LEN];
};

/* Step 3: the new session's first command (counter 1, MAC under Ks). */
struct vt3_cmd_prove {
	__u8	driver_nonce[VT3_NONCE_LEN];
	__u8	device_nonce[VT3_NONCE_LEN];
};

/* What SipHash(K, .) runs over for each word of Ks. */
struct vt3_kdf_input {
	char	label[16];		/* VT3_KDF_LABEL_K0 or _K1, zero-padded */
	__u8	driver_nonce[VT3_NONCE_LEN];
	__u8	device_nonce[VT3_NONCE_LEN];
};

/* Commands that name one object: pdn, stag, cqn or qpn. */
struct vt3_cmd_handle {
	__le32	handle;
	__le32	reserved;
};

struct vt3_resp_handle {
	__le32	handle;
	__le32	reserved;
};

enum vt3_access {
	VT3_ACCESS_LOCAL_WRITE = 1 << 0,
	VT3_ACCESS_REMOTE_WRITE = 1 << 1,
	VT3_ACCESS_REMOTE_READ = 1 << 2,
	VT3_ACCESS_MW_BIND = 1 << 3,
};

enum vt3_mr_flags {
	/* No page list: iova is a guest-physical address (get_dma_mr). */
	VT3_MR_DMA = 1 << 0,
	/*
	 * A DMA MR with remote access: only for a kernel PD made with
	 * IB_PD_UNSAFE_GLOBAL_RKEY. vt3d refuses remote rights on a DMA MR
	 * without it (VT3_ERR_INVALID).
	 */
	VT3_MR_UNSAFE_GLOBAL_RKEY = 1 << 1,
};

/* STag = TPT index << 8 | key; the key changes on every registration. */
#define VT3_STAG_INDEX(stag)	((stag) >> 8)
#define VT3_STAG_KEY(stag)	((stag) & 0xff)

struct vt3_cmd_reg_mr {
	__le64	iova;
	__le64	length;
	__le64	pbl_addr;		/* guest-physical __le64[npages] */
	__le32	npages;
	__le32	pdn;
	__le32	access;			/* enum vt3_access */
	__le32	flags;			/* enum vt3_mr_flags */
	__le32	page_offset;		/* iova's offset into the first page */
	__le32	reserved;
};

/* An empty fast-reg MR (state invalid) of pdn for up to max_pages pages. */
struct vt3_cmd_alloc_mr {
	__le32	pdn;
	__le32	max_pages;
};

enum vt3_mw_type {
	VT3_MW_TYPE_1 = 1,		/* bound to the PD (ibv_bind_mw) */
	VT3_MW_TYPE_2 = 2,		/* bound to the posting QP (IB's type 2B) */
};

/* What VT3_CMD_REREG_MR changes. */
enum vt3_rereg_change {
	VT3_REREG_TRANSLATION = 1 << 0,	/* iova, length, the page list */
	VT3_REREG_PD = 1 << 1,		/* pdn */
	VT3_REREG_ACCESS = 1 << 2,	/* access */
};

/*
 * The MR named by stag (current key) takes the fields `change` names;
 * the others are ignored. With VT3_REREG_TRANSLATION: npages pages at
 * pbl_addr, the region starting page_offset into the first.
 */
struct vt3_cmd_rereg_mr {
	__le32	stag;
	__le32	change;			/* enum vt3_rereg_change */
	__le64	iova;
	__le64	length;
	__le64	pbl_addr;		/* guest-physical __le64[npages] */
	__le32	npages;
	__le32	pdn;
	__le32	access;			/* enum vt3_access */
	__le32	page_offset;
};

/* An unbound memory window of pdn. */
struct vt3_cmd_alloc_mw {
	__le32	pdn;
	__le32	mw_type;		/* enum vt3_mw_type */
};

struct vt3_cmd_create_cq {
	__le64	ring_pbl_addr;		/* pages holding depth vt3_cqe */
	__le64	status_addr;		/* guest-physical vt3_cq_status */
	__le32	ring_npages;
	__le32	depth;			/* power of two */
};

enum vt3_arm_flags {
	VT3_ARM_NEXT = 1 << 0,		/* event on the next completion */
	VT3_ARM_SOLICITED = 1 << 1,	/* event on the next solicited one */
};

struct vt3_cmd_arm_cq {
	__le32	cqn;
	__le32	flags;			/* enum vt3_arm_flags */
};

struct vt3_cmd_create_qp {
	__le64	sq_pbl_addr;
	__le64	rq_pbl_addr;
	__le64	status_addr;		/* guest-physical vt3_qp_status */
	__le32	sq_npages;
	__le32	rq_npages;
	__le32	sq_depth;		/* power of two */
	__le32	rq_depth;		/* power of two */
	__le32	pdn;
	__le32	send_cqn;
	__le32	recv_cqn;
	__le32	max_send_sge;
	__le32	max_recv_sge;
	__le32	max_inline;
	__le32	flags;			/* enum vt3_qp_flags */
	__le32	srqn;			/* 0: own RQ; else the SRQ (rq_* all 0) */
};

enum vt3_qp_flags {
	VT3_QP_KERNEL = 1 << 0,		/* owned by a kernel ULP, not user space */
	VT3_QP_SIG_ALL = 1 << 1,	/* every send WQE is signaled */
};

/* iWARP verbs QP states (docs/architecture.md §4). */
enum vt3_qp_state {
	VT3_QPS_IDLE = 0,
	VT3_QPS_RTS = 1,
	VT3_QPS_CLOSING = 2,
	VT3_QPS_TERMINATE = 3,
	VT3_QPS_ERROR = 4,
};

enum vt3_modify_mask {
	VT3_MODIFY_STATE = 1 << 0,
	VT3_MODIFY_IRD = 1 << 1,
	VT3_MODIFY_ORD = 1 << 2,
};

struct vt3_cmd_modify_qp {
	__le32	qpn;
	__le32	mask;			/* enum vt3_modify_mask */
	__le32	state;			/* enum vt3_qp_state */
	__le32	ird;
	__le32	ord;
	__le32	reserved;
};

struct vt3_qp_attr {
	__le32	state;
	__le32	ird;
	__le32	ord;
	__le32	sq_depth;
	__le32	rq_depth;
	__le32	reserved;
};

enum vt3_doorbell_queue {
	VT3_DB_SQ = 1 << 0,
	VT3_DB_RQ = 1 << 1,
	VT3_DB_SRQ = 1 << 2,		/* alone: qpn names an SRQ (srqn) */
};

struct vt3_cmd_doorbell {
	__le32	qpn;
	__le32	queues;			/* enum vt3_doorbell_queue */
};

/* ------------------------------------------------------------------ */
/* Shared receive queues                                               */

/*
 * CREATE_SRQ: a ring of depth vt3_rq_wqe (power of two) of PD pdn, with a
 * vt3_srq_status page. limit != 0 arms the limit event at once (as
 * ib_create_srq's srq_limit). A QP created with this srqn (same PD)
 * takes its receive WQEs from here.
 */
struct vt3_cmd_create_srq {
	__le64	ring_pbl_addr;
	__le64	status_addr;		/* guest-physical vt3_srq_status */
	__le32	ring_npages;
	__le32	depth;			/* power of two */
	__le32	pdn;
	__le32	max_sge;
	__le32	limit;			/* 0: not armed */
	__le32	reserved;
};

enum vt3_srq_modify_mask {
	VT3_SRQ_MODIFY_LIMIT = 1 << 0,	/* set limit */
	VT3_SRQ_MODIFY_ARM = 1 << 1,	/* arm (limit != 0) */
};

struct vt3_cmd_modify_srq {
	__le32	srqn;
	__le32	mask;			/* enum vt3_srq_modify_mask */
	__le32	limit;			/* <= depth */
	__le32	reserved;
};

/*
 * RESIZE_SRQ: the SRQ's new ring, depth (a power of two, not below the
 * current depth, within max_srq_wr's) vt3_rq_wqe in ring_npages pages.
 */
struct vt3_cmd_resize_srq {
	__le64	ring_pbl_addr;
	__le32	ring_npages;
	__le32	depth;
	__le32	srqn;
	__le32	reserved;
};

struct vt3_srq_attr {
	__le32	depth;
	__le32	max_sge;
	__le32	limit;
	__le32	armed;			/* 1 while the limit event is armed */
	__le32	qps;			/* QPs attached */
	__le32	reserved;
};

/* ------------------------------------------------------------------ */
/* Connection management                                               */

/* MPA rev 2 carries IRD/ORD in 4 of these bytes: 508 are usable there. */
#define VT3_MAX_PRIVATE_DATA	512

/* IPv4 address and TCP port, both in network byte order. */
struct vt3_sockaddr {
	__be32	ipv4;
	__be16	port;
	__u16	reserved;
};

/*
 * LISTEN: the TOE accepts TCP connections on local.port (local.ipv4 0: the
 * guest's address) with an accept backlog; each MPA request is reported as
 * VT3_EV_CONNECT_REQUEST with a conn_id the driver answers with ACCEPT or
 * REJECT. The driver reserves the port in the guest's own TCP stack.
 */
struct vt3_cmd_listen {
	struct vt3_sockaddr local;
	__le32	backlog;
	__le32	reserved;
};

/*
 * CONNECT: active open from local (port reserved by the driver) to remote;
 * next_hop is the MAC of the peer or of the gateway, resolved by the
 * driver. The QP must be IDLE; MPA rev 2 with IRD/ORD is offered.
 */
struct vt3_cmd_connect {
	struct vt3_sockaddr local;
	struct vt3_sockaddr remote;
	__u8	next_hop[6];
	__le16	pd_len;
	__le32	qpn;
	__le32	ird;
	__le32	ord;
	__le32	reserved;
	__u8	private_data[VT3_MAX_PRIVATE_DATA];
};

struct vt3_cmd_accept {
	__le32	conn_id;
	__le32	qpn;			/* an IDLE QP that takes the connection */
	__le32	ird;
	__le32	ord;
	__le16	pd_len;
	__le16	reserved0;
	__le32	reserved1;
	__u8	private_data[VT3_MAX_PRIVATE_DATA];
};

struct vt3_cmd_reject {
	__le32	conn_id;
	__le16	pd_len;
	__le16	reserved;
	__u8	private_data[VT3_MAX_PRIVATE_DATA];
};

/*
 * PAIR_QP, a vt3 extension for test suites and one-VM setups (rdma-core's
 * tests/ connect two RC QPs of one device by ibv_modify_qp, without a CM):
 * user QP qpn, whose RTR named peer_qpn (IB_QP_DEST_QPN), moves to RTS and
 * asks for a connection to that QP of this device. Once both QPs asked for
 * each other, vt3d connects them inside its TOE loopback exactly as an
 * rdma_cm loopback connection (TCP and MPA, no private data): the QP that
 * asked first listens on its port and gets VT3_EV_ESTABLISHED (conn_id 0)
 * when it accepted; the second connects from its port and gets
 * VT3_EV_CONNECT_REPLY (status 0 or an errno). From then on it is a
 * connection like any other (DISCONNECT, the VT3_EV_QP events). Should the
 * attempt end before the first QP accepted (the second destroyed or moved
 * to ERROR, the first moved to ERROR), the first gets VT3_QPE_RESET and
 * goes to ERROR. A request holds while the QP stays IDLE: a MODIFY_QP of
 * its state drops it; asking again replaces it. Ports are the driver's,
 * reserved in the guest's own TCP stack as for CONNECT.
 * Refused: INVALID (a kernel QP on either side, qpn == peer_qpn, port 0),
 * NOT_FOUND (either QP), STATE (no address yet; either QP is not IDLE, is
 * in a connection or its attempt, or is spent), BUSY (the TOE holds the port).
 */
struct vt3_cmd_pair_qp {
	__le32	qpn;
	__le32	peer_qpn;
	__be16	port;			/* qpn's own TCP port */
	__le16	reserved;
};

/* DISCONNECT: graceful (FIN after the SQ drained) or abortive (RST). */
struct vt3_cmd_disconnect {
	__le32	qpn;
	__le32	abort;			/* 0: graceful, 1: abortive */
};

/* ------------------------------------------------------------------ */
/* Events                                                              */

/*
 * Events (VT3_MSG_EVENT): opcode is enum vt3_event_type; the payload is
 * struct vt3_event, or struct vt3_event_cm for the connection events.
 */
enum vt3_event_type {
	VT3_EV_CQ_COMPLETION = 1,	/* armed CQ got a completion */
	VT3_EV_CQ_ERROR = 2,		/* CQ overflow */
	VT3_EV_QP = 3,			/* connection end or error: enum vt3_qp_event */
	VT3_EV_DEVICE_FATAL = 4,
	VT3_EV_CONNECT_REQUEST = 5,	/* vt3_event_cm: conn_id, addresses, ird/ord, pd */
	VT3_EV_CONNECT_REPLY = 6,	/* vt3_event_cm: qpn, status, peer's pd */
	VT3_EV_ESTABLISHED = 7,		/* vt3_event_cm: qpn (passive side, after ACCEPT) */
	VT3_EV_SRQ_LIMIT = 8,		/* vt3_event: srqn; the limit was reached */
	VT3_EV_SRQ_ERROR = 9,		/* vt3_event: srqn; its ring is broken */
};

struct vt3_event {
	__le32	handle;			/* cqn or qpn */
	__le32	code;			/* VT3_EV_QP: enum vt3_qp_event */
	__le32	detail;			/* VT3_EV_QP: see enum vt3_qp_event */
	__le32	reserved;
};

/*
 * Why a QP's connection ended or failed (docs/architecture.md §5). After
 * any of these but PEER_CLOSE the QP is in ERROR (or IDLE after a clean
 * close) and vt3d writes no further CQE for it: the provider or driver
 * flushes.
 * detail: CLOSE_COMPLETE: 1 if SQ WQEs were still outstanding;
 *         TERMINATE_*: layer << 12 | etype << 8 | ecode (RFC 5040 layout).
 */
enum vt3_qp_event {
	VT3_QPE_CLOSE_COMPLETE = 1,	/* graceful close finished */
	VT3_QPE_PEER_CLOSE = 2,		/* peer's FIN while RTS: now CLOSING */
	VT3_QPE_RESET = 3,		/* RST received */
	VT3_QPE_TIMEOUT = 4,		/* retransmit or keep-alive timeout */
	VT3_QPE_TERMINATE_RECEIVED = 5,
	VT3_QPE_TERMINATE_SENT = 6,	/* local protocol error */
	VT3_QPE_BAD_WQE = 7,		/* malformed local WQE */
	/*
	 * A QP of an SRQ in ERROR will take no more SRQ WQEs and vt3d wrote
	 * its last CQE: sent after the event that says why (or after the
	 * MODIFY_QP to ERROR), once per entry into ERROR.
	 */
	VT3_QPE_LAST_WQE_REACHED = 8,
};

/* CONNECT_REPLY status: 0 (established) or a positive errno. */
struct vt3_event_cm {
	__le32	conn_id;
	__le32	qpn;
	__le32	status;
	__le32	ird;
	__le32	ord;
	__le16	pd_len;
	__le16	reserved;
	struct vt3_sockaddr local;
	struct vt3_sockaddr remote;
	__u8	private_data[VT3_MAX_PRIVATE_DATA];
};

/* ------------------------------------------------------------------ */
/* Work queues                                                         */

#define VT3_MAX_SGE		4
#define VT3_MAX_INLINE		64

struct vt3_sge {
	__le64	addr;
	__le32	length;
	__le32	lkey;
};

enum vt3_wr_opcode {
	VT3_WR_SEND = 0,
	VT3_WR_SEND_INV = 1,
	VT3_WR_SEND_SE = 2,
	VT3_WR_SEND_SE_INV = 3,
	VT3_WR_WRITE = 4,
	VT3_WR_READ = 5,
	VT3_WR_REG_MR = 6,		/* struct vt3_reg_mr_wqe */
	VT3_WR_LOCAL_INV = 7,		/* invalidate_stag; no SGEs */
	VT3_WR_READ_INV = 8,		/* READ, then LOCAL_INV of invalidate_stag */
	VT3_WR_BIND_MW = 9,		/* struct vt3_bind_mw_wqe */
};

enum vt3_wqe_flags {
	VT3_WQE_SIGNALED = 1 << 0,
	VT3_WQE_INLINE = 1 << 1,	/* payload in `inline_data`, not SGEs */
	VT3_WQE_FENCE = 1 << 2,
};

/* SQ and RQ slots are both VT3_WQE_SIZE bytes. */
#define VT3_WQE_SIZE		128

struct vt3_sq_wqe {
	__le64	wr_id;
	__u8	opcode;			/* enum vt3_wr_opcode */
	__u8	flags;			/* enum vt3_wqe_flags */
	__u8	num_sge;
	__u8	reserved0;
	__le32	invalidate_stag;	/* SEND_INV, SEND_SE_INV */
	__le64	remote_addr;		/* WRITE, READ */
	__le32	remote_stag;		/* WRITE, READ */
	__le32	inline_len;
	__le64	reserved1[4];
	union {
		struct vt3_sge	sge[VT3_MAX_SGE];
		__u8		inline_data[VT3_MAX_INLINE];
	};
};

/*
 * The SQ slot of a VT3_WR_REG_MR (same size and header as vt3_sq_wqe):
 * registers pages pbl_addr[0 .. npages) under stag, bytes [iova, iova +
 * length) of the region starting iova & (page size - 1) into the first
 * page. flags: VT3_WQE_SIGNALED, VT3_WQE_FENCE.
 */
struct vt3_reg_mr_wqe {
	__le64	wr_id;
	__u8	opcode;			/* VT3_WR_REG_MR */
	__u8	flags;			/* enum vt3_wqe_flags, INLINE excluded */
	__u8	reserved0[2];
	__le32	stag;			/* the MR's index, its new key */
	__le64	iova;
	__le64	length;
	__le64	pbl_addr;		/* guest-physical __le64[npages] */
	__le32	npages;
	__le32	access;			/* enum vt3_access */
	__le32	page_shift;		/* VT3_PAGE_SHIFT */
	__le32	reserved1;
	__le64	reserved2[9];
};

/*
 * The SQ slot of a VT3_WR_BIND_MW (same size and header as vt3_sq_wqe):
 * binds window mw_stag (its index, its new key) over bytes [addr, addr +
 * length) of MR mr_stag with rights access (REMOTE_READ/REMOTE_WRITE;
 * LOCAL_WRITE is accepted and ignored). mw_type is the type the poster
 * means (1: ibv_bind_mw, 2: IBV_WR_BIND_MW) and must be the window's.
 * flags: VT3_WQE_SIGNALED, VT3_WQE_FENCE.
 */
struct vt3_bind_mw_wqe {
	__le64	wr_id;
	__u8	opcode;			/* VT3_WR_BIND_MW */
	__u8	flags;			/* enum vt3_wqe_flags, INLINE excluded */
	__u8	mw_type;		/* enum vt3_mw_type */
	__u8	reserved0;
	__le32	mw_stag;		/* the window's index, its new key */
	__le64	addr;
	__le64	length;
	__le32	mr_stag;
	__le32	access;			/* enum vt3_access */
	__le64	reserved1[11];
};

struct vt3_rq_wqe {
	__le64	wr_id;
	__u8	num_sge;
	__u8	reserved0[7];
	__le64	reserved1[6];
	struct vt3_sge	sge[VT3_MAX_SGE];
};

/* ------------------------------------------------------------------ */
/* Completion queues                                                   */

enum vt3_wc_opcode {
	VT3_WC_SEND = 0,
	VT3_WC_WRITE = 1,
	VT3_WC_READ = 2,
	VT3_WC_RECV = 3,
	VT3_WC_REG_MR = 4,
	VT3_WC_LOCAL_INV = 5,
	VT3_WC_BIND_MW = 6,
};

enum vt3_wc_status {
	VT3_WC_SUCCESS = 0,
	VT3_WC_LOC_LEN_ERR = 1,
	VT3_WC_LOC_QP_OP_ERR = 2,
	VT3_WC_LOC_PROT_ERR = 3,
	/* by the provider/driver; by vt3d only for an SRQ WQE its QP took (VT3_CQE_SRQ) */
	VT3_WC_WR_FLUSH_ERR = 4,
	VT3_WC_REM_ACCESS_ERR = 5,
	VT3_WC_REM_OP_ERR = 6,
	VT3_WC_GENERAL_ERR = 7,
	VT3_WC_BAD_RESP_ERR = 8,
	VT3_WC_REM_INV_REQ_ERR = 9,
	VT3_WC_MW_BIND_ERR = 10,
};

enum vt3_cqe_flags {
	VT3_CQE_INVALIDATED = 1 << 0,	/* RECV of a SEND_INV: stag invalidated */
	VT3_CQE_SOLICITED = 1 << 1,
	VT3_CQE_SRQ = 1 << 2,		/* wqe_idx is an index of the QP's SRQ */
};

struct vt3_cqe {
	__le64	wr_id;
	__le32	qpn;
	__u8	opcode;			/* enum vt3_wc_opcode */
	__u8	status;			/* enum vt3_wc_status */
	__u8	flags;			/* enum vt3_cqe_flags */
	__u8	reserved0;
	__le32	byte_len;
	__le32	invalidated_stag;
	__le32	vendor_err;		/* TERMINATE layer/etype/ecode, if any */
	__le32	wqe_idx;		/* the WQE's index in its queue (or SRQ) */
};

/* ------------------------------------------------------------------ */
/* Status pages (one per QP and per CQ, in guest memory)               */

enum vt3_qp_status_flags {
	VT3_QP_F_ERROR = 1 << 0,	/* set by vt3d or vt3.ko: QP is in error */
	VT3_QP_F_SQ_IDLE = 1 << 1,	/* vt3d idle on the SQ: ring the doorbell */
	VT3_QP_F_RQ_IDLE = 1 << 2,
};

struct vt3_qp_status {
	__le32	sq_prod;		/* written by the producer (provider/driver) */
	__le32	rq_prod;
	__le32	sq_cons;		/* written by vt3d */
	__le32	rq_cons;
	__le32	flags;			/* enum vt3_qp_status_flags (atomic OR) */
	__le32	state;			/* enum vt3_qp_state, written by vt3d */
	__le32	reserved[2];
};

enum vt3_cq_status_flags {
	VT3_CQ_F_ERROR = 1 << 0,	/* a QP feeding this CQ is in error */
	VT3_CQ_F_OVERFLOW = 1 << 1,
	/*
	 * Set by vt3.ko, never by vt3d: the device is lost. Consumers read
	 * frozen_prod instead of prod from then on, so nothing vt3d might
	 * still write is taken after the driver declared every QP in error.
	 */
	VT3_CQ_F_FROZEN = 1 << 2,
};

struct vt3_cq_status {
	__le32	prod;			/* written by vt3d */
	__le32	cons;			/* written by the consumer */
	__le32	flags;			/* enum vt3_cq_status_flags (atomic OR) */
	__le32	frozen_prod;		/* written by vt3.ko before VT3_CQ_F_FROZEN */
};

enum vt3_srq_status_flags {
	VT3_SRQ_F_IDLE = 1 << 0,	/* vt3d idle on the SRQ: ring the doorbell */
	VT3_SRQ_F_ERROR = 1 << 1,	/* set by vt3d: the ring is broken */
};

struct vt3_srq_status {
	__le32	prod;			/* written by the producer (provider/driver) */
	__le32	cons;			/* written by vt3d: WQEs taken by QPs */
	__le32	flags;			/* enum vt3_srq_status_flags (atomic OR) */
	__le32	reserved;
};

/* ------------------------------------------------------------------ */
/* Sizes are part of the ABI.                                          */

#ifdef __KERNEL__
#include <linux/build_bug.h>
#define VT3_ASSERT_SIZE(t, n) static_assert(sizeof(struct t) == (n), #t)
#else
#define VT3_ASSERT_SIZE(t, n) _Static_assert(sizeof(struct t) == (n), #t)
#endif
VT3_ASSERT_SIZE(vt3_ctrl_hdr, 24);
VT3_ASSERT_SIZE(vt3_cmd_hello, 16);
VT3_ASSERT_SIZE(vt3_resp_hello, 32);
VT3_ASSERT_SIZE(vt3_cmd_prove, 32);
VT3_ASSERT_SIZE(vt3_kdf_input, 48);
VT3_ASSERT_SIZE(vt3_device_attr, 104);
VT3_ASSERT_SIZE(vt3_port_attr, 16);
VT3_ASSERT_SIZE(vt3_cmd_set_addr, 12);
VT3_ASSERT_SIZE(vt3_cmd_handle, 8);
VT3_ASSERT_SIZE(vt3_resp_handle, 8);
VT3_ASSERT_SIZE(vt3_cmd_reg_mr, 48);
VT3_ASSERT_SIZE(vt3_cmd_alloc_mr, 8);
VT3_ASSERT_SIZE(vt3_cmd_alloc_mw, 8);
VT3_ASSERT_SIZE(vt3_cmd_rereg_mr, 48);
VT3_ASSERT_SIZE(vt3_cmd_create_cq, 24);
VT3_ASSERT_SIZE(vt3_cmd_arm_cq, 8);
VT3_ASSERT_SIZE(vt3_cmd_create_qp, 72);
VT3_ASSERT_SIZE(vt3_cmd_modify_qp, 24);
VT3_ASSERT_SIZE(vt3_qp_attr, 24);
VT3_ASSERT_SIZE(vt3_cmd_doorbell, 8);
VT3_ASSERT_SIZE(vt3_cmd_create_srq, 40);
VT3_ASSERT_SIZE(vt3_cmd_modify_srq, 16);
VT3_ASSERT_SIZE(vt3_cmd_resize_srq, 24);
VT3_ASSERT_SIZE(vt3_srq_attr, 24);
VT3_ASSERT_SIZE(vt3_event, 16);
VT3_ASSERT_SIZE(vt3_sockaddr, 8);
VT3_ASSERT_SIZE(vt3_cmd_listen, 16);
VT3_ASSERT_SIZE(vt3_cmd_connect, 552);
VT3_ASSERT_SIZE(vt3_cmd_accept, 536);
VT3_ASSERT_SIZE(vt3_cmd_reject, 520);
VT3_ASSERT_SIZE(vt3_cmd_disconnect, 8);
VT3_ASSERT_SIZE(vt3_event_cm, 552);
VT3_ASSERT_SIZE(vt3_sge, 16);
VT3_ASSERT_SIZE(vt3_sq_wqe, VT3_WQE_SIZE);
VT3_ASSERT_SIZE(vt3_reg_mr_wqe, VT3_WQE_SIZE);
VT3_ASSERT_SIZE(vt3_bind_mw_wqe, VT3_WQE_SIZE);
VT3_ASSERT_SIZE(vt3_rq_wqe, VT3_WQE_SIZE);
VT3_ASSERT_SIZE(vt3_cqe, 32);
VT3_ASSERT_SIZE(vt3_qp_status, 32);
VT3_ASSERT_SIZE(vt3_cq_status, 16);
VT3_ASSERT_SIZE(vt3_srq_status, 16);
#undef VT3_ASSERT_SIZE

#endif /* VT3_HW_H */
