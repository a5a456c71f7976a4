#!/usr/bin/env bash
# LiveKit for `scripts/setup.sh dev` (README "LiveKit rooms"): everything the room tests and
# the page's room lane need, in the git-ignored .lk/ folder or from Debian.
#   - livekit-server v1.13.5, built with `go install` into .lk/bin (needs Go >= 1.26; without Go
#     the LiveKit tests skip and say so). v1.13.6+ carry go.mod `replace` lines, which
#     `go install pkg@version` refuses, hence this pin.
#   - redis-server from Debian (two server nodes share it).
#   - livekit-client from npm into .lk/npm (the room lane of the page; served by `myna serve`).
set -euo pipefail
cd "$(dirname "$0")/.."
LIVEKIT_SERVER_VERSION=v1.13.5
LIVEKIT_CLIENT_VERSION=2.23.0

# The livekit wheel carries the SDK's native library; its sdist does not (it would not load).
.venv/bin/python -c 'import livekit.rtc' 2>/dev/null \
  || .venv/bin/python -m pip --disable-pip-version-check -q install --force-reinstall --only-binary livekit "livekit>=1.1.21,<1.2"

if [ "$(.lk/bin/livekit-server --version 2>/dev/null)" = "livekit-server version ${LIVEKIT_SERVER_VERSION#v}" ]; then
  :
elif command -v go >/dev/null; then
  echo "setup: building livekit-server $LIVEKIT_SERVER_VERSION with $(go version | cut -d' ' -f3) (a few minutes the first time)"
  mkdir -p .lk/bin
  GOBIN="$PWD/.lk/bin" CGO_ENABLED=0 go install "github.com/livekit/livekit-server/cmd/server@$LIVEKIT_SERVER_VERSION"
  mv .lk/bin/server .lk/bin/livekit-server   # go install names the binary after its package folder
else
  echo "setup: Go not found: the LiveKit room tests will be skipped (install Go >= 1.26, then rerun this)"
fi

if ! command -v redis-server >/dev/null; then
  echo "setup: installing Debian's redis-server"
  sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -qq && $sudo apt-get install -y -qq redis-server >/dev/null
fi

if [ "$(node -p "require('./.lk/npm/node_modules/livekit-client/package.json').version" 2>/dev/null)" != "$LIVEKIT_CLIENT_VERSION" ]; then
  if command -v npm >/dev/null; then
    echo "setup: installing livekit-client $LIVEKIT_CLIENT_VERSION from npm into .lk/npm"
    npm install --prefix .lk/npm --no-audit --no-fund --silent "livekit-client@$LIVEKIT_CLIENT_VERSION"
  else
    echo "setup: npm not found: the page's LiveKit room lane will be unavailable (install npm, then rerun this)"
  fi
fi
