/* SPDX-License-Identifier: GPL-2.0 */
/*
 * vt3.ko - iWARP RDMA function of a vt3 virtual T3-class RNIC.
 *
 * The Ethernet function is the stock virtio_net netdev that vt3d backs;
 * this module talks to vt3d through control frames on that netdev
 * (vt3_ctrl.c) and exposes an iWARP ib_device on top of it.
 *
 * Memory model: vt3d reaches guest memory by guest-physical address. Pages
 * the driver allocates are described with page_to_phys()/virt_to_phys();
 * user and kernel-ULP memory is DMA-mapped through the netdev's DMA-capable
 * ancestor (the virtio PCI function), whose DMA addresses equal physical
 * addresses as long as no IOMMU translates for it - the case for
 * virtio-net without VIRTIO_F_ACCESS_PLATFORM, i.e. every vt3 setup.
 * vt3_attach() refuses a device behind an IOMMU.
 */
#ifndef VT3_H
#define VT3_H

#include <linux/in.h>
#include <linux/kref.h>
#include <linux/mutex.h>
#include <linux/netdevice.h>
#include <linux/siphash.h>
#include <linux/skbuff.h>
#include <linux/spinlock.h>
#include <linux/workqueue.h>
#include <linux/xarray.h>
#include <rdma/ib_verbs.h>
#include <rdma/iw_cm.h>

#include "vt3_compat.h"
#include "include/vt3_hw.h"
#include "include/uapi/vt3-abi.h"

/*
 * RDMA_DRIVER_CXGB3 is unused since cxgb3 left the kernel (5.5) and
 * rdma-core no longer ships libcxgb3, so it names vt3 unambiguously; a
 * T3 look-alike wearing cxgb3's id is fitting. ib_unregister_driver()
 * needs a driver id that is ours alone, which RDMA_DRIVER_UNKNOWN is not.
 */
#define VT3_DRIVER_ID		RDMA_DRIVER_CXGB3
#define VT3_NODE_DESC		"vt3 virtual T3-class iWARP RNIC"

extern unsigned int vt3_cmd_timeout_ms;
extern unsigned int vt3_probe_timeout_ms;
extern unsigned int vt3_cm_timeout_ms;

/* Connection events and timers run here (vt3_cm.c). */
extern struct workqueue_struct *vt3_cm_wq;

/* Device limits from VT3_CMD_QUERY_DEVICE, in CPU order, already clamped. */
struct vt3_limits {
	u64 fw_ver;
	u64 max_mr_size;
	u64 page_size_cap;
	u32 vendor_id;
	u32 vendor_part_id;
	u32 hw_ver;
	u32 max_qp;
	u32 max_qp_wr;
	u32 max_qp_depth;	/* power of two >= max_qp_wr */
	u32 max_sge;
	u32 max_sge_rd;
	u32 max_cq;
	u32 max_cqe;
	u32 max_cq_depth;	/* power of two > max_cqe */
	u32 max_mr;
	u32 max_pd;
	u32 max_ord;
	u32 max_ird;
	u32 max_inline;
	u32 max_pbl_pages;
	u32 max_fast_reg_pages;	/* 0: vt3d has no fast registration */
	u32 max_mw;		/* 0: vt3d has no memory windows */
	u32 max_srq;		/* 0: vt3d has no SRQs */
	u32 max_srq_wr;
	u32 max_srq_depth;	/* power of two >= max_srq_wr */
	u32 max_srq_sge;
	u32 max_msg_size;
};

/* Control channel state (vt3_ctrl.c). */
/* Why a frame from vt3d was refused (hw_counters ctrl_refused_*). */
enum vt3_refusal {
	VT3_REFUSED_SHORT,
	VT3_REFUSED_VERSION,
	VT3_REFUSED_TYPE,
	VT3_REFUSED_NO_SESSION,
	VT3_REFUSED_MAC,
	VT3_REFUSED_REPLAY,
	VT3_REFUSED_HELLO,		/* a HELLO answer we did not wait for */
	VT3_REFUSED_MAX
};

