# Airflow with the provider, for the scheduler, dag-processor, triggerer and api-server.
# Build from the repository root: docker build -f docker/airflow.Dockerfile .

# The provider's wheel, built from the repository (the same wheel as the Ray image's).
FROM python:3.11-slim AS provider
WORKDIR /src
COPY pyproject.toml README.md ./
COPY airflow_provider_horovod ./airflow_provider_horovod
RUN pip install --no-cache-dir "build==1.6.1" \
    && python -m build --wheel --outdir /dist .

# The provider's requirements with its [amazon] extra, one a line, from pyproject.toml alone (the
# image installs them in a layer of their own, before the provider's code).
FROM python:3.11-slim AS requirements
COPY pyproject.toml /tmp/
RUN python -c 'import tomllib; p = tomllib.load(open("/tmp/pyproject.toml", "rb"))["project"]; print("\n".join(p["dependencies"] + p["optional-dependencies"]["amazon"]))' \
    > /requirements.txt

# Python 3.11, as in the Ray image: a @task.ray or @task.horovod function defined in a DAG file
# travels to the cluster pickled, which needs the same Python minor on both sides.
FROM apache/airflow:3.3.2-python3.11
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# The provider with its [amazon] extra (s3:// storage, through the Amazon provider's hooks), and
# with the dependencies it declares: no torch and no Ray, since the training and the evaluation run
# on the cluster and the provider speaks HTTP to Ray's dashboard. apache-airflow is pinned to the
# image's own version (AIRFLOW_VERSION, set by the image) so that pip keeps it: the official
# image's documented way of adding packages. First what it needs, read from pyproject.toml by the
# requirements stage (this layer stays cached while the dependencies do), then the provider's wheel:
# after a change to its code only that last layer is built again.
COPY --from=requirements --chown=airflow:root /requirements.txt /tmp/provider-requirements.txt
RUN pip install --no-cache-dir "apache-airflow==${AIRFLOW_VERSION}" -r /tmp/provider-requirements.txt \
    && rm /tmp/provider-requirements.txt
COPY --from=provider --chown=airflow:root /dist/ /tmp/provider/
# DL3013: the provider is this repository's wheel; what it needs is installed above.
# hadolint ignore=DL3013
RUN wheels=(/tmp/provider/airflow_provider_horovod-*.whl) \
    && pip install --no-cache-dir "apache-airflow==${AIRFLOW_VERSION}" "${wheels[0]}[amazon]" \
    && rm -rf /tmp/provider

# Builds the ray_default connection from the token secret at start (see docker/compose.yaml).
COPY --chmod=755 docker/with_ray_token.sh /opt/provider/with_ray_token.sh
ENTRYPOINT ["/opt/provider/with_ray_token.sh"]
