"""RayHook against a small real HTTP server standing in for the Ray dashboard: the hook's
requests, parsing, retries, authentication and errors, sync and async alike."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from airflow_provider_horovod.contract import RAY_VERSIONS
from airflow_provider_horovod.exceptions import (
    RayAuthenticationError,
    RayClusterUnreachableError,
    RayConnectionConfigError,
    RayJobError,
    RayVersionMismatchError,
)
from airflow_provider_horovod.hooks import ray_transport
from airflow_provider_horovod.hooks.ray import JOB_INFO, JOB_LOGS, RayHook, Route, total_resources
from airflow_provider_horovod.hooks.ray import NODES as NODES_ROUTE
from airflow_provider_horovod.hooks.ray_packages import package_folder
from airflow_provider_horovod.hooks.ray_transport import RETRIES
from harness.ports import free_port

TOKEN = "tok-0d6b2a9c4e8f1357"
NODES = {
    "data": {
        "result": {
            "result": [
                {"state": "ALIVE", "resources_total": {"CPU": 4.0, "memory": 1e9, "node:10.0.0.1": 1.0}},
                {"state": "ALIVE", "resources_total": {"CPU": 2.0, "GPU": 1.0}},
                {"state": "DEAD", "resources_total": {"GPU": 8.0}},
            ]
        }
    }
}


class Dashboard:
    """A tiny Ray dashboard: answers each (method, path) from a script (the last answer repeats),
    404 for anything unscripted, and records every request and the connection it came on. A path
    scripted without a query answers whatever query it is asked with."""

    def __init__(self):
        self.routes: dict[tuple[str, str], list[tuple[int, str]]] = {}
        self.requests: list[dict] = []
        self.answer("GET", "/api/version", 200, {"ray_version": "2.60.0", "version": "4"})
        dashboard = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as Ray's dashboard (aiohttp) does

            def log_message(self, *args):
                pass

            def handle_one(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                dashboard.requests.append(
                    {
                        "method": self.command,
                        "path": self.path,
                        "body": body,
                        "headers": dict(self.headers),
                        "peer": self.client_address,
                    }
                )
                script = dashboard.routes.get((self.command, self.path)) or dashboard.routes.get(
                    (self.command, self.path.split("?", 1)[0])
                )
                status, text = (script.pop(0) if len(script) > 1 else script[0]) if script else (404, "not found")
                data = text.encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = handle_one

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()

    def answer(self, method: str, path: str, *answers) -> None:
        """Answers as (status, body) pairs, or a status and a body for one answer."""
        if answers and isinstance(answers[0], int):
            answers = (answers,)
        self.routes[(method, path)] = [(s, b if isinstance(b, str) else json.dumps(b)) for s, b in answers]

    def asked(self, method: str, path: str) -> list[dict]:
        return [r for r in self.requests if (r["method"], r["path"]) == (method, path)]

    def asked_with_query(self, method: str, path: str) -> list[dict[str, list[str]]]:
        """The queries of the requests for ``path``, whatever their query."""
        from urllib.parse import parse_qs, urlsplit

        return [
            parse_qs(urlsplit(r["path"]).query)
            for r in self.requests
            if r["method"] == method and urlsplit(r["path"]).path == path
        ]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def dashboard():
    server = Dashboard()
    yield server
    server.close()


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch):
    monkeypatch.setattr(ray_transport, "BACKOFF_S", 0.001)


def set_connection(monkeypatch, conn_id: str, port: int, **fields) -> str:
    conn = {"conn_type": "ray", "host": "127.0.0.1", "port": port, "schema": "http", "password": TOKEN, **fields}
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(conn))
    return conn_id


@pytest.fixture
def hook(dashboard, monkeypatch):
    return RayHook(
        ray_conn_id=set_connection(monkeypatch, "ray_test", dashboard.port, extra={"headers": {"X-Team": "ml"}})
    )


def arun(coro, hook: RayHook | None = None):
    """Run ``coro``; with ``hook``, close the hook's async session after it, as a trigger does."""

    async def closing():
        try:
            return await coro
        finally:
            await hook.aclose()

    return asyncio.run(closing() if hook is not None else coro)


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
    assert headers["Authorization"] == f"Bearer {TOKEN}" and headers["X-Team"] == "ml"
    assert hook.get_dashboard_url() == dashboard.url
    assert hook.get_job_url("sid-a1") == f"{dashboard.url}/#/jobs/sid-a1"


