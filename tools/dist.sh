#!/usr/bin/env bash
# Writes vt3's relocatable bundle: everything a user needs to run vt3
# guests with only their distribution's QEMU and Python, no build, no
# download, no root (docs/bundle.md).
#
#   tools/dist.sh --images DIR --vt3d PATH --out DIR
#
# DIR/vt3-VERSION-x86_64.tar.zst holds, under vt3-VERSION-x86_64/:
#   bin/vt3d                 the device (stripped)
#   bin/vt3                  the launcher: vt3 demo | up N | down | shell
#   images/                  the guest kernel (vmlinux) and initramfs-vt3.cpio
#                            (vt3.ko, rdma-core 55 with libvt3, the guest tools)
#   vt3lab-VERSION-py3-none-any.whl   the Python lab and its pytest plugin
#   examples/ulp-suite/      a user's suite to copy (docs/bundle.md)
#   manifest.json            versions and the sha256 of every file
# run-vm.sh dist calls it once the images and vt3d are built.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
IMAGES='' VT3D='' OUT=''
while [ $# -gt 0 ]; do
	case $1 in
	--images) IMAGES=${2:?} && shift 2 ;;
	--vt3d) VT3D=${2:?} && shift 2 ;;
	--out) OUT=${2:?} && shift 2 ;;
	*) echo "dist.sh: unknown option $1" >&2 && exit 2 ;;
	esac
done
if [ -z "$IMAGES" ] || [ -z "$VT3D" ] || [ -z "$OUT" ]; then
	echo "usage: dist.sh --images DIR --vt3d PATH --out DIR" >&2
	exit 2
fi

VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' "$ROOT/pyproject.toml")
CARGO_VERSION=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' "$ROOT/Cargo.toml")
[ "$VERSION" = "$CARGO_VERSION" ] || {
	echo "dist.sh: pyproject.toml says $VERSION, Cargo.toml $CARGO_VERSION" >&2
	exit 1
}
NAME=vt3-$VERSION-x86_64
WORK=$(mktemp -d "${TMPDIR:-/tmp}/vt3-dist.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
STAGE=$WORK/$NAME
mkdir -p "$STAGE/bin" "$STAGE/images" "$STAGE/examples" "$OUT"

# The wheel, built from a copy: setuptools writes build/ and *.egg-info
# next to the sources it builds.
mkdir -p "$WORK/src/docs"
cp -r "$ROOT/pyproject.toml" "$ROOT/vt3lab" "$WORK/src/"
cp "$ROOT/docs/vt3lab.md" "$WORK/src/docs/"
find "$WORK/src" -name __pycache__ -prune -exec rm -rf {} +
PYTHON=${PYTHON:-python3}
"$PYTHON" -m pip wheel -q --no-deps --no-build-isolation --no-index -w "$STAGE" "$WORK/src" >&2

cp "$VT3D" "$STAGE/bin/vt3d"
strip "$STAGE/bin/vt3d"
cp "$IMAGES/vmlinux" "$IMAGES/initramfs-vt3.cpio" "$STAGE/images/"
cp "$IMAGES/manifest.txt" "$STAGE/images/packages.txt"
cp -r "$ROOT/examples/ulp-suite" "$STAGE/examples/"
find "$STAGE/examples" -name __pycache__ -prune -exec rm -rf {} +

cat >"$STAGE/bin/vt3" <<'EOF'
#!/bin/sh
# vt3's launcher in a bundle: the lab (vt3lab) with this bundle's vt3d and
# guest images. vt3lab comes from the Python environment if installed
# there (pip install the bundle's wheel), else from the wheel itself.
here=$(cd "$(dirname "$0")/.." && pwd)
export VT3_BUNDLE="$here"
py=${PYTHON:-python3}
if ! "$py" -c 'import vt3lab' 2>/dev/null; then
	for wheel in "$here"/vt3lab-*.whl; do
		PYTHONPATH="$wheel${PYTHONPATH:+:$PYTHONPATH}"
	done
	export PYTHONPATH
fi
exec "$py" -m vt3lab.cli "$@"
EOF
chmod 755 "$STAGE/bin/vt3"

# Versions and content hashes: what a user's CI can pin and check.
RDMA_CORE=$(sed -n 's/^RDMA_CORE_VERSION=//p' "$ROOT/provider/build-rdma-core.sh")
"$PYTHON" - "$STAGE" "$VERSION" "$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)" \
	"$(cat "$IMAGES/kver")" "$RDMA_CORE" <<'EOF'
import hashlib, json, sys, time
from pathlib import Path
stage, version, commit, kver, rdma_core = Path(sys.argv[1]), *sys.argv[2:]
files = {str(p.relative_to(stage)): {"sha256": hashlib.sha256(p.read_bytes()).hexdigest(), "size": p.stat().st_size}
         for p in sorted(stage.rglob("*")) if p.is_file()}
manifest = {"name": "vt3", "version": version, "commit": commit, "arch": "x86_64",
            "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "guest_kernel": kver, "rdma_core": f"{rdma_core} with libvt3",
            "needs": ["qemu-system-x86_64 >= 7.2", "python3 >= 3.9"],
            "files": files}
(stage / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
EOF

tar -C "$WORK" -cf - "$NAME" | zstd -q -T0 -10 -o "$OUT/$NAME.tar.zst" -f
echo "$OUT/$NAME.tar.zst"
