#!/usr/bin/env bash
# A wheelhouse of Myna's core dependencies (pyproject's [project] dependencies, at the versions
# .venv has), for tests/test_wheel.py: the tests run in a network namespace without the package
# index, so the test installs the freshly built wheel into a new venv with
#   pip install --no-index --find-links WHEELHOUSE dist/myna-*.whl
# and pip resolves the wheel's own requirements from these wheels alone (a requirement missing
# from them fails the install, as it would fail a user's). `scripts/setup.sh dev` runs this.
#   bash scripts/wheelhouse.sh     (~200 MB of wheels, ~30 s the first time; then nothing to do)
# Where: $MYNA_WHEELHOUSE, by default ~/.cache/myna/wheelhouse (outside the checkout, so a fresh
# clone on the same machine reuses it). It is collected again, whole, only when it cannot satisfy
# the dependencies at .venv's versions any more (an offline `pip install --dry-run` says; ~4 s).
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${MYNA_WHEELHOUSE:-${XDG_CACHE_HOME:-$HOME/.cache}/myna/wheelhouse}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Constraints: .venv's versions (URL installs cannot be constraints and are left out).
.venv/bin/python -m pip --disable-pip-version-check freeze --exclude-editable | grep -v ' @ ' > "$work/constraints.txt" || true
.venv/bin/python -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))' \
  > "$work/requirements.txt"
if [ -d "$dir" ] && .venv/bin/python -m pip --disable-pip-version-check install -q --dry-run --ignore-installed \
     --no-index --find-links "$dir" -c "$work/constraints.txt" -r "$work/requirements.txt" >/dev/null 2>&1; then
  exit 0
fi
echo "setup: collecting wheels of myna's dependencies into $dir (for tests/test_wheel.py; ~200 MB the first time)"
mkdir -p "$dir"
# Into a new folder (wheels already here are reused), then in place of the old one: no stale versions.
.venv/bin/python -m pip --disable-pip-version-check wheel -q --progress-bar off -w "$work/wheels" --find-links "$dir" \
  -c "$work/constraints.txt" -r "$work/requirements.txt"
rm -rf "$dir.old" && mv "$dir" "$dir.old" && mv "$work/wheels" "$dir" && rm -rf "$dir.old"
echo "setup: wheelhouse ready: $(ls "$dir" | grep -c '\.whl$') wheels, $(du -sh "$dir" | cut -f1)"
