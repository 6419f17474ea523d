"""Forwarded AWS session credentials: asked from STS (moto's server) through the Amazon provider
for the connection, and what the cluster side makes of them."""

import json
import sys

import pytest

from airflow_provider_horovod.credentials import session_credentials
from airflow_provider_horovod.exceptions import HorovodProviderError, MissingExtraError
from airflow_provider_horovod.runtime.aws_session import session_env, with_env

KEY_ID, SECRET_KEY = "AKIAAHPTESTKEY000001", "ahp-long-lived-secret-key"


@pytest.fixture
def aws_conn(s3, monkeypatch):
    """AIRFLOW_CONN_AWS_X: long-lived keys, moto's endpoint and a region of its own; the worker's
    environment points nowhere, so what is found comes from the connection."""
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "ap-south-1")
    monkeypatch.setenv(
        "AIRFLOW_CONN_AWS_X",
        json.dumps(
            {
                "conn_type": "aws",
                "login": KEY_ID,
                "password": SECRET_KEY,
                "extra": {"endpoint_url": s3.endpoint_url, "region_name": "eu-west-1"},
            }
        ),
    )
    return "aws_x"


def test_session_credentials_from_the_connection(aws_conn, s3):
    session = session_credentials(aws_conn, 900)
    assert set(session) == {
        "aws_access_key_id",
        "aws_secret_access_key",
        "aws_session_token",
        "expiration",
        "region_name",
        "endpoint_url",
    }
    assert session["aws_access_key_id"]
    assert session["aws_session_token"]
    assert session["aws_access_key_id"] != KEY_ID
    assert session["aws_secret_access_key"] != SECRET_KEY
    assert session["endpoint_url"] == s3.endpoint_url
    assert session["region_name"] == "eu-west-1"
    from datetime import datetime

    datetime.fromisoformat(session["expiration"])
    json.dumps(session)


def test_sts_errors_name_the_connection_and_not_the_keys(aws_conn, monkeypatch):
    monkeypatch.setenv(
        "AIRFLOW_CONN_AWS_X",
        json.dumps(
            {
                "conn_type": "aws",
                "login": KEY_ID,
                "password": SECRET_KEY,
                "extra": {
                    "endpoint_url": "http://127.0.0.1:9",
                    "region_name": "eu-west-1",
                    "config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 1},
                },
            }
        ),
    )
    with pytest.raises(HorovodProviderError) as err:
        session_credentials(aws_conn, 900)
    message = str(err.value)
    assert "connection 'aws_x'" in message
    assert "sts:GetSessionToken" in message
    assert KEY_ID not in message
    assert SECRET_KEY not in message


def test_without_the_amazon_provider(monkeypatch):
    monkeypatch.setitem(sys.modules, "airflow.providers.amazon.aws.hooks.base_aws", None)
    with pytest.raises(MissingExtraError, match=r"airflow-provider-horovod\[amazon\]"):
        session_credentials("aws_x", 900)


def test_the_cluster_side_environment_of_a_session(aws_conn, monkeypatch):
    session = session_credentials(aws_conn, 900)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    assert session_env(session) == {
        "AWS_ACCESS_KEY_ID": session["aws_access_key_id"],
        "AWS_SECRET_ACCESS_KEY": session["aws_secret_access_key"],
        "AWS_SESSION_TOKEN": session["aws_session_token"],
        "AWS_ENDPOINT_URL": session["endpoint_url"],
        "AWS_DEFAULT_REGION": "eu-west-1",
    }
    # The cluster's own endpoint and region win over Airflow's.
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://cluster-side:9000")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    assert "AWS_ENDPOINT_URL" not in session_env(session)
    assert "AWS_DEFAULT_REGION" not in session_env(session)


def test_the_training_function_runs_with_the_session_in_its_environment(monkeypatch):
    import os

    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)

    def train(config):
        return os.environ.get("AWS_SESSION_TOKEN"), config

    wrapped = with_env(train, {"AWS_SESSION_TOKEN": "token"})
    assert wrapped({"a": 1}) == ("token", {"a": 1})
    assert wrapped.__name__ == "train"
    monkeypatch.delenv("AWS_SESSION_TOKEN")
