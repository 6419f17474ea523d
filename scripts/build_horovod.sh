#!/usr/bin/env bash
# Build Horovod 0.28.1 (its last release) against the pinned torch and install it into the venv.
#
# Horovod 0.28.1 as released does not compile against torch >= 2.1: torch's headers need C++17
# and Horovod asks for C++14 (and C++11 for its bundled Gloo). Three one-line edits of the sdist
# fix that. The wheel is cached outside git, keyed by the versions it was built against, so a
# second set-up installs it without rebuilding.
#
# Usage: scripts/build_horovod.sh PYTHON   (the venv's python, with torch already installed)
# Env:   HOROVOD_WHEEL_CACHE  where wheels are kept (default: ~/.cache/airflow-provider-horovod)
#        HOROVOD_GPU_OPERATIONS=NCCL  to build the GPU variant (needs CUDA's nvcc; used by docker/).
#          Without HOROVOD_NCCL_HOME/_INCLUDE/_LIB it links the NCCL that PyPI's torch brings.
#        HOROVOD_BUILD_CUDA_CC_LIST  e.g. 90: compile the GPU kernels for these architectures only
set -euo pipefail

py=${1:?usage: build_horovod.sh PYTHON}
version=0.28.1
cache=${HOROVOD_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/airflow-provider-horovod}
torch_version=$("$py" -c 'import torch; print(torch.__version__)')
py_tag=$("$py" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
variant=${HOROVOD_GPU_OPERATIONS:+gpu-$HOROVOD_GPU_OPERATIONS}
key="horovod-$version-torch-$torch_version-$py_tag-${variant:-cpu}"
wheel_dir="$cache/$key"

if "$py" -c 'import horovod.torch' >/dev/null 2>&1; then
  echo "horovod $version already installed"
  exit 0
fi

if ! ls "$wheel_dir"/horovod-*.whl >/dev/null 2>&1; then
  echo "building horovod $version against torch $torch_version (a few minutes, once)"
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  "$py" -m pip download --no-deps --no-binary :all: --no-build-isolation \
    -d "$work" "horovod==$version" >/dev/null
  tar -xzf "$work/horovod-$version.tar.gz" -C "$work"
  src="$work/horovod-$version"
  # The three edits: C++17 for Horovod, its torch extension and its bundled Gloo.
  sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' \
    "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"
  sed -i 's/-std=c++11/-std=c++17/' "$src/third_party/gloo/CMakeLists.txt"
  grep -q 'CMAKE_CXX_STANDARD 17' "$src/CMakeLists.txt"
  grep -q 'CMAKE_CXX_STANDARD 17' "$src/horovod/torch/CMakeLists.txt"
  grep -q -- '-std=c++17' "$src/third_party/gloo/CMakeLists.txt"
  # GCC 13 no longer includes <string> and <stdexcept> through other headers: two missing includes.
  sed -i '0,/^#include/s//#include <string>\n#include/' "$src/horovod/common/group_table.h"
  sed -i '0,/^#include/s//#include <stdexcept>\n#include/' "$src/horovod/common/common.h"
  grep -q '^#include <string>' "$src/horovod/common/group_table.h"
  grep -q '^#include <stdexcept>' "$src/horovod/common/common.h"
  if [ "${HOROVOD_GPU_OPERATIONS:-}" = NCCL ] && [ -z "${HOROVOD_NCCL_HOME:-}${HOROVOD_NCCL_INCLUDE:-}${HOROVOD_NCCL_LIB:-}" ]; then
    # The NCCL that torch loads (PyPI's nvidia-nccl-* package): one NCCL in the process, not two.
    nccl_h=$("$py" -c 'import glob, site; print(next(iter(sorted(h for r in site.getsitepackages()
      for h in glob.glob(r + "/nvidia/**/include/nccl.h", recursive=True))), ""))')
    if [ -n "$nccl_h" ]; then
      nccl_dir=$(dirname "$(dirname "$nccl_h")")
      # CMake looks for libnccl.so; the package has only libnccl.so.2.
      mkdir -p "$work/nccl-lib"
      ln -s "$nccl_dir/lib/libnccl.so.2" "$work/nccl-lib/libnccl.so"
      export HOROVOD_NCCL_INCLUDE="$nccl_dir/include" HOROVOD_NCCL_LIB="$work/nccl-lib" HOROVOD_NCCL_LINK=SHARED
      echo "using torch's NCCL: $nccl_dir"
    fi
  fi
  "$py" -m pip install -q cmake wheel setuptools >/dev/null
  export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_TENSORFLOW=1 \
    HOROVOD_WITHOUT_MXNET=1 HOROVOD_CPU_OPERATIONS=GLOO
  export MAKEFLAGS=${MAKEFLAGS:-"-j$(nproc)"}
  # CMake 4 (what `pip install cmake` gives) refuses the bundled Gloo's cmake_minimum_required(<3.5).
  export CMAKE_POLICY_VERSION_MINIMUM=3.5
  mkdir -p "$work/dist"
  "$py" -m pip wheel --no-deps --no-build-isolation -w "$work/dist" "$src"
  mkdir -p "$wheel_dir"
  mv "$work"/dist/horovod-*.whl "$wheel_dir/"
fi

"$py" -m pip install --no-deps "$wheel_dir"/horovod-*.whl
# Horovod's own runtime dependencies (the wheel was installed without them).
"$py" -m pip install -q cffi cloudpickle psutil pyyaml packaging