struct vt3_ctrl {
	struct mutex cmd_lock;		/* one synchronous command at a time */
	atomic64_t sent;		/* counter of the last frame sent */
	atomic64_t refused[VT3_REFUSED_MAX];
	spinlock_t lock;		/* the fields below */
	/*
	 * The session key Ks (docs/security.md): set by
	 * the first contact, under cmd_lock too, before any frame of the
	 * session is sent or taken, and fixed once it is proven. The
	 * sender reads it without the lock: nothing else sends meanwhile.
	 */
	siphash_key_t key;
	bool keyed;
	u64 rx_highest;			/* replay window of frames from vt3d */
	u64 rx_seen;
	u32 next_seq;
	bool waiting;			/* a synchronous command awaits its RESP */
	u32 wait_seq;
	u16 wait_opcode;
	/* The nonce of the HELLO waiting (wait_opcode VT3_CMD_HELLO). */
	u8 hello_nonce[VT3_NONCE_LEN];
	void *resp;
	size_t resp_len;
	int result;
	struct completion done;
	bool lost;			/* a command timed out: vt3d is gone */
};

/*
 * Memory the device was told about: kernel pages (rings, status pages)
 * and/or a pinned user region, plus the page list (PBL) describing them.
 * Reference counted because a user mmap entry can outlive the CQ/QP that
 * owns it; freed in vt3_pages_put(). When the device did not confirm that
 * it forgot the memory (destroy failed), the owner parks it on the
 * device's orphan list instead, so the device can never write into pages
 * that were given back to the allocator.
 */
struct vt3_pages {
	struct kref ref;
	struct list_head orphan;
	struct ib_umem *umem;
	__le64 *pbl;			/* physically contiguous (kmalloc) */
	u32 pbl_len;			/* VT3_PAGE_SIZE entries */
	u32 npages;			/* kernel pages in pages[] */
	struct page *pages[];
};

struct vt3_dev {
	struct ib_device ibdev;
	struct net_device *netdev;
	netdevice_tracker netdev_tracker;
	struct packet_type ptype;
	bool ptype_added;
	bool attached;			/* vt3d answered the probe */
	bool reprobe;			/* lost: its netdev is probed again */
	struct vt3_ctrl ctrl;
	struct vt3_limits lim;
	u8 mac[ETH_ALEN];
	int port_state;			/* enum ib_port_state, from the netdev */
	struct delayed_work carrier_work; /* carrier loss: vt3d gone? */
	struct xarray cq_xa;		/* cqn -> vt3_cq, for events */
	struct xarray qp_xa;		/* qpn -> vt3_qp, for iw_get_qp, CQEs */
	struct xarray srq_xa;		/* srqn -> vt3_srq, for events */
	spinlock_t orphan_lock;
	struct list_head orphans;	/* vt3_pages the device may still use */
	unsigned int orphaned;		/* on orphans; under orphan_lock */

	/* Connection management (vt3_cm.c) */
	struct mutex cm_lock;		/* listeners, addr */
	struct list_head listeners;	/* vt3_listener */
	struct vt3_cmd_set_addr addr;	/* what vt3d was told last */
	bool addr_sent;
	struct sk_buff_head ev_queue;	/* connection/QP events from RX */
	struct work_struct ev_work;
	struct work_struct addr_work;
	struct work_struct lost_work;
	atomic_t fatal;			/* IB_EVENT_DEVICE_FATAL dispatched */
	bool removing;			/* being unregistered (going away or lost) */
};

struct vt3_ucontext {
	struct ib_ucontext ibuc;
};

struct vt3_pd {
	struct ib_pd ibpd;
	u32 pdn;
};

struct vt3_mr {
	struct ib_mr ibmr;
	struct vt3_pages *mem;		/* PBL (+ umem); NULL for a DMA MR */
	/*
	 * Fast-reg MRs (alloc_mr): mem->pbl holds up to mem->pbl_len pages,
	 * npages of them set by the last map_mr_sg; a REG_MR WQE names that
	 * list and vt3d copies it when it executes the WQE.
	 */
	bool fast_reg;
	u32 npages;
	int ib_access;			/* user MRs: to pin a new range alike */
};

