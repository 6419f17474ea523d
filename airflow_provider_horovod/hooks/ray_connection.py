"""The Ray connection read into a ``RayEndpoint``: where the dashboard is, how to authenticate, and
the connection's defaults. Pure: it checks the fields and says what is wrong before any request
(requests' own errors would come late, and some echo header values, the token among them)."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

from airflow_provider_horovod.exceptions import InvalidParameterError, RayConnectionConfigError

DEFAULT_PORT = 8265
LOCAL_HOSTS = frozenset({"", "local"})
EXTRAS = ("verify", "ca_bundle", "headers", "runtime_env", "shared_storage", "prices")


@dataclasses.dataclass(frozen=True)
class RayEndpoint:
    """Where and how to reach a dashboard. ``repr`` hides the headers (they carry the token).

    ``embedded``: the provider's own local cluster (same machine, same disk). ``shared_storage``:
    local paths are shared by every Ray node and the Airflow workers (connection extra). ``prices``:
    what the cluster's CPU- and GPU-hours cost (connection extra), for tasks that give none.
    """

    conn_id: str
    url: str
    headers: Mapping[str, str] = dataclasses.field(repr=False)
    verify: bool | str = True
    runtime_env: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    embedded: bool = False
    shared_storage: bool = False
    prices: Mapping[str, Any] | None = None

    def job_url(self, submission_id: str) -> str:
        return f"{self.url}/#/jobs/{submission_id}"


def is_local_host(host: str | None) -> bool:
    return (host or "").strip().lower() in LOCAL_HOSTS


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


def _flag(conn_id: str, name: str, value: Any, default: bool) -> bool:
    if value is None or value == "":
        return default
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    if isinstance(value, bool):
        return value
    raise RayConnectionConfigError(f"Connection {conn_id!r}: extra {name!r}={value!r} must be true or false.")


def read_extras(conn_id: str, raw: Any) -> dict[str, Any]:
    """The connection's extra as a dict. Airflow's ``extra_dejson`` turns malformed JSON into {} with
    only a log line, which would drop the user's verify, headers and runtime_env without a word."""
    if raw in (None, ""):
        return {}
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError as err:
            raise RayConnectionConfigError(
                f'Connection {conn_id!r}: extra is not valid JSON ({err}); give a JSON object, e.g. {{"verify": true}}.'
            ) from None
    if not isinstance(raw, Mapping):
        raise RayConnectionConfigError(
            f"Connection {conn_id!r}: extra must be a JSON object, got {type(raw).__name__}; give e.g. "
            '{"verify": true, "runtime_env": {"pip": ["pandas"]}}.'
        )
    unknown = set(raw) - set(EXTRAS)
    if unknown:
        raise RayConnectionConfigError(
            f"Connection {conn_id!r}: unknown extra {sorted(unknown, key=repr)}; the Ray connection takes "
            f"{', '.join(map(repr, EXTRAS))}."
        )
    return dict(raw)


def check_headers(conn_id: str, headers: dict) -> dict[str, str]:
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
    return headers


def check_address(conn_id: str, host: str, port: Any, schema: str | None) -> None:
    scheme = host.split("://", 1)[0].lower() if "://" in host else (schema or "http").lower()
    if scheme not in ("http", "https"):
        raise RayConnectionConfigError(
            f"Connection {conn_id!r}: schema {scheme!r} is not a scheme of the Ray dashboard; use 'http' or "
            "'https' (in the schema field, or in the host's URL; it is not a database schema)."
        )
    bare = host.split("://", 1)[-1].rstrip("/")
    if not bare or any(c.isspace() for c in bare) or "/" in bare.split(":", 1)[0]:
        raise RayConnectionConfigError(
            f"Connection {conn_id!r}: host {host!r} is not a host name; give the Ray head's name or address, "
            "e.g. 'ray-head.example.com', with the port in the port field."
        )
    if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536):
        raise RayConnectionConfigError(
            f"Connection {conn_id!r}: port {port!r} is not a TCP port; give the dashboard's port, 1 to 65535 "
            f"(Ray's default is {DEFAULT_PORT}), or leave it empty."
        )


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


