#!/usr/bin/env bash
# Install what the tests need (Python packages, Debian chromium) and run them.
# The run happens in a network namespace that holds only `lo`: nothing a test
# does can leave loopback. Each run writes test-artifacts/durations.txt (wall time, the slowest
# tests) and prints its head.
#   bash scripts/test.sh               everything (what CI runs), in two phases: the tests on
#                                      MYNA_TEST_WORKERS processes (default 4, pytest-xdist, a
#                                      file per process at a time, the longest files first), then
#                                      the `serial` ones (bounds on real time that need the CPU)
#                                      one at a time
#   bash scripts/test.sh --quick       the first phase only, without the slow tiers (livekit, browser,
#                                      e2e, and tests marked slow: over ~5 s in the parallel run)
#   bash scripts/test.sh ARGS...       one pytest run of ARGS on one process (MYNA_TEST_WORKERS=N:
#                                      on N), e.g. `bash scripts/test.sh tests/audio -k playout`
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev
mkdir -p test-artifacts
if [ "$(id -u)" = 0 ]; then ns=(unshare -n); else ns=(unshare -rn); fi
pytest() {  # pytest ARGS...: one run in the loopback-only namespace
  "${ns[@]}" sh -c 'ip link set lo up && exec .venv/bin/python -m pytest -ra "$@"' pytest "$@"
}
export MYNA_TEST_STARTED="$(date +%s.%N)"  # the wall time in durations.txt spans both phases
if [ $# -gt 0 ] && [ "$*" != --quick ]; then
  if [ -n "${MYNA_TEST_WORKERS:-}" ]; then set -- -n "$MYNA_TEST_WORKERS" --dist loadfile "$@"; fi
  pytest "$@"
  exit
fi
if [ "$*" = --quick ]; then
  MYNA_TEST_PHASE=parallel pytest -n "${MYNA_TEST_WORKERS:-4}" --dist loadfile -m "not serial and not (livekit or browser or e2e or slow)"
  exit
fi
# The serial tests run once the others are done, with the machine to themselves (side by side
# with the niced parallel phase, they passed, but the run took longer: the suite is bound by the
# CPU, not by waiting). Either phase failing fails the run, after both have run; exit status 5
# is "no test collected".
status=0
MYNA_TEST_PHASE=parallel pytest -n "${MYNA_TEST_WORKERS:-4}" --dist loadfile -m "not serial" || status=$?
MYNA_TEST_PHASE=serial pytest -p no:xdist -m serial || { s=$?; [ "$s" = 5 ] || status=$s; }
exit "$status"