/* A memory window: all its state is vt3d's (docs/memory-windows.md). */
struct vt3_mw {
	struct ib_mw ibmw;
};

struct vt3_mmap_entry {
	struct rdma_user_mmap_entry rdma;
	struct vt3_pages *mem;
};

/* One ring or status page in kernel memory. */
struct vt3_queue_mem {
	struct vt3_pages *mem;
	struct vt3_mmap_entry *mmap;	/* user objects only */
};

struct vt3_cq {
	struct ib_cq ibcq;
	u32 cqn;
	u32 depth;
	bool user;
	struct vt3_queue_mem ring;
	struct vt3_queue_mem status;
	spinlock_t lock;		/* kernel consumer: cons, polling, flush lists */
	u32 cons;
	/*
	 * Kernel CQs: the QPs whose outstanding WQEs the driver completes
	 * with IB_WC_WR_FLUSH_ERR (vt3_qp.c), after the device's CQEs.
	 */
	struct list_head flush_sq;	/* vt3_qp.sq_flush_node */
	struct list_head flush_rq;	/* vt3_qp.rq_flush_node */
	/*
	 * Destroyed QPs whose CQEs may still be in the ring (struct
	 * vt3_gone): skipped, so a QP number vt3d hands out again never
	 * gets the old QP's completions.
	 */
	struct list_head gone;
	bool frozen;			/* device lost: no CQE past frozen_prod */
	u32 frozen_prod;
	spinlock_t comp_lock;		/* serializes comp_handler calls */
	struct work_struct arm_work;	/* arm from IRQs-off context */
	atomic_t arm_flags;
	atomic_t armed;			/* the consumer armed; no event since */
	struct work_struct kick_work;	/* completion event from a post */
};

/*
 * A kernel SRQ's record of one slot (vt3_srq.c): which WQE is in it and
 * whether its completion is still owed. The slot is free for a post once
 * the CQE of that WQE was taken (vt3_hw.h), whatever vt3d's cons says.
 */
struct vt3_srq_slot {
	u64 wr_id;
	u32 idx;			/* the WQE's free-running SRQ index */
	bool owed;			/* posted, its completion not returned */
};

struct vt3_srq {
	struct ib_srq ibsrq;
	u32 srqn;
	u32 depth;			/* power of two; every entry usable */
	u32 max_sge;
	u32 limit;
	bool user;
	struct vt3_queue_mem ring;
	struct vt3_queue_mem status;
	/*
	 * Kernel SRQs: the producer and the slots. Taken inside a CQ's
	 * lock (poll_cq), never the other way round.
	 */
	spinlock_t lock;
	u32 prod;
	u32 owed;			/* slots with owed set */
	struct vt3_srq_slot *slots;
	/*
	 * The device was lost: the QP whose receive CQ flushes every owed
	 * slot (vt3_hw.h), from flush_pos on; NULL until one claims it.
	 */
	struct vt3_qp *flusher;
	u32 flush_pos;
	struct work_struct db_work;	/* doorbell from IRQs-off context */
	/* Serializes modify_srq (a resize sleeps on vt3d's answer). */
	struct mutex modify_lock;
	/*
	 * A kernel SRQ's resize waiting for vt3d's answer (under lock):
	 * posts and completions go to these too, so whichever ring vt3d
	 * reads holds the same WQEs.
	 */
	struct vt3_pages *next_ring;
	struct vt3_srq_slot *next_slots;
	u32 next_depth;
};

/* Where a QP's connection is, as far as iw_cm was told (vt3_cm.c). */
enum vt3_conn_state {
	VT3_CONN_NONE,		/* none, or its end was reported */
	VT3_CONN_CONNECTING,	/* CONNECT sent: CONNECT_REPLY owed */
	VT3_CONN_ACCEPTING,	/* ACCEPT sent: ESTABLISHED owed */
	VT3_CONN_UP,		/* iw_cm knows it established */
	VT3_CONN_CLOSING,	/* a close began (ours or the peer's) */
	VT3_CONN_PAIRING,	/* PAIR_QP sent (vt3_pair.c): not up yet */
};

/*
 * ib_state is the IB state the driver tracks: vt3d knows only its iWARP
 * state (vt3_qp.c maps between them).
 */
