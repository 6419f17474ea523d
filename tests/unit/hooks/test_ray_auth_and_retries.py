"""RayHook against the stand-in dashboard when things go wrong: a refused token, a busy or
unreachable dashboard retried and then given up on, each try a new attempt to connect."""

from __future__ import annotations

import re
import socket
import threading

import pytest

from airflow_provider_horovod.exceptions import RayAuthenticationError, RayClusterUnreachableError
from airflow_provider_horovod.hooks.ray import RayHook
from airflow_provider_horovod.hooks.ray_transport import RETRIES
from harness.ports import free_port
from unit.hooks.dashboard import LOG_FILE, TOKEN, arun, set_connection

pytestmark = pytest.mark.usefixtures("quick_retries")


@pytest.mark.parametrize("status, what", [(401, "no token was sent"), (403, "the token was refused")])
def test_a_refused_token_names_the_connection_and_not_the_token(hook, dashboard, status, what):
    dashboard.answer("GET", "/api/jobs/sid-a1", status, "Unauthorized")
    for call in (lambda: hook.get_job_info("sid-a1"), lambda: arun(hook.a_get_job_info("sid-a1"), hook)):
        with pytest.raises(RayAuthenticationError) as err:
            call()
        message = str(err.value)
        assert f"answered {status} ({what})" in message
        assert "connection 'ray_test'" in message
        assert "~/.ray/auth_token" in message
        assert TOKEN not in message
    assert len(dashboard.asked("GET", "/api/jobs/sid-a1")) == 2  # not retried


def test_a_busy_dashboard_is_retried(hook, dashboard):
    dashboard.answer("GET", "/api/jobs/sid-a1", (503, "busy"), (502, "bad gateway"), (200, {"status": "RUNNING"}))
    assert hook.get_job_info("sid-a1") == {"status": "RUNNING"}
    assert len(dashboard.asked("GET", "/api/jobs/sid-a1")) == 3
    dashboard.answer("GET", "/api/jobs/sid-a2", (503, "busy"), (504, "timeout"), (200, {"status": "PENDING"}))
    assert arun(hook.a_get_job_info("sid-a2"), hook) == {"status": "PENDING"}
    assert len(dashboard.asked("GET", "/api/jobs/sid-a2")) == 3


def test_too_many_requests_is_retried(hook, dashboard):
    # The State API refuses requests beyond about 100 at once with 429: a busy moment, not an error.
    dashboard.answer("GET", "/api/jobs/sid-a1", (429, "Too many requests"), (200, {"status": "RUNNING"}))
    assert hook.get_job_info("sid-a1") == {"status": "RUNNING"}
    assert len(dashboard.asked("GET", "/api/jobs/sid-a1")) == 2
    dashboard.answer("GET", LOG_FILE, (429, "Too many requests"), (429, "Too many requests"), (200, "a\nb\n"))
    assert arun(hook.a_get_log_tail("node-1", "sid-a1", 10), hook) == "a\nb\n"
    assert len(dashboard.asked_with_query("GET", LOG_FILE)) == 3


def test_a_dashboard_that_stays_busy_is_unreachable_after_the_retries(hook, dashboard):
    dashboard.answer("GET", "/api/jobs/sid-a1", 503, "busy")
    with pytest.raises(RayClusterUnreachableError, match=f"did not answer after {RETRIES} tries .*HTTP 503"):
        hook.get_job_info("sid-a1")
    assert len(dashboard.asked("GET", "/api/jobs/sid-a1")) == RETRIES


def test_a_refused_connection_is_unreachable_after_the_retries(monkeypatch):
    port = free_port()
    hook = RayHook(ray_conn_id=set_connection(monkeypatch, "ray_down", port))
    for call in (lambda: hook.get_job_info("sid"), lambda: arun(hook.a_get_job_info("sid"), hook)):
        with pytest.raises(RayClusterUnreachableError) as err:
            call()
        message = str(err.value)
        assert (
            f"The Ray dashboard at http://127.0.0.1:{port} (connection 'ray_down') did not answer after {RETRIES} tries"
            in message
        )
        assert re.search(r"Connect(or)?Error", message)
        assert "Check that the cluster is up" in message
        assert TOKEN not in message


def test_every_try_is_a_new_attempt_to_connect(monkeypatch):
    """A server that accepts and hangs up at once: the hook tries exactly RETRIES times."""
    accepted = []
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)

    def serve():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            accepted.append(1)
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    try:
        hook = RayHook(ray_conn_id=set_connection(monkeypatch, "ray_flaky", listener.getsockname()[1]))
        with pytest.raises(RayClusterUnreachableError, match=f"did not answer after {RETRIES} tries"):
            hook.get_job_info("sid")
        assert len(accepted) == RETRIES
    finally:
        listener.close()
