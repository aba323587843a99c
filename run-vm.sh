#!/usr/bin/env bash
# vt3: start vt3d(s) and QEMU guest(s) — the demo, the full-system tests,
# and an interactive shell.
#
#   ./run-vm.sh [OPTIONS]              the demo
#   ./run-vm.sh [OPTIONS] test [CASE…] full-system tests (all by default)
#   ./run-vm.sh [OPTIONS] list         names the test cases
#   ./run-vm.sh [OPTIONS] check        every test: cargo test, all cases with
#                                      this QEMU, and QEMU 10.0 cases
#   ./run-vm.sh [OPTIONS] bench        perftest vt3↔vt3 beside siw↔siw: table,
#                                      build/bench/bench.{csv,txt,png}
#   ./run-vm.sh [OPTIONS] shell        an interactive guest with a vt3 NIC
#
# Options:
#   --qemu PATH    QEMU binary (default: $VT3_QEMU, else qemu-system-x86_64)
#   --keep         keep the run directory even when everything passes
#
# Every run works in its own temp dir with unix sockets only (no fixed
# ports); every QEMU, vt3d and guest command has a timeout; only processes
# this script started are killed. A failed case keeps its guest consoles
# and vt3d logs and prints where they are.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tools/cache-dir.sh
source "$ROOT/tools/cache-dir.sh"
IMAGES=${VT3_IMAGES:-$VT3_CACHE/images}
# Cargo's target dir is a cache too: dependencies built once per machine.
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$VT3_CACHE/target}
VT3D=$CARGO_TARGET_DIR/release/vt3d
QEMU=${VT3_QEMU:-}
KEEP=0

# Guest sizing and timeouts (seconds). TCG is slow: be generous, never
# unbounded.
GUEST_MEM=512M
BOOT_TIMEOUT=${VT3_BOOT_TIMEOUT:-240}
QEMU_TIMEOUT=${VT3_QEMU_TIMEOUT:-1800}

# shellcheck source=images/agent-host.sh
source "$ROOT/images/agent-host.sh"

log() { printf '%s\n' "$*" >&2; }
die() {
	log "run-vm.sh: $*"
	exit 2
}

# ---------------------------------------------------------------- host setup

# Host tools the harness needs, as "command:package".
HOST_TOOLS="timeout:coreutils mkfifo:coreutils md5sum:coreutils pgrep:procps gcc:gcc"

ensure_host_packages() {
	local missing=() pair cmd pkg
	[ -n "$QEMU" ] || HOST_TOOLS+=" qemu-system-x86_64:qemu-system-x86"
	for pair in $HOST_TOOLS; do
		cmd=${pair%%:*} pkg=${pair#*:}
		command -v "$cmd" >/dev/null 2>&1 || missing+=("$pkg")
	done
	# vt3-uverbs is linked statically (images/overlay.sh): libc.a.
	[ -f /usr/lib/x86_64-linux-gnu/libc.a ] || missing+=(libc6-dev)
	[ ${#missing[@]} -eq 0 ] && return 0
	if [ "$(id -u)" -ne 0 ]; then
		die "missing host packages: ${missing[*]} (run as root to install them, or: apt-get install ${missing[*]})"
	fi
	log "installing host packages: ${missing[*]}"
	apt-get update -q >/dev/null
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null
}

ensure_vt3d() {
	command -v cargo >/dev/null || die "cargo not found: install Rust (rustup) first"
	(cd "$ROOT" && cargo build --release -q -p vt3d) || die "building vt3d failed"
}

ensure_images() {
	"$ROOT/images/build.sh" --out "$IMAGES" >&2 || die "building the guest images failed"
	"$ROOT/images/overlay.sh" --images "$IMAGES" || die "building vt3.ko / rdma-core for the guest failed"
	INITRD=$IMAGES/initramfs-vt3.cpio.gz
}

# QEMU 7.2 under TCG segfaults in msix_set_vector_notifiers for a
# vhost-user virtio-net-pci with MSI-X; later QEMUs are fine.
qemu_needs_intx() {
	local major
	major=$("$QEMU" --version | sed -n 's/^QEMU emulator version \([0-9]*\)\..*/\1/p')
	[ -n "$major" ] && [ "$major" -lt 8 ]
}

# KVM only when a short probe boot proves it works: here /dev/kvm exists
# but KVM hangs (unkillably) instead of failing, so the probe is never
# waited on for more than a few seconds.
pick_accel() {
	ACCEL=tcg
	case ${VT3_ACCEL:-auto} in
	tcg) return 0 ;;
	auto | kvm) ;;
	*) die "VT3_ACCEL must be auto, tcg or kvm" ;;
	esac
	if [ -w /dev/kvm ]; then
		# No root fs: the kernel panics at once and -no-reboot ends QEMU.
		# In a subshell, so bash does not report the probe's own crash.
		(timeout -k 2 15 "$QEMU" -accel kvm -M q35 -m 128M -display none -monitor none \
			-serial none -no-reboot -kernel "$IMAGES/vmlinuz" -append "panic=-1" \
			>/dev/null 2>&1 </dev/null) 2>/dev/null &
		local probe=$! i
		for i in $(seq 40); do
			if ! kill -0 "$probe" 2>/dev/null; then
				wait "$probe" && ACCEL=kvm
				break
			fi
			sleep 0.5
		done
	fi
	if [ "${VT3_ACCEL:-auto}" = kvm ] && [ "$ACCEL" != kvm ]; then
		die "VT3_ACCEL=kvm but the KVM probe failed"
	fi
}

