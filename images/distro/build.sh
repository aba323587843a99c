#!/usr/bin/env bash
# A Debian 12 guest installed the way a user installs vt3: systemd, udev,
# Debian's kernel (linux-image-amd64, 6.1) and its headers, DKMS, and two
# sets of packages built here from their own Debian packaging:
#   - vt3-dkms (guest-driver/ with guest-driver/debian/): DKMS builds vt3.ko
#     against the image's kernel headers when the package is installed; its
#     udev rule loads vt3.ko when a virtio-net NIC appears;
#   - rdma-core 55 with libvt3 (rdma-core's own debian/, dpkg-buildpackage):
#     installed with apt over Debian's rdma-core 44, so Debian's perftest and
#     everything else use our libibverbs.
# Debian's part is an mmdebstrap directory (cached on its own, built while
# our packages build); ours go into a copy of it with apt in a chroot. The
# disk is an ext4 file system made from that directory with `mkfs.ext4 -d`
# (no loop device, no mount of the disk), converted to qcow2. The guest
# boots its own kernel directly: OUT/vmlinuz and OUT/initrd.img are copies
# of the image's /boot files (QEMU -kernel/-initrd, root=/dev/vda).
#
#   images/distro/build.sh [--out DIR]     (default $VT3_CACHE/distro/image; prints DIR)
#   -> DIR/disk.qcow2 DIR/vmlinuz DIR/initrd.img DIR/kver DIR/manifest.txt
#      $VT3_CACHE/distro/debs/*.deb        (the packages, for your own VMs)
#
# Cached by content: each step is keyed by the hash of its inputs and
# skipped when they did not change (an unchanged rebuild takes seconds).
set -euo pipefail
export LC_ALL=C

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
HERE=$REPO/images/distro
# shellcheck source=../../tools/cache-dir.sh
source "$REPO/tools/cache-dir.sh"
WORK=$VT3_CACHE/distro
OUT=$WORK/image
DEBS=$WORK/debs
SUITE=bookworm

# Debian's packages in the image. rdma-core's are Debian's own first; ours
# replace them afterwards with apt, as a user would upgrade.
GUEST_PACKAGES=(systemd-sysv udev dbus linux-image-amd64 linux-headers-amd64 initramfs-tools dkms
	iproute2 procps kmod rdma-core ibverbs-providers ibverbs-utils rdmacm-utils perftest)
# Our rdma-core packages that replace Debian's in the image.
RDMA_CORE_PACKAGES=(rdma-core libibverbs1 ibverbs-providers ibverbs-utils librdmacm1 rdmacm-utils)
# The normal user the tests run RDMA programs as.
GUEST_USER=vt3user
HOST_PACKAGES=(mmdebstrap dpkg-dev debhelper dh-dkms fakeroot e2fsprogs qemu-utils)

START=$SECONDS
log() { printf '[distro %3ds] %s\n' $((SECONDS - START)) "$*" >&2; }
die() {
	printf 'images/distro/build.sh: error: %s\n' "$*" >&2
	exit 1
}

while (($#)); do
	case $1 in
	--out)
		OUT=${2:?--out needs a directory}
		shift 2
		;;
	-h | --help)
		sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
		exit 0
		;;
	*) die "unknown argument '$1' (try --help)" ;;
	esac
done

stamp_ok() { [[ -f $1 && "$(<"$1")" == "$2" ]]; }
hash_files() { (cd "$1" && find . -type f ! -name '.stamp' -print0 | sort -z | xargs -0 sha256sum) | sha256sum | cut -c1-16; }

apt_install() {
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >&2 || {
		apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >&2
	}
}

