#!/usr/bin/env bash
# Build the vt3 guest images from Debian packages:
#   OUT/vmlinuz             Debian's kernel: the ABI package linux-image-amd64 (6.1) or
#                           linux-image-6.12-amd64 (6.12) points at today
#   OUT/vmlinux             the same kernel uncompressed (ELF, PVH entry): QEMU boots it
#                           directly, ~5 s sooner under TCG than vmlinuz, which must
#                           first unpack itself (xz) in the emulated CPU
#   OUT/initramfs.cpio.gz   busybox + rdma-core + perftest + iproute2 + netcat, the
#                           kernel modules we need, siw.ko built from Debian's own
#                           kernel source, and images/init as /init
#   OUT/initramfs-python.cpio.gz  Debian's python3, a layer over initramfs.cpio.gz for the
#                           guests that run rdma-core's own test suite (pyverbs)
#   OUT/kver                kernel release, e.g. 6.1.0-57-amd64
#   OUT/kbuild-dir          kernel build dir for out-of-tree modules (make -C $(cat ..) M=..)
#   OUT/manifest.txt        every package and module that went in, with versions
#
# Usage: images/build.sh [--kernel 6.1|6.12] [--out DIR] [--clean]
#   --kernel S  which of Debian 12's two kernels (default 6.1)
#   --out DIR   output directory (default $VT3_CACHE/images for 6.1,
#               $VT3_CACHE/images-6.12 for 6.12: both images coexist)
#   --clean     wipe the cache ($VT3_CACHE/image-build) first
#
# VT3_CACHE: tools/cache-dir.sh (/var/cache/vt3 for root), outside the clone.
#
# Everything downloaded or built is cached, keyed by package versions and by the
# content of the inputs (images/build.sh, images/init), so an unchanged rebuild
# takes a fraction of a second. Same versions and inputs give the same bytes.
set -euo pipefail
export LC_ALL=C

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
IMAGES=$REPO/images
# shellcheck source=../tools/cache-dir.sh
source "$REPO/tools/cache-dir.sh"
OUT=
CACHE=$VT3_CACHE/image-build
CLEAN=0
# Which of Debian 12's kernels (--kernel): its series and the meta package
# whose Depends names the current ABI package.
SERIES=6.1

# Kernel modules for the guest. Their dependencies are added from modules.dep;
# names that are built into the Debian kernel (ipv6, 8250) are skipped.
# qemu_fw_cfg: the firmware configuration files in /sys/firmware/qemu_fw_cfg,
# where vt3.ko reads its key (QEMU -fw_cfg name=opt/vt3/key).
KERNEL_MODULES=(
	virtio_pci virtio_net net_failover failover qemu_fw_cfg
	ib_core ib_uverbs ib_cm iw_cm rdma_cm rdma_ucm rdma_rxe siw
	crc32_generic crc32c_generic libcrc32c
	ipv6
	nvme-rdma nvmet-rdma brd
	nfsd nfs nfsv4 rpcrdma
	target_core_iblock iscsi_target_mod ib_isert ib_iser sd_mod
	9p 9pnet_virtio
)

# Guest user space. Shared libraries they need are found by scanning NEEDED
# entries and taken from the packages' (recursive) lib* dependencies.
# - busybox, not busybox-static: the static build prefers its own applets over
#   PATH (so `nc -N`, `ip`, `timeout nc` would run busybox's versions); the
#   dynamic one honours PATH, so the Debian tools below win.
# - libgcc-s1: glibc dlopens libgcc_s for pthread_cancel/exit; rping aborts
#   without it, and nothing lists it as NEEDED.
GUEST_PACKAGES=(
	busybox libc6 libgcc-s1
	libibverbs1 librdmacm1 ibverbs-providers ibverbs-utils rdmacm-utils perftest
	iproute2 netcat-openbsd
	nvme-cli fio
	nfs-kernel-server nfs-common netbase
	open-iscsi
)

# Python for rdma-core's test suite (pyverbs; images/overlay.sh adds pyverbs
# and the tests). Only the `pyverbs` case runs it, so it is a layer of its
# own (initramfs-python.cpio.gz), not part of the base every guest boots:
# with its libraries it is about 30 MB unpacked. The stdlib packages
# suffice: the suite imports only the standard library and pyverbs. Debian
# 12's python3 is 3.11, the interpreter provider/build-rdma-core.sh builds
# pyverbs for; pyverbs' modules link libpython3.11.so.1.0 (rdma-core's
# cmake links them with the Python library, as in Debian's python3-pyverbs).
PYTHON_PACKAGES=(python3-minimal python3.11-minimal libpython3.11-minimal libpython3.11-stdlib libpython3.11)

# Libraries fio links only for engines the guest never runs (rbd/rados,
# glusterfs, nbd, pmem). With what they pull in (ceph, glusterfs, gnutls,
# ICU) they are ~75 MB, three times the rest of the image; the guest gets a
# stub of each instead: same soname and symbol versions, every function
# prints which engine is missing and aborts. The packages are downloaded
# (their symbol tables say what a stub exports), their dependencies are not.
STUB_PACKAGES=(librados2 librbd1 libgfapi0 libnbd0 libpmem1 libpmemblk1)

# Links Debian's maintainer scripts make with update-alternatives (dpkg -x
# runs none): LINK=TARGET, relative to the guest root.
ALTERNATIVES=(usr/bin/nc=nc.openbsd)

