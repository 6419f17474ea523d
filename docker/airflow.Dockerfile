# Airflow with the provider, for the scheduler, dag-processor, triggerer and api-server.
# Build from the repository root: docker build -f docker/airflow.Dockerfile .

# The provider's wheel, built from the repository (the same wheel as the Ray image's).
FROM python:3.11-slim AS provider
WORKDIR /src
COPY pyproject.toml README.md ./
COPY airflow_provider_horovod ./airflow_provider_horovod
RUN pip install --no-cache-dir "build==1.6.1" \
    && python -m build --wheel --outdir /dist .

# Python 3.11, as in the Ray image: a @task.ray or @task.horovod function defined in a DAG file
# travels to the cluster pickled, which needs the same Python minor on both sides.
FROM apache/airflow:3.3.2-python3.11
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY --from=provider --chown=airflow:root /dist/ /tmp/provider/
# The provider with its [amazon] extra (s3:// storage, through the Amazon provider's hooks), and
# with the dependencies it declares: no torch and no Ray, since the training and the evaluation run
# on the cluster and the provider speaks HTTP to Ray's dashboard. apache-airflow is pinned to the
# image's own version (AIRFLOW_VERSION, set by the image) so that pip keeps it: the official
# image's documented way of adding packages. (DL3013: the provider is this repository's wheel.)
# hadolint ignore=DL3013
RUN wheels=(/tmp/provider/airflow_provider_horovod-*.whl) \
    && pip install --no-cache-dir "apache-airflow==${AIRFLOW_VERSION}" "${wheels[0]}[amazon]" \
    && rm -rf /tmp/provider

# Builds the ray_default connection from the token secret at start (see docker/compose.yaml).
COPY --chmod=755 docker/with_ray_token.sh /opt/provider/with_ray_token.sh
ENTRYPOINT ["/opt/provider/with_ray_token.sh"]
