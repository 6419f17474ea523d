"""Bad input against the real cluster: every bad operator, sensor, trigger, connection and DAG
parameter fails with an error naming the parameter, the value and the fix, and the cluster's job
list is the same afterwards (nothing was submitted)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from airflow_provider_horovod.exceptions import HorovodProviderError, InvalidParameterError
from airflow_provider_horovod.operators.horovod import HorovodTrainOperator
from airflow_provider_horovod.sensors.ray import RayJobSensor
from airflow_provider_horovod.triggers.ray import RayJobTrigger

from ..unit.operators.test_horovod import BAD_INPUTS, GOOD_FN
from .test_operator import FakeTI

pytestmark = pytest.mark.integration

DAGS = Path(__file__).resolve().parents[2] / "dags"

OPERATOR_CASES = BAD_INPUTS + [
    ({"forward_aws_credentials": True}, "forward_aws_credentials", "set aws_conn_id"),
    ({"forward_aws_credentials": "yes"}, "forward_aws_credentials", "True or False"),
]


@pytest.fixture
def job_list_unchanged(ray_hook):
    """Yields; then checks that the cluster's jobs are exactly what they were."""
    before = sorted(j["submission_id"] or j["job_id"] for j in ray_hook.list_jobs())
    yield
    assert sorted(j["submission_id"] or j["job_id"] for j in ray_hook.list_jobs()) == before


@pytest.mark.parametrize("kwargs, parameter, fix", OPERATOR_CASES,
                         ids=[f"{p}-{i}" for i, (_, p, _) in enumerate(OPERATOR_CASES)])
def test_bad_operator_input(ray_cluster, job_list_unchanged, tmp_path, kwargs, parameter, fix):
    kwargs = {"train_fn": GOOD_FN, "storage_path": str(tmp_path), **kwargs}
    op = HorovodTrainOperator(task_id="train", **kwargs)
    with pytest.raises(InvalidParameterError) as err:
        op.execute({"ti": FakeTI(f"bad-{uuid.uuid4().hex[:6]}")})
    assert err.value.parameter == parameter
    assert f"Invalid {parameter}=" in str(err.value) and fix in str(err.value)


@pytest.mark.parametrize("extra, names", [
    ({"verify": 5}, "'verify'"),
    ({"verfy": False}, "unknown extra ['verfy']"),
    ({"headers": "{not json"}, "'headers' is not valid JSON"),
    ({"headers": {"X-Team": 1}}, "'headers' must map strings to strings"),
    ({"runtime_env": "[1, 2]"}, "'runtime_env' must be a JSON object"),
], ids=["verify", "unknown", "headers-json", "headers-types", "runtime_env"])
def test_bad_connection_extras(ray_cluster, job_list_unchanged, tmp_path, monkeypatch, extra, names):
    port = int(ray_cluster.dashboard_url.rsplit(":", 1)[1])
    monkeypatch.setenv("AIRFLOW_CONN_RAY_BAD", json.dumps(
        {"conn_type": "ray", "host": "127.0.0.1", "port": port, "password": ray_cluster.token, "extra": extra}))
    op = HorovodTrainOperator(task_id="train", train_fn=GOOD_FN, storage_path=str(tmp_path), ray_conn_id="ray_bad")
    with pytest.raises(HorovodProviderError) as err:
        op.execute({"ti": FakeTI(f"bad-{uuid.uuid4().hex[:6]}")})
    message = str(err.value)
    assert "'ray_bad'" in message and names in message
    assert ray_cluster.token not in message


def test_a_connection_that_does_not_exist(ray_cluster, job_list_unchanged, tmp_path):
    op = HorovodTrainOperator(task_id="train", train_fn=GOOD_FN, storage_path=str(tmp_path), ray_conn_id="ray_nope")
    with pytest.raises(HorovodProviderError, match="'ray_nope'"):
        op.execute({"ti": FakeTI(f"bad-{uuid.uuid4().hex[:6]}")})


@pytest.mark.parametrize("submission_id", ["", "   ", None, 42])
def test_bad_sensor_submission_id(ray_cluster, job_list_unchanged, submission_id):
    sensor = RayJobSensor(task_id="wait", submission_id=submission_id, poke_interval=1, deferrable=False)
    with pytest.raises(InvalidParameterError) as err:
        sensor.execute({"ti": FakeTI("bad-sensor")})
    assert err.value.parameter == "submission_id" and "xcom_pull" in str(err.value)


def test_sensor_of_a_job_that_does_not_exist(ray_cluster, job_list_unchanged):
    sensor = RayJobSensor(task_id="wait", submission_id="ahp-no-such-job", poke_interval=1, deferrable=False)
    with pytest.raises(HorovodProviderError, match="'ahp-no-such-job' does not exist.*check submission_id"):
        sensor.execute({"ti": FakeTI("bad-sensor")})


@pytest.mark.parametrize("kwargs, parameter", [
    ({"submission_id": ""}, "submission_id"),
    ({"submission_id": "x", "poll_interval_seconds": 0}, "poll_interval_seconds"),
    ({"submission_id": "x", "poll_interval_seconds": "fast"}, "poll_interval_seconds"),
    ({"submission_id": "x", "pending_timeout_seconds": -1}, "pending_timeout_seconds"),
])
def test_bad_trigger_arguments(ray_cluster, job_list_unchanged, kwargs, parameter):
    with pytest.raises(InvalidParameterError) as err:
        RayJobTrigger(**kwargs)
    assert err.value.parameter == parameter and "give" in str(err.value)


@pytest.mark.parametrize("dag_id, conf, param", [
    ("horovod_retraining", {"evaluate_on_ray": "yes"}, "evaluate_on_ray"),
    ("horovod_quickstart", {"storage_path": 5}, "storage_path"),
    ("horovod_sensor_example", {"storage_path": ["s3://b"]}, "storage_path"),
])
def test_bad_dag_params_are_refused_before_the_run(job_list_unchanged, dag_id, conf, param):
    from airflow.sdk.definitions.param import ParamsDict
    from airflow.sdk.exceptions import ParamValidationError

    from airflow.dag_processing.dagbag import DagBag

    dag = DagBag(dag_folder=str(DAGS / f"{dag_id}.py")).dags[dag_id]
    params = ParamsDict(dag.params)
    with pytest.raises(ParamValidationError, match=param):
        params.update(conf)
        params.validate()
