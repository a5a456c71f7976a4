#!/usr/bin/env bash
# Set up Myna in ./.venv on a fresh machine: `bash scripts/setup.sh` (runtime) or
# `bash scripts/setup.sh dev` (runtime + what the tests need, Chromium included).
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-runtime}"
python="${PYTHON:-python3.11}"
command -v "$python" >/dev/null || python=python3

if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $("$python" --version)"
  "$python" -m venv .venv
fi
pip() { .venv/bin/python -m pip --disable-pip-version-check -q "$@"; }
# torch first, exactly this version: a looser request pulls a multi-GB CUDA build (DESIGN.md §8).
.venv/bin/python -c 'import torch, sys; sys.exit(torch.__version__.split("+")[0] != "2.13.0")' 2>/dev/null \
  || { echo "setup: installing torch 2.13.0"; pip install torch==2.13.0; }

if [ "$mode" = dev ]; then
  echo "setup: installing myna with its test extras and the framework plug-ins"
  pip install -e ".[dev,pipecat,livekit]"
  # The DSM reference implementation is a test oracle only: no dependencies of its own pins.
  pip install --no-deps "moshi==0.2.13"   # its imports (einops, sphn, huggingface-hub) are dev extras
  bash scripts/setup_livekit.sh   # livekit-server, Redis, livekit-client (LiveKit rooms)
  missing=()
  command -v chromium >/dev/null || missing+=(chromium)    # browser tests
  command -v ip >/dev/null || missing+=(iproute2)          # the loopback-only test namespace
  if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing Debian packages: ${missing[*]}"
    sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
    $sudo apt-get update -qq && $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
else
  echo "setup: installing myna"
  pip install -e .
fi
