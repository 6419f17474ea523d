"""RayHook: the connection to a Ray cluster's dashboard (Jobs API), sync for operators and async for triggers."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import time
from collections.abc import Mapping
from functools import cached_property
from typing import Any

from airflow.sdk import BaseHook

from airflow_provider_horovod.exceptions import (
    InvalidParameterError,
    RayAuthenticationError,
    RayClusterUnreachableError,
    RayConnectionConfigError,
    RayJobError,
    RayVersionMismatchError,
)

DEFAULT_PORT = 8265
# Tries of a request whose connection fails, with doubling waits from BACKOFF_S: about 15 s in all,
# enough to ride out a dashboard restart, bounded so a dead cluster fails the task clearly.
RETRIES = 6
BACKOFF_S = 0.5
TIMEOUT_S = (5.0, 30.0)  # connect, read
RETRY_STATUSES = frozenset({502, 503, 504})
LOCAL_HOSTS = frozenset({"", "local"})


# --- pure parts ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RayEndpoint:
    """Where and how to reach a dashboard. ``repr`` hides the headers (they carry the token)."""

    conn_id: str
    url: str
    headers: Mapping[str, str] = dataclasses.field(repr=False)
    verify: bool | str = True
    runtime_env: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def dashboard_url(host: str, port: int | None, schema: str | None) -> str:
    host = host.strip().rstrip("/")
    if "://" in host:  # a full URL in the host field
        return host if port is None or host.count(":") > 1 else f"{host}:{port}"
    return f"{schema or 'http'}://{host}:{port or DEFAULT_PORT}"


def _json_field(conn_id: str, name: str, value: Any) -> dict:
    if value in (None, ""):
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as err:
            raise RayConnectionConfigError(
                f"Connection {conn_id!r}: extra {name!r} is not valid JSON ({err}); give a JSON object."
            ) from None
    if not isinstance(value, Mapping):
        raise RayConnectionConfigError(
            f"Connection {conn_id!r}: extra {name!r} must be a JSON object, got {type(value).__name__}."
        )
    return dict(value)


def parse_extras(conn_id: str, extra: Mapping[str, Any]) -> tuple[bool | str, dict[str, str], dict]:
    """(verify, headers, runtime_env) from a connection's extras, or a clear error."""
    if not isinstance(extra, Mapping):
        raise RayConnectionConfigError(
            f"Connection {conn_id!r}: extra must be a JSON object, got {type(extra).__name__}; give e.g. "
            '{"verify": true, "runtime_env": {"pip": ["pandas"]}}.'
        )
    unknown = set(extra) - {"verify", "headers", "runtime_env"}
    if unknown:
        raise RayConnectionConfigError(
            f"Connection {conn_id!r}: unknown extra {sorted(unknown)}; the Ray connection takes "
            "'verify', 'headers' and 'runtime_env'."
        )
    verify: Any = extra.get("verify", True)
    if isinstance(verify, str) and verify.strip().lower() in ("true", "false", ""):
        verify = verify.strip().lower() != "false"
    if not isinstance(verify, (bool, str)):
        raise RayConnectionConfigError(
            f"Connection {conn_id!r}: extra 'verify'={verify!r} must be true, false or a CA bundle path."
        )
    headers = _json_field(conn_id, "headers", extra.get("headers"))
    for key, value in headers.items():
        # Header values are not shown: a proxy's credentials may be among them.
        if not isinstance(key, str) or not isinstance(value, str):
            raise RayConnectionConfigError(
                f"Connection {conn_id!r}: extra 'headers' must map strings to strings; header {key!r} has a "
                f'{type(value).__name__} value. Give e.g. {{"X-Team": "ml"}}.'
            )
        if any(c in key + value for c in "\r\n\0"):
            raise RayConnectionConfigError(
                f"Connection {conn_id!r}: extra 'headers': header {key!r} has a line break in its name or value "
                "(not shown); remove it."
            )
    runtime_env = _json_field(conn_id, "runtime_env", extra.get("runtime_env"))
    return verify, headers, runtime_env


