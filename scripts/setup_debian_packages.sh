#!/usr/bin/env bash
# The Debian packages the tests use, in one apt-get (two at once would fight over dpkg's lock):
# Chromium for the browser tests (Playwright drives it; no browser download of its own) and the
# PostgreSQL server for the real-stack tests (harness/postgres.py starts a server of its own from its
# binaries; nothing is configured system-wide). Cheap when both are there.
set -euo pipefail
missing=()
[ -x /usr/bin/chromium ] || missing+=(chromium)
{ compgen -G "/usr/lib/postgresql/*/bin/pg_ctl" >/dev/null && id postgres >/dev/null 2>&1; } || missing+=(postgresql)
# `make chaos`'s spread deployment: Redis as the Celery broker, iptables for its partitions and lossy links.
[ -x /usr/bin/redis-server ] || missing+=(redis-server)
[ -x /usr/sbin/iptables ] || missing+=(iptables)
[ ${#missing[@]} -eq 0 ] && exit 0
sudo=$([ "$(id -u)" = 0 ] || echo sudo)
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
