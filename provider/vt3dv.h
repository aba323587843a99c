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
#define VT3DV_ABI_VERSION	1

/*
 * Coming with the close/flush work (DESIGN.md §5): the vendor async event
 * LLP_CLOSE_COMPLETE, reported through ibv_get_async_event() with
 * event.element.qp set, when a connection closed gracefully and no send
 * WQE was flushed. Its event type constant will be defined here.
 */

#endif /* VT3DV_H */