# Linux queues at most net.unix.max_dgram_qlen (default 10) datagrams on an
# unconnected unix socket: too few for a burst of TCP segments between
# guests, which would then wait for retransmit timeouts. Raise it.
ensure_dgram_queue() {
	local want=1024 have
	have=$(cat /proc/sys/net/unix/max_dgram_qlen 2>/dev/null || echo "$want")
	[ "$have" -ge "$want" ] && return 0
	log "raising net.unix.max_dgram_qlen from $have to $want (unix-dgram uplinks)"
	echo "$want" >/proc/sys/net/unix/max_dgram_qlen || log "could not raise it; expect slow RDMA traffic"
}

prepare() {
	ensure_host_packages
	ensure_dgram_queue
	QEMU=${QEMU:-$(command -v qemu-system-x86_64)}
	[ -x "$QEMU" ] || die "QEMU not found at $QEMU"
	ensure_vt3d
	ensure_images
	pick_accel
	RUN_DIR=$(mktemp -d "${TMPDIR:-/tmp}/vt3-run.XXXXXX")
	log "run dir $RUN_DIR; $("$QEMU" --version | head -1); accel $ACCEL"
}

# ------------------------------------------------------- processes we own

PIDS=()

track() { PIDS+=("$1"); }

kill_tracked() {
	local pid
	for pid in "${PIDS[@]}"; do
		kill "$pid" 2>/dev/null || true
	done
	for pid in "${PIDS[@]}"; do
		wait "$pid" 2>/dev/null || true
	done
	PIDS=()
}

GUESTS=()
VT3DS=()

close_agents() {
	local name
	for name in "${GUESTS[@]}"; do
		agent_close "$name" 2>/dev/null || true
	done
	GUESTS=() VT3DS=()
}

# dump_state WHY: what every vt3d and guest of the case holds, into the
# case log (for a hang: taken while it hangs).
dump_state() {
	local name
	printf '=== state: %s\n' "$1" >>"$CASE_DIR/commands.log"
	for name in "${VT3DS[@]}"; do
		{
			printf '=== %s: qps, tcb, stats\n' "$name"
			vt3d_ctl "$name" qps
			vt3d_ctl "$name" tcb
			vt3d_ctl "$name" stats
		} >>"$CASE_DIR/commands.log" 2>&1 || true
	done
	for name in "${GUESTS[@]}"; do
		on "$name" 20 "rdma res show qp; rdma res show cm_id; dmesg | tail -n 20" || true
	done
}

on_exit() {
	kill_tracked
	close_agents
}
trap on_exit EXIT
trap 'exit 130' INT TERM

# ------------------------------------------------------------- components

# start_vt3d NAME UPLINK [vt3d options…]: vt3d serving $CASE_DIR/NAME.vhost
start_vt3d() {
	local name=$1 uplink=$2
	shift 2
	local sock=$CASE_DIR/$name.vhost
	RUST_LOG=${RUST_LOG:-info} timeout "$QEMU_TIMEOUT" "$VT3D" serve --socket "$sock" \
		--mgmt "$CASE_DIR/$name.mgmt" --uplink "$uplink" "$@" >"$CASE_DIR/$name.vt3d.log" 2>&1 &
	local pid=$!
	track "$pid"
	eval "VT3D_PID_${name//-/_}=$pid"
	VT3DS+=("$name")
	local i
	for i in $(seq 100); do
		[ -S "$sock" ] && return 0
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	log "vt3d $name did not come up:"
	cat "$CASE_DIR/$name.vt3d.log" >&2
	return 1
}

# vt3d_ctl NAME ARGS…: `vt3d ctl` against that vt3d.
vt3d_ctl() {
	local name=$1
	shift
	timeout 10 "$VT3D" ctl --mgmt "$CASE_DIR/$name.mgmt" "$@"
}

# vt3d_pid NAME: the vt3d process itself (not the timeout wrapping it).
vt3d_pid() {
	local var="VT3D_PID_${1//-/_}"
	pgrep -P "${!var}" -x vt3d
}

