// SPDX-License-Identifier: GPL-2.0
/*
 * vt3-forge: the attacker of vt3_hw.h's threat model. A guest process with
 * only a packet socket on the NIC (CAP_NET_RAW) tries to drive the device
 * and to fool the driver:
 *
 *   vt3-forge IFACE [--commands N] [--wait SECONDS]
 *     sniffs the driver's control frames until it has N commands (default
 *     16), then sends: a forged command of every kind (a PD, a DMA MR over
 *     all of RAM, a CQ and a QP at chosen guest addresses, a connect, a
 *     doorbell, ...), a HELLO with guessed virtqueue addresses, every
 *     sniffed command again (replay), every sniffed command with one byte
 *     changed, and a forged event and response towards the driver. Then it
 *     listens 2 s more and counts answers vt3d gave to any of it.
 *
 *   vt3-forge IFACE --events-to MAC
 *     from a machine on the segment: device events and responses sent to
 *     MAC over the wire (vt3d drops control frames from its uplink).
 *
 * It prints one line of counts, "vt3-forge: sniffed=.. forged=.. ..." and
 * exits 0 when it could run at all (the verdict is the caller's: it
 * compares the counts with vt3d's and vt3.ko's refusal counters).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <linux/if_packet.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <poll.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "vt3_hw.h"

#define MAX_FRAME 2048
#define MAX_SNIFFED 64
/* Forged commands carry seqs of this form, so their answers show. */
#define FORGED_SEQ 0xf0f00000u
#define MAX_SEEN 4096

struct frame {
	unsigned char data[MAX_FRAME];
	size_t len;
};

static int sock = -1;
static int ifindex;
static unsigned char own_mac[ETH_ALEN];
static struct frame sniffed[MAX_SNIFFED];
static unsigned int nsniffed;
/* seqs of the responses seen, to spot one answered twice */
static uint32_t seen_resp[MAX_SEEN];
static unsigned int nseen;
static unsigned int answered, duplicated;

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void die(const char *what)
{
	perror(what);
	exit(2);
}

static void open_socket(const char *ifname)
{
	struct sockaddr_ll sll = { .sll_family = AF_PACKET };
	struct ifreq ifr = {};

	sock = socket(AF_PACKET, SOCK_RAW, htons(ETH_P_ALL));
	if (sock < 0)
		die("socket(AF_PACKET)");
	snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "%s", ifname);
	if (ioctl(sock, SIOCGIFINDEX, &ifr) < 0)
		die("SIOCGIFINDEX");
	ifindex = ifr.ifr_ifindex;
	if (ioctl(sock, SIOCGIFHWADDR, &ifr) < 0)
		die("SIOCGIFHWADDR");
	memcpy(own_mac, ifr.ifr_hwaddr.sa_data, ETH_ALEN);
	sll.sll_protocol = htons(ETH_P_ALL);
	sll.sll_ifindex = ifindex;
	if (bind(sock, (struct sockaddr *)&sll, sizeof(sll)) < 0)
		die("bind");
}

static void send_frame(const unsigned char *data, size_t len)
{
	struct sockaddr_ll to = {
		.sll_family = AF_PACKET,
		.sll_ifindex = ifindex,
		.sll_halen = ETH_ALEN,
	};

	memcpy(to.sll_addr, data, ETH_ALEN);
	if (sendto(sock, data, len, 0, (struct sockaddr *)&to, sizeof(to)) < 0)
		die("sendto");
	usleep(2000);	/* one at a time: each must reach vt3d */
}

/* A control frame to @dst: header, payload, and a MAC of made-up bytes. */
static size_t build(unsigned char *out, const unsigned char *dst, uint8_t type,
		    uint16_t opcode, uint32_t seq, const void *payload,
		    uint16_t len)
{
	struct vt3_ctrl_hdr hdr = {
		.version = VT3_CTRL_VERSION,
		.type = type,
		.opcode = opcode,
		.seq = seq,
		.len = len,
		.counter = 1u << 20,
	};
	struct ether_header *eth = (struct ether_header *)out;
	size_t at = sizeof(*eth);
	unsigned int i;

	memcpy(eth->ether_dhost, dst, ETH_ALEN);
	memcpy(eth->ether_shost, own_mac, ETH_ALEN);
	eth->ether_type = htons(VT3_ETHERTYPE);
	memcpy(out + at, &hdr, sizeof(hdr));
	at += sizeof(hdr);
	memcpy(out + at, payload, len);
	at += len;
	for (i = 0; i < VT3_CTRL_MAC_LEN; i++)
		out[at++] = rand();
	return at;
}

