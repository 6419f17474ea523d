# Airflow with the provider, for the scheduler, dag-processor, triggerer and api-server.
# Build from the repository root: docker build -f docker/airflow.Dockerfile .
FROM apache/airflow:3.3.2-python3.11

# The Airflow side needs no torch or Horovod (the training runs on Ray), so the provider is
# installed without its dependencies, with only what its Airflow-side modules import.
# Ray's client must match the cluster's version exactly.
COPY --chown=airflow:root pyproject.toml README.md /opt/provider/
COPY --chown=airflow:root airflow_provider_horovod /opt/provider/airflow_provider_horovod
RUN pip install --no-cache-dir --no-deps /opt/provider \
    && pip install --no-cache-dir "apache-airflow==3.3.2" "ray[default]==2.60.0" "boto3>=1.35" "cloudpickle>=3.0" "pyarrow>=15"

# The example DAGs in dags/ score the trained model in an Airflow task, which loads it with torch
# (CPU is enough). DAGs that evaluate on Ray do not need it: --build-arg EXAMPLES=false.
ARG EXAMPLES=true
RUN if [ "${EXAMPLES}" = true ]; then \
        pip install --no-cache-dir --index-url https://download.pytorch.org/whl/cpu "torch==2.13.0"; \
    fi

# Builds the ray_default connection from the token secret at start (see docker/compose.yaml).
COPY --chmod=755 docker/with_ray_token.sh /opt/provider/with_ray_token.sh
ENTRYPOINT ["/opt/provider/with_ray_token.sh"]
