#!/usr/bin/env bash
# Debian's Chromium for the browser tests (Playwright drives it; no browser download of its own).
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
  exit 0
fi
sudo=$([ "$(id -u)" = 0 ] || echo sudo)
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends chromium >/dev/null