static const struct vt3_ctrl_hdr *control_of(const unsigned char *f, size_t len)
{
	const struct ether_header *eth = (const void *)f;

	if (len < sizeof(*eth) + sizeof(struct vt3_ctrl_hdr) ||
	    ntohs(eth->ether_type) != VT3_ETHERTYPE)
		return NULL;
	return (const void *)(f + sizeof(*eth));
}

static void note_response(const struct vt3_ctrl_hdr *h)
{
	unsigned int i;

	if ((h->seq & 0xffff0000u) == FORGED_SEQ)
		answered++;
	for (i = 0; i < nseen; i++) {
		if (seen_resp[i] == h->seq) {
			duplicated++;
			return;
		}
	}
	if (nseen < MAX_SEEN)
		seen_resp[nseen++] = h->seq;
}

/*
 * Reads frames until @until (monotonic) or, with @want, until it captured
 * @want of the driver's commands (without, it only counts answers).
 */
static void sniff(double until, unsigned int want)
{
	unsigned char buf[MAX_FRAME];
	struct sockaddr_ll from;

	while (now() < until && (!want || nsniffed < want)) {
		struct pollfd p = { .fd = sock, .events = POLLIN };
		socklen_t flen = sizeof(from);
		const struct vt3_ctrl_hdr *h;
		ssize_t n;

		if (poll(&p, 1, 100) <= 0)
			continue;
		n = recvfrom(sock, buf, sizeof(buf), 0, (struct sockaddr *)&from, &flen);
		if (n <= 0)
			continue;
		h = control_of(buf, n);
		if (!h)
			continue;
		if (from.sll_pkttype == PACKET_OUTGOING && h->type == VT3_MSG_CMD &&
		    nsniffed < want && (h->seq & 0xffff0000u) != FORGED_SEQ) {
			memcpy(sniffed[nsniffed].data, buf, n);
			sniffed[nsniffed++].len = n;
		} else if (from.sll_pkttype != PACKET_OUTGOING && h->type == VT3_MSG_RESP) {
			note_response(h);
		}
	}
}

/* A payload for @opcode that vt3d would take from the driver. */
static uint16_t payload_for(uint16_t opcode, unsigned char *p)
{
	memset(p, 0, 600);
	switch (opcode) {
	case VT3_CMD_REG_MR: {
		struct vt3_cmd_reg_mr *r = (void *)p;

		r->length = UINT64_MAX;	/* all of guest RAM */
		r->pdn = 1;
		r->access = VT3_ACCESS_LOCAL_WRITE | VT3_ACCESS_REMOTE_WRITE |
			    VT3_ACCESS_REMOTE_READ;
		r->flags = VT3_MR_DMA;
		return sizeof(*r);
	}
	case VT3_CMD_CREATE_CQ: {
		struct vt3_cmd_create_cq *c = (void *)p;

		c->ring_pbl_addr = 0x1000000;
		c->status_addr = 0x1100000;
		c->ring_npages = 1;
		c->depth = 64;
		return sizeof(*c);
	}
	case VT3_CMD_CREATE_QP: {
		struct vt3_cmd_create_qp *q = (void *)p;

		q->sq_pbl_addr = 0x1200000;
		q->rq_pbl_addr = 0x1300000;
		q->status_addr = 0x1400000;
		q->sq_npages = q->rq_npages = 1;
		q->sq_depth = q->rq_depth = 32;
		q->pdn = 1;
		q->send_cqn = q->recv_cqn = 1;
		return sizeof(*q);
	}
	case VT3_CMD_CONNECT: {
		struct vt3_cmd_connect *c = (void *)p;

		c->qpn = 1;
		c->remote.ipv4 = htonl(0x0a000202);
		c->remote.port = htons(7174);
		return sizeof(*c);
	}
	case VT3_CMD_DOORBELL: {
		struct vt3_cmd_doorbell *d = (void *)p;

		d->qpn = 1;
		d->queues = VT3_DB_SQ | VT3_DB_RQ;
		return sizeof(*d);
	}
	default:
		return 64;
	}
}

