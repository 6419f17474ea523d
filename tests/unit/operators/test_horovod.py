"""HorovodTrainOperator's own parameters: every bad input fails in execute() before the cluster is
asked anything, naming the parameter, the value and the fix; its template fields render. Its plan is
tested in test_horovod_plan.py, a whole training task run in test_horovod_run.py, the flow it shares
with every operator in test_base.py.

``BAD_INPUTS`` is also used by the integration tests (against a real cluster).
"""

from __future__ import annotations

import threading

import pytest

from airflow_provider_horovod.exceptions import InvalidParameterError
from airflow_provider_horovod.operators.base import BaseRayJobOperator
from airflow_provider_horovod.operators.horovod import HorovodTrainOperator
from unit.fakes import FakeRay, context
from unit.operators.training_cluster import GOOD_FN, operator


class Unpicklable:
    def __init__(self):
        self.lock = threading.Lock()

    def __call__(self, config):
        return self.lock


BAD_INPUTS = [
    ({"num_workers": 0}, "num_workers", "1 or more"),
    ({"num_workers": "two"}, "num_workers", "whole number"),
    ({"num_workers": (4, 2)}, "num_workers", "at most max 2"),
    ({"num_workers": [0, 2]}, "num_workers", "at least 1"),
    ({"num_workers": (2, 4), "trainer_api": "legacy"}, "num_workers", "no elastic training"),
    (
        {"num_workers": (2, 4), "elastic_resize_monitor_interval_s": 0},
        "elastic_resize_monitor_interval_s",
        "greater than 0",
    ),
    ({"num_workers": True}, "num_workers", "whole number"),
    ({"train_fn": "no_such_module_xyz:train"}, "train_fn", "not importable"),
    ({"train_fn": "not a path"}, "train_fn", "package.module:function"),
    ({"train_fn": 42}, "train_fn", "give a function"),
    ({"train_fn": Unpicklable()}, "train_fn", "cannot be pickled"),
    ({"train_fn": lambda a, b: None}, "train_fn", "no argument or one"),
    ({"datasets": {"train": 5}}, "datasets['train']", "URI of parquet"),
    ({"datasets": {"train": "ftp://host/x.parquet"}}, "datasets['train']", "s3://"),
    ({"datasets": ["s3://b/x"]}, "datasets", "give a dict"),
    ({"datasets": {"bad name": "s3://b/x"}}, "datasets", "simple name"),
    ({"storage_path": "gs://bucket/x"}, "storage_path", "not supported"),
    ({"storage_path": "s3:///nobucket"}, "storage_path", "name the bucket"),
    ({"storage_path": "relative/dir"}, "storage_path", "absolute"),
    ({"train_loop_config": {"model": object()}}, "train_loop_config", "JSON-serialisable"),
    ({"train_loop_config": [1, 2]}, "train_loop_config", "give a dict"),
    ({"resources_per_worker": {"CPU": -1}}, "resources_per_worker", "negative"),
    ({"resources_per_worker": {"CPU": "one"}}, "resources_per_worker", "not a number"),
    ({"resources_per_worker": {"gpu": 1}, "use_gpu": True}, "resources_per_worker", "'GPU'"),
    ({"resources_per_worker": {"GPU": 1}}, "resources_per_worker", "use_gpu=True"),
    ({"checkpoint_score_order": "best"}, "checkpoint_score_order", "'max'"),
    ({"checkpoint_num_to_keep": 0}, "checkpoint_num_to_keep", "greater than 0"),
    ({"max_failures": -3}, "max_failures", "-1"),
    ({"horovod_env": {"OMP_NUM_THREADS": "1"}}, "horovod_env", "HOROVOD_"),
    ({"horovod_timeout_s": 0}, "horovod_timeout_s", "greater than 0"),
    ({"horovod_nics": [""]}, "horovod_nics", "interface names"),
    ({"runtime_env": {"env_vars": {"AWS_SECRET_ACCESS_KEY": "abc"}}}, "runtime_env", "looks like a secret"),
    ({"runtime_env": "pip"}, "runtime_env", "give a dict"),
    ({"trainer_api": "v3"}, "trainer_api", "'legacy'"),
    ({"poll_interval_seconds": 0}, "poll_interval_seconds", "greater than 0"),
    ({"pending_timeout_seconds": -5}, "pending_timeout_seconds", "greater than 0"),
]

