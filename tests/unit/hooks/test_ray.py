"""RayHook against a small real HTTP server standing in for the Ray dashboard (``unit.hooks.dashboard``):
the hook's requests and their answers, sync and async alike, its connections, the tail of a job's log,
and connections that cannot be used. Authentication and retries are tested in
test_ray_auth_and_retries.py, the version check and submitting in test_ray_submit.py."""

from __future__ import annotations

import asyncio

import pytest

from airflow_provider_horovod.exceptions import RayConnectionConfigError, RayJobError
from airflow_provider_horovod.hooks import ray_transport
from airflow_provider_horovod.hooks.ray import RayHook
from unit.hooks.dashboard import LOG_FILE, NODES, TOKEN, arun, set_connection

pytestmark = pytest.mark.usefixtures("quick_retries")


def test_identity():
    assert (RayHook.conn_type, RayHook.default_conn_name, RayHook.hook_name, RayHook.conn_name_attr) == (
        "ray",
        "ray_default",
        "Ray",
        "ray_conn_id",
    )


# --- requests and answers -------------------------------------------------------------------------


def test_requests_carry_the_token_and_the_headers(hook, dashboard):
    dashboard.answer("GET", "/api/jobs/sid-a1", 200, {"status": "RUNNING"})
    assert hook.get_job_info("sid-a1") == {"status": "RUNNING"}
    headers = dashboard.asked("GET", "/api/jobs/sid-a1")[0]["headers"]
    assert headers["Authorization"] == f"Bearer {TOKEN}"
    assert headers["X-Team"] == "ml"
    assert hook.get_job_url("sid-a1") == f"{dashboard.url}/#/jobs/sid-a1"


def test_a_missing_job_is_none(hook):
    assert hook.get_job_info("nope") is None
    assert hook.get_job_status("nope") is None
    assert hook.get_job_logs("nope") == ""
    assert hook.stop_job("nope") is False
    assert hook.delete_job("nope") is False
    assert arun(hook.a_get_job_info("nope"), hook) is None


def test_other_errors_raise_with_the_answer(hook, dashboard):
    dashboard.answer("GET", "/api/jobs/", 500, "internal trouble")
    with pytest.raises(RayJobError, match="job list failed: HTTP 500: internal trouble"):
        hook.list_jobs()


def script_jobs(dashboard):
    dashboard.answer("GET", "/api/jobs/sid-a1", 200, {"status": "FAILED", "message": "boom", "metadata": {"k": "v"}})
    dashboard.answer("GET", "/api/jobs/sid-a1/logs", 200, {"logs": "line 1\nline 2\n"})
    dashboard.answer("POST", "/api/jobs/sid-a1/stop", 200, {"stopped": True})
    dashboard.answer("DELETE", "/api/jobs/sid-a1", 200, {"deleted": True})
    dashboard.answer("GET", "/api/v0/nodes?detail=1&limit=10000", 200, NODES)


def test_sync_and_async_twins_give_the_same_results(hook, dashboard):
    script_jobs(dashboard)
    sync = [
        hook.get_job_info("sid-a1"),
        hook.get_job_logs("sid-a1"),
        hook.stop_job("sid-a1"),
        hook.get_cluster_resources(),
    ]

    async def twins():
        async with hook:
            return [
                await hook.a_get_job_info("sid-a1"),
                await hook.a_get_job_logs("sid-a1"),
                await hook.a_stop_job("sid-a1"),
                await hook.a_get_cluster_resources(),
            ]

    asked = [(r["method"], r["path"]) for r in dashboard.requests]
    assert arun(twins()) == sync
    twins_asked = [(r["method"], r["path"]) for r in dashboard.requests][len(asked) :]
    assert twins_asked == [a for a in asked if a[1] != "/api/version"]  # each twin asks its call's route
    assert sync[0] == {"status": "FAILED", "message": "boom", "metadata": {"k": "v"}}
    assert sync[1] == "line 1\nline 2\n"
    assert sync[2] is True
    assert sync[3] == {"CPU": 6.0, "memory": 1e9, "GPU": 1.0}


def test_the_sync_calls_a_user_may_make_besides(hook, dashboard):
    script_jobs(dashboard)
    assert hook.get_job_status("sid-a1") == "FAILED"
    assert hook.delete_job("sid-a1") is True
    assert hook.get_job_url("sid-a1") == f"{dashboard.url}/#/jobs/sid-a1"


def test_one_client_and_one_connection_for_many_calls(hook, dashboard):
    script_jobs(dashboard)
    assert hook.get_conn() is hook.get_conn()
    for _ in range(4):
        hook.get_job_info("sid-a1")
    assert len({r["peer"] for r in dashboard.requests}) == 1  # the connection is kept alive


def test_aclose_closes_the_async_client(hook, dashboard):
    script_jobs(dashboard)

    async def use():
        async with hook:
            await hook.a_get_job_info("sid-a1")
            _, client = await hook._a_session()
            await hook.a_get_job_logs("sid-a1")
            assert (await hook._a_session())[1] is client
            assert not client.closed
        return client

    client = arun(use())
    assert client.closed
    assert len({r["peer"] for r in dashboard.requests}) == 1


