"""``follow``, the one wait of the trigger and the operator, to its end: each line written once in
order with the cursor saved before it, the event a job ends with (its last lines, the reason only
the runtime's marked lines give), a pending timeout, a log that cannot be read, a restart."""

from __future__ import annotations

import pytest

from airflow_provider_horovod.contract import (
    ERROR_MARK,
    LOG_TAIL_LINES,
    META_MARK_TOKEN,
    META_RESOURCES,
    JobStatus,
    marked,
)
from airflow_provider_horovod.exceptions import RayClusterUnreachableError, RayJobError
from airflow_provider_horovod.failures import Failure, FailureClass
from airflow_provider_horovod.jobs.logs import LogCursor
from airflow_provider_horovod.jobs.wait import THREAD_LINES, WaitPolicy
from unit.fakes import FakeRay
from unit.jobs.following import SID, Run, growing, job, numbered


def test_lines_are_written_once_in_order_and_the_cursor_saved_before_each_batch():
    text = numbered(60) + "all reduce\n" * 100 + numbered(60) + "done, no newline"
    logs = growing(text, 25)
    ray = FakeRay(
        {SID: [job("PENDING"), *[job("RUNNING")] * (len(logs) - 1), job("SUCCEEDED")]}, logs={SID: ["", *logs]}
    )
    run = Run(ray)
    expected = text.split("\n")
    assert run.streamed == expected
    assert run.written == [f"[ray] {line}" for line in expected]
    # Each batch: its cursor saved first (counting the batch), then its lines; nothing saved for no line.
    written = saved = 0
    for kind, item in run.order:
        if kind == "save":
            assert item.lines > written
            saved = item.lines
        else:
            written += 1
            assert written <= saved
    assert [cursor.lines for cursor in run.saved] == sorted({cursor.lines for cursor in run.saved})
    assert run.saved[-1].lines == len(expected)
    event = run.event
    assert event.succeeded
    assert event.job_status is JobStatus.SUCCEEDED
    assert event.log_tail == []
    assert LogCursor.from_dict(event.log_cursor, SID) == run.saved[-1]
    assert "get_job_logs" not in ray.calls  # the windows sufficed: the whole log was never read
    assert max(lines for _, lines in ray.tail_reads) <= 1024


def test_a_poll_of_thousands_of_lines_writes_them_in_order_with_rays_own_folded():
    # Sorted in a worker thread (THREAD_LINES), as the few lines of an ordinary poll are in the loop.
    ray_warning = "[2026-11-24 11:50:03,428 W 1 2] Ray's own warning"
    text = numbered(THREAD_LINES) + ray_warning + "\n" + numbered(THREAD_LINES)
    ray = FakeRay({SID: [job("RUNNING"), job("SUCCEEDED")]}, logs={SID: [text, text]})
    run = Run(ray)
    lines = text.splitlines()
    assert run.streamed == lines
    assert run.written.index("::group::Ray's own output") == THREAD_LINES
    assert run.written[THREAD_LINES + 2] == "::endgroup::"


def test_a_failed_job_ends_with_its_last_lines():
    text = numbered(100) + "Traceback (most recent call last):\nValueError: nan loss\n"
    ray = FakeRay(
        {SID: [job("RUNNING"), job("FAILED", error_type="JOB_ENTRYPOINT_COMMAND_ERROR")]},
        logs={SID: [numbered(30), text]},
    )
    run = Run(ray)
    event = run.event
    assert not event.succeeded
    assert event.job_status is JobStatus.FAILED
    assert event.error_type == "JOB_ENTRYPOINT_COMMAND_ERROR"
    assert event.message == "msg-FAILED"
    assert event.log_tail == text.split("\n")[:-1][-LOG_TAIL_LINES:]
    assert event.log_tail[-1] == "ValueError: nan loss"
    assert run.streamed == text.split("\n")[:-1]


