"""Fixtures of the unit tests: an S3 service (moto's server, in this process, on 127.0.0.1)."""

from __future__ import annotations

import logging
import socket
import uuid

import pytest


class S3:
    def __init__(self, endpoint_url: str):
        self.endpoint_url = endpoint_url

    def client(self):
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )

    def bucket(self) -> str:
        """A new bucket of its own for a test (moto's state lives as long as the server)."""
        name = f"ahp-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name


@pytest.fixture(scope="session")
def _s3_server():
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def s3(_s3_server, monkeypatch) -> S3:
    """The S3 service, and a worker environment that points at it (test credentials)."""
    for name, value in {
        "AWS_ENDPOINT_URL": _s3_server,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.delenv(name, raising=False)
    return S3(_s3_server)


@pytest.fixture
def serve(monkeypatch):
    """Serve a ``FakeRay`` over HTTP as a Ray connection (``ray_default`` unless named): the code
    under test talks to it through the real ``RayHook``. Returns the dashboard."""
    from unit.fakes import Dashboard

    started = []

    def serve_(ray, conn_id: str = "ray_default", *, shared_storage: bool = True):
        dashboard = Dashboard(ray)
        started.append(dashboard)
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", dashboard.connection(shared_storage=shared_storage))
        return dashboard

    yield serve_
    for dashboard in started:
        dashboard.close()
