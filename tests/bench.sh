# SPDX-License-Identifier: GPL-2.0
# `./run-vm.sh bench`: perftest between two vt3 guests and, as the anchor,
# between two siw guests in the same QEMU setup (each guest behind its own
# vt3d, so siw's frames take the same NIC path that vt3's offload skips).
# Sourced by run-vm.sh after tests/traffic-cases.sh (perftest_run).
# A benchmark, not a test: it prints a table and writes CSV and a PNG.

BENCH_BW_TOOLS=(ib_write_bw ib_send_bw ib_read_bw)
BENCH_LAT_TOOLS=(ib_write_lat ib_send_lat ib_read_lat)
read -ra BENCH_SIZES <<<"${BENCH_SIZES:-2 64 1024 4096 16384 65536 262144 1048576}"

# Two guests, each behind its own vt3d, with RDMA_ARGS on their kernel
# command line (vt3.driver=1 for vt3, vt3.siw=1 for siw).
pair_behind_vt3d() {
	local args=$1
	start_vt3d vt3a "unix-dgram:$CASE_DIR/vt3a.up,$CASE_DIR/vt3b.up" --mac "$A_MAC" || return 1
	start_vt3d vt3b "unix-dgram:$CASE_DIR/vt3b.up,$CASE_DIR/vt3a.up" --mac "$B_MAC" || return 1
	start_guest a vt3:vt3a "$A_IP" "$A_MAC" "$args" || return 1
	start_guest b vt3:vt3b "$B_IP" "$B_MAC" "$args" || return 1
	expect a 60 "ping -c 2 -W 5 $B_IP"
}

# bench_setup NAME KERNEL_ARGS DEVICE: every tool and size, b client → a server.
bench_setup() {
	local name=$1 args=$2 device=$3 tool size iters
	CASE_DIR=$RUN_DIR/bench-$name
	mkdir -p "$CASE_DIR"
	PERF_RESULTS=()
	pair_behind_vt3d "$args" || return 1
	expect a 30 "for i in \$(seq 100); do [ -e /sys/class/infiniband/$device ] && exit 0; sleep 0.2; done; exit 1"
	for tool in "${BENCH_BW_TOOLS[@]}"; do
		for size in "${BENCH_SIZES[@]}"; do
			iters=500
			[ "$size" -ge 65536 ] && iters=50
			[ "$size" -ge 1048576 ] && iters=20
			perftest_run a b "$tool" "$size" "$iters" || log "bench: $name $tool $size: ${FAIL_REASON:-failed}"
			FAIL_REASON=
		done
	done
	for tool in "${BENCH_LAT_TOOLS[@]}"; do
		perftest_run a b "$tool" 64 200 || log "bench: $name $tool: ${FAIL_REASON:-failed}"
		FAIL_REASON=
	done
	local row
	for row in "${PERF_RESULTS[@]}"; do
		set -- $row
		printf '%s,%s,%s,%s\n' "$name" "$2" "$3" "$4" >>"$BENCH_CSV"
	done
	kill_tracked
	close_agents
}

# bench_value SETUP TOOL SIZE: the CSV's value, or "-".
bench_value() {
	awk -F, -v s="$1" -v t="$2" -v z="$3" '$1 == s && $2 == t && $3 == z { v = $4 } END { print (v == "" ? "-" : v) }' "$BENCH_CSV"
}

bench_table() {
	local tool size v s
	printf '%-12s %8s %12s %12s %8s\n' tool bytes vt3 siw vt3/siw
	for tool in "${BENCH_BW_TOOLS[@]}" "${BENCH_LAT_TOOLS[@]}"; do
		local sizes=("${BENCH_SIZES[@]}")
		[[ $tool == *_lat ]] && sizes=(64)
		for size in "${sizes[@]}"; do
			v=$(bench_value vt3 "$tool" "$size")
			s=$(bench_value siw "$tool" "$size")
			printf '%-12s %8s %12s %12s %8s\n' "$tool" "$size" "$v" "$s" \
				"$(awk -v v="$v" -v s="$s" 'BEGIN { if (v == "-" || s == "-" || s + 0 == 0) print "-"; else printf "%.2f", v / s }')"
		done
	done
	echo "(bandwidth in MB/s, latency t_avg in µs; b → a, TCG, 1 vCPU per guest)"
}

bench_plot() {
	local png=$1 plot=() tool
	command -v gnuplot >/dev/null || { log "gnuplot missing: no PNG"; return 0; }
	for tool in "${BENCH_BW_TOOLS[@]}"; do
		plot+=("'< grep \"^vt3,$tool,\" $BENCH_CSV' using 3:4 with linespoints title 'vt3 $tool'")
		plot+=("'< grep \"^siw,$tool,\" $BENCH_CSV' using 3:4 with linespoints dashtype 2 title 'siw $tool'")
	done
	local IFS=,
	gnuplot <<GP
set terminal png size 1000,600
set output '$png'
set datafile separator ','
set logscale x 2
set termoption noenhanced
set format x '%.0b %BB'
set xlabel 'message size'
set ylabel 'MB/s'
set key left top
set grid
set title 'perftest -R between two QEMU (TCG) guests: vt3 offload vs siw'
plot ${plot[*]}
GP
}

cmd_bench() {
	HOST_TOOLS+=" gnuplot:gnuplot-nox"
	prepare
	local out=${BENCH_OUT:-$ROOT/build/bench}
	mkdir -p "$out"
	BENCH_CSV=$out/bench.csv
	echo "setup,tool,bytes,value" >"$BENCH_CSV"
	log "== bench: vt3 ↔ vt3"
	bench_setup vt3 vt3.driver=1 vt3_0 || log "bench: vt3 setup failed"
	log "== bench: siw ↔ siw (same QEMU setup)"
	bench_setup siw vt3.siw=1 siw0 || log "bench: siw setup failed"
	bench_table | tee "$out/bench.txt"
	bench_plot "$out/bench.png"
	log "wrote $out/bench.csv, bench.txt, bench.png; logs in $RUN_DIR"
}
