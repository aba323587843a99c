#!/usr/bin/env bash
# Builds the project's own guest artefacts and the initramfs that carries
# them on top of the Debian base from images/build.sh:
#   - vt3.ko (guest-driver/), built against the headers of the image's own
#     kernel (DIR/kbuild-dir: 6.1 or 6.12, images/build.sh --kernel), and
#     the driver's own test tools (guest-driver/tests: vt3_ktest.ko, a
#     kernel-verbs exerciser, and vt3-uverbs, raw uverbs without a provider);
#   - rdma-core 55 with libvt3 and guest-tools/ (provider/build-rdma-core.sh),
#     replacing Debian's rdma-core 44 libraries and tools file for file.
# The overlay is a second newc cpio appended to the base one (the kernel
# unpacks concatenated archives in order, later files win). The result is
# left uncompressed: under TCG the guest unpacks 40 MB of cpio 1.5 s sooner
# than it inflates the same gzip'd.
#
# rdma-core's own test suite (pyverbs and tests/, staged by
# build-rdma-core.sh) goes only into a second image, with images/build.sh's
# python layer: initramfs-pyverbs.cpio = initramfs-vt3.cpio + python +
# pyverbs, about 30 MB more to unpack, booted by the `pyverbs` case alone.
#
#   images/overlay.sh [--images DIR]     (default DIR: $VT3_CACHE/images)
#   -> DIR/initramfs-vt3.cpio, DIR/initramfs-pyverbs.cpio
#
# In the guest, `vt3.driver=1` on the kernel command line loads vt3.ko
# (a hook in /etc/vt3/init.d, run by images/init before "ready").
# Cached: rebuilt only when an input changed.
set -euo pipefail
export LC_ALL=C

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=../tools/cache-dir.sh
source "$REPO/tools/cache-dir.sh"
IMAGES=$VT3_CACHE/images

while [ $# -gt 0 ]; do
	case $1 in
	--images)
		IMAGES=${2:?--images needs a directory}
		shift 2
		;;
	*)
		echo "overlay.sh: unknown option $1" >&2
		exit 2
		;;
	esac
done

say() { printf '[overlay] %s\n' "$*" >&2; }
die() {
	say "ERROR: $*"
	exit 1
}

[ -f "$IMAGES/initramfs.cpio.gz" ] || die "no base image in $IMAGES (run images/build.sh first)"
[ -f "$IMAGES/initramfs-python.cpio.gz" ] || die "no python layer in $IMAGES (run images/build.sh again)"
KVER=$(cat "$IMAGES/kver")
KDIR=$(cat "$IMAGES/kbuild-dir")
# A build of the overlay per images directory (tools/mutants.sh builds its own).
WORK=$IMAGES/overlay-work
STAGE=${VT3_RDMA_CORE_WORK:-$VT3_CACHE/rdma-core}/stage
OUT=$IMAGES/initramfs-vt3.cpio
PYVERBS_OUT=$IMAGES/initramfs-pyverbs.cpio
# rdma-core's test suite and its Python binding, as Debian's python3-pyverbs
# installs them, and guest-tools' runner of it; in the pyverbs image only.
PYVERBS_PATHS=(./usr/lib/python3 ./usr/share/doc/rdma-core/tests ./usr/bin/vt3-pyverbs)

# The driver's kernel test modules (guest-driver/tests/Kbuild).
TEST_MODULES=(vt3_ktest.ko vt3_kcm.ko vt3_kforge.ko vt3_kchaos.ko vt3_kfrmr.ko vt3_ksrq.ko)

# The driver is built in a copy per images directory ($WORK/src), so the
# 6.1 and 6.12 images (images/build.sh --kernel) each keep their own
# objects and never rebuild each other's. tar keeps the sources' mtimes:
# make rebuilds what changed only.
DRV=$WORK/src/guest-driver

copy_driver_sources() {
	mkdir -p "$WORK/src"
	(cd "$REPO" && find guest-driver -type f \( -name '*.c' -o -name '*.h' -o -name Kbuild -o -name Makefile \) \
		! -name '*.mod.c' -print0 | tar --null -T - -cf -) | tar -xf - -C "$WORK/src"
}

build_module() {
	say "vt3.ko for $KVER"
	copy_driver_sources
	make -s -C "$KDIR" M="$DRV" modules >&2 || die "building vt3.ko failed"
	make -s -C "$KDIR" M="$DRV/tests" modules >&2 || die "building vt3_ktest.ko failed"
	mkdir -p "$WORK"
	# Static: it must not depend on which libc the guest has.
	gcc -static -O2 -Wall -o "$WORK/vt3-uverbs" "$REPO/guest-driver/tests/vt3-uverbs.c" ||
		die "building vt3-uverbs failed (needs libc6-dev)"
	gcc -static -O2 -Wall -I"$REPO/guest-driver/include" -o "$WORK/vt3-forge" "$REPO/guest-driver/tests/vt3-forge.c" ||
		die "building vt3-forge failed"
}