# start_guest NAME NIC IP MAC [kernel args…]
#   NIC: vt3:VT3D_NAME (vhost-user to that vt3d) or dgram:PEER_SOCKET
#        (a plain QEMU virtio-net on a unix datagram socket).
start_guest() {
	local name=$1 nic=$2 ip=$3 mac=$4
	shift 4
	local args=(
		-accel "$ACCEL" -M q35 -smp 1 -m "$GUEST_MEM" -display none -monitor none
		-no-reboot -nodefaults -kernel "$IMAGES/vmlinuz" -initrd "$INITRD"
		-append "console=ttyS0 panic=-1 loglevel=5 vt3.name=$name vt3.ip=$ip/24 $*"
		-serial "file:$CASE_DIR/$name.console"
		-chardev "pipe,id=agent,path=$CASE_DIR/$name.agent" -serial chardev:agent
	)
	case $nic in
	vt3:*)
		local intx=
		qemu_needs_intx && intx=,vectors=0
		args+=(
			-object "memory-backend-memfd,id=mem,size=$GUEST_MEM,share=on" -numa node,memdev=mem
			-chardev "socket,id=vhost,path=$CASE_DIR/${nic#vt3:}.vhost"
			-netdev vhost-user,id=n0,chardev=vhost
			-device "virtio-net-pci,netdev=n0,mac=$mac,romfile=$intx"
		)
		;;
	dgram:*)
		args+=(
			-netdev "dgram,id=n0,local.type=unix,local.path=$CASE_DIR/$name.dgram,remote.type=unix,remote.path=${nic#dgram:}"
			-device "virtio-net-pci,netdev=n0,mac=$mac,romfile="
		)
		;;
	*) die "start_guest: unknown NIC $nic" ;;
	esac
	rm -f "$CASE_DIR/$name.agent.in" "$CASE_DIR/$name.agent.out"
	agent_mkfifo "$name" "$CASE_DIR"
	timeout "$QEMU_TIMEOUT" "$QEMU" "${args[@]}" >"$CASE_DIR/$name.qemu.log" 2>&1 </dev/null &
	local pid=$!
	track "$pid"
	eval "GUEST_PID_${name//-/_}=$pid"
	agent_open "$name" "$CASE_DIR"
	GUESTS+=("$name")
	if ! agent_wait_ready "$name" "$BOOT_TIMEOUT"; then
		log "guest $name did not boot; console tail:"
		tail -n 20 "$CASE_DIR/$name.console" >&2 || true
		tail -n 5 "$CASE_DIR/$name.qemu.log" >&2 || true
		return 1
	fi
	if grep -q 'vt3-init: ERROR' "$CASE_DIR/$name.console"; then
		grep 'vt3-init: ERROR' "$CASE_DIR/$name.console" >&2
		return 1
	fi
}

# stop_guest NAME: power the guest off (kill its QEMU) and forget it.
stop_guest() {
	local var="GUEST_PID_${1//-/_}"
	local pid=${!var}
	agent_close "$1"
	kill "$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
	rm -f "$CASE_DIR/$1.agent.in" "$CASE_DIR/$1.agent.out"
}

# on NAME TIMEOUT CMD: run CMD in guest NAME; output goes to the case log
# (and to stdout with VERBOSE=1); returns its exit status.
on() {
	local name=$1 t=$2
	shift 2
	local out rc=0
	out=$(agent_run "$name" "$t" "$*") || rc=$?
	{
		printf '[%s]$ %s\n' "$name" "$*"
		[ -n "$out" ] && printf '%s\n' "$out"
		[ "$rc" -ne 0 ] && printf '(exit %s)\n' "$rc"
	} >>"$CASE_DIR/commands.log"
	[ "${VERBOSE:-0}" = 1 ] && printf '%s\n' "$out" >&2
	LAST_OUT=$out
	return "$rc"
}

# expect NAME TIMEOUT CMD: like `on`, but a failure fails the case.
expect() {
	if ! on "$@"; then
		fail "in $1: ${*:3} (exit $?): $(printf '%s' "$LAST_OUT" | tail -n 5)"
	fi
}

fail() {
	FAIL_REASON=$*
	return 1
}

# ------------------------------------------------------------------ cases

# Two guests on one segment: "a" behind vt3d, "b" a plain QEMU NIC.
#   A_IP/B_IP, A_MAC/B_MAC
A_IP=10.77.0.1 B_IP=10.77.0.2
A_MAC=52:54:00:77:00:01 B_MAC=52:54:00:77:00:02

pair_vt3_plain() {
	local a_args=$1 b_args=$2
	shift 2
	start_vt3d vt3a "unix-dgram:$CASE_DIR/vt3a.up,$CASE_DIR/b.dgram" --mac "$A_MAC" "$@" || return 1
	start_guest a vt3:vt3a "$A_IP" "$A_MAC" $a_args || return 1
	start_guest b "dgram:$CASE_DIR/vt3a.up" "$B_IP" "$B_MAC" $b_args || return 1
}

