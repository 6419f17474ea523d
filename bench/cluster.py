"""The benchmarks' surroundings: a moto S3 server in its own process and the embedded local Ray
cluster under the benchmarks' AIRFLOW_HOME, both stopped when the run ends, also on error."""

from __future__ import annotations

import contextlib
import os
import time

from bench.common import OUT, RAY_ADDRESS_ENV, log
from harness.s3 import MotoServer

BUCKET = "ahp-bench"


@contextlib.contextmanager
def moto_server():
    """moto's S3 server in a process of its own (in ours it would share our GIL and skew figure 5); its address
    goes into the environment before the Ray head starts, so the cluster inherits it."""
    (OUT / "logs").mkdir(parents=True, exist_ok=True)
    with MotoServer(own_process=True, log=OUT / "logs" / "moto.log") as server:
        os.environ.update(server.env())
        server.make_bucket(BUCKET)
        log(f"moto S3 server on {server.endpoint_url}, bucket {BUCKET}")
        yield server.endpoint_url


@contextlib.contextmanager
def ray_cluster():
    """The provider's embedded local Ray head (token auth on), under the benchmarks' AIRFLOW_HOME."""
    from airflow_provider_horovod import local

    local.down()  # leftovers of an interrupted run
    started = time.monotonic()
    try:
        cluster = local.ensure_running()
        # Jobs and scripts pass this on to Ray Train's actors (see bench.common).
        os.environ[RAY_ADDRESS_ENV] = cluster.gcs_address
        log(f"Ray head up in {time.monotonic() - started:.1f} s: {cluster.dashboard_url}")
        yield cluster
    finally:
        log("stopping the Ray cluster")
        local.down()
