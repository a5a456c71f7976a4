#!/usr/bin/env bash
# LiveKit for Myna (docs/livekit-quickstart.md, README "LiveKit rooms"), into this checkout:
#   bash scripts/setup_livekit.sh        what trying Myna in a room needs:
#     - the `livekit` extra in .venv (`bash scripts/setup.sh livekit` when it is missing; the
#       livekit wheel carries the SDK's native library, its sdist does not, so a broken one is
#       reinstalled from the wheel);
#     - livekit-server v1.13.5 in the git-ignored .lk/bin, built with `go install` (Go >= 1.26; a
#       few minutes the first time). v1.13.6+ carry go.mod `replace` lines, which
#       `go install pkg@version` refuses, hence this pin. A livekit-server already on PATH is used
#       instead when there is no Go;
#     - livekit-client from npm into .lk/npm when npm is there (the page's "via LiveKit room"
#       lane, `myna serve --livekit-url`; nothing else needs it).
#   bash scripts/setup_livekit.sh dev    also redis-server from Debian (the tests' two-node cluster),
#                                        and for phone calls (docs/phone.md):
#                                        livekit-sip v1.0.0 in .lk/bin, built with Go and cgo against
#                                        Debian's libopus-dev, libopusfile-dev and libsoxr-dev, and
#                                        Debian's baresip (the tests' caller). `scripts/setup.sh dev`
#                                        runs this. Without Go the LiveKit tests skip and say so.
# Run it again at any time: what is there already is kept. It ends by printing the next commands.
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-user}"
LIVEKIT_SERVER_VERSION=v1.13.5
LIVEKIT_CLIENT_VERSION=2.23.0
# The newest livekit-sip whose module the proxy serves in full here (v1.1+ are listed, not served).
LIVEKIT_SIP_VERSION=v1.0.0

if ! .venv/bin/python -c 'import myna, livekit.agents, livekit.api' 2>/dev/null; then
  echo "setup: installing myna with the livekit extra into .venv (bash scripts/setup.sh livekit)"
  bash scripts/setup.sh livekit
fi
.venv/bin/python -c 'import livekit.rtc' 2>/dev/null || {
  echo "setup: reinstalling the livekit SDK from its wheel (the installed one lacks its native library)"
  .venv/bin/python -m pip --disable-pip-version-check -q install --force-reinstall --only-binary livekit "livekit>=1.1.21,<1.2"
}

server=.lk/bin/livekit-server
if [ "$($server --version 2>/dev/null)" = "livekit-server version ${LIVEKIT_SERVER_VERSION#v}" ]; then
  echo "setup: livekit-server ${LIVEKIT_SERVER_VERSION#v} is in $server"
elif command -v go >/dev/null; then
  echo "setup: building livekit-server $LIVEKIT_SERVER_VERSION into .lk/bin with $(go version | cut -d' ' -f3) (a few minutes the first time)"
  mkdir -p .lk/bin
  GOBIN="$PWD/.lk/bin" CGO_ENABLED=0 go install "github.com/livekit/livekit-server/cmd/server@$LIVEKIT_SERVER_VERSION"
  mv .lk/bin/server "$server"   # go install names the binary after its package folder
elif command -v livekit-server >/dev/null; then
  server=$(command -v livekit-server)
  echo "setup: Go not found; using $server ($($server --version 2>/dev/null || echo 'version unknown'))"
else
  server=""
  if [ "$mode" = dev ]; then
    echo "setup: Go not found: the LiveKit room tests will be skipped (install Go >= 1.26, then rerun this)"
  else
    echo "setup: Go not found, and no livekit-server on PATH: install Go >= 1.26 and rerun this, or install" >&2
    echo "       LiveKit's own livekit-server build (its docs: \"Running LiveKit locally\") and rerun this" >&2
    exit 1
  fi
fi

if [ "$(node -p "require('./.lk/npm/node_modules/livekit-client/package.json').version" 2>/dev/null)" != "$LIVEKIT_CLIENT_VERSION" ]; then
  if command -v npm >/dev/null; then
    echo "setup: installing livekit-client $LIVEKIT_CLIENT_VERSION from npm into .lk/npm (the page's LiveKit room lane)"
    npm install --prefix .lk/npm --no-audit --no-fund --silent "livekit-client@$LIVEKIT_CLIENT_VERSION"
  else
    echo "setup: npm not found: the page's \"via LiveKit room\" lane will be unavailable (install npm, then rerun this)"
  fi
fi

if [ "$mode" = dev ]; then
  missing=()
  command -v redis-server >/dev/null || missing+=(redis-server)   # the tests' two-node cluster, livekit-sip's bus
  command -v baresip >/dev/null || missing+=(baresip)             # the phone tests' caller
  for lib in opus opusfile soxr; do                                # livekit-sip's cgo codecs
    pkg-config --exists "$lib" 2>/dev/null || missing+=("lib$lib-dev")
  done
  command -v pkg-config >/dev/null || missing+=(pkg-config)
  command -v gcc >/dev/null || missing+=(gcc)                      # cgo (without it Go builds no codecs)
  if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing Debian packages: ${missing[*]}"
    sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
    $sudo apt-get update -qq && $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
  sip=.lk/bin/livekit-sip
  if [ -x "$sip" ] && [ "$(cat .lk/bin/livekit-sip.version 2>/dev/null)" = "$LIVEKIT_SIP_VERSION" ]; then
    echo "setup: livekit-sip ${LIVEKIT_SIP_VERSION#v} is in $sip"
  elif command -v go >/dev/null; then
    # `go install pkg@version` needs the module's version list, which the proxy refuses for this
    # module: build it from a throwaway module that requires the exact version instead.
    echo "setup: building livekit-sip $LIVEKIT_SIP_VERSION into .lk/bin (a few minutes the first time)"
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    printf 'module myna.local/livekit-sip\n\ngo 1.24\n\nrequire github.com/livekit/sip %s\n' "$LIVEKIT_SIP_VERSION" > "$work/go.mod"
    printf '//go:build tools\n\npackage tools\n\nimport _ "github.com/livekit/sip/cmd/livekit-sip"\n' > "$work/tools.go"
    mkdir -p .lk/bin
    (cd "$work" && go mod tidy && CGO_ENABLED=1 go build -o "$OLDPWD/$sip" github.com/livekit/sip/cmd/livekit-sip)
    echo "$LIVEKIT_SIP_VERSION" > .lk/bin/livekit-sip.version
  fi
fi

if [ "$mode" != dev ] && [ -n "$server" ]; then
  cat <<EOF
setup: LiveKit is ready. Next (docs/livekit-quickstart.md), each terminal in this folder:
  terminal 1:  $server --config scripts/livekit-dev.yaml
               (a development server on ws://127.0.0.1:7880, API key devkey, secret secret,
               that hands clients no public STUN server)
  terminal 2:  export LIVEKIT_API_KEY=devkey LIVEKIT_API_SECRET=secret
               .venv/bin/myna room --url ws://127.0.0.1:7880 --room demo
  terminal 3:  export LIVEKIT_API_KEY=devkey LIVEKIT_API_SECRET=secret
               .venv/bin/myna talk --url ws://127.0.0.1:7880 --room demo "Hello from a LiveKit room."
EOF
fi
