#!/usr/bin/env bash
# Compile check: vt3.ko and its test modules (guest-driver/tests) built with
# W=1 against each of Debian 12's kernels (tools/kernel-headers.sh). Any
# warning or error fails that kernel. One line per kernel on stdout:
#
#   compile 6.1 (6.1.0-57-amd64): ok
#   compile 6.12 (6.12.117+deb12-amd64): FAILED, 2 warning(s)/error(s) (log: …)
#
# Usage: tools/compile-check.sh [--junit FILE] [SERIES…]   (default: 6.1 6.12)
#   --junit FILE   also write a JUnit file, one testcase per kernel
#
# The sources are copied into build/compile-check/SERIES/ and built there,
# so guest-driver/ itself is never touched (images/overlay.sh builds in a
# copy of its own too). Exit status 0 only if every kernel passed.
set -euo pipefail
export LC_ALL=C

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=$REPO/build/compile-check
JUNIT=
SERIES=()

while (($#)); do
	case $1 in
	--junit)
		[[ $# -ge 2 ]] || { echo "compile-check.sh: --junit needs a file" >&2; exit 2; }
		JUNIT=$2
		shift 2
		;;
	-h | --help)
		sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
		exit 0
		;;
	*)
		SERIES+=("$1")
		shift
		;;
	esac
done
((${#SERIES[@]})) || SERIES=(6.1 6.12)

# The driver's build inputs only (no objects a previous in-tree build left).
copy_sources() {
	local dst=$1
	rm -rf "$dst" && mkdir -p "$dst"
	(cd "$REPO" && find guest-driver -type f \( -name '*.c' -o -name '*.h' -o -name Kbuild \) \
		! -name '*.mod.c' -print0 | tar --null -T - -cf -) | tar -xf - -C "$dst"
}

# Builds against one kernel; sets RESULT (one line) and DETAIL (for JUnit).
check_one() {
	local series=$1 kdir kver dir log n
	dir=$OUT/$series log=$OUT/$series.log
	RESULT="" DETAIL=""
	mkdir -p "$OUT"
	if ! kdir=$("$REPO/tools/kernel-headers.sh" "$series" 2>"$log"); then
		DETAIL=$(tail -n 5 "$log")
		RESULT="compile $series: FAILED, no kernel headers (log: $log)"
		return 1
	fi
	kver=${kdir##*/linux-headers-}
	copy_sources "$dir"
	local rc=0
	{
		make -C "$kdir" M="$dir/guest-driver" W=1 -j"$(nproc)" modules &&
			make -C "$kdir" M="$dir/guest-driver/tests" W=1 -j"$(nproc)" modules
	} >>"$log" 2>&1 || rc=$?
	# Compiler and modpost diagnostics both count ("warning:", "WARNING:").
	n=$(grep -ciE '(warning|error)[: ]' "$log" || true)
	if ((rc == 0 && n == 0)); then
		RESULT="compile $series ($kver): ok"
		return 0
	fi
	((n > 0)) || n=1
	DETAIL=$(grep -iE '(warning|error)[: ]' "$log" | head -n 20)
	[[ -n $DETAIL ]] || DETAIL=$(tail -n 20 "$log")
	RESULT="compile $series ($kver): FAILED, $n warning(s)/error(s) (log: $log)"
	return 1
}

xml_escape() { sed 's/&/\&amp;/g; s/</\&lt;/g; s/>/\&gt;/g; s/"/\&quot;/g'; }

failed=0 cases=
for s in "${SERIES[@]}"; do
	start=$SECONDS
	if check_one "$s"; then
		cases+="  <testcase classname=\"compile-check\" name=\"$s\" time=\"$((SECONDS - start))\"/>"$'\n'
	else
		failed=$((failed + 1))
		[[ -z $DETAIL ]] || printf '%s\n' "$DETAIL" >&2
		cases+="  <testcase classname=\"compile-check\" name=\"$s\" time=\"$((SECONDS - start))\">"$'\n'
		cases+="    <failure message=\"$(xml_escape <<<"$RESULT")\">$(xml_escape <<<"$DETAIL")</failure>"$'\n'
		cases+="  </testcase>"$'\n'
	fi
	printf '%s\n' "$RESULT"
done

if [[ -n $JUNIT ]]; then
	mkdir -p "$(dirname "$JUNIT")"
	{
		echo '<?xml version="1.0" encoding="utf-8"?>'
		echo "<testsuite name=\"compile-check\" tests=\"${#SERIES[@]}\" failures=\"$failed\" errors=\"0\" skipped=\"0\">"
		printf '%s' "$cases"
		echo '</testsuite>'
	} >"$JUNIT.tmp"
	mv "$JUNIT.tmp" "$JUNIT"
fi
((failed == 0))