# Host packages the build needs beyond Debian's essential set (apt, dpkg, tar,
# gzip, coreutils, findutils, sed, grep, libc-bin are always there).
#   make, gcc-12          out-of-tree build of siw (the headers' Makefile says gcc-12)
#   binutils              ld for modules, objdump (NEEDED scan), strip
#   libelf1, libssl3      runtime libs of linux-kbuild's prebuilt objtool/modpost/sign-file
#   kmod                  depmod, modprobe --show-depends
#   xz-utils              the kernel source tarball is .tar.xz; 6.12's modules are .ko.xz
#   cpio                  the initramfs
#   zstd                  the 6.12 kernel image is zstd-compressed (vmlinux)
HOST_PACKAGES=(make gcc-12 binutils libelf1 libssl3 kmod xz-utils zstd cpio)
# Tools from packages of priority "required" (not "essential"): checked too.
HOST_TOOLS=(awk:mawk apt-get:apt apt-cache:apt)

# Files under images/ that end up in the initramfs; their content keys the cache.
IMAGE_INPUTS=("$IMAGES/build.sh" "$IMAGES/init")

# ---------------------------------------------------------------- utilities

START=$SECONDS
log() { printf '[%3ds] %s\n' $((SECONDS - START)) "$*" >&2; }
die() {
	printf 'build.sh: error: %s\n' "$*" >&2
	exit 1
}

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

# A stamp file holds the key of what was built next to it; equal key = up to date.
stamp_ok() { [[ -f $1 && "$(<"$1")" == "$2" ]]; }
stamp_set() { printf '%s\n' "$2" >"$1"; }

# Hash of shell functions: a step is rebuilt when the code doing it changes.
fn_hash() { declare -f "$@" | sha256sum | cut -c1-16; }