def check_endpoint(conn_id: str, host: str, port: Any, schema: str | None, verify: bool | str,
                   runtime_env: Mapping[str, Any]) -> None:
    """The connection's fields make a dashboard URL that works, or a clear error before any request
    (requests' own errors would come late, and some echo header values, the token among them)."""
    scheme = host.split("://", 1)[0].lower() if "://" in host else (schema or "http").lower()
    if scheme not in ("http", "https"):
        raise RayConnectionConfigError(
            f"Connection {conn_id!r}: schema {scheme!r} is not a scheme of the Ray dashboard; use 'http' or "
            "'https' (in the schema field, or in the host's URL; it is not a database schema)."
        )
    bare = host.split("://", 1)[-1].rstrip("/")
    if not bare or any(c.isspace() for c in bare) or "/" in bare.split(":", 1)[0]:
        raise RayConnectionConfigError(
            f"Connection {conn_id!r}: host {host!r} is not a host name; give the Ray head's name or "
            "address, e.g. 'ray-head.example.com', with the port in the port field."
        )
    if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536):
        raise RayConnectionConfigError(
            f"Connection {conn_id!r}: port {port!r} is not a TCP port; give the dashboard's port, 1 to "
            f"65535 (Ray's default is {DEFAULT_PORT}), or leave it empty."
        )
    if isinstance(verify, str) and not os.path.exists(verify):
        raise RayConnectionConfigError(
            f"Connection {conn_id!r}: extra 'verify'={verify!r} is neither true/false nor an existing path; "
            "give true, false or the path of a CA bundle (PEM file or folder) on the Airflow workers."
        )
    if runtime_env:
        from airflow_provider_horovod.training import check_runtime_env

        try:
            check_runtime_env(runtime_env)
        except InvalidParameterError as err:
            # The connection's runtime_env goes under every job's: the same rules apply.
            raise RayConnectionConfigError(
                f"Connection {conn_id!r}: extra 'runtime_env'={err.value!r}: {err.fix}"
            ) from None


def clean_token(conn_id: str, token: str | None) -> str | None:
    """The Ray token with the line break that `cat ~/.ray/auth_token` leaves removed. The token is
    never shown: not in this error, and not in the one requests would raise for a header value."""
    if not token:
        return token
    token = token.strip()
    if any(c.isspace() or ord(c) < 32 for c in token):
        raise RayConnectionConfigError(
            f"Connection {conn_id!r}: the password (the Ray auth token) has spaces or control characters "
            "inside it (not shown); paste the token alone, the contents of ~/.ray/auth_token on the head."
        )
    return token


def check_conn_id(conn_id: Any) -> str:
    if not isinstance(conn_id, str) or not conn_id.strip():
        raise InvalidParameterError(
            "ray_conn_id", conn_id,
            "give the id of a connection of type 'ray', or leave the default 'ray_default' (an embedded "
            "local Ray cluster when no such connection exists).",
        )
    return conn_id


def unreadable_env_connection(conn_id: str) -> RayConnectionConfigError | None:
    """Airflow reports a connection it cannot parse from AIRFLOW_CONN_<ID> as missing: say what is
    wrong instead (without its value, which holds the token), rather than fall back to a local cluster."""
    var = f"AIRFLOW_CONN_{conn_id.upper()}"
    value = os.environ.get(var)
    if value is None:
        return None
    reason = "it is neither a JSON object nor a connection URI"
    if value.lstrip().startswith("{"):
        try:
            fields = json.loads(value)
        except ValueError as err:
            reason = f"it is not valid JSON ({err})"
        else:
            reason = "a field has the wrong type"
            port = fields.get("port") if isinstance(fields, dict) else None
            if port is not None and not str(port).strip().isdigit():
                reason = f"its port {port!r} is not a number"
    return RayConnectionConfigError(
        f"Connection {conn_id!r} is set in {var}, but Airflow cannot read it: {reason}. Give e.g. "
        '{"conn_type": "ray", "host": "ray-head", "port": 8265, "schema": "http", "password": "<token>"}.'
    )


def auth_headers(token: str | None, headers: Mapping[str, str]) -> dict[str, str]:
    out = dict(headers)
    if token:
        out["Authorization"] = f"Bearer {token}"
    return out


def merge_runtime_env(base: Mapping[str, Any] | None, override: Mapping[str, Any] | None) -> dict:
    """The connection's default runtime_env under a job's own: env_vars merge key by key,
    py_modules add up, anything else the job sets wins."""
    merged = dict(base or {})
    for key, value in (override or {}).items():
        if key == "env_vars":
            merged[key] = {**(merged.get(key) or {}), **(value or {})}
        elif key == "py_modules":
            merged[key] = [*(value or []), *(merged.get(key) or [])]
        else:
            merged[key] = value
    return merged


