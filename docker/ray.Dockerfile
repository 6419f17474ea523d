# A Ray node (head or worker) that can run the provider's training jobs: Ray 2.60, torch 2.13, the
# provider with its [cluster] extra, and Horovod 0.28.1 built by the provider's own build command
# (`python -m airflow_provider_horovod.build_horovod`, with its C++17 edits).
# Build from the repository root:
#   CPU: docker build -f docker/ray.Dockerfile .
#   GPU: docker build -f docker/ray.Dockerfile --build-arg VARIANT=gpu .   (Horovod with NCCL)
ARG VARIANT=cpu

# The provider's wheel, built from the repository (the same wheel as the Airflow image's).
FROM python:3.11-slim AS provider
WORKDIR /src
COPY pyproject.toml README.md ./
COPY airflow_provider_horovod ./airflow_provider_horovod
RUN pip install --no-cache-dir "build==1.6.1" \
    && python -m build --wheel --outdir /dist .

# The provider's requirements with its [cluster] extra, one a line, from pyproject.toml alone (the
# image installs them in a layer of their own, before the provider's code).
FROM python:3.11-slim AS requirements
COPY pyproject.toml /tmp/
RUN python -c 'import tomllib; p = tomllib.load(open("/tmp/pyproject.toml", "rb"))["project"]; print("\n".join(p["dependencies"] + p["optional-dependencies"]["cluster"]))' \
    > /requirements.txt

# Python 3.11, as in the Airflow image: a @task.ray or @task.horovod function defined in a DAG file
# arrives pickled, which needs the same Python minor on both sides.
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
# torch first, at the project's pin (CPU wheels, or PyPI's CUDA build for the GPU variant): Horovod
# compiles against it.
RUN if [ "${VARIANT}" = gpu ]; then \
        pip install --no-cache-dir "torch==2.13.0"; \
    else \
        pip install --no-cache-dir --index-url https://download.pytorch.org/whl/cpu "torch==2.13.0"; \
    fi
# Horovod, built against that torch (with NCCL for the GPU variant), installed, and checked: the
# command fails if `horovodrun --check-build` lacks PyTorch, Gloo (or NCCL). The compile is the long
# step of this image, so it comes before the provider, from the build command's own files only: a
# change to the provider's other modules then reuses it. Those files need only the standard library;
# they run here as a namespace package of their own (no __init__.py), removed afterwards: the provider
# installs them again.
COPY --chown=1000:100 \
    airflow_provider_horovod/build_horovod.py \
    airflow_provider_horovod/horovod_source_edits.py \
    airflow_provider_horovod/exceptions.py \
    /tmp/horovod-build/airflow_provider_horovod/
WORKDIR /tmp/horovod-build
RUN if [ "${VARIANT}" = gpu ]; then \
        PIP_NO_CACHE_DIR=1 python -m airflow_provider_horovod.build_horovod --gpu --cache /tmp/horovod-wheels; \
    else \
        PIP_NO_CACHE_DIR=1 python -m airflow_provider_horovod.build_horovod --cache /tmp/horovod-wheels; \
    fi \
    && rm -rf /tmp/horovod-wheels /tmp/horovod-build
WORKDIR /home/ray
# What the provider and its [cluster] extra need (Ray Train, torch, pyarrow, cloudpickle, boto3, and
# Airflow's packages, since apache-airflow is the provider's core dependency; unused on the cluster,
# where the provider's runtime travels with each job), read from pyproject.toml by the requirements
# stage: this layer stays cached while the dependencies do. Ray and torch are named at the image's
# versions so that pip keeps them.
COPY --from=requirements --chown=1000:100 /requirements.txt /tmp/provider-requirements.txt
RUN pip install --no-cache-dir -r /tmp/provider-requirements.txt "ray[default,train]==2.60.0" "torch==2.13.0" \
    && rm /tmp/provider-requirements.txt
# The provider with its [cluster] extra: everything it needs is installed above, so after a change
# to its code this is the only layer built again (with the wheel).
COPY --from=provider --chown=1000:100 /dist/ /tmp/provider/
# DL3013: the provider is this repository's wheel; what it needs is pinned above or ranged by it.
# hadolint ignore=DL3013
RUN wheels=(/tmp/provider/airflow_provider_horovod-*.whl) \
    && pip install --no-cache-dir "${wheels[0]}[cluster]" \
    && rm -rf /tmp/provider
