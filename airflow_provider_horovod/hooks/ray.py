"""RayHook: a Ray cluster's dashboard over HTTP (the Jobs API), sync for operators and async for triggers.

No Ray package is needed where Airflow runs: the job's local files are uploaded through the
dashboard's package API, and the runtime that trains travels with each job.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections.abc import Mapping
from functools import cached_property
from typing import Any

from airflow.sdk import BaseHook

from airflow_provider_horovod.exceptions import (
    RayAuthenticationError,
    RayClusterUnreachableError,
    RayConnectionConfigError,
    RayJobError,
    RayVersionMismatchError,
)
from airflow_provider_horovod.hooks.ray_connection import (
    RayEndpoint,
    endpoint_from,
    is_local_host,
    merge_runtime_env,
    unreadable_env_connection,
)
from airflow_provider_horovod.hooks.ray_routes import (
    DELETE_JOB,
    JOB_INFO,
    JOB_LIST,
    JOB_LIST_DETAILED,
    JOB_LOGS,
    LOG_FILE,
    NODES,
    PACKAGE,
    STOP_JOB,
    SUBMIT_JOB,
    UPLOAD_PACKAGE,
    VERSION,
    Route,
)
from airflow_provider_horovod.hooks.ray_transport import (
    RETRIES,
    SESSIONS,
    UPLOAD_TIMEOUT_S,
    Transient,
    a_fetch,
    a_send,
    client_args,
    fetch,
    import_aiohttp,
    send,
)


def cluster_or_none(hook: RayHook) -> dict | None:
    """The cluster's resources for an error message; None when they cannot be read."""
    from airflow_provider_horovod.exceptions import HorovodProviderError

    try:
        return hook.get_cluster_resources()
    except HorovodProviderError:
        return None


