#!/usr/bin/env bash
# Install Myna (when pyproject.toml is newer than the last install) and start the worker with
# the embedded offline voice. Extra arguments go to `myna serve`, e.g. `--port 9000`.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/myna ] || [ pyproject.toml -nt .venv/.myna-installed ]; then
  bash scripts/setup.sh runtime
  touch .venv/.myna-installed
fi
exec .venv/bin/myna serve "$@"
