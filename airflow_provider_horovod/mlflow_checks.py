"""Checks of the MLflow tracking parameters (``mlflow_tracking_uri``, ``mlflow_conn_id``,
``mlflow_experiment_name``) and the tracking target a connection gives. Pure; each raises
``InvalidParameterError`` naming the parameter, the value and the fix."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

from airflow_provider_horovod.checks import check_conn_id
from airflow_provider_horovod.exceptions import InvalidParameterError

MLFLOW_SCHEMES = ("http", "https", "databricks")


MLFLOW_URI_FIX = (
    "give the address of an MLflow tracking server that the Ray cluster reaches, e.g. "
    "'http://mlflow:5000' (or 'databricks'), or None for no tracking."
)


def check_mlflow(tracking_uri: Any, conn_id: Any) -> None:
    """One of ``mlflow_tracking_uri`` and ``mlflow_conn_id`` at most (the connection holds the URI)."""
    if tracking_uri and conn_id:
        raise InvalidParameterError(
            "mlflow_conn_id",
            conn_id,
            "give either mlflow_tracking_uri or mlflow_conn_id (whose host is the tracking URI), not both.",
        )
    if conn_id is not None:
        check_conn_id(
            "mlflow_conn_id", conn_id, "give the id of a connection whose host is the MLflow tracking URI, or None."
        )


def check_mlflow_tracking_uri(value: Any, parameter: str = "mlflow_tracking_uri") -> str | None:
    """An MLflow tracking URI without credentials in it (they would show in the rendered field and the
    job's payload list); None or empty: no tracking."""
    if value is None or value == "":
        return None
    if isinstance(value, str) and value.strip() == "databricks":  # the workspace of the default profile
        return "databricks"
    parts = urlparse(value.strip()) if isinstance(value, str) else None
    if parts is None or parts.scheme not in MLFLOW_SCHEMES or (parts.scheme != "databricks" and not parts.hostname):
        raise InvalidParameterError(parameter, value, MLFLOW_URI_FIX)
    if parts.username or parts.password:
        raise InvalidParameterError(
            parameter,
            "<a URI with credentials>",
            "keep credentials out of the URI: put the "
            "server's address in an MLflow connection (host; login and password, or a token "
            "as password) and give mlflow_conn_id.",
        )
    return value.strip()


def check_mlflow_experiment_name(value: Any, default: str) -> str:
    if value is None:
        return default
    if not isinstance(value, str) or not value.strip():
        raise InvalidParameterError(
            "mlflow_experiment_name",
            value,
            "give the name of an MLflow experiment (created when missing), or None for the DAG's id.",
        )
    return value.strip()


def mlflow_connection(conn_id: str, conn: Any) -> tuple[str, dict[str, str]]:
    """(tracking URI, credentials) of an MLflow connection: its host is the URI (``http://mlflow:5000``),
    or a host name with ``port`` and ``schema`` (``http``, the default, or ``https``); ``login`` and
    ``password`` are basic auth, a ``password`` alone a token."""
    host = (getattr(conn, "host", None) or "").strip()
    if not host:
        raise InvalidParameterError(
            "mlflow_conn_id",
            conn_id,
            "its connection has no host: set the host to the MLflow tracking URI, e.g. http://mlflow:5000.",
        )
    if "://" not in host and host != "databricks":
        port = f":{conn.port}" if getattr(conn, "port", None) else ""
        host = f"{getattr(conn, 'schema', None) or 'http'}://{host}{port}"
    uri = check_mlflow_tracking_uri(host, parameter=f"mlflow_conn_id {conn_id!r}: the host")
    login, password = getattr(conn, "login", None), getattr(conn, "password", None)
    if login and password:
        return str(uri), {"username": login, "password": password}
    return str(uri), {"token": password} if password else {}
