# Stand-in for apache/airflow:3.3.2-python3.11: Airflow 3.3.2 with its postgres extra, on Debian 12's
# Python 3.11, keeping what the project's airflow.Dockerfile and compose.yaml rely on: user airflow
# (uid 50000, gid 0), HOME /home/airflow, AIRFLOW_HOME /opt/airflow, AIRFLOW_VERSION, pip installing
# as that user into a folder on PATH, curl, /usr/bin/dumb-init and an /entrypoint that runs
# `airflow <command>` (or bash/python as given).
FROM ahp-standins/debian:bookworm
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY pip.conf /etc/pip.conf
COPY constraints-airflow.txt /opt/standin/constraints.txt
COPY --chmod=755 airflow-entrypoint.sh /entrypoint
ENV AIRFLOW_VERSION=3.3.2 \
    AIRFLOW_HOME=/opt/airflow \
    AIRFLOW_USER_HOME_DIR=/home/airflow \
    PATH=/home/airflow/.local/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONDONTWRITEBYTECODE=1 \
    LANG=C.UTF-8
RUN useradd --uid 50000 --gid 0 --home-dir /home/airflow --create-home --shell /bin/bash airflow \
    && mkdir -p /opt/airflow/dags /opt/airflow/logs /opt/airflow/plugins \
    && chown -R airflow:root /opt/airflow
USER 50000
# A virtual environment where the official image has the user's site: `pip install` as airflow
# lands on PATH, as it does there.
RUN python3.11 -m venv /home/airflow/.local \
    && pip install --no-cache-dir "apache-airflow[postgres]==${AIRFLOW_VERSION}" \
       --constraint /opt/standin/constraints.txt
WORKDIR /opt/airflow
EXPOSE 8080
ENTRYPOINT ["/usr/bin/dumb-init", "--", "/entrypoint"]
CMD []
