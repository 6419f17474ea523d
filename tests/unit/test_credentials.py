"""Forwarding AWS session credentials: the operator's checks, and what the cluster side makes of them."""

import pytest

from airflow_provider_horovod.exceptions import InvalidParameterError
from airflow_provider_horovod.operators.horovod import check_forwarding
from airflow_provider_horovod.runtime.aws import session_env, with_env


@pytest.mark.parametrize("forward, conn, ttl, parameter, fix", [
    ("yes", "aws", 3600, "forward_aws_credentials", "True or False"),
    (True, None, 3600, "forward_aws_credentials", "set aws_conn_id"),
    (True, "aws", 60, "aws_credentials_ttl_seconds", "900 to 129600"),
    (True, "aws", 2.5e5, "aws_credentials_ttl_seconds", "900 to 129600"),
    (True, "aws", True, "aws_credentials_ttl_seconds", "whole seconds"),
])
def test_bad_forwarding_settings_name_the_parameter_and_the_fix(forward, conn, ttl, parameter, fix):
    with pytest.raises(InvalidParameterError) as err:
        check_forwarding(forward, conn, ttl)
    assert err.value.parameter == parameter and fix in str(err.value)


def test_forwarding_off_needs_nothing():
    check_forwarding(False, None, 0)


SESSION = {"aws_access_key_id": "ASIAKEY", "aws_secret_access_key": "secret", "aws_session_token": "token",
           "expiration": "2026-11-22T12:00:00+00:00", "region_name": "eu-west-1",
           "endpoint_url": "http://airflow-side:9000"}


def test_the_clusters_own_endpoint_and_region_win(monkeypatch):
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    env = session_env(SESSION)
    assert env == {"AWS_ACCESS_KEY_ID": "ASIAKEY", "AWS_SECRET_ACCESS_KEY": "secret", "AWS_SESSION_TOKEN": "token",
                   "AWS_ENDPOINT_URL": "http://airflow-side:9000", "AWS_DEFAULT_REGION": "eu-west-1"}
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://cluster-side:9000")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    assert "AWS_ENDPOINT_URL" not in session_env(SESSION) and "AWS_DEFAULT_REGION" not in session_env(SESSION)


def test_the_training_function_runs_with_the_session_in_its_environment(monkeypatch):
    import os

    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)

    def train(config):
        return os.environ.get("AWS_SESSION_TOKEN"), config

    wrapped = with_env(train, {"AWS_SESSION_TOKEN": "token"})
    assert wrapped({"a": 1}) == ("token", {"a": 1}) and wrapped.__name__ == "train"
    monkeypatch.delenv("AWS_SESSION_TOKEN")