case_nic_ping() {
	pair_vt3_plain "vt3.mtu=9000" "vt3.mtu=9000" --mtu 9000 || return 1
	expect a 60 "ping -c 5 -W 5 $B_IP"
	expect b 60 "ping -c 5 -W 5 $A_IP"
	# Jumbo: a 9000-byte IP packet in one 9014-byte frame each way.
	expect a 60 "ping -c 3 -W 5 -s 8972 $B_IP"
	expect b 60 "ping -c 3 -W 5 -s 8972 $A_IP"
}

case_nic_tcp() {
	pair_vt3_plain "" "" || return 1
	local sum_a sum_b t0 secs
	expect a 60 "dd if=/dev/urandom of=/tmp/blob bs=1M count=32 2>/dev/null && md5sum /tmp/blob"
	sum_a=${LAST_OUT%% *}
	expect b 10 "nc -l -p 5001 > /tmp/blob 2>/tmp/nc.err & echo \$! > /tmp/nc.pid"
	sleep 1
	t0=$SECONDS
	expect a 600 "nc -N $B_IP 5001 < /tmp/blob"
	secs=$((SECONDS - t0))
	expect b 60 "while kill -0 \$(cat /tmp/nc.pid) 2>/dev/null; do sleep 0.2; done; md5sum /tmp/blob"
	sum_b=${LAST_OUT%% *}
	[ "$sum_a" = "$sum_b" ] || fail "checksums differ: sent $sum_a, received $sum_b"
	RESULT="32 MiB in ${secs}s"
}

case_siw_over_vt3() {
	pair_vt3_plain "vt3.siw=1" "vt3.siw=1" || return 1
	expect a 30 "ibv_devices | grep -w siw0"
	expect b 30 "rping -s -a $B_IP -C 10 -v > /tmp/rping.srv 2>&1 &"
	sleep 2
	expect a 180 "rping -c -a $B_IP -C 10 -v"
	[ "$(grep -c 'ping data' <<<"$LAST_OUT")" -eq 10 ] ||
		fail "rping client saw $(grep -c 'ping data' <<<"$LAST_OUT") of 10 pings"
	expect b 30 "ib_write_bw -d siw0 -R -s 65536 -n 200 > /tmp/bw.srv 2>&1 &"
	sleep 2
	expect a 300 "ib_write_bw -d siw0 -R -s 65536 -n 200 $B_IP"
	grep -Eq '^ *65536 +200 ' <<<"$LAST_OUT" ||
		fail "ib_write_bw printed no result line"
	RESULT="ib_write_bw 64KiB: $(printf '%s\n' "$LAST_OUT" | awk '$1 == 65536 {print $4 " MB/s"}')"
}

case_vt3_restart() {
	pair_vt3_plain "" "" || return 1
	local pid
	pid=$(vt3d_pid vt3a)
	expect a 60 "ping -c 3 -W 5 $B_IP"
	stop_guest a
	start_guest a vt3:vt3a "$A_IP" "$A_MAC" || return 1
	kill -0 "$pid" 2>/dev/null || fail "vt3d exited with its frontend"
	expect a 60 "ping -c 3 -W 5 $B_IP"
	grep -q 'session 2: frontend connected' "$CASE_DIR/vt3a.vt3d.log" ||
		fail "vt3d log shows no second session"
}

# Where the overlay puts our modules in the guest.
KMOD='/lib/modules/$(uname -r)/extra'

# One vt3 guest with vt3.ko loaded, for the RNIC control-plane cases.
single_vt3() {
	start_vt3d vt3a "unix-dgram:$CASE_DIR/vt3a.up,$CASE_DIR/b.dgram" --mac "$A_MAC" || return 1
	start_guest a vt3:vt3a "$A_IP" "$A_MAC" vt3.driver=1 || return 1
	expect a 30 "for i in \$(seq 50); do [ -e /sys/class/infiniband/vt3_0 ] && exit 0; sleep 0.2; done; dmesg | tail -20; exit 1"
}

# rnic_count NAME KIND: a resource count from vt3d (pd, mr, cq, qp).
rnic_count() {
	vt3d_ctl "$1" stats | awk -v k="rnic.$2" '$1 == k { print $2 }'
}

