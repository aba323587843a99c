# SPDX-License-Identifier: GPL-2.0
# Full-system traffic cases for run-vm.sh (sourced after its helpers and
# guest-driver/tests/cm-cases.sh): perftest, rdma_cm examples, many
# connections. Appends TRAFFIC_CASES to CASES.

# shellcheck disable=SC2034 # run-vm.sh adds them to CASES
TRAFFIC_CASES=(perftest-vt3-vt3 perftest-vt3-siw)

describe_traffic() {
	case $1 in
	perftest-vt3-vt3) echo "ib_send/write/read_bw -R, 1 B to 1 MiB, both directions, two vt3 guests" ;;
	perftest-vt3-siw) echo "ib_send/write/read_bw -R, 1 B to 1 MiB, both directions, vt3 and siw" ;;
	esac
}

ip_of() { [ "$1" = a ] && echo "$A_IP" || echo "$B_IP"; }

# wait_rdma_listen GUEST: until an rdma_cm id listens there (a server started
# in the background is slow to get there under TCG).
wait_rdma_listen() {
	expect "$1" 60 "for i in \$(seq 250); do rdma res show cm_id | grep -q LISTEN && exit 0; sleep 0.2; done; rdma res show cm_id; exit 1"
}

# perftest_run SERVER CLIENT TOOL SIZE ITERS: one perftest run over rdma_cm;
# appends "TOOL SIZE MB/s" to PERF_RESULTS.
perftest_run() {
	local server=$1 client=$2 tool=$3 size=$4 iters=$5 ip bw
	ip=$(ip_of "$server")
	expect "$server" 10 "timeout 300 $tool -R -F -s $size -n $iters > /tmp/pt.srv 2>&1 & echo \$! > /tmp/pt.pid" || return 1
	wait_rdma_listen "$server" || return 1
	if ! on "$client" 300 "timeout 280 $tool -R -F -s $size -n $iters $ip"; then
		on "$server" 10 "cat /tmp/pt.srv" || true
		fail "$tool -s $size: $client → $server failed: $(printf '%s' "$LAST_OUT" | tail -n 3)"
		return 1
	fi
	bw=$(awk -v s="$size" '$1 == s && NF >= 5 { print $4 }' <<<"$LAST_OUT" | tail -n 1)
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
