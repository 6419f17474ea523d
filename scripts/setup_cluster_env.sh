#!/usr/bin/env bash
# .venv: the cluster's environment (Ray, torch, the patched Horovod) with Airflow beside it, for the
# embedded local cluster of `make demo` and as the Ray side of the tests. Idempotent and cheap when
# nothing changed (make calls it before demo and test).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/versions.env

venv=.venv
stamp=$venv/.ready
inputs=(pyproject.toml scripts/versions.env scripts/setup_cluster_env.sh airflow_provider_horovod/build_horovod.py)
if [ -f "$stamp" ] && [ -z "$(find "${inputs[@]}" -newer "$stamp")" ]; then
  exit 0
fi

[ -x "$venv/bin/python" ] || "python$PYTHON_CLUSTER" -m venv "$venv"
pip=("$venv/bin/python" -m pip)
"${pip[@]}" install -q --upgrade pip
# torch first: Horovod compiles against it.
"${pip[@]}" install -q "torch==$TORCH"
# The provider's own build command (from the checkout: the package is installed afterwards).
PYTHONPATH=$PWD "$venv/bin/python" -m airflow_provider_horovod.build_horovod
"${pip[@]}" install -q -e ".[cluster,amazon,test,mlflow]" "apache-airflow==$AIRFLOW" "ray[default,train]==$RAY" \
  "mlflow-skinny==$MLFLOW" build twine
touch "$stamp"