parse_args() {
	while (($#)); do
		case $1 in
		--out)
			[[ $# -ge 2 ]] || die "--out needs a directory"
			OUT=$2
			shift 2
			;;
		--out=*)
			OUT=${1#--out=}
			shift
			;;
		--kernel)
			[[ $# -ge 2 ]] || die "--kernel needs 6.1 or 6.12"
			SERIES=$2
			shift 2
			;;
		--kernel=*)
			SERIES=${1#--kernel=}
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
	case $SERIES in
	6.1) KMETA=linux-image-amd64 OUT=${OUT:-$VT3_CACHE/images} ;;
	6.12) KMETA=linux-image-6.12-amd64 OUT=${OUT:-$VT3_CACHE/images-6.12} ;;
	*) die "--kernel: '$SERIES' is not one of Debian 12's kernels (6.1, 6.12)" ;;
	esac
	mkdir -p "$OUT"
	OUT=$(cd "$OUT" && pwd)
}

# Only one build per cache at a time: two would race on the same directories.
lock_cache() {
	mkdir -p "$CACHE"
	exec 9>"$CACHE/.lock"
	if ! flock -n 9; then
		log "cache $CACHE is locked by another build; waiting"
		flock 9
	fi
}

# ---------------------------------------------------------------- host setup

APT_UPDATED=0
apt_update_once() {
	((APT_UPDATED == 0)) && [[ $EUID -eq 0 ]] || return 1
	APT_UPDATED=1
	log "apt-get update"
	apt-get update -qq >&2 || die "apt-get update failed"
}

ensure_host_packages() {
	[[ $(dpkg --print-architecture) == amd64 ]] || die "the build host must be amd64 (Debian 12)"
	local missing=() p t
	for p in "${HOST_PACKAGES[@]}"; do
		[[ $(dpkg-query -W -f='${Status}' "$p" 2>/dev/null) == "install ok installed" ]] || missing+=("$p")
	done
	for t in "${HOST_TOOLS[@]}"; do
		command -v "${t%%:*}" >/dev/null || missing+=("${t#*:}")
	done
	((${#missing[@]})) || return 0
	[[ $EUID -eq 0 ]] ||
		die "missing host packages: ${missing[*]} (run as root, or: apt-get install ${missing[*]})"
	log "installing host packages: ${missing[*]}"
	if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2; then
		apt_update_once || true
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2 ||
			die "could not install host packages: ${missing[*]}"
	fi
}

# ---------------------------------------------------------------- apt helpers

# apt as root drops to the _apt user, which cannot write into our cache.
APT_OPTS=()
[[ $EUID -ne 0 ]] || APT_OPTS=(-o APT::Sandbox::User=root)

# Path of the cached .deb of PKG=VER (apt encodes ':' of an epoch as %3a).
deb_path() {
	local f
	for f in "$CACHE/debs/${1}_${2//:/%3a}_"*.deb; do
		[[ -f $f ]] && printf '%s\n' "$f" && return 0
	done
	return 1
}

# Download PKG=VER... into the cache unless already there.
fetch_debs() {
	local want=() pv
	for pv in "$@"; do deb_path "${pv%%=*}" "${pv#*=}" >/dev/null || want+=("$pv"); done
	((${#want[@]})) || return 0
	log "downloading ${#want[@]} package(s): ${want[*]}"
	# Download into a scratch dir so an interrupted download never looks cached.
	local tmp=$CACHE/debs/.partial
	rm -rf "$tmp" && mkdir -p "$tmp"
	if ! (cd "$tmp" && apt-get download -qq "${APT_OPTS[@]}" "${want[@]}" >&2); then
		apt_update_once || die "apt-get download failed for: ${want[*]}"
		(cd "$tmp" && apt-get download -qq "${APT_OPTS[@]}" "${want[@]}" >&2) ||
			die "apt-get download failed for: ${want[*]} (not on the mirror any more?)"
	fi
	mv "$tmp"/*.deb "$CACHE/debs/"
	rmdir "$tmp"
}

# Extract PKG=VER into DIR (its own directory) unless already done.
extract_deb_dir() {
	local pkg=$1 ver=$2 dir=$3 deb
	deb=$(deb_path "$pkg" "$ver") || die "internal: $pkg=$ver not downloaded"
	stamp_ok "$dir/.vt3-extracted" "$(basename "$deb")" && return 0
	rm -rf "$dir" && mkdir -p "$dir"
	dpkg -x "$deb" "$dir" || die "dpkg -x $deb failed"
	stamp_set "$dir/.vt3-extracted" "$(basename "$deb")"
}

# ---------------------------------------------------------------- kernel

# Sets KVER (6.1.0-57-amd64, 6.12.117+deb12-amd64), KPKGVER (6.1.192-3),
# KSRCVER, KSERIES (6.1) and the package names, from what the meta package
# (KMETA: linux-image-amd64 or linux-image-6.12-amd64) depends on right now:
# old ABI packages leave the mirror, so the version is never hard-coded.
resolve_kernel() {
	local meta dep
	meta=$(apt-cache show --no-all-versions "$KMETA" 2>/dev/null || true)
	if [[ -z $meta ]] && apt_update_once; then
		meta=$(apt-cache show --no-all-versions "$KMETA" 2>/dev/null || true)
	fi
	[[ -n $meta ]] || die "Debian package '$KMETA' not found (apt-cache show $KMETA)"
	dep=$(awk '$1 == "Depends:"' <<<"$meta" | tr ',' '\n' |
		sed -n 's/^.*\(linux-image-[0-9][^ ]*\) *(= *\([^ )]*\)).*/\1 \2/p' | head -n1)
	[[ -n $dep ]] || die "cannot find the ABI package in the Depends of $KMETA"
	KIMAGE_PKG=${dep% *}
	KPKGVER=${dep#* }
	KVER=${KIMAGE_PKG#linux-image-}            # 6.1.0-57-amd64, 6.12.117+deb12-amd64
	local abi=${KVER%-amd64}                   # 6.1.0-57, 6.12.117+deb12
	KSERIES=$(cut -d. -f1,2 <<<"$KVER")        # 6.1
	[[ $KSERIES == "$SERIES" ]] || die "$KMETA points at $KVER, not a $SERIES kernel"
	KHEADERS_PKG=linux-headers-$KVER
	KCOMMON_PKG=linux-headers-$abi-common
	KSOURCE_PKG=linux-source-$KSERIES
	# linux-source-X must be the source the headers were built from: the
	# headers' Source field names it (no version in it = same as the binary).
	local hdr
	hdr=$(apt-cache show "$KHEADERS_PKG=$KPKGVER" 2>/dev/null || true)
	[[ -n $hdr ]] || die "Debian package $KHEADERS_PKG=$KPKGVER not found"
	KSRCVER=$(awk '$1 == "Source:" && $3 ~ /^\(/ { gsub(/[()]/, "", $3); print $3 }' <<<"$hdr")
	KSRCVER=${KSRCVER:-$KPKGVER}
	# The kbuild package the headers depend on: linux-kbuild-6.1 (>= VER)
	# for 6.1, linux-kbuild-6.12.117+deb12 (unversioned) for 6.12; the one
	# of the same source version either way.
	KKBUILD_PKG=$(awk '$1 == "Depends:"' <<<"$hdr" | tr ',' '\n' |
		sed -n 's/^ *\(linux-kbuild-[^ ]*\).*/\1/p' | head -n1)
	[[ -n $KKBUILD_PKG ]] || die "cannot find the linux-kbuild package in the Depends of $KHEADERS_PKG"
	# What its prebuilt tools need on the host: libelf1, libssl3, and for
	# 6.12 pahole (a module's BTF is generated against the headers' vmlinux).
	# shellcheck disable=SC2207 # package names have no blanks
	KBUILD_DEPS=($(apt-cache show --no-all-versions "$KKBUILD_PKG=$KPKGVER" 2>/dev/null |
		awk '$1 == "Depends:"' | sed 's/^Depends: *//' | tr ',' '\n' | sed 's/^ *//; s/[ (:|].*//'))
}

# Paths derived from the resolved kernel version.
kernel_paths() {
	KDIR=$CACHE/kernel/$KVER
	KROOT=$KDIR/root
	KBUILD_DIR=$KROOT/usr/src/linux-headers-$KVER
}

# Image, headers and kbuild unpacked into one root so the headers' relative
# symlinks (scripts -> ../../lib/linux-kbuild-6.1/scripts) resolve.
extract_kernel() {
	fetch_debs "$KIMAGE_PKG=$KPKGVER" "$KHEADERS_PKG=$KPKGVER" \
		"$KCOMMON_PKG=$KPKGVER" "$KKBUILD_PKG=$KPKGVER"
	local key p
	key="$KPKGVER $(fn_hash extract_kernel fixup_kbuild_paths)"
	stamp_ok "$KDIR/extract.stamp" "$key" && [[ -d $KROOT ]] && return 0
	log "extracting kernel packages"
	rm -rf "$KROOT" && mkdir -p "$KROOT"
	for p in "$KIMAGE_PKG" "$KHEADERS_PKG" "$KCOMMON_PKG" "$KKBUILD_PKG"; do
		dpkg -x "$(deb_path "$p" "$KPKGVER")" "$KROOT" || die "dpkg -x of $p failed"
	done
	fixup_kbuild_paths
	rm -f "$KDIR/siw.stamp"
	stamp_set "$KDIR/extract.stamp" "$key"
}

# The packages assume they are installed in /: the arch headers' Makefile
# includes /usr/src/linux-headers-*-common/Makefile by absolute path, and
# lib/modules/VER/{build,source} are absolute symlinks. Point them into KROOT.
fixup_kbuild_paths() {
	local mk=$KBUILD_DIR/Makefile
	grep -q '^include /usr/src/' "$mk" || die "unexpected $mk (no 'include /usr/src/...')"
	sed -i "s|^include /usr/src/|include $KROOT/usr/src/|" "$mk"
	local mods=$KROOT/lib/modules/$KVER
	ln -sfn "../../../usr/src/linux-headers-$KVER" "$mods/build"
	ln -sfn "../../../usr/src/${KCOMMON_PKG}" "$mods/source"
	[[ -f $mods/build/Module.symvers ]] || die "kernel build dir $mods/build is incomplete"
}

# siw is not in Debian's kernel config: build it out of tree from the matching
# linux-source package, against the extracted headers.
build_siw() {
	local key
	key="$KSRCVER $(fn_hash build_siw extract_siw_source)"
	if stamp_ok "$KDIR/siw.stamp" "$key" && [[ -f $KROOT/lib/modules/$KVER/extra/siw.ko ]]; then
		return 0
	fi
	extract_siw_source
	log "building siw.ko"
	local b=$KDIR/siw-build
	rm -rf "$b" && cp -r "$KDIR/siw-src" "$b"
	# -ffile-prefix-map: no cache path in the module (__FILE__, DWARF, and so
	# the build-id), so siw.ko does not depend on where the cache is.
	if ! make -C "$KBUILD_DIR" M="$b" CONFIG_RDMA_SIW=m -j"$(nproc)" \
		KCFLAGS="-ffile-prefix-map=$b/=drivers/infiniband/sw/siw/ -ffile-prefix-map=$KROOT/=/" \
		modules >"$KDIR/siw-build.log" 2>&1; then
		tail -n 30 "$KDIR/siw-build.log" >&2
		die "building siw failed (log: $KDIR/siw-build.log)"
	fi
	# Debian strips its modules; an unstripped siw.ko is ~5 MB of DWARF.
	strip --strip-debug -o "$b/siw.stripped.ko" "$b/siw.ko"
	install -D -m 644 "$b/siw.stripped.ko" "$KROOT/lib/modules/$KVER/extra/siw.ko"
	run_depmod "$KROOT"
	stamp_set "$KDIR/siw.stamp" "$key"
}

# Only drivers/infiniband/sw/siw, streamed out of the 140 MB source tarball.
extract_siw_source() {
	fetch_debs "$KSOURCE_PKG=$KSRCVER"
	local key src=$KDIR/siw-src
	key=$(basename "$(deb_path "$KSOURCE_PKG" "$KSRCVER")")
	stamp_ok "$src/.vt3-extracted" "$key" && return 0
	log "extracting siw source from $KSOURCE_PKG"
	rm -rf "$src" "$KDIR/siw-tmp" && mkdir -p "$KDIR/siw-tmp"
	dpkg-deb --fsys-tarfile "$(deb_path "$KSOURCE_PKG" "$KSRCVER")" |
		tar -xO "./usr/src/linux-source-$KSERIES.tar.xz" |
		tar -xJ -C "$KDIR/siw-tmp" --wildcards '*/drivers/infiniband/sw/siw/*' ||
		die "extracting drivers/infiniband/sw/siw from $KSOURCE_PKG failed"
	mv "$KDIR/siw-tmp"/*/drivers/infiniband/sw/siw "$src"
	rm -rf "$KDIR/siw-tmp"
	[[ -f $src/siw_main.c ]] || die "no siw source in $KSOURCE_PKG"
	stamp_set "$src/.vt3-extracted" "$key"
}

# The kernel .deb ships no modules.dep. Its System.map is a stub, which is
# fine: depmod only needs it for the symbol checks we do not ask for (-e).
run_depmod() {
	depmod -b "$1" -F "$KROOT/boot/System.map-$KVER" "$KVER" || die "depmod -b $1 failed"
}

# ---------------------------------------------------------------- user space

# Resolves GUEST_PACKAGES and PYTHON_PACKAGES plus the closure of their library dependencies
# (first alternative of each Depends/Pre-Depends) into POOL_PKGS[name]=version.
# Only library packages are followed: that keeps debconf, adduser, passwd,
# PAM... out, and the NEEDED scan decides which of the pool really goes in.
declare -A POOL_PKGS=()
resolve_guest_packages() {
	local p queue=("${GUEST_PACKAGES[@]}" "${PYTHON_PACKAGES[@]}") next missing=()
	POOL_PKGS=()
	declare -A seen=() explicit=()
	for p in "${queue[@]}"; do seen[$p]=1 explicit[$p]=1; done
	declare -A stub=()
	for p in "${STUB_PACKAGES[@]}"; do stub[$p]=1; done
	while ((${#queue[@]})); do
		next=()
		local name ver section deps d
		while read -r name ver section deps; do
			# Follow library packages only (lib*, or zlib1g & co in section libs).
			[[ $name == lib* || $section == libs || $section == oldlibs || -n ${explicit[$name]+x} ]] || continue
			POOL_PKGS[$name]=$ver
			[[ -z ${stub[$name]+x} ]] || continue
			for d in $deps; do
				[[ -z ${seen[$d]+x} ]] || continue
				seen[$d]=1
				next+=("$d")
			done
		# apt-cache show skips names without a candidate (virtual packages):
		# they stay out of the pool, and the NEEDED check names any library
		# that turns out to be missing.
		done < <(apt-cache show --no-all-versions "${queue[@]}" 2>/dev/null | awk '
			/^Package:/ { pkg = $2 }
			/^Version:/ { ver = $2 }
			/^Section:/ { sec = $2 }
			/^(Pre-)?Depends:/ {
				sub(/^[^:]*: */, "")
				n = split($0, clause, /, */)
				for (i = 1; i <= n; i++) {
					split(clause[i], alt, / *\| */)   # first alternative
					sub(/ .*/, "", alt[1]); sub(/:.*/, "", alt[1])
					deps = deps " " alt[1]
				}
			}
			/^$/ { if (pkg != "") print pkg, ver, sec, deps; pkg = ""; deps = "" }
			END { if (pkg != "") print pkg, ver, sec, deps }')
		queue=("${next[@]}")
	done
	for p in "${GUEST_PACKAGES[@]}" "${PYTHON_PACKAGES[@]}"; do [[ -n ${POOL_PKGS[$p]+x} ]] || missing+=("$p"); done
	MISSING=${missing[*]}
	[[ -z $MISSING ]]
}

# Versions depend only on apt's view of the archive: reuse the last answer
# while the package lists, sources and dpkg status are unchanged (apt-cache
# is slow where its binary cache is disabled, as in Docker-built images).
apt_state_key() {
	{
		find /var/lib/apt/lists /etc/apt -maxdepth 2 -type f -printf '%p %s %T@\n' 2>/dev/null
		stat -c '%n %s %Y' /var/lib/dpkg/status
	} | sort | sha256sum | cut -c1-16
}

resolve_versions() {
	local key file=$CACHE/resolved-$SERIES.sh
	key="$(apt_state_key) $(fn_hash resolve_kernel resolve_guest_packages) $KMETA ${GUEST_PACKAGES[*]} python ${PYTHON_PACKAGES[*]} stubs ${STUB_PACKAGES[*]}"
	if [[ -f $file && "$(head -n1 "$file")" == "# $key" ]]; then
		# shellcheck source=/dev/null
		source "$file"
	else
		log "resolving package versions"
		resolve_kernel
		if ! resolve_guest_packages; then
			apt_update_once || die "Debian package(s) not found: $MISSING"
			resolve_guest_packages || die "Debian package(s) not found: $MISSING"
		fi
		# An apt-get update on the way changed the state the answer belongs to.
		key="$(apt_state_key) ${key#* }"
		{
			echo "# $key"
			declare -p KIMAGE_PKG KPKGVER KSRCVER KVER KSERIES KHEADERS_PKG KCOMMON_PKG \
				KKBUILD_PKG KBUILD_DEPS KSOURCE_PKG POOL_PKGS | sed 's/^declare -/declare -g -/'
		} >"$file.tmp"
		mv "$file.tmp" "$file"
	fi
	kernel_paths
	log "kernel $KVER (package $KPKGVER, source $KSRCVER); ${#POOL_PKGS[@]} guest packages"
}

# Download and unpack the guest package pool.
fetch_guest_packages() {
	local p pv=()
	for p in "${!POOL_PKGS[@]}"; do pv+=("$p=${POOL_PKGS[$p]}"); done
	fetch_debs "${pv[@]}"
	for p in "${!POOL_PKGS[@]}"; do
		extract_deb_dir "$p" "${POOL_PKGS[$p]}" "$CACHE/pkgs/$p"
	done
}

# soname -> pool package, from the shared objects each extracted package holds.
declare -A SONAME_PKG=()
index_sonames() {
	local p f
	for p in "${!POOL_PKGS[@]}"; do
		while IFS= read -r f; do
			[[ -n ${SONAME_PKG[$f]+x} ]] || SONAME_PKG[$f]=$p
		done < <(find "$CACHE/pkgs/$p" -path '*/lib/*' -name '*.so*' \( -type f -o -type l \) -printf '%f\n')
	done
}

# Paths (relative to a package root) that a minimal guest does not need.
ROOTFS_EXCLUDES=(
	./usr/share/doc ./usr/share/man ./usr/share/info ./usr/share/locale
	./usr/share/lintian ./usr/share/bug ./usr/share/bash-completion ./usr/share/zsh
	./usr/share/doc-base ./usr/share/pci.ids ./usr/lib/x86_64-linux-gnu/gconv
	./usr/lib/x86_64-linux-gnu/tc # tc qdisc plugins; q_atm.so needs libatm1
	./.vt3-extracted
)

declare -A INSTALLED=()
STUBBED=()
install_pkg() {
	local p=$1 ex=() e
	[[ -z ${INSTALLED[$p]+x} ]] || return 0
	INSTALLED[$p]=1
	for e in "${ROOTFS_EXCLUDES[@]}"; do ex+=("--exclude=$e"); done
	# The rootfs is merged-/usr (bin -> usr/bin, ...): keep those symlinks
	# when a package ships files under /bin or /lib.
	tar -C "$CACHE/pkgs/$p" "${ex[@]}" -cf - . | tar -C "$ROOTFS" --keep-directory-symlink -xf -
}

# "soname needed-by" for every NEEDED entry of every ELF file in the rootfs
# whose soname is not present in the library directories.
missing_sonames() {
	local libdirs=(usr/lib/x86_64-linux-gnu usr/lib usr/lib64)
	find "$ROOTFS/usr" -path "$ROOTFS/usr/lib/modules" -prune -o -type f -size +0 -print0 |
		{ xargs -0 objdump -p 2>/dev/null || true; } |
		awk '/: +file format elf/ { f = $1; sub(/:$/, "", f) } $1 == "NEEDED" { print $2, f }' |
		sort -u -k1,1 | while read -r so by; do
		local d found=0
		for d in "${libdirs[@]}"; do in_root "$d/$so" && found=1 && break; done
		((found)) || printf '%s %s\n' "$so" "${by#"$ROOTFS"}"
	done
}

# A stub for each library of STUB_PACKAGES that a guest program needs: the
# symbols it imports from that library (name and version node, from the real
# library's table), each a function that says what is missing and aborts.
install_stubs() {
	local p so real users dir=$CACHE/stubs
	rm -rf "$dir" && mkdir -p "$dir"
	for p in "${STUB_PACKAGES[@]}"; do
		while IFS= read -r real; do
			so=$(objdump -p "$real" | awk '$1 == "SONAME" { print $2 }')
			[[ -n $so ]] || continue
			# The guest programs that need it, and what they import.
			users=$(find "$ROOTFS/usr" -path "$ROOTFS/usr/lib/modules" -prune -o -type f -size +0 -print0 |
				{ xargs -0 objdump -p 2>/dev/null || true; } |
				awk -v so="$so" '/: +file format elf/ { f = $1; sub(/:$/, "", f) } $1 == "NEEDED" && $2 == so { print f }')
			[[ -n $users ]] || continue
			make_stub "$p" "$so" "$real" "$users" || die "making the stub of $so ($p) failed"
			install -m 644 "$dir/$so" "$ROOTFS/usr/lib/x86_64-linux-gnu/$so"
			STUBBED+=("$so")
		done < <(find "$CACHE/pkgs/$p" -path '*/lib/*' -name '*.so.*' -type f)
	done
}

make_stub() {
	local p=$1 so=$2 real=$3 users=$4 dir=$CACHE/stubs
	# "version name type" of every function or object REAL defines that a
	# user imports. objdump -T: ADDR FLAGS TYPE SECTION SIZE VERSION NAME
	# (FLAGS may be blank); versions of imports are "(V)".
	{
		objdump -T "$real" | awk 'NF >= 6 && $(NF-3) != "*UND*" && ($(NF-4) == "DF" || $(NF-4) == "DO") {
			v = $(NF-1); gsub(/[()]/, "", v); print "def", v, $NF, $(NF-4) }'
		xargs objdump -T <<<"$users" | awk 'NF >= 6 && $(NF-3) == "*UND*" {
			v = $(NF-1); gsub(/[()]/, "", v); print "use", v, $NF }'
	} | awk '$1 == "def" { def[$2 " " $3] = $4; next }
		$1 == "use" && ($2 " " $3) in def { print $2, $3, def[$2 " " $3] }' | sort -u >"$dir/$so.syms"
	[[ -s $dir/$so.syms ]] || die "no symbol of $so is used by ${users//$'\n'/ }"
	[[ -z $(awk '{ print $2 }' "$dir/$so.syms" | sort | uniq -d) ]] || die "$so: a symbol is used in two versions"
	{
		printf '/* stub of %s (%s), made by images/build.sh */\n' "$so" "$p"
		printf '#include <stdio.h>\n#include <stdlib.h>\n\n'
		printf 'static void stub(const char *f)\n{\n'
		printf '\tfprintf(stderr, "%%s: %s is a stub in the vt3 guest image (%s is not in it)\\n", f);\n' "$so" "$p"
		printf '\tabort();\n}\n\n'
		awk '$3 == "DF" { printf "void %s(void) { stub(\"%s\"); }\n", $2, $2 }
			$3 == "DO" { printf "char %s[64];\n", $2 }' "$dir/$so.syms"
	} >"$dir/$so.c"
	local vs=()
	if awk '$1 != "Base"' "$dir/$so.syms" | grep -q .; then
		awk '$1 == "Base" { exit 1 }' "$dir/$so.syms" || die "$so: versioned and unversioned symbols used"
		# One node per version, in order; each node's symbols global.
		awk '$1 != v { if (v != "") print "};"; v = $1; printf "%s {\n\tglobal:\n", v }
			{ printf "\t\t%s;\n", $2 } END { print "};" }' "$dir/$so.syms" >"$dir/$so.map"
		# One linker option: the comma is the option's own.
		# shellcheck disable=SC2054
		vs=(-Wl,--version-script="$dir/$so.map")
	fi
	gcc-12 -shared -fPIC -O2 -w -o "$dir/$so" -Wl,-soname,"$so" "${vs[@]}" "$dir/$so.c"
}

install_userspace() {
	local p
	for p in "${GUEST_PACKAGES[@]}"; do install_pkg "$p"; done
	install_stubs
	install_needed_libraries
}

# Add the packages providing missing libraries until nothing is missing.
install_needed_libraries() {
	local p _
	for _ in 1 2 3 4 5 6 7 8 9 10; do
		local missing so by added=0
		declare -A this_round=()
		missing=$(missing_sonames)
		[[ -n $missing ]] || return 0
		while read -r so by; do
			p=${SONAME_PKG[$so]:-}
			[[ -n $p ]] || die "no package in the dependency closure provides $so (needed by $by)"
			# One package may provide several of this round's sonames (libnvme1:
			# libnvme.so.1 and libnvme-mi.so.1); installed earlier, it should have.
			[[ -n ${this_round[$p]+x} ]] && continue
			[[ -n ${INSTALLED[$p]+x} ]] && die "$p is installed but $so (needed by $by) is still missing"
			install_pkg "$p"
			this_round[$p]=1
			added=1
		done <<<"$missing"
		((added)) || break
	done
	die "library resolution did not converge: $(missing_sonames | tr '\n' ' ')"
}

install_alternatives() {
	local a link target
	for a in "${ALTERNATIVES[@]}"; do
		link=${a%%=*} target=${a#*=}
		[[ -e $ROOTFS/$(dirname "$link")/$target ]] || die "alternative $link: no $target in the guest root"
		ln -sfn "$target" "$ROOTFS/$link"
	done
}

# in_root PATH: PATH (relative) exists in the guest root, as a file or as a
# link. Never `[[ -e ]]` alone: the guest's links are absolute
# (usr/bin/sh -> /usr/bin/busybox) and would be followed on the host.
in_root() { [[ -L $ROOTFS/$1 || -e $ROOTFS/$1 ]]; }

# Applet links for everything busybox does and no Debian package ships, so
# the real ip, nc, rdma... win. Asks the guest busybox itself (through the
# guest's own loader, so the host libc does not matter) for its applets.
install_busybox_links() {
	local bb=$ROOTFS/usr/bin/busybox applet dst
	[[ -x $bb ]] || die "busybox not found in the guest root"
	while read -r applet; do
		case $applet in
		bin/* | usr/bin/*) dst=usr/bin/${applet##*/} ;;
		sbin/* | usr/sbin/*) dst=usr/sbin/${applet##*/} ;;
		*) continue ;; # linuxrc
		esac
		# Skip names a package ships in either bin or sbin (ip is in both).
		in_root "usr/bin/${dst##*/}" || in_root "usr/sbin/${dst##*/}" || in_root "$dst" && continue
		ln -s /usr/bin/busybox "$ROOTFS/$dst"
	done < <("$ROOTFS/usr/lib64/ld-linux-x86-64.so.2" --library-path "$ROOTFS/usr/lib/x86_64-linux-gnu" \
		"$bb" --list-full)
	in_root usr/bin/sh || die "busybox has no sh applet"
}

# The requested modules and everything modules.dep says they need.
install_modules() {
	local m mods=() builtin=()
	for m in "${KERNEL_MODULES[@]}"; do
		local out
		out=$(modprobe -d "$KROOT" -S "$KVER" --show-depends "$m" 2>&1) ||
			die "kernel module $m not found in $KVER: $out"
		while read -r kind path _; do
			case $kind in
			insmod) mods+=("$path") ;;
			builtin) builtin+=("$path") ;;
			esac
		done <<<"$out"
	done
	local dst=$ROOTFS/usr/lib/modules/$KVER src=$KROOT/lib/modules/$KVER rel
	mkdir -p "$dst"
	for m in $(printf '%s\n' "${mods[@]}" | sort -u); do
		case $m in
		# Debian's 6.12 ships its modules xz-compressed. busybox's insmod
		# and modprobe load a module by reading the file and calling
		# init_module, which takes an ELF image only: unpack them here
		# (the initramfs is gzip'd anyway).
		*.ko.xz)
			rel=${m#"$src/"}
			mkdir -p "$(dirname "$dst/$rel")"
			{ xz -dc "$m" >"$dst/$rel" && mv "$dst/$rel" "$dst/${rel%.xz}"; } || die "unpacking $m failed"
			;;
		*.ko) install -D -m 644 "$m" "$dst/${m#"$src/"}" ;;
		*) die "kernel module $m: neither .ko nor .ko.xz" ;;
		esac
	done
	cp "$src"/modules.builtin "$src"/modules.builtin.modinfo "$src"/modules.order "$dst/"
	run_depmod "$ROOTFS"
	MODULE_LIST=$(cd "$dst" && find . -name '*.ko' | sed 's|.*/||; s|\.ko$||' | sort | tr '\n' ' ')
	log "modules: $(wc -w <<<"$MODULE_LIST") (built in: ${builtin[*]:-none})"
}

