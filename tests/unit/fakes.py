"""Stand-ins the unit tests share (imported as ``unit.fakes``): a task instance that records its
XComs, a task state store, and the Ray dashboard's job table, in memory behind the calls the job
steps make (``FakeRay``, handed to them as the hook) or served over HTTP as Ray's dashboard answers
(``Dashboard``, for tests that go through the real ``RayHook``). They stand in for Airflow's and
Ray's side of a call, never for the provider code under test. ``HttpStandIn`` is the HTTP server
under ``Dashboard`` and under the hook tests' scripted dashboard (``unit.hooks.dashboard``)."""

from __future__ import annotations

import io
import json
import os
import tempfile
import threading
import time
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any
from urllib.parse import parse_qs, urlsplit

from harness.tasks import RUN_ID, FakeTI

__all__ = ["RUN_ID", "FakeTI"]


def context(**ti) -> dict:
    return {"ti": FakeTI(**ti)}


class Store(dict):
    """A task_state_store: get and set by key."""

    def set(self, key, value):
        self[key] = value


class Untouchable:
    """A hook that fails the test when anything of it is used."""

    def __getattr__(self, name):
        raise AssertionError(f"the cluster was contacted (hook.{name}) before the input was checked")


def payload_files(runtime_env: dict) -> dict[str, bytes]:
    """The files of the payload package among a runtime_env's py_modules (read while they exist)."""
    for module in runtime_env.get("py_modules") or []:
        if os.path.basename(module).startswith("ahp_payload_"):
            files = {}
            for name in sorted(os.listdir(module)):
                with open(os.path.join(module, name), "rb") as f:
                    files[name] = f.read()
            return files
    return {}


NODE = "node-0f3a"  # the node the fake cluster's job drivers run on


def log_tail(text: str, lines: int) -> str:
    """The last ``lines`` lines of a log, as Ray's State API answers ``lines=N``: lines end at "\n"
    only, and an unterminated last line counts as a line."""
    parts = text.split("\n")
    every = [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])
    return "".join(every[-lines:]) if lines > 0 else ""