struct vt3_qp {
	struct ib_qp ibqp;
	u32 qpn;
	struct kref ref;		/* iw_cm holds references too */
	struct completion freed;
	struct mutex state_lock;	/* modify/query */
	enum ib_qp_state ib_state;
	u32 sq_depth;
	u32 rq_depth;
	u32 max_send_sge;
	u32 max_recv_sge;
	u32 max_inline;
	bool sig_all;
	bool user;
	struct vt3_queue_mem sq;
	struct vt3_queue_mem rq;
	struct vt3_queue_mem status;
	spinlock_t sq_lock;		/* kernel producer */
	spinlock_t rq_lock;
	u32 sq_prod;
	u32 rq_prod;
	/*
	 * Index after the last WQE whose CQE poll_cq took (vt3_cqe.wqe_idx):
	 * the slots before it are free for posting (vt3_hw.h). Written
	 * under the queue's CQ lock, read with acquire by the poster.
	 */
	u32 sq_done;
	u32 rq_done;
	/*
	 * Kernel QPs in error: the driver completes [sq_flush, sq_prod) and
	 * [rq_flush, rq_prod) with IB_WC_WR_FLUSH_ERR when the CQ is polled.
	 * Set under the CQ's lock and the queue's lock; read under either.
	 * sq_flush_at_done: the device was lost, its consumer index is not
	 * trusted: the flush starts at sq_done once the CQ's consumer passed
	 * the mark (the last CQE that counts was taken).
	 */
	bool sq_flushing;
	bool rq_flushing;
	bool sq_flush_at_done;
	bool rq_flush_at_done;
	u32 sq_flush;
	u32 rq_flush;
	/* CQ index past every device CQE of the queue: flushes due from there. */
	u32 sq_flush_mark;
	u32 rq_flush_mark;
	struct list_head sq_flush_node;	/* send CQ's flush_sq */
	bool destroyed;			/* under both CQs' locks: no flush again */
	struct list_head rq_flush_node;	/* recv CQ's flush_rq */
	struct work_struct db_work;	/* doorbell from IRQs-off context */
	atomic_t db_pending;

	/* The connection (vt3_cm.c), under state_lock. */
	enum vt3_conn_state conn;
	struct iw_cm_id *cm_id;		/* referenced while conn != NONE, */
					/* NULL for a pair (vt3_pair.c) */
	bool pair_named;		/* RTR named pair_qpn (IB_QP_DEST_QPN) */
	u32 pair_qpn;
	struct socket *port;		/* an active open's reserved port */
	struct sockaddr_in laddr;
	struct sockaddr_in raddr;
	unsigned long cm_deadline;	/* jiffies: vt3d must have answered */
	struct delayed_work cm_timer;
	/*
	 * The device is being removed and the connection ended before the
	 * consumer was told DEVICE_REMOVAL: its CLOSE (which makes iw_cm drop
	 * its QP reference) waits for the consumer's destroy_qp; the id is
	 * referenced until then. The connection itself is over (conn NONE).
	 */
	struct iw_cm_id *close_owed;
	bool destroying;		/* destroy_qp ends the connection */
	/*
	 * QP of an SRQ: IB_EVENT_QP_LAST_WQE_REACHED was raised since the
	 * QP last entered ERR (under state_lock). vt3d reports it when it
	 * moves the QP to ERROR; a clean close leaves the QP IDLE in vt3d
	 * (ERR for the driver) and a lost device reports nothing, so the
	 * driver raises it then: once either way.
	 */
	bool last_wqe_done;
};

static inline struct vt3_dev *to_vt3_dev(struct ib_device *ibdev)
{
	return container_of(ibdev, struct vt3_dev, ibdev);
}

static inline struct vt3_pd *to_vt3_pd(struct ib_pd *ibpd)
{
	return container_of(ibpd, struct vt3_pd, ibpd);
}

static inline struct vt3_mr *to_vt3_mr(struct ib_mr *ibmr)
{
	return container_of(ibmr, struct vt3_mr, ibmr);
}

