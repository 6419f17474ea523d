#!/usr/bin/env bash
# Entrypoint wrapper for the Airflow containers: the ray_default connection comes from
# AHP_RAY_CONN_JSON (no secret in it) plus the Ray auth token read from the compose secret, so the
# token lives in neither the image nor the compose file.
set -euo pipefail
token_file=${AHP_RAY_TOKEN_FILE:-/run/secrets/ray_token}
if [ -n "${AHP_RAY_CONN_JSON:-}" ] && [ -r "$token_file" ]; then
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
