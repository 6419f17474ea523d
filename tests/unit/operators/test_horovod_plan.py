"""HorovodTrainOperator's plan, pure: the training spec, the files and the Ray request a set of
parameters becomes, before anything is asked of the cluster."""

from __future__ import annotations

import json
import sys

import cloudpickle

from airflow_provider_horovod.contract import SPEC_FILE, attempt_uri
from airflow_provider_horovod.documents import TrainingSpec
from airflow_provider_horovod.operators.horovod import HorovodTrainOperator
from unit.operators.training_cluster import TASK_RUN, operator


def local_train(config):
    return config


def make_dataset():
    return None


def planned(op: HorovodTrainOperator):
    return op.checked_plan(TASK_RUN, op.wait_policy())


def test_plan_builds_the_spec():
    training = planned(
        operator(
            train_fn=local_train,
            train_loop_config={"lr": 0.1},
            num_workers=3,
            use_gpu=True,
            resources_per_worker={"CPU": 2},
            pending_timeout_seconds=30,
            datasets={
                "train": "s3://b/train/",
                "val": "/data/v.csv",
                "test": "file:///t.json",
                "built": make_dataset,
                "imported": "airflow_provider_horovod.examples.quickstart:make_dataset",
            },
        )
    )
    spec = training.spec
    assert spec.python_version == f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert spec.submission_id == TASK_RUN.submission_id(1)
    assert spec.attempt == 1
    assert spec.storage_uri == TASK_RUN.storage_uri("/tmp/ahp-unit")
    assert spec.train_fn == {"pickle": "train_fn.pkl", "source": __file__}
    assert spec.train_loop_config == {"lr": 0.1}
    assert spec.datasets == {
        "train": {"uri": "s3://b/train/", "format": "parquet"},
        "val": {"uri": "/data/v.csv", "format": "csv"},
        "test": {"uri": "file:///t.json", "format": "json"},
        "built": {"pickle": "dataset_built.pkl", "source": __file__},
        "imported": {"import": "airflow_provider_horovod.examples.quickstart:make_dataset"},
    }
    assert set(training.files) == {"train_fn.pkl", "dataset_built.pkl"}
    assert (spec.num_workers, spec.use_gpu, spec.resources_per_worker) == (3, True, {"CPU": 2.0})
    assert spec.pending_timeout_s == 30
    assert training.runtime_env == {}
    assert TrainingSpec.from_json(spec.to_json()) == spec


def test_an_elastic_range_plans_with_its_minimum():
    training = planned(
        operator(num_workers=(2, 4), resources_per_worker={"CPU": 2}, elastic_resize_monitor_interval_s=5)
    )
    spec = training.spec
    assert (spec.num_workers, spec.min_workers, spec.max_workers, spec.elastic) == ([2, 4], 2, 4, True)
    assert spec.elastic_resize_monitor_interval_s == 5
    # The resource check and the unschedulable message count what the run needs to start.
    assert training.resources == {"CPU": 4.0}
    assert training.request(1).metadata["ahp_num_workers"] == "2-4"
    assert TrainingSpec.from_json(spec.to_json()) == spec


def test_a_templated_range_renders_to_the_same_plan():
    op = operator(num_workers="{{ params.workers }}")
    op.render_template_fields({"params": {"workers": [2, 4]}})
    assert planned(op).spec.num_workers == [2, 4]


def test_a_callable_travels_by_value(monkeypatch):
    training = planned(operator(train_fn=local_train))
    monkeypatch.setitem(sys.modules, __name__, None)
    assert cloudpickle.loads(training.files["train_fn.pkl"])({"x": 1}) == {"x": 1}


def test_an_import_path_is_not_looked_up_when_the_runtime_env_brings_code(tmp_path):
    op = operator(train_fn="code_on_the_cluster:train", runtime_env={"py_modules": [str(tmp_path)]})
    training = planned(op)
    assert training.spec.train_fn == {"import": "code_on_the_cluster:train"}
    assert training.runtime_env == {"py_modules": [str(tmp_path)]}


def test_storage_defaults_to_airflow_home_and_is_normalised(monkeypatch, tmp_path):
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    assert planned(operator(storage_path=None)).spec.storage_uri.startswith(
        str(tmp_path / "horovod-storage") + "/dag/train/"
    )
    assert planned(operator(storage_path="file:///data/x/")).spec.storage_uri.startswith("/data/x/dag/")


def test_request_of_a_later_attempt_resumes_from_the_earlier_ones():
    training = planned(operator())
    first = training.request(1, resume=False)
    second = training.request(2, resume=True)
    third = training.request(3, resume=True)
    fresh = training.request(3, resume=False)

    def spec_of(made):
        return TrainingSpec.from_json(made.files[SPEC_FILE].decode())

    root = training.spec.storage_uri
    assert spec_of(first).resume_from == []
    assert spec_of(fresh).resume_from == []
    assert spec_of(second).resume_from == [attempt_uri(root, 1)]
    assert spec_of(third).resume_from == [attempt_uri(root, 2), attempt_uri(root, 1)]
    assert (second.submission_id, spec_of(second).attempt) == (TASK_RUN.submission_id(2), 2)
    assert spec_of(second).run_uri == f"{root}/attempt-2"


def test_extra_files_travel_in_the_payload_only():
    made = planned(operator()).request(1, extra_files={"aws_session.json": b'{"k": "v"}'})
    assert made.files["aws_session.json"] == b'{"k": "v"}'
    assert "aws_session" not in json.dumps(made.runtime_env) + json.dumps(made.metadata)
