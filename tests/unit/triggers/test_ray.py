import asyncio
import re

import pytest

from airflow_provider_horovod.exceptions import InvalidParameterError
from airflow_provider_horovod.triggers.ray import RayJobTrigger, job_event, pending_timeout_message


def test_serialize_round_trip():
    trigger = RayJobTrigger(submission_id="ahp-x-a1", ray_conn_id="my_ray", poll_interval_seconds=2.5,
                            pending_timeout_seconds=60, log_offset=7, stream_logs=False)
    classpath, kwargs = trigger.serialize()
    assert classpath == "airflow_provider_horovod.triggers.ray.RayJobTrigger"
    assert kwargs == {
        "submission_id": "ahp-x-a1",
        "ray_conn_id": "my_ray",
        "poll_interval_seconds": 2.5,
        "pending_timeout_seconds": 60,
        "log_offset": 7,
        "stream_logs": False,
    }
    assert RayJobTrigger(**kwargs).serialize() == (classpath, kwargs)


@pytest.mark.parametrize(
    "kwargs, parameter",
    [
        ({"submission_id": ""}, "submission_id"),
        ({"submission_id": "x", "poll_interval_seconds": 0}, "poll_interval_seconds"),
        ({"submission_id": "x", "pending_timeout_seconds": -1}, "pending_timeout_seconds"),
    ],
)
def test_bad_arguments_are_refused_at_construction(kwargs, parameter):
    with pytest.raises(InvalidParameterError, match=parameter):
        RayJobTrigger(**kwargs)


def test_event_is_json_safe_and_complete():
    import json

    event = job_event({"status": "FAILED", "error_type": "JOB_ENTRYPOINT_COMMAND_ERROR", "metadata": {"a": "b"}},
                      "sid", status="error", message="boom", log_tail=["x"], log_offset=3)
    assert json.loads(json.dumps(event)) == event
    assert event["job_status"] == "FAILED" and event["error_type"] == "JOB_ENTRYPOINT_COMMAND_ERROR"


def test_pending_message_names_what_was_asked_and_what_exists():
    msg = pending_timeout_message("sid", 31, {"GPU": 2.0}, {"CPU": 4.0})
    assert '"GPU": 2.0' in msg and '"CPU": 4.0' in msg and "pending_timeout_seconds" in msg


class FakeHook:
    """Stands in for the Ray dashboard: a scripted sequence of statuses and log text."""

    def __init__(self, statuses, logs):
        self.statuses = list(statuses)
        self.logs = list(logs)
        self.stopped = []

    async def a_get_job_info(self, sid):
        status = self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]
        return {"status": status, "message": "msg", "metadata": {}, "start_time": 1000}

    async def a_get_job_logs_since(self, sid, offset, final=False):
        from airflow_provider_horovod.hooks.ray import split_new_lines

        text = self.logs.pop(0) if len(self.logs) > 1 else self.logs[0]
        return split_new_lines(text, offset, final)

    async def a_get_job_logs(self, sid):
        return self.logs[-1]

    async def a_stop_job(self, sid):
        self.stopped.append(sid)
        return True

    async def a_get_cluster_resources(self):
        return {"CPU": 4.0}


def _run(trigger):
    async def collect():
        return [event async for event in trigger.run()]

    return asyncio.run(collect())


def streamed(capsys) -> list[str]:
    """Log lines the trigger streamed (Airflow's logging writes them to stdout)."""
    return re.findall(r"\[ray\] (\S+)", capsys.readouterr().out)


def test_run_streams_each_line_once_and_yields_one_event(monkeypatch, capsys):
    hook = FakeHook(["RUNNING", "RUNNING", "SUCCEEDED"], ["a\nb", "a\nb\nc\n", "a\nb\nc\nd"])
    trigger = RayJobTrigger(submission_id="sid", poll_interval_seconds=0.01)
    monkeypatch.setattr(trigger, "_hook", lambda: hook)
    events = _run(trigger)
    assert len(events) == 1 and events[0].payload["status"] == "success"
    assert streamed(capsys) == ["a", "b", "c", "d"]


def test_run_twice_from_serialized_offset_repeats_no_line(monkeypatch, capsys):
    hook = FakeHook(["SUCCEEDED"], ["a\nb\nc\n"])
    trigger = RayJobTrigger(submission_id="sid", log_offset=2)
    monkeypatch.setattr(trigger, "_hook", lambda: hook)
    _run(trigger)
    assert streamed(capsys) == ["c"]


def test_pending_too_long_stops_the_job_and_fails(monkeypatch):
    hook = FakeHook(["PENDING"], [""])
    trigger = RayJobTrigger(submission_id="sid", pending_timeout_seconds=1)
    monkeypatch.setattr(trigger, "_hook", lambda: hook)
    (event,) = _run(trigger)
    assert event.payload["status"] == "error" and "stayed PENDING" in event.payload["message"]
    assert hook.stopped == ["sid"]
