#!/usr/bin/env bash
# Entrypoint wrapper for the Airflow containers: the ray_default connection comes from
# AHP_RAY_CONN_JSON (no secret in it) plus the Ray auth token read from the compose secret, so the
# token lives in neither the image nor the compose file. Airflow's `_CMD` and `_SECRET` variants
# exist for config options only, not for AIRFLOW_CONN_* connections, hence this script.
set -euo pipefail
token_file=${AHP_RAY_TOKEN_FILE:-/run/secrets/ray_token}
if [ -n "${AHP_RAY_CONN_JSON:-}" ]; then
  # Without the token there would be no ray_default connection, and the provider would quietly
  # start an embedded Ray cluster in this container instead: stop here.
  if [ ! -s "$token_file" ]; then
    echo "with_ray_token.sh: no Ray token in $token_file; create docker/secrets/ray_token" >&2
    exit 1
  fi
  AIRFLOW_CONN_RAY_DEFAULT=$(python - "$token_file" <<'PY'
import json, os, sys
conn = json.loads(os.environ["AHP_RAY_CONN_JSON"])
with open(sys.argv[1]) as f:
    conn["password"] = f.read().strip()
print(json.dumps(conn))
PY
)
  export AIRFLOW_CONN_RAY_DEFAULT
fi
exec /usr/bin/dumb-init -- /entrypoint "$@"
