# Stand-in for rayproject/ray:2.60.0-py311-cpu: Ray 2.60.0 (`ray[default]`) on Debian 12's Python
# 3.11, keeping what the project's ray.Dockerfile and compose.yaml rely on: user ray (uid 1000,
# gid 100), HOME /home/ray, Python and pip first on PATH in /home/ray/anaconda3/bin (a virtual
# environment here, conda there), writable by ray, apt-get usable as root, and Python's headers (the
# Horovod build needs them). pip finds the CPU torch wheel on disk (pip.conf).
FROM ahp-standins/debian:bookworm
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY pip.conf /etc/pip.conf
COPY wheels/ /opt/wheels/
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3.11-dev \
    && rm -rf /var/lib/apt/lists/*
ENV HOME=/home/ray \
    PATH=/home/ray/anaconda3/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONDONTWRITEBYTECODE=1 \
    LANG=C.UTF-8
RUN useradd --uid 1000 --gid 100 --home-dir /home/ray --create-home --shell /bin/bash ray
USER 1000
RUN python3.11 -m venv /home/ray/anaconda3 \
    && pip install --no-cache-dir "ray[default]==2.60.0"
WORKDIR /home/ray
CMD ["bash"]
