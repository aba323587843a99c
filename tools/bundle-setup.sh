#!/bin/sh
# Gets vt3 from a bundle into a machine, for a user's CI (action.yml runs
# exactly this) or by hand (docs/bundle.md):
#
#   tools/bundle-setup.sh [--kvm] ARCHIVE DIR
#
# unpacks ARCHIVE (vt3-VERSION-x86_64.tar.zst, from ./run-vm.sh dist)
# into DIR, makes the venv DIR/venv with the bundle's vt3lab wheel
# (pytest from the system, nothing downloaded), and prints what a job
# needs as NAME=VALUE lines (for $GITHUB_ENV): VT3_BUNDLE, VT3_VENV.
# Missing Debian/Ubuntu packages (QEMU, python3-venv, pytest, zstd) are
# installed when root or passwordless sudo allows it, else named.
# --kvm: make /dev/kvm usable by everyone (a udev rule; needs root or
# sudo), as GitHub's hosted runners need for KVM.
set -eu

kvm=0
if [ "${1:-}" = --kvm ]; then
	kvm=1
	shift
fi
[ $# -eq 2 ] || {
	echo "usage: bundle-setup.sh [--kvm] ARCHIVE DIR" >&2
	exit 2
}
archive=$1 dir=$2

as_root() {
	if [ "$(id -u)" -eq 0 ]; then
		"$@"
	elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
		sudo "$@"
	else
		return 1
	fi
}

missing=
command -v qemu-system-x86_64 >/dev/null 2>&1 || missing="$missing qemu-system-x86"
command -v zstd >/dev/null 2>&1 || missing="$missing zstd"
python3 -c 'import ensurepip' 2>/dev/null || missing="$missing python3-venv"
python3 -c 'import pytest' 2>/dev/null || missing="$missing python3-pytest"
if [ -n "$missing" ]; then
	echo "bundle-setup: installing$missing" >&2
	if ! as_root sh -c "apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q$missing >/dev/null"; then
		echo "bundle-setup: missing packages:$missing (installing them needs root: apt-get install$missing)" >&2
		exit 1
	fi
fi
if [ "$kvm" = 1 ] && [ -e /dev/kvm ] && ! [ -w /dev/kvm ]; then
	echo 'KERNEL=="kvm", GROUP="kvm", MODE="0666", OPTIONS+="static_node=kvm"' |
		as_root tee /etc/udev/rules.d/99-vt3-kvm.rules >/dev/null &&
		as_root udevadm control --reload-rules && as_root udevadm trigger --name-match=kvm ||
		echo "bundle-setup: /dev/kvm stays closed to $(id -un) (needs root); guests run under TCG" >&2
fi

mkdir -p "$dir"
tar -C "$dir" --zstd -xf "$archive"
name=$(basename "$archive" .tar.zst)
bundle=$(cd "$dir/$name" && pwd)
[ -f "$bundle/manifest.json" ] || {
	echo "bundle-setup: $archive holds no $name/manifest.json: not a vt3 bundle" >&2
	exit 1
}
python3 -m venv --system-site-packages "$dir/venv"
"$dir/venv/bin/pip" install -q --no-index --no-deps "$bundle"/vt3lab-*-py3-none-any.whl
echo "VT3_BUNDLE=$bundle"
echo "VT3_VENV=$(cd "$dir/venv" && pwd)"
