"""What a job checks before it does anything: the cluster's Ray, and whether pickled code loads here."""

import sys

import pytest

from airflow_provider_horovod.runtime import preflight
from airflow_provider_horovod.spec import TaskSpec, TrainingSpec

HERE = f"{sys.version_info[0]}.{sys.version_info[1]}"


def test_this_clusters_ray_is_supported():
    assert preflight.ray_mismatch() is None


@pytest.mark.parametrize("version", ["2.59.0", "2.61.0", "3.0.0"])
def test_a_ray_outside_the_supported_range_fails_naming_both_and_the_fix(monkeypatch, version):
    import ray

    monkeypatch.setattr(ray, "__version__", version)
    message = preflight.ray_mismatch()
    assert message and f"Ray {version}" in message and ">=2.60,<2.61" in message
    assert "ray[default,train]>=2.60,<2.61" in message


def test_pickled_code_from_another_python_fails_naming_the_parameter_both_versions_and_the_fix():
    spec = TrainingSpec(submission_id="s-a1", train_fn={"pickle": "train_fn.pkl"}, storage_uri="/x",
                        datasets={"train": {"pickle": "dataset_train.pkl"}, "val": {"uri": "/v", "format": "csv"}},
                        python_version="3.9")
    message = preflight.python_mismatch(spec.python_version, spec.pickled_files())
    assert "train_fn and datasets['train']" in message
    assert "Airflow's Python 3.9" in message and f"runs Python {HERE}" in message
    assert 'import path "package.module:function"' in message


@pytest.mark.parametrize("spec", [
    TrainingSpec(submission_id="s", train_fn={"pickle": "f"}, storage_uri="/x", python_version=HERE),
    TrainingSpec(submission_id="s", train_fn={"import": "m:f"}, storage_uri="/x", python_version="3.9"),
    TaskSpec(submission_id="s", function={"import": "m:f"}, storage_uri="/x", python_version="3.9"),
], ids=["same-python", "import-path", "task-import-path"])
def test_the_same_python_or_import_paths_pass(spec):
    assert preflight.problems(spec) is None


def test_a_task_job_names_its_callable():
    spec = TaskSpec(submission_id="s", function={"pickle": "function.pkl"}, storage_uri="/x", python_version="3.9")
    assert "python_callable travelled pickled" in preflight.problems(spec)
