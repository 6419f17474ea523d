"""The wait: the policy (checked where it is made, travelling whole), the event it ends with, the
pure step (what one poll means: new log lines, the end, a timeout), and ``follow``, the one wait of
the trigger and the operator, against a stand-in for the Ray dashboard (``unit.fakes.FakeRay``)
whose job moves through scripted states while its log grows."""

import asyncio
import dataclasses
import json
import time
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_provider_horovod.contract import (
    ERROR_MARK,
    LOG_TAIL_LINES,
    META_MARK_TOKEN,
    META_RESOURCES,
    RESULT_MARK,
    JobStatus,
    marked,
)
from airflow_provider_horovod.exceptions import InvalidParameterError, RayClusterUnreachableError, RayJobError
from airflow_provider_horovod.failures import Failure, FailureClass
from airflow_provider_horovod.jobs import wait as wait_module
from airflow_provider_horovod.jobs.logs import LogCursor
from airflow_provider_horovod.jobs.wait import (
    FINISHING_POLL_S,
    FINISHING_S,
    Poll,
    Running,
    WaitPolicy,
    follow,
    requested_resources,
    step,
)
from unit.fakes import FakeRay

NOW = 1_800_000_000.0
SID = "ahp-dag-train-0123456789-a1"
TINY = 1e-6  # seconds between polls: as fast as the tests go


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
    assert event.succeeded and event.job_status is JobStatus.SUCCEEDED and event.log_tail == []
    assert cursor_of(event) == result.cursor
    assert (result.cursor.lines, result.cursor.tail) == (4, LogCursor(SID).advanced(["a", "b", "c", "d"]).tail)


def test_the_step_starts_from_the_cursor_it_is_given():
    earlier = LogCursor(SID).advanced(["a", "b"])
    result = step(WaitPolicy(), earlier, Poll(info("RUNNING"), NOW, ["c"]))
    assert result.lines == ["c"] and result.cursor.lines == 3
    assert result.cursor.tail == LogCursor(SID).advanced(["a", "b", "c"]).tail


def test_a_poll_without_new_lines_moves_nothing():
    cursor = LogCursor(SID).advanced(["a", "b", "c"])
    result = step(WaitPolicy(), cursor, Poll(info("RUNNING"), NOW))
    assert result.lines == [] and result.event is None and result.timeout is None
    assert (result.cursor.lines, result.cursor.tail) == (3, cursor.tail)


def test_a_missing_job_ends_the_wait_in_error():
    result = step(WaitPolicy(), LogCursor(SID).advanced(["a", "b"]), Poll(None, NOW))
    event = result.event
    assert not event.succeeded and event.job_status is None
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
    assert event.job_status is JobStatus.FAILED and event.error_type == "JOB_ENTRYPOINT_COMMAND_ERROR"
    assert event.log_tail == tail and event.message == "msg-FAILED"
    assert result.lines == ["line 99"] and cursor_of(event).lines == 1


@pytest.mark.parametrize("status", ["STOPPED", "FAILED", "SUCCEEDED"])
def test_every_terminal_state_ends_the_wait(status):
    result = step(
        WaitPolicy(pending_timeout_s=1),
        LogCursor(SID),
        Poll(info(status, started_s_ago=10_000), NOW, [], ["last words"]),
    )
    assert result.event is not None and result.timeout is None
    assert result.event.succeeded is (status == "SUCCEEDED")
    assert result.event.log_tail == ([] if status == "SUCCEEDED" else ["last words"])


def test_pending_past_the_timeout():
    asked = {"CPU": 2.0, "GPU": 4.0}
    job = info("PENDING", started_s_ago=120, metadata={META_RESOURCES: json.dumps(asked)})
    result = step(WaitPolicy(pending_timeout_s=60), LogCursor(SID), Poll(job, NOW, ["waiting"]))
    assert result.event is None and result.lines == ["waiting"]
    timeout = result.timeout
    assert (timeout.submission_id, timeout.status, timeout.asked) == (SID, "PENDING", asked)
    assert timeout.waited_s == pytest.approx(120)
    event = timeout.event({"CPU": 8.0}, result.cursor)
    assert not event.succeeded and event.job_status is JobStatus.PENDING
    assert "stayed PENDING for 120 s" in event.message and '"GPU": 4.0' in event.message
    assert 'the cluster has {"CPU": 8.0}' in event.message and "The job was stopped" in event.message
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
    assert result.event is None and result.timeout is None


def test_requested_resources_from_metadata():
    assert requested_resources({"metadata": {META_RESOURCES: '{"GPU": 2.0}'}}) == {"GPU": 2.0}
    assert requested_resources({"metadata": {META_RESOURCES: "not json"}}) == {}
    assert requested_resources({"metadata": None}) == {} == requested_resources({})