def split_new_lines(text: str, offset: int, final: bool = False) -> tuple[list[str], int]:
    """Complete lines after the first ``offset`` ones, and the new offset.

    An unterminated last line is held back (it may still grow) unless the log is ``final``.
    """
    lines = text.split("\n")
    complete = lines[:-1]
    if final and lines[-1]:
        complete.append(lines[-1])
    return complete[offset:], max(offset, len(complete))


def job_url(url: str, submission_id: str) -> str:
    return f"{url}/#/jobs/{submission_id}"


def total_resources(nodes: list[dict]) -> dict[str, float]:
    """Resources of the alive nodes, summed (``node:<ip>`` markers left out)."""
    total: dict[str, float] = {}
    for node in nodes:
        if node.get("state") != "ALIVE":
            continue
        for name, amount in (node.get("resources_total") or {}).items():
            if not name.startswith("node:"):
                total[name] = total.get(name, 0.0) + float(amount)
    return total


def ssl_context(verify: bool | str):
    """aiohttp's ``ssl`` argument for the connection's ``verify``: None (the default checks), False
    (no checks), or a context trusting a CA bundle file or a folder of CA files, as requests does."""
    import ssl

    if verify is False:
        return False
    if isinstance(verify, str):
        if os.path.isdir(verify):
            return ssl.create_default_context(capath=verify)
        return ssl.create_default_context(cafile=verify)
    return None


def local_ray_version() -> str:
    from importlib.metadata import version

    return version("ray")


# --- the hook -----------------------------------------------------------------------------------


