#!/usr/bin/env bash
# Smoke test of the guest images: boots two guests under QEMU (TCG) joined by
# a unix-datagram "wire" (no vt3d involved) and checks, through the agent,
# ping, siw (ibv_devices, rping, ib_write_bw -R), a TCP transfer with nc -N,
# and that a key given as QEMU's firmware configuration file opt/vt3/key (as
# the lab gives vt3.ko its key) is in /sys/firmware/qemu_fw_cfg.
#
# Usage: images/selftest.sh [--images DIR]   (default $VT3_CACHE/images)
# Env:   QEMU (default qemu-system-x86_64), VT3_ACCEL (default tcg),
#        VERBOSE=1 (show the output of passing checks too)
# shellcheck source-path=SCRIPTDIR
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=../tools/cache-dir.sh
source "$REPO/tools/cache-dir.sh"
IMG=$VT3_CACHE/images
QEMU=${QEMU:-qemu-system-x86_64}
ACCEL=${VT3_ACCEL:-tcg}
BOOT_TIMEOUT=120
VERBOSE=${VERBOSE:-}
[[ ${1:-} != --images ]] || IMG=$2

command -v "$QEMU" >/dev/null || { echo "selftest: no $QEMU (apt-get install qemu-system-x86)" >&2; exit 1; }
[[ -f $IMG/vmlinux && -f $IMG/initramfs.cpio.gz ]] || { echo "selftest: no images in $IMG (run images/build.sh)" >&2; exit 1; }

# shellcheck source=agent-host.sh
. "$REPO/images/agent-host.sh"

WORK=$(mktemp -d /tmp/vt3-selftest.XXXXXX)
declare -A QEMU_PID=()
PASSED=0 FAILED=0

