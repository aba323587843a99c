#!/usr/bin/env bash
# Lint of vt3.ko's sources: checkpatch.pl --strict over every driver source
# and header (guest-driver/*.[ch], guest-driver/include/**/*.h), and sparse
# run by kbuild (make C=2) against Debian 12's kernels. Findings go to
# stdout, then one closing line:
#
#   lint-kmod: checkpatch 15 files clean, sparse clean (6.12, 6.1)
#
# Usage: tools/lint-kmod.sh [SERIES…]   (sparse against: default 6.12 6.1)
#
# Exit status 0 only if neither tool reported anything. What checkpatch
# is told to ignore is in guest-driver/.checkpatch.conf, each type with its
# reason. sparse counts every diagnostic, in vt3's files or not (the
# kernel headers give none with this driver, so nothing is filtered).
#
# checkpatch.pl comes from Debian's linux-source-6.12 (the version apt
# resolves), fetched with apt-get download into $VT3_CACHE/lint-kmod/debs
# unless images/build.sh's cache has it; the few files it needs are
# streamed out of the source tarball once per .deb into
# $VT3_CACHE/lint-kmod/checkpatch/<deb>/. The kernel build dirs are
# tools/kernel-headers.sh's. sparse builds in build/lint-kmod/SERIES/, a
# copy of the sources kept between runs (C=2 checks every file, rebuilt
# or not), so guest-driver/ itself is never touched. As root on a fresh
# Debian 12 machine, sparse and perl are installed when missing.
set -euo pipefail
export LC_ALL=C

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=cache-dir.sh
source "$REPO/tools/cache-dir.sh"
CACHE=$VT3_CACHE/lint-kmod
OUT=$REPO/build/lint-kmod
SELF=$(realpath "${BASH_SOURCE[0]}")
SOURCE_PKG=linux-source-6.12
# sparse: the checker of make C=; perl: checkpatch.pl's modules
# (Term::ANSIColor is not in perl-base).
HOST_PACKAGES=(sparse perl)

die() {
	printf 'lint-kmod.sh: error: %s\n' "$*" >&2
	exit 1
}
log() { printf 'lint-kmod.sh: %s\n' "$*" >&2; }

SERIES=()
while (($#)); do
	case $1 in
	-h | --help)
		sed -n '2,/^set -euo/p' "$SELF" | sed '$d; s/^# \{0,1\}//'
		exit 0
		;;
	6.1 | 6.12)
		SERIES+=("$1")
		shift
		;;
	*) die "usage: tools/lint-kmod.sh [6.1|6.12]…" ;;
	esac