static inline struct vt3_cq *to_vt3_cq(struct ib_cq *ibcq)
{
	return container_of(ibcq, struct vt3_cq, ibcq);
}

static inline struct vt3_qp *to_vt3_qp(struct ib_qp *ibqp)
{
	return container_of(ibqp, struct vt3_qp, ibqp);
}

static inline struct vt3_srq *to_vt3_srq(struct ib_srq *ibsrq)
{
	return container_of(ibsrq, struct vt3_srq, ibsrq);
}

static inline struct vt3_mmap_entry *
to_vt3_mmap(struct rdma_user_mmap_entry *entry)
{
	return container_of(entry, struct vt3_mmap_entry, rdma);
}

/* Names for log messages (vt3_ctrl.c). */
const char *vt3_qp_state_name(unsigned int state);
const char *vt3_event_name(unsigned int event);

/* vt3_ctrl.c */
void vt3_ctrl_init(struct vt3_dev *dev);
void vt3_ctrl_start(struct vt3_dev *dev);
void vt3_ctrl_stop(struct vt3_dev *dev);
int vt3_ctrl_first_contact(struct vt3_dev *dev, unsigned int tries,
			   unsigned int timeout_ms);
int vt3_key_load(void);
bool vt3_key_ready(void);
void vt3_key_report_missing(struct net_device *netdev);
void vt3_key_wipe(void);
int vt3_cmd(struct vt3_dev *dev, enum vt3_cmd opcode, const void *req,
	    size_t req_len, void *resp, size_t resp_len);
int vt3_cmd_timeout(struct vt3_dev *dev, enum vt3_cmd opcode,
		    const void *req, size_t req_len, void *resp,
		    size_t resp_len, unsigned int timeout_ms);
int vt3_post(struct vt3_dev *dev, enum vt3_cmd opcode, const void *req,
	     size_t req_len);
int vt3_cmd_handle(struct vt3_dev *dev, enum vt3_cmd opcode, u32 handle);

/*
 * Whether a destroy command's result proves vt3d no longer uses the
 * object's memory: it confirmed, or it never knew the handle.
 */
static inline bool vt3_forgot(int err)
{
	return !err || err == -ENOENT;
}

/*
 * Whether a failed create or register command surely made nothing in
 * vt3d: it answered with an error status, or the command never left.
 * Unanswered (-ETIMEDOUT) or not understood (-EPROTO), vt3d may hold the
 * object with our memory: that memory is kept until a RESET is confirmed.
 */
static inline bool vt3_refused(int err)
{
	return err != -ETIMEDOUT && err != -EPROTO;
}

/* vt3_main.c */
void vt3_device_lost(struct vt3_dev *dev);
void vt3_device_fatal_event(struct vt3_dev *dev);

/* vt3_cm.c */
void vt3_cm_init(struct vt3_dev *dev);
void vt3_cm_stop(struct vt3_dev *dev);
void vt3_cm_queue_event(struct vt3_dev *dev, struct sk_buff *skb);
void vt3_cm_addr_changed(struct vt3_dev *dev);
void vt3_cm_device_lost(struct vt3_dev *dev);
void vt3_cm_going_away(struct vt3_dev *dev);
void vt3_cm_qp_init(struct vt3_qp *qp);
void vt3_cm_qp_destroy(struct vt3_qp *qp);
int vt3_cm_disconnect(struct vt3_qp *qp);
void vt3_cm_abort(struct vt3_qp *qp, int status);
int vt3_cm_sync_addr(struct vt3_dev *dev);
int vt3_port_reserve(struct vt3_dev *dev, struct sockaddr_in *sin,
		     bool listener, struct socket **sockp);
int vt3_pair_name(struct vt3_qp *qp, const struct ib_qp_attr *attr, int mask);
int vt3_pair_connect(struct vt3_qp *qp);
int vt3_iw_connect(struct iw_cm_id *cm_id, struct iw_cm_conn_param *param);
int vt3_iw_accept(struct iw_cm_id *cm_id, struct iw_cm_conn_param *param);
int vt3_iw_reject(struct iw_cm_id *cm_id, const void *pdata, u8 pdata_len);
int vt3_iw_create_listen(struct iw_cm_id *cm_id, int backlog);
int vt3_iw_destroy_listen(struct iw_cm_id *cm_id);

