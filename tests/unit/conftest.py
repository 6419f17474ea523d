"""Fixtures of the unit tests: an S3 service (moto's server, in this process, on 127.0.0.1)."""

from __future__ import annotations

import uuid

import pytest


@pytest.fixture(scope="session")
def _s3_server():
    from harness.s3 import MotoServer

    with MotoServer() as server:
        yield server


class S3:
    def __init__(self, server):
        self.server = server
        self.endpoint_url = server.endpoint_url

    def client(self):
        return self.server.client()

    def bucket(self) -> str:
        """A new bucket of its own for a test (moto's state lives as long as the server)."""
        return self.server.make_bucket(f"ahp-{uuid.uuid4().hex[:12]}")


@pytest.fixture
def s3(_s3_server, monkeypatch) -> S3:
    """The S3 service, and a worker environment that points at it (test credentials)."""
    for name, value in _s3_server.env().items():
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

    def serve_(ray, conn_id: str = "ray_default", *, shared_storage: bool = True, **extra):
        dashboard = Dashboard(ray)
        started.append(dashboard)
        connection = dashboard.connection(shared_storage=shared_storage, **extra)
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", connection)
        return dashboard

    yield serve_
    for dashboard in started:
        dashboard.close()
