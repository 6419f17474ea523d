# A Ray node (head or worker) that can run the provider's training jobs: Ray 2.60, torch 2.13
# and Horovod 0.28.1 built by the project's own script (with its three C++17 edits).
# Build from the repository root:
#   CPU: docker build -f docker/ray.Dockerfile .
#   GPU: docker build -f docker/ray.Dockerfile --build-arg VARIANT=gpu .   (Horovod with NCCL)
ARG VARIANT=cpu
FROM rayproject/ray:2.60.0-py311-cpu AS base-cpu
# CUDA 13.0: the CUDA that PyPI's torch 2.13.0 is built with. Horovod's kernels are compiled with
# this image's nvcc and NCCL, and must match the CUDA that torch runs.
FROM rayproject/ray:2.60.0-py311-cu130 AS base-gpu

# One of the two tagged stages above, chosen by VARIANT.
# hadolint ignore=DL3006
FROM base-${VARIANT}
ARG VARIANT=cpu
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# root (uid 0) to install the compiler Horovod needs, then back to the image's `ray` user (uid 1000).
USER 0
# The distribution's current g++ and make are what we want; pinning them would break on its updates.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ make \
    && rm -rf /var/lib/apt/lists/*
USER 1000
COPY --chown=1000:100 scripts/build_horovod.sh /tmp/build_horovod.sh
# torch first, at the project's pin (CPU wheels, or PyPI's CUDA build for the GPU variant): Horovod
# compiles against it. Then Horovod, with NCCL for the GPU variant, and a check of what was built.
RUN if [ "${VARIANT}" = gpu ]; then \
        pip install --no-cache-dir "torch==2.13.0" && export HOROVOD_GPU_OPERATIONS=NCCL; \
    else \
        pip install --no-cache-dir --index-url https://download.pytorch.org/whl/cpu "torch==2.13.0"; \
    fi \
    && PIP_NO_CACHE_DIR=1 HOROVOD_WHEEL_CACHE=/tmp/horovod-wheels bash /tmp/build_horovod.sh "$(command -v python)" \
    && rm -rf /tmp/horovod-wheels /tmp/build_horovod.sh \
    && built=$(horovodrun --check-build) && echo "$built" \
    && for need in PyTorch Gloo ${HOROVOD_GPU_OPERATIONS:-}; do \
        grep -q "\[X\] ${need}" <<<"$built" || { echo "Horovod was built without ${need}" >&2; exit 1; }; \
    done
# What the provider's runtime imports on the cluster; the provider itself travels with each job.
RUN pip install --no-cache-dir "cloudpickle>=3.0" "boto3>=1.35" "pyarrow>=15"