/* vt3_mem.c: memory handed to the device */
void vt3_pages_put(struct vt3_pages *mem);
void vt3_free_orphans(struct vt3_dev *dev);
void vt3_write_recv_wqe(struct vt3_pages *ring, u32 index,
			const struct ib_recv_wr *wr);
long vt3_pages_live(void);
unsigned int vt3_orphaned(struct vt3_dev *dev);
void *vt3_pages_slot(struct vt3_pages *mem, size_t offset);
int vt3_queue_mem_alloc(struct vt3_dev *dev, struct ib_ucontext *uctx,
			struct vt3_queue_mem *q, size_t bytes, bool with_pbl,
			u64 *key);
void vt3_queue_mem_release(struct vt3_dev *dev, struct vt3_queue_mem *q,
			   bool device_forgot);
struct ib_mr *vt3_get_dma_mr(struct ib_pd *ibpd, int access);
struct ib_mr *vt3_reg_user_mr(struct ib_pd *ibpd, u64 start, u64 length,
			      u64 virt, int access, struct ib_udata *udata);
struct ib_mr *vt3_rereg_user_mr(struct ib_mr *ibmr, int flags, u64 start,
				u64 length, u64 virt, int ib_access,
				struct ib_pd *ibpd, struct ib_udata *udata);
int vt3_dereg_mr(struct ib_mr *ibmr, struct ib_udata *udata);
int vt3_alloc_mw(struct ib_mw *ibmw, struct ib_udata *udata);
int vt3_dealloc_mw(struct ib_mw *ibmw);
struct ib_mr *vt3_alloc_mr(struct ib_pd *ibpd, enum ib_mr_type type,
			   u32 max_num_sg);
int vt3_map_mr_sg(struct ib_mr *ibmr, struct scatterlist *sg, int sg_nents,
		  unsigned int *sg_offset);
int vt3_access(int ib_access, u32 *access);

/* vt3_verbs.c */
int vt3_query_device(struct ib_device *ibdev, struct ib_device_attr *attr,
		     struct ib_udata *udata);
int vt3_query_port(struct ib_device *ibdev, u32 port,
		   struct ib_port_attr *attr);
int vt3_get_port_immutable(struct ib_device *ibdev, u32 port,
			   struct ib_port_immutable *immutable);
int vt3_query_gid(struct ib_device *ibdev, u32 port, int idx,
		  union ib_gid *gid);
void vt3_ucontext_resp(struct vt3_dev *dev,
		       struct vt3_alloc_ucontext_resp *resp);
int vt3_alloc_ucontext(struct ib_ucontext *ibuc, struct ib_udata *udata);
void vt3_dealloc_ucontext(struct ib_ucontext *ibuc);
void vt3_disassociate_ucontext(struct ib_ucontext *ibuc);
int vt3_mmap(struct ib_ucontext *ibuc, struct vm_area_struct *vma);
void vt3_mmap_free(struct rdma_user_mmap_entry *entry);
int vt3_alloc_pd(struct ib_pd *ibpd, struct ib_udata *udata);
int vt3_dealloc_pd(struct ib_pd *ibpd, struct ib_udata *udata);
void vt3_get_dev_fw_str(struct ib_device *ibdev, char *str);
bool vt3_udata_in_ok(struct ib_udata *udata);

/* vt3_import.c */
extern const struct uapi_definition vt3_uapi_defs[];
int vt3_query_ucontext(struct ib_ucontext *ibuc,
		       struct uverbs_attr_bundle *attrs);

/* vt3_cq.c */
int vt3_create_cq(struct ib_cq *ibcq, const struct ib_cq_init_attr *attr,
		  struct vt3_create_cq_attrs *attrs);
