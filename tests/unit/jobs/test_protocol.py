"""The job protocol: Ray's states as JSON-ready strings, and the one event a wait ends with."""

import json

import pytest

from airflow_provider_horovod.jobs.protocol import JobEvent, JobStatus, Outcome


def test_job_status_is_a_string():
    assert JobStatus.RUNNING == "RUNNING" and isinstance(JobStatus.FAILED, str)
    assert json.dumps({"s": JobStatus.SUCCEEDED}) == '{"s": "SUCCEEDED"}'
    assert {s.value for s in JobStatus} == {"PENDING", "RUNNING", "STOPPED", "SUCCEEDED", "FAILED"}


def test_terminal_states():
    assert {s for s in JobStatus if s.is_terminal} == {JobStatus.STOPPED, JobStatus.SUCCEEDED, JobStatus.FAILED}


@pytest.mark.parametrize("value, status", [("FAILED", JobStatus.FAILED), (JobStatus.PENDING, JobStatus.PENDING),
                                           ("failed", None), ("DELETED", None), (None, None), (3, None)])
def test_status_of_any_value(value, status):
    assert JobStatus.of(value) is status


INFO = {"status": "FAILED", "error_type": "JOB_ENTRYPOINT_COMMAND_ERROR", "message": "boom",
        "metadata": {"ahp_attempt": "1"}, "start_time": 1, "driver_info": {"x": 1}}


def test_event_round_trip_through_json():
    event = JobEvent.from_info("sid-a1", INFO, log_tail=["a", "b"], log_cursor={"submission_id": "sid-a1", "lines": 7})
    data = json.loads(json.dumps(event.to_dict()))
    assert data["outcome"] == "error" and data["job_status"] == "FAILED"
    assert JobEvent.from_dict(data) == event
    assert event.job_status is JobStatus.FAILED and event.error_type == "JOB_ENTRYPOINT_COMMAND_ERROR"
    assert event.metadata == {"ahp_attempt": "1"} and event.log_tail == ["a", "b"] and not event.succeeded


def test_success_and_error_events():
    ok = JobEvent.from_info("sid", {"status": "SUCCEEDED"})
    assert ok.succeeded and ok.outcome is Outcome.SUCCESS and ok.message == "" and ok.metadata == {}
    missing = JobEvent.error("sid", "gone")
    assert not missing.succeeded and missing.job_status is None and missing.message == "gone"
    assert JobEvent.from_dict(json.loads(json.dumps(missing.to_dict()))) == missing
    timed_out = JobEvent.error("sid", "late", info={"status": "PENDING", "metadata": {"a": "b"}})
    assert timed_out.job_status is JobStatus.PENDING and timed_out.metadata == {"a": "b"}
    assert JobEvent.error("sid", "x", job_status=JobStatus.STOPPED).job_status is JobStatus.STOPPED


def test_unknown_keys_are_ignored():
    data = JobEvent.from_info("sid", {"status": "SUCCEEDED"}).to_dict()
    data["from_a_newer_provider"] = 1
    assert JobEvent.from_dict(data) == JobEvent.from_info("sid", {"status": "SUCCEEDED"})


def test_an_unknown_status_reads_as_none():
    data = {"outcome": "error", "submission_id": "sid", "job_status": "DELETED"}
    assert JobEvent.from_dict(data).job_status is None