done
((${#SERIES[@]})) || SERIES=(6.12 6.1)

# ---------------------------------------------------------------- host

# shellcheck source=apt.sh
source "$REPO/tools/apt.sh"

# ---------------------------------------------------------------- checkpatch

resolve_source() {
	local file=$CACHE/resolved key
	key=$(apt_state_key)
	if [[ -f $file && "$(head -n1 "$file")" == "# $key" ]]; then
		SOURCE_VER=$(sed -n 2p "$file")
		[[ -n $SOURCE_VER ]] && return 0
	fi
	SOURCE_VER=$(apt-cache show --no-all-versions "$SOURCE_PKG" 2>/dev/null | sed -n 's/^Version: *//p' | head -n1)
	[[ -n $SOURCE_VER ]] || return 1
	printf '# %s\n%s\n' "$key" "$SOURCE_VER" >"$file.tmp"
	mv "$file.tmp" "$file"
}

# Path of the cached .deb of SOURCE_PKG at SOURCE_VER: ours, or the one
# images/build.sh fetched for the guest's siw.ko (apt encodes ':' as %3a).
source_deb() {
	local f
	for f in "$CACHE/debs/${SOURCE_PKG}_${SOURCE_VER//:/%3a}_"*.deb \
		"$VT3_CACHE/image-build/debs/${SOURCE_PKG}_${SOURCE_VER//:/%3a}_"*.deb; do
		[[ -f $f ]] && printf '%s\n' "$f" && return 0
	done
	return 1
}

# Downloads the .deb unless cached; fails quietly so the caller can retry
# after an apt-get update.
fetch_source() {
	local tmp=$CACHE/debs/.partial
	source_deb >/dev/null && return 0
	log "downloading $SOURCE_PKG=$SOURCE_VER (about 150 MB, once)"
	# A scratch dir, so an interrupted download never looks cached.
	rm -rf "$tmp" && mkdir -p "$tmp"
	(cd "$tmp" && apt-get download -qq "${APT_OPTS[@]}" "$SOURCE_PKG=$SOURCE_VER" >&2) || return 1
	mv "$tmp"/*.deb "$CACHE/debs/"
	rmdir "$tmp"
}

# What checkpatch.pl reads next to itself (spelling.txt,
# const_structs.checkpatch; checkpatch.rst only for --verbose), streamed
# out of the source tarball. An empty include/ makes the directory a
# kernel tree for --root: with --no-tree checkpatch would otherwise look
# for CamelCase names in /include.
CHECKPATCH_FILES=(scripts/checkpatch.pl scripts/spelling.txt scripts/const_structs.checkpatch
	Documentation/dev-tools/checkpatch.rst)
extract_checkpatch() {
	local deb name dir tmp f patterns=()
	deb=$(source_deb) || die "internal: $SOURCE_PKG=$SOURCE_VER not downloaded"
	name=$(basename "$deb" .deb)
	dir=$CACHE/checkpatch/$name
	CHECKPATCH_ROOT=$dir
	[[ -f $dir/.vt3-extracted && "$(<"$dir/.vt3-extracted")" == "$name" ]] && return 0
	log "extracting checkpatch.pl from $name"
	for f in "${CHECKPATCH_FILES[@]}"; do patterns+=("*/$f"); done
	tmp=$dir.tmp
	rm -rf "$dir" "$tmp" && mkdir -p "$tmp"
	dpkg-deb --fsys-tarfile "$deb" |
		tar -xO "./usr/src/$SOURCE_PKG.tar.xz" |
		tar -xJ -C "$tmp" --wildcards "${patterns[@]}" ||
		die "extracting checkpatch.pl from $deb failed"
	mv "$tmp"/*/ "$dir"
	rm -rf "$tmp"
	for f in "${CHECKPATCH_FILES[@]}"; do
		[[ -f $dir/$f ]] || die "no $f in $deb"
	done
	mkdir -p "$dir/include"
	printf '%s\n' "$name" >"$dir/.vt3-extracted"
}

get_checkpatch() {
	mkdir -p "$CACHE/debs"
	# One download and extraction per cache at a time.
	exec 9>"$CACHE/.lock"
	flock 9
	if ! resolve_source; then
		apt_update_once || die "Debian package '$SOURCE_PKG' not found (apt-cache show $SOURCE_PKG)"
		resolve_source || die "Debian package '$SOURCE_PKG' not found after apt-get update"
	fi
	if ! fetch_source; then
		# The lists name a version the mirror dropped: refresh, resolve again.
		apt_update_once || die "apt-get download $SOURCE_PKG=$SOURCE_VER failed"
		resolve_source || die "Debian package '$SOURCE_PKG' not found after apt-get update"
		fetch_source || die "apt-get download $SOURCE_PKG=$SOURCE_VER failed"
	fi
	extract_checkpatch
	exec 9>&-
}

# Every driver source and header, relative to the repository.
driver_files() {
	(cd "$REPO" && {
		find guest-driver -maxdepth 1 -type f \( -name '*.c' -o -name '*.h' \) ! -name '*.mod.c'
		find guest-driver/include -type f -name '*.h'
	} | sort)
}

# Sets CP_FILES and CP_FINDINGS; prints the findings.
run_checkpatch() {
	local dir=$OUT/checkpatch rc=0 files group jobs i j pids=() p
	mapfile -t files < <(driver_files)
	((${#files[@]})) || die "no driver sources in $REPO/guest-driver"
	CP_FILES=${#files[@]}
	rm -rf "$dir" && mkdir -p "$dir"
	# Its files dealt out to one checkpatch per CPU (the slow part of a
	# warm run). checkpatch reads .checkpatch.conf from its working
	# directory, and writes a CamelCase cache there: a scratch dir each,
	# where guest-driver is a link so that findings name guest-driver/FILE.
	jobs=$(nproc)
	for ((i = 0; i < jobs && i < ${#files[@]}; i++)); do
		group=()
		for ((j = i; j < ${#files[@]}; j += jobs)); do group+=("${files[j]}"); done
		mkdir "$dir/$i"
		ln -s "$REPO/guest-driver" "$dir/$i/guest-driver"
		[[ ! -f $REPO/guest-driver/.checkpatch.conf ]] || cp "$REPO/guest-driver/.checkpatch.conf" "$dir/$i/"
		(cd "$dir/$i" && exec perl "$CHECKPATCH_ROOT/scripts/checkpatch.pl" --strict --no-tree \
			--root="$CHECKPATCH_ROOT" --terse --show-types --no-summary --color=never \
			-f "${group[@]}") >"$dir/$i.out" 2>&1 &
		pids+=($!)
	done
	for p in "${pids[@]}"; do wait "$p" || rc=$?; done
	# By file and line, as one run would print them.
	cat "$dir"/*.out | sort -s -t: -k1,1 -k2,2n >"$dir/out"
	CP_FINDINGS=$(grep -cE '^[^:]+:[0-9]+: (ERROR|WARNING|CHECK):' "$dir/out" || true)
	cat "$dir/out"
	# A failure with nothing to show (perl died, a bad option): one finding.
	((rc == 0 || CP_FINDINGS > 0)) || CP_FINDINGS=1
}

# ---------------------------------------------------------------- sparse

# Keeps DST/guest-driver a copy of the driver's build inputs (not its
# tests) while leaving unchanged files, and so the objects, alone.
sync_sources() {
	local dst=$1 f
	mkdir -p "$dst"
	if [[ -d $dst/guest-driver ]]; then
		(cd "$dst" && find guest-driver -type f \( -name '*.c' -o -name '*.h' -o -name Kbuild \) \
			! -name '*.mod.c') | while IFS= read -r f; do
			[[ -f $REPO/$f ]] || rm -f "$dst/$f"
		done
	fi
	{
		driver_files
		echo guest-driver/Kbuild
	} | while IFS= read -r f; do
		cmp -s "$REPO/$f" "$dst/$f" 2>/dev/null && continue
		mkdir -p "$(dirname "$dst/$f")"
		cp "$REPO/$f" "$dst/$f"
	done
}

# sparse as kbuild runs it, against one kernel. Sets SP_RESULT ("6.12: 2
# warning(s)") when it found anything; prints the diagnostics.
run_sparse() {
	local series=$1 kdir dir log rc=0 n
	dir=$OUT/$series log=$OUT/$series.log
	mkdir -p "$OUT"
	kdir=$("$REPO/tools/kernel-headers.sh" "$series" 2>"$log") || {
		tail -n 5 "$log" >&2
		die "no kernel headers for $series (log: $log)"
	}
	sync_sources "$dir"
	# C=2: sparse on every source, rebuilt or not. -fdiagnostic-prefix
	# marks sparse's lines apart from the compiler's (compile-check.sh's
	# W=1 build judges those).
	make -C "$kdir" M="$dir/guest-driver" C=2 CF=-fdiagnostic-prefix -j"$(nproc)" modules \
		>>"$log" 2>&1 || rc=$?
	if ((rc != 0)); then
		tail -n 20 "$log"
		SP_RESULT+="${SP_RESULT:+, }$series: build failed (log: $log)"
		return 0
	fi
	n=$(grep -cE ': sparse: (warning|error):' "$log" || true)
	((n > 0)) || return 0
	SP_RESULT+="${SP_RESULT:+, }$series: $n warning(s)/error(s)"
	# Diagnostics and their continuation lines, paths relative to the copy.
	echo "sparse against $series:"
	grep -E ': sparse: ' "$log" | sed "s|$dir/||"
}

# ---------------------------------------------------------------- main

ensure_host_packages
get_checkpatch
CP_FILES=0 CP_FINDINGS=0 SP_RESULT=
run_checkpatch
for s in "${SERIES[@]}"; do
	run_sparse "$s"
done

if ((CP_FINDINGS == 0)); then
	cp_line="checkpatch $CP_FILES files clean"
else
	cp_line="checkpatch $CP_FINDINGS finding(s) in $CP_FILES files"
fi
if [[ -z $SP_RESULT ]]; then
	sp_line="sparse clean ($(printf '%s, ' "${SERIES[@]}" | sed 's/, $//'))"
else
	sp_line="sparse FAILED ($SP_RESULT)"
fi
echo "lint-kmod: $cp_line, $sp_line"
((CP_FINDINGS == 0)) && [[ -z $SP_RESULT ]]
