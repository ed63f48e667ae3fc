#!/usr/bin/env bash
# Installs what spaced and its tests need and a fresh Debian machine may lack (as root, with
# apt). `make run` and `make test` call it; it does nothing when everything is there.
#   scripts/deps.sh        what spaced needs to run
#   scripts/deps.sh test   also what the tests need (Node.js for the E2B SDK test, its npm packages)
set -euo pipefail
cd "$(dirname "$0")/.."
need=()
{ [ -x /bin/busybox ] && file -L /bin/busybox 2>/dev/null | grep -q 'statically linked'; } || need+=(busybox-static)
command -v file >/dev/null || need+=(file)
command -v ip >/dev/null || need+=(iproute2)
command -v mmdebstrap >/dev/null || need+=(mmdebstrap)   # builds the base template
command -v mkfs.ext4 >/dev/null || need+=(e2fsprogs)     # sandbox disks (resources.disk_mib), ext4 export
command -v nsenter >/dev/null || need+=(util-linux)      # mount, losetup, nsenter
if [ "${1:-}" = test ]; then
  command -v node >/dev/null || need+=(nodejs npm)       # the E2B SDK compatibility test
fi
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "deps: missing ${need[*]}: install them (Debian package names) or run as root on Debian" >&2
    exit 1
  fi
  echo "deps: installing ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
fi
if [ "${1:-}" = test ] && [ ! -d e2e/e2b/node_modules ]; then
  (cd e2e/e2b && npm ci --no-audit --no-fund)            # the unmodified E2B SDK, pinned
fi
