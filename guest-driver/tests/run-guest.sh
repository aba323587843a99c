#!/usr/bin/env bash
# Full-system test of vt3.ko: boots a guest "a" behind vt3d and a guest "b"
# with a plain virtio-net NIC (no vt3d: its probe must time out quietly),
# and exercises the driver through the guest agent. Prints one line per
# check and "N passed, N failed" last.
#
#   guest-driver/tests/run-guest.sh [--keep]
#
# Needs: built vt3.ko (make -C guest-driver), target/release/vt3d, the
# guest images (build/images), qemu-system-x86_64, gcc with static glibc.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
IMAGES=${VT3_IMAGES:-$ROOT/build/images}
VT3D=$ROOT/target/release/vt3d
QEMU=${VT3_QEMU:-qemu-system-x86_64}
KEEP=0
[ "${1:-}" = --keep ] && KEEP=1

# shellcheck source=../../images/agent-host.sh
source "$ROOT/images/agent-host.sh"

DIR=$(mktemp -d "${TMPDIR:-/tmp}/vt3-drv.XXXXXX")
PIDS=()
PASSED=0 FAILED=0

cleanup() {
	local pid
	for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
	for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
	agent_close a 2>/dev/null || true
	agent_close b 2>/dev/null || true
	if [ "$KEEP" = 1 ] || [ "$FAILED" -ne 0 ]; then
		echo "logs kept in $DIR" >&2
	else
		rm -rf "$DIR"
	fi
}
trap cleanup EXIT

pass() {
	PASSED=$((PASSED + 1))
	printf 'PASS %s\n' "$*"
}
fail() {
	FAILED=$((FAILED + 1))
	printf 'FAIL %s\n' "$*"
}

# on NAME TIMEOUT CMD: runs CMD in the guest; output in $OUT, logged.
on() {
	local name=$1 t=$2 rc=0
	shift 2
	OUT=$(agent_run "$name" "$t" "$*") || rc=$?
	printf '[%s]$ %s\n%s\n(rc %s)\n' "$name" "$*" "$OUT" "$rc" >>"$DIR/commands.log"
	return "$rc"
}

# expect NAME TIMEOUT DESCRIPTION CMD: a check that CMD succeeds.
expect() {
	local name=$1 t=$2 what=$3
	shift 3
	if on "$name" "$t" "$*"; then pass "$what"; else fail "$what: $(tail -n 3 <<<"$OUT")"; fi
}

ctl() { timeout 10 "$VT3D" ctl --mgmt "$DIR/vt3a.mgmt" stats; }

# ------------------------------------------------------------------ setup

make -s -C "$ROOT/guest-driver" >/dev/null
mkdir -p "$DIR/overlay/opt/vt3"
cp "$ROOT/guest-driver/vt3.ko" "$DIR/overlay/opt/vt3/"
make -s -C "$(cat "$IMAGES/kbuild-dir")" M="$ROOT/guest-driver/tests" modules >/dev/null
cp "$ROOT/guest-driver/tests/vt3_ktest.ko" "$DIR/overlay/opt/vt3/"
gcc -static -O2 -Wall -o "$DIR/overlay/opt/vt3/vt3-uverbs" "$ROOT/guest-driver/tests/vt3-uverbs.c"
(cd "$DIR/overlay" && find . | cpio -o -H newc 2>/dev/null | gzip) >"$DIR/overlay.cpio.gz"
cat "$IMAGES/initramfs.cpio.gz" "$DIR/overlay.cpio.gz" >"$DIR/initrd.gz"

A_MAC=52:54:00:77:00:01 B_MAC=52:54:00:77:00:02
RUST_LOG=${RUST_LOG:-info} "$VT3D" serve --socket "$DIR/vt3a.vhost" --mgmt "$DIR/vt3a.mgmt" \
	--uplink "unix-dgram:$DIR/vt3a.up,$DIR/b.dgram" --mac "$A_MAC" >"$DIR/vt3a.vt3d.log" 2>&1 &
VT3D_PID=$!
PIDS+=("$VT3D_PID")
for _ in $(seq 100); do [ -S "$DIR/vt3a.vhost" ] && break; sleep 0.1; done

intx=
major=$("$QEMU" --version | sed -n 's/^QEMU emulator version \([0-9]*\)\..*/\1/p')
[ "${major:-0}" -lt 8 ] && intx=,vectors=0

