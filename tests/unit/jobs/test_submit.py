"""One Ray job per task run: which attempt a try works with, against the dashboard's job table
(``unit.fakes.FakeRay``, handed in as the hook) and real storage (a local folder); the checks that
need the cluster run only when something is to be submitted, and refuse before anything goes."""

import dataclasses
import os

import pytest

from airflow_provider_horovod.contract import (
    META_MARK_TOKEN,
    SPEC_FILE,
    TaskRun,
    consumed_uri,
    result_uri,
    submitted_uri,
)
from airflow_provider_horovod.documents import TrainingSpec
from airflow_provider_horovod.exceptions import InvalidParameterError, RayJobPendingTimeoutError, TaskKilledError
from airflow_provider_horovod.jobs.submit import Attempt, find_attempt, start, submit
from airflow_provider_horovod.operators.horovod import HorovodTrainOperator
from airflow_provider_horovod.plan import training_plan
from airflow_provider_horovod.storage import Storage
from unit.fakes import FakeRay

RUN = TaskRun("dag", "train", "manual__1")
SID = RUN.submission_id


def make_plan(root, **kwargs):
    op = HorovodTrainOperator(
        task_id="train",
        **{
            "train_fn": "json:dumps",
            "num_workers": 2,
            "runtime_env": {"py_modules": ["gcs://_ray_pkg_user.zip"]},
            "aws_credentials_ttl_seconds": 3600,
            "storage_path": str(root),
            "ray_conn_id": "ray_remote",
            **kwargs,
        },
    )
    return training_plan(RUN, op.parameters.checked(op), train_call=None, pending_timeout_s=600.0)


@pytest.fixture
def plan(tmp_path):
    return make_plan(tmp_path)


def spec_sent(call) -> TrainingSpec:
    return TrainingSpec.from_json(call["payload"][SPEC_FILE].decode())


def test_no_job_yet_submits_attempt_one(plan):
    ray = FakeRay()
    job = start(ray, plan, Storage())
    assert job == {
        "submission_id": SID(1),
        "dashboard_url": ray.get_job_url(SID(1)),
        "storage_uri": plan.storage_uri,
        "attempt": 1,
        "kind": "train",
        "checkpoint_score_attribute": None,
        "aws_conn_id": None,
        "job_tags": {},
    }
    (submitted,) = ray.submitted
    assert submitted["submission_id"] == SID(1)
    assert spec_sent(submitted).resume_from == []


def test_each_attempt_gets_a_token_of_its_own_for_its_runtimes_marks(plan):
    ray = FakeRay()
    start(ray, plan, Storage())
    ray.set_job(SID(1), {"status": "FAILED"})
    start(ray, plan, Storage())
    tokens = [spec_sent(call).mark_token for call in ray.submitted]
    assert [call["metadata"][META_MARK_TOKEN] for call in ray.submitted] == tokens
    assert len(set(tokens)) == 2
    assert all(len(token) == 16 for token in tokens)


@pytest.mark.parametrize("status", ["PENDING", "RUNNING"])
def test_a_running_job_is_reattached_without_asking_the_cluster_anything_else(plan, status):
    ray = FakeRay({SID(1): {"status": status}}, cluster={})  # no resources: a submission would be refused
    assert start(ray, plan, Storage())["attempt"] == 1
    assert ray.submitted == []
    assert "get_cluster_resources" not in ray.calls


def test_a_succeeded_job_not_consumed_is_reused(plan):
    ray = FakeRay({SID(1): {"status": "SUCCEEDED"}})
    assert start(ray, plan, Storage())["submission_id"] == SID(1)
    assert ray.submitted == []


def test_a_succeeded_job_consumed_gives_the_next_attempt_from_scratch(plan):
    Storage().write_json(consumed_uri(plan.storage_uri, 1), {"submission_id": SID(1)})
    ray = FakeRay({SID(1): {"status": "SUCCEEDED"}})
    assert find_attempt(ray, plan, Storage()) == Attempt(2, SID(2), resume=False)
    assert start(ray, plan, Storage())["attempt"] == 2
    assert spec_sent(ray.submitted[0]).resume_from == []


@pytest.mark.parametrize("status", ["FAILED", "STOPPED"])
def test_a_failed_or_stopped_job_gives_the_next_attempt_resuming(plan, status):
    ray = FakeRay({SID(1): {"status": status}})
    assert find_attempt(ray, plan, Storage()) == Attempt(2, SID(2), resume=True)
    start(ray, plan, Storage())
    (submitted,) = ray.submitted
    assert submitted["submission_id"] == SID(2)
    assert spec_sent(submitted).resume_from == [f"{plan.storage_uri}/attempt-1"]


