// SPDX-License-Identifier: GPL-2.0
/*
 * vt3-forge: the attacker of vt3_hw.h's threat model. A guest process with
 * only a packet socket on the NIC (CAP_NET_RAW) tries to drive the device
 * and to fool the driver:
 *
 *   vt3-forge IFACE [--commands N] [--wait SECONDS]
 *     sniffs the driver's control frames until it has N commands (default
 *     16), then sends: a forged command of every kind (a PD, a DMA MR over
 *     all of RAM with remote rights, a CQ and a QP at chosen guest
 *     addresses, a connect, a doorbell, ...), a HELLO of its own (a random
 *     nonce, a made-up MAC), every sniffed command again (replay), every
 *     sniffed command with its opcode changed, and a forged event and
 *     response towards the driver. Then it listens 2 s more and counts
 *     answers vt3d gave to any of it.
 *
 *   vt3-forge IFACE --events-to MAC
 *     from a machine on the segment: device events and responses sent to
 *     MAC over the wire (vt3d drops control frames from its uplink).
 *
 *   vt3-forge IFACE [--sniff-handshake [--save FILE] [--capture-only]]
 *                   [--handshake FILE] [--frames FILE] [--as-nobody]
 *                   [--spray MB] [--guess SECONDS] [--wait SECONDS]
 *     the first contact (control protocol v5), attacked:
 *     --sniff-handshake  captures the driver's HELLO, vt3d's RESP HELLO,
 *                 the driver's PROVE and its RESP while the driver is
 *                 reloaded (within --wait s), keeps it in FILE (--save),
 *                 then (unless --capture-only) attacks with it, as
 *     --handshake FILE  does with a capture saved before: the HELLO and the
 *                 PROVE replayed, each with every byte of its control part
 *                 flipped in turn, vt3d's answers reflected to it as they
 *                 are and as commands, a HELLO with a counter, HELLOs of
 *                 other shapes and versions, PROVEs naming made-up and
 *                 half-made-up challenges. HELLOs and PROVEs go out paced
 *                 below vt3d's refusal rate (VT3_HELLO_RATE), so that each
 *                 is checked rather than dropped as over the limit, and the
 *                 counts say which refusal counter each must move (want_*:
 *                 the rules of docs/security.md).
 *     --frames FILE  a saved capture, for --spray to copy.
 *     --as-nobody  first drops to uid/gid 65534 with CAP_NET_RAW only (in
 *                 the bounding set too), then tries to read the key from
 *                 the firmware configuration (key_read=denied is right),
 *                 and only then opens its sockets.
 *     --spray MB  fills MB of its memory (locked if it may, touched anyway)
 *                 with key records of the v4 session page and copies of the
 *                 captured frames, kept resident while it guesses.
 *     --guess S   random HELLOs and PROVEs (random nonces and MACs) at full
 *                 speed for S seconds.
 *     --ready FILE  (any mode) is created once the sockets are open.
 *
 * Answers: any response vt3d sends carrying a seq of the attacker's own
 * range, or a HELLO or PROVE response carrying the seq of a captured HELLO
 * or PROVE (their genuine answers were seen during the capture), counts as
 * answered; a response seq seen twice counts as duplicated.
 *
 * It prints one line of counts, "vt3-forge: k=v ..." and exits 0 when it
 * could run at all (the verdict is the caller's: it compares the counts
 * with vt3d's and vt3.ko's refusal counters).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
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
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "vt3_hw.h"

#define MAX_FRAME 2048
#define MAX_SNIFFED 64
#define MAX_SEEN 4096
#define ETH_HDR sizeof(struct ether_header)
#define HDR_LEN sizeof(struct vt3_ctrl_hdr)
/* The attacker's seqs: the top byte of this base, the rest a counter. */
#define SEQ_MASK 0xff000000u
/* Paced HELLOs and PROVEs: this many at once, then this many a second. */
#define PACE_FREE (VT3_HELLO_BURST / 2)
#define PACE_RATE (VT3_HELLO_RATE * 3 / 4)
#define KEY_RAW "/sys/firmware/qemu_fw_cfg/by_name/" VT3_FW_CFG_KEY "/raw"
#define NOBODY 65534
/* vt3_hw.h v4's vt3_session_page, what the spray imitates. */
#define V4_SESSION_MAGIC 0x53335456	/* "VT3S" */
#define HS_MAGIC "VT3HS\0\0\1"

struct frame {
	unsigned char data[MAX_FRAME];
	size_t len;
};

struct v4_session_page {
	uint32_t magic;
	uint32_t version;
	uint64_t key[2];
	uint64_t reserved;
};

/* vt3d's refusal counters (vt3d ctl stats: control.ctrl_refused_*). */
enum want {
	W_SHORT, W_VERSION, W_NOT_COMMAND, W_NO_SESSION, W_MAC, W_REPLAY,
	W_HELLO, W_HELLO_REPLAY, W_NR
};
static const char *const want_names[W_NR] = {
	"short", "version", "not_command", "no_session", "mac", "replay",
	"hello", "hello_replay",
};

/* The first contact as captured. */
enum { HS_HELLO, HS_RESP_HELLO, HS_PROVE, HS_RESP_PROVE, HS_N };

