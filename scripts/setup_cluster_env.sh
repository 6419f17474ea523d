#!/usr/bin/env bash
# .venv: the cluster's environment (Ray, torch, the patched Horovod) with Airflow beside it, for the
# embedded local cluster of `make demo` and as the Ray side of the tests. Idempotent and cheap when
# nothing changed (make calls it before demo and test).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/versions.env

venv=.venv
stamp=$venv/.ready
inputs=(pyproject.toml scripts/versions.env scripts/setup_cluster_env.sh scripts/uv.sh airflow_provider_horovod/build_horovod.py
  airflow_provider_horovod/horovod_source_edits.py)
if [ -f "$stamp" ] && [ -z "$(find "${inputs[@]}" -newer "$stamp")" ]; then
  exit 0
fi

source scripts/uv.sh
# --seed: pip too, for the Horovod build command below and for users of the environment.
uv_venv "$venv" "$PYTHON_CLUSTER" --seed
started=$SECONDS

# Horovod, with the provider's own build command (from the checkout: the package is installed
# afterwards): kept if installed, else installed from its wheel cache, else compiled (about a minute and
# a half on 2 cores, once per torch and Python) in an environment of its own with the same torch, while
# the rest installs here (nothing installs into an environment that a build reads).
build_horovod=(env PYTHONPATH="$PWD" "$venv/bin/python" -m airflow_provider_horovod.build_horovod)
status=3
if "$venv/bin/python" -c 'import torch' >/dev/null 2>&1; then
  status=0
  "${build_horovod[@]}" --if-cached || status=$?
fi
hvd_pid=
if [ "$status" = 3 ]; then
  # The build environment first, torch and the build tools (seconds: uv takes torch from its cache or the
  # index once for both environments), so that the compile, the longest step, starts at once. It finds
  # the wheel in the cache when there is one for the torch uv picks.
  uv_venv .build/horovod-env "$PYTHON_CLUSTER" --seed
  "$uv" pip install -q -p .build/horovod-env/bin/python "torch==$TORCH" \
    $("python$PYTHON_CLUSTER" -c 'from airflow_provider_horovod.build_horovod import BUILD_DEPS; print(*BUILD_DEPS)')
  # Its own session: a failed install below stops the whole build with it (kill -- -pid).
  PYTHONPATH=$PWD setsid .build/horovod-env/bin/python -m airflow_provider_horovod.build_horovod --wheel-only &
  hvd_pid=$!
  trap '[ -z "$hvd_pid" ] || kill -- "-$hvd_pid" 2>/dev/null || true' EXIT
elif [ "$status" != 0 ]; then
  exit "$status"
fi

"$uv" pip install -q -p "$venv/bin/python" -e ".[cluster,amazon,test,mlflow]" "torch==$TORCH" \
  "apache-airflow==$AIRFLOW" "ray[default,train]==$RAY" "mlflow-skinny==$MLFLOW" build twine
echo "$venv: packages installed in $((SECONDS - started)) s"

# While Horovod compiles or installs, Python writes the bytecode of what its check and the demo import first
# (uv installs without it), on a core the compile leaves idle at times, instead of after it.
"$venv/bin/python" -c 'import torch, ray.train, airflow.models' >/dev/null 2>&1 &
warm_pid=$!

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
  echo "$venv: Horovod built and installed in $((SECONDS - started)) s"
fi
wait "$warm_pid" || true
touch "$stamp"
