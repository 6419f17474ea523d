"""The MLflow checks: a tracking server's URI (never its credentials echoed), or a connection that
gives one, and the experiment name.

The helper ``fails`` is test_checks.py's."""

from __future__ import annotations

import pytest

from airflow_provider_horovod import mlflow_checks
from unit.test_checks import SECRET, fails


@pytest.mark.parametrize("uri", ["http://mlflow:5000", "https://mlflow.example.com/prefix", " databricks "])
def test_mlflow_tracking_uri(uri):
    assert mlflow_checks.check_mlflow_tracking_uri(uri) == uri.strip()
    assert mlflow_checks.check_mlflow_tracking_uri(None) is None
    assert mlflow_checks.check_mlflow_tracking_uri("") is None


@pytest.mark.parametrize("uri", ["mlflow:5000", "/var/mlruns", "file:///mlruns", "sqlite:///m.db", 5000, "http://"])
def test_mlflow_tracking_uri_that_is_not_a_server(uri):
    fails(mlflow_checks.check_mlflow_tracking_uri, uri, parameter="mlflow_tracking_uri", fix="tracking server")


def test_mlflow_tracking_uri_with_credentials_is_refused_without_showing_them():
    err = fails(
        mlflow_checks.check_mlflow_tracking_uri,
        f"https://user:{SECRET}@mlflow:5000",
        parameter="mlflow_tracking_uri",
        fix="mlflow_conn_id",
    )
    assert SECRET not in str(err)


def test_mlflow_uri_and_connection_exclude_each_other():
    mlflow_checks.check_mlflow("http://mlflow:5000", None)
    mlflow_checks.check_mlflow(None, "mlflow_default")
    fails(
        mlflow_checks.check_mlflow, "http://mlflow:5000", "mlflow_default", parameter="mlflow_conn_id", fix="not both"
    )
    fails(mlflow_checks.check_mlflow, None, " ", parameter="mlflow_conn_id")


def test_mlflow_experiment_name():
    assert mlflow_checks.check_mlflow_experiment_name(None, "my_dag") == "my_dag"
    assert mlflow_checks.check_mlflow_experiment_name(" retraining ", "my_dag") == "retraining"
    fails(mlflow_checks.check_mlflow_experiment_name, "", "my_dag", parameter="mlflow_experiment_name")


def conn(**fields):
    from types import SimpleNamespace

    return SimpleNamespace(**{"host": None, "port": None, "schema": None, "login": None, "password": None, **fields})


@pytest.mark.parametrize(
    ("fields", "uri", "auth"),
    [
        ({"host": "http://mlflow:5000"}, "http://mlflow:5000", {}),
        ({"host": "mlflow", "port": 5000}, "http://mlflow:5000", {}),
        (
            {"host": "mlflow.example.com", "schema": "https", "password": SECRET},
            "https://mlflow.example.com",
            {"token": SECRET},
        ),
        (
            {"host": "https://mlflow.example.com", "login": "bot", "password": SECRET},
            "https://mlflow.example.com",
            {"username": "bot", "password": SECRET},
        ),
        ({"host": "databricks", "password": SECRET}, "databricks", {"token": SECRET}),
    ],
)
def test_an_mlflow_connection_gives_the_uri_and_the_credentials(fields, uri, auth):
    assert mlflow_checks.mlflow_connection("mlflow_default", conn(**fields)) == (uri, auth)


def test_an_mlflow_connection_without_a_server_fails_naming_it():
    fails(mlflow_checks.mlflow_connection, "mlflow_default", conn(), parameter="mlflow_conn_id", fix="no host")
    err = fails(
        mlflow_checks.mlflow_connection,
        "mlflow_default",
        conn(host="sqlite:///m.db", password=SECRET),
        fix="tracking server",
    )
    assert "mlflow_default" in err.parameter
    assert SECRET not in str(err)