case_devinfo() {
	single_vt3 || return 1
	expect a 30 "ibv_devices"
	grep -qw vt3_0 <<<"$LAST_OUT" || fail "ibv_devices does not list vt3_0"
	expect a 30 "ibv_devinfo -v -d vt3_0"
	local info=$LAST_OUT want
	for want in "transport:[[:space:]]*iWARP" "state:[[:space:]]*PORT_ACTIVE" "max_qp:[[:space:]]*1024" \
		"max_qp_wr:[[:space:]]*4095" "max_sge:[[:space:]]*4" "max_cq:[[:space:]]*2048" \
		"max_cqe:[[:space:]]*65535" "max_mr:[[:space:]]*16384" "max_pd:[[:space:]]*1024" \
		"max_qp_rd_atom:[[:space:]]*8" "max_qp_init_rd_atom:[[:space:]]*8" "vendor_id:[[:space:]]*0x1425"; do
		grep -Eq "$want" <<<"$info" || fail "ibv_devinfo -v lacks '$want'"
	done
	expect a 30 "rdma link show"
	grep -q 'vt3_0/1 state ACTIVE' <<<"$LAST_OUT" || fail "rdma link: vt3_0 not ACTIVE"
}

case_resources() {
	single_vt3 || return 1
	local t0=$SECONDS
	expect a 1500 "vt3-resources -d vt3_0 -n 10000"
	RESULT="10000 iterations in $((SECONDS - t0))s"
	local kind n
	for kind in pd mr cq qp; do
		n=$(rnic_count vt3a "$kind")
		[ "$n" = 0 ] || fail "vt3d still holds $n ${kind}(s) after vt3-resources"
	done
}

# vt3.ko on a NIC without vt3d behind it: the probe times out quietly.
case_driver_probe() {
	single_vt3 || return 1
	start_guest b "dgram:$CASE_DIR/vt3a.up" "$B_IP" "$B_MAC" || return 1
	expect b 60 "insmod $KMOD/vt3.ko && ! ls /sys/class/infiniband/ 2>/dev/null | grep -q vt3"
	expect b 30 "rmmod vt3 && ! dmesg | grep -i 'vt3.*\(error\|fail\)'"
	expect a 30 "rdma link show vt3_0/1 | grep -q 'state ACTIVE.*netdev eth0'"
	expect a 30 "grep -q RNIC /sys/class/infiniband/vt3_0/node_type && rdma dev show vt3_0 | grep -q 'node_type rnic'"
	expect a 30 "ip link set eth0 down && sleep 1 && grep -q DOWN /sys/class/infiniband/vt3_0/ports/1/state"
	expect a 30 "ip link set eth0 up && sleep 2 && grep -q ACTIVE /sys/class/infiniband/vt3_0/ports/1/state"
	# A wildcard listen reaches every iWARP device: vt3 must not break siw's.
	expect a 30 "rdma link add siw0 type siw netdev eth0 && { timeout 3 rping -s -a 0.0.0.0 -v; rc=\$?; rdma link del siw0; [ \$rc = 124 ] || [ \$rc = 143 ]; }"
}

# The verbs through raw uverbs (no provider) and from a kernel module.
case_verbs() {
	single_vt3 || return 1
	expect a 60 "vt3-uverbs check"
	expect a 60 "insmod $KMOD/vt3_ktest.ko && rmmod vt3_ktest && dmesg | grep vt3_ktest: | grep -q 'vt3_0: [0-9]* passed, 0 failed'"
	expect_no_rnic_objects vt3a "after the checks"
}

# A vt3 guest (a) and a siw guest (b) on one segment.
pair_vt3_siw() {
	pair_vt3_plain "vt3.driver=1" "vt3.siw=1" || return 1
	wait_vt3_device a
}

wait_vt3_device() {
	expect "$1" 30 "for i in \$(seq 50); do [ -e /sys/class/infiniband/vt3_0 ] && exit 0; sleep 0.2; done; dmesg | tail -20; exit 1"
}

# rping_between SERVER CLIENT COUNT: rping -V with data verification.
rping_between() {
	local server=$1 client=$2 count=$3 server_ip
	[ "$server" = a ] && server_ip=$A_IP || server_ip=$B_IP
	expect "$server" 10 "timeout 900 rping -s -a $server_ip -C $count -V > /tmp/rping.srv 2>&1 & echo \$! > /tmp/rping.pid"
	sleep 2
	local t0=$SECONDS
	expect "$client" 900 "rping -c -a $server_ip -C $count -V"
	expect "$server" 30 "for i in \$(seq 50); do kill -0 \$(cat /tmp/rping.pid) 2>/dev/null || exit 0; sleep 0.2; done; cat /tmp/rping.srv; exit 1"
	RESULT="$count verified pings in $((SECONDS - t0))s"
}

case_rping_vt3_vt3() {
	pair_vt3_vt3 || return 1
	rping_between b a 1000
}

case_rping_vt3_siw() {
	pair_vt3_siw || return 1
	rping_between b a 100
}

case_rping_siw_vt3() {
	pair_vt3_siw || return 1
	rping_between a b 100
}

