# SPDX-License-Identifier: GPL-2.0
# Full-system cases for vt3.ko's connections, for run-vm.sh: it sources
# this file (after its helpers: start_vt3d, start_guest, stop_guest, on,
# expect, fail, single_vt3, expect_no_rnic_objects, vt3d_pid, A_IP/B_IP,
# A_MAC/B_MAC, KMOD) and appends CM_CASES to CASES. vt3-kcm needs
# tests/vt3_kcm.ko in the guest image beside vt3_ktest.ko; vt3-rping and
# the cases after it need libvt3's data path.

# shellcheck disable=SC2034 # run-vm.sh adds them to CASES
CM_CASES=(vt3-listen vt3-kcm vt3-rping vt3-disconnect vt3-abort vt3-timeout vt3-lost-conn vt3-rmmod-conn)

describe_cm() {
	case $1 in
	vt3-listen) echo "rdma listens on ports guest TCP holds, wildcard (with siw) and IPv6 listens" ;;
	vt3-kcm) echo "two vt3 guests: kernel rdma_cm client/server (reject, connect, 10 SENDs, disconnect)" ;;
	vt3-rping) echo "two vt3 guests: rping -C 10, both sides exit, vt3d ends with no objects" ;;
	vt3-disconnect) echo "rdma_disconnect after the peer's close succeeds (ib_send_bw -R, 3 rounds)" ;;
	vt3-abort) echo "rping client killed: RST, the server gets CLOSE and exits" ;;
	vt3-timeout) echo "the client's vt3d killed: the server's TCP times out, CLOSE, exit" ;;
	vt3-lost-conn) echo "vt3d stops answering under a connection and a listener; re-probe" ;;
	vt3-rmmod-conn) echo "rmmod vt3 under a live connection, on either side" ;;
	esac
}

# The pid of vt3d itself: vt3d_pid names the timeout(1) wrapping it, which
# SIGSTOP would stop instead.
vt3d_main_pid() {
	local pid
	pid=$(vt3d_pid "$1")
	pgrep -P "$pid" -x vt3d || echo "$pid"
}

# Two vt3 guests, each behind its own vt3d, the two vt3d wired together.
pair_vt3_vt3() {
	start_vt3d vt3a "unix-dgram:$CASE_DIR/vt3a.up,$CASE_DIR/vt3b.up" --mac "$A_MAC" || return 1
	start_vt3d vt3b "unix-dgram:$CASE_DIR/vt3b.up,$CASE_DIR/vt3a.up" --mac "$B_MAC" || return 1
	start_guest a vt3:vt3a "$A_IP" "$A_MAC" vt3.driver=1 || return 1
	start_guest b vt3:vt3b "$B_IP" "$B_MAC" vt3.driver=1 || return 1
	local g
	for g in a b; do
		expect $g 30 "for i in \$(seq 50); do [ -e /sys/class/infiniband/vt3_0 ] && exit 0; sleep 0.2; done; dmesg | tail -20; exit 1"
		expect $g 10 "mount -t debugfs none /sys/kernel/debug && echo 'module vt3 +p' > /sys/kernel/debug/dynamic_debug/control"
	done
	expect a 60 "ping -c 2 -W 5 $B_IP"
}

case_vt3_kcm() {
	pair_vt3_vt3 || return 1
	expect a 30 "insmod $KMOD/vt3_kcm.ko server=1"
	on b 600 "insmod $KMOD/vt3_kcm.ko addr=$A_IP; dmesg | grep vt3_kcm" || true
	printf '%s\n' "$LAST_OUT" | grep -q 'vt3_kcm: client: [0-9]* passed, 0 failed' ||
		fail "client: $(printf '%s\n' "$LAST_OUT" | grep -E 'FAIL|passed' | head -5)"
	on a 60 "for i in \$(seq 30); do dmesg | grep -q 'vt3_kcm: server: ' && break; sleep 1; done; dmesg | grep vt3_kcm" || true
	printf '%s\n' "$LAST_OUT" | grep -q 'vt3_kcm: server: [0-9]* passed, 0 failed' ||
		fail "server: $(printf '%s\n' "$LAST_OUT" | grep -E 'FAIL|passed' | head -5)"
	expect b 60 "rmmod vt3_kcm"
	expect a 60 "rmmod vt3_kcm"
	on a 10 "dmesg | grep -i vt3" || true
	on b 10 "dmesg | grep -i vt3" || true
	expect_no_rnic_objects vt3a "after the kernel test"
	expect_no_rnic_objects vt3b "after the kernel test"
}

