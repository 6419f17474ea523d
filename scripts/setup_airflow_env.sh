#!/usr/bin/env bash
# An Airflow-side environment as users have one: stock Airflow, and the provider installed from its
# built wheel with the given extras, nothing of the training stack.
#
# Usage: scripts/setup_airflow_env.sh VENV PYTHON AIRFLOW_VERSION EXTRAS
#   e.g. scripts/setup_airflow_env.sh .venv-airflow 3.11 3.3.2 amazon,test
# The wheel is built from the checkout into .build/dist (ignored) by the cluster env's `build`.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=$1 python=$2 airflow=$3 extras=$4

# A wheel of the current sources: rebuilt when a file of the package changed. Under a lock: make runs
# this script for two environments at once, and the second waits for the first one's wheel.
dist=.build/dist
mkdir -p .build
exec 9>.build/wheel.lock
flock 9
if [ ! -f .build/wheel.ready ] || [ -n "$(find airflow_provider_horovod pyproject.toml README.md -newer .build/wheel.ready -not -name '*.pyc' | head -1)" ]; then
  rm -rf "$dist" && mkdir -p "$dist"
  .venv/bin/python -m build -q --outdir "$dist" . >/dev/null
  touch .build/wheel.ready
fi
flock -u 9
wheel=$(ls "$dist"/airflow_provider_horovod-*.whl)

stamp=$venv/.ready
if [ -f "$stamp" ] && [ -z "$(find "$wheel" scripts/setup_airflow_env.sh scripts/versions.env -newer "$stamp")" ]; then
  exit 0
fi
[ -x "$venv/bin/python" ] || PYENV_VERSION=$(pyenv versions --bare 2>/dev/null | grep -E "^$python\.[0-9]+$" | tail -1) \
  "python$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
# --no-compile: .pyc only for the modules imported (Python writes them on first use), not for all.
"$venv/bin/python" -m pip install -q --no-compile "apache-airflow==$airflow" "$wheel[$extras]"
# The same version number as the last install: make pip take the new wheel's files.
"$venv/bin/python" -m pip install -q --force-reinstall --no-deps "$wheel"
touch "$stamp"
