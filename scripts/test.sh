#!/usr/bin/env bash
# Install what the tests need (Python packages, Debian chromium) and run them all.
# The run happens in a network namespace that holds only `lo` (DESIGN.md §5): nothing a test
# does can leave loopback. Extra arguments go to pytest, e.g. `bash scripts/test.sh -k playout`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev
mkdir -p test-artifacts
if [ "$(id -u)" = 0 ]; then ns=(unshare -n); else ns=(unshare -rn); fi
exec "${ns[@]}" sh -c 'ip link set lo up && exec .venv/bin/python -m pytest "$@"' pytest -ra "$@"