def auth_headers(token: str | None, headers: Mapping[str, str]) -> dict[str, str]:
    out = dict(headers)
    if token:
        out["Authorization"] = f"Bearer {token}"
    return out


def endpoint_from(
    conn_id: str,
    *,
    host: str | None,
    port: Any,
    schema: str | None,
    password: str | None,
    extra: Any,
    local_url: str | None = None,
    local_token: str | None = None,
) -> RayEndpoint:
    """The endpoint of a connection's fields. ``local_url``/``local_token``: the embedded cluster's,
    used when the host is empty or ``local``."""
    from airflow_provider_horovod.checks import check_prices
    from airflow_provider_horovod.runtime_env_checks import check_runtime_env

    extras = read_extras(conn_id, extra)
    verify: Any = extras.get("verify", True)
    if verify is None or (isinstance(verify, str) and verify.strip().lower() in ("true", "false", "")):
        verify = verify is None or verify.strip().lower() != "false"
    if not isinstance(verify, (bool, str)):
        raise RayConnectionConfigError(
            f"Connection {conn_id!r}: extra 'verify'={verify!r} must be true, false or a CA bundle path."
        )
    ca_bundle = extras.get("ca_bundle") or None
    if ca_bundle is not None and not isinstance(ca_bundle, str):
        raise RayConnectionConfigError(
            f"Connection {conn_id!r}: extra 'ca_bundle'={ca_bundle!r} is not a path; give the path of a CA bundle "
            "(PEM file or folder) on the Airflow workers, or leave it empty."
        )
    if ca_bundle is not None and verify is not False:
        # The form's "CA bundle" field; a path in "verify" itself still works (connections made before it).
        verify = ca_bundle
    if isinstance(verify, str) and not os.path.exists(verify):
        if verify == ca_bundle:
            raise RayConnectionConfigError(
                f"Connection {conn_id!r}: extra 'ca_bundle'={verify!r} is not an existing path; give the path of a "
                "CA bundle (PEM file or folder) on the Airflow workers, or leave it empty."
            )
        raise RayConnectionConfigError(
            f"Connection {conn_id!r}: extra 'verify'={verify!r} is neither true, false nor an existing path; give "
            "true, false or the path of a CA bundle (PEM file or folder) on the Airflow workers."
        )
    headers = check_headers(conn_id, _json_field(conn_id, "headers", extras.get("headers")))
    runtime_env = _json_field(conn_id, "runtime_env", extras.get("runtime_env"))
    try:
        check_runtime_env("runtime_env", runtime_env)
    except InvalidParameterError as err:
        # The connection's runtime_env goes under every job's: the same rules apply.
        raise RayConnectionConfigError(
            f"Connection {conn_id!r}: extra 'runtime_env'={err.value!r}: {err.fix}"
        ) from None
    shared = bool(_flag(conn_id, "shared_storage", extras.get("shared_storage"), False))
    try:
        prices = check_prices("prices", _json_field(conn_id, "prices", extras.get("prices")) or None)
    except InvalidParameterError as err:
        raise RayConnectionConfigError(f"Connection {conn_id!r}: extra 'prices'={err.value!r}: {err.fix}") from None
    if is_local_host(host):
        return RayEndpoint(
            conn_id,
            local_url or "",
            auth_headers(local_token, headers),
            verify,
            runtime_env,
            embedded=True,
            shared_storage=True,
            prices=prices,
        )
    host = str(host)
    check_address(conn_id, host.strip(), port, schema)
    token = clean_token(conn_id, password)
    return RayEndpoint(
        conn_id,
        dashboard_url(host, port, schema),
        auth_headers(token, headers),
        verify,
        runtime_env,
        shared_storage=shared,
        prices=prices,
    )


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
