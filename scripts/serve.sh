#!/usr/bin/env bash
# Install Myna (first run only) and start the worker with the embedded offline voice.
# Extra arguments go to `myna serve`, e.g. `bash scripts/serve.sh --port 9000`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh runtime
exec .venv/bin/myna serve "$@"
