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

# Horovod, with the provider's own build command (from the checkout: the package is installed
# afterwards): kept if installed, else installed from its wheel cache, else compiled (minutes, once per
# torch and Python) in an environment of its own with the same torch, while the rest installs here:
# pip is not safe against two installs into one environment at once.
build_horovod=(env PYTHONPATH="$PWD" "$venv/bin/python" -m airflow_provider_horovod.build_horovod)
status=3
if "$venv/bin/python" -c 'import torch' >/dev/null 2>&1; then
  status=0
  "${build_horovod[@]}" --if-cached || status=$?
fi
hvd_pid=
if [ "$status" = 3 ]; then
  # Its own session: a failed install below stops the whole build with it (kill -- -pid). It finds
  # the wheel in the cache when there is one for the torch pip picks.
  setsid bash -c '
    set -euo pipefail
    [ -x "$1/bin/python" ] || "python$2" -m venv "$1"
    "$1/bin/python" -m pip install -q --no-compile "torch==$3"
    PYTHONPATH=$PWD exec "$1/bin/python" -m airflow_provider_horovod.build_horovod --wheel-only' \
    build-horovod .build/horovod-env "$PYTHON_CLUSTER" "$TORCH" &
  hvd_pid=$!
  trap '[ -z "$hvd_pid" ] || kill -- "-$hvd_pid" 2>/dev/null || true' EXIT
elif [ "$status" != 0 ]; then
  exit "$status"
fi

"${pip[@]}" install -q --upgrade pip
# --no-compile: no .pyc for the thousands of modules never imported (Python writes those it imports).
"${pip[@]}" install -q --no-compile -e ".[cluster,amazon,test,mlflow]" "torch==$TORCH" "apache-airflow==$AIRFLOW" \
  "ray[default,train]==$RAY" "mlflow-skinny==$MLFLOW" build twine

if [ -n "$hvd_pid" ]; then
  if ! wait "$hvd_pid"; then
    hvd_pid=
    echo "scripts/setup_cluster_env.sh: building Horovod's wheel failed (its output is above); $venv is not ready" >&2
    exit 1
  fi
  hvd_pid=
  # Its work is in the cache: the build environment (a second torch) goes.
  rm -rf .build/horovod-env
  # The wheel is in the cache now: installs it and checks it (compiles here if this torch differs).
  "${build_horovod[@]}"
fi
touch "$stamp"