class RayHook(BaseHook):
    """Talks to a Ray cluster's dashboard: submit, watch, read logs of and stop Ray jobs.

    Connection (type ``ray``): host, port (default 8265) and schema (http/https) give the dashboard
    URL; the password is the Ray auth token, sent as ``Authorization: Bearer``. Extras: ``verify``
    (bool or CA bundle path, default true), ``headers`` (JSON object), ``runtime_env`` (a default
    runtime_env for every job) and ``shared_storage`` (true when local storage paths are shared by
    every Ray node and the Airflow workers). Without a ``ray_default`` connection, or with host
    ``local``, it starts (or reuses) an embedded local Ray cluster.

    One HTTP client per hook, its connection kept alive: ``get_conn()`` (an ``httpx.Client``) for
    the sync calls; for the ``a_*`` twins an ``aiohttp.ClientSession`` shared by the hooks of one
    event loop that speak to the same dashboard (a triggerer's tasks). Close it with ``aclose()``,
    or use the hook as an async context manager.

    :param ray_conn_id: the connection id.
    """

    conn_name_attr = "ray_conn_id"
    default_conn_name = "ray_default"
    conn_type = "ray"
    hook_name = "Ray"

    def __init__(self, ray_conn_id: str = default_conn_name, **kwargs) -> None:
        super().__init__(**kwargs)
        self.ray_conn_id = ray_conn_id
        self._async_endpoint: RayEndpoint | None = None
        # The aiohttp session of the async twins: (its event loop, its key in SESSIONS, the session).
        self._async_session: tuple[asyncio.AbstractEventLoop, tuple, Any] | None = None
        self._cluster_info: dict | None = None

    # --- the connection -------------------------------------------------------------------------

    def _endpoint(self, conn) -> RayEndpoint:
        """The endpoint of a connection (None: no such connection, the embedded cluster)."""
        host = None if conn is None else conn.host
        local_url = local_token = None
        if is_local_host(host):
            from airflow_provider_horovod.local import ensure_running

            cluster = ensure_running()
            local_url, local_token = cluster.dashboard_url, cluster.token
        return endpoint_from(
            self.ray_conn_id,
            host=host,
            port=None if conn is None else conn.port,
            schema=None if conn is None else conn.schema,
            password=None if conn is None else conn.password,
            extra=None if conn is None else conn.extra,
            local_url=local_url,
            local_token=local_token,
        )

    def _missing(self):
        """None for the default connection (the embedded cluster); else a clear error."""
        if (unreadable := unreadable_env_connection(self.ray_conn_id)) is not None:
            raise unreadable
        if self.ray_conn_id != self.default_conn_name:
            raise RayConnectionConfigError(
                f"Connection {self.ray_conn_id!r} was not found. A running task finds connections in Airflow's "
                f"metadata database, its environment (AIRFLOW_CONN_{self.ray_conn_id.upper()}) and secrets "
                "backends; code outside a task (a script, a test, the Python shell) only in the last two. Create it "
                f"(type 'ray'), or leave ray_conn_id at {self.default_conn_name!r} to use the embedded local Ray "
                "cluster."
            )
        return None

    @cached_property
    def endpoint(self) -> RayEndpoint:
        from airflow.providers.common.compat.sdk import AirflowNotFoundException

        if self._async_endpoint is not None:  # read already by an async call
            return self._async_endpoint
        try:
            conn = self.get_connection(self.ray_conn_id)
        except AirflowNotFoundException:
            conn = self._missing()
        return self._endpoint(conn)

    async def a_endpoint(self) -> RayEndpoint:
        if self._async_endpoint is None and "endpoint" in vars(self):  # read already by a sync call
            self._async_endpoint = self.endpoint
        if self._async_endpoint is None:
            from airflow.providers.common.compat.connection import get_async_connection
            from airflow.providers.common.compat.sdk import AirflowNotFoundException

            try:
                conn = await get_async_connection(self.ray_conn_id, self)
            except AirflowNotFoundException:
                conn = self._missing()
            # Starting or finding the local cluster does file and process work: keep it off the loop.
            self._async_endpoint = await asyncio.to_thread(self._endpoint, conn)
        return self._async_endpoint

    def get_conn(self):
        """The hook's ``httpx.Client``, with the dashboard's URL, the token and the headers."""
        return self._client

    @cached_property
    def _client(self):
        import httpx

        return httpx.Client(**client_args(self.endpoint))

    def get_job_url(self, submission_id: str) -> str:
        return self.endpoint.job_url(submission_id)

    # --- the transport: one call path for each twin, through the routes above ------------------

    def _request(self, route: Route, *, timeout: tuple[float, float] | None = None, **request: Any) -> tuple[int, str]:
        """The status and text of ``route``'s request (``request``: its path's values, and ``params``,
        ``json`` or ``content``); a dashboard that does not answer or refuses the token raises."""
        import httpx

        path, options = route.split(request)
        if timeout is not None:
            options["timeout"] = httpx.Timeout(timeout[1], connect=timeout[0])
        started = time.monotonic()
        try:
            status, text = send(functools.partial(fetch, self.get_conn(), route.method, path, **options))
        except Transient as err:
            raise self._unreachable(self.endpoint, err, time.monotonic() - started) from None
        self._check_auth(self.endpoint, status)
        return status, text

    async def _a_request(self, route: Route, **request: Any) -> tuple[int, str]:
        """``_request`` in the event loop, through the loop's shared aiohttp session."""
        endpoint, (_, session) = await self.a_endpoint(), await self._a_session()
        path, options = route.split(request)
        started = time.monotonic()
        try:
            status, text = await a_send(
                functools.partial(a_fetch, session, route.method, endpoint.url.rstrip("/") + path, **options)
            )
        except Transient as err:
            raise self._unreachable(endpoint, err, time.monotonic() - started) from None
        self._check_auth(endpoint, status)
        return status, text

    def _call(self, route: Route, **request: Any) -> Any:
        """What ``route`` answers, read as the route says."""
        return route.answer(*self._request(route, **request))

    async def _a_call(self, route: Route, **request: Any) -> Any:
        return route.answer(*await self._a_request(route, **request))

    async def _a_session(self) -> tuple[tuple, Any]:
        """(its key in ``SESSIONS``, the aiohttp session) for this event loop."""
        loop = asyncio.get_running_loop()
        if self._async_session is None or self._async_session[0] is not loop:
            endpoint = await self.a_endpoint()
            await import_aiohttp()
            # An aiohttp session serves the loop it was made in (the operator runs one loop per wait).
            key, session = SESSIONS.acquire(loop, endpoint)
            self._async_session = (loop, key, session)
        return self._async_session[1:]

    async def aclose(self) -> None:
        if self._async_session is not None:
            _, key, _ = self._async_session
            self._async_session = None
            await SESSIONS.release(key)

    async def __aenter__(self) -> RayHook:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _check_auth(self, endpoint: RayEndpoint, status: int) -> None:
        if status in (401, 403):
            what = "no token was sent" if status == 401 else "the token was refused"
            raise RayAuthenticationError(
                f"The Ray dashboard at {endpoint.url} answered {status} ({what}). Set the Ray auth token (the "
                "contents of ~/.ray/auth_token on the head node, or RAY_AUTH_TOKEN) as the password of "
                f"connection {self.ray_conn_id!r}."
            )

    def _unreachable(self, endpoint: RayEndpoint, last: Any, elapsed: float) -> RayClusterUnreachableError:
        return RayClusterUnreachableError(
            f"The Ray dashboard at {endpoint.url} (connection {self.ray_conn_id!r}) did not answer after "
            f"{RETRIES} tries over {elapsed:.1f} s: {last}. Check that the cluster is up and the host, port and "
            f"schema of connection {self.ray_conn_id!r}."
        )

    # --- the Jobs API: each call, and its async twin for triggers ------------------------------

    def check_connection(self) -> dict:
        """The cluster's version info; raises when unreachable, refused, or of a Ray version the
        provider's runtime does not support (a newer, untested one is logged as a warning)."""
        from airflow_provider_horovod.contract import check_ray_version, untested_ray_version

        info = self._call(VERSION)
        if (problem := check_ray_version(info.get("ray_version"))) is not None:
            raise RayVersionMismatchError(f"The cluster of connection {self.ray_conn_id!r}: {problem}")
        if warning := untested_ray_version(info.get("ray_version")):
            self.log.warning("The cluster of connection %r: %s", self.ray_conn_id, warning)
        self._cluster_info = info
        return info

    def ray_version(self) -> str | None:
        """The cluster's Ray version, as its dashboard reports it (checked once per hook)."""
        info = self._cluster_info if self._cluster_info is not None else self.check_connection()
        return info.get("ray_version")

    def test_connection(self) -> tuple[bool, str]:
        try:
            info = self.check_connection()
        except Exception as err:  # the UI shows the message
            return False, str(err)
        return True, f"Connected to Ray {info.get('ray_version')} at {self.endpoint.url}"

    def upload_package(self, uri: str, data: bytes) -> bool:
        """Upload one package unless the cluster has it; True when it was uploaded."""
        protocol, name = uri.split("://", 1)
        status, _ = self._request(PACKAGE, protocol=protocol, name=name)
        if status == 200:
            return False
        self._call(UPLOAD_PACKAGE, protocol=protocol, name=name, content=data, timeout=UPLOAD_TIMEOUT_S)
        return True

    def submit_job(
        self,
        *,
        entrypoint: str,
        submission_id: str,
        runtime_env: Mapping | None = None,
        metadata: Mapping[str, str] | None = None,
        entrypoint_num_cpus: float | None = None,
        entrypoint_num_gpus: float | None = None,
        entrypoint_memory: int | None = None,
        entrypoint_resources: Mapping[str, float] | None = None,
    ) -> str:
        """Submit a job under the given id, uploading its local ``working_dir``/``py_modules``, and
        return the id. Retried requests cannot double it: Ray refuses a second job of the same id."""
        from airflow_provider_horovod.hooks.ray_packages import with_uploaded_packages

        if self._cluster_info is None:
            self.check_connection()
        env, packages = with_uploaded_packages(merge_runtime_env(self.endpoint.runtime_env, runtime_env))
        for package in packages:
            if self.upload_package(package.uri, package.data):
                self.log.info("Uploaded %s (%.1f KiB).", package.uri, len(package.data) / 1024)
        body = {
            "entrypoint": entrypoint,
            "submission_id": submission_id,
            "runtime_env": env,
            "metadata": dict(metadata or {}),
            "entrypoint_num_cpus": entrypoint_num_cpus,
            "entrypoint_num_gpus": entrypoint_num_gpus,
            "entrypoint_memory": entrypoint_memory,
            "entrypoint_resources": dict(entrypoint_resources) if entrypoint_resources else None,
        }
        status, text = self._request(SUBMIT_JOB, json=body)
        if status >= 400 and "already exists" in text and self.get_job_info(submission_id) is not None:
            return submission_id  # an earlier try of this request reached Ray
        if status >= 400:
            raise RayJobError(
                f"Ray refused job {submission_id}: HTTP {status}: {text[-1000:]}", submission_id=submission_id
            )
        return json.loads(text).get("submission_id") or submission_id

    def get_job_info(self, submission_id: str) -> dict | None:
        return self._call(JOB_INFO, submission_id=submission_id)

    async def a_get_job_info(self, submission_id: str, fresh_within_s: float | None = None) -> dict | None:
        """The job's info; with ``fresh_within_s``, where this event loop waits for many jobs, from a
        list of the cluster's unended jobs at most that old, read once for all of them."""
        if fresh_within_s is not None:
            key, _ = await self._a_session()
            info = await SESSIONS.board(key).info(submission_id, fresh_within_s, self._a_list_unended)
            if info is not None:
                return info
        return await self._a_call(JOB_INFO, submission_id=submission_id)

    async def _a_list_unended(self) -> list[dict]:
        """The cluster's PENDING and RUNNING jobs, with the infos ``a_get_job_info`` gives (State API)."""
        from airflow_provider_horovod.contract import JobStatus

        params: list[tuple[str, Any]] = [("limit", 10000), ("detail", "true")]
        for ended in (status for status in JobStatus if status.is_terminal):
            params += [("filter_keys", "status"), ("filter_predicates", "!="), ("filter_values", ended.value)]
        return await self._a_call(JOB_LIST_DETAILED, params=params)

    def get_job_status(self, submission_id: str) -> str | None:
        info = self.get_job_info(submission_id)
        return info.get("status") if info else None

    def get_job_logs(self, submission_id: str) -> str:
        return self._call(JOB_LOGS, submission_id=submission_id)

    async def a_get_job_logs(self, submission_id: str) -> str:
        return await self._a_call(JOB_LOGS, submission_id=submission_id)

    async def a_get_log_tail(self, node_id: str, submission_id: str, lines: int) -> str | None:
        """The last ``lines`` lines of the job's driver log (State API; cost follows ``lines``), None
        while the driver has not written it."""
        params = {"node_id": node_id, "filename": f"job-driver-{submission_id}.log", "lines": lines}
        status, text = await self._a_request(LOG_FILE, params=params)
        if status != 200 and "file is not found" in text:
            return None
        if status != 200:
            raise RayJobError(
                f"Ray dashboard {LOG_FILE.what} failed: HTTP {status}: {text[:500]}", submission_id=submission_id
            )
        return text

    def stop_job(self, submission_id: str) -> bool:
        """Stop a job; idempotent. Ray's answer: True while the job's supervisor is there to signal (a
        job already STOPPED may still have it for a moment, on a busy head), False once it is gone or the
        job does not exist."""
        return self._call(STOP_JOB, submission_id=submission_id)

    async def a_stop_job(self, submission_id: str) -> bool:
        return await self._a_call(STOP_JOB, submission_id=submission_id)

    def delete_job(self, submission_id: str) -> bool:
        """Delete an ended job's record (a running job must be stopped first)."""
        return self._call(DELETE_JOB, submission_id=submission_id)

    def list_jobs(self) -> list[dict]:
        return self._call(JOB_LIST)

    def get_cluster_resources(self) -> dict[str, float]:
        return self._call(NODES)

    async def a_get_cluster_resources(self) -> dict[str, float]:
        return await self._a_call(NODES)


class WithRayHook:
    """How the operators, the sensor and the trigger make their ``RayHook``: from their ``ray_conn_id``,
    when first used (not in ``__init__``, which runs at every DAG parse), then kept."""

    ray_conn_id: str

    @cached_property
    def hook(self) -> RayHook:
        return RayHook(ray_conn_id=self.ray_conn_id)
