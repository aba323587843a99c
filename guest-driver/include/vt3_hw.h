/* SPDX-License-Identifier: (GPL-2.0 OR Linux-OpenIB) */
/*
 * vt3_hw.h - the vt3 device interface: control frames between vt3.ko and
 * vt3d, work queue and completion queue entries, status pages.
 *
 * Single source of truth: vt3.ko and libvt3 include this file; vt3d
 * mirrors it in device/src/abi.rs, and a cargo test
 * (device/tests/abi_header.rs) compiles this header and compares the size
 * and every field offset of every struct.
 *
 * All multi-byte fields are little endian. Every struct has a fixed size
 * (checked with static asserts at the end); reserved fields are zero.
 *
 * Control channel: Ethernet frames of EtherType VT3_ETHERTYPE on the
 * virtio-net netdev vt3d backs, each a struct vt3_ctrl_hdr, `len` payload
 * bytes and a VT3_CTRL_MAC_LEN-byte MAC. vt3.ko sends VT3_MSG_CMD; vt3d
 * answers each with one VT3_MSG_RESP of the same seq and opcode, and sends
 * VT3_MSG_EVENT on its own. Only vt3.ko may command and only vt3d answer:
 * a first contact (HELLO, PROVE) proves the provisioned key on both sides
 * and derives a session key, under which every frame carries a counter
 * and a MAC.
 *
 * This file holds the layouts; the rules, each stated once, are in:
 *   docs/architecture.md §2 (the control channel), §3 (objects and
 *   memory; §3.1 rings and ordering, §3.2 doorbells and arming, §3.3 fast
 *   registration, §3.4 shared receive queues), §4 (connections), §5
 *   (completions, errors and the flush), §10 (errors and recovery);
 *   docs/security.md (who may drive the device: threat model, key, first
 *   contact, session key, counters and MACs); docs/events.md,
 *   docs/memory-windows.md, docs/rereg-mr.md, docs/srq-resize.md.
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
/* Who may drive the device: key, first contact, replay (docs/security.md). */
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
	/* Shared receive queues (docs/architecture.md §3.4): */
	VT3_CMD_CREATE_SRQ = 25,	/* vt3_cmd_create_srq -> vt3_resp_handle (srqn) */
	VT3_CMD_MODIFY_SRQ = 26,	/* vt3_cmd_modify_srq */
	VT3_CMD_QUERY_SRQ = 27,		/* vt3_cmd_handle (srqn) -> vt3_srq_attr */
	VT3_CMD_DESTROY_SRQ = 28,	/* vt3_cmd_handle (srqn); BUSY while QPs use it */
	/* vt3 extension: QPs of this device connected by modify_qp (below): */
	VT3_CMD_PAIR_QP = 29,		/* vt3_cmd_pair_qp; then as CONNECT/ACCEPT */
	/* Memory windows (docs/memory-windows.md): */
	VT3_CMD_ALLOC_MW = 30,		/* vt3_cmd_alloc_mw -> vt3_resp_handle (stag) */
	VT3_CMD_DEALLOC_MW = 31,	/* vt3_cmd_handle (stag, any key) */
	/* Re-registration (docs/rereg-mr.md): */
	VT3_CMD_REREG_MR = 32,		/* vt3_cmd_rereg_mr */
	/* SRQ resize (docs/srq-resize.md): */
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

/* First contact, step 1 (frame counter 0, MAC under K; docs/security.md). */
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

/*
 * Fast registration: an empty fast-reg MR (state invalid) of pdn for up
 * to max_pages pages (docs/architecture.md §3.3).
 */
struct vt3_cmd_alloc_mr {
	__le32	pdn;
	__le32	max_pages;
};

enum vt3_mw_type {
	VT3_MW_TYPE_1 = 1,		/* bound to the PD (ibv_bind_mw) */
	VT3_MW_TYPE_2 = 2,		/* bound to the posting QP (IB's type 2B) */
};

/* Re-registration: what VT3_CMD_REREG_MR changes (docs/rereg-mr.md). */
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

/* Memory windows: an unbound window of pdn (docs/memory-windows.md). */
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
 * PAIR_QP, a vt3 extension (rdma-core's tests/ connect two RC QPs of one
 * device by ibv_modify_qp, without a CM): user QP qpn asks, from its own
 * port, for a loopback connection to QP peer_qpn of this device, made once
 * both asked for each other. Events, lifetime and refusals:
 * docs/architecture.md §4 ("Loopback").
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
/* Rings and ordering, doorbells: docs/architecture.md §3.1, §3.2.     */

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
