#!/usr/bin/env bash
# Another Ray minor laid over the cluster's environment (.venv): `ray` alone, no dependencies, in
# .build/ray-VERSION, put first on the cluster's PYTHONPATH (the tests read AHP_CLUSTER_PYTHONPATH). The
# rest (torch, Horovod, Ray's own dependencies) is .venv's, which every tested minor accepts. Idempotent
# and cheap when done: a stamp beside it. Prints the folder.
#
# Usage: scripts/setup_ray_layer.sh [VERSION]   (default: the oldest tested minor, RAY_OLDEST)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/versions.env

version=${1:-$RAY_OLDEST}
layer=.build/ray-$version
stamp=$layer/.ready
if [ ! -f "$stamp" ]; then
  rm -rf "$layer"
  source scripts/uv.sh
  "$uv" pip install -q -p .venv/bin/python --no-deps --target "$layer" "ray==$version" >&2
  # The layer's Ray must be the one a cluster-side process imports.
  found=$(PYTHONPATH="$PWD/$layer" .venv/bin/python -c 'import ray; print(ray.__version__)')
  if [ "$found" != "$version" ]; then
    echo "scripts/setup_ray_layer.sh: $layer gives Ray $found, not $version" >&2
    exit 1
  fi
  touch "$stamp"
fi
echo "$PWD/$layer"