def test_a_waiting_trigger_keeps_its_connection_for_keepalive_s(dashboard, monkeypatch):
    def peers_of_two_polls(conn_id: str) -> int:
        hook = RayHook(ray_conn_id=set_connection(monkeypatch, conn_id, dashboard.port))

        async def poll_twice():
            async with hook:
                await hook.a_get_job_info("sid-a1")
                await asyncio.sleep(2.5)
                await hook.a_get_job_info("sid-a1")

        dashboard.requests.clear()
        arun(poll_twice())
        return len({r["peer"] for r in dashboard.requests})

    script_jobs(dashboard)
    assert ray_transport.KEEPALIVE_S > 10  # longer than any usual poll interval
    assert peers_of_two_polls("ray_kept") == 1
    monkeypatch.setattr(ray_transport, "KEEPALIVE_S", 1.0)  # the setting is what keeps it
    assert peers_of_two_polls("ray_short") == 2


# --- the tail of a job's log (State API) ------------------------------------------------------------


def test_log_tail_asks_for_the_drivers_log_file_on_its_node(hook, dashboard):
    dashboard.answer("GET", LOG_FILE, 200, "step 9\nstep 10\nunterminat")
    assert arun(hook.a_get_log_tail("ab12cd", "sid-a1", 64), hook) == "step 9\nstep 10\nunterminat"  # as Ray sent it
    (query,) = dashboard.asked_with_query("GET", LOG_FILE)
    assert query == {"node_id": ["ab12cd"], "filename": ["job-driver-sid-a1.log"], "lines": ["64"]}
    request = [r for r in dashboard.requests if r["path"].startswith(LOG_FILE)][0]
    assert request["headers"]["Authorization"] == f"Bearer {TOKEN}"


def test_log_tail_of_a_log_not_written_yet_is_none(hook, dashboard):
    # Ray answers 500 while the driver has not created its log file.
    dashboard.answer("GET", LOG_FILE, 500, "A file is not found at: /tmp/ray/session_latest/logs/job-driver-sid-a1.log")
    assert arun(hook.a_get_log_tail("ab12cd", "sid-a1", 64), hook) is None
    assert len(dashboard.asked_with_query("GET", LOG_FILE)) == 1  # not retried


@pytest.mark.parametrize(
    "status, text", [(500, "Failed to get the log: node ab12cd is dead"), (400, "lines must be an int")]
)
def test_log_tail_that_fails_otherwise_raises(hook, dashboard, status, text):
    dashboard.answer("GET", LOG_FILE, status, text)
    with pytest.raises(RayJobError, match=f"log read failed: HTTP {status}: {text}") as err:
        arun(hook.a_get_log_tail("ab12cd", "sid-a1", 64), hook)
    assert err.value.submission_id == "sid-a1"


def test_the_async_calls_reuse_an_endpoint_read_by_a_sync_one(hook, dashboard, monkeypatch):
    script_jobs(dashboard)
    endpoint = hook.endpoint  # read by a sync call
    monkeypatch.delenv("AIRFLOW_CONN_RAY_TEST")  # the connection could not be read again

    async def use():
        async with hook:
            return await hook.a_endpoint(), await hook.a_get_job_info("sid-a1")

    got_endpoint, info = arun(use())
    assert got_endpoint == endpoint
    assert info["status"] == "FAILED"


def test_the_sync_calls_reuse_an_endpoint_read_by_an_async_one(hook, dashboard, monkeypatch):
    script_jobs(dashboard)
    endpoint = arun(hook.a_endpoint())
    monkeypatch.delenv("AIRFLOW_CONN_RAY_TEST")
    assert hook.endpoint is endpoint
    assert hook.get_job_status("sid-a1") == "FAILED"


# --- connections that cannot be used --------------------------------------------------------------


def test_a_missing_named_connection_is_an_error_not_a_local_cluster(monkeypatch):
    monkeypatch.delenv("AIRFLOW_CONN_RAY_NOPE", raising=False)
    for call in (
        lambda: RayHook(ray_conn_id="ray_nope").get_job_url("x"),
        lambda: arun(RayHook(ray_conn_id="ray_nope").a_endpoint()),
    ):
        with pytest.raises(RayConnectionConfigError) as err:
            call()
        message = str(err.value)
        assert "Connection 'ray_nope' was not found" in message
        assert "AIRFLOW_CONN_RAY_NOPE" in message
        assert "code outside a task" in message
        assert "only in the last two" in message
        assert "secrets backends" in message
        assert "Create it (type 'ray')" in message


def test_an_unreadable_connection_is_not_taken_for_a_missing_one(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_RAY_DEFAULT", '{"conn_type": "ray", "host": "h", "password": "%s",' % TOKEN)
    with pytest.raises(RayConnectionConfigError, match="is set in AIRFLOW_CONN_RAY_DEFAULT") as err:
        RayHook().get_job_url("x")
    assert TOKEN not in str(err.value)


def test_a_bad_connection_fails_before_any_request(monkeypatch):
    hook = RayHook(ray_conn_id=set_connection(monkeypatch, "ray_bad", 70000))
    with pytest.raises(RayConnectionConfigError, match="port 70000"):
        hook.get_job_info("sid")


# --- pure helpers ---------------------------------------------------------------------------------