static int rsock = -1, ssock = -1;
static int ifindex;
static unsigned char own_mac[ETH_ALEN];
static uint32_t forged_base = 0xf0000000u;
static struct frame sniffed[MAX_SNIFFED];
static unsigned int nsniffed;
static struct frame hs[HS_N];
static unsigned int nhs;		/* frames of hs[] captured or loaded */
static int watching;			/* the genuine answers are behind us */
/* seqs of the responses seen, to spot one answered twice */
static uint32_t seen_resp[MAX_SEEN];
static unsigned int nseen;
static unsigned int answered, duplicated;
static unsigned long busy;		/* sends the NIC's queue had no room for */
static uint64_t rng_state;

/* What the first-contact attacks sent, and what vt3d must make of it. */
static struct {
	unsigned int want[W_NR];
	unsigned int replayed, modified, reflected, reflected_cmd, crafted, bucketed;
	double last_bucketed;
} t;

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

static uint64_t rnd(void)
{
	/* xorshift64*: fast enough for a flood, seeded from getrandom. */
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 0x2545f4914f6cdd1dull;
}

static void rnd_bytes(unsigned char *p, size_t n)
{
	while (n >= 8) {
		uint64_t v = rnd();

		memcpy(p, &v, 8);
		p += 8;
		n -= 8;
	}
	while (n--)
		*p++ = rnd();
}

static void seed(void)
{
	if (getrandom(&rng_state, sizeof(rng_state), 0) != sizeof(rng_state))
		rng_state = getpid() ^ (uint64_t)time(NULL) << 20;
	rng_state |= 1;
	srand(rnd());
}

static void bind_to(int s, uint16_t proto)
{
	struct sockaddr_ll sll = {
		.sll_family = AF_PACKET,
		.sll_protocol = htons(proto),
		.sll_ifindex = ifindex,
	};

	if (bind(s, (struct sockaddr *)&sll, sizeof(sll)) < 0)
		die("bind");
}

/*
 * The receiving socket: every frame on the NIC, the driver's outgoing
 * ones included (@all), or only incoming control frames. The sending
 * socket receives nothing and bypasses the qdisc, so that a frame it
 * could not queue is an error (ENOBUFS, tried again) rather than a drop
 * nobody sees: every frame counted as sent reached the device.
 */
static void open_sockets(const char *ifname, int all)
{
	struct ifreq ifr = {};
	int one = 1;

	rsock = socket(AF_PACKET, SOCK_RAW, htons(all ? ETH_P_ALL : VT3_ETHERTYPE));
	if (rsock < 0)
		die("socket(AF_PACKET)");
	ssock = socket(AF_PACKET, SOCK_RAW, 0);
	if (ssock < 0)
		die("socket(AF_PACKET)");
	snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "%s", ifname);
	if (ioctl(rsock, SIOCGIFINDEX, &ifr) < 0)
		die("SIOCGIFINDEX");
	ifindex = ifr.ifr_ifindex;
	if (ioctl(rsock, SIOCGIFHWADDR, &ifr) < 0)
		die("SIOCGIFHWADDR");
	memcpy(own_mac, ifr.ifr_hwaddr.sa_data, ETH_ALEN);
	bind_to(rsock, all ? ETH_P_ALL : VT3_ETHERTYPE);
	bind_to(ssock, 0);
	if (setsockopt(ssock, SOL_PACKET, PACKET_QDISC_BYPASS, &one, sizeof(one)) < 0)
		die("PACKET_QDISC_BYPASS");
}

/* One frame out; waits for room in the NIC's queue as long as it takes. */
static void send_now(const unsigned char *data, size_t len)
{
	struct sockaddr_ll to = {
		.sll_family = AF_PACKET,
		.sll_protocol = htons(VT3_ETHERTYPE),
		.sll_ifindex = ifindex,
		.sll_halen = ETH_ALEN,
	};
	double give_up = 0;

	memcpy(to.sll_addr, data, ETH_ALEN);
	while (sendto(ssock, data, len, MSG_DONTWAIT, (struct sockaddr *)&to, sizeof(to)) < 0) {
		if (errno != ENOBUFS && errno != EAGAIN && errno != EINTR)
			die("sendto");
		busy++;
		if (!give_up)
			give_up = now() + 10;
		else if (now() > give_up)
			die("sendto: no room in the NIC's queue for 10 s");
		usleep(50);
	}
}

static void send_frame(const unsigned char *data, size_t len)
{
	send_now(data, len);
	usleep(2000);	/* one at a time: each must reach vt3d */
}

static uint16_t get16(const unsigned char *p)
{
	uint16_t v;

	memcpy(&v, p, 2);
	return le16toh(v);
}

static uint32_t get32(const unsigned char *p)
{
	uint32_t v;

	memcpy(&v, p, 4);
	return le32toh(v);
}

static void put_hdr(unsigned char *ctrl, uint8_t version, uint8_t type, uint16_t opcode,
		    uint32_t seq, uint16_t len, uint64_t counter)
{
	struct vt3_ctrl_hdr hdr = {
		.version = version,
		.type = type,
		.opcode = htole16(opcode),
		.seq = htole32(seq),
		.len = htole16(len),
		.counter = htole64(counter),
	};

	memcpy(ctrl, &hdr, sizeof(hdr));
}