def spoofed_and_real_marks(token: str) -> str:
    """A failed job's log: a user's lines carrying the bare marks (one printed on a worker, one from the
    driver), and the runtime's own, marked with its attempt's ``token``, between them."""
    fake = Failure(FailureClass.INFRASTRUCTURE, "lost a node, honestly").line()
    real = Failure(FailureClass.USER_CODE, "ValueError: nan loss")
    return (
        "(RayTrainWorker pid=7) AHP_ERROR infrastructure: not my fault\n"
        f"(RayTrainWorker pid=7) {fake}\n"
        f"{marked(ERROR_MARK, token)}user_code: ValueError: nan loss\n"
        f"{real.line(token)}\n"
        "AHP_ERROR preemption: printed after the runtime's, by the user's atexit hook\n"
        f"{fake}\n"
    )


def test_only_the_runtimes_marked_lines_decide_a_failures_reason_and_class():
    token = "0123456789abcdef"
    metadata = {META_MARK_TOKEN: token}
    text = spoofed_and_real_marks(token)
    ray = FakeRay({SID: [job("RUNNING", metadata=metadata), job("FAILED", metadata=metadata)]}, logs={SID: ["", text]})
    event = Run(ray).event
    assert event.reason == "user_code: ValueError: nan loss"
    assert event.failure["failure_class"] == "user_code"
    assert event.failure["summary"] == "ValueError: nan loss"


def test_a_line_copied_from_another_attempts_log_is_not_this_attempts():
    metadata = {META_MARK_TOKEN: "fedcba9876543210"}
    text = spoofed_and_real_marks("0123456789abcdef")  # the other attempt's token
    ray = FakeRay({SID: [job("FAILED", metadata=metadata)]}, logs={SID: [text]})
    event = Run(ray).event
    assert (event.reason, event.failure) == ("", {})


def test_the_bare_marks_of_a_job_without_a_token_are_read_an_older_providers_job():
    text = "epoch 1\nAHP_ERROR user_code: ValueError: nan loss\n" + Failure(FailureClass.USER_CODE, "x").line() + "\n"
    ray = FakeRay({SID: [job("FAILED")]}, logs={SID: [text]})
    event = Run(ray).event
    assert event.reason == "user_code: ValueError: nan loss"
    assert event.failure["failure_class"] == "user_code"


def test_pending_past_the_timeout_stops_the_job():
    ray = FakeRay(
        {SID: job("PENDING", started_s_ago=90, metadata={META_RESOURCES: '{"GPU": 4.0}'})}, cluster={"CPU": 8.0}
    )
    seen = []
    real = ray.a_get_job_info

    async def info(sid, fresh_within_s=None):
        got = await real(sid)
        seen.append(got["status"])
        return got

    ray.a_get_job_info = info
    run = Run(ray, policy=WaitPolicy(pending_timeout_s=30))
    event = run.event
    assert not event.succeeded
    assert event.job_status is JobStatus.PENDING
    assert "stayed PENDING for 90 s" in event.message
    assert 'ask for {"GPU": 4.0}' in event.message
    assert 'the cluster has {"CPU": 8.0}' in event.message
    # Stopped once, and waited for until Ray said it ended (the driver has kept its record by then).
    assert ray.stopped == [SID]
    assert seen[-1] == "STOPPED"
    assert ray.tail_reads == []


def test_pending_past_the_timeout_when_the_cluster_cannot_say_what_it_has():
    ray = FakeRay({SID: job("PENDING", started_s_ago=90)})

    async def unreachable():
        raise RayClusterUnreachableError("down")

    ray.a_get_cluster_resources = unreachable
    run = Run(ray, policy=WaitPolicy(pending_timeout_s=30))
    assert "the cluster has unknown" in run.event.message
    assert ray.stopped == [SID]


