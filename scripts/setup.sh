#!/usr/bin/env bash
# Set up Myna in ./.venv on a fresh machine:
#   bash scripts/setup.sh            the main job: the worker with the embedded voice (no PyTorch)
#   bash scripts/setup.sh EXTRA...   add extras: dsm (PyTorch, several GB), pipecat, race (the page's Pipecat lanes),
#                                    livekit, bench, hub, docs
#   bash scripts/setup.sh dev        everything the tests need (all of the above, Chromium included)
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-runtime}"
case " $* " in *" dev "*) mode=dev ;; esac  # dev is every extra: it may come with others, in any place
python="${PYTHON:-python3.11}"
command -v "$python" >/dev/null || python=python3

if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $("$python" --version)"
  "$python" -m venv .venv
fi
# pip, printing one line per package it downloads (name, size) and one as it installs them, so a
# long install shows where it is; errors still come through whole on stderr.
pip() {
  PYTHONUNBUFFERED=1 .venv/bin/python -m pip --disable-pip-version-check "$@" --progress-bar off | awk '
    /^ *Downloading / { print "  downloading " $2 " " $3 $4; fflush() }
    /^ *Using cached / { print "  cached " $3; fflush() }
    /^Installing collected packages:/ { print "  installing " split($0, names, ",") " packages..."; fflush() }'
}
# torch first, exactly this version: a looser request may pick another build. From PyPI
# this is the CUDA build with its nvidia-* wheels (several GB); it runs on the CPU.
torch_first() {
  .venv/bin/python -c 'import torch, sys; sys.exit(torch.__version__.split("+")[0] != "2.13.0")' 2>/dev/null \
    || { echo "setup: installing torch 2.13.0 (the dsm extra; a download of several GB)"; pip install torch==2.13.0; }
}

if [ "$mode" = dev ]; then
  torch_first
  echo "setup: installing myna with its test extras, the dsm engine and the framework plug-ins"
  pip install -e ".[dev,dsm,pipecat,livekit]"
  # The DSM reference implementation is a test oracle only: no dependencies of its own pins.
  pip install --no-deps "moshi==0.2.13"   # its imports (einops, sphn, huggingface-hub) are dev extras
  bash scripts/setup_livekit.sh dev   # livekit-server, Redis, livekit-client (LiveKit rooms)
  bash scripts/wheelhouse.sh          # the wheels tests/test_wheel.py installs from (the tests reach no index)
  missing=()
  command -v chromium >/dev/null || missing+=(chromium)    # browser tests
  command -v ip >/dev/null || missing+=(iproute2)          # the loopback-only test namespace
  if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing Debian packages: ${missing[*]}"
    sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
    $sudo apt-get update -qq && $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
elif [ "$mode" = runtime ]; then
  echo "setup: installing myna (the embedded voice; no PyTorch)"
  pip install -e .
else
  extras=$(IFS=,; echo "$*")
  case ",$extras," in *,dsm,*) torch_first ;; esac
  echo "setup: installing myna[$extras]"
  pip install -e ".[$extras]"
fi
echo "setup: done in ${SECONDS} s"