# expect_no_rnic_objects VT3D WHEN: vt3d holds no PD, MR, CQ or QP.
expect_no_rnic_objects() {
	local kind n
	for kind in pd mr cq qp; do
		n=$(rnic_count "$1" "$kind")
		[ "$n" = 0 ] || fail "vt3d still holds $n ${kind}(s) $2"
	done
}

case_rdma_res() {
	single_vt3 || return 1
	expect a 20 "vt3-uverbs hold > /tmp/hold.log 2>&1 & echo \$! > /tmp/hold.pid; sleep 3; grep -q holding /tmp/hold.log"
	local kind
	for kind in pd mr cq qp; do
		expect a 20 "rdma res show $kind | grep -q vt3_0"
		[ "$(rnic_count vt3a "$kind")" -gt 0 ] || fail "vt3d holds no $kind while vt3-uverbs does"
	done
	expect a 20 "kill \$(cat /tmp/hold.pid); sleep 1; ! rdma res show qp | grep -q vt3_0"
	expect_no_rnic_objects vt3a "after the holder exited"
}

case_driver_unload() {
	single_vt3 || return 1
	expect a 20 "vt3-uverbs hold > /tmp/hold.log 2>&1 & echo \$! > /tmp/hold.pid; sleep 3; grep -q holding /tmp/hold.log"
	expect a 60 "rmmod vt3 && ! ls /sys/class/infiniband/vt3_0 2>/dev/null"
	expect_no_rnic_objects vt3a "after rmmod"
	expect a 30 "kill \$(cat /tmp/hold.pid) && sleep 1 && ! kill -0 \$(cat /tmp/hold.pid) 2>/dev/null"
	expect a 60 "insmod $KMOD/vt3.ko && ls /sys/class/infiniband/vt3_0"
	expect a 30 "! rdma link add vt3x type vt3 netdev eth0 2>&1"
	expect a 30 "rdma link del vt3_0 && ! ls /sys/class/infiniband/vt3_0 2>/dev/null"
	expect a 60 "rdma link add vt3x type vt3 netdev eth0 && ls /sys/class/infiniband/vt3x && vt3-uverbs check"
}

# vt3d stops answering, then goes away, under a live device.
case_vt3d_lost() {
	single_vt3 || return 1
	local pid
	pid=$(vt3d_pid vt3a)
	kill -STOP "$pid"
	on a 60 "vt3-uverbs check" || true
	expect a 60 "for i in \$(seq 40); do ls /sys/class/infiniband/ | grep -q vt3 || exit 0; sleep 1; done; exit 1"
	kill -CONT "$pid"
	expect a 60 "ip link set eth0 down && ip link set eth0 up && sleep 3 && ls /sys/class/infiniband/vt3_0"
	expect a 20 "vt3-uverbs hold > /tmp/hold.log 2>&1 & echo \$! > /tmp/hold.pid; sleep 3; grep -q holding /tmp/hold.log"
	kill "$pid"
	sleep 2
	expect a 30 "for i in \$(seq 20); do grep -q DOWN /sys/class/infiniband/vt3_0/ports/1/state && exit 0; sleep 1; done; exit 1"
	expect a 60 "rmmod vt3 && kill \$(cat /tmp/hold.pid)"
}

# Connection cases of vt3.ko (pair_vt3_vt3 among their helpers).
# shellcheck source=guest-driver/tests/cm-cases.sh
source "$ROOT/guest-driver/tests/cm-cases.sh"
# shellcheck source=tests/traffic-cases.sh
source "$ROOT/tests/traffic-cases.sh"
# shellcheck source=tests/flush-cases.sh
source "$ROOT/tests/flush-cases.sh"
# shellcheck source=tests/bench.sh
source "$ROOT/tests/bench.sh"

CASES=(nic-ping nic-tcp siw-over-vt3 vt3-restart driver-probe verbs rdma-res driver-unload vt3d-lost devinfo resources
	"${CM_CASES[@]}" rping-vt3-vt3 rping-vt3-siw rping-siw-vt3 "${TRAFFIC_CASES[@]}" "${FLUSH_CASES[@]}")
# Cases also run with QEMU 10.0 by `check` (the vhost-user paths that differ).
QEMU10_CASES=(nic-ping vt3-restart devinfo)

