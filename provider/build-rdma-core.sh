#!/usr/bin/env bash
# Build rdma-core 55 with the vt3 provider (provider/) and the vt3 guest tools
# (guest-tools/) inside its tree, and install the result into a staging dir:
#   STAGE/usr/lib/x86_64-linux-gnu/          libibverbs.so.1, librdmacm.so.1, libmlx5.so.1 ...
#   STAGE/usr/lib/x86_64-linux-gnu/libibverbs/  providers: libvt3-rdmav34.so, libsiw-rdmav34.so ...
#   STAGE/etc/libibverbs.d/                  vt3.driver, siw.driver ...
#   STAGE/usr/bin/                           ibv_devinfo, rping, ucmatose, rdma_server ..., vt3-resources
#   STAGE/usr/include/infiniband/vt3dv.h
#   STAGE/usr/lib/python3/dist-packages/pyverbs/   pyverbs (Cython), for Debian's python3
#   STAGE/usr/share/doc/rdma-core/tests/    rdma-core's own test suite (run_tests.py)
# The layout is Debian's (multiarch lib dir, /etc), so the staged files replace
# Debian's rdma-core packages file for file.
#
# Usage: provider/build-rdma-core.sh [--out DIR] [--work DIR] [--clean]
#   --out DIR    staging directory (default WORK/stage)
#   --work DIR   source copy, cmake build dir and fetch manifest (default $VT3_CACHE/rdma-core,
#                outside the clone: tools/cache-dir.sh)
#   --clean      wipe WORK first
#
# rdma-core itself is never committed: it is the vendor/rdma-core tree of the
# crate ibverbs-sys 0.3.2+55.0, fetched with cargo into the cargo cache. The
# copy in WORK/src gets two add_subdirectory() lines; providers/vt3,
# vt3-guest-tools and vt3-include in it are copies of provider/, guest-tools/
# and guest-driver/include/, refreshed when their content changes: the build
# depends on what the sources say, never on where the clone is, so every
# clone on a machine shares one WORK and ninja rebuilds only what changed.
#
# Cached: a stamp holds the hash of every input (this script, provider/,
# guest-tools/, guest-driver/include/); an unchanged rebuild only checks it.
set -euo pipefail
export LC_ALL=C

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=../tools/cache-dir.sh
source "$REPO/tools/cache-dir.sh"
WORK=${VT3_RDMA_CORE_WORK:-$VT3_CACHE/rdma-core}
STAGE=
CLEAN=0

CRATE=ibverbs-sys
CRATE_VERSION=0.3.2+55.0
RDMA_CORE_VERSION=55.0

# Host packages: the toolchain and what rdma-core's cmake looks for. libnl is
# required for the netlink device discovery of libibverbs 55, libudev for
# rdma-ndd; python3, python3-dev and cython3 for pyverbs, which rdma-core's
# test suite (tests/, the `pyverbs` case) is written in.
HOST_PACKAGES=(gcc binutils cmake ninja-build pkg-config python3 python3-dev cython3
	libnl-3-dev libnl-route-3-dev libudev-dev)

# pyverbs is built for Debian's python3, the one the guest runs (images/build.sh
# PYTHON_PACKAGES): its headers come from python3-dev, Cython from cython3, and
# only this interpreter imports that Cython (a python3 earlier on PATH, e.g. a
# pyenv one, would not).
PYTHON=/usr/bin/python3