case_vt3_rping() {
	pair_vt3_vt3 || return 1
	expect a 30 "rping -s -a $A_IP -v > /tmp/rping.srv 2>&1 & echo \$! > /tmp/rping.pid"
	sleep 2
	on b 300 "rping -c -a $A_IP -C 10 -v" || fail "rping client: $(printf '%s\n' "$LAST_OUT" | tail -3)"
	[ "$(printf '%s\n' "$LAST_OUT" | grep -c 'ping data')" -eq 10 ] ||
		fail "rping client saw $(printf '%s\n' "$LAST_OUT" | grep -c 'ping data') of 10 pings"
	expect a 30 "for i in \$(seq 20); do kill -0 \$(cat /tmp/rping.pid) 2>/dev/null || exit 0; sleep 1; done; cat /tmp/rping.srv; exit 1"
	on a 10 "cat /tmp/rping.srv; dmesg | grep -i vt3" || true
	on b 10 "dmesg | grep -i vt3" || true
	expect_no_rnic_objects vt3a "after rping"
	expect_no_rnic_objects vt3b "after rping"
}

# librdmacm's rdma_disconnect() moves the QP to SQD first: after the
# peer's close completed (CLOSE delivered, QP in ERR) that must still
# succeed, or perftest says "Failed to disconnect RDMA CM connection.".
case_vt3_disconnect() {
	pair_vt3_vt3 || return 1
	local round out
	for round in 1 2 3; do
		expect a 10 "timeout 120 ib_send_bw -R -F -s 64 -n 50 > /tmp/pt.srv 2>&1 & echo \$! > /tmp/pt.pid" || return 1
		expect a 60 "for i in \$(seq 250); do rdma res show cm_id | grep -q LISTEN && exit 0; sleep 0.2; done; exit 1" || return 1
		expect b 120 "timeout 110 ib_send_bw -R -F -s 64 -n 50 $A_IP > /tmp/pt.cli 2>&1; rc=\$?; cat /tmp/pt.cli; exit \$rc" || return 1
		out=$LAST_OUT
		expect a 30 "for i in \$(seq 100); do kill -0 \$(cat /tmp/pt.pid) 2>/dev/null || break; sleep 0.2; done; cat /tmp/pt.srv" || return 1
		out+=$LAST_OUT
		if grep -qi 'fail' <<<"$out"; then
			fail "round $round: $(grep -i 'fail' <<<"$out" | head -2)"
			return 1
		fi
	done
	on a 10 "dmesg | grep -i vt3 | tail -12" || true
	expect_no_rnic_objects vt3a "after the runs"
	expect_no_rnic_objects vt3b "after the runs"
}

# A long rping from b to a; then $1 happens to b.
rping_then() {
	pair_vt3_vt3 || return 1
	expect a 30 "rping -s -a $A_IP > /tmp/rping.srv 2>&1 & echo \$! > /tmp/rping.pid"
	sleep 2
	expect b 30 "rping -c -a $A_IP -C 100000 > /tmp/rping.cli 2>&1 & echo \$! > /tmp/rping.pid"
	sleep 8
	expect a 10 "kill -0 \$(cat /tmp/rping.pid)"
	expect b 10 "kill -0 \$(cat /tmp/rping.pid)"
}

# The client dies: its QP is destroyed with the connection up (RST).
case_vt3_abort() {
	rping_then || return 1
	expect b 30 "kill -9 \$(cat /tmp/rping.pid); sleep 1; ! kill -0 \$(cat /tmp/rping.pid) 2>/dev/null"
	expect a 60 "for i in \$(seq 40); do kill -0 \$(cat /tmp/rping.pid) 2>/dev/null || exit 0; sleep 1; done; cat /tmp/rping.srv; exit 1"
	on a 10 "cat /tmp/rping.srv | tail -5; dmesg | grep -i vt3" || true
	on b 10 "dmesg | grep -i vt3" || true
	expect_no_rnic_objects vt3a "after the abort"
	expect_no_rnic_objects vt3b "after the abort"
}

# a's vt3d stops answering under a live connection and a listener.
case_vt3_lost_conn() {
	rping_then || return 1
	expect a 30 "rping -s -a $A_IP -p 7999 > /tmp/rping2.srv 2>&1 & echo \$! > /tmp/rping2.pid"
	local pid
	pid=$(vt3d_main_pid vt3a)
	kill -STOP "$pid"
	on a 60 "vt3-uverbs check" || true
	expect a 60 "for i in \$(seq 40); do ls /sys/class/infiniband/ | grep -q vt3 || exit 0; sleep 1; done; exit 1"
	expect a 60 "for i in \$(seq 40); do kill -0 \$(cat /tmp/rping.pid) 2>/dev/null || kill -0 \$(cat /tmp/rping2.pid) 2>/dev/null || exit 0; sleep 1; done; exit 1"
	on a 10 "cat /tmp/rping.srv /tmp/rping2.srv; dmesg | grep -i vt3" || true
	kill -CONT "$pid"
	expect a 60 "ip link set eth0 down && ip link set eth0 up && sleep 3 && ls /sys/class/infiniband/vt3_0 >/dev/null"
	expect b 120 "for i in \$(seq 100); do kill -0 \$(cat /tmp/rping.pid) 2>/dev/null || exit 0; sleep 1; done; exit 1"
	on b 10 "tail -3 /tmp/rping.cli; dmesg | grep -i vt3" || true
	expect_no_rnic_objects vt3a "after the loss"
	expect_no_rnic_objects vt3b "after the loss"
}

