"""The wait step: what one poll means (new log lines, the end, a timeout), without any I/O."""

import json

import pytest

from airflow_provider_horovod.jobs.logs import LogCursor
from airflow_provider_horovod.jobs.protocol import LOG_TAIL_LINES, META_RESOURCES, JobStatus
from airflow_provider_horovod.jobs.wait import Poll, WaitPolicy, needs_log, requested_resources, step

NOW = 1_800_000_000.0


def info(status, *, started_s_ago=0.0, **extra):
    return {"status": status, "start_time": (NOW - started_s_ago) * 1000, "message": f"msg-{status}", **extra}


def run(polls, policy=WaitPolicy(), sid="sid"):
    """Every poll through step: the lines streamed, and the last step."""
    cursor, streamed, result = LogCursor(sid), [], None
    for job_info, log in polls:
        result = step(policy, cursor, Poll(job_info, log, NOW))
        streamed += result.lines
        cursor = result.cursor
        if result.done:
            break
    return streamed, result


def test_lines_are_streamed_once_and_the_unterminated_one_at_the_end():
    streamed, result = run([
        (info("PENDING"), ""),
        (info("RUNNING"), "a\nb"),
        (info("RUNNING"), "a\nb\nc\n"),
        (info("RUNNING"), "a\nb\nc\n"),
        (info("SUCCEEDED"), "a\nb\nc\nd"),
    ])
    assert streamed == ["a", "b", "c", "d"]
    assert result.event.succeeded and result.event.log_tail == []
    assert result.event.log_cursor == {"submission_id": "sid", "lines": 4}


def test_runs_of_identical_lines():
    streamed, _ = run([(info("RUNNING"), "epoch\nepoch\n"), (info("RUNNING"), "epoch\nepoch\nepoch\nepoch"),
                       (info("FAILED"), "epoch\nepoch\nepoch\nepoch\n")])
    assert streamed == ["epoch"] * 4


def test_a_poll_without_the_log_moves_nothing():
    result = step(WaitPolicy(), LogCursor("sid", 3), Poll(info("RUNNING"), None, NOW))
    assert result.lines == [] and result.cursor == LogCursor("sid", 3) and not result.done


def test_a_missing_job_ends_the_wait_in_error():
    result = step(WaitPolicy(), LogCursor("sid", 2), Poll(None, None, NOW))
    assert result.done and not result.event.succeeded and result.event.job_status is None
    assert "Ray job sid does not exist" in result.event.message
    assert result.event.log_cursor == {"submission_id": "sid", "lines": 2}


def test_a_failure_carries_the_tail_of_the_log():
    log = "".join(f"line {i}\n" for i in range(100))
    result = step(WaitPolicy(), LogCursor("sid"), Poll(info("FAILED", error_type="JOB_ENTRYPOINT_COMMAND_ERROR"),
                                                      log, NOW))
    event = result.event
    assert event.job_status is JobStatus.FAILED and event.error_type == "JOB_ENTRYPOINT_COMMAND_ERROR"
    assert event.log_tail == [f"line {i}" for i in range(100 - LOG_TAIL_LINES, 100)]
    assert event.message == "msg-FAILED" and len(result.lines) == 100


@pytest.mark.parametrize("status", ["STOPPED", "FAILED", "SUCCEEDED"])
def test_every_terminal_state_ends_the_wait(status):
    result = step(WaitPolicy(pending_timeout_s=1), LogCursor("sid"),
                  Poll(info(status, started_s_ago=10_000), "", NOW))
    assert result.event is not None and result.timeout is None
    assert result.event.succeeded is (status == "SUCCEEDED")


def test_pending_past_the_timeout():
    asked = {"CPU": 2.0, "GPU": 4.0}
    job = info("PENDING", started_s_ago=120, metadata={META_RESOURCES: json.dumps(asked)})
    result = step(WaitPolicy(pending_timeout_s=60), LogCursor("sid"), Poll(job, "waiting\n", NOW))
    assert result.done and result.event is None and result.lines == ["waiting"]
    timeout = result.timeout
    assert (timeout.submission_id, timeout.status, timeout.asked) == ("sid", "PENDING", asked)
    assert timeout.waited_s == pytest.approx(120)
    event = timeout.event({"CPU": 8.0}, result.cursor)
    assert not event.succeeded and event.job_status is JobStatus.PENDING
    assert "stayed PENDING for 120 s" in event.message and '"GPU": 4.0' in event.message
    assert 'the cluster has {"CPU": 8.0}' in event.message and "The job was stopped" in event.message
    assert event.log_cursor == {"submission_id": "sid", "lines": 1}
    assert "the cluster has unknown" in timeout.event(None, result.cursor).message


@pytest.mark.parametrize("job, policy", [
    (info("PENDING", started_s_ago=30), WaitPolicy(pending_timeout_s=60)),
    (info("PENDING", started_s_ago=10_000), WaitPolicy(pending_timeout_s=None)),
    (info("RUNNING", started_s_ago=10_000), WaitPolicy(pending_timeout_s=60)),
    ({"status": "PENDING"}, WaitPolicy(pending_timeout_s=60)),  # no start time yet
])
def test_no_timeout(job, policy):
    assert not step(policy, LogCursor("sid"), Poll(job, "", NOW)).done


def test_requested_resources_from_metadata():
    assert requested_resources({"metadata": {META_RESOURCES: '{"GPU": 2.0}'}}) == {"GPU": 2.0}
    assert requested_resources({"metadata": {META_RESOURCES: "not json"}}) == {}
    assert requested_resources({"metadata": None}) == {} == requested_resources({})


@pytest.mark.parametrize("job, streaming, needed", [
    (None, True, False),
    ({"status": "RUNNING"}, True, True),
    ({"status": "RUNNING"}, False, False),
    ({"status": "PENDING"}, False, False),
    ({"status": "FAILED"}, False, True),
    ({"status": "SUCCEEDED"}, False, True),
    ({"status": "WEIRD"}, False, False),
])
def test_needs_log(job, streaming, needed):
    assert needs_log(job, streaming) is needed