def test_a_missing_job_is_none(hook):
    assert hook.get_job_info("nope") is None and hook.get_job_status("nope") is None
    assert hook.get_job_logs("nope") == "" and hook.stop_job("nope") is False and hook.delete_job("nope") is False
    assert arun(hook.a_get_job_info("nope"), hook) is None


def test_other_errors_raise_with_the_answer(hook, dashboard):
    dashboard.answer("GET", "/api/jobs/", 500, "internal trouble")
    with pytest.raises(RayJobError, match="job list failed: HTTP 500: internal trouble"):
        hook.list_jobs()


def test_a_route_fills_its_path_and_reads_its_answer_as_it_says():
    assert JOB_LOGS.split({"submission_id": "sid-a1", "params": {"x": 1}}) == (
        "/api/jobs/sid-a1/logs",
        {"params": {"x": 1}},
    )
    assert NODES_ROUTE.split({}) == ("/api/v0/nodes?detail=1&limit=10000", {})
    assert JOB_LOGS.answer(200, '{"logs": "a\\n"}') == "a\n" and JOB_LOGS.answer(404, "not found") == ""
    assert JOB_INFO.answer(404, "not found") is None and JOB_INFO.answer(200, "") == {}
    with pytest.raises(RayJobError, match="upload failed: HTTP 404: gone"):
        Route("PUT", "/api/packages/{name}", "upload").answer(404, "gone")
    with pytest.raises(RayJobError, match="job info failed: HTTP 500: trouble"):
        JOB_INFO.answer(500, "trouble")


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
        hook.get_job_status("sid-a1"),
        hook.get_job_logs("sid-a1"),
        hook.stop_job("sid-a1"),
        hook.delete_job("sid-a1"),
        hook.get_cluster_resources(),
        hook.get_job_url("sid-a1"),
    ]

    async def twins():
        async with hook:
            return [
                await hook.a_get_job_info("sid-a1"),
                await hook.a_get_job_status("sid-a1"),
                await hook.a_get_job_logs("sid-a1"),
                await hook.a_stop_job("sid-a1"),
                await hook.a_delete_job("sid-a1"),
                await hook.a_get_cluster_resources(),
                await hook.a_get_job_url("sid-a1"),
            ]

    asked = [(r["method"], r["path"]) for r in dashboard.requests]
    assert arun(twins()) == sync
    twins_asked = [(r["method"], r["path"]) for r in dashboard.requests][len(asked) :]
    assert twins_asked == [a for a in asked if a[1] != "/api/version"]  # each twin asks its call's route
    assert sync[:5] == [
        {"status": "FAILED", "message": "boom", "metadata": {"k": "v"}},
        "FAILED",
        "line 1\nline 2\n",
        True,
        True,
    ]
    assert sync[5] == {"CPU": 6.0, "memory": 1e9, "GPU": 1.0}


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
            await hook.a_get_job_status("sid-a1")
            assert (await hook._a_session())[1] is client and not client.closed
        return client

    client = arun(use())
    assert client.closed
    assert len({r["peer"] for r in dashboard.requests}) == 1


def test_a_waiting_trigger_keeps_its_connection_for_keepalive_s(dashboard, monkeypatch):
    def peers_of_two_polls(conn_id: str) -> int:
        hook = RayHook(ray_conn_id=set_connection(monkeypatch, conn_id, dashboard.port))

        async def poll_twice():
            async with hook:
                await hook.a_get_job_status("sid-a1")
                await asyncio.sleep(2.5)
                await hook.a_get_job_status("sid-a1")

        dashboard.requests.clear()
        arun(poll_twice())
        return len({r["peer"] for r in dashboard.requests})

    script_jobs(dashboard)
    assert ray_transport.KEEPALIVE_S > 10  # longer than any usual poll interval
    assert peers_of_two_polls("ray_kept") == 1
    monkeypatch.setattr(ray_transport, "KEEPALIVE_S", 1.0)  # the setting is what keeps it
    assert peers_of_two_polls("ray_short") == 2


# --- authentication, retries, unreachable clusters ------------------------------------------------


@pytest.mark.parametrize("status, what", [(401, "no token was sent"), (403, "the token was refused")])
def test_a_refused_token_names_the_connection_and_not_the_token(hook, dashboard, status, what):
    dashboard.answer("GET", "/api/jobs/sid-a1", status, "Unauthorized")
    for call in (lambda: hook.get_job_info("sid-a1"), lambda: arun(hook.a_get_job_info("sid-a1"), hook)):
        with pytest.raises(RayAuthenticationError) as err:
            call()
        message = str(err.value)
        assert f"answered {status} ({what})" in message and "connection 'ray_test'" in message
        assert "~/.ray/auth_token" in message and TOKEN not in message
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
            and re.search(r"Connect(or)?Error", message)
        )
        assert "Check that the cluster is up" in message and TOKEN not in message


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


