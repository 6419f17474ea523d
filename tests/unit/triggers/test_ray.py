"""RayJobTrigger: serialisable arguments checked at construction, and a run against a stand-in for
the Ray dashboard that streams each log line once and yields exactly one event."""

import asyncio
import re
import time

import pytest

from airflow_provider_horovod.exceptions import InvalidParameterError, RayClusterUnreachableError
from airflow_provider_horovod.jobs.protocol import META_RESOURCES, JobEvent, JobStatus
from airflow_provider_horovod.triggers.ray import RayJobTrigger
from unit.fakes import FakeRay

SID = "ahp-dag-train-0123456789-a1"


def test_serialize_exact_and_rebuilt():
    trigger = RayJobTrigger(submission_id=SID, ray_conn_id="my_ray", poll_interval_seconds=2.5,
                            pending_timeout_seconds=60, log_cursor={"submission_id": SID, "lines": 7},
                            stream_logs=False)
    assert trigger.serialize() == ("airflow_provider_horovod.triggers.ray.RayJobTrigger", {
        "submission_id": SID, "ray_conn_id": "my_ray", "poll_interval_seconds": 2.5, "pending_timeout_seconds": 60,
        "log_cursor": {"submission_id": SID, "lines": 7}, "stream_logs": False})
    classpath, kwargs = trigger.serialize()
    assert RayJobTrigger(**kwargs).serialize() == (classpath, kwargs)


def test_defaults_and_a_cursor_of_another_job():
    _, kwargs = RayJobTrigger(submission_id=SID, log_cursor={"submission_id": "other", "lines": 9}).serialize()
    assert kwargs == {"submission_id": SID, "ray_conn_id": "ray_default", "poll_interval_seconds": 1.0,
                      "pending_timeout_seconds": 600.0, "log_cursor": {"submission_id": SID, "lines": 0},
                      "stream_logs": True}


@pytest.mark.parametrize("kwargs, parameter", [
    ({"submission_id": ""}, "submission_id"),
    ({"submission_id": None}, "submission_id"),
    ({"submission_id": "x", "poll_interval_seconds": 0}, "poll_interval_seconds"),
    ({"submission_id": "x", "poll_interval_seconds": "fast"}, "poll_interval_seconds"),
    ({"submission_id": "x", "poll_interval_seconds": True}, "poll_interval_seconds"),
    ({"submission_id": "x", "pending_timeout_seconds": -1}, "pending_timeout_seconds"),
    ({"submission_id": "x", "pending_timeout_seconds": "10"}, "pending_timeout_seconds"),
])
def test_bad_arguments_are_refused_at_construction(kwargs, parameter):
    with pytest.raises(InvalidParameterError) as err:
        RayJobTrigger(**kwargs)
    assert err.value.parameter == parameter and "give" in str(err.value)


def job(status, started_s_ago=0.0, **extra):
    return {"status": status, "message": f"msg-{status}", "start_time": (time.time() - started_s_ago) * 1000,
            "metadata": {}, **extra}


def run(trigger, ray, monkeypatch):
    monkeypatch.setattr(trigger, "_hook", lambda: ray)

    async def collect():
        return [event async for event in trigger.run()]

    return asyncio.run(collect())


def streamed(capsys) -> list[str]:
    """The job's log lines the trigger wrote to the task log (Airflow's logging writes to stdout)."""
    return re.findall(r"\[ray\] (\S+)", capsys.readouterr().out)


def test_run_streams_each_line_once_and_yields_one_event(monkeypatch, capsys):
    ray = FakeRay({SID: [job("PENDING"), job("RUNNING"), job("RUNNING"), job("RUNNING"), job("SUCCEEDED")]},
                  logs={SID: ["", "l1\nl2", "l1\nl2\nl3\n", "l1\nl2\nl3\n", "l1\nl2\nl3\nl4"]})
    events = run(RayJobTrigger(submission_id=SID, poll_interval_seconds=0.001), ray, monkeypatch)
    assert len(events) == 1
    event = JobEvent.from_dict(events[0].payload)
    assert events[0].payload["outcome"] == "success" and event.succeeded
    assert event.job_status is JobStatus.SUCCEEDED and event.log_cursor == {"submission_id": SID, "lines": 4}
    assert streamed(capsys) == ["l1", "l2", "l3", "l4"]
    assert ray.calls[-1] == "aclose"  # the hook's clients are closed


