"""The wait: the policy (checked where it is made, travelling whole), the event it ends with, and the
pure step (what one poll means: new log lines, the end, a timeout). ``follow``, the one wait of the
trigger and the operator, is tested in test_wait_follow.py and, on a clock, in test_wait_timing.py."""

import json

import pytest

from airflow_provider_horovod.contract import META_RESOURCES, JobStatus
from airflow_provider_horovod.exceptions import InvalidParameterError
from airflow_provider_horovod.jobs.logs import LogCursor
from airflow_provider_horovod.jobs.wait import Poll, WaitPolicy, requested_resources, step
from unit.fakes import FakeRay
from unit.jobs.following import SID, Run, job

NOW = 1_800_000_000.0


# --- the policy -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, parameter",
    [
        ({"poll_interval_s": 0}, "poll_interval_seconds"),
        ({"pending_timeout_s": -1}, "pending_timeout_seconds"),
        ({"stall_timeout_s": "5"}, "stall_timeout_seconds"),
        ({"poll_interval_s": True}, "poll_interval_seconds"),
    ],
)
def test_a_bad_policy_is_refused_where_it_is_made_naming_the_parameter(kwargs, parameter):
    with pytest.raises(InvalidParameterError) as err:
        WaitPolicy(**kwargs)
    assert err.value.parameter == parameter


def test_the_policy_travels_whole_as_json():
    policy = WaitPolicy(poll_interval_s=2.5, pending_timeout_s=None, stall_timeout_s=60)
    assert WaitPolicy.from_dict(json.loads(json.dumps(policy.to_dict()))) == policy
    with pytest.raises(InvalidParameterError):
        WaitPolicy.from_dict({**policy.to_dict(), "poll_interval_s": -1})


# --- the step ---------------------------------------------------------------------------------------


def info(status, *, started_s_ago=0.0, **extra):
    return {"status": status, "start_time": (NOW - started_s_ago) * 1000, "message": f"msg-{status}", **extra}


def cursor_of(event) -> LogCursor:
    return LogCursor.from_dict(event.log_cursor, SID)


def run(polls, policy=WaitPolicy()):
    """Every poll (job info, new lines, tail) through step: the lines to write, and the last step."""
    cursor, written, result = LogCursor(SID), [], None
    for job_info, lines, tail in polls:
        result = step(policy, cursor, Poll(job_info, NOW, lines, tail))
        written += result.lines
        cursor = result.cursor
        if result.event is not None or result.timeout is not None:
            break
    return written, result


def test_new_lines_are_written_and_advance_the_cursor():
    written, result = run(
        [
            (info("PENDING"), [], []),
            (info("RUNNING"), ["a", "b"], ["a", "b"]),
            (info("RUNNING"), [], ["a", "b"]),
            (info("RUNNING"), ["c"], ["a", "b", "c"]),
            (info("SUCCEEDED"), ["d"], ["a", "b", "c", "d"]),
        ]
    )
    assert written == ["a", "b", "c", "d"]
    event = result.event
    assert event.succeeded
    assert event.job_status is JobStatus.SUCCEEDED
    assert event.log_tail == []
    assert cursor_of(event) == result.cursor
    assert (result.cursor.lines, result.cursor.tail) == (4, LogCursor(SID).advanced(["a", "b", "c", "d"]).tail)


def test_the_step_starts_from_the_cursor_it_is_given():
    earlier = LogCursor(SID).advanced(["a", "b"])
    result = step(WaitPolicy(), earlier, Poll(info("RUNNING"), NOW, ["c"]))
    assert result.lines == ["c"]
    assert result.cursor.lines == 3
    assert result.cursor.tail == LogCursor(SID).advanced(["a", "b", "c"]).tail


def test_a_poll_without_new_lines_moves_nothing():
    cursor = LogCursor(SID).advanced(["a", "b", "c"])
    result = step(WaitPolicy(), cursor, Poll(info("RUNNING"), NOW))
    assert result.lines == []
    assert result.event is None
    assert result.timeout is None
    assert (result.cursor.lines, result.cursor.tail) == (3, cursor.tail)