describe() {
	case $1 in
	nic-ping) echo "ping (and 9000-byte jumbo ping) between a vt3 guest and a plain guest" ;;
	nic-tcp) echo "32 MiB TCP transfer through vt3d, md5 compared on both ends" ;;
	siw-over-vt3) echo "siw on both guests, one behind vt3d: rping and ib_write_bw -R" ;;
	vt3-restart) echo "QEMU restarted against the same vt3d; the NIC works again" ;;
	devinfo) echo "ibv_devices/ibv_devinfo -v show vt3_0: iWARP, PORT_ACTIVE, the device limits" ;;
	resources) echo "10,000 create/destroy rounds of PD, MRs, CQs, QPs; vt3d counts back to zero" ;;
	driver-probe) echo "vt3.ko attaches to vt3d's NIC only; port follows the link; siw beside it" ;;
	verbs) echo "PD/MR/CQ/QP through raw uverbs and from a kernel module; vt3d ends with none" ;;
	rdma-res) echo "rdma res show pd|mr|cq|qp lists a live program's objects" ;;
	driver-unload) echo "rmmod vt3 with live resources, reload, rdma link del/add" ;;
	vt3d-lost) echo "vt3d stops answering (device unregistered), then exits (port DOWN, rmmod)" ;;
	rping-vt3-vt3) echo "rping -V, 1000 iterations, between two vt3 guests" ;;
	rping-vt3-siw) echo "rping -V: vt3 client, siw server" ;;
	rping-siw-vt3) echo "rping -V: siw client, vt3 server" ;;
	vt3-*) describe_cm "$1" ;;
	flush-*) describe_flush "$1" ;;
	*) describe_traffic "$1" ;;
	esac
}

