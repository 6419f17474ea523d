"""The benchmarks' surroundings: a moto S3 server in its own process and the embedded local Ray
cluster under the benchmarks' AIRFLOW_HOME, both stopped when the run ends, also on error."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

from bench.common import OUT, PY, RAY_ADDRESS_ENV, log

BUCKET = "ahp-bench"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def moto_server():
    """moto's S3 server in a process of its own (in this process it would share our GIL and skew
    both sides of the checkpoint comparison). Its address goes into the environment before the Ray
    head starts, so the cluster inherits it, as the test suite does."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    (OUT / "logs").mkdir(parents=True, exist_ok=True)
    with open(OUT / "logs" / "moto.log", "w") as out:
        proc = subprocess.Popen(
            [str(Path(PY).with_name("moto_server")), "-H", "127.0.0.1", "-p", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(endpoint, timeout=1).read()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"moto_server did not start; see {OUT / 'logs' / 'moto.log'}") from None
                time.sleep(0.2)
        os.environ.update(
            {
                "AWS_ENDPOINT_URL": endpoint,
                "AWS_ACCESS_KEY_ID": "testing",
                "AWS_SECRET_ACCESS_KEY": "testing",
                "AWS_DEFAULT_REGION": "us-east-1",
                "AWS_EC2_METADATA_DISABLED": "true",
            }
        )
        import boto3

        boto3.client("s3").create_bucket(Bucket=BUCKET)
        log(f"moto S3 server on {endpoint}, bucket {BUCKET}")
        yield endpoint
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


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
