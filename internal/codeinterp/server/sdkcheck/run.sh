#!/usr/bin/env bash
# Runs check.mjs: the real @e2b/code-interpreter SDK (pinned in package-lock.json) against a real
# code-interpreter server behind mock.mjs, all on loopback. Needs node >= 20.18 for the SDK (the
# server's own javascript kernels use whatever --node says) and the server's Debian packages.
#   internal/codeinterp/server/sdkcheck/run.sh
# SPACE_CODE_SERVER and SPACE_CODE_PYTHON as for test_server.py.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
server=${SPACE_CODE_SERVER:-$here/../server.py}
python=${SPACE_CODE_PYTHON:-/usr/bin/python3}
cd "$here"
[ -d node_modules/@e2b/code-interpreter ] || npm ci --no-audit --no-fund >/dev/null
tmp=$(mktemp -d)
free_port() { "$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
cport=$(free_port); mport=$(free_port)
mkdir -p "$tmp/home"
HOME="$tmp/home" "$python" "$server" --host 127.0.0.1 --port "$cport" --envs-url "http://127.0.0.1:$mport/envs" >"$tmp/server.log" 2>&1 &
spid=$!
node mock.mjs "$mport" "$cport" >"$tmp/mock.log" 2>&1 &
mpid=$!
cleanup() { kill -TERM "$spid" 2>/dev/null || true; kill "$mpid" 2>/dev/null || true; wait "$spid" "$mpid" 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
for _ in $(seq 1 300); do
  [ "$(curl -s "http://127.0.0.1:$cport/health" || true)" = OK ] && break
  kill -0 "$spid" 2>/dev/null || { cat "$tmp/server.log"; exit 1; }
  sleep 0.1
done
export E2B_API_KEY=e2b_0123456789abcdef0123456789abcdef E2B_API_URL="http://127.0.0.1:$mport" E2B_SANDBOX_URL="http://127.0.0.1:$mport"
node check.mjs || { echo "--- server log"; tail -40 "$tmp/server.log"; exit 1; }
# Again through a proxy that delivers bodies 97 bytes at a time.
kill "$mpid"; wait "$mpid" 2>/dev/null || true
MOCK_CHOP=97 node mock.mjs "$mport" "$cport" >>"$tmp/mock.log" 2>&1 &
mpid=$!
for _ in $(seq 1 50); do curl -s -o /dev/null "http://127.0.0.1:$mport/health" && break; sleep 0.1; done
node utf8.mjs || { echo "--- server log"; tail -40 "$tmp/server.log"; exit 1; }