cleanup() {
	local n
	for n in "${!QEMU_PID[@]}"; do kill "${QEMU_PID[$n]}" 2>/dev/null || true; done
	wait 2>/dev/null || true
	if ((FAILED)); then echo "selftest: logs kept in $WORK" >&2; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

# start_guest NAME IP MAC PEER: QEMU in the background; console in WORK/NAME.console;
# WORK/NAME.key (16 random bytes) as the firmware configuration file opt/vt3/key.
start_guest() {
	local name=$1 ip=$2 mac=$3 peer=$4
	agent_mkfifo "$name" "$WORK"
	(umask 077 && head -c 16 /dev/urandom >"$WORK/$name.key")
	timeout 600 "$QEMU" -accel "$ACCEL" -m 512M -smp 1 -nographic -no-reboot \
		-kernel "$IMG/vmlinux" -initrd "$IMG/initramfs.cpio.gz" \
		-append "console=ttyS0 panic=-1 vt3.name=$name vt3.ip=$ip/24 vt3.siw=1" \
		-serial "file:$WORK/$name.console" \
		-chardev "pipe,id=ag,path=$WORK/$name.agent" -serial chardev:ag \
		-netdev "dgram,id=n0,local.type=unix,local.path=$WORK/$name.sock,remote.type=unix,remote.path=$WORK/$peer.sock" \
		-device "virtio-net-pci,netdev=n0,mac=$mac,romfile=" \
		-fw_cfg "name=opt/vt3/key,file=$WORK/$name.key" \
		-display none -monitor none >"$WORK/$name.qemu.log" 2>&1 &
	QEMU_PID[$name]=$!
	agent_open "$name" "$WORK"
}

indent() { sed 's/^/     | /'; }

# check DESCRIPTION NAME TIMEOUT COMMAND [GREP-PATTERN]: run, want rc 0 (and the pattern).
check() {
	local what=$1 name=$2 t=$3 cmd=$4 pat=${5:-} out rc=0
	out=$(agent_run "$name" "$t" "$cmd" 2>&1) || rc=$?
	if ((rc == 0)) && { [[ -z $pat ]] || grep -qE -- "$pat" <<<"$out"; }; then
		echo "ok   $what"
		[[ -z $VERBOSE ]] || indent <<<"$out"
		PASSED=$((PASSED + 1))
	else
		echo "FAIL $what (rc $rc)"
		indent <<<"$out" | tail -n 20
		FAILED=$((FAILED + 1))
	fi
}

# check_rc DESCRIPTION NAME TIMEOUT COMMAND RC: run, want exit status RC.
check_rc() {
	local what=$1 name=$2 t=$3 cmd=$4 want=$5 rc=0
	agent_run "$name" "$t" "$cmd" >/dev/null 2>&1 || rc=$?
	if ((rc == want)); then
		echo "ok   $what"
		PASSED=$((PASSED + 1))
	else
		echo "FAIL $what (rc $rc, want $want)"
		FAILED=$((FAILED + 1))
	fi
}

t0=$EPOCHSECONDS
start_guest a 10.0.0.1 52:54:00:00:00:01 b
start_guest b 10.0.0.2 52:54:00:00:00:02 a
for n in a b; do
	if ! agent_wait_ready "$n" "$BOOT_TIMEOUT"; then
		echo "FAIL boot $n"
		tail -n 20 "$WORK/$n.console"
		FAILED=$((FAILED + 1))
		echo "$PASSED passed, $FAILED failed"
		exit 1
	fi
done
echo "both guests ready after $((EPOCHSECONDS - t0))s"
grep -h 'vt3-init: ERROR' "$WORK"/*.console && FAILED=$((FAILED + 1))

check "ping a -> b" a 30 'ping -c 3 10.0.0.2' ' 0% packet loss'
# init loaded qemu_fw_cfg; the guest sees its own key, byte for byte.
key_a=$(od -An -v -tx1 "$WORK/a.key" | tr -d ' \n')
check "fw_cfg: a has its key in /sys/firmware/qemu_fw_cfg" a 10 \
	"od -An -v -tx1 /sys/firmware/qemu_fw_cfg/by_name/opt/vt3/key/raw | tr -d ' \\n'; echo" "^${key_a}\$"
check "ibv_devices lists siw0" a 10 'ibv_devices' 'siw0'
check "rdma link shows siw0 on eth0" b 10 'rdma link' 'siw0/1 state ACTIVE .*netdev eth0'

# rping: server in the background on b, then the client on a.
agent_run b 5 'timeout 90 rping -s -a 10.0.0.2 -C 10 -v >/tmp/rping-s.log 2>&1 &' >/dev/null
check "rping -c a -> b (10 iterations)" a 90 'sleep 2; timeout 60 rping -c -a 10.0.0.2 -C 10 -v' 'ping data: rdma-ping-9'
check "rping -s on b finished" b 30 'sleep 1; cat /tmp/rping-s.log; ! pidof rping' 'server DISCONNECT'

# perftest over siw: RDMA WRITE bandwidth through rdma_cm.
agent_run b 5 'timeout 120 ib_write_bw -R -F -n 200 -s 65536 >/tmp/bw-s.log 2>&1 &' >/dev/null
check "ib_write_bw -R a -> b" a 120 'sleep 3; timeout 100 ib_write_bw -R -F -n 200 -s 65536 10.0.0.2' '^ *65536 +200 '

# TCP: 1 MB through nc -N (closes after EOF), checked by md5.
agent_run b 5 'timeout 120 nc -l -p 5000 >/tmp/recv &' >/dev/null
agent_run a 10 'head -c 1000000 /dev/urandom >/tmp/send; md5sum </tmp/send >/tmp/send.md5' >/dev/null
check "nc -N a -> b (1 MB)" a 100 'sleep 1; timeout 90 nc -N 10.0.0.2 5000 </tmp/send && cat /tmp/send.md5'
sum_a=$(agent_run a 5 'cat /tmp/send.md5')
check "nc: b received the same bytes" b 30 'sleep 1; ! pidof nc && md5sum </tmp/recv' "^${sum_a%% *}"

# The agent itself: exit status, guest-side timeout, host-side timeout.
check_rc "agent: exit status passes through" a 10 'exit 7' 7
check_rc "agent: guest-side timeout gives 143" a 2 'sleep 10' 143
# sh ignores timeout's SIGTERM here, so only the host-side deadline can end it.
AGENT_MARGIN=2 check_rc "agent: host-side timeout gives $AGENT_RC_HOST_TIMEOUT" a 1 'trap "" TERM; sleep 8' "$AGENT_RC_HOST_TIMEOUT"
check "agent: next command after a host-side timeout" a 30 'echo still-here' '^still-here$'
echo "$PASSED passed, $FAILED failed"
((FAILED == 0))
