#!/usr/bin/env bash
# An Airflow-side environment as users have one: stock Airflow, and the provider installed from its
# built wheel with the given extras, nothing of the training stack.
#
# Usage: scripts/setup_airflow_env.sh VENV PYTHON AIRFLOW_VERSION EXTRAS
#   e.g. scripts/setup_airflow_env.sh .venv-airflow 3.11 3.3.2 amazon,test
# The wheel is built from the checkout into .build/dist (ignored) by `uv build`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/versions.env
venv=$1 python=$2 airflow=$3 extras=$4

# A wheel of the current sources: rebuilt when a file of the package changed. Under a lock: make runs
# this script for two environments at once, and the second waits for the first one's wheel.
dist=.build/dist
mkdir -p .build
exec 9>.build/wheel.lock
flock 9
if [ ! -f .build/wheel.ready ] || [ -n "$(find airflow_provider_horovod pyproject.toml README.md -newer .build/wheel.ready -not -name '*.pyc' | head -1)" ]; then
  rm -rf "$dist" && mkdir -p "$dist"
  source scripts/uv.sh
  "$uv" build -q -p "$(python_of "$PYTHON_CLUSTER")" --out-dir "$dist" . >/dev/null
  touch .build/wheel.ready
fi
flock -u 9
wheel=$(ls "$dist"/airflow_provider_horovod-*.whl)

stamp=$venv/.ready
if [ -f "$stamp" ] && [ -z "$(find "$wheel" scripts/setup_airflow_env.sh scripts/uv.sh scripts/versions.env -newer "$stamp")" ]; then
  exit 0
fi
[ -n "${uv-}" ] || source scripts/uv.sh
uv_venv "$venv" "$python"
# The same version number as the last install: --reinstall-package takes the new wheel's files.
"$uv" pip install -q -p "$venv/bin/python" --reinstall-package airflow-provider-horovod \
  "apache-airflow==$airflow" "$wheel[$extras]"
touch "$stamp"
