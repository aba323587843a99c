/* SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB */
/*
 * vt3dv.h - public interface of libvt3, the rdma-core provider for the vt3
 * virtual iWARP RNIC (ib devices vt3_0, vt3_1, ...). Everything else an
 * application needs is plain libibverbs.
 */
#ifndef VT3DV_H
#define VT3DV_H

/* The provider: libvt3-rdmav34.so, /etc/libibverbs.d/vt3.driver. */
#define VT3DV_PROVIDER_NAME	"vt3"

/* The vt3.ko uverbs ABI this header and the provider belong to. */
#define VT3DV_ABI_VERSION	3

/*
 * resource_type of the alloc/free callbacks of a parent domain
 * (ibv_alloc_parent_domain(3)): the provider's own buffers of a QP (its
 * send and receive shadows: what each posted WR owes, for the flush) and
 * of an SRQ (its slots). The rings themselves are vt3.ko's, mapped, never
 * allocated by the provider. The high 32 bits are the driver id vt3.ko
 * reports (RDMA_DRIVER_CXGB3, 3), as mlx5dv's types carry theirs.
 */
#define VT3DV_RES_TYPE_QP	(((unsigned long long)3 << 32) + 1)
#define VT3DV_RES_TYPE_SRQ	(((unsigned long long)3 << 32) + 2)

/*
 * Async events of a vt3 device (docs/architecture.md §5; docs/events.md).
 *
 * VT3DV_EVENT_LLP_CLOSE_COMPLETE: a vendor event type, outside enum
 * ibv_event_type (compare event.event_type with it as an int). It comes
 * from ibv_get_async_event() when a QP's connection closed gracefully
 * (rdma_disconnect() on either side, the close handshake done) and no send
 * WR was still outstanding: the case where a T3 reported nothing at all.
 *
 *   - event.element.qp is the ibv_qp, as for a QP event (libibverbs hands
 *     the provider the type as a port event; libvt3 finds the QP again).
 *   - When it arrives, the QP is in error and libvt3 has already noted
 *     the flush: every receive WR still posted, and every send WR,
 *     signaled or not, that the device had not completed, is owed exactly one
 *     completion with IBV_WC_WR_FLUSH_ERR, which ibv_poll_cq() returns
 *     after every completion the device wrote for that queue (per-queue
 *     posting order). WRs posted afterwards are taken and flushed too.
 *   - ibv_ack_async_event() is still required, as for every event. Its
 *     accounting for ibv_destroy_qp() is however done by libvt3 inside
 *     ibv_get_async_event() (libibverbs does not count unknown types),
 *     so ibv_destroy_qp() will not wait for that ack: do not destroy the
 *     QP while another thread still uses element.qp of this event.
 *     (Why at get time: ibv_get_async_event() calls the provider, and
 *     ibv_ack_async_event() does not; rewriting event_type into a type
 *     libibverbs counts at ack would hide the vendor type from the
 *     application, and not counting at all makes ibv_destroy_qp() wait
 *     forever, since uverbs counted the event when it was read.)
 *
 * The other events an application sees from a vt3 device, standard
 * libibverbs types (element as libibverbs documents):
 *
 *   IBV_EVENT_QP_FATAL       RST from the peer, retransmit/keepalive
 *                            timeout, TERMINATE received or sent with a
 *                            catastrophic or LLP error type
 *   IBV_EVENT_QP_ACCESS_ERR  TERMINATE received/sent: protection error
 *                            (invalid STag, bounds, rights)
 *   IBV_EVENT_QP_REQ_ERR     TERMINATE received/sent: operation error;
 *                            a malformed local WQE (it also completes
 *                            with an error status)
 *   IBV_EVENT_CQ_ERR         CQ overflow: completions were lost
 *   IBV_EVENT_DEVICE_FATAL   vt3d gone (device lost): every QP in error
 *
 * For the three QP events (and DEVICE_FATAL for all QPs of the context)
 * libvt3 notes the flush when the event is read, as for the vendor event.
 * A peer's graceful disconnect while the QP is RTS produces no ib event
 * (RDMA_CM_EVENT_DISCONNECTED for the rdma_cm user); the vendor event or a
 * fatal one follows when the connection has ended. An application that
 * never reads async events still gets every flush completion: ibv_poll_cq()
 * and the post verbs notice the error too, and an armed CQ's completion
 * channel wakes when the QP goes into error. Once ibv_destroy_qp()
 * returned, no completion of that QP is returned any more (its CQEs still
 * in the CQ are skipped and the flush it still owed goes with it, as
 * mlx5 cleans its CQs): reap before destroying what you want to see.
 *
 * Testing knob: the environment variable VT3_FLUSH_TRIGGERS, a comma
 * list of "event", "poll" and "post" (default: all three), restricts
 * which of the three notes a QP's flush, so a test can prove each one
 * works on its own.
 */
#define VT3DV_EVENT_LLP_CLOSE_COMPLETE	0x8001

#endif /* VT3DV_H */
