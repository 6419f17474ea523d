"""A killed task's job stopped, and the record of its attempt kept by the side that stops it, since the
driver may not: one stopped while PENDING gets SIGTERM before the entrypoint runs, a running one may not
write within Ray's grace (``unit.fakes.FakeRay`` as the hook, a local folder as the storage)."""

import asyncio
import json
import logging

import pytest

from airflow_provider_horovod.attempts import read_attempt
from airflow_provider_horovod.contract import META_ATTEMPT, META_RESULT_URI, META_STORAGE_URI, TaskRun, result_uri
from airflow_provider_horovod.documents import TaskRecord
from airflow_provider_horovod.failures import kept_by_stopper, stopped_by_request
from airflow_provider_horovod.jobs import stop
from airflow_provider_horovod.jobs.stop import a_stop_killed, stop_killed
from airflow_provider_horovod.storage import Storage
from unit.fakes import FakeRay

SID = TaskRun("dag", "train", "manual__1").submission_id(2)


def job(status: str, root) -> dict:
    storage_uri = str(root / "dag" / "train" / "manual__1")
    return {
        "status": status,
        "metadata": {
            META_STORAGE_URI: storage_uri,
            META_ATTEMPT: "2",
            META_RESULT_URI: result_uri(storage_uri, 2),
        },
    }


@pytest.fixture(autouse=True)
def quick_watch(monkeypatch):
    """The watch's pace, scaled down: what it does between reads is what these tests check."""
    monkeypatch.setattr(stop, "CONFIRM_POLL_S", 0.01)
    monkeypatch.setattr(stop, "ASK_AGAIN_NOT_TAKEN_S", 0.1)


def record_of(info: dict) -> dict | None:
    return Storage().read_json(info["metadata"][META_RESULT_URI])


def test_a_job_stopped_while_pending_gets_the_record_of_its_attempt(tmp_path):
    info = job("PENDING", tmp_path)
    ray = FakeRay({SID: info})
    stop_killed(ray, Storage(), SID)
    assert ray.stopped == [SID]
    record = record_of(info)
    assert TaskRecord.from_dict(record).attempt == 2  # a whole record, sealed as every writer's
    assert record["submission_id"] == SID
    assert record["run_uri"] == f"{info['metadata'][META_STORAGE_URI]}/attempt-2"
    assert record["failure"]["failure_class"] == "infrastructure"
    assert stopped_by_request(record["failure"])  # the Training view shows a kill
    assert "while PENDING" in record["failure"]["summary"]


def test_the_record_reads_back_as_the_attempts_for_its_tasks_next_try(tmp_path):
    info = job("PENDING", tmp_path)
    stop_killed(FakeRay({SID: info}), Storage(), SID)
    files = read_attempt(Storage(), info["metadata"][META_STORAGE_URI], 2)
    assert files.unread == {}
    assert files.record["failure"]["failure_class"] == "infrastructure"


def test_a_running_job_gets_the_record_of_its_attempt_in_case_its_driver_cannot(tmp_path):
    # Its driver may not unwind and write within Ray's SIGKILL grace (a busy node, storage refusing):
    # without this the attempt has no record.
    info = job("RUNNING", tmp_path)
    stop_killed(FakeRay({SID: info}), Storage(), SID)
    record = record_of(info)
    assert TaskRecord.from_dict(record).attempt == 2
    assert stopped_by_request(record["failure"])
    assert "while its driver ran" in record["failure"]["summary"]
    assert kept_by_stopper(record)  # what the driver's own record replaces


@pytest.mark.parametrize("status", ["STOPPED", "SUCCEEDED", "FAILED"])
def test_a_job_that_had_ended_keeps_its_own_record(tmp_path, status):
    info = job(status, tmp_path)
    ray = FakeRay({SID: info})
    stop_killed(ray, Storage(), SID)
    assert ray.stopped == [SID]
    assert record_of(info) is None  # its driver wrote it, or its post-mortem is the Airflow side's


def test_a_record_already_there_is_kept(tmp_path):
    info = job("PENDING", tmp_path)
    uri = info["metadata"][META_RESULT_URI]
    Storage().write_json(uri, {"submission_id": SID, "kept": True})
    stop_killed(FakeRay({SID: info}), Storage(), SID)
    assert record_of(info) == {"submission_id": SID, "kept": True}


def test_a_stop_ray_did_not_take_writes_nothing_is_asked_again_and_said_when_the_job_runs_on(
    tmp_path, monkeypatch, caplog
):
    info = job("PENDING", tmp_path)
    ray = FakeRay({SID: info})
    asks = []
    ray.stop_job = lambda sid: asks.append(sid) and False  # no supervisor found: the job goes on
    with caplog.at_level(logging.WARNING):
        stop_killed(ray, Storage(), SID, confirm_s=1.0)
    assert record_of(info) is None
    assert len(asks) >= 3  # asked again every ASK_AGAIN_NOT_TAKEN_S while no ask was taken
    assert f"Ray job {SID} was still PENDING 1 s after it was asked to stop ({len(asks)} times)" in caplog.text
    assert f"ray job stop {SID}" in caplog.text