# Cases that need no cluster either, beyond the table the integration tests share.
MORE_BAD_INPUTS = [
    ({"use_gpu": "yes"}, "use_gpu", "True or False"),
    ({"check_cluster_resources": "no"}, "check_cluster_resources", "True or False"),
    ({"forward_aws_credentials": True}, "forward_aws_credentials", "set aws_conn_id"),
    ({"datasets": {"train": "no_such_module_xyz:make"}}, "datasets['train']", "not importable"),
    ({"train_fn": f"{GOOD_FN[: -len('train_func')]}trian_func"}, "train_fn", "(it has train_func"),
    ({"mlflow_tracking_uri": "mlflow:5000"}, "mlflow_tracking_uri", "http://mlflow:5000"),
    ({"mlflow_tracking_uri": "http://mlflow:5000", "mlflow_conn_id": "mlflow_default"}, "mlflow_conn_id", "not both"),
    (
        {"mlflow_tracking_uri": "http://mlflow:5000", "mlflow_experiment_name": " "},
        "mlflow_experiment_name",
        "MLflow experiment",
    ),
]


def given(kwargs: dict, parameter: str):
    """The value as the error shows it: env var values hidden."""
    if parameter.startswith("datasets["):
        return kwargs["datasets"][parameter[len("datasets['") : -2]]
    value = kwargs.get(parameter)
    if parameter == "runtime_env" and isinstance(value, dict) and isinstance(value.get("env_vars"), dict):
        return {**value, "env_vars": {k: "***" for k in value["env_vars"]}}
    return value


@pytest.mark.parametrize(
    "kwargs, parameter, fix",
    BAD_INPUTS + MORE_BAD_INPUTS,
    ids=[f"{p}-{i}" for i, (_, p, _) in enumerate(BAD_INPUTS + MORE_BAD_INPUTS)],
)
def test_bad_input_fails_in_execute_before_any_cluster_call(serve, kwargs, parameter, fix):
    dashboard = serve(FakeRay())
    op = operator(**kwargs)
    ctx = context()
    with pytest.raises(InvalidParameterError) as err:
        op.execute(ctx)
    assert err.value.parameter == parameter
    message = str(err.value)
    assert message.startswith(f"Invalid {parameter}={given(kwargs, parameter)!r}: ")
    assert fix in message
    assert op.submission_id is None
    assert ctx["ti"].xcoms == {}
    assert dashboard.requests == []


def test_secret_values_are_not_echoed_in_the_error(serve):
    dashboard = serve(FakeRay())
    op = operator(runtime_env={"env_vars": {"AWS_SECRET_ACCESS_KEY": "s3cr3t-value"}})
    with pytest.raises(InvalidParameterError) as err:
        op.execute(context())
    assert "s3cr3t-value" not in str(err.value)
    assert dashboard.requests == []


def test_its_own_template_fields_render():
    # Its own templated parameters beside those it shares with every operator (test_base.py).
    assert set(HorovodTrainOperator.template_fields) == set(BaseRayJobOperator.template_fields) | {
        "train_script",
        "script_args",
        "train_loop_config",
        "datasets",
        "num_workers",
        "horovod_env",
        "mlflow_tracking_uri",
        "mlflow_conn_id",
        "mlflow_experiment_name",
    }
    assert HorovodTrainOperator.template_fields_renderers == {
        "train_loop_config": "json",
        "horovod_env": "json",
        "runtime_env": "json",
    }
    op = operator(
        train_loop_config={"lr": "{{ params.lr }}"},
        datasets={"train": "s3://b/{{ params.env }}/train/"},
        horovod_env={"HOROVOD_LOG_LEVEL": "{{ params.level }}"},
        mlflow_experiment_name="ranking-{{ params.env }}",
    )
    op.render_template_fields({"params": {"env": "prod", "lr": 0.1, "level": "debug"}})
    assert op.train_loop_config == {"lr": "0.1"}
    assert op.datasets == {"train": "s3://b/prod/train/"}
    assert op.horovod_env == {"HOROVOD_LOG_LEVEL": "debug"}
    assert op.mlflow_experiment_name == "ranking-prod"