class FakeRay:
    """The Ray dashboard's job table in memory, behind the methods of RayHook the provider calls.

    ``jobs`` maps a submission id to its info, or to a list of infos that successive polls see (the
    last one stays). ``logs`` likewise maps a submission id to the driver's log, or a list of logs:
    each poll of the job's info moves the log on with it (the last one stays), and every read of
    the log between two polls sees the same text. A job that is not PENDING has its driver on
    ``NODE`` unless its info says otherwise; a job without a log has no log file yet.
    ``on_submit(fake, call)`` plays the cluster after a submission (by default the job is PENDING).
    ``version``: the cluster's Ray version, as its dashboard reports it.
    """

    def __init__(
        self,
        jobs: dict | None = None,
        *,
        logs: dict | None = None,
        cluster: dict | None = None,
        shared_storage: bool = True,
        on_submit=None,
        version: str = "2.60.0",
    ):
        self.jobs = {sid: list(v) if isinstance(v, list) else [v] for sid, v in (jobs or {}).items()}
        self.logs = {sid: list(v) if isinstance(v, list) else [v] for sid, v in (logs or {}).items()}
        self.cluster = {"CPU": 4.0} if cluster is None else cluster
        self.version = version
        self.endpoint = SimpleNamespace(
            url="http://ray-head:8265", shared_storage=shared_storage, embedded=False, prices=None
        )
        self.on_submit = on_submit
        self.submitted: list[dict] = []
        self.stopped: list[str] = []
        self.calls: list[str] = []
        self.tail_reads: list[tuple[str, int]] = []  # (submission id, lines asked) of each log tail read
        self.log_now: dict[str, str] = {}  # the log as the last poll of the job left it

    def set_job(self, sid: str, *infos: dict) -> None:
        self.jobs[sid] = list(infos)

    def _next(self, table: dict, sid: str):
        seen = table.get(sid)
        if not seen:
            return None
        return seen.pop(0) if len(seen) > 1 else seen[0]

    # --- sync -------------------------------------------------------------------------------------

    def get_job_info(self, submission_id: str) -> dict | None:
        self.calls.append("get_job_info")
        if submission_id in self.logs:
            self.log_now[submission_id] = self._next(self.logs, submission_id)
        info = self._next(self.jobs, submission_id)
        if info is None:
            return None
        info = dict(info)
        if info.get("status") != "PENDING":
            info.setdefault("driver_node_id", NODE)
        return info

    def log(self, submission_id: str) -> str | None:
        """The job's log as it is now (None: no log file)."""
        if submission_id in self.log_now:
            return self.log_now[submission_id]
        seen = self.logs.get(submission_id)
        return seen[0] if seen else None

    def get_job_logs(self, submission_id: str) -> str:
        self.calls.append("get_job_logs")
        return self.log(submission_id) or ""

    def stop_job(self, submission_id: str) -> bool:
        self.calls.append("stop_job")
        self.stopped.append(submission_id)
        if seen := self.jobs.get(submission_id):  # seen as it was once more, then STOPPED (the driver has exited)
            self.jobs[submission_id] = [seen[0], {**seen[-1], "status": "STOPPED"}]
        return True

    def get_cluster_resources(self) -> dict:
        self.calls.append("get_cluster_resources")
        return dict(self.cluster)

    def ray_version(self) -> str | None:
        return self.version

    def get_job_url(self, submission_id: str) -> str:
        return f"{self.endpoint.url}/#/jobs/{submission_id}"

    def submit_job(self, *, entrypoint: str, submission_id: str, runtime_env=None, metadata=None, **kwargs) -> str:
        self.calls.append("submit_job")
        call = {
            "entrypoint": entrypoint,
            "submission_id": submission_id,
            "runtime_env": dict(runtime_env or {}),
            "metadata": dict(metadata or {}),
            "payload": payload_files(dict(runtime_env or {})),
            **kwargs,
        }
        self.submitted.append(call)
        self.jobs[submission_id] = [
            {"status": "PENDING", "metadata": call["metadata"], "start_time": time.time() * 1000, "message": ""}
        ]
        if self.on_submit is not None:
            self.on_submit(self, call)
        return submission_id

    # --- async twins, as the trigger uses them ------------------------------------------------------

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.aclose()

    async def aclose(self) -> None:
        self.calls.append("aclose")

    async def a_endpoint(self):
        return self.endpoint

    async def a_get_job_info(self, submission_id: str, fresh_within_s: float | None = None) -> dict | None:
        return self.get_job_info(submission_id)

    async def a_get_job_logs(self, submission_id: str) -> str:
        return self.get_job_logs(submission_id)

    async def a_get_log_tail(self, node_id: str, submission_id: str, lines: int) -> str | None:
        self.calls.append("a_get_log_tail")
        self.tail_reads.append((submission_id, lines))
        assert node_id == NODE, f"the log was read from node {node_id!r}, not the driver's"
        text = self.log(submission_id)
        return None if text is None else log_tail(text, lines)

    async def a_stop_job(self, submission_id: str) -> bool:
        return self.stop_job(submission_id)

    async def a_get_cluster_resources(self) -> dict:
        return self.get_cluster_resources()