/* A control frame to @dst: header, payload, and a MAC of made-up bytes. */
static size_t build_v(unsigned char *out, const unsigned char *dst, uint8_t version,
		      uint8_t type, uint16_t opcode, uint32_t seq, const void *payload,
		      uint16_t len, uint64_t counter)
{
	struct ether_header *eth = (struct ether_header *)out;
	size_t at = ETH_HDR;

	memcpy(eth->ether_dhost, dst, ETH_ALEN);
	memcpy(eth->ether_shost, own_mac, ETH_ALEN);
	eth->ether_type = htons(VT3_ETHERTYPE);
	put_hdr(out + at, version, type, opcode, seq, len, counter);
	at += HDR_LEN;
	memcpy(out + at, payload, len);
	at += len;
	rnd_bytes(out + at, VT3_CTRL_MAC_LEN);
	return at + VT3_CTRL_MAC_LEN;
}

static size_t build(unsigned char *out, const unsigned char *dst, uint8_t type, uint16_t opcode,
		    uint32_t seq, const void *payload, uint16_t len, uint64_t counter)
{
	return build_v(out, dst, VT3_CTRL_VERSION, type, opcode, seq, payload, len, counter);
}

static const struct vt3_ctrl_hdr *control_of(const unsigned char *f, size_t len)
{
	const struct ether_header *eth = (const void *)f;

	if (len < ETH_HDR + HDR_LEN || ntohs(eth->ether_type) != VT3_ETHERTYPE)
		return NULL;
	return (const void *)(f + ETH_HDR);
}

static int is_ours(uint32_t seq)
{
	return (seq & SEQ_MASK) == forged_base;
}

static void note_response(const struct vt3_ctrl_hdr *h)
{
	uint32_t seq = le32toh(h->seq);
	uint16_t op = le16toh(h->opcode);
	unsigned int i;

	if (is_ours(seq))
		answered++;
	else if (watching && (op == VT3_CMD_HELLO || op == VT3_CMD_PROVE) && nhs == HS_N &&
		 (seq == get32(hs[HS_HELLO].data + ETH_HDR + offsetof(struct vt3_ctrl_hdr, seq)) ||
		  seq == get32(hs[HS_PROVE].data + ETH_HDR + offsetof(struct vt3_ctrl_hdr, seq))))
		answered++;
	for (i = 0; i < nseen; i++) {
		if (seen_resp[i] == seq) {
			duplicated++;
			return;
		}
	}
	if (nseen < MAX_SEEN)
		seen_resp[nseen++] = seq;
}

