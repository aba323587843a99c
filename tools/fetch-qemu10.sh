#!/usr/bin/env bash
# Unpacks QEMU 10.0 from bookworm-backports into a folder beside the system
# QEMU (nothing is installed) and prints the path of a wrapper that runs it.
#
#   tools/fetch-qemu10.sh [DIR]      (default DIR: $VT3_CACHE/qemu10)
#
# Needs root only to add the bookworm-backports apt source when it is
# missing. The wrapper points QEMU at its own ROMs and at SeaBIOS.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=cache-dir.sh
source "$ROOT/tools/cache-dir.sh"
OUT=${1:-$VT3_CACHE/qemu10}
WRAPPER=$OUT/qemu-system-x86_64
PACKAGES=(qemu-system-x86 qemu-system-common qemu-system-data)

die() {
	echo "fetch-qemu10: $*" >&2
	exit 1
}

backports_version() {
	apt-cache madison qemu-system-x86 2>/dev/null |
		awk -F'|' '$3 ~ /bookworm-backports/ { gsub(/ /, "", $2); print $2; exit }'
}

ensure_backports_source() {
	[ -n "$(backports_version)" ] && return 0
	[ "$(id -u)" -eq 0 ] || die "bookworm-backports is not an apt source; run as root to add it"
	cat >/etc/apt/sources.list.d/vt3-bookworm-backports.sources <<'SRC'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
	apt-get update -q >/dev/null
	[ -n "$(backports_version)" ] || die "no qemu-system-x86 in bookworm-backports"
}

main() {
	if [ -x "$WRAPPER" ] && "$WRAPPER" --version >/dev/null 2>&1; then
		echo "$WRAPPER"
		return 0
	fi
	ensure_backports_source
	local version tmp pkg deb
	version=$(backports_version)
	tmp=$(mktemp -d)
	chmod 755 "$tmp" # apt's download user must be able to write here
	trap 'rm -rf "$tmp"' RETURN
	(cd "$tmp" && apt-get download -q -o APT::Sandbox::User=root "${PACKAGES[@]/%/=$version}" >/dev/null) ||
		die "apt-get download of QEMU $version failed"
	rm -rf "$OUT"
	mkdir -p "$OUT"
	for pkg in "${PACKAGES[@]}"; do
		deb=$(ls "$tmp/${pkg}_"*.deb)
		dpkg -x "$deb" "$OUT"
	done
	cat >"$WRAPPER" <<WRAP
#!/bin/sh
# QEMU $version unpacked by tools/fetch-qemu10.sh
exec "$OUT/usr/bin/qemu-system-x86_64" -L "$OUT/usr/share/qemu" -L /usr/share/seabios "\$@"
WRAP
	chmod +x "$WRAPPER"
	"$WRAPPER" --version >/dev/null 2>&1 || die "the unpacked QEMU does not run: $("$WRAPPER" --version 2>&1 | head -3)"
	echo "$WRAPPER"
}

main "$@"
