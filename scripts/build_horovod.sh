#!/usr/bin/env bash
# Build Horovod 0.28.1 (its last release) against the pinned torch and install it into the venv:
# python -m airflow_provider_horovod.build_horovod (the C++17 edits, the wheel cache, the check),
# run from this checkout, so it works before the package is installed.
#
# Usage: scripts/build_horovod.sh PYTHON   (the venv's python, with torch already installed)
#        Further arguments go to the module: --gpu, --cache DIR, --check-only.
# Env:   HOROVOD_WHEEL_CACHE, HOROVOD_GPU_OPERATIONS=NCCL, HOROVOD_NCCL_HOME/_INCLUDE/_LIB,
#        HOROVOD_BUILD_CUDA_CC_LIST: see the module's docstring.
set -euo pipefail

py=${1:?usage: scripts/build_horovod.sh PYTHON}
repo=$(cd "$(dirname "$0")/.." && pwd)
PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" exec "$py" -m airflow_provider_horovod.build_horovod "${@:2}"
