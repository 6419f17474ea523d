#!/usr/bin/env bash
# The Training views' JavaScript, checked: ESLint over the sources (plugins/www/eslint.config.js, no
# warning allowed) and node's own test runner over the pure modules (plugins/www/test: the charts'
# options, the history's picks). Both run in .build/ui, where scripts/build_ui.sh copies the sources
# and installs the packages (no browser). Paths in ESLint's report are relative to plugins/www.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build_ui.sh
cd .build/ui
npx --no-install --loglevel=error eslint --max-warnings=0 .
node --test --test-reporter=spec test/