static int attack(const char *ifname, unsigned int want, double wait)
{
	unsigned char f[MAX_FRAME], payload[600];
	unsigned int forged = 0, hello = 0, replayed = 0, modified = 0, events = 0;
	struct vt3_cmd_hello h = {};
	uint16_t op;
	unsigned int i;
	size_t n;

	open_socket(ifname);
	sniff(now() + wait, want);

	/* Every command kind, sealed with a key of our own (made-up MAC). */
	for (op = VT3_CMD_QUERY_DEVICE; op < VT3_CMD_HELLO; op++) {
		n = build(f, own_mac, VT3_MSG_CMD, op, FORGED_SEQ | op, payload,
			  payload_for(op, payload));
		send_frame(f, n);
		forged++;
	}
	/* A session of our own: guessed virtqueues, a page we could spray. */
	h.session_page = 0x2000000;
	h.rx.desc = 0x3000000;
	h.rx.avail = 0x3001000;
	h.rx.used = 0x3002000;
	h.tx.desc = 0x3004000;
	h.tx.avail = 0x3005000;
	h.tx.used = 0x3006000;
	n = build(f, own_mac, VT3_MSG_CMD, VT3_CMD_HELLO, FORGED_SEQ | VT3_CMD_HELLO,
		  &h, sizeof(h));
	send_frame(f, n);
	hello++;
	/* The driver's own frames again, then changed. */
	for (i = 0; i < nsniffed; i++) {
		send_frame(sniffed[i].data, sniffed[i].len);
		replayed++;
	}
	for (i = 0; i < nsniffed; i++) {
		struct frame *s = &sniffed[i];
		size_t at = sizeof(struct ether_header) + offsetof(struct vt3_ctrl_hdr, opcode);

		/* The opcode: a QUERY becomes a DESTROY, say. */
		s->data[at] ^= 0x01;
		send_frame(s->data, s->len);
		modified++;
	}
	/* Towards the driver: vt3d takes no events or responses from the guest. */
	n = build(f, own_mac, VT3_MSG_EVENT, VT3_EV_DEVICE_FATAL, 0, payload, 0);
	send_frame(f, n);
	events++;
	n = build(f, own_mac, VT3_MSG_RESP, VT3_CMD_ALLOC_PD, FORGED_SEQ, payload, 8);
	send_frame(f, n);
	events++;

	sniff(now() + 2, 0);
	printf("vt3-forge: sniffed=%u forged=%u hello=%u replayed=%u modified=%u events=%u answered=%u duplicated=%u\n",
	       nsniffed, forged, hello, replayed, modified, events, answered, duplicated);
	return 0;
}

static int parse_mac(const char *s, unsigned char *mac)
{
	return sscanf(s, "%hhx:%hhx:%hhx:%hhx:%hhx:%hhx", &mac[0], &mac[1],
		      &mac[2], &mac[3], &mac[4], &mac[5]) == 6 ? 0 : -1;
}

static int events_to(const char *ifname, const char *target)
{
	unsigned char f[MAX_FRAME], payload[64] = {}, dst[ETH_ALEN];
	unsigned int sent = 0;
	size_t n;

	if (parse_mac(target, dst))
		return fprintf(stderr, "vt3-forge: bad MAC %s\n", target), 2;
	open_socket(ifname);
	n = build(f, dst, VT3_MSG_EVENT, VT3_EV_DEVICE_FATAL, 0, payload, 0);
	send_frame(f, n);
	sent++;
	n = build(f, dst, VT3_MSG_EVENT, VT3_EV_QP, 0, payload, sizeof(struct vt3_event));
	send_frame(f, n);
	sent++;
	n = build(f, dst, VT3_MSG_RESP, VT3_CMD_QUERY_DEVICE, 1, payload, 0);
	send_frame(f, n);
	sent++;
	printf("vt3-forge: wire-events=%u\n", sent);
	return 0;
}

int main(int argc, char **argv)
{
	unsigned int want = 16;
	double wait = 60;
	int i;

	if (argc < 2) {
		fprintf(stderr, "usage: vt3-forge IFACE [--commands N] [--wait S] | IFACE --events-to MAC\n");
		return 2;
	}
	srand(getpid() ^ time(NULL));
	for (i = 2; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--commands"))
			want = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--wait"))
			wait = atof(argv[i + 1]);
		else if (!strcmp(argv[i], "--events-to"))
			return events_to(argv[1], argv[i + 1]);
		else
			return fprintf(stderr, "vt3-forge: unknown %s\n", argv[i]), 2;
	}
	if (want > MAX_SNIFFED)
		want = MAX_SNIFFED;
	setvbuf(stdout, NULL, _IOLBF, 0);
	return attack(argv[1], want, wait);
}