def test_a_serialized_cursor_repeats_no_line(monkeypatch, capsys):
    ray = FakeRay({SID: job("SUCCEEDED")}, logs={SID: "l1\nl2\nl3\n"})
    trigger = RayJobTrigger(submission_id=SID, log_cursor={"submission_id": SID, "lines": 2})
    rebuilt = RayJobTrigger(**trigger.serialize()[1])
    (event,) = run(rebuilt, ray, monkeypatch)
    assert streamed(capsys) == ["l3"]
    assert event.payload["log_cursor"] == {"submission_id": SID, "lines": 3}


def test_without_streaming_only_the_end_is_read(monkeypatch, capsys):
    ray = FakeRay({SID: [job("RUNNING"), job("FAILED")]}, logs={SID: "boom\n"})
    (event,) = run(RayJobTrigger(submission_id=SID, poll_interval_seconds=0.001, stream_logs=False), ray, monkeypatch)
    assert ray.calls.count("get_job_logs") == 1
    assert event.payload["outcome"] == "error" and event.payload["log_tail"] == ["boom"]


def test_pending_too_long_stops_the_job_and_says_what_was_asked(monkeypatch):
    ray = FakeRay({SID: job("PENDING", started_s_ago=90, metadata={META_RESOURCES: '{"GPU": 4.0}'})},
                  cluster={"CPU": 8.0})
    (event,) = run(RayJobTrigger(submission_id=SID, pending_timeout_seconds=30), ray, monkeypatch)
    payload = event.payload
    assert payload["outcome"] == "error" and payload["job_status"] == "PENDING"
    assert "stayed PENDING for 90 s" in payload["message"]
    assert 'ask for {"GPU": 4.0}' in payload["message"] and 'the cluster has {"CPU": 8.0}' in payload["message"]
    assert ray.stopped == [SID]


def test_pending_too_long_when_the_cluster_cannot_say_what_it_has(monkeypatch):
    ray = FakeRay({SID: job("PENDING", started_s_ago=90)})

    async def unreachable():
        raise RayClusterUnreachableError("down")

    ray.a_get_cluster_resources = unreachable
    (event,) = run(RayJobTrigger(submission_id=SID, pending_timeout_seconds=30), ray, monkeypatch)
    assert "the cluster has unknown" in event.payload["message"] and ray.stopped == [SID]


def test_a_missing_job_yields_an_error_event(monkeypatch):
    (event,) = run(RayJobTrigger(submission_id=SID), FakeRay(), monkeypatch)
    assert event.payload["outcome"] == "error" and f"Ray job {SID} does not exist" in event.payload["message"]


def test_a_provider_error_becomes_one_error_event(monkeypatch):
    ray = FakeRay({SID: [job("RUNNING")]}, logs={SID: "l1\n"})
    calls = {"n": 0}
    real = ray.a_get_job_info

    async def flaky(sid):
        calls["n"] += 1
        if calls["n"] > 1:
            raise RayClusterUnreachableError("The Ray dashboard did not answer")
        return await real(sid)

    ray.a_get_job_info = flaky
    (event,) = run(RayJobTrigger(submission_id=SID, poll_interval_seconds=0.001), ray, monkeypatch)
    assert event.payload["outcome"] == "error" and "did not answer" in event.payload["message"]
    assert event.payload["log_cursor"] == {"submission_id": SID, "lines": 1}


def test_on_kill_stops_the_job(monkeypatch):
    ray = FakeRay({SID: job("RUNNING")})
    trigger = RayJobTrigger(submission_id=SID)
    monkeypatch.setattr(trigger, "_hook", lambda: ray)
    asyncio.run(trigger.on_kill())
    assert ray.stopped == [SID]
