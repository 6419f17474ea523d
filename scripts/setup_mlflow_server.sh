#!/usr/bin/env bash
# .venv-mlflow: MLflow's tracking server, for the tests that log trainings to a real one (`mlflow
# server` on SQLite). A venv of its own: the full mlflow package brings a web stack (Flask, SQLAlchemy,
# scikit-learn, pandas) that neither the cluster nor Airflow needs; the cluster has only the client
# (mlflow-skinny, the [mlflow] extra). Idempotent and cheap when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/versions.env

venv=.venv-mlflow
stamp=$venv/.ready
if [ -f "$stamp" ] && [ -z "$(find scripts/versions.env scripts/setup_mlflow_server.sh scripts/uv.sh -newer "$stamp")" ]; then
  exit 0
fi
source scripts/uv.sh
uv_venv "$venv" "$PYTHON_CLUSTER"
"$uv" pip install -q -p "$venv/bin/python" "mlflow==$MLFLOW"
touch "$stamp"
