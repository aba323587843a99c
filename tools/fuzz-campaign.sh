#!/usr/bin/env bash
# Runs the fuzz campaign (docs/architecture.md §7.4): every cargo-fuzz target
# of iwarp/fuzz and device/fuzz, one after another (one fuzzer process at a
# time, niced), each until it reached RUNS executions or ran SECONDS,
# whichever comes first; then prints the results as the markdown table of
# docs/fuzzing.md. Exits non-zero if any target crashed or timed out.
#
#   tools/fuzz-campaign.sh [--runs N] [--time SECONDS] [--nice N] [--asan] [TARGET...]
#
# Defaults: 10000000 runs, 1800 s, nice 10 (0: an equal share beside other
# work), every target, no sanitizer (safe Rust;
# --asan builds with AddressSanitizer, about half the speed). Corpora
# persist in $VT3_CACHE/fuzz/<target> (tools/cache-dir.sh: /var/cache/vt3
# for root), crash and timeout reproducers go to
# $VT3_CACHE/fuzz/artifacts/<target>/, libFuzzer's output to
# $VT3_CACHE/fuzz/logs/<target>.log. Committed seeds (<crate>/seeds/<target>/)
# and dictionaries (<crate>/<target>.dict) are used when present.
# Needs cargo-fuzz (`cargo install cargo-fuzz`) and a nightly toolchain,
# or RUSTC_BOOTSTRAP=1 with stable.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=tools/cache-dir.sh
. "$root/tools/cache-dir.sh"

runs=10000000
seconds=1800
sanitizer=none
niceness=10
targets=()
while [ $# -gt 0 ]; do
	case "$1" in
	--runs) runs=$2; shift 2 ;;
	--time) seconds=$2; shift 2 ;;
	--nice) niceness=$2; shift 2 ;;
	--asan) sanitizer=address; shift ;;
	-h | --help) sed -n '2,19p' "$0"; exit 0 ;;
	-*) echo "unknown option $1" >&2; exit 2 ;;
	*) targets+=("$1"); shift ;;
	esac
done

# target -> crate directory, in campaign order.
declare -A crate_of=(
	[mpa_deframer]=iwarp/fuzz [ddp_rdmap_parse]=iwarp/fuzz
	[mpa_negotiation]=iwarp/fuzz [engine_receive]=iwarp/fuzz
	[wqe]=device/fuzz [control_command]=device/fuzz
	[vhost_user_relay]=device/fuzz [virtio_chains]=device/fuzz
)
order=(mpa_deframer ddp_rdmap_parse mpa_negotiation engine_receive wqe control_command vhost_user_relay virtio_chains)
[ ${#targets[@]} -gt 0 ] || targets=("${order[@]}")
for t in "${targets[@]}"; do
	[ -n "${crate_of[$t]:-}" ] || { echo "unknown target $t (known: ${order[*]})" >&2; exit 2; }
done

toolchain=(+nightly)
if ! rustup run nightly rustc --version >/dev/null 2>&1; then
	toolchain=()
	export RUSTC_BOOTSTRAP=1
fi

work="$VT3_CACHE/fuzz"
mkdir -p "$work/logs"
declare -A built=()
rows=()
failed=0
for t in "${targets[@]}"; do
	crate="$root/${crate_of[$t]}"
	if [ -z "${built[$crate]:-}" ]; then
		echo "== building $(basename "$(dirname "$crate")")/fuzz (sanitizer: $sanitizer)" >&2
		(cd "$crate" && nice -n 10 cargo "${toolchain[@]}" fuzz build -s "$sanitizer" >&2)
		built[$crate]=1
	fi
	bin="$crate/target/x86_64-unknown-linux-gnu/release/$t"
	corpus="$work/$t"
	artifacts="$work/artifacts/$t"
	log="$work/logs/$t.log"
	mkdir -p "$corpus" "$artifacts"
	extra=()
	[ -d "$crate/seeds/$t" ] && extra+=("$crate/seeds/$t")
	dict=()
	[ -f "$crate/$t.dict" ] && dict=("-dict=$crate/$t.dict")
	count() { find "$artifacts" -type f -name "$1" | wc -l; }
	crashes_before=$(( $(count 'crash-*') + $(count 'oom-*') + $(count 'leak-*') ))
	timeouts_before=$(count 'timeout-*')
	echo "== $t: up to $runs runs or $seconds s (log: $log)" >&2
	start=$(date +%s)
	status=0
	nice -n "$niceness" "$bin" "$corpus" "${extra[@]}" "${dict[@]}" \
		-runs="$runs" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
		-print_final_stats=1 -artifact_prefix="$artifacts/" >"$log" 2>&1 || status=$?
	wall=$(( $(date +%s) - start ))
	stat() { sed -n "s/^stat::$1: *//p" "$log" | tail -1; }
	execs=$(stat number_of_executed_units)
	# A crash ends the run before the final stats: take the last status line.
	[ -n "$execs" ] || execs=$(sed -n 's/^#\([0-9]*\).*/\1/p' "$log" | tail -1)
	rate=$(stat average_exec_per_sec)
	size=$(find "$corpus" -type f | wc -l)
	crashes=$(( $(count 'crash-*') + $(count 'oom-*') + $(count 'leak-*') - crashes_before ))
	timeouts=$(( $(count 'timeout-*') - timeouts_before ))
	result=ok
	if [ "$status" -ne 0 ] || [ "$crashes" -gt 0 ] || [ "$timeouts" -gt 0 ]; then
		result="FAILED (exit $status; see $log)"
		failed=1
	fi
	rows+=("| \`$t\` | ${crate_of[$t]%/fuzz} | ${execs:-0} | $wall | ${rate:-0} | $size | $crashes | $timeouts | $result |")
	echo "   ${execs:-0} runs in $wall s, $result" >&2
done

echo "| target | crate | executions | wall time (s) | exec/s | corpus | crashes | timeouts | result |"
echo "|---|---|--:|--:|--:|--:|--:|--:|---|"
printf '%s\n' "${rows[@]}"
exit "$failed"