class RayHook(BaseHook):
    """Talks to a Ray cluster's dashboard: submit, watch, read logs of and stop Ray jobs.

    Connection (type ``ray``): host, port (default 8265) and schema (http/https) give the
    dashboard URL; the password is the Ray auth token, sent as ``Authorization: Bearer``; extras
    ``verify`` (bool or CA bundle path, default true), ``headers`` (JSON object) and
    ``runtime_env`` (a default runtime_env for every job). Without a ``ray_default`` connection,
    or with host ``local``, it starts (or reuses) an embedded local Ray cluster.

    :param ray_conn_id: the connection id.
    """

    conn_name_attr = "ray_conn_id"
    default_conn_name = "ray_default"
    conn_type = "ray"
    hook_name = "Ray"

    def __init__(self, ray_conn_id: str = default_conn_name, **kwargs) -> None:
        super().__init__(**kwargs)
        self.ray_conn_id = ray_conn_id
        self._version_checked = False

    # endpoint -------------------------------------------------------------------------------

    def _extras(self, conn) -> Any:
        # extra_dejson turns malformed JSON into {} with only a log line: the user's verify,
        # headers and runtime_env would be dropped without a word.
        if conn is None or not conn.extra:
            return {}
        if isinstance(conn.extra, str):
            try:
                return json.loads(conn.extra)
            except ValueError as err:
                raise RayConnectionConfigError(
                    f"Connection {self.ray_conn_id!r}: extra is not valid JSON ({err}); give a JSON object, "
                    'e.g. {"verify": true}.'
                ) from None
        return conn.extra_dejson

    def _endpoint_from(self, conn) -> RayEndpoint:
        if conn is None or (conn.host or "").strip().lower() in LOCAL_HOSTS:
            verify, headers, runtime_env = parse_extras(self.ray_conn_id, self._extras(conn))
            check_endpoint(self.ray_conn_id, "127.0.0.1", None, None, verify, runtime_env)
            from airflow_provider_horovod.local import ensure_running

            cluster = ensure_running()
            return RayEndpoint(self.ray_conn_id, cluster.dashboard_url, auth_headers(cluster.token, headers),
                               verify, runtime_env)
        verify, headers, runtime_env = parse_extras(self.ray_conn_id, self._extras(conn))
        check_endpoint(self.ray_conn_id, conn.host.strip(), conn.port, conn.schema, verify, runtime_env)
        token = clean_token(self.ray_conn_id, conn.password)
        url = dashboard_url(conn.host, conn.port, conn.schema)
        return RayEndpoint(self.ray_conn_id, url, auth_headers(token, headers), verify, runtime_env)

    def _connection_or_none(self):
        from airflow.sdk.exceptions import AirflowNotFoundException

        check_conn_id(self.ray_conn_id)
        try:
            return self.get_connection(self.ray_conn_id)
        except AirflowNotFoundException:
            if (unreadable := unreadable_env_connection(self.ray_conn_id)) is not None:
                raise unreadable from None
            if self.ray_conn_id != self.default_conn_name:
                raise RayConnectionConfigError(
                    f"Connection {self.ray_conn_id!r} does not exist. Create it (type 'ray'), or leave "
                    f"ray_conn_id at {self.default_conn_name!r} to use the embedded local Ray cluster."
                ) from None
            return None

    @cached_property
    def endpoint(self) -> RayEndpoint:
        return self._endpoint_from(self._connection_or_none())

    def get_dashboard_url(self) -> str:
        return self.endpoint.url

    def get_job_url(self, submission_id: str) -> str:
        return job_url(self.endpoint.url, submission_id)

    # sync requests ----------------------------------------------------------------------------

    def _request(self, method: str, path: str, **kwargs):
        import requests

        ep = self.endpoint
        started = time.monotonic()
        last: Exception | str | None = None
        for attempt in range(RETRIES):
            if attempt:
                time.sleep(BACKOFF_S * 2 ** (attempt - 1))
            try:
                response = requests.request(method, ep.url + path, headers=dict(ep.headers), verify=ep.verify,
                                            timeout=TIMEOUT_S, **kwargs)
            except (requests.ConnectionError, requests.Timeout) as err:
                last = err
                continue
            if response.status_code in RETRY_STATUSES:
                last = f"HTTP {response.status_code}"
                continue
            self._raise_for_auth(response.status_code, response.text)
            return response
        raise self._unreachable(last, time.monotonic() - started)

    def _raise_for_auth(self, status: int, text: str) -> None:
        if status in (401, 403):
            what = "no token was sent" if status == 401 else "the token was refused"
            raise RayAuthenticationError(
                f"The Ray dashboard at {self.endpoint.url} answered {status} ({what}). Set the Ray auth "
                f"token (the contents of ~/.ray/auth_token on the head node, or RAY_AUTH_TOKEN) as the "
                f"password of connection {self.ray_conn_id!r}."
            )

    def _unreachable(self, last: Any, elapsed: float) -> RayClusterUnreachableError:
        return RayClusterUnreachableError(
            f"The Ray dashboard at {self.endpoint.url} (connection {self.ray_conn_id!r}) did not answer "
            f"after {RETRIES} tries over {elapsed:.1f} s: {last}. Check that the cluster is up and the "
            f"host, port and schema of connection {self.ray_conn_id!r}."
        )

    def _json(self, response, what: str) -> Any:
        if response.status_code >= 400:
            raise RayJobError(f"Ray dashboard {what} failed: HTTP {response.status_code}: {response.text[:500]}")
        return response.json()

    def check_connection(self) -> dict:
        """The cluster's version info; raises when unreachable, refused or of another Ray version."""
        info = self._json(self._request("GET", "/api/version"), "version check")
        self._check_version(info)
        return info

    def _check_version(self, info: dict) -> None:
        cluster, client = info.get("ray_version"), local_ray_version()
        if cluster != client:
            raise RayVersionMismatchError(
                f"The cluster of connection {self.ray_conn_id!r} runs Ray {cluster}, this Airflow "
                f"worker has Ray {client}. Install ray=={cluster} where Airflow runs, or run the "
                f"cluster on Ray {client}."
            )
        self._version_checked = True

    def test_connection(self) -> tuple[bool, str]:
        try:
            info = self.check_connection()
        except Exception as err:  # the UI shows the message
            return False, str(err)
        return True, f"Connected to Ray {info.get('ray_version')} at {self.endpoint.url}"

    def submit_job(self, *, entrypoint: str, submission_id: str, runtime_env: dict | None = None,
                   metadata: dict[str, str] | None = None, entrypoint_num_cpus: float | None = None,
                   entrypoint_resources: dict[str, float] | None = None) -> str:
        """Submit a job under the given id (uploading local py_modules/working_dir) and return the id."""
        if not self._version_checked:
            self.check_connection()
        from ray.job_submission import JobSubmissionClient

        import requests

        ep = self.endpoint
        started = time.monotonic()
        last: Any = None
        for attempt in range(RETRIES):
            if attempt:
                time.sleep(BACKOFF_S * 2 ** (attempt - 1))
                # The submission id makes the retry safe: an earlier try may have reached Ray.
                try:
                    if self.get_job_info(submission_id) is not None:
                        return submission_id
                except RayClusterUnreachableError:
                    continue
            try:
                client = JobSubmissionClient(ep.url, headers=dict(ep.headers), verify=ep.verify)
                return client.submit_job(
                    entrypoint=entrypoint,
                    submission_id=submission_id,
                    runtime_env=merge_runtime_env(ep.runtime_env, runtime_env),
                    metadata=metadata,
                    entrypoint_num_cpus=entrypoint_num_cpus,
                    entrypoint_resources=entrypoint_resources,
                )
            except (requests.ConnectionError, requests.Timeout, ConnectionError) as err:
                last = err
            except RuntimeError as err:
                raise RayJobError(f"Ray refused job {submission_id}: {err}", submission_id=submission_id) from err
        raise self._unreachable(last, time.monotonic() - started)

    def get_job_info(self, submission_id: str) -> dict | None:
        response = self._request("GET", f"/api/jobs/{submission_id}")
        return None if response.status_code == 404 else self._json(response, "job info")

    def get_job_status(self, submission_id: str) -> str | None:
        info = self.get_job_info(submission_id)
        return info and info.get("status")

    def get_job_logs(self, submission_id: str) -> str:
        response = self._request("GET", f"/api/jobs/{submission_id}/logs")
        return "" if response.status_code == 404 else self._json(response, "job logs").get("logs", "")

    def get_job_logs_since(self, submission_id: str, offset: int, *, final: bool = False) -> tuple[list[str], int]:
        return split_new_lines(self.get_job_logs(submission_id), offset, final)

    def stop_job(self, submission_id: str) -> bool:
        """Stop a job; False when it had already ended or does not exist."""
        response = self._request("POST", f"/api/jobs/{submission_id}/stop")
        return False if response.status_code == 404 else bool(self._json(response, "stop").get("stopped"))

    def delete_job(self, submission_id: str) -> bool:
        """Delete an ended job's record (a running job must be stopped first)."""
        response = self._request("DELETE", f"/api/jobs/{submission_id}")
        return False if response.status_code == 404 else bool(self._json(response, "delete").get("deleted"))

    def wait_for_job(self, submission_id: str, *, poll_interval: float = 2.0,
                     timeout: float | None = None) -> dict:
        """Poll until the job ends and return its info; RayJobError when it ended otherwise than
        SUCCEEDED, does not exist, or is still running after ``timeout`` seconds."""
        from airflow_provider_horovod.training import TERMINAL_STATES

        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            info = self.get_job_info(submission_id)
            if info is None:
                raise RayJobError(f"Ray job {submission_id!r} does not exist on the cluster of connection "
                                  f"{self.ray_conn_id!r}; check the submission id and the connection.",
                                  submission_id=submission_id)
            status = info.get("status")
            if status in TERMINAL_STATES:
                if status != "SUCCEEDED":
                    raise RayJobError(f"Ray job {submission_id} ended {status}: {info.get('message') or ''}; "
                                      f"see {self.get_job_url(submission_id)}", submission_id=submission_id)
                return info
            if deadline is not None and time.monotonic() > deadline:
                raise RayJobError(f"Ray job {submission_id} is still {status} after {timeout:.0f} s.",
                                  submission_id=submission_id)
            time.sleep(poll_interval)

    def list_jobs(self) -> list[dict]:
        return self._json(self._request("GET", "/api/jobs/"), "job list")

    def get_cluster_resources(self) -> dict[str, float]:
        data = self._json(self._request("GET", "/api/v0/nodes?detail=1&limit=10000"), "node list")
        return total_resources(data["data"]["result"]["result"])

    # async twins, for triggers ---------------------------------------------------------------

    async def a_endpoint(self) -> RayEndpoint:
        if "endpoint" in self.__dict__:
            return self.endpoint
        from airflow.sdk.exceptions import AirflowNotFoundException
        from airflow.providers.common.compat.connection import get_async_connection

        check_conn_id(self.ray_conn_id)
        try:
            conn = await get_async_connection(self.ray_conn_id, self)
        except AirflowNotFoundException:
            conn = None
            if (unreadable := unreadable_env_connection(self.ray_conn_id)) is not None:
                raise unreadable from None
            if self.ray_conn_id != self.default_conn_name:
                raise RayConnectionConfigError(f"Connection {self.ray_conn_id!r} does not exist.") from None
        # Starting or finding the local cluster does file and process work: keep it off the loop.
        endpoint = await asyncio.to_thread(self._endpoint_from, conn)
        self.__dict__["endpoint"] = endpoint
        return endpoint

    async def _a_request(self, method: str, path: str) -> tuple[int, str]:
        import aiohttp

        ep = await self.a_endpoint()
        ssl_arg = ssl_context(ep.verify)
        started = time.monotonic()
        last: Any = None
        timeout = aiohttp.ClientTimeout(connect=TIMEOUT_S[0], total=TIMEOUT_S[0] + TIMEOUT_S[1])
        for attempt in range(RETRIES):
            if attempt:
                await asyncio.sleep(BACKOFF_S * 2 ** (attempt - 1))
            try:
                async with aiohttp.ClientSession(timeout=timeout) as session:
                    async with session.request(method, ep.url + path, headers=dict(ep.headers), ssl=ssl_arg) as r:
                        status, text = r.status, await r.text()
            except (aiohttp.ClientConnectionError, asyncio.TimeoutError) as err:
                last = err
                continue
            if status in RETRY_STATUSES:
                last = f"HTTP {status}"
                continue
            self._raise_for_auth(status, text)
            return status, text
        raise self._unreachable(last, time.monotonic() - started)

    def _a_json(self, status: int, text: str, what: str) -> Any:
        if status >= 400:
            raise RayJobError(f"Ray dashboard {what} failed: HTTP {status}: {text[:500]}")
        return json.loads(text)

    async def a_get_job_url(self, submission_id: str) -> str:
        return job_url((await self.a_endpoint()).url, submission_id)

    async def a_submit_job(self, *, entrypoint: str, submission_id: str, runtime_env: dict | None = None,
                           metadata: dict[str, str] | None = None, entrypoint_num_cpus: float | None = None,
                           entrypoint_resources: dict[str, float] | None = None) -> str:
        """``submit_job`` off the event loop: it uploads the job's local files with Ray's own client."""
        await self.a_endpoint()
        return await asyncio.to_thread(
            self.submit_job, entrypoint=entrypoint, submission_id=submission_id, runtime_env=runtime_env,
            metadata=metadata, entrypoint_num_cpus=entrypoint_num_cpus, entrypoint_resources=entrypoint_resources)

    async def a_get_job_info(self, submission_id: str) -> dict | None:
        status, text = await self._a_request("GET", f"/api/jobs/{submission_id}")
        return None if status == 404 else self._a_json(status, text, "job info")

    async def a_get_job_status(self, submission_id: str) -> str | None:
        info = await self.a_get_job_info(submission_id)
        return info and info.get("status")

    async def a_get_job_logs(self, submission_id: str) -> str:
        status, text = await self._a_request("GET", f"/api/jobs/{submission_id}/logs")
        return "" if status == 404 else self._a_json(status, text, "job logs").get("logs", "")

    async def a_get_job_logs_since(self, submission_id: str, offset: int, *,
                                   final: bool = False) -> tuple[list[str], int]:
        return split_new_lines(await self.a_get_job_logs(submission_id), offset, final)

    async def a_stop_job(self, submission_id: str) -> bool:
        status, text = await self._a_request("POST", f"/api/jobs/{submission_id}/stop")
        return False if status == 404 else bool(self._a_json(status, text, "stop").get("stopped"))

    async def a_delete_job(self, submission_id: str) -> bool:
        status, text = await self._a_request("DELETE", f"/api/jobs/{submission_id}")
        return False if status == 404 else bool(self._a_json(status, text, "delete").get("deleted"))

    async def a_get_cluster_resources(self) -> dict[str, float]:
        status, text = await self._a_request("GET", "/api/v0/nodes?detail=1&limit=10000")
        return total_resources(self._a_json(status, text, "node list")["data"]["result"]["result"])
