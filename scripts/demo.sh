#!/usr/bin/env bash
# `make demo`: a retraining DAG through `airflow dags test` on the embedded defaults (a local Ray
# cluster, storage under AIRFLOW_HOME). Leaves no Ray process running, and fails if a task fails.
set -euo pipefail
cd "$(dirname "$0")/.."
py=.venv/bin/python
export AIRFLOW_HOME=${AIRFLOW_HOME:-$PWD/.airflow}
export AIRFLOW__CORE__DAGS_FOLDER=$PWD/dags AIRFLOW__CORE__LOAD_EXAMPLES=False
dag=${DEMO_DAG:-horovod_retraining}
date=${DEMO_DATE:-2026-11-01}

trap '"$py" -m airflow_provider_horovod.local down >/dev/null 2>&1 || true' EXIT
log=$AIRFLOW_HOME/demo-$dag.log
mkdir -p "$AIRFLOW_HOME"
# The embedded cluster starts while Airflow migrates its database and `airflow dags test` starts, rather
# than when the first Ray task asks for it: the task then finds it running (the start holds a lock).
if [ -z "${AIRFLOW_CONN_RAY_DEFAULT:-}" ]; then
  "$py" -m airflow_provider_horovod.local up >"$AIRFLOW_HOME/demo-cluster.log" 2>&1 &
fi
.venv/bin/airflow db migrate >/dev/null
echo "airflow dags test $dag $date  (log: $log)"
if ! .venv/bin/airflow dags test "$dag" "$date" >"$log" 2>&1; then
  tail -60 "$log"
  echo "demo failed: see $log" >&2
  exit 1
fi
"$py" scripts/demo_summary.py "$dag" "$log"
