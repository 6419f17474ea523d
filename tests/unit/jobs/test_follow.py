"""follow_job: the one wait of the trigger and the operator, against a stand-in for the Ray dashboard
(``unit.fakes.FakeRay``) whose job moves through scripted states while its log grows."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from airflow_provider_horovod.exceptions import RayClusterUnreachableError, RayJobError
from airflow_provider_horovod.jobs import follow as follow_module
from airflow_provider_horovod.jobs.follow import follow_job
from airflow_provider_horovod.jobs.logs import LogCursor
from airflow_provider_horovod.jobs.protocol import LOG_TAIL_LINES, META_RESOURCES, JobStatus
from airflow_provider_horovod.jobs.wait import WaitPolicy
from unit.fakes import FakeRay

SID = "ahp-dag-train-0123456789-a1"


def job(status, started_s_ago=0.0, **extra):
    return {"status": status, "message": f"msg-{status}", "start_time": (time.time() - started_s_ago) * 1000,
            "metadata": {}, **extra}


class Run:
    """One follow_job against ``ray``: what it wrote and saved, in the order it did."""

    def __init__(self, ray: FakeRay, *, cursor: LogCursor | None = None, policy: WaitPolicy = WaitPolicy(),
                 stream_logs: bool = True, stopped=lambda: False):
        self.ray, self.order = ray, []

        async def save(latest: LogCursor) -> None:
            self.order.append(("save", latest))

        self.event = asyncio.run(follow_job(
            ray, SID, policy=policy, cursor=cursor or LogCursor(SID), poll_interval_s=0,
            write=lambda line: self.order.append(("write", line)), save_cursor=save, stream_logs=stream_logs,
            stopped=stopped))

    @property
    def written(self) -> list[str]:
        return [item for kind, item in self.order if kind == "write"]

    @property
    def streamed(self) -> list[str]:
        return [line[len("[ray] "):] for line in self.written if line.startswith("[ray] ")]

    @property
    def saved(self) -> list[LogCursor]:
        return [item for kind, item in self.order if kind == "save"]


def growing(text: str, polls: int) -> list[str]:
    """The log as ``polls`` polls see it, cut anywhere (mid-line too), then whole."""
    step = max(1, len(text) // polls)
    return [text[:cut] for cut in range(0, len(text), step)] + [text]


def numbered(count: int) -> str:
    return "".join(f"epoch {i}: loss {1 / (i + 1):.4f}\n" for i in range(count))


def test_lines_are_written_once_in_order_and_the_cursor_saved_before_each_batch():
    text = numbered(60) + "all reduce\n" * 100 + numbered(60) + "done, no newline"
    logs = growing(text, 25)
    ray = FakeRay({SID: [job("PENDING"), *[job("RUNNING")] * (len(logs) - 1), job("SUCCEEDED")]},
                  logs={SID: ["", *logs]})
    run = Run(ray)
    expected = text.split("\n")
    assert run.streamed == expected and run.written == [f"[ray] {line}" for line in expected]
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
    assert event.succeeded and event.job_status is JobStatus.SUCCEEDED and event.log_tail == []
    assert LogCursor.from_dict(event.log_cursor, SID) == run.saved[-1]
    assert "get_job_logs" not in ray.calls  # the windows sufficed: the whole log was never read
    assert max(lines for _, lines in ray.tail_reads) <= 1024


def test_a_failed_job_ends_with_its_last_lines():
    text = numbered(100) + "Traceback (most recent call last):\nValueError: nan loss\n"
    ray = FakeRay({SID: [job("RUNNING"), job("FAILED", error_type="JOB_ENTRYPOINT_COMMAND_ERROR")]},
                  logs={SID: [numbered(30), text]})
    run = Run(ray)
    event = run.event
    assert not event.succeeded and event.job_status is JobStatus.FAILED
    assert event.error_type == "JOB_ENTRYPOINT_COMMAND_ERROR" and event.message == "msg-FAILED"
    assert event.log_tail == text.split("\n")[:-1][-LOG_TAIL_LINES:]
    assert event.log_tail[-1] == "ValueError: nan loss"
    assert run.streamed == text.split("\n")[:-1]


def test_pending_past_the_timeout_stops_the_job():
    ray = FakeRay({SID: job("PENDING", started_s_ago=90, metadata={META_RESOURCES: '{"GPU": 4.0}'})},
                  cluster={"CPU": 8.0})
    run = Run(ray, policy=WaitPolicy(pending_timeout_s=30))
    event = run.event
    assert not event.succeeded and event.job_status is JobStatus.PENDING
    assert "stayed PENDING for 90 s" in event.message and 'ask for {"GPU": 4.0}' in event.message
    assert 'the cluster has {"CPU": 8.0}' in event.message
    assert ray.stopped == [SID] and ray.calls.count("get_job_info") == 1 and ray.tail_reads == []


def test_pending_past_the_timeout_when_the_cluster_cannot_say_what_it_has():
    ray = FakeRay({SID: job("PENDING", started_s_ago=90)})

    async def unreachable():
        raise RayClusterUnreachableError("down")

    ray.a_get_cluster_resources = unreachable
    run = Run(ray, policy=WaitPolicy(pending_timeout_s=30))
    assert "the cluster has unknown" in run.event.message and ray.stopped == [SID]


def test_a_killed_task_raises_after_writing_what_came():
    polls = []
    ray = FakeRay({SID: job("RUNNING")}, logs={SID: ["a\n", "a\nb\n", "a\nb\nc\n"]})

    def stopped():
        polls.append(1)
        return len(polls) >= 2

    with pytest.raises(RayJobError, match=f"Task killed; Ray job {SID} was stopped") as err:
        Run(ray, stopped=stopped)
    assert err.value.status == "STOPPED" and err.value.submission_id == SID
    assert ray.calls.count("get_job_info") == 2 and ray.stopped == []  # on_kill stops it, not the wait


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
    assert gaps == ["The job's log cannot be read from line 11 on (Ray dashboard log read failed: HTTP 500: node is "
                    "dead); its rest is read once the job ends."]
    assert run.streamed == final.split("\n")[:-1]  # the first 10 from windows, the rest from the whole log
    assert ray.calls.count("get_job_logs") == 1 and len(ray.tail_reads) == 1  # not tried again after the gap
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
        "The job's log from line 1 on cannot be read: HTTP 500: no"]
    assert run.event.succeeded and run.saved == []


def test_a_truncated_log_is_a_gap_too():
    ray = FakeRay({SID: [job("RUNNING"), job("RUNNING"), job("SUCCEEDED")]},
                  logs={SID: [numbered(50), "rotated\n", "rotated\nmore\n"]})
    run = Run(ray)
    assert run.streamed == numbered(50).split("\n")[:-1]
    (gap,) = [line for line in run.written if not line.startswith("[ray] ")]
    assert gap.startswith("The job's log cannot be read from line 51 on (the log is shorter (1 lines) than what "
                          "was already streamed (50 lines)")
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
    assert ray.tail_reads == [(SID, LOG_TAIL_LINES)] * reads and "get_job_logs" not in ray.calls
    assert run.event.log_tail == ([] if status == "SUCCEEDED" else text.split("\n")[-LOG_TAIL_LINES:])
    assert LogCursor.from_dict(run.event.log_cursor, SID).lines == 0


def test_a_missing_job_ends_in_an_error_event():
    ray = FakeRay()
    run = Run(ray)
    assert not run.event.succeeded and f"Ray job {SID} does not exist" in run.event.message
    assert run.order == [] and ray.tail_reads == []


def test_it_sleeps_the_poll_interval_between_polls(monkeypatch):
    slept = []

    async def sleep(seconds):
        slept.append(seconds)

    monkeypatch.setattr(follow_module.asyncio, "sleep", sleep)
    ray = FakeRay({SID: [job("PENDING"), job("RUNNING"), job("RUNNING"), job("SUCCEEDED")]})

    async def save(cursor):
        pass

    event = asyncio.run(follow_job(ray, SID, policy=WaitPolicy(), cursor=LogCursor(SID), poll_interval_s=2.5,
                                   write=print, save_cursor=save))
    assert event.succeeded and slept == [2.5, 2.5, 2.5]


class Clock:
    """Time for follow_job: each of its sleeps moves the clock on instead of waiting."""

    def __init__(self, monkeypatch, start: float = 1_000_000.0):
        self.now = start
        monkeypatch.setattr(follow_module, "time", SimpleNamespace(time=lambda: self.now))
        monkeypatch.setattr(follow_module.asyncio, "sleep", self.sleep)

    async def sleep(self, seconds: float) -> None:
        self.now += seconds


def follow_at(ray: FakeRay, interval: float, clock: Clock, policy: WaitPolicy = WaitPolicy()):
    """follow_job polling every ``interval`` (clock) seconds; the event, the streamed lines, and the
    clock at each log read."""
    streamed, read_at = [], []
    real = ray.a_get_log_tail

    async def tail(*args):
        read_at.append(clock.now)
        return await real(*args)

    ray.a_get_log_tail = tail

    async def save(cursor):
        pass

    event = asyncio.run(follow_job(ray, SID, policy=policy, cursor=LogCursor(SID), poll_interval_s=interval,
                                   write=lambda line: streamed.append(line[len("[ray] "):]), save_cursor=save))
    return event, streamed, read_at


def test_a_quiet_log_is_read_less_often_and_every_line_still_arrives(monkeypatch):
    clock = Clock(monkeypatch)
    start = clock.now
    # Polls every 10 s: 3 polls of new lines, a quiet stretch of 40 polls with one line at poll 25,
    # then the job ends with one more line.
    logs = [numbered(3), numbered(6), numbered(9)] + [numbered(9)] * 22 + [numbered(10)] * 18 + [numbered(11)]
    ray = FakeRay({SID: [job("RUNNING")] * (len(logs) - 1) + [job("SUCCEEDED")]}, logs={SID: logs})
    event, streamed, read_at = follow_at(ray, 10.0, clock)
    assert event.succeeded and streamed == numbered(11).splitlines()  # each line once, the last at the end
    polls = len(logs)
    assert len(read_at) < polls / 2
    gaps = [round(b - a) for a, b in zip(read_at, read_at[1:])]
    # Every poll while lines come; then 10, 20, 40, 60, 60 ... s apart (6 polls at most, longer than
    # 30 s); every poll again after a line.
    assert gaps[:7] == [10, 10, 10, 10, 20, 40, 60] and max(gaps) == longest_quiet_read(10.0) == 60
    line_at = start + 25 * 10  # the poll that first could see the line "epoch 9"
    seen_at = min(t for t in read_at if t >= line_at)
    assert seen_at - line_at <= longest_quiet_read(10.0)
    assert read_at[read_at.index(seen_at) + 1] - seen_at == 10  # read at the next poll again
    assert read_at[-1] == start + (polls - 1) * 10  # and at the end, whatever the schedule said


def test_a_quiet_log_is_read_before_a_stall_is_called(monkeypatch):
    clock = Clock(monkeypatch)
    # A line every 30 s, within a 25 s stall timeout but not within the quiet log's read delay
    # (reads 10, then 20 s apart): the log is read before a stall is called.
    logs = [numbered(1 + poll // 3) for poll in range(30)]
    ray = FakeRay({SID: [job("RUNNING")] * 29 + [job("SUCCEEDED")]}, logs={SID: logs})
    event, streamed, read_at = follow_at(ray, 10.0, clock, WaitPolicy(stall_timeout_s=25))
    assert event.succeeded and streamed == numbered(10).splitlines() and ray.stopped == []


def longest_quiet_read(poll_interval_s: float) -> float:
    from airflow_provider_horovod.hooks.ray_logs import QUIET_READ_POLLS, QUIET_READ_S

    return max(QUIET_READ_S, QUIET_READ_POLLS * poll_interval_s)


def test_at_a_short_poll_interval_a_quiet_log_is_read_every_30_s_at_most(monkeypatch):
    clock = Clock(monkeypatch)
    logs = [numbered(3)] + [numbered(3)] * 200 + [numbered(4)]
    ray = FakeRay({SID: [job("RUNNING")] * (len(logs) - 1) + [job("SUCCEEDED")]}, logs={SID: logs})
    event, streamed, read_at = follow_at(ray, 1.0, clock)
    gaps = [round(b - a) for a, b in zip(read_at, read_at[1:])]
    assert event.succeeded and streamed == numbered(4).splitlines()
    assert gaps[:7] == [1, 1, 2, 4, 8, 16, 30] and max(gaps) == longest_quiet_read(1.0) == 30