class HttpStandIn:
    """A real HTTP server on 127.0.0.1, keep-alive as Ray's dashboard (aiohttp) is: each request is
    answered by the subclass's ``respond(request, body)`` (``request``: the handler, with its
    ``command``, ``path``, ``headers`` and ``client_address``) as (status, bytes or a JSON value)."""

    def __init__(self):
        respond = self.respond

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def handle_one(self):
                length = int(self.headers.get("Content-Length") or 0)
                status, answer = respond(self, self.rfile.read(length) if length else b"")
                data = answer if isinstance(answer, bytes) else json.dumps(answer).encode()
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

    def respond(self, request: BaseHTTPRequestHandler, body: bytes) -> tuple[int, Any]:
        raise NotImplementedError

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Dashboard(HttpStandIn):
    """``FakeRay``'s job table served over HTTP as Ray 2.60's dashboard answers the calls RayHook
    makes: version, packages, jobs (submit, info, logs, stop), the State API's log file and nodes.
    A submission's payload package is unpacked for ``FakeRay`` as the job's driver would see it."""

    def __init__(self, ray: FakeRay):
        self.ray = ray
        self.packages: dict[str, bytes] = {}
        self.requests: list[tuple[str, str]] = []
        self.failures: list[tuple[str, int, int]] = []  # (path prefix, HTTP status, requests answered before)
        super().__init__()

    def respond(self, request: BaseHTTPRequestHandler, body: bytes) -> tuple[int, Any]:
        self.requests.append((request.command, request.path))
        return self.answer(request.command, request.path, body)

    def connection(self, *, shared_storage: bool = True, **extra: Any) -> str:
        """An AIRFLOW_CONN_* value for this dashboard; ``extra``: more of the connection's extra."""
        return json.dumps(
            {
                "conn_type": "ray",
                "host": "127.0.0.1",
                "port": self.port,
                "password": "tok-unit",
                "extra": {"shared_storage": shared_storage, **extra},
            }
        )

    def fail(self, prefix: str, status: int = 500, *, after: int = 0) -> None:
        """Answer requests whose path starts with ``prefix`` with ``status``, after ``after`` of them."""
        self.failures.append((prefix, status, after))

    def answer(self, method: str, target: str, body: bytes) -> tuple[int, Any]:
        url = urlsplit(target)
        path, query = url.path, {k: v[0] for k, v in parse_qs(url.query).items()}
        for prefix, status, after in self.failures:
            if path.startswith(prefix) and sum(p.startswith(prefix) for _, p in self.requests) > after:
                return status, {"error": "the dashboard failed"}
        ray = self.ray
        if (method, path) == ("GET", "/api/version"):
            return 200, {"ray_version": "2.60.0", "version": "4"}
        if path.startswith("/api/packages/"):
            name = path.rsplit("/", 1)[1]
            if method == "PUT":
                self.packages[name] = body
                return 200, {}
            return (200, {}) if name in self.packages else (404, {})
        if (method, path) == ("POST", "/api/jobs/"):
            return 200, {"submission_id": self.submit(json.loads(body))}
        if path == "/api/v0/nodes":
            return 200, {"data": {"result": {"result": [{"state": "ALIVE", "resources_total": ray.cluster}]}}}
        if path == "/api/v0/logs/file":
            sid = query["filename"][len("job-driver-") : -len(".log")]
            ray.calls.append("a_get_log_tail")
            ray.tail_reads.append((sid, int(query["lines"])))
            text = ray.log(sid) if query.get("node_id") == NODE else None
            if text is None:
                return 500, b"file is not found"
            return 200, log_tail(text, int(query["lines"])).encode()
        parts = path.rstrip("/").split("/")  # /api/jobs/<sid>[/logs|/stop]
        sid, action = parts[3], parts[4] if len(parts) > 4 else ""
        if action == "stop":
            return 200, {"stopped": ray.stop_job(sid)}
        info = ray.get_job_info(sid) if action == "" else (ray.jobs.get(sid) or [None])[0]
        if info is None:
            return 404, {}
        if action == "logs":
            return 200, {"logs": ray.get_job_logs(sid)}
        return 200, {**info, "submission_id": sid}

    def submit(self, body: dict) -> str:
        """The job as ``FakeRay`` takes it: the payload package unpacked where its driver would read it."""
        env = dict(body.get("runtime_env") or {})
        with tempfile.TemporaryDirectory() as folder:
            modules = []
            for uri in env.get("py_modules") or []:
                data = self.packages.get(uri.rsplit("/", 1)[-1])
                with zipfile.ZipFile(io.BytesIO(data or b"PK\x05\x06" + b"\0" * 18)) as archive:
                    names = archive.namelist()
                    top = names[0].split("/", 1)[0] if names else ""
                    if top.startswith("ahp_payload_"):
                        archive.extractall(folder)
                        modules.append(os.path.join(folder, top))
                        continue
                modules.append(uri)
            env["py_modules"] = modules
            kwargs = {
                k: body.get(k)
                for k in ("entrypoint_num_cpus", "entrypoint_num_gpus", "entrypoint_memory", "entrypoint_resources")
            }
            return self.ray.submit_job(
                entrypoint=body["entrypoint"],
                submission_id=body["submission_id"],
                runtime_env=env,
                metadata=body.get("metadata"),
                **kwargs,
            )


def as_runtime_prints(text: str, token: str) -> str:
    """``text`` with its lines that start with a bare mark marked as the runtime of an attempt with
    ``token`` prints them (a fake cluster's log, written with the bare marks)."""
    from airflow_provider_horovod.contract import ERROR_MARK, FAILURE_MARK, RESULT_MARK, marked

    lines = text.split("\n")
    for i, line in enumerate(lines):
        for mark in (ERROR_MARK, FAILURE_MARK, RESULT_MARK):
            if line.startswith(mark):
                lines[i] = marked(mark, token) + line[len(mark) :]
    return "\n".join(lines)