/* Whatever is waiting on the receiving socket, without blocking. */
static void drain(void)
{
	unsigned char buf[MAX_FRAME];
	struct sockaddr_ll from;
	socklen_t flen = sizeof(from);
	ssize_t n;

	while ((n = recvfrom(rsock, buf, sizeof(buf), MSG_DONTWAIT, (struct sockaddr *)&from, &flen)) > 0) {
		const struct vt3_ctrl_hdr *h = control_of(buf, n);

		if (h && from.sll_pkttype != PACKET_OUTGOING && h->type == VT3_MSG_RESP)
			note_response(h);
		flen = sizeof(from);
	}
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
		struct pollfd p = { .fd = rsock, .events = POLLIN };
		socklen_t flen = sizeof(from);
		const struct vt3_ctrl_hdr *h;
		ssize_t n;
		uint16_t op;

		if (poll(&p, 1, 100) <= 0)
			continue;
		n = recvfrom(rsock, buf, sizeof(buf), 0, (struct sockaddr *)&from, &flen);
		if (n <= 0)
			continue;
		h = control_of(buf, n);
		if (!h)
			continue;
		op = le16toh(h->opcode);
		if (from.sll_pkttype == PACKET_OUTGOING && h->type == VT3_MSG_CMD &&
		    nsniffed < want && !is_ours(le32toh(h->seq)) &&
		    op != VT3_CMD_HELLO && op != VT3_CMD_PROVE) {
			memcpy(sniffed[nsniffed].data, buf, n);
			sniffed[nsniffed++].len = n;
			/* Far from the driver's seqs: its answers cannot look like ours. */
			forged_base = (le32toh(h->seq) + 0x80000000u) & SEQ_MASK;
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
		r->flags = VT3_MR_DMA | VT3_MR_UNSAFE_GLOBAL_RKEY;
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

/* A random HELLO (@prove: PROVE) of the attacker's, as a guess would be. */
static size_t random_contact(unsigned char *f, int prove, uint32_t seq)
{
	unsigned char nonces[2 * VT3_NONCE_LEN];

	rnd_bytes(nonces, sizeof(nonces));
	if (prove)
		return build(f, own_mac, VT3_MSG_CMD, VT3_CMD_PROVE, seq, nonces,
			     sizeof(struct vt3_cmd_prove), 1);
	return build(f, own_mac, VT3_MSG_CMD, VT3_CMD_HELLO, seq, nonces,
		     sizeof(struct vt3_cmd_hello), 0);
}

static int attack(const char *ifname, unsigned int want, double wait, const char *ready)
{
	unsigned char f[MAX_FRAME], payload[600];
	unsigned int forged = 0, hello = 0, replayed = 0, modified = 0, events = 0;
	uint16_t op;
	unsigned int i;
	size_t n;

	open_sockets(ifname, 1);
	if (ready)
		close(open(ready, O_CREAT | O_WRONLY, 0644));
	sniff(now() + wait, want);

	/* Every command kind, sealed with a key of our own (made-up MAC). */
	for (op = VT3_CMD_QUERY_DEVICE; op < VT3_CMD_HELLO; op++) {
		n = build(f, own_mac, VT3_MSG_CMD, op, forged_base | op, payload,
			  payload_for(op, payload), 1u << 20);
		send_frame(f, n);
		forged++;
	}
	/* A session of our own: a HELLO we cannot seal under the key. */
	n = random_contact(f, 0, forged_base | VT3_CMD_HELLO);
	send_frame(f, n);
	hello++;
	/* The driver's own frames again, then changed. */
	for (i = 0; i < nsniffed; i++) {
		send_frame(sniffed[i].data, sniffed[i].len);
		replayed++;
	}
	for (i = 0; i < nsniffed; i++) {
		struct frame *s = &sniffed[i];
		size_t at = ETH_HDR + offsetof(struct vt3_ctrl_hdr, opcode);
		uint16_t to = get16(s->data + at) ^ 0x01;

		/* The opcode: a QUERY becomes a DESTROY, say (but never a first contact). */
		s->data[at] ^= (to == VT3_CMD_HELLO || to == VT3_CMD_PROVE) ? 0x40 : 0x01;
		send_frame(s->data, s->len);
		modified++;
	}
	/* Towards the driver: vt3d takes no events or responses from the guest. */
	n = build(f, own_mac, VT3_MSG_EVENT, VT3_EV_DEVICE_FATAL, 0, payload, 0, 1u << 20);
	send_frame(f, n);
	events++;
	n = build(f, own_mac, VT3_MSG_RESP, VT3_CMD_ALLOC_PD, forged_base, payload, 8, 1u << 20);
	send_frame(f, n);
	events++;

	sniff(now() + 2, 0);
	printf("vt3-forge: sniffed=%u forged=%u hello=%u replayed=%u modified=%u events=%u answered=%u duplicated=%u\n",
	       nsniffed, forged, hello, replayed, modified, events, answered, duplicated);
	return 0;
}

/* ------------------------------------------------------------------ */
/* The first contact                                                   */

static const unsigned char *payload_of(const struct frame *f)
{
	return f->data + ETH_HDR + HDR_LEN;
}

static size_t ctrl_len(const unsigned char *f)
{
	return HDR_LEN + get16(f + ETH_HDR + offsetof(struct vt3_ctrl_hdr, len)) + VT3_CTRL_MAC_LEN;
}

/*
 * Captures the driver's first contact (HELLO, its answer, PROVE, its
 * answer) within @until; returns how many of the four it has.
 */
static unsigned int capture_handshake(double until)
{
	struct frame hellos[8];
	unsigned int nhellos = 0, stage = 0, i;
	unsigned char buf[MAX_FRAME];
	struct sockaddr_ll from;

	while (now() < until && stage < HS_N) {
		struct pollfd p = { .fd = rsock, .events = POLLIN };
		socklen_t flen = sizeof(from);
		const struct vt3_ctrl_hdr *h;
		uint16_t op, len;
		int out;
		ssize_t n;

		if (poll(&p, 1, 100) <= 0)
			continue;
		n = recvfrom(rsock, buf, sizeof(buf), 0, (struct sockaddr *)&from, &flen);
		h = n > 0 ? control_of(buf, n) : NULL;
		if (!h || h->version != VT3_CTRL_VERSION || (size_t)n < ctrl_len(buf) + ETH_HDR)
			continue;
		out = from.sll_pkttype == PACKET_OUTGOING;
		op = le16toh(h->opcode);
		len = le16toh(h->len);
		if (out && h->type == VT3_MSG_CMD && op == VT3_CMD_HELLO &&
		    len == sizeof(struct vt3_cmd_hello)) {
			struct frame *s = &hellos[nhellos++ % 8];

			memcpy(s->data, buf, n);
			s->len = n;
		} else if (!out && h->type == VT3_MSG_RESP && op == VT3_CMD_HELLO &&
			   len == sizeof(struct vt3_resp_hello) && h->status == VT3_OK) {
			/* The answer to one of the HELLOs seen: same seq, same nonce. */
			for (i = 0; i < nhellos && i < 8; i++) {
				struct frame *s = &hellos[i];

				if (get32(s->data + ETH_HDR + offsetof(struct vt3_ctrl_hdr, seq)) ==
				    le32toh(h->seq) &&
				    !memcmp(payload_of(s), buf + ETH_HDR + HDR_LEN, VT3_NONCE_LEN)) {
					hs[HS_HELLO] = *s;
					memcpy(hs[HS_RESP_HELLO].data, buf, n);
					hs[HS_RESP_HELLO].len = n;
					stage = 2;
				}
			}
		} else if (stage >= 2 && out && h->type == VT3_MSG_CMD && op == VT3_CMD_PROVE &&
			   len == sizeof(struct vt3_cmd_prove) &&
			   !memcmp(buf + ETH_HDR + HDR_LEN, payload_of(&hs[HS_RESP_HELLO]),
				   sizeof(struct vt3_cmd_prove))) {
			memcpy(hs[HS_PROVE].data, buf, n);
			hs[HS_PROVE].len = n;
			stage = 3;
		} else if (stage == 3 && !out && h->type == VT3_MSG_RESP && op == VT3_CMD_PROVE &&
			   le32toh(h->seq) ==
			   get32(hs[HS_PROVE].data + ETH_HDR + offsetof(struct vt3_ctrl_hdr, seq))) {
			memcpy(hs[HS_RESP_PROVE].data, buf, n);
			hs[HS_RESP_PROVE].len = n;
			stage = 4;
		} else if (!out && h->type == VT3_MSG_RESP) {
			note_response(h);
		}
	}
	return stage;
}

static void save_handshake(const char *path)
{
	FILE *f = fopen(path, "wb");
	unsigned int i;

	if (!f)
		die(path);
	fwrite(HS_MAGIC, 1, 8, f);
	for (i = 0; i < HS_N; i++) {
		uint32_t len = htole32(hs[i].len);

		fwrite(&len, 4, 1, f);
		fwrite(hs[i].data, 1, hs[i].len, f);
	}
	if (fclose(f))
		die(path);
}

static void load_handshake(const char *path)
{
	FILE *f = fopen(path, "rb");
	char magic[8];
	unsigned int i;

	if (!f)
		die(path);
	if (fread(magic, 1, 8, f) != 8 || memcmp(magic, HS_MAGIC, 8)) {
		fprintf(stderr, "vt3-forge: %s is no capture of a first contact\n", path);
		exit(2);
	}
	for (i = 0; i < HS_N; i++) {
		uint32_t len;

		if (fread(&len, 4, 1, f) != 1 || (len = le32toh(len)) > MAX_FRAME || len < ETH_HDR + HDR_LEN ||
		    fread(hs[i].data, 1, len, f) != len) {
			fprintf(stderr, "vt3-forge: %s is cut short\n", path);
			exit(2);
		}
		hs[i].len = len;
	}
	fclose(f);
	nhs = HS_N;
}

static int same_control(const unsigned char *f, size_t n, const struct frame *g)
{
	size_t len = ctrl_len(g->data);

	return n >= ETH_HDR + len && !memcmp(f + ETH_HDR, g->data + ETH_HDR, len);
}

/*
 * What vt3d must make of a frame from the guest while the driver has a
 * session (docs/security.md; vt3d refuses HELLOs and
 * PROVEs before it runs out of tokens: this tool paces them). Returns the
 * refusal counter it must move; *@bucketed: whether it is a HELLO or PROVE
 * that costs vt3d a token of its refusal bucket.
 */
static enum want model(const unsigned char *f, size_t n, int *bucketed)
{
	const unsigned char *c = f + ETH_HDR;
	uint16_t op, len;

	*bucketed = 0;
	if (n < ETH_HDR + HDR_LEN)
		return W_SHORT;
	if (c[offsetof(struct vt3_ctrl_hdr, version)] != VT3_CTRL_VERSION)
		return W_VERSION;
	len = get16(c + offsetof(struct vt3_ctrl_hdr, len));
	if (n < ETH_HDR + HDR_LEN + len + VT3_CTRL_MAC_LEN)
		return W_SHORT;
	if (c[offsetof(struct vt3_ctrl_hdr, type)] != VT3_MSG_CMD)
		return W_NOT_COMMAND;
	op = get16(c + offsetof(struct vt3_ctrl_hdr, opcode));
	if (op == VT3_CMD_HELLO) {
		*bucketed = 1;
		/*
		 * Only the driver's own HELLO has a MAC under K (this tool lacks
		 * K): any other fails its shape, counter or MAC. The driver's
		 * own, again, names a driver nonce vt3d has seen.
		 */
		if (len == sizeof(struct vt3_cmd_hello) && same_control(f, n, &hs[HS_HELLO]))
			return W_HELLO_REPLAY;
		return W_HELLO;
	}
	if (op == VT3_CMD_PROVE) {
		*bucketed = 1;
		/* A PROVE naming the challenge the driver used, whatever its MAC. */
		if (len == sizeof(struct vt3_cmd_prove) &&
		    !memcmp(c + HDR_LEN, payload_of(&hs[HS_PROVE]), sizeof(struct vt3_cmd_prove)))
			return W_HELLO_REPLAY;
		return W_HELLO;	/* no such challenge, or of another shape */
	}
	/* A command of the live session: only the driver's MAC under Ks is right. */
	return W_MAC;
}

/* Sends a first-contact attack frame, counted by what it must move. */
static void send_counted(const unsigned char *f, size_t n)
{
	int bucketed;
	enum want w = model(f, n, &bucketed);

	if (bucketed) {
		if (t.bucketed >= PACE_FREE) {
			double due = t.last_bucketed + 1.0 / PACE_RATE;

			while (now() < due) {
				drain();
				usleep(5000);
			}
		}
		t.last_bucketed = now();
		t.bucketed++;
	}
	t.want[w]++;
	send_frame(f, n);
	drain();
}

static void send_crafted(const unsigned char *f, size_t n)
{
	send_counted(f, n);
	t.crafted++;
}

static void handshake_attacks(void)
{
	static const unsigned int kinds[] = { HS_HELLO, HS_PROVE };
	static const unsigned int answers[] = { HS_RESP_HELLO, HS_RESP_PROVE };
	const size_t type_at = ETH_HDR + offsetof(struct vt3_ctrl_hdr, type);
	const size_t counter_at = ETH_HDR + offsetof(struct vt3_ctrl_hdr, counter);
	unsigned char f[MAX_FRAME], p[600];
	uint32_t seq = forged_base | 0x100000;
	unsigned int k;
	size_t i, n;

	/* 1. The driver's HELLO and PROVE, as they were. */
	for (k = 0; k < 2; k++) {
		send_counted(hs[kinds[k]].data, hs[kinds[k]].len);
		t.replayed++;
	}
	/* 2. Each with every byte of its control part flipped in turn. */
	for (k = 0; k < 2; k++) {
		const struct frame *s = &hs[kinds[k]];

		for (i = ETH_HDR; i < ETH_HDR + ctrl_len(s->data); i++) {
			memcpy(f, s->data, s->len);
			f[i] ^= 0xff;
			send_counted(f, s->len);
			t.modified++;
		}
	}
	/* 3. vt3d's answers sent back to it: as they are, and as commands. */
	for (k = 0; k < 2; k++) {
		const struct frame *s = &hs[answers[k]];

		send_counted(s->data, s->len);
		memcpy(f, s->data, s->len);
		f[type_at] = VT3_MSG_CMD;
		send_counted(f, s->len);
		t.reflected++;
		t.reflected_cmd++;
	}
	/* 4. Crafted. The driver's HELLO with a counter (its MAC unchanged). */
	memcpy(f, hs[HS_HELLO].data, hs[HS_HELLO].len);
	f[counter_at] = 1;
	send_crafted(f, hs[HS_HELLO].len);
	/* The driver's nonce in a HELLO of ours (a MAC we made up). */
	n = build(f, own_mac, VT3_MSG_CMD, VT3_CMD_HELLO, seq++, payload_of(&hs[HS_HELLO]),
		  sizeof(struct vt3_cmd_hello), 0);
	send_crafted(f, n);
	/* A fresh HELLO, and one shaped as the answer, and an empty one. */
	n = random_contact(f, 0, seq++);
	send_crafted(f, n);
	n = build(f, own_mac, VT3_MSG_CMD, VT3_CMD_HELLO, seq++, payload_of(&hs[HS_RESP_HELLO]),
		  sizeof(struct vt3_resp_hello), 0);
	send_crafted(f, n);
	n = build(f, own_mac, VT3_MSG_CMD, VT3_CMD_HELLO, seq++, p, 0, 0);
	send_crafted(f, n);
	/* v4's HELLO (a page and guessed virtqueues) under v4. */
	memset(p, 0, sizeof(p));
	for (i = 0; i < 7; i++) {
		uint64_t gpa = htole64(0x2000000 + i * 0x1000);

		memcpy(p + 8 * i, &gpa, 8);
	}
	n = build_v(f, own_mac, 4, VT3_MSG_CMD, VT3_CMD_HELLO, seq++, p, 56, 0);
	send_crafted(f, n);
	/* PROVEs: made-up nonces; the driver's with a made-up device nonce and
	 * the other way round; the used challenge again under a made-up MAC
	 * and a later counter. */
	n = random_contact(f, 1, seq++);
	send_crafted(f, n);
	memcpy(p, payload_of(&hs[HS_PROVE]), sizeof(struct vt3_cmd_prove));
	rnd_bytes(p + VT3_NONCE_LEN, VT3_NONCE_LEN);
	n = build(f, own_mac, VT3_MSG_CMD, VT3_CMD_PROVE, seq++, p, sizeof(struct vt3_cmd_prove), 1);
	send_crafted(f, n);
	memcpy(p, payload_of(&hs[HS_PROVE]), sizeof(struct vt3_cmd_prove));
	rnd_bytes(p, VT3_NONCE_LEN);
	n = build(f, own_mac, VT3_MSG_CMD, VT3_CMD_PROVE, seq++, p, sizeof(struct vt3_cmd_prove), 1);
	send_crafted(f, n);
	n = build(f, own_mac, VT3_MSG_CMD, VT3_CMD_PROVE, seq++, payload_of(&hs[HS_PROVE]),
		  sizeof(struct vt3_cmd_prove), 2);
	send_crafted(f, n);
	/* What a session of our own would have done first: a DMA MR over all
	 * of RAM with remote rights, as if the PROVE had been taken. */
	n = build(f, own_mac, VT3_MSG_CMD, VT3_CMD_REG_MR, seq++, p, payload_for(VT3_CMD_REG_MR, p), 2);
	send_crafted(f, n);
}

/* ------------------------------------------------------------------ */
/* Spray, guesses, privileges                                          */

static struct {
	unsigned char *mem;
	size_t len;
	unsigned int mb, locked;
	unsigned long records;
} spr;

/* Every 4th page copies of the captured frames, the others v4 key records. */
static void spray(unsigned int mb)
{
	const size_t page = 4096;
	size_t at, off;
	unsigned int i;

	spr.len = (size_t)mb << 20;
	spr.mem = mmap(NULL, spr.len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (spr.mem == MAP_FAILED)
		die("mmap");
	spr.locked = mlock(spr.mem, spr.len) == 0;
	for (at = 0; at < spr.len; at += page) {
		unsigned char *pg = spr.mem + at;

		if ((at / page) % 4 == 3 && nhs) {
			for (off = 0, i = 0; off + hs[i].len <= page; i = (i + 1) % nhs) {
				memcpy(pg + off, hs[i].data, hs[i].len);
				off += (hs[i].len + 7) & ~(size_t)7;
			}
			continue;
		}
		for (off = 0; off + sizeof(struct v4_session_page) <= page;
		     off += sizeof(struct v4_session_page)) {
			struct v4_session_page r = {
				.magic = htole32(V4_SESSION_MAGIC),
				.version = htole32(off & 32 ? 4 : VT3_CTRL_VERSION),
				.key = { rnd(), rnd() },
			};

			memcpy(pg + off, &r, sizeof(r));
			spr.records++;
		}
	}
	spr.mb = mb;
}

/* Pages of the spray still as written (resident all along: no swap). */
static unsigned long spray_intact(void)
{
	unsigned long intact = 0;
	size_t at;

	for (at = 0; at < spr.len; at += 4096) {
		uint32_t magic = get32(spr.mem + at);

		intact += magic == V4_SESSION_MAGIC ||
			  (nhs && !memcmp(spr.mem + at, hs[0].data, ETH_HDR));
	}
	return intact;
}

static struct {
	unsigned long hello, prove;
	unsigned int ms;
} g;

/* Random HELLOs and PROVEs, as fast as the NIC takes them. */
static void guess(double seconds)
{
	unsigned char hello[MAX_FRAME], prove[MAX_FRAME];
	size_t nh = random_contact(hello, 0, forged_base), np = random_contact(prove, 1, forged_base);
	const size_t seq_at = ETH_HDR + offsetof(struct vt3_ctrl_hdr, seq);
	double start = now(), end = start + seconds;
	uint32_t i = 0;

	while (now() < end) {
		int is_prove = i & 1;
		unsigned char *f = is_prove ? prove : hello;
		uint32_t seq = htole32(forged_base | (0x200000 + (i & 0xdfffff)));

		memcpy(f + seq_at, &seq, 4);
		/* New nonces and a new MAC: everything after the header. */
		rnd_bytes(f + ETH_HDR + HDR_LEN, (is_prove ? np : nh) - ETH_HDR - HDR_LEN);
		send_now(f, is_prove ? np : nh);
		if (is_prove)
			g.prove++;
		else
			g.hello++;
		if (!(++i & 255))
			drain();
	}
	g.ms = (now() - start) * 1000;
}

static struct {
	int done;
	unsigned long uid, gid, capeff, capprm, capbnd;
	int key_present, key_errno;
	long key_bytes;
	const char *key_read;
} who = { .key_read = "untried" };

static unsigned long status_field(const char *name, int hex)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	size_t len = strlen(name);
	unsigned long v = ~0ul;

	if (!f)
		die("/proc/self/status");
	while (fgets(line, sizeof(line), f)) {
		if (!strncmp(line, name, len) && line[len] == ':') {
			v = strtoul(line + len + 1, NULL, hex ? 16 : 10);
			break;
		}
	}
	fclose(f);
	return v;
}

/* uid and gid 65534, CAP_NET_RAW and nothing else, for good. */
static void drop_to_nobody(void)
{
	struct __user_cap_header_struct hdr = { .version = _LINUX_CAPABILITY_VERSION_3 };
	struct __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3] = {};
	uid_t r, e, s;
	int cap;

	for (cap = 0; prctl(PR_CAPBSET_READ, cap, 0, 0, 0) >= 0; cap++) {
		if (cap != CAP_NET_RAW && prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0)
			die("PR_CAPBSET_DROP");
	}
	prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
	if (prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0) < 0)
		die("PR_SET_KEEPCAPS");
	if (setgroups(0, NULL) < 0)
		die("setgroups");
	if (setresgid(NOBODY, NOBODY, NOBODY) < 0)
		die("setresgid");
	if (setresuid(NOBODY, NOBODY, NOBODY) < 0)
		die("setresuid");
	data[0].permitted = data[0].effective = 1u << CAP_NET_RAW;
	if (syscall(SYS_capset, &hdr, data) < 0)
		die("capset");
	if (prctl(PR_SET_KEEPCAPS, 0, 0, 0, 0) < 0 || prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
		die("prctl");
	if (getresuid(&r, &e, &s) < 0 || r != NOBODY || e != NOBODY || s != NOBODY) {
		fprintf(stderr, "vt3-forge: still uid %u/%u/%u\n", r, e, s);
		exit(2);
	}
	who.done = 1;
	who.uid = getuid();
	who.gid = getgid();
	who.capeff = status_field("CapEff", 1);
	who.capprm = status_field("CapPrm", 1);
	who.capbnd = status_field("CapBnd", 1);
}

/* The key in the firmware configuration: root only (mode 0400). */
static void try_key(void)
{
	unsigned char buf[64];
	int fd = open(KEY_RAW, O_RDONLY);

	if (fd < 0) {
		who.key_errno = errno;
		who.key_read = errno == EACCES ? "denied" : errno == ENOENT ? "absent" : "error";
		return;
	}
	who.key_bytes = read(fd, buf, sizeof(buf));
	who.key_errno = who.key_bytes < 0 ? errno : 0;
	who.key_read = "READ";
	memset(buf, 0, sizeof(buf));
	close(fd);
}

struct options {
	const char *ifname, *save, *load, *frames, *ready;
	int sniff, capture_only, nobody;
	unsigned int spray_mb;
	double guess_s, wait;
};

static int contact(const struct options *o)
{
	unsigned int sniffed_hs = 0;
	struct stat st;

	if (o->load || o->frames) {
		load_handshake(o->load ? o->load : o->frames);
		sniffed_hs = HS_N;
	}
	if (o->nobody) {
		who.key_present = stat(KEY_RAW, &st) == 0;
		drop_to_nobody();
		try_key();
	}
	open_sockets(o->ifname, o->sniff);
	if (o->ready)
		close(open(o->ready, O_CREAT | O_WRONLY, 0644));
	if (o->sniff) {
		sniffed_hs = nhs = capture_handshake(now() + o->wait);
		if (nhs == HS_N && o->save)
			save_handshake(o->save);
	}
	if (nhs == HS_N)
		forged_base = (get32(hs[HS_HELLO].data + ETH_HDR + offsetof(struct vt3_ctrl_hdr, seq)) +
			       0x80000000u) & SEQ_MASK;
	watching = 1;
	if (nhs == HS_N && (o->load || (o->sniff && !o->capture_only)))
		handshake_attacks();
	if (o->spray_mb)
		spray(o->spray_mb);
	if (o->guess_s > 0)
		guess(o->guess_s);
	if (t.replayed || g.hello || spr.mb)
		sniff(now() + 2, 0);

	printf("vt3-forge: sniffed_hs=%u replayed=%u modified=%u reflected=%u reflected_cmd=%u crafted=%u bucketed=%u",
	       sniffed_hs, t.replayed, t.modified, t.reflected, t.reflected_cmd, t.crafted, t.bucketed);
	for (int w = 0; w < W_NR; w++)
		printf(" want_%s=%u", want_names[w], t.want[w]);
	printf(" guess_hello=%lu guess_prove=%lu guess_ms=%u guess_rate=%lu busy=%lu",
	       g.hello, g.prove, g.ms, g.ms ? (g.hello + g.prove) * 1000 / g.ms : 0, busy);
	printf(" spray_mb=%u spray_locked=%u spray_records=%lu spray_intact_pages=%lu spray_pages=%lu",
	       spr.mb, spr.locked, spr.records, spr.mb ? spray_intact() : 0, (unsigned long)(spr.len / 4096));
	if (who.done)
		printf(" uid=%lu gid=%lu capeff=%lu capprm=%lu capbnd=%lu key_present=%d key_read=%s key_errno=%d key_bytes=%ld",
		       who.uid, who.gid, who.capeff, who.capprm, who.capbnd, who.key_present,
		       who.key_read, who.key_errno, who.key_bytes);
	printf(" answered=%u duplicated=%u\n", answered, duplicated);
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
	open_sockets(ifname, 0);
	n = build(f, dst, VT3_MSG_EVENT, VT3_EV_DEVICE_FATAL, 0, payload, 0, 1u << 20);
	send_frame(f, n);
	sent++;
	n = build(f, dst, VT3_MSG_EVENT, VT3_EV_QP, 0, payload, sizeof(struct vt3_event), 1u << 20);
	send_frame(f, n);
	sent++;
	n = build(f, dst, VT3_MSG_RESP, VT3_CMD_QUERY_DEVICE, 1, payload, 0, 1u << 20);
	send_frame(f, n);
	sent++;
	printf("vt3-forge: wire-events=%u\n", sent);
	return 0;
}

static void usage(void)
{
	fprintf(stderr,
		"usage: vt3-forge IFACE [--commands N] [--wait S] [--ready FILE]\n"
		"       vt3-forge IFACE --events-to MAC\n"
		"       vt3-forge IFACE [--sniff-handshake [--save FILE] [--capture-only]] [--handshake FILE]\n"
		"                 [--frames FILE] [--as-nobody] [--spray MB] [--guess S] [--wait S] [--ready FILE]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	struct options o = { .wait = 60 };
	const char *events = NULL;
	unsigned int want = 16;
	int i;

	if (argc < 2 || argv[1][0] == '-')
		usage();
	o.ifname = argv[1];
	seed();
	for (i = 2; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;

		if (!strcmp(a, "--sniff-handshake"))
			o.sniff = 1;
		else if (!strcmp(a, "--capture-only"))
			o.capture_only = 1;
		else if (!strcmp(a, "--as-nobody"))
			o.nobody = 1;
		else if (!v)
			usage();
		else if (!strcmp(a, "--commands"))
			want = atoi(v), i++;
		else if (!strcmp(a, "--wait"))
			o.wait = atof(v), i++;
		else if (!strcmp(a, "--events-to"))
			events = v, i++;
		else if (!strcmp(a, "--save"))
			o.save = v, i++;
		else if (!strcmp(a, "--handshake"))
			o.load = v, i++;
		else if (!strcmp(a, "--frames"))
			o.frames = v, i++;
		else if (!strcmp(a, "--ready"))
			o.ready = v, i++;
		else if (!strcmp(a, "--spray"))
			o.spray_mb = atoi(v), i++;
		else if (!strcmp(a, "--guess"))
			o.guess_s = atof(v), i++;
		else
			return fprintf(stderr, "vt3-forge: unknown %s\n", a), 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (events)
		return events_to(o.ifname, events);
	if (o.sniff || o.load || o.frames || o.nobody || o.spray_mb || o.guess_s > 0)
		return contact(&o);
	if (want > MAX_SNIFFED)
		want = MAX_SNIFFED;
	return attack(o.ifname, want, o.wait, o.ready);
}
