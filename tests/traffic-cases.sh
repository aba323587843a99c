# SPDX-License-Identifier: GPL-2.0
# Full-system traffic cases for run-vm.sh (sourced after its helpers and
# guest-driver/tests/cm-cases.sh): perftest, rdma_cm examples, many
# connections. Appends TRAFFIC_CASES to CASES.

# shellcheck disable=SC2034 # run-vm.sh adds them to CASES
TRAFFIC_CASES=(perftest-vt3-vt3 perftest-vt3-siw rdma-cm-examples multi-conn)

describe_traffic() {
	case $1 in
	perftest-vt3-vt3) echo "ib_send/write/read_bw -R, 1 B to 1 MiB, both directions, two vt3 guests" ;;
	perftest-vt3-siw) echo "ib_send/write/read_bw -R, 1 B to 1 MiB, both directions, vt3 and siw" ;;
	multi-conn) echo "64 concurrent connections between two vt3 guests, each moving verified data" ;;
	rdma-cm-examples) echo "rdma_server/rdma_client both ways and ucmatose with 8 connections, two vt3 guests" ;;
	esac
}

ip_of() { [ "$1" = a ] && echo "$A_IP" || echo "$B_IP"; }

# wait_rdma_listen GUEST: until an rdma_cm id listens there (a server started
# in the background is slow to get there under TCG).
wait_rdma_listen() {
	expect "$1" 60 "for i in \$(seq 250); do rdma res show cm_id | grep -q LISTEN && exit 0; sleep 0.2; done; rdma res show cm_id; exit 1"
}

# perftest_run SERVER CLIENT TOOL SIZE ITERS: one perftest run over rdma_cm;
# appends "CLIENT→SERVER TOOL SIZE VALUE" to PERF_RESULTS (MB/s, or µs for
# the latency tools).
perftest_run() {
	local server=$1 client=$2 tool=$3 size=$4 iters=$5 ip bw
	ip=$(ip_of "$server")
	expect "$server" 10 "timeout 300 $tool -R -F -s $size -n $iters > /tmp/pt.srv 2>&1 & echo \$! > /tmp/pt.pid" || return 1
	wait_rdma_listen "$server" || return 1
	# In the background, so that a hang can be looked at while it lasts.
	expect "$client" 10 "rm -f /tmp/pt.rc; (timeout 280 $tool -R -F -s $size -n $iters $ip > /tmp/pt.cli 2>&1; echo \$? > /tmp/pt.rc) & echo \$! > /tmp/pt.cpid" || return 1
	if ! on "$client" 260 "while [ ! -e /tmp/pt.rc ]; do sleep 0.2; done; cat /tmp/pt.cli; exit \$(cat /tmp/pt.rc)"; then
		on "$client" 10 "[ ! -e /tmp/pt.rc ]" && dump_state "$tool -s $size hangs"
		on "$server" 10 "cat /tmp/pt.srv" || true
		on "$client" 10 "cat /tmp/pt.cli" || true
		fail "$tool -s $size: $client → $server failed: $(printf '%s' "$LAST_OUT" | tail -n 3)"
		return 1
	fi
	# Bandwidth tools: BW average (MB/s); latency tools: t_avg (µs).
	local column=4
	[[ $tool == *_lat ]] && column=6
	bw=$(awk -v s="$size" -v c="$column" '$1 == s && NF >= c + 1 { print $c }' <<<"$LAST_OUT" | tail -n 1)
	[ -n "$bw" ] || { fail "$tool -s $size: no result line"; return 1; }
	expect "$server" 30 "for i in \$(seq 100); do kill -0 \$(cat /tmp/pt.pid) 2>/dev/null || exit 0; sleep 0.2; done; cat /tmp/pt.srv; exit 1" || return 1
	PERF_RESULTS+=("$client→$server $tool $size $bw")
}

# The matrix; narrow it for a manual run, e.g.
#   PERF_TOOLS=ib_read_bw PERF_SIZES=1 ./run-vm.sh test perftest-vt3-siw
read -ra PERF_TOOLS <<<"${PERF_TOOLS:-ib_send_bw ib_write_bw ib_read_bw}"
read -ra PERF_SIZES <<<"${PERF_SIZES:-1 64 4096 65536 1048576}"