def test_a_missing_job_ends_the_wait_in_error():
    result = step(WaitPolicy(), LogCursor(SID).advanced(["a", "b"]), Poll(None, NOW))
    event = result.event
    assert not event.succeeded
    assert event.job_status is None
    assert f"Ray job {SID} does not exist" in event.message
    assert cursor_of(event).lines == 2


def test_a_failure_carries_the_tail_it_was_given():
    tail = [f"line {i}" for i in range(60, 100)]
    result = step(
        WaitPolicy(),
        LogCursor(SID),
        Poll(info("FAILED", error_type="JOB_ENTRYPOINT_COMMAND_ERROR"), NOW, ["line 99"], tail),
    )
    event = result.event
    assert event.job_status is JobStatus.FAILED
    assert event.error_type == "JOB_ENTRYPOINT_COMMAND_ERROR"
    assert event.log_tail == tail
    assert event.message == "msg-FAILED"
    assert result.lines == ["line 99"]
    assert cursor_of(event).lines == 1


@pytest.mark.parametrize("status", ["STOPPED", "FAILED", "SUCCEEDED"])
def test_every_terminal_state_ends_the_wait(status):
    result = step(
        WaitPolicy(pending_timeout_s=1),
        LogCursor(SID),
        Poll(info(status, started_s_ago=10_000), NOW, [], ["last words"]),
    )
    assert result.event is not None
    assert result.timeout is None
    assert result.event.succeeded is (status == "SUCCEEDED")
    assert result.event.log_tail == ([] if status == "SUCCEEDED" else ["last words"])


def test_pending_past_the_timeout():
    asked = {"CPU": 2.0, "GPU": 4.0}
    job = info("PENDING", started_s_ago=120, metadata={META_RESOURCES: json.dumps(asked)})
    result = step(WaitPolicy(pending_timeout_s=60), LogCursor(SID), Poll(job, NOW, ["waiting"]))
    assert result.event is None
    assert result.lines == ["waiting"]
    timeout = result.timeout
    assert (timeout.submission_id, timeout.status, timeout.asked) == (SID, "PENDING", asked)
    assert timeout.waited_s == pytest.approx(120)
    event = timeout.event({"CPU": 8.0}, result.cursor)
    assert not event.succeeded
    assert event.job_status is JobStatus.PENDING
    assert "stayed PENDING for 120 s" in event.message
    assert '"GPU": 4.0' in event.message
    assert 'the cluster has {"CPU": 8.0}' in event.message
    assert "The job was stopped" in event.message
    assert cursor_of(event).lines == 1
    assert "the cluster has unknown" in timeout.event(None, result.cursor).message


@pytest.mark.parametrize(
    "job, policy",
    [
        (info("PENDING", started_s_ago=30), WaitPolicy(pending_timeout_s=60)),
        (info("PENDING", started_s_ago=10_000), WaitPolicy(pending_timeout_s=None)),
        (info("RUNNING", started_s_ago=10_000), WaitPolicy(pending_timeout_s=60)),
        ({"status": "PENDING"}, WaitPolicy(pending_timeout_s=60)),  # no start time yet
    ],
)
def test_the_wait_goes_on(job, policy):
    result = step(policy, LogCursor(SID), Poll(job, NOW))
    assert result.event is None
    assert result.timeout is None


def test_requested_resources_from_metadata():
    assert requested_resources({"metadata": {META_RESOURCES: '{"GPU": 2.0}'}}) == {"GPU": 2.0}
    assert requested_resources({"metadata": {META_RESOURCES: "not json"}}) == {}
    assert requested_resources({"metadata": None}) == {} == requested_resources({})


def test_a_job_in_a_state_the_provider_does_not_know_ends_the_wait_with_an_error():
    written, result = run([(info("RUNNING"), ["a"], ["a"]), (info("DRAINING"), [], ["a"])])
    event = result.event
    assert written == ["a"]
    assert not event.succeeded
    assert event.job_status is None
    assert "Ray reported the job status 'DRAINING'" in event.message
    assert "Ray version" in event.message


def test_follow_ends_on_a_state_it_does_not_know_instead_of_waiting_for_ever():
    ray = FakeRay({SID: [job("RUNNING"), job("SUSPENDED")]})
    run = Run(ray)  # before the fix, the wait polled SUSPENDED for ever
    assert not run.event.succeeded
    assert "'SUSPENDED'" in run.event.message