# run_case NAME: runs one case in its own directory; prints PASS/FAIL.
run_case() {
	local name=$1 start rc=0
	CASE_DIR=$RUN_DIR/$name
	mkdir -p "$CASE_DIR"
	FAIL_REASON= RESULT=
	start=$(date +%s)
	# A subshell would lose the pids; run in this shell, errors as statuses.
	set +e
	"case_${name//-/_}"
	rc=$?
	set -e
	[ -n "$FAIL_REASON" ] && rc=1
	kill_tracked
	close_agents
	if grep -qsE 'WARNING:|BUG:|Oops|Call Trace' "$CASE_DIR"/*.console; then
		FAIL_REASON="kernel warning in a guest: $(grep -hE 'WARNING:|BUG:|Oops' "$CASE_DIR"/*.console | head -1)"
		rc=1
	fi
	local took=$(($(date +%s) - start))
	if [ "$rc" -eq 0 ]; then
		printf 'PASS %-18s %4ss  %s\n' "$name" "$took" "$RESULT"
		return 0
	fi
	printf 'FAIL %-18s %4ss  %s\n' "$name" "$took" "${FAIL_REASON:-setup failed}"
	printf '     logs: %s\n' "$CASE_DIR"
	return 1
}

cmd_test() {
	local selected=("$@") name passed=0 failed=0
	[ ${#selected[@]} -gt 0 ] || selected=("${CASES[@]}")
	for name in "${selected[@]}"; do
		[[ " ${CASES[*]} " == *" $name "* ]] || die "unknown case '$name' (see ./run-vm.sh list)"
	done
	prepare
	for name in "${selected[@]}"; do
		if run_case "$name"; then
			passed=$((passed + 1))
		else
			failed=$((failed + 1))
		fi
	done
	if [ "$failed" -eq 0 ] && [ "$KEEP" -eq 0 ]; then
		rm -rf "$RUN_DIR"
	else
		log "run dir kept: $RUN_DIR"
	fi
	echo "$passed passed, $failed failed"
	[ "$failed" -eq 0 ]
}

# check: the whole suite, as CI runs it, with one closing count.
cmd_check() {
	local log passed=0 failed=0 p f qemu10 start=$SECONDS
	log=$(mktemp)
	log "== cargo test --workspace"
	set +e
	(cd "$ROOT" && cargo test --workspace 2>&1) | tee "$log" | grep -E '^(test result|error|failures:|---- )' >&2
	set -e
	p=$(awk '/^test result:/ { s += $4 } END { print s + 0 }' "$log")
	f=$(awk '/^test result:/ { s += $6 } END { print s + 0 }' "$log")
	grep -q '^error' "$log" && f=$((f + 1))
	passed=$((passed + p)) failed=$((failed + f))
	log "cargo: $p passed, $f failed"
	log "== full system, $(${QEMU:-qemu-system-x86_64} --version 2>/dev/null | head -1 || echo 'system QEMU')"
	"$ROOT/run-vm.sh" ${QEMU:+--qemu "$QEMU"} test | tee "$log"
	count_line "$log"
	log "== full system, QEMU 10.0 (bookworm-backports)"
	qemu10=$("$ROOT/tools/fetch-qemu10.sh") || die "could not fetch QEMU 10.0"
	"$ROOT/run-vm.sh" --qemu "$qemu10" test "${QEMU10_CASES[@]}" | tee "$log"
	count_line "$log"
	rm -f "$log"
	log "check took $((SECONDS - start)) s"
	echo "$passed passed, $failed failed"
	[ "$failed" -eq 0 ]
}

# Adds a run's closing "N passed, N failed" to the totals (a run that
# printed none counts as one failure).
count_line() {
	local line
	line=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$1" | tail -n 1)
	if [ -z "$line" ]; then
		failed=$((failed + 1))
		return
	fi
	set -- $line
	passed=$((passed + $1)) failed=$((failed + $3))
}

cmd_list() {
	local name
	for name in "${CASES[@]}"; do
		printf '%-18s %s\n' "$name" "$(describe "$name")"
	done
}

cmd_demo() {
	prepare
	CASE_DIR=$RUN_DIR/demo
	mkdir -p "$CASE_DIR"
	log "== vt3 demo: guests a ($A_IP) and b ($B_IP), each with a vt3 RNIC behind its own vt3d =="
	pair_vt3_vt3 || die "demo setup failed; logs in $CASE_DIR"
	VERBOSE=1
	log "-- b: ibv_devinfo"
	on b 30 "ibv_devinfo -d vt3_0 | head -n 12" || true
	log "-- rping -V, 10 verified pings, b → a"
	on a 10 "timeout 120 rping -s -a $A_IP -C 10 -V > /tmp/rping.srv 2>&1 &"
	wait_rdma_listen a || true
	on b 120 "rping -c -a $A_IP -C 10 -V -v | tail -n 3" || true
	local tool
	for tool in ib_write_bw ib_read_bw ib_send_lat; do
		log "-- $tool -R, b → a"
		PERF_RESULTS=()
		if [[ $tool == *_lat ]]; then
			perftest_run a b "$tool" 64 200 || log "$tool failed: $FAIL_REASON"
		else
			perftest_run a b "$tool" 65536 100 || log "$tool failed: $FAIL_REASON"
		fi
		[ ${#PERF_RESULTS[@]} -gt 0 ] && log "   ${PERF_RESULTS[*]} $([[ $tool == *_lat ]] && echo µs || echo MB/s)"
	done
	log "-- vt3d ctl stats (a's vt3d, the iWARP counters)"
	vt3d_ctl vt3a stats | grep '^iwarp\.' >&2 || true
	demo_events
	kill_tracked
	log "demo done; logs in $CASE_DIR"
}

# The close and fatal event part of the demo (DESIGN.md §5).
demo_events() {
	log "-- close and fatal events (docs/events.md): vt3-flushtest client in b, server in a"
	flush_server || { log "flushtest server did not start"; return 0; }
	log "   a normal close: b disconnects with work outstanding; vt3.ko posts LLP_CLOSE_COMPLETE"
	log "   and libvt3 flushes every receive when b reaps it"
	on b 120 "vt3-flushtest client --server $A_IP --port $FLUSH_PORT --scenario local-close --style events --timeout 60 -v" || true
	log "   a fatal error: \`vt3d ctl fault rst\` on a's end of the connection; b gets QP_FATAL"
	log "   and all its work back, flushed"
	flush_injected rst events 60 QP_FATAL vt3d_ctl vt3a fault rst --qp "{PEER}" || log "   failed: $FAIL_REASON"
	FAIL_REASON=
}

cmd_shell() {
	prepare
	CASE_DIR=$RUN_DIR/shell
	mkdir -p "$CASE_DIR"
	start_vt3d vt3a "unix-dgram:$CASE_DIR/vt3a.up,$CASE_DIR/peer.dgram" --mac "$A_MAC"
	log "interactive guest (vt3 NIC, $A_IP); quit with Ctrl-A X"
	local intx=
	qemu_needs_intx && intx=,vectors=0
	timeout "$QEMU_TIMEOUT" "$QEMU" -accel "$ACCEL" -M q35 -smp 1 -m "$GUEST_MEM" -nographic \
		-no-reboot -kernel "$IMAGES/vmlinuz" -initrd "$INITRD" \
		-append "console=ttyS0 panic=-1 vt3.name=shell vt3.ip=$A_IP/24 vt3.shell=1" \
		-object "memory-backend-memfd,id=mem,size=$GUEST_MEM,share=on" -numa node,memdev=mem \
		-chardev "socket,id=vhost,path=$CASE_DIR/vt3a.vhost" -netdev vhost-user,id=n0,chardev=vhost \
		-device "virtio-net-pci,netdev=n0,mac=$A_MAC,romfile=$intx"
}

main() {
	while [ $# -gt 0 ]; do
		case $1 in
		--qemu)
			QEMU=${2:?--qemu needs a path}
			shift 2
			;;
		--keep)
			KEEP=1
			shift
			;;
		-h | --help)
			sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'
			return 0
			;;
		*) break ;;
		esac
	done
	local cmd=${1:-demo}
	[ $# -gt 0 ] && shift
	case $cmd in
	demo) cmd_demo ;;
	test) cmd_test "$@" ;;
	list) cmd_list ;;
	check) cmd_check ;;
	bench) cmd_bench ;;
	shell) cmd_shell ;;
	*) die "unknown command '$cmd' (demo, test, list, check, bench, shell)" ;;
	esac
}

main "$@"