write_etc() {
	mkdir -p "$ROOTFS"/{proc,sys,dev,tmp,run,root,etc,var}
	chmod 1777 "$ROOTFS/tmp"
	ln -sfn /run "$ROOTFS/var/run"
	ln -sfn /tmp "$ROOTFS/var/tmp"
	cat >"$ROOTFS/etc/passwd" <<-'EOF'
		root:x:0:0:root:/root:/bin/sh
		statd:x:101:65534::/var/lib/nfs:/bin/false
		nobody:x:65534:65534:nobody:/nonexistent:/bin/false
	EOF
	cat >"$ROOTFS/etc/group" <<-'EOF'
		root:x:0:
		nogroup:x:65534:
	EOF
	cat >"$ROOTFS/etc/hosts" <<-'EOF'
		127.0.0.1	localhost
		::1		localhost ip6-localhost ip6-loopback
	EOF
	# Without nsswitch.conf glibc tries DNS first for host names.
	cat >"$ROOTFS/etc/nsswitch.conf" <<-'EOF'
		passwd: files
		group: files
		shadow: files
		hosts: files
		networks: files
		protocols: files
		services: files
	EOF
	# No ld.so.cache: Debian's loader searches the multiarch dirs by default.
	install -m 755 "$IMAGES/init" "$ROOTFS/init"
	ls "$ROOTFS"/etc/libibverbs.d/*.driver >/dev/null 2>&1 ||
		die "no /etc/libibverbs.d/*.driver in the guest root (ibverbs-providers?)"
}

write_manifest() {
	{
		echo "kernel $KVER $KPKGVER (source $KSRCVER)"
		echo "modules $MODULE_LIST"
		echo "stubs ${STUBBED[*]}"
		write_package_lines "${!INSTALLED[@]}"
	} >"$1"
}

write_package_lines() {
	local p
	for p in $(printf '%s\n' "$@" | sort); do echo "package $p ${POOL_PKGS[$p]}"; done
}

# newc cpio of the guest root's paths read from stdin (NUL-separated, in
# order), gzip'd into FILE.
write_cpio_gz() {
	(cd "$ROOTFS" && cpio --null -o -H newc -R 0:0 --reproducible --quiet) |
		gzip -6 -n >"$1.tmp"
	mv "$1.tmp" "$1"
}

# The python layer: PYTHON_PACKAGES and the libraries they need that the
# base lacks, installed over the finished base root (every path in it has
# mtime 0 by now); the paths they add make initramfs-python.cpio.gz.
write_python_layer() {
	local base_pkgs=("${!INSTALLED[@]}") base_files=$CACHE/base-files-$SERIES p
	(cd "$ROOTFS" && find . | sort) >"$base_files"
	for p in "${PYTHON_PACKAGES[@]}"; do install_pkg "$p"; done
	install_needed_libraries
	# A layer only adds: a file of the base replaced by it would differ
	# between the guests that have the layer and those that do not.
	local replaced
	replaced=$(cd "$ROOTFS" && find . ! -type d -newermt @1 | sort | comm -12 - "$base_files")
	[[ -z $replaced ]] || die "the python layer would replace files of the base: ${replaced//$'\n'/ }"
	declare -A in_base=()
	for p in "${base_pkgs[@]}"; do in_base[$p]=1; done
	local layer_pkgs=()
	for p in "${!INSTALLED[@]}"; do [[ -n ${in_base[$p]+x} ]] || layer_pkgs+=("$p"); done
	write_package_lines "${layer_pkgs[@]}" >"$ROOTFS/etc/vt3-manifest-python.txt"
	find "$ROOTFS" -newermt @1 -exec touch -h -d @0 {} +
	(cd "$ROOTFS" && find . | sort | comm -23 - "$base_files" | tr '\n' '\0') |
		write_cpio_gz "$OUT/initramfs-python.cpio.gz"
	cp "$ROOTFS/etc/vt3-manifest-python.txt" "$OUT/manifest-python.txt"
}

# ---------------------------------------------------------------- assembly

build_initramfs() {
	local key
	key=$(
		echo "kernel $KVER $KPKGVER"
		sha256sum "$KROOT/lib/modules/$KVER/extra/siw.ko" | cut -d' ' -f1
		printf '%s\n' "${KERNEL_MODULES[@]}" "${GUEST_PACKAGES[@]}" python "${PYTHON_PACKAGES[@]}"
		for p in $(printf '%s\n' "${!POOL_PKGS[@]}" | sort); do echo "$p=${POOL_PKGS[$p]}"; done
		sha256sum "${IMAGE_INPUTS[@]}" | cut -d' ' -f1
	)
	key=$(sha256sum <<<"$key" | cut -d' ' -f1)
	if stamp_ok "$OUT/.stamp" "$key" && [[ -f $OUT/initramfs.cpio.gz && -f $OUT/initramfs-python.cpio.gz && -f $OUT/vmlinuz ]]; then
		log "initramfs up to date"
		return 0
	fi
	index_sonames
	ROOTFS=$CACHE/rootfs-$SERIES
	log "assembling guest root in $ROOTFS"
	rm -rf "$ROOTFS" && mkdir -p "$ROOTFS"/usr/{bin,sbin,lib,lib64}
	local d
	for d in bin sbin lib lib64; do ln -s "usr/$d" "$ROOTFS/$d"; done
	install_userspace
	install_alternatives
	install_busybox_links
	install_modules
	write_etc
	write_manifest "$ROOTFS/etc/vt3-manifest.txt"

	log "writing initramfs.cpio.gz"
	# Fixed timestamps, owners and order: the same inputs give the same bytes.
	find "$ROOTFS" -exec touch -h -d @0 {} +
	(cd "$ROOTFS" && find . -print0 | sort -z) | write_cpio_gz "$OUT/initramfs.cpio.gz"
	cp "$KROOT/boot/vmlinuz-$KVER" "$OUT/vmlinuz"
	cp "$ROOTFS/etc/vt3-manifest.txt" "$OUT/manifest.txt"
	log "writing initramfs-python.cpio.gz"
	write_python_layer
	stamp_set "$OUT/.stamp" "$key"
}

# vmlinuz is a boot stub and a compressed ELF kernel (xz for 6.1, zstd for
# 6.12). The boot protocol header says where that payload is: the
# protected-mode code starts at (setup_sects + 1) * 512 (setup_sects at
# 0x1f1), the payload at payload_offset (0x248) into it, payload_length
# (0x24c) bytes long; its last 4 bytes are the unpacked size (LE).
write_vmlinux() {
	[[ -f $OUT/vmlinux && ! $OUT/vmlinuz -nt $OUT/vmlinux ]] && return 0
	local img=$OUT/vmlinuz setup off len size magic
	le() { od -An -t"u$2" -j "$1" -N "$2" "$img" | tr -d ' '; }
	[[ $(od -An -c -j 0x202 -N 4 "$img" | tr -d ' ') == HdrS ]] || die "$img: not a bzImage"
	setup=$(le $((0x1f1)) 1)
	off=$(((setup + 1) * 512 + $(le $((0x248)) 4)))
	len=$(le $((0x24c)) 4)
	size=$(le $((off + len - 4)) 4)
	magic=$(od -An -tx1 -j "$off" -N 6 "$img" | tr -d ' ')
	local unpack
	case $magic in
	fd377a585a00) unpack=(xz -dc --single-stream) ;;
	28b52ffd*) unpack=(zstd -dcq) ;;
	*) die "$img: payload at $off is neither xz nor zstd (magic $magic)" ;;
	esac
	# The payload less its size trailer is exactly one compressed stream.
	"${unpack[@]}" <(tail -c +$((off + 1)) "$img" | head -c $((len - 4))) >"$OUT/vmlinux.tmp" ||
		die "$img: its ${unpack[0]} payload does not unpack"
	[[ $(stat -c %s "$OUT/vmlinux.tmp") == "$size" ]] ||
		die "$img: the payload unpacks to $(stat -c %s "$OUT/vmlinux.tmp") bytes, the header says $size"
	[[ $(head -c 4 "$OUT/vmlinux.tmp" | od -An -tx1 | tr -d ' ') == 7f454c46 ]] ||
		die "$img: what it unpacks to is not an ELF kernel"
	mv "$OUT/vmlinux.tmp" "$OUT/vmlinux"
}

main() {
	parse_args "$@"
	if ((CLEAN)); then
		log "wiping cache $CACHE"
		rm -rf "$CACHE" "$OUT/.stamp"
	fi
	lock_cache
	mkdir -p "$CACHE/debs" "$CACHE/pkgs"
	ensure_host_packages
	resolve_versions
	HOST_PACKAGES+=("${KBUILD_DEPS[@]}")
	ensure_host_packages
	extract_kernel
	build_siw
	fetch_guest_packages
	build_initramfs
	write_vmlinux
	printf '%s\n' "$KVER" >"$OUT/kver"
	printf '%s\n' "$KBUILD_DIR" >"$OUT/kbuild-dir"
	log "done: $OUT/vmlinuz, $OUT/initramfs.cpio.gz ($(du -h "$OUT/initramfs.cpio.gz" | cut -f1)), kernel $KVER"
}

main "$@"