@pytest.mark.parametrize("in_triggerer", [False, True])
def test_a_stop_that_did_not_take_at_first_is_taken_when_asked_again(tmp_path, monkeypatch, caplog, in_triggerer):
    monkeypatch.setattr(stop, "ASK_AGAIN_S", 60.0)  # a stop not taken is asked again sooner than one taken
    info = job("RUNNING", tmp_path)
    ray = FakeRay({SID: info})
    taken, asks = ray.stop_job, []

    def stop_job(sid):  # Ray found no supervisor the first time (a slow GCS), then did
        asks.append(sid)
        return len(asks) > 1 and taken(sid)

    ray.stop_job = stop_job
    with caplog.at_level(logging.WARNING):
        if in_triggerer:
            asyncio.run(a_stop_killed(ray, Storage(), SID, confirm_s=5.0))
        else:
            stop_killed(ray, Storage(), SID, confirm_s=5.0)
    assert len(asks) >= 2
    assert ray.stopped[0] == SID  # an ask after the first reached the job, which then ended
    assert ray.get_job_info(SID)["status"] == "STOPPED"
    assert "was still" not in caplog.text


@pytest.mark.parametrize("in_triggerer", [False, True])
def test_a_job_stopped_a_moment_after_its_submission_gets_its_record_once_a_stop_is_taken(tmp_path, in_triggerer):
    # Ray creates a job's supervisor after it answers the submission: a stop in that moment finds none.
    info = job("PENDING", tmp_path)
    ray = FakeRay({SID: info})
    taken, asks = ray.stop_job, []

    def stop_job(sid):
        asks.append(sid)
        return len(asks) > 1 and taken(sid)

    ray.stop_job = stop_job
    if in_triggerer:
        asyncio.run(a_stop_killed(ray, Storage(), SID))
    else:
        stop_killed(ray, Storage(), SID)  # within a worker's 4 s, asked again after ASK_AGAIN_NOT_TAKEN_S
    assert len(asks) == 2
    assert "while PENDING" in record_of(info)["failure"]["summary"]


def test_the_watch_asks_again_sooner_while_no_stop_was_taken():
    watch = stop.Watch(started=0.0, asked=0.0)
    running = {"status": "RUNNING"}
    assert watch.next(running, stop.ASK_AGAIN_NOT_TAKEN_S, confirm_s=30.0) == "ask"
    watch.asked_again(True, stop.ASK_AGAIN_NOT_TAKEN_S)
    assert watch.next(running, 2 * stop.ASK_AGAIN_NOT_TAKEN_S, confirm_s=30.0) == "wait"
    assert watch.next(running, stop.ASK_AGAIN_NOT_TAKEN_S + stop.ASK_AGAIN_S, confirm_s=30.0) == "ask"
    assert watch.next(running, 30.0, confirm_s=30.0) == "give_up"
    assert watch.next({"status": "STOPPED"}, 1.0, confirm_s=30.0) == "ended"
    assert watch.next(stop.UNREAD, 1.0, confirm_s=30.0) == "wait"


def test_a_job_not_of_the_providers_gets_no_record(tmp_path):
    ray = FakeRay({"raysubmit_1": {"status": "PENDING", "metadata": {}}})
    stop_killed(ray, Storage(), "raysubmit_1")
    assert ray.stopped == ["raysubmit_1"]
    assert list(tmp_path.iterdir()) == []


def test_a_storage_that_fails_loses_the_record_and_says_so(tmp_path, caplog):
    info = job("PENDING", tmp_path)

    class Refusing(Storage):
        def write_bytes(self, uri, body):
            raise OSError("No space left on device")

    with caplog.at_level(logging.WARNING):
        stop_killed(FakeRay({SID: info}), Refusing(), SID)
    assert "Could not keep the record of the stopped attempt" in caplog.text
    assert "No space left on device" in caplog.text


def test_a_job_info_that_cannot_be_read_still_stops_the_job(tmp_path, caplog):
    info = job("PENDING", tmp_path)
    ray = FakeRay({SID: info})

    def fails(sid, fresh_within_s=None):
        raise ConnectionError("refused")

    ray.get_job_info = fails
    with caplog.at_level(logging.WARNING):
        stop_killed(ray, Storage(), SID, confirm_s=1.0)
        ray.a_get_job_info = fails
        asyncio.run(a_stop_killed(ray, Storage(), SID, confirm_s=1.0))
    assert ray.stopped == [SID, SID]
    assert record_of(info) is None  # nothing says the driver had not started
    # A read that fails does not say the job ended: the watch goes on, and says so at its end.
    assert caplog.text.count(f"Ray job {SID} was still unreadable 1 s after it was asked to stop") == 2


def test_a_dashboard_that_fails_never_raises_from_the_signal_handler(tmp_path, caplog):
    ray = FakeRay()

    def fails(sid):
        raise ConnectionError("refused")

    ray.stop_job = fails
    with caplog.at_level(logging.ERROR):
        stop_killed(ray, Storage(), SID)
    assert f"Could not stop Ray job {SID}" in caplog.text


def test_the_triggerers_twin_keeps_the_same_record(tmp_path):
    info = job("PENDING", tmp_path)
    ray = FakeRay({SID: info})
    asyncio.run(a_stop_killed(ray, Storage(), SID))
    assert ray.stopped == [SID]
    assert stopped_by_request(record_of(info)["failure"])
    assert json.loads(TaskRecord.from_dict(record_of(info)).to_json())["attempt"] == 2
