"""Fixtures of the RayHook tests: the stand-in dashboard (``unit.hooks.dashboard``), a hook on it, and
quick retries (``pytestmark = pytest.mark.usefixtures("quick_retries")`` in a test file)."""

from __future__ import annotations

import pytest

from airflow_provider_horovod.hooks import ray_transport
from airflow_provider_horovod.hooks.ray import RayHook
from unit.hooks.dashboard import Dashboard, set_connection


@pytest.fixture
def dashboard():
    server = Dashboard()
    yield server
    server.close()


@pytest.fixture
def quick_retries(monkeypatch):
    monkeypatch.setattr(ray_transport, "BACKOFF_S", 0.001)


@pytest.fixture
def hook(dashboard, monkeypatch):
    return RayHook(
        ray_conn_id=set_connection(monkeypatch, "ray_test", dashboard.port, extra={"headers": {"X-Team": "ml"}})
    )