# Listens: ports the guest's TCP holds, wildcard and IPv6 listens.
case_vt3_listen() {
	single_vt3 || return 1
	expect a 10 "mount -t debugfs none /sys/kernel/debug && echo 'module vt3 +p' > /sys/kernel/debug/dynamic_debug/control"
	expect a 10 "nc -l -p 7174 > /dev/null 2>&1 & echo \$! > /tmp/nc.pid; sleep 1"
	expect a 30 "timeout 3 rping -s -a 0.0.0.0 -v; rc=\$?; [ \$rc = 124 ] || [ \$rc = 143 ]"
	expect a 30 "timeout 3 rping -s -a $A_IP -v; rc=\$?; echo rc \$rc; [ \$rc != 124 ] && [ \$rc != 143 ] && [ \$rc != 0 ]"
	expect a 30 "timeout 3 rping -s -a :: -p 7200 -v; rc=\$?; [ \$rc = 124 ] || [ \$rc = 143 ]"
	expect a 30 "rdma link add siw0 type siw netdev eth0 && { timeout 3 rping -s -a 0.0.0.0 -p 7201 -v; rc=\$?; rdma link del siw0; [ \$rc = 124 ] || [ \$rc = 143 ]; }"
	expect a 10 "kill \$(cat /tmp/nc.pid); dmesg | grep -i 'vt3_0'"
	expect a 10 "nc -l -p 7200 > /dev/null 2>&1 & p=\$!; sleep 1; kill -0 \$p && kill \$p"
}

# rmmod under live connections: the server's side, then the client's.
case_vt3_rmmod_conn() {
	rping_then || return 1
	expect a 120 "rmmod vt3 && ! ls /sys/class/infiniband/vt3_0 2>/dev/null"
	expect a 60 "for i in \$(seq 40); do kill -0 \$(cat /tmp/rping.pid) 2>/dev/null || exit 0; sleep 1; done; exit 1"
	expect b 120 "for i in \$(seq 100); do kill -0 \$(cat /tmp/rping.pid) 2>/dev/null || exit 0; sleep 1; done; exit 1"
	on a 10 "cat /tmp/rping.srv | tail -3" || true
	on b 10 "tail -3 /tmp/rping.cli; dmesg | grep -i vt3 | tail -8" || true
	expect_no_rnic_objects vt3a "after rmmod"
	expect_no_rnic_objects vt3b "after the peer's rmmod"
	expect a 60 "insmod $KMOD/vt3.ko && ls /sys/class/infiniband/vt3_0 >/dev/null"
	expect a 30 "rping -s -a $A_IP > /tmp/rping.srv 2>&1 & echo \$! > /tmp/rping.pid"
	sleep 2
	expect b 30 "rping -c -a $A_IP -C 100000 > /tmp/rping.cli 2>&1 & echo \$! > /tmp/rping.pid"
	sleep 8
	expect b 120 "rmmod vt3 && ! ls /sys/class/infiniband/vt3_0 2>/dev/null"
	expect b 60 "for i in \$(seq 40); do kill -0 \$(cat /tmp/rping.pid) 2>/dev/null || exit 0; sleep 1; done; exit 1"
	expect a 120 "for i in \$(seq 100); do kill -0 \$(cat /tmp/rping.pid) 2>/dev/null || exit 0; sleep 1; done; exit 1"
	on a 10 "tail -3 /tmp/rping.srv; dmesg | grep -i vt3 | tail -8" || true
	expect_no_rnic_objects vt3a "after the peer's rmmod"
	expect_no_rnic_objects vt3b "after rmmod"
}

# The client's vt3d dies: no RST, a's TCP times out.
case_vt3_timeout() {
	rping_then || return 1
	kill -9 "$(vt3d_main_pid vt3b)"
	stop_guest b
	local t0=$SECONDS
	expect a 200 "for i in \$(seq 180); do kill -0 \$(cat /tmp/rping.pid) 2>/dev/null || exit 0; sleep 1; done; cat /tmp/rping.srv; exit 1"
	RESULT="server gone after $((SECONDS - t0))s"
	on a 10 "cat /tmp/rping.srv | tail -5; dmesg | grep -i vt3" || true
	expect_no_rnic_objects vt3a "after the timeout"
}
