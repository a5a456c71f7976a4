#!/usr/bin/env bash
# Install what the tests need (Python packages, Debian chromium) and run them all.
# The run happens in a network namespace that holds only `lo`: nothing a test
# does can leave loopback. Each run writes test-artifacts/durations.txt (wall time, the slowest
# tests) and prints its head.
#   bash scripts/test.sh               everything, one process (what CI runs)
#   bash scripts/test.sh --quick       all but the slow real-time tiers (livekit, browser, e2e)
#   MYNA_TEST_WORKERS=4 bash scripts/test.sh
#                                      on 4 processes (pytest-xdist, one file per process at a
#                                      time); on 2 cores the real-time tests' timing then fails
# Other arguments go to pytest, e.g. `bash scripts/test.sh -k playout`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev
mkdir -p test-artifacts
args=()
for arg in "$@"; do
  if [ "$arg" = --quick ]; then args+=(-m "not (livekit or browser or e2e)"); else args+=("$arg"); fi
done
if [ -n "${MYNA_TEST_WORKERS:-}" ]; then args=(-n "$MYNA_TEST_WORKERS" --dist loadfile "${args[@]}"); fi
if [ "$(id -u)" = 0 ]; then ns=(unshare -n); else ns=(unshare -rn); fi
exec "${ns[@]}" sh -c 'ip link set lo up && exec .venv/bin/python -m pytest "$@"' pytest -ra "${args[@]}"
