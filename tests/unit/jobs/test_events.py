"""A wait's end as the finish step reads it: a JobEvent travels through the triggerer as JSON and comes
back equal; a job's info or a wait's error makes one."""

import json

from airflow_provider_horovod.contract import JobStatus
from airflow_provider_horovod.jobs.events import JobEvent, Outcome

INFO = {
    "status": "FAILED",
    "error_type": "JOB_ENTRYPOINT_COMMAND_ERROR",
    "message": "boom",
    "metadata": {"ahp_attempt": "1"},
    "start_time": 1,
    "driver_info": {"x": 1},
}


def test_event_round_trip_through_json():
    event = JobEvent.from_info("sid-a1", INFO, log_tail=["a", "b"], log_cursor={"submission_id": "sid-a1", "lines": 7})
    data = json.loads(json.dumps(event.to_dict()))
    assert data["outcome"] == "error"
    assert data["job_status"] == "FAILED"
    assert JobEvent.from_dict(data) == event
    assert event.job_status is JobStatus.FAILED
    assert event.error_type == "JOB_ENTRYPOINT_COMMAND_ERROR"
    assert event.metadata == {"ahp_attempt": "1"}
    assert event.log_tail == ["a", "b"]
    assert not event.succeeded


def test_success_and_error_events():
    ok = JobEvent.from_info("sid", {"status": "SUCCEEDED"})
    assert ok.succeeded
    assert ok.outcome is Outcome.SUCCESS
    assert ok.message == ""
    assert ok.metadata == {}
    missing = JobEvent.error("sid", "gone")
    assert not missing.succeeded
    assert missing.job_status is None
    assert missing.message == "gone"
    assert JobEvent.from_dict(json.loads(json.dumps(missing.to_dict()))) == missing
    timed_out = JobEvent.error("sid", "late", info={"status": "PENDING", "metadata": {"a": "b"}})
    assert timed_out.job_status is JobStatus.PENDING
    assert timed_out.metadata == {"a": "b"}


def test_unknown_keys_are_ignored():
    data = JobEvent.from_info("sid", {"status": "SUCCEEDED"}).to_dict()
    data["from_a_newer_provider"] = 1
    assert JobEvent.from_dict(data) == JobEvent.from_info("sid", {"status": "SUCCEEDED"})


def test_an_error_event_of_a_job_in_a_state_the_provider_does_not_know_has_no_status():
    event = JobEvent.error("sid", "unknown", info={"status": "DELETED"})
    assert event.job_status is None
    assert JobEvent.from_dict(json.loads(json.dumps(event.to_dict()))) == event