# --- the tail of a job's log (State API) ------------------------------------------------------------

LOG_FILE = "/api/v0/logs/file"


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
            return await hook.a_endpoint(), await hook.a_get_job_status("sid-a1")

    assert arun(use()) == (endpoint, "FAILED")


def test_the_sync_calls_reuse_an_endpoint_read_by_an_async_one(hook, dashboard, monkeypatch):
    script_jobs(dashboard)
    endpoint = arun(hook.a_endpoint())
    monkeypatch.delenv("AIRFLOW_CONN_RAY_TEST")
    assert hook.endpoint is endpoint and hook.get_job_status("sid-a1") == "FAILED"


# --- the cluster's version ------------------------------------------------------------------------


def test_check_connection(hook, dashboard):
    assert hook.check_connection()["ray_version"] == "2.60.0"
    assert hook.test_connection() == (True, f"Connected to Ray 2.60.0 at {dashboard.url}")


@pytest.mark.parametrize("version", ["2.49.2", None])
def test_an_older_ray_version_is_refused_naming_both(hook, dashboard, version):
    dashboard.answer("GET", "/api/version", 200, {"ray_version": version} if version else {})
    (low, _) = RAY_VERSIONS
    with pytest.raises(RayVersionMismatchError) as err:
        hook.check_connection()
    message = str(err.value)
    assert "connection 'ray_test'" in message and f"ray[default,train]>={low[0]}.{low[1]}" in message
    assert (version or "of an unknown version") in message
    ok, text = hook.test_connection()
    assert not ok and text == message


@pytest.mark.parametrize("version", ["2.50.1", "2.55.0"])
def test_the_oldest_tested_ray_is_accepted_and_its_version_read_once(hook, dashboard, version):
    dashboard.answer("GET", "/api/version", 200, {"ray_version": version})
    assert hook.ray_version() == version
    dashboard.answer("GET", "/api/version", 200, {"ray_version": "2.60.0"})
    assert hook.ray_version() == version  # the hook's first answer


def test_a_newer_untested_ray_is_accepted_with_a_warning(hook, dashboard):
    import structlog.testing

    dashboard.answer("GET", "/api/version", 200, {"ray_version": "2.61.0"})
    with structlog.testing.capture_logs() as logged:
        assert hook.check_connection()["ray_version"] == "2.61.0"
    (warning,) = [e for e in logged if e.get("log_level") == "warning"]
    text = warning["event"] % warning.get("positional_args", ())
    assert "Ray 2.61.0 is newer than the minors" in text and "connection 'ray_test'" in text


# --- submitting -----------------------------------------------------------------------------------


def make_module(tmp_path):
    folder = tmp_path / "mymod"
    folder.mkdir()
    (folder / "__init__.py").write_text("VALUE = 1\n")
    return folder


def test_submit_uploads_local_packages_and_posts_the_job(hook, dashboard, tmp_path, monkeypatch):
    monkeypatch.setenv(
        "AIRFLOW_CONN_RAY_TEST",
        json.dumps(
            {
                "conn_type": "ray",
                "host": "127.0.0.1",
                "port": dashboard.port,
                "password": TOKEN,
                "extra": {"runtime_env": {"env_vars": {"FROM_CONN": "1", "MODE": "conn"}, "pip": ["requests"]}},
            }
        ),
    )
    hook = RayHook(ray_conn_id="ray_test")
    module = make_module(tmp_path)
    package = package_folder(str(module), keep_name=True)
    put = f"/api/packages/gcs/{package.name}"
    dashboard.answer("PUT", put, 200, "")
    dashboard.answer("POST", "/api/jobs/", 200, {"submission_id": "sid-a1", "job_id": "02000000"})
    sid = hook.submit_job(
        entrypoint="python -m x",
        submission_id="sid-a1",
        runtime_env={"py_modules": [str(module), "gcs://_ray_pkg_given.zip"], "env_vars": {"MODE": "job"}},
        metadata={"airflow_dag_id": "d"},
        entrypoint_num_cpus=1,
    )
    assert sid == "sid-a1"
    assert [r["method"] for r in dashboard.asked("GET", put)] == ["GET"]  # asked whether Ray has it: 404
    (upload,) = dashboard.asked("PUT", put)
    assert upload["body"] == package.data
    (posted,) = dashboard.asked("POST", "/api/jobs/")
    body = json.loads(posted["body"])
    assert body == {
        "entrypoint": "python -m x",
        "submission_id": "sid-a1",
        "metadata": {"airflow_dag_id": "d"},
        "runtime_env": {
            "py_modules": [package.uri, "gcs://_ray_pkg_given.zip"],
            "pip": ["requests"],
            "env_vars": {"FROM_CONN": "1", "MODE": "job"},
        },
        "entrypoint_num_cpus": 1,
        "entrypoint_num_gpus": None,
        "entrypoint_memory": None,
        "entrypoint_resources": None,
    }

    # A second job: the cluster has the package now, and the version was checked once.
    dashboard.answer("GET", put, 200, "")
    dashboard.answer("POST", "/api/jobs/", 200, {"submission_id": "sid-a2"})
    assert (
        hook.submit_job(entrypoint="python -m x", submission_id="sid-a2", runtime_env={"py_modules": [str(module)]})
        == "sid-a2"
    )
    assert len(dashboard.asked("PUT", put)) == 1
    assert len(dashboard.asked("GET", "/api/version")) == 1


