#!/bin/sh
# Installs Debian's chromium for the browser tests. Idempotent: does nothing when it is already there.
# Playwright's own browser download needs the open internet; the Debian package comes from the package mirror.
set -eu
CHROMIUM="${MWMS_CHROMIUM:-/usr/bin/chromium}"
if [ -x "$CHROMIUM" ]; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "chromium is missing at $CHROMIUM and this user is not root: run 'sudo apt-get install -y chromium'" >&2
    exit 2
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "chromium is missing at $CHROMIUM and apt-get is not available: install chromium by hand" >&2
    exit 2
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >/dev/null
apt-get install -y -q --no-install-recommends chromium fonts-dejavu-core >/dev/null
test -x "$CHROMIUM"