# Install paths as Debian's rdma-core package uses them (debian/rules), so the
# staged tree overrides Debian's files in the guest; but systemd units and
# udev files go under /usr/lib, not /lib: in a merged-/usr root /lib is a
# symlink, and a copy (or an appended cpio) of a real lib/ directory would
# replace it and take the C library with it.
CMAKE_ARGS=(
	-GNinja
	-DCMAKE_BUILD_TYPE=RelWithDebInfo
	-DNO_MAN_PAGES=1
	-DENABLE_STATIC=0
	-DCMAKE_INSTALL_PREFIX=/usr
	-DCMAKE_INSTALL_LIBDIR=lib/x86_64-linux-gnu
	-DCMAKE_INSTALL_SYSCONFDIR=/etc
	-DCMAKE_INSTALL_RUNDIR=/run
	-DCMAKE_INSTALL_LIBEXECDIR=/usr/lib
	-DCMAKE_INSTALL_SHAREDSTATEDIR=/var/lib
	-DCMAKE_INSTALL_INITDDIR=/etc/init.d
	-DCMAKE_INSTALL_SYSTEMD_SERVICEDIR=/usr/lib/systemd/system
	-DCMAKE_INSTALL_SYSTEMD_BINDIR=/usr/lib/systemd
	-DCMAKE_INSTALL_UDEV_RULESDIR=/usr/lib/udev/rules.d
	# Where Debian's python3-pyverbs puts it (not the host's sysconfig
	# platlib, /usr/local/lib/python3.X/dist-packages on Debian).
	-DCMAKE_INSTALL_PYTHON_ARCH_LIB=/usr/lib/python3/dist-packages
	# No build-tree RPATH: the install would drop it but keep its length,
	# and the staged bytes would depend on the path of WORK.
	-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON
)

# ---------------------------------------------------------------- utilities

START=$SECONDS
log() { printf '[%3ds] %s\n' $((SECONDS - START)) "$*" >&2; }
die() {
	printf 'build-rdma-core.sh: error: %s\n' "$*" >&2
	exit 1
}

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

stamp_ok() { [[ -f $1 && "$(<"$1")" == "$2" ]]; }
stamp_set() { printf '%s\n' "$2" >"$1"; }

parse_args() {
	while (($#)); do
		case $1 in
		--out | --work)
			[[ $# -ge 2 ]] || die "$1 needs a directory"
			[[ $1 == --out ]] && STAGE=$2 || WORK=$2
			shift 2
			;;
		--out=*)
			STAGE=${1#--out=}
			shift
			;;
		--work=*)
			WORK=${1#--work=}
			shift
			;;
		--clean)
			CLEAN=1
			shift
			;;
		-h | --help)
			usage
			exit 0
			;;
		*) die "unknown argument '$1' (try --help)" ;;
		esac
	done
	mkdir -p "$WORK"
	WORK=$(cd "$WORK" && pwd)
	STAGE=${STAGE:-$WORK/stage}
	mkdir -p "$(dirname "$STAGE")"
	STAGE=$(cd "$(dirname "$STAGE")" && pwd)/$(basename "$STAGE")
}

# One build per work dir at a time.
lock_work() {
	exec 9>"$WORK/.lock"
	if ! flock -n 9; then
		log "$WORK is locked by another build; waiting"
		flock 9
	fi
}