start_guest() {
	local name=$1 ip=$2 mac=$3 nic
	shift 3
	nic=("$@")
	agent_mkfifo "$name" "$DIR"
	timeout 1200 "$QEMU" -accel tcg -M q35 -smp 1 -m 512M -display none -monitor none \
		-no-reboot -nodefaults -kernel "$IMAGES/vmlinuz" -initrd "$DIR/initrd.gz" \
		-append "console=ttyS0 panic=-1 loglevel=7 vt3.name=$name vt3.ip=$ip/24" \
		-serial "file:$DIR/$name.console" -chardev "pipe,id=agent,path=$DIR/$name.agent" \
		-serial chardev:agent "${nic[@]}" >"$DIR/$name.qemu.log" 2>&1 </dev/null &
	PIDS+=("$!")
	agent_open "$name" "$DIR"
}

start_guest a 10.77.0.1 "$A_MAC" \
	-object memory-backend-memfd,id=mem,size=512M,share=on -numa node,memdev=mem \
	-chardev "socket,id=vhost,path=$DIR/vt3a.vhost" -netdev vhost-user,id=n0,chardev=vhost \
	-device "virtio-net-pci,netdev=n0,mac=$A_MAC,romfile=$intx"
start_guest b 10.77.0.2 "$B_MAC" \
	-netdev "dgram,id=n0,local.type=unix,local.path=$DIR/b.dgram,remote.type=unix,remote.path=$DIR/vt3a.up" \
	-device "virtio-net-pci,netdev=n0,mac=$B_MAC,romfile="
agent_wait_ready a 240 || { fail "guest a boots"; exit 1; }
agent_wait_ready b 240 || { fail "guest b boots"; exit 1; }
pass "guests boot"

# ------------------------------------------------------------------ checks

# b: a virtio-net NIC without vt3d behind it.
expect b 60 "insmod without vt3d: no ib device" \
	'insmod /opt/vt3/vt3.ko && ! ls /sys/class/infiniband/ 2>/dev/null | grep -q vt3'
expect b 30 "rmmod without vt3d" 'rmmod vt3 && ! dmesg | grep -i "vt3.*\(error\|fail\)"'

# a: the real thing.
expect a 60 "insmod: vt3_0 registered" \
	'insmod /opt/vt3/vt3.ko && ls /sys/class/infiniband/vt3_0'
expect a 30 "rdma dev/link show vt3_0 on eth0, ACTIVE" \
	'/usr/bin/rdma link show vt3_0/1 | tee /dev/stderr | grep -q "state ACTIVE.*netdev eth0"'
expect a 30 "node type RNIC, port ACTIVE" \
	'grep -q RNIC /sys/class/infiniband/vt3_0/node_type && grep -q ACTIVE /sys/class/infiniband/vt3_0/ports/1/state'
# rdma-core 44 has no vt3 provider: ibv_devices skips vt3_0, uverbs has it.
expect a 30 "uverbs device and rdma dev show vt3_0" \
	'grep -qx vt3_0 /sys/class/infiniband_verbs/uverbs*/ibdev && /usr/bin/rdma dev show vt3_0 | grep -q "node_type rnic"'
on a 30 'ibv_devinfo -v -d vt3_0 2>&1; cat /sys/class/infiniband/vt3_0/fw_ver' || true
printf '%s\n' "$OUT" >"$DIR/ibv_devinfo.txt"
expect a 60 "uverbs check (PD, MR, CQ, QP, mmaps, states, doorbells)" '/opt/vt3/vt3-uverbs check'
printf '%s\n' "$OUT" >"$DIR/uverbs-check.txt"
expect a 60 "kernel verbs (vt3_ktest: PD, DMA MR, CQ, QP, posting, states)" \
	'insmod /opt/vt3/vt3_ktest.ko && rmmod vt3_ktest && dmesg | grep vt3_ktest: | tee /dev/stderr | grep -q "vt3_0: [0-9]* passed, 0 failed"'
printf '%s\n' "$OUT" >"$DIR/ktest.txt"
if ctl | tee "$DIR/ctl1.txt" | grep -Eq '(pd|mr|cq|qp)[^0-9]*[1-9]'; then
	fail "vt3d holds no objects after the check: $(tr '\n' ' ' <"$DIR/ctl1.txt")"
else
	pass "vt3d holds no objects after the check"
fi

# A wildcard listen reaches every iWARP device in the kernel: vt3 must
# not make siw's fail (rdma-core 44 sees only siw0: it has no vt3 provider).
expect a 30 "rping -s on the wildcard address (siw0 beside vt3_0) listens" \
	'/usr/bin/rdma link add siw0 type siw netdev eth0 && { timeout 3 rping -s -a 0.0.0.0 -v; rc=$?; /usr/bin/rdma link del siw0; [ $rc = 124 ] || [ $rc = 143 ]; }'
expect a 30 "port follows the link: DOWN" \
	'/usr/bin/ip link set eth0 down && sleep 1 && grep -q DOWN /sys/class/infiniband/vt3_0/ports/1/state'