int vt3_destroy_cq(struct ib_cq *ibcq, struct ib_udata *udata);
int vt3_poll_cq(struct ib_cq *ibcq, int num, struct ib_wc *wc);
int vt3_req_notify_cq(struct ib_cq *ibcq, enum ib_cq_notify_flags flags);
void vt3_cq_event(struct vt3_dev *dev, u16 type, const struct vt3_event *ev);
void vt3_cq_set_error(struct vt3_cq *cq);
void vt3_cq_kick(struct vt3_cq *cq);
void vt3_cq_kick_later(struct vt3_cq *cq);
void vt3_cq_freeze(struct vt3_cq *cq);
void vt3_cq_freeze_all(struct vt3_dev *dev);

/* vt3_qp.c */
int vt3_create_qp(struct ib_qp *ibqp, struct ib_qp_init_attr *attr,
		  struct ib_udata *udata);
int vt3_modify_qp(struct ib_qp *ibqp, struct ib_qp_attr *attr, int mask,
		  struct ib_udata *udata);
int vt3_query_qp(struct ib_qp *ibqp, struct ib_qp_attr *attr, int mask,
		 struct ib_qp_init_attr *init);
int vt3_destroy_qp(struct ib_qp *ibqp, struct ib_udata *udata);
int vt3_post_send(struct ib_qp *ibqp, const struct ib_send_wr *wr,
		  const struct ib_send_wr **bad_wr);
int vt3_post_recv(struct ib_qp *ibqp, const struct ib_recv_wr *wr,
		  const struct ib_recv_wr **bad_wr);
struct ib_qp *vt3_iw_get_qp(struct ib_device *ibdev, int qpn);
void vt3_iw_add_ref(struct ib_qp *ibqp);
void vt3_iw_rem_ref(struct ib_qp *ibqp);
struct vt3_qp *vt3_qp_get(struct vt3_dev *dev, u32 qpn);
struct vt3_qp *vt3_qp_get_next(struct vt3_dev *dev, unsigned long *qpn);
void vt3_qp_put(struct vt3_qp *qp);
void vt3_qp_enter_error(struct vt3_qp *qp);
void vt3_qp_ib_event(struct vt3_qp *qp, enum ib_event_type type);
void vt3_qp_last_wqe(struct vt3_qp *qp);

/* vt3_flush.c: kernel QPs' flush and completion books */
void vt3_qp_flush_start(struct vt3_qp *qp);
void vt3_qp_flush_stop(struct vt3_qp *qp);
void vt3_qp_forget(struct vt3_qp *qp);
int vt3_qp_poll_flush(struct vt3_cq *cq, int num, struct ib_wc *wc);
bool vt3_qp_cqe_taken(struct vt3_qp *qp, struct vt3_cq *cq, bool recv,
		      u32 wqe_idx);
bool vt3_qp_flush_pending(struct vt3_cq *cq);
void vt3_cq_forget(struct vt3_cq *cq, u32 qpn);
u32 vt3_cq_prod(struct vt3_cq *cq);
void vt3_cq_free_gone(struct vt3_cq *cq);

/* vt3_srq.c */
int vt3_create_srq(struct ib_srq *ibsrq, struct ib_srq_init_attr *init,
		   struct ib_udata *udata);
int vt3_modify_srq(struct ib_srq *ibsrq, struct ib_srq_attr *attr,
		   enum ib_srq_attr_mask mask, struct ib_udata *udata);
int vt3_query_srq(struct ib_srq *ibsrq, struct ib_srq_attr *attr);
int vt3_destroy_srq(struct ib_srq *ibsrq, struct ib_udata *udata);
int vt3_post_srq_recv(struct ib_srq *ibsrq, const struct ib_recv_wr *wr,
		      const struct ib_recv_wr **bad_wr);
void vt3_srq_event(struct vt3_dev *dev, u16 type, const struct vt3_event *ev);
bool vt3_srq_cqe_taken(struct vt3_qp *qp, struct vt3_cq *cq, u32 wqe_idx,
		       u64 *wr_id);
int vt3_srq_flush(struct vt3_qp *qp, int num, struct ib_wc *wc);
bool vt3_srq_flush_pending(struct vt3_qp *qp);
void vt3_srq_qp_gone(struct vt3_qp *qp);

static inline struct vt3_qp_status *vt3_qp_status(struct vt3_qp *qp)
{
	return vt3_pages_slot(qp->status.mem, 0);
}

#endif /* VT3_H */
