#!/usr/bin/env bash
# vt3: builds what the guests need, then runs the demo, the tests, the
# bench or a guest to work in. The full-system tests are Python (pytest,
# tests/system/, fixtures in vt3lab/); this script only prepares the host.
#
#   ./run-vm.sh [OPTIONS]              the demo
#   ./run-vm.sh [OPTIONS] test [--repeat N] [CASE…]
#                                      full-system tests (all by default),
#                                      each N times (a tally per case)
#   ./run-vm.sh [OPTIONS] list         names the test cases
#   ./run-vm.sh [OPTIONS] check        every test, as CI runs it: cargo test,
#                                      the compile check (vt3.ko on 6.1 and
#                                      6.12), the image self-test, all cases with this
#                                      QEMU, the QEMU 10.0 set, the 6.12 kernel set
#   ./run-vm.sh [OPTIONS] soak [--repeat N] [CASE…]
#                                      the long runs (not in CI), or some of
#                                      them; `soak connections` runs the
#                                      connection-heavy cases 30 times each
#   ./run-vm.sh [OPTIONS] mutants      deliberately broken builds must fail
#   ./run-vm.sh [OPTIONS] bench [--device-only] [--short]
#                                      vt3d's own bench (two vt3d processes,
#                                      synthetic guests, no QEMU: device.json),
#                                      then perftest and fio over NVMe/RDMA,
#                                      vt3↔vt3 beside siw↔siw;
#                                      --short: the device bench's few-second
#                                      form only (implies --device-only)
#   ./run-vm.sh [OPTIONS] up N [--siw K] [--hosts H [--fabric vxlan|l2]]
#                             [--share DIR] [--dir DIR] [--hours H]
#                                      the lab: N guests on one Ethernet segment
#                                      (the last K with siw, the others vt3),
#                                      or spread over H hosts (network
#                                      namespaces joined by VXLAN; docs/hosts.md),
#                                      booted in the background; prints each
#                                      guest's console and vt3d ctl; DIR (default
#                                      /tmp/vt3-lab-UID) is its run directory
#   ./run-vm.sh down [--dir DIR]       stops the lab, and everything it started
#   ./run-vm.sh [OPTIONS] shell        an interactive guest with a vt3 NIC
#                                      (its console here; Ctrl-] leaves)
#   ./run-vm.sh [OPTIONS] dist         the relocatable bundle: vt3d, guest
#                                      images, the vt3lab wheel, the `vt3`
#                                      launcher (build/dist/vt3-VERSION-x86_64.tar.zst;
#                                      docs/bundle.md)
#
# Options:
#   --qemu PATH    QEMU binary (default: $VT3_QEMU, else qemu-system-x86_64)
#   --keep         keep the run directory even when everything passes
#   --kernel S     the guests' kernel: Debian 12's 6.1 (default) or 6.12; its
#                  images are in $VT3_CACHE/images or $VT3_CACHE/images-6.12
#                  (images/build.sh --kernel S) unless VT3_IMAGES names a dir
#
# Runs as root on a fresh Debian 12 machine: missing host packages are
# installed. Caches (images, rdma-core, cargo's target dir) live in
# $VT3_CACHE (tools/cache-dir.sh), outside the clone. Two runs side by side
# each need their own VT3_IMAGES, VT3_RDMA_CORE_WORK, CARGO_TARGET_DIR and
# VT3_RESULTS (default build/test-results, emptied by each run).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tools/cache-dir.sh
source "$ROOT/tools/cache-dir.sh"
# The guests' kernel (--kernel) and its images (set in main, once known).
KERNEL=6.1
IMAGES=
# Cargo's target dir is a cache too: dependencies built once per machine.
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$VT3_CACHE/target}
VT3D=$CARGO_TARGET_DIR/release/vt3d
QEMU=${VT3_QEMU:-}
KEEP=0
RESULTS=${VT3_RESULTS:-$ROOT/build/test-results}
PYTHON=/usr/bin/python3
START=$SECONDS

