"""The operator's checks: every bad input fails before anything reaches Ray, naming the parameter,
the value and the fix. The cluster is never touched here: `_hook` raises if called."""

import json
import threading
from types import SimpleNamespace

import pytest

from airflow_provider_horovod.exceptions import InvalidParameterError
from airflow_provider_horovod.operators.horovod import HorovodTrainOperator
from airflow_provider_horovod.spec import TrainingSpec

GOOD_FN = "airflow_provider_horovod.examples.quickstart:train_func"


def context(run_id="scheduled__2026-11-01T00:00:00+00:00", map_index=-1):
    ti = SimpleNamespace(dag_id="d", task_id="t", run_id=run_id, map_index=map_index, try_number=1,
                         xcom_push=lambda **kw: None)
    return {"ti": ti}


def operator(**kwargs):
    kwargs.setdefault("train_fn", GOOD_FN)
    kwargs.setdefault("storage_path", "/tmp/ahp-unit")
    op = HorovodTrainOperator(task_id="t", **kwargs)

    def no_cluster():
        raise AssertionError("the cluster was contacted before the input was checked")

    op._hook = no_cluster
    return op


def local_train(config):
    return config


def test_good_input_builds_a_json_spec():
    spec, files, runtime_env = operator(train_loop_config={"lr": 0.1}, num_workers=3,
                                        datasets={"train": "s3://b/train/", "val": "/data/v.csv"}).build_spec(context())
    assert spec.train_fn == {"import": GOOD_FN} and files == {} and runtime_env == {}
    assert spec.datasets == {"train": {"uri": "s3://b/train/", "format": "parquet"},
                             "val": {"uri": "/data/v.csv", "format": "csv"}}
    assert TrainingSpec.from_json(spec.to_json()) == spec
    assert spec.storage_uri.startswith("/tmp/ahp-unit/d/t/scheduled__2026-11-01T00_00_00_00_00-")


def test_callable_train_fn_is_pickled_by_value():
    import cloudpickle

    spec, files, _ = operator(train_fn=local_train).build_spec(context())
    assert spec.train_fn == {"pickle": "train_fn.pkl"}
    assert cloudpickle.loads(files["train_fn.pkl"])({"x": 1}) == {"x": 1}


def test_runs_and_map_indexes_get_distinct_ids_and_storage():
    a, _, _ = operator().build_spec(context("r1"))
    b, _, _ = operator().build_spec(context("r2"))
    c, _, _ = operator().build_spec(context("r1", map_index=0))
    assert len({a.submission_id, b.submission_id, c.submission_id}) == 3
    assert len({a.storage_uri, b.storage_uri, c.storage_uri}) == 3
    again, _, _ = operator().build_spec(context("r1"))
    assert again.submission_id == a.submission_id  # known before submission, same on a retry


class Unpicklable:
    def __init__(self):
        self.lock = threading.Lock()

    def __call__(self, config):
        return self.lock


BAD_INPUTS = [
    ({"num_workers": 0}, "num_workers", "1 or more"),
    ({"num_workers": "2"}, "num_workers", "whole number"),
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


@pytest.mark.parametrize("kwargs, parameter, fix", BAD_INPUTS, ids=[f"{p}-{i}" for i, (_, p, _) in enumerate(BAD_INPUTS)])
def test_bad_input_fails_before_submission_with_a_clear_message(kwargs, parameter, fix):
    op = operator(**kwargs)
    with pytest.raises(InvalidParameterError) as err:
        op.execute(context())
    assert err.value.parameter == parameter
    message = str(err.value)
    assert f"Invalid {parameter}=" in message and fix in message


def test_secret_values_are_not_echoed_in_the_error():
    op = operator(runtime_env={"env_vars": {"AWS_SECRET_ACCESS_KEY": "s3cr3t-value"}})
    with pytest.raises(InvalidParameterError) as err:
        op.execute(context())
    assert "s3cr3t-value" not in str(err.value)


def test_constructor_does_no_work():
    # A DAG file is parsed again and again: bad values only fail when the task runs.
    HorovodTrainOperator(task_id="t", train_fn="x", num_workers=-1, storage_path="ftp://x")


def test_templated_fields_are_declared():
    assert set(HorovodTrainOperator.template_fields) >= {"train_loop_config", "datasets", "storage_path", "runtime_env"}
    json.dumps(list(HorovodTrainOperator.template_fields))
