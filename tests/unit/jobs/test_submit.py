"""One Ray job per task run: which attempt a try works with, against the dashboard's job table."""

import os

import pytest

from airflow_provider_horovod.ids import TaskRun
from airflow_provider_horovod.jobs.request import training_request
from airflow_provider_horovod.jobs.submit import Attempt, consumed_in, find_attempt, find_or_submit, submit
from airflow_provider_horovod.spec import SPEC_FILE, TrainingSpec, consumed_uri
from airflow_provider_horovod.storage import Storage
from unit.fakes import FakeRay

RUN = TaskRun("dag", "train", "manual__1")
SID = RUN.submission_id


def make_request_for(calls):
    def make_request(attempt: Attempt):
        calls.append(attempt)
        spec = TrainingSpec(submission_id=attempt.submission_id, train_fn={"import": "m:f"}, storage_uri="/s",
                            attempt=attempt.number)
        return training_request(spec, {"train_fn.pkl": b"fn"}, {"py_modules": ["gcs://_ray_pkg_user.zip"]}, RUN)

    return make_request


def never(attempt):
    raise AssertionError(f"a request was made for attempt {attempt.number}, though a job was re-attached")


def test_no_job_yet_submits_attempt_one():
    ray, calls = FakeRay(), []
    attempt = find_or_submit(ray, RUN, make_request_for(calls))
    assert attempt == Attempt(1, SID(1)) and not attempt.reattached
    assert [a.number for a in calls] == [1] and not calls[0].resume
    (submitted,) = ray.submitted
    assert submitted["submission_id"] == SID(1)


@pytest.mark.parametrize("status", ["PENDING", "RUNNING"])
def test_a_running_job_is_reattached(status):
    ray = FakeRay({SID(1): {"status": status}})
    attempt = find_or_submit(ray, RUN, never)
    assert attempt.reattached and attempt.number == 1 and attempt.info["status"] == status
    assert ray.submitted == []


def test_a_succeeded_job_not_consumed_is_reused():
    ray = FakeRay({SID(1): {"status": "SUCCEEDED"}})
    attempt = find_or_submit(ray, RUN, never, consumed=lambda n: False)
    assert attempt.reattached and attempt.submission_id == SID(1) and ray.submitted == []


def test_a_succeeded_job_consumed_gives_the_next_attempt():
    ray, calls = FakeRay({SID(1): {"status": "SUCCEEDED"}}), []
    attempt = find_or_submit(ray, RUN, make_request_for(calls), consumed=lambda n: n == 1)
    assert attempt == Attempt(2, SID(2), resume=False)
    assert [a.number for a in calls] == [2] and ray.submitted[0]["submission_id"] == SID(2)


@pytest.mark.parametrize("status", ["FAILED", "STOPPED"])
def test_a_failed_or_stopped_job_gives_the_next_attempt_resuming(status):
    ray, calls = FakeRay({SID(1): {"status": status}}), []
    attempt = find_or_submit(ray, RUN, make_request_for(calls))
    assert attempt == Attempt(2, SID(2), resume=True)
    assert calls == [attempt]


def test_the_latest_attempt_decides():
    ray = FakeRay({SID(1): {"status": "FAILED"}, SID(2): {"status": "FAILED"}, SID(3): {"status": "RUNNING"}})
    assert find_attempt(ray, RUN).submission_id == SID(3)
    ray = FakeRay({SID(1): {"status": "SUCCEEDED"}, SID(2): {"status": "FAILED"}})
    assert find_attempt(ray, RUN) == Attempt(3, SID(3), resume=True)


def test_before_submit_sees_the_request_before_it_goes():
    ray, seen = FakeRay(), []

    def before(request):
        seen.append((request.submission_id, len(ray.submitted)))

    find_or_submit(ray, RUN, make_request_for([]), before_submit=before)
    assert seen == [(SID(1), 0)] and len(ray.submitted) == 1


def test_a_refused_request_submits_nothing():
    ray = FakeRay()

    def refuse(attempt):
        raise RuntimeError("no GPUs")

    with pytest.raises(RuntimeError, match="no GPUs"):
        find_or_submit(ray, RUN, refuse)
    assert ray.submitted == []


def test_submit_uploads_the_payload_package_with_the_job():
    ray = FakeRay()
    made = make_request_for([])(Attempt(1, SID(1)))
    assert submit(ray, made) == SID(1)
    (call,) = ray.submitted
    modules = call["runtime_env"]["py_modules"]
    assert modules[:-1] == made.runtime_env["py_modules"]
    assert os.path.basename(modules[-1]) == made.payload_module
    assert call["payload"] == {"__init__.py": call["payload"]["__init__.py"], **made.files}
    assert SPEC_FILE in call["payload"]
    assert (call["entrypoint"], call["metadata"]) == (made.entrypoint, made.metadata)
    assert not os.path.exists(modules[-1])  # a temporary folder, gone after the upload
    assert made.runtime_env["py_modules"][-1] != modules[-1]  # the request itself is unchanged


def test_consumed_markers_in_storage(tmp_path):
    storage, uri = Storage(), str(tmp_path / "run")
    consumed = consumed_in(storage, uri)
    assert not consumed(1)
    storage.write_json(consumed_uri(uri, 1), {"submission_id": SID(1)})
    assert consumed(1) and not consumed(2)


def test_submit_passes_what_the_driver_reserves():
    import dataclasses

    ray = FakeRay()
    made = dataclasses.replace(make_request_for([])(Attempt(1, SID(1))),
                               driver_resources={"num_cpus": 2, "num_gpus": 1, "resources": {"accel": 1}})
    submit(ray, made)
    (call,) = ray.submitted
    assert (call["entrypoint_num_cpus"], call["entrypoint_num_gpus"], call["entrypoint_memory"],
            call["entrypoint_resources"]) == (2, 1, None, {"accel": 1})