log() { printf '[%4ds] %s\n' $((SECONDS - START)) "$*" >&2; }
die() {
	printf 'run-vm.sh: %s\n' "$*" >&2
	exit 2
}

# ---------------------------------------------------------------- host setup

# Host tools, as "command:package"; python3-pytest is checked by import.
# tshark: the case pcap reads vt3d's captures with Wireshark's dissectors
# (hosts-pcap captures with its dumpcap).
# socat: what `up` tells the user to reach a guest's console with.
# ip: the tap uplink's tests, the case tap-uplink-vt3-siw and the bench
# put taps in a bridge of their own; `up --hosts` and the hosts-* cases
# make namespaces, bridges and VXLAN devices (ip, bridge: iproute2).
# zstd, strip: the bundle (dist, and the case user-suite that builds one).
HOST_TOOLS="timeout:coreutils md5sum:coreutils gcc:gcc flock:util-linux tshark:tshark socat:socat ip:iproute2
zstd:zstd strip:binutils runuser:util-linux"
# The same, installed without their recommendations: libvirt's daemon and
# virsh for the case libvirt (not libvirt-daemon-system: the case runs its
# own libvirtd; no service of the machine's is installed or started).
HOST_TOOLS_BARE="libvirtd:libvirt-daemon virsh:libvirt-clients"
# Python modules beyond pytest's, as "module:package": the vt3lab wheel is
# built with pip, setuptools and wheel; the case user-suite installs it
# into a venv (ensurepip: python3-venv).
PYTHON_MODULES="pip:python3-pip setuptools:python3-setuptools wheel:python3-wheel ensurepip:python3-venv"
# What check's lint stage (tools/lint.sh) runs besides cargo's own
# rustfmt and clippy (tools/lint-kmod.sh adds perl for checkpatch): added
# to the above by cmd_check only.
LINT_TOOLS="shellcheck:shellcheck sparse:sparse"
LINT_PYTHON_MODULES="flake8:python3-flake8"