expect a 30 "port follows the link: ACTIVE again" \
	'/usr/bin/ip link set eth0 up && sleep 2 && grep -q ACTIVE /sys/class/infiniband/vt3_0/ports/1/state'

on a 10 '/opt/vt3/vt3-uverbs hold > /tmp/hold.out 2>&1 & echo $! > /tmp/hold.pid; sleep 3; cat /tmp/hold.out' || true
expect a 30 "rdma res show lists the held QP, CQ, MR, PD" \
	'/usr/bin/rdma res show qp | grep -q vt3_0 && /usr/bin/rdma res show cq | grep -q vt3-uverbs && /usr/bin/rdma res show mr | grep -q vt3-uverbs && /usr/bin/rdma res show pd | grep -q vt3-uverbs'
printf '%s\n' "$OUT" >"$DIR/res.txt"
on a 30 '/usr/bin/rdma res show qp; /usr/bin/rdma res show cq; /usr/bin/rdma res show mr; /usr/bin/rdma res show pd' || true
printf '%s\n' "$OUT" >>"$DIR/res.txt"
ctl >"$DIR/ctl2.txt" || true
expect a 60 "rmmod with live user objects" 'rmmod vt3 && ! ls /sys/class/infiniband/vt3_0 2>/dev/null'
if ctl | tee "$DIR/ctl3.txt" | grep -Eq '(pd|mr|cq|qp)[^0-9]*[1-9]'; then
	fail "vt3d holds no objects after rmmod: $(tr '\n' ' ' <"$DIR/ctl3.txt")"
else
	pass "vt3d holds no objects after rmmod"
fi
expect a 30 "the holder survives and exits" 'kill $(cat /tmp/hold.pid) && sleep 1 && ! kill -0 $(cat /tmp/hold.pid) 2>/dev/null'

expect a 60 "reload: vt3_0 again" 'insmod /opt/vt3/vt3.ko && ls /sys/class/infiniband/vt3_0'
expect a 30 "rdma link add refuses a second device on eth0" \
	'! /usr/bin/rdma link add vt3x type vt3 netdev eth0 2>&1'
expect a 30 "rdma link del vt3_0" '/usr/bin/rdma link del vt3_0 && ! ls /sys/class/infiniband/vt3_0 2>/dev/null'
expect a 60 "rdma link add vt3x type vt3 netdev eth0" \
	'/usr/bin/rdma link add vt3x type vt3 netdev eth0 && ls /sys/class/infiniband/vt3x && /opt/vt3/vt3-uverbs check | tail -1'

# vt3d stops answering (SIGSTOP): a command times out, the device goes.
kill -STOP "$VT3D_PID"
on a 60 '/opt/vt3/vt3-uverbs check | head -3' || true
sleep 2
on a 30 'ls /sys/class/infiniband/' || true
if [ -z "$OUT" ]; then pass "silent vt3d: the ib device is unregistered"; else fail "silent vt3d: still have $OUT"; fi
kill -CONT "$VT3D_PID"
expect a 60 "vt3d back: link flap re-probes" \
	'/usr/bin/ip link set eth0 down && /usr/bin/ip link set eth0 up && sleep 3 && ls /sys/class/infiniband/vt3_0'
expect a 60 "final check and rmmod" '/opt/vt3/vt3-uverbs check | tail -1 && rmmod vt3'

# vt3d exits under live objects (vhost-user disconnect): rmmod stays clean.
expect a 60 "insmod and hold objects" \
	'insmod /opt/vt3/vt3.ko && (/opt/vt3/vt3-uverbs hold > /tmp/hold.out 2>&1 & echo $! > /tmp/hold.pid) && sleep 3 && grep -q holding /tmp/hold.out'
kill "$VT3D_PID"
wait "$VT3D_PID" 2>/dev/null || true
sleep 2
expect a 30 "vt3d gone: port DOWN" 'grep -q DOWN /sys/class/infiniband/vt3_0/ports/1/state'
expect a 60 "vt3d gone: rmmod with live objects" 'rmmod vt3 && kill $(cat /tmp/hold.pid)'

on a 30 'dmesg' || true
printf '%s\n' "$OUT" >"$DIR/a.dmesg"
on b 30 'dmesg' || true
printf '%s\n' "$OUT" >"$DIR/b.dmesg"
if grep -hE 'WARNING:|BUG:|Oops|Call Trace|lockdep|refcount_t' "$DIR/a.dmesg" "$DIR/b.dmesg" "$DIR"/*.console; then
	fail "kernel warnings in a guest"
else
	pass "no kernel warnings in either guest"
fi
grep -h 'vt3' "$DIR/a.dmesg" | tail -n 30 >"$DIR/a.vt3-dmesg.txt" || true

echo "$PASSED passed, $FAILED failed"
[ "$FAILED" -eq 0 ]