# Both directions: "SERVER CLIENT" pairs.
perftest_matrix() {
	local tool size iters dir
	PERF_RESULTS=()
	for dir in "b a" "a b"; do
		for tool in "${PERF_TOOLS[@]}"; do
			for size in "${PERF_SIZES[@]}"; do
				iters=200
				[ "$size" -ge 65536 ] && iters=20
				# shellcheck disable=SC2086 # dir is "SERVER CLIENT"
				perftest_run $dir "$tool" "$size" "$iters" || return 1
			done
		done
	done
	printf '%s\n' "${PERF_RESULTS[@]}" >"$CASE_DIR/perftest.txt"
	RESULT="$(grep -c . "$CASE_DIR/perftest.txt") runs; 64 KiB write a→b: $(awk '$1 == "a→b" && $2 == "ib_write_bw" && $3 == 65536 { print $4 }' "$CASE_DIR/perftest.txt") MB/s"
}

case_perftest_vt3_vt3() {
	pair_vt3_vt3 || return 1
	perftest_matrix
}

case_perftest_vt3_siw() {
	pair_vt3_siw || return 1
	perftest_matrix
}

# rdma_cm's example programs from rdma-core, between two vt3 guests.
case_rdma_cm_examples() {
	pair_vt3_vt3 || return 1
	local server client
	for server in a b; do
		[ "$server" = a ] && client=b || client=a
		expect "$server" 10 "timeout 120 rdma_server > /tmp/rs.out 2>&1 & echo \$! > /tmp/rs.pid"
		wait_rdma_listen "$server" || return 1
		expect "$client" 120 "rdma_client -s $(ip_of "$server")"
		expect "$server" 30 "for i in \$(seq 100); do kill -0 \$(cat /tmp/rs.pid) 2>/dev/null || { wait \$(cat /tmp/rs.pid) 2>/dev/null; cat /tmp/rs.out; exit 0; }; sleep 0.2; done; cat /tmp/rs.out; exit 1"
		grep -q 'rdma_server: end 0' <<<"$LAST_OUT" || { fail "rdma_server on $server: $(tail -n 2 <<<"$LAST_OUT")"; return 1; }
	done
	# ucmatose: 8 connections, 100 messages each way on each.
	expect a 10 "timeout 300 ucmatose -c 8 -C 100 > /tmp/uc.out 2>&1 & echo \$! > /tmp/uc.pid"
	wait_rdma_listen a || return 1
	expect b 300 "ucmatose -s $A_IP -c 8 -C 100"
	grep -q 'test complete' <<<"$LAST_OUT" || { fail "ucmatose client: $(tail -n 3 <<<"$LAST_OUT")"; return 1; }
	expect a 60 "for i in \$(seq 250); do kill -0 \$(cat /tmp/uc.pid) 2>/dev/null || break; sleep 0.2; done; cat /tmp/uc.out; grep -q 'return status 0' /tmp/uc.out"
	expect_no_rnic_objects vt3a "after the examples"
	expect_no_rnic_objects vt3b "after the examples"
	RESULT="rdma_server/rdma_client both ways; ucmatose 8 connections × 100 messages"
}

# 64 concurrent connections between two vt3 guests (vt3-multiconn: one
# thread per connection; SEND checked by the server, RDMA WRITE back
# checked by the client, every round).
case_multi_conn() {
	pair_vt3_vt3 || return 1
	local n=${MC_CONNS:-64} rounds=${MC_ROUNDS:-20}
	expect a 10 "timeout 600 vt3-multiconn -s -n $n -r $rounds > /tmp/mc.out 2>&1 & echo \$! > /tmp/mc.pid"
	wait_rdma_listen a || return 1
	expect b 600 "vt3-multiconn -c $A_IP -n $n -r $rounds"
	local client=$LAST_OUT
	expect a 120 "for i in \$(seq 600); do kill -0 \$(cat /tmp/mc.pid) 2>/dev/null || break; sleep 0.2; done; cat /tmp/mc.out; grep -q ' 0 failed' /tmp/mc.out"
	on a 10 "dmesg | grep -i vt3 | tail -40" || true; on b 10 "dmesg | grep -i vt3 | tail -40" || true
	expect_no_rnic_objects vt3a "after the connections"
	expect_no_rnic_objects vt3b "after the connections"
	RESULT=$(grep -o '[0-9]* connections.*' <<<"$client" | tail -n 1)
}
