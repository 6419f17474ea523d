#!/usr/bin/env bash
# The Training views' bundle: airflow_provider_horovod/plugins/www (sources, package.json and its lock
# file) built with packages from the npm registry into plugins/www/dist (ignored), which the wheel
# carries (package-data). Needs Node.js >= 20.19 and npm. Cheap when nothing changed. The packages
# include the linter that scripts/check_ui.sh runs there.
#
# node_modules stays out of the package folder, in .build/ui: that folder travels with every Ray job.
set -euo pipefail
cd "$(dirname "$0")/.."
www=airflow_provider_horovod/plugins/www
work=.build/ui
stamp=.build/ui.ready
if [ -f "$stamp" ] && [ -f "$www/dist/training.js" ] && \
   [ -z "$(find "$www" scripts/build_ui.sh -path "$www/dist" -prune -o -newer "$stamp" -print | head -1)" ]; then
  exit 0
fi
command -v npm >/dev/null || { echo "scripts/build_ui.sh: npm (Node.js >= 20.19) builds the Training views; install Node.js" >&2; exit 1; }
# No "new npm available" notice in the set-up's output.
export npm_config_update_notifier=false
mkdir -p "$work"
rm -rf "${work:?}/src" "${work:?}/public" "${work:?}/test"
cp -r "$www/package.json" "$www/package-lock.json" "$www/vite.config.js" "$www/eslint.config.js" "$www/src" \
  "$www/public" "$www/test" "$work/"
# The packages again only when the lock file changed.
if ! cmp -s "$www/package-lock.json" "$work/node_modules/.ahp-package-lock.json"; then
  (cd "$work" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
  cp "$www/package-lock.json" "$work/node_modules/.ahp-package-lock.json"
fi
(cd "$work" && AHP_UI_OUT="$OLDPWD/$www/dist" npx --no-install --loglevel=error vite build --logLevel warn)
echo "the Training views built in $SECONDS s"
touch "$stamp"