ensure_host_packages() {
	local missing=() p
	for p in "${HOST_PACKAGES[@]}"; do
		[[ $(dpkg-query -W -f='${Status}' "$p" 2>/dev/null) == "install ok installed" ]] || missing+=("$p")
	done
	if ((${#missing[@]})); then
		[[ $EUID -eq 0 ]] || die "missing host packages: ${missing[*]} (apt-get install ${missing[*]})"
		log "apt-get install ${missing[*]}"
		# Waits for dpkg's lock rather than failing while another apt runs.
		local apt=(apt-get -o DPkg::Lock::Timeout=600)
		DEBIAN_FRONTEND=noninteractive "${apt[@]}" install -y -qq "${missing[@]}" >&2 || {
			"${apt[@]}" update -qq >&2 &&
				DEBIAN_FRONTEND=noninteractive "${apt[@]}" install -y -qq "${missing[@]}" >&2
		} || die "apt-get install ${missing[*]} failed"
	fi
	command -v cargo >/dev/null || die "no cargo (rustup, or apt-get install cargo): it fetches rdma-core"
}

# Hash of every input of the build: a different hash means rebuild.
inputs_hash() {
	{
		printf '%s\n' "$CRATE $CRATE_VERSION" "${CMAKE_ARGS[@]}" "$PYTHON"
		(cd "$REPO" && find provider guest-tools guest-driver/include -type f ! -name '*~' -print0 |
			sort -z | xargs -0 sha256sum)
	} | sha256sum | cut -c1-16
}

# ---------------------------------------------------------------- steps

# Prints the path of the crate file in the cargo cache, fetching it first.
fetch_crate() {
	local dir=$WORK/fetch cargo_home=${CARGO_HOME:-$HOME/.cargo} f
	mkdir -p "$dir/src"
	# A throwaway package whose only purpose is to make cargo fetch the crate.
	cat >"$dir/Cargo.toml" <<-EOF
		[package]
		name = "vt3-fetch-rdma-core"
		version = "0.0.0"
		edition = "2021"
		publish = false

		[dependencies]
		$CRATE = "=$CRATE_VERSION"

		[workspace]
	EOF
	: >"$dir/src/lib.rs"
	log "cargo fetch $CRATE $CRATE_VERSION"
	cargo fetch -q --manifest-path "$dir/Cargo.toml" --target x86_64-unknown-linux-gnu >&2 ||
		die "cargo fetch of $CRATE $CRATE_VERSION failed"
	for f in "$cargo_home"/registry/cache/*/"$CRATE-$CRATE_VERSION.crate"; do
		[[ -f $f ]] && {
			echo "$f"
			return 0
		}
	done
	die "cargo fetched $CRATE $CRATE_VERSION but its .crate is not in $cargo_home/registry/cache"
}

# Patch the copied tree: our provider next to siw, our tools next to the
# librdmacm examples (their files are copied in by sync_our_sources).
patch_tree() {
	local src=$1
	sed -i -e 's|^add_subdirectory(providers/siw)$|&\nadd_subdirectory(providers/vt3)|' \
		-e 's|^add_subdirectory(librdmacm/examples)$|&\nadd_subdirectory(vt3-guest-tools)|' \
		"$src/CMakeLists.txt"
	if ! grep -qx 'add_subdirectory(providers/vt3)' "$src/CMakeLists.txt" ||
		! grep -qx 'add_subdirectory(vt3-guest-tools)' "$src/CMakeLists.txt"; then
		die "could not add vt3 to rdma-core's CMakeLists.txt (layout changed?)"
	fi
}

# WORK/src: rdma-core's tree from the crate, patched. Keyed by the crate
# version and the code that makes it.
prepare_source() {
	local key crate
	key="$CRATE-$CRATE_VERSION $(declare -f fetch_crate patch_tree | sha256sum | cut -c1-16)"
	stamp_ok "$WORK/src/.vt3-stamp" "$key" && return 0
	crate=$(fetch_crate)
	log "unpacking rdma-core $RDMA_CORE_VERSION from $crate"
	rm -rf "$WORK/src" "$WORK/src.tmp" "$WORK/build"
	mkdir -p "$WORK/src.tmp"
	tar -xzf "$crate" -C "$WORK/src.tmp" --strip-components=3 "$CRATE-$CRATE_VERSION/vendor/rdma-core"
	grep -q "set(PACKAGE_VERSION \"$RDMA_CORE_VERSION\")" "$WORK/src.tmp/CMakeLists.txt" ||
		die "$crate does not hold rdma-core $RDMA_CORE_VERSION"
	patch_tree "$WORK/src.tmp"
	stamp_set "$WORK/src.tmp/.vt3-stamp" "$key"
	mv "$WORK/src.tmp" "$WORK/src"
}

# Our sources into the tree: a file is rewritten only when its content
# differs, so ninja sees a new mtime exactly where something changed.
sync_our_sources() {
	local src=$WORK/src from to f
	for pair in provider:providers/vt3 guest-tools:vt3-guest-tools guest-driver/include:vt3-include; do
		from=$REPO/${pair%%:*} to=$src/${pair#*:}
		[[ -L $to ]] && rm -f "$to" # trees made by older versions of this script
		mkdir -p "$to"
		(cd "$from" && find . -type f ! -name '*~' ! -name '*.sh' -print) | while read -r f; do
			cmp -s "$from/$f" "$to/$f" || install -D -m 644 "$from/$f" "$to/$f"
		done
		# Files gone from the repository go from the tree too.
		(cd "$to" && find . -type f -print) | while read -r f; do
			[[ -f $from/$f ]] || rm -f "$to/$f"
		done
	done
}

configure() {
	local key
	# Build paths are mapped away so the staged bytes (build ids included) do
	# not depend on where WORK is.
	local cflags="-ffile-prefix-map=$WORK/src=/usr/src/rdma-core-$RDMA_CORE_VERSION"
	cflags+=" -ffile-prefix-map=$WORK/build=/usr/src/rdma-core-$RDMA_CORE_VERSION/build"
	key="${CMAKE_ARGS[*]} $cflags $PYTHON"
	[[ -f $WORK/build/build.ninja ]] && stamp_ok "$WORK/build/.vt3-stamp" "$key" && return 0
	log "cmake"
	rm -rf "$WORK/build"
	cmake -S "$WORK/src" -B "$WORK/build" "${CMAKE_ARGS[@]}" -DCMAKE_C_FLAGS="$cflags" \
		-DVT3_ABI_INCLUDE_DIR="$WORK/src/vt3-include" \
		-DPYTHON_EXECUTABLE="$PYTHON" >"$WORK/cmake.log" 2>&1 ||
		die "cmake failed, see $WORK/cmake.log"
	! grep -q 'cython NOT found' "$WORK/cmake.log" ||
		die "cmake found no Cython for $PYTHON (pyverbs would be left out), see $WORK/cmake.log"
	stamp_set "$WORK/build/.vt3-stamp" "$key"
}

build_and_stage() {
	log "ninja ($(nproc) cores)"
	ninja -C "$WORK/build" >"$WORK/ninja.log" 2>&1 || {
		grep -E -A5 'error|FAILED' "$WORK/ninja.log" | head -n 40 >&2
		die "ninja failed, see $WORK/ninja.log"
	}
	log "installing into $STAGE"
	rm -rf "$STAGE.tmp"
	DESTDIR=$STAGE.tmp ninja -C "$WORK/build" install/strip >"$WORK/install.log" 2>&1 ||
		die "ninja install failed, see $WORK/install.log"
	local f
	for f in usr/lib/x86_64-linux-gnu/libibverbs/libvt3-rdmav34.so etc/libibverbs.d/vt3.driver \
		usr/bin/vt3-resources usr/lib/x86_64-linux-gnu/libibverbs.so.1 \
		usr/lib/python3/dist-packages/pyverbs/__init__.py usr/share/doc/rdma-core/tests/run_tests.py; do
		[[ -e $STAGE.tmp/$f ]] || die "the install did not produce $f"
	done
	# Only etc/ and usr/: safe to lay over a merged-/usr root (see CMAKE_ARGS).
	f=$(cd "$STAGE.tmp" && find . -mindepth 1 -maxdepth 1 ! -name etc ! -name usr)
	[[ -z $f ]] || die "the install put files outside etc/ and usr/: $f"
	rm -rf "$STAGE"
	mv "$STAGE.tmp" "$STAGE"
}

# ---------------------------------------------------------------- main

parse_args "$@"
if ((CLEAN)); then
	log "wiping $WORK"
	rm -rf "${WORK:?}"/{src,src.tmp,build,fetch,stage,stage.tmp,.stamp,*.log}
fi
lock_work
ensure_host_packages
KEY="$(inputs_hash) $STAGE"
log "inputs $(cut -d' ' -f1 <<<"$KEY")"
if [[ -d $STAGE ]] && stamp_ok "$WORK/.stamp" "$KEY"; then
	log "up to date: $STAGE"
	exit 0
fi
prepare_source
sync_our_sources
configure
build_and_stage
stamp_set "$WORK/.stamp" "$KEY"
log "done: $STAGE"