ensure_host_packages() {
	local missing=() p
	for p in "${HOST_PACKAGES[@]}"; do
		[[ $(dpkg-query -W -f='${Status}' "$p" 2>/dev/null) == "install ok installed" ]] || missing+=("$p")
	done
	((${#missing[@]} == 0)) && return 0
	[[ $EUID -eq 0 ]] || die "missing host packages: ${missing[*]} (run as root)"
	log "apt-get install ${missing[*]}"
	apt_install "${missing[@]}" || die "apt-get install ${missing[*]} failed"
}

# ------------------------------------------------------------ rdma-core .debs

# rdma-core's tree as provider/build-rdma-core.sh fetches it (the crate
# ibverbs-sys, vendor/rdma-core) with providers/vt3 and vt3-include synced
# in; that script is the one place that fetches it. Our copy then gets
# what a provider added upstream also gets: its static-provider declaration
# in verbs.h and its header in libibverbs-dev. The provider itself is in
# ibverbs-providers through debian/ibverbs-providers.install's
# `usr/lib/*/libibverbs/lib*-rdmav*.so` and `etc/libibverbs.d/`.
# vt3-guest-tools (our test programs) are left out of the packages.
RDMA_CORE_SRC=${VT3_RDMA_CORE_WORK:-$VT3_CACHE/rdma-core}/src

prepare_rdma_core_source() {
	local src=$1
	"$REPO/provider/build-rdma-core.sh" >&2 || die "provider/build-rdma-core.sh failed"
	[[ -f $RDMA_CORE_SRC/debian/control ]] || die "no rdma-core tree with debian/ in $RDMA_CORE_SRC"
	rm -rf "$src"
	mkdir -p "$src"
	(cd "$RDMA_CORE_SRC" && tar --exclude=./build-deb --exclude=./.vt3-stamp -cf - .) | tar -xf - -C "$src"
	sed -i '/^add_subdirectory(vt3-guest-tools)$/d' "$src/CMakeLists.txt"
	sed -i 's|^extern const struct verbs_device_ops verbs_provider_siw;$|&\nextern const struct verbs_device_ops verbs_provider_vt3;|' \
		"$src/libibverbs/verbs.h"
	grep -q 'verbs_provider_vt3;' "$src/libibverbs/verbs.h" || die "could not declare verbs_provider_vt3 in verbs.h"
	echo usr/include/infiniband/vt3dv.h >>"$src/debian/libibverbs-dev.install"
	# A version of our own above Debian's, so apt upgrades to it.
	local version
	version="$(dpkg-parsechangelog -l "$src/debian/changelog" -S Version)+vt3"
	{
		printf 'rdma-core (%s) %s; urgency=medium\n\n  * With the vt3 provider (libvt3).\n\n' "$version" "$SUITE"
		printf ' -- vt3 developers <vt3@invalid>  %s\n\n' "$(dpkg-parsechangelog -l "$src/debian/changelog" -S Date)"
		cat "$src/debian/changelog"
	} >"$src/debian/changelog.new"
	mv "$src/debian/changelog.new" "$src/debian/changelog"
}

build_rdma_core_debs() {
	local dir=$WORK/rdma-core src key
	src=$dir/rdma-core-55.0
	mkdir -p "$dir"
	prepare_rdma_core_source "$src.next"
	key="$(hash_files "$src.next") $(declare -f prepare_rdma_core_source build_rdma_core_debs | sha256sum | cut -c1-16)"
	if stamp_ok "$dir/.stamp" "$key" && compgen -G "$dir/debs/libibverbs1_*.deb" >/dev/null; then
		rm -rf "$src.next"
		log "rdma-core .debs up to date"
		return 0
	fi
	rm -rf "$src" "$dir/debs" && mv "$src.next" "$src"
	rm -f "$dir"/*.deb "$dir"/*.ddeb "$dir"/*.changes "$dir"/*.buildinfo
	log "rdma-core build dependencies (apt-get build-dep, from its debian/control)"
	(cd "$src" && DEBIAN_FRONTEND=noninteractive apt-get build-dep -y -q ./ >&2) ||
		die "apt-get build-dep for rdma-core failed"
	log "rdma-core .debs (dpkg-buildpackage, its own debian/; a few minutes)"
	(cd "$src" && DEB_BUILD_OPTIONS="parallel=$(nproc) nocheck" \
		EXTRA_CMAKE_FLAGS="-DVT3_ABI_INCLUDE_DIR=$src/vt3-include" \
		dpkg-buildpackage -b -uc -us >"$dir/build.log" 2>&1) || {
		tail -n 30 "$dir/build.log" >&2
		die "dpkg-buildpackage of rdma-core failed (log: $dir/build.log)"
	}
	mkdir -p "$dir/debs"
	mv "$dir"/*.deb "$dir/debs/"
	# (grep -q would end the pipe early: dpkg-deb's SIGPIPE fails it under pipefail.)
	dpkg-deb -c "$dir"/debs/ibverbs-providers_*.deb | grep 'libibverbs/libvt3-rdmav34.so$' >/dev/null ||
		die "ibverbs-providers has no libvt3-rdmav34.so"
	printf '%s\n' "$key" >"$dir/.stamp"
}

# ------------------------------------------------------------ vt3-dkms .deb

build_vt3_dkms_deb() {
	local dir=$WORK/vt3-dkms key version
	version=$(sed -n 's/^PACKAGE_VERSION="\(.*\)"$/\1/p' "$REPO/guest-driver/dkms.conf")
	key="$(hash_files "$REPO/guest-driver") $(declare -f build_vt3_dkms_deb | sha256sum | cut -c1-16)"
	if stamp_ok "$dir/.stamp" "$key" && compgen -G "$dir/vt3-dkms_*.deb" >/dev/null; then
		log "vt3-dkms .deb up to date"
		return 0
	fi
	log "vt3-dkms .deb (dpkg-buildpackage, guest-driver/debian)"
	rm -rf "$dir"
	mkdir -p "$dir/vt3-$version"
	# The driver and its packaging; its tests are not part of the package.
	(cd "$REPO/guest-driver" && tar --exclude=./tests -cf - .) | tar -xf - -C "$dir/vt3-$version"
	(cd "$dir/vt3-$version" && dpkg-buildpackage -b -uc -us >"$dir/build.log" 2>&1) || {
		tail -n 30 "$dir/build.log" >&2
		die "dpkg-buildpackage of vt3-dkms failed (log: $dir/build.log)"
	}
	printf '%s\n' "$key" >"$dir/.stamp"
}

# ------------------------------------------------------------ the image

collect_debs() {
	local p
	rm -rf "$DEBS"
	mkdir -p "$DEBS"
	cp "$WORK"/vt3-dkms/vt3-dkms_*.deb "$DEBS/"
	for p in "${RDMA_CORE_PACKAGES[@]}"; do
		cp "$WORK"/rdma-core/debs/"${p}"_*.deb "$DEBS/"
	done
}

# The lab's agent, taken from images/init (the busybox guests' PID 1) so
# both kinds of guest speak the same protocol through the same code.
make_agent() {
	{
		printf '#!/bin/sh\n# The vt3 lab agent: the agent section of vt3/images/init.\n'
		# shellcheck disable=SC2016 # text of the script written, not expanded here
		printf 'err() { echo "vt3-agent: ERROR $*" >&2; }\nOPT_AGENT=${1:-ttyS1}\n'
		sed -n '/^# -* agent$/,/^# -* main$/p' "$REPO/images/init" | sed '1d;$d'
		printf 'agent_loop\n'
	} >"$1"
	grep -q '^agent_loop()' "$1" || die "no agent_loop in images/init"
	chmod 755 "$1"
}

# Sources: the host's Debian entries (the mirror this machine uses).
apt_sources() {
	local f
	for f in /etc/apt/sources.list.d/debian.sources /etc/apt/sources.list; do
		[[ -s $f ]] && grep -q "^[^#]*$SUITE" "$f" && {
			echo "$f"
			return 0
		}
	done
	echo "http://deb.debian.org/debian"
}

# Debian's part of the image, cached on its own (the long step: a few
# minutes, most of it dpkg and initramfs-tools): only Debian's packages.
build_base_root() {
	local base=$WORK/base-root key sources
	sources=$(apt_sources)
	key=$({
		printf '%s\n' "${GUEST_PACKAGES[@]}" "$sources"
		apt-cache policy linux-image-amd64 linux-headers-amd64 | grep Candidate
		declare -f build_base_root
	} | sha256sum | cut -c1-16)
	if stamp_ok "$WORK/base-root.stamp" "$key" && [[ -d $base ]]; then
		log "Debian root up to date"
		echo "$key"
		return 0
	fi
	log "mmdebstrap $SUITE (systemd, udev, linux-image-amd64 + headers, DKMS; many minutes, log: $WORK/mmdebstrap.log)"
	rm -rf "$base" "$WORK/base-root.stamp"
	mkdir -p "$WORK/apt-archives"
	# Downloads are kept between builds (mmdebstrap's sync-in/sync-out recipe).
	# shellcheck disable=SC2016 # "$1" is the hook's, expanded by mmdebstrap's shell
	mmdebstrap --mode=root --variant=minbase --skip=download/empty \
		--include="$(
			IFS=,
			echo "${GUEST_PACKAGES[*]}"
		)" \
		--setup-hook='mkdir -p "$1"/var/cache/apt/archives' \
		--setup-hook="sync-in $WORK/apt-archives /var/cache/apt/archives" \
		--customize-hook="sync-out /var/cache/apt/archives $WORK/apt-archives" \
		"$SUITE" "$base" "$sources" >"$WORK/mmdebstrap.log" 2>&1 || {
		tail -n 30 "$WORK/mmdebstrap.log" >&2
		die "mmdebstrap failed (log: $WORK/mmdebstrap.log)"
	}
	printf '%s\n' "$key" >"$WORK/base-root.stamp"
	echo "$key"
}

# Runs COMMAND... in ROOT with /proc, /sys and /dev mounted (what apt,
# DKMS and initramfs-tools need), unmounting whatever happens.
in_chroot() {
	local root=$1 rc=0
	shift
	mount -t proc proc "$root/proc"
	mount --rbind /sys "$root/sys" && mount --make-rslave "$root/sys"
	mount --rbind /dev "$root/dev" && mount --make-rslave "$root/dev"
	chroot "$root" "$@" || rc=$?
	umount -R "$root/dev" "$root/sys" "$root/proc"
	return "$rc"
}

# Our part: the .debs installed with apt over Debian's (DKMS builds vt3.ko
# for the image's kernel here), the agent, the user, the guest's own
# configuration; then the disk.
build_image() {
	local root=$WORK/root base_key=$1 key kver agent
	agent=$WORK/vt3-agent
	make_agent "$agent"
	key=$({
		printf '%s\n' "$base_key" "$GUEST_USER"
		sha256sum "$DEBS"/*.deb "$agent" | cut -d' ' -f1
		hash_files "$HERE/rootfs"
		declare -f build_image in_chroot
	} | sha256sum | cut -c1-16)
	if stamp_ok "$OUT/.stamp" "$key" && [[ -f $OUT/disk.qcow2 ]]; then
		log "image up to date: $OUT"
		return 0
	fi
	log "our packages into a copy of the Debian root (apt; DKMS builds vt3.ko)"
	rm -rf "$root" "$OUT.tmp"
	mkdir -p "$OUT.tmp"
	cp -a "$WORK/base-root" "$root"
	cp -r "$DEBS" "$root/tmp/debs"
	in_chroot "$root" sh -c 'DEBIAN_FRONTEND=noninteractive apt-get install -y -q /tmp/debs/*.deb' \
		>"$WORK/install.log" 2>&1 || {
		tail -n 30 "$WORK/install.log" >&2
		die "installing our packages failed (log: $WORK/install.log)"
	}
	rm -rf "$root/tmp/debs"
	install -D -m 755 "$agent" "$root/usr/local/lib/vt3/vt3-agent"
	cp -r "$HERE/rootfs/." "$root/"
	chroot "$root" useradd -m -s /bin/bash "$GUEST_USER"
	chroot "$root" systemctl enable -q systemd-networkd vt3-agent.service
	echo distro >"$root/etc/hostname"
	printf '/dev/vda / ext4 errors=remount-ro 0 1\n' >"$root/etc/fstab"
	# shellcheck disable=SC2016 # dpkg-query's format, not the shell's
	chroot "$root" dpkg-query -W -f='${Package} ${Version}\n' >"$OUT.tmp/manifest.txt"
	kver=$(cd "$root/lib/modules" && ls)
	[[ $(wc -w <<<"$kver") == 1 ]] || die "expected one kernel in the image, found: $kver"
	[[ -f $root/lib/modules/$kver/updates/dkms/vt3.ko ]] ||
		die "DKMS did not build vt3.ko for $kver at install time (log: $WORK/install.log)"
	cp "$root/boot/vmlinuz-$kver" "$OUT.tmp/vmlinuz"
	cp "$root/boot/initrd.img-$kver" "$OUT.tmp/initrd.img"
	echo "$kver" >"$OUT.tmp/kver"
	local size
	# The root's size and a quarter more room for the guest to write in.
	size=$(($(du -sm "$root" | cut -f1) * 5 / 4 + 256))
	log "mkfs.ext4 -d (${size} MB) and qemu-img convert"
	mkfs.ext4 -q -F -L vt3-distro -d "$root" "$WORK/disk.raw" "${size}M" || die "mkfs.ext4 -d failed"
	qemu-img convert -O qcow2 "$WORK/disk.raw" "$OUT.tmp/disk.qcow2" || die "qemu-img convert failed"
	rm -f "$WORK/disk.raw"
	rm -rf "$root"
	printf '%s\n' "$key" >"$OUT.tmp/.stamp"
	rm -rf "$OUT"
	mv "$OUT.tmp" "$OUT"
	log "done: $OUT ($(du -h "$OUT/disk.qcow2" | cut -f1) qcow2, kernel $kver)"
}

main() {
	mkdir -p "$WORK"
	exec 9>"$WORK/.lock"
	flock 9
	ensure_host_packages
	# Debian's root builds while our packages do (neither needs the other).
	local base_key
	build_base_root >"$WORK/base-root.key" &
	local base_pid=$!
	build_vt3_dkms_deb
	build_rdma_core_debs
	wait "$base_pid" || die "building the Debian root failed"
	base_key=$(<"$WORK/base-root.key")
	collect_debs
	build_image "$base_key"
	echo "$OUT"
}

main
