"""Shared fixtures. Airflow's home for the tests is a fresh folder in the checkout (ignored by git),
set before Airflow is imported."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TEST_HOME = REPO / ".test-airflow" / f"home-{os.getpid()}"

os.environ["AIRFLOW_HOME"] = str(TEST_HOME)
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(REPO / "tests" / "dags")
os.environ["AIRFLOW__CORE__UNIT_TEST_MODE"] = "False"
os.environ.pop("AIRFLOW_CONN_RAY_DEFAULT", None)  # tests use the embedded local cluster
TEST_HOME.mkdir(parents=True, exist_ok=True)


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/integration" in str(item.fspath):
            item.add_marker(pytest.mark.integration)


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(TEST_HOME, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def airflow_db():
    """Airflow's metadata database (sqlite in the test home), migrated once."""
    airflow = str(Path(sys.executable).with_name("airflow"))
    subprocess.run([airflow, "db", "migrate"], check=True, capture_output=True, timeout=300)
    return TEST_HOME


class MotoServer:
    def __init__(self, server, endpoint_url: str):
        self.server = server
        self.endpoint_url = endpoint_url

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint_url)

    def make_bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return name


@pytest.fixture(scope="session")
def moto_server():
    """A real S3-protocol server (moto's server mode) on 127.0.0.1. Its address and test
    credentials go into the environment, so the Ray head started afterwards inherits them."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per S3 request otherwise

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    os.environ.update({
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    })
    yield MotoServer(server, endpoint)
    server.stop()


@pytest.fixture(scope="session")
def ray_cluster(moto_server):
    """The embedded local Ray head (token auth on), started once for the session and stopped after."""
    from airflow_provider_horovod import local

    cluster = local.ensure_running()
    yield cluster
    local.down()


@pytest.fixture
def ray_hook(ray_cluster):
    from airflow_provider_horovod.hooks.ray import RayHook

    return RayHook()
