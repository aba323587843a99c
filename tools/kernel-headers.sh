#!/usr/bin/env bash
# Kernel build dir of one of Debian 12's two kernels, for out-of-tree builds
# of vt3.ko, unpacked from Debian's packages (nothing is installed into /):
#
#   tools/kernel-headers.sh 6.1    the kernel linux-headers-amd64 points at
#   tools/kernel-headers.sh 6.12   the kernel linux-headers-6.12-amd64 points at
#                                  (bookworm's newest 6.12)
#
# Prints the build dir: make -C "$(tools/kernel-headers.sh 6.12)" M=$PWD
#
# The headers, -common headers and kbuild packages of that version are
# downloaded with apt-get download into $VT3_CACHE/kernel-headers/debs and
# unpacked into $VT3_CACHE/kernel-headers/<kver>/root, keyed by the package
# version and this script, so a second call only asks apt which version is
# current. As root on a fresh Debian 12 machine, the host packages a module
# build needs are installed. Progress goes to stderr, the path to stdout.
set -euo pipefail
export LC_ALL=C

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=cache-dir.sh
source "$REPO/tools/cache-dir.sh"
CACHE=$VT3_CACHE/kernel-headers
SELF=$(realpath "${BASH_SOURCE[0]}")

# What building a module against the unpacked headers needs beyond Debian's
# essential set (as in images/build.sh):
#   make, gcc-12          the headers' Makefile names gcc-12 (both kernels)
#   binutils              ld for modules
# plus whatever the kbuild package depends on: the runtime libs of its
# prebuilt objtool/modpost (libelf1, libssl3), and for 6.12 pahole, which
# generates a module's BTF against the vmlinux the 6.12 headers ship.
HOST_PACKAGES=(make gcc-12 binutils)

die() {
	printf 'kernel-headers.sh: error: %s\n' "$*" >&2
	exit 1
}
log() { printf 'kernel-headers.sh: %s\n' "$*" >&2; }

usage() { sed -n '2,/^set -euo/p' "$SELF" | sed '$d; s/^# \{0,1\}//'; }

case ${1:-} in
6.1) META=linux-headers-amd64 ;;
6.12) META=linux-headers-6.12-amd64 ;;
-h | --help)
	usage
	exit 0
	;;
*) die "usage: tools/kernel-headers.sh 6.1|6.12" ;;
esac
SERIES=$1

# shellcheck source=apt.sh
source "$REPO/tools/apt.sh"

# The Depends of PKG[=VER], one a line, first alternatives only.
depends() {
	apt-cache show --no-all-versions "$1" 2>/dev/null |
		sed -n 's/^Depends: *//p' | tr ',' '\n' | sed 's/^ *//; s/ *|.*//'
}

# "NAME VERSION" of the first exact (=) dependency of PKG[=VER] whose name
# matches the basic regex RE.
exact_dep() {
	depends "$1" | sed -n "s/^\($2\) *(= *\([^ )]*\)).*/\1 \2/p" | head -n1
}

