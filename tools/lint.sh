#!/usr/bin/env bash
# The lint stage of `./run-vm.sh check` (it runs first): every linter the
# project keeps clean, each a pass or a failure of its own, and a closing
# `N passed, N failed` line. Exits non-zero when any failed.
#
#   tools/lint.sh [STAGE...]     stages: rustfmt clippy shellcheck flake8
#                                kmod mutant-anchors (default: all)
#
# A finding is fixed, or listed in that tool's config with its reason:
# rustfmt.toml, .shellcheckrc, .flake8, guest-driver/.checkpatch.conf.
# Needs cargo with rustfmt and clippy, shellcheck, Debian's python3-flake8
# and sparse (run-vm.sh installs the Debian packages).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-/usr/bin/python3}
cd "$ROOT"

# Every shell script of the repository: *.sh and anything with a sh/bash
# shebang (images/init, .ci/run).
shell_scripts() {
	git ls-files -z | while IFS= read -r -d '' f; do
		case $f in
		*.sh) printf '%s\n' "$f" ;;
		*.py | *.rs | *.c | *.h | *.md | *.toml | *.json | *.xml) ;;
		*) [ -f "$f" ] && head -n 1 "$f" | grep -qE '^#!.*\b(ba)?sh\b' && printf '%s\n' "$f" ;;
		esac
	done
}

lint_rustfmt() {
	cargo fmt --all -- --check &&
		(cd device/fuzz && cargo fmt -- --check) &&
		(cd iwarp/fuzz && cargo fmt -- --check)
}
lint_clippy() { cargo clippy -q --workspace --all-targets -- -D warnings; }
lint_shellcheck() {
	local files
	mapfile -t files < <(shell_scripts)
	[ ${#files[@]} -gt 0 ] || { echo "no shell scripts found" >&2; return 1; }
	shellcheck "${files[@]}" && echo "shellcheck: ${#files[@]} scripts"
}
lint_flake8() { "$PYTHON" -m flake8 vt3lab tests examples; }
lint_kmod() { "$ROOT/tools/lint-kmod.sh"; }
lint_mutant_anchors() { "$ROOT/tools/mutants.sh" --check-anchors; }

ALL=(rustfmt clippy shellcheck flake8 kmod mutant-anchors)
stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=("${ALL[@]}")
passed=0 failed=0
for s in "${stages[@]}"; do
	fn=lint_${s//-/_}
	declare -F "$fn" >/dev/null || { echo "lint: unknown stage '$s' (${ALL[*]})" >&2; exit 2; }
	start=$SECONDS
	if "$fn" >&2; then
		passed=$((passed + 1))
		echo "lint: $s ok ($((SECONDS - start)) s)" >&2
	else
		failed=$((failed + 1))
		echo "lint: $s FAILED ($((SECONDS - start)) s)" >&2
	fi
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
