/* SPDX-License-Identifier: GPL-2.0 */
/*
 * What vt3_cm.c (the iw_cm verbs and each connection's life) and
 * vt3_cm_event.c (vt3d's connection and QP events) share.
 */
#ifndef VT3_CM_H
#define VT3_CM_H

#include "vt3.h"

struct vt3_listener {
	struct list_head list;		/* dev->listeners */
	struct iw_cm_id *cm_id;		/* referenced */
	struct socket *port;		/* the reservation; NULL: none */
	bool serving;			/* vt3d listens (else inactive here) */
	struct vt3_sockaddr addr;	/* as LISTEN named it */
};

/* vt3_event_cm, parsed. */
struct vt3_cm_ev {
	u32 conn_id;
	u32 qpn;
	u32 status;
	u32 ird;
	u32 ord;
	struct vt3_sockaddr local;
	struct vt3_sockaddr remote;
	const u8 *pd;
	u16 pd_len;
};

void vt3_cm_end_all(struct vt3_dev *dev, int status);
void vt3_cm_ird_ord(struct iw_cm_event *ev, const struct vt3_cm_ev *c);
int vt3_cm_reject(struct vt3_dev *dev, u32 conn_id, const void *pdata,
		  u8 pdata_len);
void vt3_cm_sockaddr(struct sockaddr_storage *ss,
		     const struct vt3_sockaddr *addr);
int vt3_cm_upcall(struct iw_cm_id *cm_id, struct iw_cm_event *ev);
void vt3_conn_end(struct vt3_qp *qp, int status);
void vt3_conn_release(struct vt3_qp *qp);
void vt3_conn_upcall(struct vt3_qp *qp, enum iw_cm_event_type type,
		     int status, const struct vt3_cm_ev *c);
void vt3_cm_event_work(struct work_struct *work);

#endif /* VT3_CM_H */
