"""Forwarded AWS credentials on the cluster (``forward_aws_credentials``; the Airflow side's
``credentials``): they reach the driver through its environment, Ray Train through an explicit storage
filesystem (it travels to the controller and workers pickled, through Ray's object store, never through
the job's info), and the training function through its workers' environment."""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable

from airflow_provider_horovod.contract import SESSION_FILE

ENV_NAMES = {
    "aws_access_key_id": "AWS_ACCESS_KEY_ID",
    "aws_secret_access_key": "AWS_SECRET_ACCESS_KEY",
    "aws_session_token": "AWS_SESSION_TOKEN",
}


def read_session(folder: str) -> dict | None:
    path = os.path.join(folder, SESSION_FILE)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def session_env(session: dict) -> dict[str, str]:
    """The AWS_* variables of the session; the cluster's own endpoint and region win over Airflow's."""
    env = {name: session[key] for key, name in ENV_NAMES.items()}
    if session.get("endpoint_url") and not os.environ.get("AWS_ENDPOINT_URL"):
        env["AWS_ENDPOINT_URL"] = session["endpoint_url"]
    if session.get("region_name") and not os.environ.get("AWS_DEFAULT_REGION"):
        env["AWS_DEFAULT_REGION"] = session["region_name"]
    return env


def s3_filesystem(env: dict[str, str]):
    import pyarrow.fs

    return pyarrow.fs.S3FileSystem(
        access_key=env["AWS_ACCESS_KEY_ID"],
        secret_key=env["AWS_SECRET_ACCESS_KEY"],
        session_token=env["AWS_SESSION_TOKEN"],
        endpoint_override=env.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL"),
        region=env.get("AWS_DEFAULT_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1",
    )


def with_env(train_fn: Callable, env: dict[str, str]) -> Callable:
    """The training function, run with ``env`` in its worker's environment (for its own boto3 or
    pyarrow calls)."""

    @functools.wraps(train_fn)
    def wrapped(*args, **kwargs):
        os.environ.update(env)
        return train_fn(*args, **kwargs)

    return wrapped