ensure_host_packages() {
	local missing=() bare=() pair cmd pkg
	[ -n "$QEMU" ] || HOST_TOOLS+=" qemu-system-x86_64:qemu-system-x86"
	for pair in $HOST_TOOLS; do
		cmd=${pair%%:*} pkg=${pair#*:}
		command -v "$cmd" >/dev/null 2>&1 || missing+=("$pkg")
	done
	for pair in $HOST_TOOLS_BARE; do
		cmd=${pair%%:*} pkg=${pair#*:}
		PATH=$PATH:/usr/sbin command -v "$cmd" >/dev/null 2>&1 || bare+=("$pkg")
	done
	# vt3-uverbs is linked statically (images/overlay.sh): libc.a.
	[ -f /usr/lib/x86_64-linux-gnu/libc.a ] || missing+=(libc6-dev)
	# The example suite builds its rdma_cm program on the host (user-suite).
	[ -f /usr/include/infiniband/verbs.h ] || missing+=(libibverbs-dev)
	[ -f /usr/include/rdma/rdma_cma.h ] || missing+=(librdmacm-dev)
	# Debian's own Python and pytest (not whatever python3 is first on PATH).
	# pytest-repeat: `test --repeat N` and the soak run a case N times.
	"$PYTHON" -c 'import pytest, xdist, pytest_repeat' 2>/dev/null ||
		missing+=(python3 python3-pytest python3-pytest-xdist python3-pytest-repeat)
	for pair in $PYTHON_MODULES; do
		"$PYTHON" -c "import ${pair%%:*}" 2>/dev/null || missing+=("${pair#*:}")
	done
	[ $((${#missing[@]} + ${#bare[@]})) -eq 0 ] && return 0
	if [ "$(id -u)" -ne 0 ]; then
		die "missing host packages: ${missing[*]} ${bare[*]} (run as root to install them, or: apt-get install ${missing[*]} ${bare[*]})"
	fi
	log "installing host packages: ${missing[*]} ${bare[*]} (apt, about a minute)"
	apt-get update -q >/dev/null
	[ ${#missing[@]} -eq 0 ] || DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null
	[ ${#bare[@]} -eq 0 ] || DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${bare[@]}" >/dev/null
}

# The Rust the workspace asks for (Cargo.toml's rust-version), with a clear
# message instead of a compiler error deep in a build.
ensure_rust() {
	command -v cargo >/dev/null || die "cargo not found: install Rust ≥ $(rust_wanted) (https://rustup.rs)"
	local have want
	have=$(cargo --version | sed -n 's/^cargo \([0-9]*\.[0-9]*\).*/\1/p')
	want=$(rust_wanted)
	if [ "$(printf '%s\n%s\n' "$want" "$have" | sort -V | head -n 1)" != "$want" ]; then
		die "Rust $have is too old: vt3 needs Rust ≥ $want (rustup update)"
	fi
}
rust_wanted() { sed -n 's/^rust-version = "\(.*\)"/\1/p' "$ROOT/Cargo.toml"; }

ensure_vt3d() {
	ensure_rust
	log "building vt3d (cargo build --release; a few minutes the first time)"
	(cd "$ROOT" && cargo build --release -q -p vt3d) || die "building vt3d failed"
}

ensure_images() {
	log "guest images (images/build.sh: Debian packages, kernel, siw; cached)"
	"$ROOT/images/build.sh" --kernel "$KERNEL" --out "$IMAGES" >&2 || die "building the guest images failed"
	log "vt3.ko and rdma-core with libvt3 (images/overlay.sh; cached)"
	"$ROOT/images/overlay.sh" --images "$IMAGES" || die "building vt3.ko / rdma-core for the guest failed"
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
		(timeout -k 2 15 "$QEMU" -accel kvm -M q35 -m 128M -display none -monitor none \
			-serial none -no-reboot -kernel "$IMAGES/vmlinuz" -append "panic=-1" \
			>/dev/null 2>&1 </dev/null) 2>/dev/null &
		local probe=$!
		for _ in $(seq 40); do
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
	export VT3_QEMU=$QEMU VT3_ACCEL=$ACCEL VT3_IMAGES=$IMAGES VT3_VT3D=$VT3D
	KEEP_ARGS=()
	[ "$KEEP" = 0 ] || KEEP_ARGS=(--vt3-keep)
	log "ready: $("$QEMU" --version | head -n 1), accel $ACCEL, kernel $(cat "$IMAGES/kver")"
}

# ------------------------------------------------------------------ tests

# pytest NAME ARGS…: the full-system tests; JUnit XML in RESULTS/NAME.xml,
# a failed run's consoles and logs in RESULTS/NAME/. VT3_PYTEST_ARGS: more
# pytest options (e.g. --maxfail=1).
# Setups run JOBS at a time (pytest-xdist, one worker each; default 2: the
# guests leave a 2-core host half idle, waiting on each other).
JOBS=${VT3_JOBS:-2}

run_pytest() {
	local name=$1 parallel=()
	shift
	mkdir -p "$RESULTS"
	rm -rf "${RESULTS:?}/$name" "$RESULTS/$name.xml"
	[ "$JOBS" -le 1 ] || parallel=(-n "$JOBS" --dist loadgroup)
	# VT3_PYTEST_ARGS is a list of options: split on purpose.
	# shellcheck disable=SC2086
	(cd "$ROOT" && "$PYTHON" -m pytest tests/system -v "${parallel[@]}" --durations=20 --junitxml="$RESULTS/$name.xml" \
		--vt3-run-dir "$RESULTS/$name" "${KEEP_ARGS[@]}" ${VT3_PYTEST_ARGS:-} "$@")
}

# The closing line of a JUnit file: passed = run and neither failed, errored
# nor skipped; a run that ran nothing is a failure.
junit_counts() {
	"$PYTHON" - "$@" <<'PY'
import sys, xml.etree.ElementTree as ET
passed = failed = 0
for path in sys.argv[1:]:
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        failed += 1
        continue
    for s in ([root] if root.tag == "testsuite" else root.iter("testsuite")):
        n, bad = int(s.get("tests", 0)), sum(int(s.get(k, 0)) for k in ("failures", "errors", "skipped"))
        passed += n - bad
        failed += bad + (1 if n == 0 else 0)
print(passed, failed)
PY
}

# CASE... as pytest options: each --case, and --repeat N as pytest-repeat's
# --count (each run its own test, a fresh boot where the case's fixture
# gives one; no run is retried). Sets CASE_ARGS.
case_args() {
	CASE_ARGS=()
	while [ $# -gt 0 ]; do
		case $1 in
		--repeat)
			[[ ${2:-} =~ ^[1-9][0-9]*$ ]] || die "--repeat: '${2:-}' is not a count"
			CASE_ARGS+=(--count "$2")
			shift 2
			;;
		*)
			CASE_ARGS+=(--case "$1")
			shift
			;;
		esac
	done
}

cmd_test() {
	case_args "$@"
	prepare
	local rc=0 p f
	run_pytest system "${CASE_ARGS[@]}" || rc=$?
	read -r p f < <(junit_counts "$RESULTS/system.xml")
	set -- "$p" "$f"
	echo "$1 passed, $2 failed"
	[ "$rc" -eq 0 ] && [ "$2" -eq 0 ] && [ "$1" -gt 0 ]
}

cmd_list() {
	"$PYTHON" -c 'import pytest' 2>/dev/null || ensure_host_packages
	(cd "$ROOT" && "$PYTHON" -m pytest tests/system -q --vt3-list -m "") | sed '/^$/q' | sed '/^$/d'
}

# tools/lint.sh: rustfmt, clippy, shellcheck, flake8, checkpatch and sparse
# over vt3.ko, the mutants' anchors; one pass or failure per linter.
check_lint() {
	local out=$RESULTS/lint.log p f
	log "== lint (tools/lint.sh)"
	if ! (cd "$ROOT" && cargo fmt --version && cargo clippy --version) >/dev/null 2>&1; then
		log "lint: cargo fmt and cargo clippy are needed (rustup component add rustfmt clippy)"
		FAILED=$((FAILED + 1))
		return 0
	fi
	"$ROOT/tools/lint.sh" >"$out" 2>&1 || true
	grep -E '^lint: ' "$out" >&2 || true
	if ! read -r p f < <(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$out" | tail -n 1 | tr -d ',' | awk '{print $1, $3}') ||
		[ -z "$p" ]; then
		p=0 f=1
	fi
	if [ "$f" -gt 0 ]; then
		# What the failed linters said.
		grep -vE '^lint: .* ok ' "$out" | tail -n 60 >&2
	fi
	log "lint: $p passed, $f failed (log: $out)"
	PASSED=$((PASSED + p)) FAILED=$((FAILED + f))
}

# cargo test, with its failures shown; adds to PASSED/FAILED.
check_cargo() {
	local out=$RESULTS/cargo-test.log p f
	# Tests that need CAP_NET_ADMIN (a real tap) are #[ignore]d: as root
	# they run too, without root cargo reports them ignored, not passed.
	local ignored=()
	[ "$(id -u)" -ne 0 ] || ignored=(-- --include-ignored)
	log "== cargo test --workspace ${ignored[*]}"
	set +e
	(cd "$ROOT" && cargo test --workspace "${ignored[@]}" 2>&1) >"$out"
	local rc=$?
	set -e
	grep -E '^test result:' "$out" >&2 || true
	p=$(awk '/^test result:/ { s += $4 } END { print s + 0 }' "$out")
	f=$(awk '/^test result:/ { s += $6 } END { print s + 0 }' "$out")
	if [ "$rc" -ne 0 ]; then
		# Failures and build errors, as cargo printed them.
		sed -n '/^failures:$/,/^test result:/p; /^error/,/^$/p' "$out" | head -n 150 >&2
		[ "$f" -gt 0 ] || f=1
	fi
	[ "$p" -gt 0 ] || f=$((f + 1))
	log "cargo: $p passed, $f failed (log: $out)"
	PASSED=$((PASSED + p)) FAILED=$((FAILED + f))
}

# images/selftest.sh: two guests of the base image on a plain wire.
SELFTEST_CHECKS=13
check_selftest() {
	local out=$RESULTS/selftest.log line
	log "== images/selftest.sh (base image, no vt3d)"
	QEMU=$QEMU VT3_ACCEL=$ACCEL "$ROOT/images/selftest.sh" --images "$IMAGES" >"$out" 2>&1 || true
	line=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$out" | tail -n 1)
	if [ "$line" = "$SELFTEST_CHECKS passed, 0 failed" ]; then
		PASSED=$((PASSED + SELFTEST_CHECKS))
		log "selftest: $line"
	else
		grep -E '^FAIL' -A 5 "$out" >&2 || true
		FAILED=$((FAILED + 1))
		log "selftest: '${line:-no summary}', want '$SELFTEST_CHECKS passed, 0 failed' (log: $out)"
	fi
}

# tools/compile-check.sh: vt3.ko and its test modules, W=1, against each
# Debian 12 kernel's headers; one testcase per kernel.
check_compile() {
	log "== compile check (vt3.ko, W=1, Debian 12's 6.1 and 6.12)"
	rm -f "$RESULTS/compile-check.xml"
	"$ROOT/tools/compile-check.sh" --junit "$RESULTS/compile-check.xml" >&2 || true
	local p f
	read -r p f < <(junit_counts "$RESULTS/compile-check.xml")
	PASSED=$((PASSED + p)) FAILED=$((FAILED + f))
}

check_pytest() {
	local name=$1
	shift
	log "== full system ($name)"
	run_pytest "$name" "$@" || true
	local p f
	read -r p f < <(junit_counts "$RESULTS/$name.xml")
	log "$name: $p passed, $f failed"
	PASSED=$((PASSED + p)) FAILED=$((FAILED + f))
}

# The core set (the cases marked kernel612: devinfo, rping vt3↔vt3 and
# vt3↔siw, one perftest size, flush-local, flush-rst, nvme-vt3-vt3) on
# Debian 12's 6.12 kernel: its own images (images/build.sh --kernel 6.12,
# cached beside the 6.1 ones), one boot per setup, one flush style.
check_kernel612() {
	local images=$IMAGES
	[ "$KERNEL" = 6.12 ] || images=$VT3_CACHE/images-6.12
	log "== guest images for the 6.12 kernel (images/build.sh --kernel 6.12, overlay; cached)"
	if "$ROOT/images/build.sh" --kernel 6.12 --out "$images" >&2 &&
		"$ROOT/images/overlay.sh" --images "$images"; then
		VT3_IMAGES=$images VT3_FLUSH_STYLES=events check_pytest kernel6.12 -m kernel612
	else
		log "could not build the 6.12 guest images"
		FAILED=$((FAILED + 1))
	fi
}

# check: the whole suite, as CI runs it; every stage runs whatever the
# others did, and one closing count sums them.
cmd_check() {
	PASSED=0 FAILED=0
	HOST_TOOLS+=" $LINT_TOOLS" PYTHON_MODULES+=" $LINT_PYTHON_MODULES"
	prepare
	mkdir -p "$RESULTS"
	check_lint
	check_cargo
	check_compile
	check_selftest
	check_pytest "qemu$("$QEMU" --version | sed -n 's/^QEMU emulator version \([0-9]*\)\..*/\1/p')"
	local qemu10
	if qemu10=$("$ROOT/tools/fetch-qemu10.sh"); then
		VT3_QEMU=$qemu10 VT3_FLUSH_STYLES=events check_pytest qemu10 -m qemu10
	else
		log "could not fetch QEMU 10.0"
		FAILED=$((FAILED + 1))
	fi
	check_kernel612
	log "check took $((SECONDS - START)) s; results in $RESULTS"
	echo "$PASSED passed, $FAILED failed"
	[ "$FAILED" -eq 0 ]
}

# The device bench (device/benches/device: real vt3d processes driven by
# synthetic guests, build/bench/device.json), then the perftest and fio table.
cmd_bench() {
	local device_only=0 short=()
	for arg; do
		case $arg in
		--device-only) device_only=1 ;;
		--short) short=(--short) device_only=1 ;;
		*) die "bench: unknown option '$arg' (--device-only, --short)" ;;
		esac
	done
	ensure_rust
	log "== device bench (cargo bench -p vt3d --bench device ${short[*]})"
	(cd "$ROOT" && cargo bench -q -p vt3d --bench device -- "${short[@]}" --out "$ROOT/build/bench/device.json") ||
		die "device bench failed"
	[ "$device_only" = 1 ] && return 0
	HOST_TOOLS+=" gnuplot:gnuplot-nox"
	vt3lab bench
}

# The connection-heavy cases `soak connections` runs, 30 times each unless
# --repeat says otherwise: a connection that stalls once in fifty shows.
SOAK_CONNECTIONS="vt3-rmmod-conn vt3-kfrmr vt3-disconnect rping-vt3-vt3 rping-vt3-siw perftest-vt3-vt3 loopback nvme-vt3-vt3"

cmd_soak() {
	local args=() marks=(-m soak)
	for arg; do
		if [ "$arg" = connections ]; then
			# shellcheck disable=SC2206
			args+=($SOAK_CONNECTIONS)
			marks=()
			[[ " $* " == *" --repeat "* ]] || args+=(--repeat 30)
		else
			args+=("$arg")
		fi
	done
	case_args "${args[@]}"
	prepare
	local rc=0 p f
	run_pytest soak "${marks[@]}" "${CASE_ARGS[@]}" || rc=$?
	read -r p f < <(junit_counts "$RESULTS/soak.xml")
	set -- "$p" "$f"
	echo "$1 passed, $2 failed"
	[ "$rc" -eq 0 ] && [ "$2" -eq 0 ] && [ "$1" -gt 0 ]
}

# The relocatable bundle (tools/dist.sh, docs/bundle.md).
cmd_dist() {
	prepare
	log "== bundle (tools/dist.sh)"
	PYTHON=$PYTHON "$ROOT/tools/dist.sh" --images "$IMAGES" --vt3d "$VT3D" --out "${VT3_DIST:-$ROOT/build/dist}"
}

vt3lab() {
	prepare
	local keep=()
	case $1 in demo | bench | shell) [ "$KEEP" = 0 ] || keep=(--keep) ;; esac
	(cd "$ROOT" && exec "$PYTHON" -m vt3lab "$@" "${keep[@]}")
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
		--kernel)
			KERNEL=${2:?--kernel needs 6.1 or 6.12}
			shift 2
			;;
		-h | --help)
			sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
			return 0
			;;
		*) break ;;
		esac
	done
	case $KERNEL in
	6.1) IMAGES=${VT3_IMAGES:-$VT3_CACHE/images} ;;
	6.12) IMAGES=${VT3_IMAGES:-$VT3_CACHE/images-6.12} ;;
	*) die "--kernel: '$KERNEL' is not one of Debian 12's kernels (6.1, 6.12)" ;;
	esac
	local cmd=${1:-demo}
	[ $# -gt 0 ] && shift
	case $cmd in
	demo) vt3lab demo ;;
	test) cmd_test "$@" ;;
	list) cmd_list ;;
	check) cmd_check ;;
	soak) cmd_soak "$@" ;;
	mutants) prepare && "$ROOT/tools/mutants.sh" "$@" ;;
	bench) cmd_bench "$@" ;;
	up) vt3lab up "$@" ;;
	down) (cd "$ROOT" && exec "$PYTHON" -m vt3lab down "$@") ;;
	shell) vt3lab shell ;;
	dist) cmd_dist ;;
	*) die "unknown command '$cmd' (demo, test, list, check, soak, mutants, bench, up, down, shell, dist)" ;;
	esac
}

main "$@"