def test_a_job_in_a_state_the_provider_does_not_know_ends_the_wait_with_an_error():
    written, result = run([(info("RUNNING"), ["a"], ["a"]), (info("DRAINING"), [], ["a"])])
    event = result.event
    assert written == ["a"] and not event.succeeded and event.job_status is None
    assert "Ray reported the job status 'DRAINING'" in event.message and "Ray version" in event.message


def test_follow_ends_on_a_state_it_does_not_know_instead_of_waiting_for_ever():
    ray = FakeRay({SID: [job("RUNNING"), job("SUSPENDED")]})
    run = Run(ray)  # before the fix, the wait polled SUSPENDED for ever
    assert not run.event.succeeded and "'SUSPENDED'" in run.event.message


# --- the loop ---------------------------------------------------------------------------------------


def job(status, started_s_ago=0.0, **extra):
    return {
        "status": status,
        "message": f"msg-{status}",
        "start_time": (time.time() - started_s_ago) * 1000,
        "metadata": {},
        **extra,
    }


def drain(ray: FakeRay, cursor: LogCursor | None = None, **kwargs) -> tuple[Any, list[tuple[str, Any]]]:
    """``follow`` to its last update, taken as the operator and the trigger take it: each update's cursor
    (where it brings lines), then its lines. Its end, and what was saved and written, in order."""
    order: list[tuple[str, Any]] = []

    async def run():
        async for update in follow(ray, SID, cursor=cursor or LogCursor(SID), **kwargs):
            if update.lines:
                order.append(("save", update.cursor))
                order.extend(("write", line) for _, line in update.lines)
            if update.end is not None:
                return update.end
        raise AssertionError("follow ended without an end")

    return asyncio.run(run()), order


class Run:
    """One follow against ``ray`` to its end: what it gave to save and to write, in the order given."""

    def __init__(
        self,
        ray: FakeRay,
        *,
        cursor: LogCursor | None = None,
        policy: WaitPolicy = WaitPolicy(),
        stream_logs: bool = True,
    ):
        self.ray = ray
        self.event, self.order = drain(
            ray, cursor, policy=dataclasses.replace(policy, poll_interval_s=TINY), stream_logs=stream_logs
        )

    @property
    def written(self) -> list[str]:
        return [item for kind, item in self.order if kind == "write"]

    @property
    def streamed(self) -> list[str]:
        return [line[len("[ray] ") :] for line in self.written if line.startswith("[ray] ")]

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
    ray = FakeRay(
        {SID: [job("PENDING"), *[job("RUNNING")] * (len(logs) - 1), job("SUCCEEDED")]}, logs={SID: ["", *logs]}
    )
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
    ray = FakeRay(
        {SID: [job("RUNNING"), job("FAILED", error_type="JOB_ENTRYPOINT_COMMAND_ERROR")]},
        logs={SID: [numbered(30), text]},
    )
    run = Run(ray)
    event = run.event
    assert not event.succeeded and event.job_status is JobStatus.FAILED
    assert event.error_type == "JOB_ENTRYPOINT_COMMAND_ERROR" and event.message == "msg-FAILED"
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
    run = Run(ray, policy=WaitPolicy(pending_timeout_s=30))
    event = run.event
    assert not event.succeeded and event.job_status is JobStatus.PENDING
    assert "stayed PENDING for 90 s" in event.message and 'ask for {"GPU": 4.0}' in event.message
    assert 'the cluster has {"CPU": 8.0}' in event.message
    # One poll, the stop, then its status until Ray says it ended (the driver has kept its record by then).
    assert ray.stopped == [SID] and ray.calls[:4] == ["get_job_info", "stop_job", "get_job_info", "get_job_info"]
    assert ray.tail_reads == []


def test_pending_past_the_timeout_when_the_cluster_cannot_say_what_it_has():
    ray = FakeRay({SID: job("PENDING", started_s_ago=90)})

    async def unreachable():
        raise RayClusterUnreachableError("down")

    ray.a_get_cluster_resources = unreachable
    run = Run(ray, policy=WaitPolicy(pending_timeout_s=30))
    assert "the cluster has unknown" in run.event.message and ray.stopped == [SID]


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

    monkeypatch.setattr(wait_module.asyncio, "sleep", sleep)
    ray = FakeRay({SID: [job("PENDING"), job("RUNNING"), job("RUNNING"), job("SUCCEEDED")]})

    event, _ = drain(ray, policy=WaitPolicy(poll_interval_s=2.5))
    assert event.succeeded and slept == [2.5, 2.5, 2.5]


class Clock:
    """Time for follow: each of its sleeps moves the clock on instead of waiting."""

    def __init__(self, monkeypatch, start: float = 1_000_000.0):
        self.now = start
        monkeypatch.setattr(wait_module, "time", SimpleNamespace(time=lambda: self.now, monotonic=lambda: self.now))
        monkeypatch.setattr(wait_module.asyncio, "sleep", self.sleep)

    async def sleep(self, seconds: float) -> None:
        self.now += seconds