# Sets KVER (6.12.117+deb12-amd64), VER (6.12.117-1~deb12u1) and PKGS, from
# what the meta package depends on right now: old ABI packages leave the
# mirror, so no version is written down here.
resolve() {
	local dep hdr common kbuild
	dep=$(exact_dep "$META" 'linux-headers-[^ ]*')
	[[ -n $dep ]] || return 1
	hdr=${dep% *} VER=${dep#* }
	KVER=${hdr#linux-headers-}
	common=$(exact_dep "$hdr=$VER" 'linux-headers-[^ ]*-common' | cut -d' ' -f1)
	# linux-kbuild-6.1 is versioned >=, linux-kbuild-6.12.N+deb12 not at all:
	# take the one of the same source version either way.
	kbuild=$(depends "$hdr=$VER" | sed -n 's/^\(linux-kbuild-[^ ]*\).*/\1/p' | head -n1)
	[[ -n $common && -n $kbuild ]] || die "cannot find the -common and kbuild packages of $hdr=$VER"
	PKGS=("$hdr" "$common" "$kbuild")
	# shellcheck disable=SC2207 # package names have no blanks
	KBUILD_DEPS=($(depends "$kbuild=$VER" | sed 's/[ (:].*//'))
}

resolve_cached() {
	local file=$CACHE/resolved-$SERIES.sh key
	key="$(apt_state_key) $(declare -f resolve depends exact_dep | sha256sum | cut -c1-16)"
	if [[ -f $file && "$(head -n1 "$file")" == "# $key" ]]; then
		# shellcheck source=/dev/null
		source "$file"
		return 0
	fi
	resolve || return 1
	{
		echo "# $key"
		declare -p VER KVER PKGS KBUILD_DEPS | sed 's/^declare -/declare -g -/'
	} >"$file.tmp"
	mv "$file.tmp" "$file"
}

# Path of the cached .deb of PKG at VER (apt encodes ':' of an epoch as %3a).
deb_path() {
	local f
	for f in "$CACHE/debs/${1}_${VER//:/%3a}_"*.deb; do
		[[ -f $f ]] && printf '%s\n' "$f" && return 0
	done
	return 1
}

# Downloads what is not cached yet; fails quietly so the caller can retry
# after an apt-get update.
fetch() {
	local want=() p tmp=$CACHE/debs/.partial
	for p in "${PKGS[@]}"; do deb_path "$p" >/dev/null || want+=("$p=$VER"); done
	((${#want[@]})) || return 0
	log "downloading ${want[*]}"
	# A scratch dir, so an interrupted download never looks cached.
	rm -rf "$tmp" && mkdir -p "$tmp"
	(cd "$tmp" && apt-get download -qq "${APT_OPTS[@]}" "${want[@]}" >&2) || return 1
	mv "$tmp"/*.deb "$CACHE/debs/"
	rmdir "$tmp"
}

# The packages assume they are installed in /: the arch headers' Makefile
# includes /usr/src/linux-headers-*-common/Makefile by absolute path. Point
# it into ROOT (the relative symlinks to ../../lib/linux-kbuild-* resolve
# once all three packages share one root). TMP is where the packages are
# unpacked, ROOT where that directory will be.
fixup_paths() {
	local tmp=$1 root=$2 mk=$1/usr/src/linux-headers-$KVER/Makefile
	grep -q '^include /usr/src/' "$mk" || die "unexpected $mk (no 'include /usr/src/...')"
	sed -i "s|^include /usr/src/|include $root/usr/src/|" "$mk"
}

unpack() {
	local dir=$CACHE/$KVER key p
	key="$VER $(sha256sum "$SELF" | cut -c1-16)"
	[[ -f $dir/stamp && "$(<"$dir/stamp")" == "$key" && -d $dir/root ]] && return 0
	log "unpacking ${PKGS[*]} ($VER)"
	rm -rf "$dir/root" "$dir/root.tmp" && mkdir -p "$dir/root.tmp"
	for p in "${PKGS[@]}"; do
		dpkg -x "$(deb_path "$p")" "$dir/root.tmp" || die "dpkg -x of $p failed"
	done
	fixup_paths "$dir/root.tmp" "$dir/root"
	mv "$dir/root.tmp" "$dir/root"
	[[ -f $dir/root/usr/src/linux-headers-$KVER/Module.symvers ]] ||
		die "kernel build dir of $KVER is incomplete"
	printf '%s\n' "$key" >"$dir/stamp"
}

mkdir -p "$CACHE/debs"
# One unpack per cache at a time; two would race on the same directories.
exec 9>"$CACHE/.lock"
flock 9
if ! resolve_cached; then
	apt_update_once || die "Debian package '$META' not found (apt-cache show $META)"
	resolve_cached || die "Debian package '$META' not found after apt-get update"
fi
if ! fetch; then
	# The lists name a version the mirror dropped: refresh, resolve again.
	apt_update_once || die "apt-get download failed for: ${PKGS[*]} ($VER)"
	resolve_cached || die "Debian package '$META' not found after apt-get update"
	fetch || die "apt-get download failed for: ${PKGS[*]} ($VER)"
fi
HOST_PACKAGES+=("${KBUILD_DEPS[@]}")
ensure_host_packages
unpack
printf '%s\n' "$CACHE/$KVER/root/usr/src/linux-headers-$KVER"