def test_submit_on_a_cluster_of_another_version_submits_nothing(hook, dashboard):
    dashboard.answer("GET", "/api/version", 200, {"ray_version": "2.49.2"})
    with pytest.raises(RayVersionMismatchError):
        hook.submit_job(entrypoint="python -m x", submission_id="sid-a1")
    assert dashboard.asked("POST", "/api/jobs/") == []


def test_a_duplicate_of_a_job_that_exists_returns_its_id(hook, dashboard):
    dashboard.answer("POST", "/api/jobs/", 500, "Job with submission_id sid-a1 already exists. Please use a different")
    dashboard.answer("GET", "/api/jobs/sid-a1", 200, {"status": "RUNNING"})
    assert hook.submit_job(entrypoint="python -m x", submission_id="sid-a1") == "sid-a1"


def test_a_refused_job_raises(hook, dashboard):
    dashboard.answer("POST", "/api/jobs/", 400, "runtime_env is invalid: pip")
    with pytest.raises(RayJobError, match="Ray refused job sid-a1: HTTP 400: runtime_env is invalid") as err:
        hook.submit_job(entrypoint="python -m x", submission_id="sid-a1")
    assert err.value.submission_id == "sid-a1"
    dashboard.answer("POST", "/api/jobs/", 500, "already exists")  # ... but no such job
    with pytest.raises(RayJobError, match="HTTP 500: already exists"):
        hook.submit_job(entrypoint="python -m x", submission_id="sid-a1")


def test_async_submit(hook, dashboard):
    dashboard.answer("POST", "/api/jobs/", 200, {"submission_id": "sid-a1"})
    assert arun(hook.a_submit_job(entrypoint="python -m x", submission_id="sid-a1")) == "sid-a1"


# --- connections that cannot be used --------------------------------------------------------------


def test_a_missing_named_connection_is_an_error_not_a_local_cluster(monkeypatch):
    monkeypatch.delenv("AIRFLOW_CONN_RAY_NOPE", raising=False)
    for call in (
        lambda: RayHook(ray_conn_id="ray_nope").get_dashboard_url(),
        lambda: arun(RayHook(ray_conn_id="ray_nope").a_get_job_url("x")),
    ):
        with pytest.raises(RayConnectionConfigError) as err:
            call()
        message = str(err.value)
        assert "Connection 'ray_nope' was not found" in message and "AIRFLOW_CONN_RAY_NOPE" in message
        assert "code outside a task" in message and "only in the last two" in message
        assert "secrets backends" in message and "Create it (type 'ray')" in message


def test_an_unreadable_connection_is_not_taken_for_a_missing_one(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_RAY_DEFAULT", '{"conn_type": "ray", "host": "h", "password": "%s",' % TOKEN)
    with pytest.raises(RayConnectionConfigError, match="is set in AIRFLOW_CONN_RAY_DEFAULT") as err:
        RayHook().get_dashboard_url()
    assert TOKEN not in str(err.value)


def test_a_bad_connection_fails_before_any_request(monkeypatch):
    hook = RayHook(ray_conn_id=set_connection(monkeypatch, "ray_bad", 70000))
    with pytest.raises(RayConnectionConfigError, match="port 70000"):
        hook.get_job_info("sid")


# --- pure helpers ---------------------------------------------------------------------------------


def test_total_resources_of_the_alive_nodes():
    assert total_resources(NODES["data"]["result"]["result"]) == {"CPU": 6.0, "memory": 1e9, "GPU": 1.0}
    assert total_resources([]) == {}