def test_a_log_that_cannot_be_read_is_said_once_and_read_whole_at_the_end():
    final = numbered(120) + "RuntimeError: boom\n"
    logs = [numbered(10), numbered(40), numbered(80), numbered(100), final]
    ray = FakeRay({SID: [*[job("RUNNING")] * 4, job("FAILED")]}, logs={SID: logs})
    real = ray.a_get_log_tail

    async def node_gone(node_id, submission_id, lines):
        if ray.calls.count("get_job_info") >= 2:
            raise RayJobError("Ray dashboard log read failed: HTTP 500: node is dead")
        return await real(node_id, submission_id, lines)

    ray.a_get_log_tail = node_gone
    run = Run(ray)
    gaps = [line for line in run.written if not line.startswith("[ray] ")]
    assert gaps == [
        "The job's log cannot be read from line 11 on (Ray dashboard log read failed: HTTP 500: node is "
        "dead); its rest is read once the job ends."
    ]
    assert run.streamed == final.split("\n")[:-1]  # the first 10 from windows, the rest from the whole log
    assert ray.calls.count("get_job_logs") == 1
    assert len(ray.tail_reads) == 1  # not tried again after the gap
    assert run.order.index(("write", gaps[0])) < run.order.index(("write", "[ray] epoch 10: loss 0.0909"))
    assert run.event.log_tail == final.split("\n")[:-1][-LOG_TAIL_LINES:]
    assert LogCursor.from_dict(run.event.log_cursor, SID).lines == 121


def test_a_log_that_cannot_be_read_at_all():
    ray = FakeRay({SID: [job("RUNNING"), job("SUCCEEDED")]}, logs={SID: ["a\n", "a\nb\n"]})

    async def refused(*args):
        raise RayJobError("HTTP 500: no")

    ray.a_get_log_tail = refused
    ray.a_get_job_logs = lambda sid: refused()
    run = Run(ray)
    assert run.written == [
        "The job's log cannot be read from line 1 on (HTTP 500: no); its rest is read once the job ends.",
        "The job's log from line 1 on cannot be read: HTTP 500: no",
    ]
    assert run.event.succeeded
    assert {cursor.lines for cursor in run.saved} == {0}  # nothing of the log counted


def test_a_truncated_log_is_a_gap_too():
    ray = FakeRay(
        {SID: [job("RUNNING"), job("RUNNING"), job("SUCCEEDED")]},
        logs={SID: [numbered(50), "rotated\n", "rotated\nmore\n"]},
    )
    run = Run(ray)
    assert run.streamed == numbered(50).split("\n")[:-1]
    (gap,) = [line for line in run.written if not line.startswith("[ray] ")]
    assert gap.startswith(
        "The job's log cannot be read from line 51 on (the log is shorter (1 lines) than what "
        "was already streamed (50 lines)"
    )
    assert ray.calls.count("get_job_logs") == 1


def test_a_restart_continues_after_the_cursor():
    text = numbered(10)
    lines = text.split("\n")[:-1]
    ray = FakeRay({SID: job("SUCCEEDED")}, logs={SID: text})
    run = Run(ray, cursor=LogCursor(SID).advanced(lines[:6]))
    assert run.streamed == lines[6:]
    assert LogCursor.from_dict(run.event.log_cursor, SID).lines == 10


@pytest.mark.parametrize("status, reads", [("SUCCEEDED", 0), ("FAILED", 1), ("STOPPED", 1)])
def test_without_streaming_nothing_is_written_and_a_failure_still_has_its_tail(status, reads):
    text = numbered(100) + "last words"
    ray = FakeRay({SID: [job("RUNNING"), job("RUNNING"), job(status)]}, logs={SID: text})
    run = Run(ray, stream_logs=False)
    assert run.order == []
    assert ray.tail_reads == [(SID, LOG_TAIL_LINES)] * reads
    assert "get_job_logs" not in ray.calls
    assert run.event.log_tail == ([] if status == "SUCCEEDED" else text.split("\n")[-LOG_TAIL_LINES:])
    assert LogCursor.from_dict(run.event.log_cursor, SID).lines == 0


def test_a_missing_job_ends_in_an_error_event():
    ray = FakeRay()
    run = Run(ray)
    assert not run.event.succeeded
    assert f"Ray job {SID} does not exist" in run.event.message
    assert run.order == []
    assert ray.tail_reads == []