build_rdma_core() {
	"$REPO/provider/build-rdma-core.sh" --out "$STAGE" >&2 || die "building rdma-core with libvt3 failed"
}

# Inputs of the overlay, hashed: rebuild only when one changed.
inputs_hash() {
	# Contents only (no paths): the same inputs from any clone hit the cache.
	{
		sha256sum "$IMAGES/initramfs.cpio.gz" "$IMAGES/initramfs-python.cpio.gz" "$DRV/vt3.ko" "${BASH_SOURCE[0]}" \
			"${TEST_MODULES[@]/#/$DRV/tests/}" "$WORK/vt3-uverbs" "$WORK/vt3-forge" |
			cut -d' ' -f1
		(cd "$STAGE" && find . -type f -print0 | sort -z | xargs -0 sha256sum)
	} | sha256sum | cut -d' ' -f1
}

assemble() {
	local root=$WORK/root
	rm -rf "$root"
	# The guest's /lib is a symlink to usr/lib, and the kernel's cpio
	# unpacker would replace it by a real directory: never ship lib/.
	mkdir -p "$root/usr/lib/modules/$KVER/extra" "$root/etc/vt3/init.d"
	install -m 644 "$DRV/vt3.ko" "${TEST_MODULES[@]/#/$DRV/tests/}" \
		"$root/usr/lib/modules/$KVER/extra/"
	install -D -m 755 "$WORK/vt3-uverbs" "$root/usr/bin/vt3-uverbs"
	install -D -m 755 "$WORK/vt3-forge" "$root/usr/bin/vt3-forge"
	# rdma-core as the guest runs it: libraries, providers, tools, config.
	local p pyverbs_prune=()
	for p in "${PYVERBS_PATHS[@]}"; do pyverbs_prune+=(-o -path "$p"); done
	(cd "$STAGE" && find . \( -path ./usr/include -o -path ./usr/share/man -o -path ./usr/share/doc \
		"${pyverbs_prune[@]}" -o -name '*.a' -o -path '*/pkgconfig' \) -prune -o -print |
		cpio -pdm --quiet "$root")
	local top
	for top in "$root"/*; do
		case ${top##*/} in
		etc | usr) ;;
		*) die "overlay would replace /${top##*/} in the guest" ;;
		esac
	done
	cat >"$root/etc/vt3/init.d/10-vt3.sh" <<'HOOK'
# Loads vt3.ko when the kernel command line asks for it (vt3.driver=1).
grep -qw 'vt3.driver=1' /proc/cmdline || exit 0
insmod "/lib/modules/$(uname -r)/extra/vt3.ko" || { echo "vt3-init: ERROR insmod vt3.ko failed"; exit 1; }
HOOK
	{
		gzip -dc "$IMAGES/initramfs.cpio.gz"
		(cd "$root" && find . -mindepth 1 | sort | cpio -o -H newc --quiet -R 0:0)
	} >"$OUT.tmp"
	rm -f "$IMAGES/initramfs-vt3.cpio.gz" # what this wrote before
	mv "$OUT.tmp" "$OUT"
	assemble_pyverbs
}

assemble_pyverbs() {
	local p
	for p in "${PYVERBS_PATHS[@]}"; do
		[ -e "$STAGE/$p" ] || die "no $p in $STAGE (rdma-core built without pyverbs?)"
	done
	{
		cat "$OUT"
		gzip -dc "$IMAGES/initramfs-python.cpio.gz"
		# With their parent directories: the kernel's unpacker makes none.
		(cd "$STAGE" && {
			for p in "${PYVERBS_PATHS[@]}"; do
				while p=$(dirname "$p") && [ "$p" != . ]; do echo "$p"; done
			done
			find "${PYVERBS_PATHS[@]}"
		} | sort -u | cpio -o -H newc --quiet -R 0:0)
	} >"$PYVERBS_OUT.tmp"
	mv "$PYVERBS_OUT.tmp" "$PYVERBS_OUT"
}

main() {
	mkdir -p "$WORK"
	build_module
	build_rdma_core
	local hash
	hash=$(inputs_hash)
	if [ -f "$OUT" ] && [ -f "$PYVERBS_OUT" ] && [ "$(cat "$WORK/.stamp" 2>/dev/null)" = "$hash" ]; then
		say "initramfs-vt3 up to date"
		return 0
	fi
	assemble
	echo "$hash" >"$WORK/.stamp"
	say "done: $OUT ($(du -h "$OUT" | cut -f1)), $PYVERBS_OUT ($(du -h "$PYVERBS_OUT" | cut -f1))"
}

main