def test_the_latest_attempt_decides(plan):
    ray = FakeRay({SID(1): {"status": "FAILED"}, SID(2): {"status": "FAILED"}, SID(3): {"status": "RUNNING"}})
    assert find_attempt(ray, plan, Storage()).submission_id == SID(3)
    ray = FakeRay({SID(1): {"status": "SUCCEEDED"}, SID(2): {"status": "FAILED"}})
    assert find_attempt(ray, plan, Storage()) == Attempt(3, SID(3), resume=True)


def test_each_submission_is_noted_in_storage_before_it_is_sent(plan):
    ray = FakeRay()
    noted = []
    ray.on_submit = lambda fake, call: noted.append(Storage().read_json(submitted_uri(plan.storage_uri, 1)))
    start(ray, plan, Storage())
    assert noted == [{"submission_id": SID(1), "submitted_at": noted[0]["submitted_at"]}]


def test_a_job_that_vanished_with_its_head_is_never_submitted_again_and_the_next_attempt_resumes(plan):
    """Attempt 1 was submitted (noted), then the Ray head was replaced: the new head does not know it.
    One attempt is one job, so the retry submits attempt 2, resuming, and keeps attempt 1's record."""
    Storage().write_json(submitted_uri(plan.storage_uri, 1), {"submission_id": SID(1)})
    ray = FakeRay()  # the new head: no job of this task run
    assert find_attempt(ray, plan, Storage()) == Attempt(2, SID(2), resume=True)
    start(ray, plan, Storage())
    (submitted,) = ray.submitted
    assert submitted["submission_id"] == SID(2)
    assert spec_sent(submitted).resume_from == [f"{plan.storage_uri}/attempt-1"]
    record = Storage().read_json(result_uri(plan.storage_uri, 1))
    assert (record["submission_id"], record["attempt"], record["failure"]["failure_class"]) == (
        SID(1),
        1,
        "infrastructure",
    )
    assert "vanished" in record["failure"]["summary"]


def test_a_vanished_attempts_record_written_by_its_driver_is_kept(plan):
    Storage().write_json(submitted_uri(plan.storage_uri, 1), {"submission_id": SID(1)})
    Storage().write_json(result_uri(plan.storage_uri, 1), {"submission_id": SID(1), "failure": {"summary": "own"}})
    find_attempt(FakeRay(), plan, Storage())
    assert Storage().read_json(result_uri(plan.storage_uri, 1))["failure"] == {"summary": "own"}


def test_an_attempt_the_new_head_runs_after_a_vanished_one_is_reattached(plan):
    for n in (1, 2):
        Storage().write_json(submitted_uri(plan.storage_uri, n), {"submission_id": SID(n)})
    ray = FakeRay({SID(2): {"status": "RUNNING"}})  # attempt 1 vanished, attempt 2 runs on the new head
    assert find_attempt(ray, plan, Storage()).submission_id == SID(2)
    assert ray.submitted == []


def test_a_task_killed_before_its_submission_submits_nothing(plan):
    ray = FakeRay()
    with pytest.raises(TaskKilledError, match="nothing was submitted"):
        start(ray, plan, Storage(), stopped=lambda: True)
    assert ray.submitted == []
    assert not Storage().exists(submitted_uri(plan.storage_uri, 1))
    # never submitted: the retry submits attempt 1
    assert find_attempt(ray, plan, Storage()) == Attempt(1, SID(1))


def test_resources_no_node_has_are_refused_before_submitting(tmp_path):
    ray = FakeRay(cluster={"CPU": 8.0, "memory": 1e9})
    with pytest.raises(RayJobPendingTimeoutError) as err:
        start(ray, make_plan(tmp_path, use_gpu=True), Storage())
    assert 'ask for {"GPU": 2.0}' in str(err.value)
    assert "none of ['GPU']" in str(err.value)
    assert "check_cluster_resources=False" in str(err.value)
    assert ray.submitted == []
    start(ray, make_plan(tmp_path, use_gpu=True, check_cluster_resources=False), Storage())  # an autoscaling cluster
    assert len(ray.submitted) == 1


@pytest.mark.parametrize("version, refused", [("2.54.1", True), ("2.55.1", False)])
def test_elastic_workers_on_a_ray_without_elastic_scaling_are_refused_before_submitting(tmp_path, version, refused):
    ray = FakeRay(version=version)
    plan = make_plan(tmp_path, num_workers=[2, 4], trainer_api="auto")
    if not refused:
        start(ray, plan, Storage())
        assert len(ray.submitted) == 1
        return
    with pytest.raises(InvalidParameterError) as err:
        start(ray, plan, Storage())
    assert err.value.parameter == "num_workers"
    assert "the cluster's Ray 2.54.1 lacks" in str(err.value)
    assert "first comes with Ray 2.55" in str(err.value)
    assert ray.submitted == []
    start(ray, make_plan(tmp_path, num_workers=2, trainer_api="auto"), Storage())  # a number of workers runs
    assert len(ray.submitted) == 1