def follow_at(
    ray: FakeRay, interval: float, clock: Clock, policy: WaitPolicy = WaitPolicy(), written_at: dict | None = None
):
    """follow polling every ``interval`` (clock) seconds; the event, the streamed lines, and the
    clock at each log read (and, in ``written_at``, when each line was written)."""
    streamed, read_at = [], []
    seen = written_at if written_at is not None else {}
    real = ray.a_get_log_tail

    async def tail(*args):
        read_at.append(clock.now)
        return await real(*args)

    ray.a_get_log_tail = tail
    written_now = []

    async def run():
        async for update in follow(
            ray, SID, policy=dataclasses.replace(policy, poll_interval_s=interval), cursor=LogCursor(SID)
        ):
            for _, line in update.lines:
                streamed.append(line[len("[ray] ") :])
                seen.setdefault(line[len("[ray] ") :], clock.now)
            written_now.append(clock.now)
            if update.end is not None:
                return update.end

    return asyncio.run(run()), streamed, read_at


def test_a_quiet_log_is_read_at_every_poll_and_a_line_after_a_quiet_spell_arrives_at_the_next(monkeypatch):
    clock = Clock(monkeypatch)
    start = clock.now
    # Polls every 10 s: 3 polls of new lines, a quiet stretch of 40 polls with one line at poll 25,
    # then the job ends with one more line.
    logs = [numbered(3), numbered(6), numbered(9)] + [numbered(9)] * 22 + [numbered(10)] * 18 + [numbered(11)]
    ray = FakeRay({SID: [job("RUNNING")] * (len(logs) - 1) + [job("SUCCEEDED")]}, logs={SID: logs})
    written_at = {}
    event, streamed, read_at = follow_at(ray, 10.0, clock, written_at=written_at)
    assert event.succeeded and streamed == numbered(11).splitlines()  # each line once, the last at the end
    assert read_at == [start + poll * 10 for poll in range(len(logs))]
    assert written_at[numbered(10).splitlines()[-1]] == start + 25 * 10  # at the first poll after it came


def test_once_the_runtime_has_said_its_last_the_status_is_asked_every_tenth_of_a_second(monkeypatch):
    clock = Clock(monkeypatch)
    done = numbered(3) + f"{RESULT_MARK}{{}}\n"
    logs = [numbered(3)] * 5 + [done] * 12 + [done]
    ray = FakeRay({SID: [job("RUNNING")] * (len(logs) - 1) + [job("SUCCEEDED")]}, logs={SID: logs})
    asked_at = []
    real = ray.a_get_job_info

    async def info(sid, fresh_within_s=None):
        asked_at.append((clock.now, fresh_within_s))
        return await real(sid)

    ray.a_get_job_info = info
    event, streamed, read_at = follow_at(ray, 1.0, clock)
    gaps = [round(b[0] - a[0], 3) for a, b in zip(asked_at, asked_at[1:])]
    assert event.succeeded and streamed[-1].startswith(RESULT_MARK)
    # A poll interval apart until the line is read (at poll 6); a tenth of a second from then on, each
    # poll asking for the job's own info.
    seen = gaps.index(FINISHING_POLL_S)
    assert seen == 5 and gaps == [1.0] * seen + [FINISHING_POLL_S] * (len(gaps) - seen)
    assert {fresh for _, fresh in asked_at[: seen + 1]} == {0.5}
    assert {fresh for _, fresh in asked_at[seen + 1 :]} == {None}


def test_the_finishing_polls_last_at_most_finishing_s(monkeypatch):
    clock = Clock(monkeypatch)
    done = f"{RESULT_MARK}{{}}\n"
    polls = int(FINISHING_S / FINISHING_POLL_S) + 20
    ray = FakeRay({SID: [job("RUNNING")] * polls + [job("SUCCEEDED")]}, logs={SID: [done] * (polls + 1)})
    asked_at = []
    real = ray.a_get_job_info

    async def info(sid, fresh_within_s=None):
        asked_at.append(clock.now)
        return await real(sid)

    ray.a_get_job_info = info
    follow_at(ray, 1.0, clock)
    gaps = [round(b - a, 3) for a, b in zip(asked_at, asked_at[1:])]
    assert gaps[0] == FINISHING_POLL_S and gaps[-1] == 1.0  # back to the interval once FINISHING_S is over


def test_a_wait_given_seconds_says_the_job_still_runs_with_how_far_its_log_is(monkeypatch):
    clock = Clock(monkeypatch)
    start = clock.now
    ray = FakeRay({SID: [job("RUNNING")] * 100}, logs={SID: ["", "a\n", "a\nb\n"] + ["a\nb\n"] * 97})
    running, _ = drain(ray, policy=WaitPolicy(poll_interval_s=1.0), within_s=3.0)
    assert isinstance(running, Running)
    assert running.cursor.lines == 2
    assert running.cursor.submission_id == SID
    assert 3.0 <= clock.now - start < 4.0  # polled every 0.5 s until then