@pytest.mark.parametrize("storage_path", ["{tmp}/checkpoints", None])
def test_a_local_path_needs_a_shared_filesystem_and_the_error_names_the_storage_root(
    tmp_path, monkeypatch, storage_path
):
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "airflow-home"))
    root = storage_path.format(tmp=tmp_path) if storage_path else str(tmp_path / "airflow-home" / "horovod-storage")
    plan = make_plan(tmp_path, storage_path=storage_path.format(tmp=tmp_path) if storage_path else None)
    with pytest.raises(InvalidParameterError) as err:
        start(FakeRay(shared_storage=False), plan, Storage())
    # Before the fix an unmapped task's error named the folder above the root (AIRFLOW_HOME's parent).
    assert err.value.parameter == "storage_path"
    assert err.value.value == root
    assert "connection 'ray_remote'" in str(err.value)
    assert '{"shared_storage": true}' in str(err.value)
    assert start(FakeRay(shared_storage=True), plan, Storage())["attempt"] == 1


def test_s3_storage_needs_no_shared_filesystem():
    plan = make_plan("/unused", storage_path="s3://bucket/prefix")
    ray = FakeRay(shared_storage=False)
    storage = Storage()
    # S3 itself is tested against moto in test_storage.py
    storage.check_bucket = lambda uri: None
    storage.exists = lambda uri: False
    storage.write_json = lambda uri, data: None
    assert start(ray, plan, storage)["storage_uri"].startswith("s3://bucket/prefix/dag/train/")


def test_a_refusal_submits_nothing(plan):
    ray = FakeRay()
    storage = Storage()
    storage.check_bucket = lambda uri: (_ for _ in ()).throw(RuntimeError("bucket gone"))
    with pytest.raises(RuntimeError, match="bucket gone"):
        start(ray, plan, storage)
    assert ray.submitted == []


def test_submit_uploads_the_payload_package_with_the_job(plan):
    ray = FakeRay()
    made = plan.request(1)
    assert submit(ray, made) == SID(1)
    (call,) = ray.submitted
    modules = call["runtime_env"]["py_modules"]
    assert modules[:-1] == made.runtime_env["py_modules"]
    assert os.path.basename(modules[-1]) == made.payload_module
    assert call["payload"] == {"__init__.py": call["payload"]["__init__.py"], **made.files}
    assert (call["entrypoint"], call["metadata"]) == (made.entrypoint, made.metadata)
    assert not os.path.exists(modules[-1])  # a temporary folder, gone after the upload
    assert made.runtime_env["py_modules"][-1] != modules[-1]  # the request itself is unchanged


def test_submit_passes_what_the_driver_reserves(plan):
    ray = FakeRay()
    made = dataclasses.replace(plan.request(1), driver_resources={"num_cpus": 2, "num_gpus": 1, "resources": {"a": 1}})
    submit(ray, made)
    (call,) = ray.submitted
    assert (
        call["entrypoint_num_cpus"],
        call["entrypoint_num_gpus"],
        call["entrypoint_memory"],
        call["entrypoint_resources"],
    ) == (2, 1, None, {"a": 1})


@pytest.mark.parametrize(
    ("executor", "refused"),
    [
        ("CeleryExecutor", True),
        ("LocalExecutor,airflow.providers.celery.executors.celery_executor.CeleryExecutor", True),
        ("KubernetesExecutor", True),
        ("LocalExecutor", False),
    ],
)
def test_the_embedded_cluster_under_an_executor_of_many_machines_is_refused_before_submission(
    tmp_path, monkeypatch, executor, refused
):
    # Its jobs and its local records are on the submitting worker's machine: a triggerer or a next try on
    # another machine would reach another embedded cluster and find none of them.
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", executor)
    ray = FakeRay(shared_storage=True)
    ray.endpoint.embedded = True
    plan = make_plan(tmp_path)
    if not refused:
        assert start(ray, plan, Storage())["attempt"] == 1
        return
    with pytest.raises(InvalidParameterError) as err:
        start(ray, plan, Storage())
    assert err.value.parameter == "ray_conn_id"
    assert "runs a task's next try, and the triggerer its wait, on other machines" in str(err.value)
    assert str(tmp_path) in str(err.value)
    assert ray.submitted == []
