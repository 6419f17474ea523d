"""``follow's`` timing on a clock the test moves: the poll interval between polls, a quiet log read at
every poll, the tenth-of-a-second polls once the runtime has said its last (for at most
``FINISHING_S``), and a wait given seconds that returns the job still running."""

from __future__ import annotations

import asyncio
import dataclasses
from types import SimpleNamespace

from airflow_provider_horovod.contract import RESULT_MARK
from airflow_provider_horovod.jobs import wait as wait_module
from airflow_provider_horovod.jobs.logs import LogCursor
from airflow_provider_horovod.jobs.wait import FINISHING_POLL_S, FINISHING_S, Running, WaitPolicy, follow
from unit.fakes import FakeRay
from unit.jobs.following import SID, drain, job, numbered


def test_it_sleeps_the_poll_interval_between_polls(monkeypatch):
    slept = []

    async def sleep(seconds):
        slept.append(seconds)

    monkeypatch.setattr(wait_module.asyncio, "sleep", sleep)
    ray = FakeRay({SID: [job("PENDING"), job("RUNNING"), job("RUNNING"), job("SUCCEEDED")]})

    event, _ = drain(ray, policy=WaitPolicy(poll_interval_s=2.5))
    assert event.succeeded
    assert slept == [2.5, 2.5, 2.5]


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
    assert event.succeeded
    assert streamed == numbered(11).splitlines()  # each line once, the last at the end
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
    assert event.succeeded
    assert streamed[-1].startswith(RESULT_MARK)
    # A poll interval apart until the line is read (at poll 6); a tenth of a second from then on, each
    # poll asking for the job's own info.
    seen = gaps.index(FINISHING_POLL_S)
    assert seen == 5
    assert gaps == [1.0] * seen + [FINISHING_POLL_S] * (len(gaps) - seen)
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
    assert gaps[0] == FINISHING_POLL_S
    assert gaps[-1] == 1.0  # back to the interval once FINISHING_S is over


def test_a_wait_given_seconds_says_the_job_still_runs_with_how_far_its_log_is(monkeypatch):
    clock = Clock(monkeypatch)
    start = clock.now
    ray = FakeRay({SID: [job("RUNNING")] * 100}, logs={SID: ["", "a\n", "a\nb\n"] + ["a\nb\n"] * 97})
    asked_at, real = [], ray.a_get_job_info

    async def info(*args, **kwargs):
        asked_at.append(clock.now - start)
        return await real(*args, **kwargs)

    ray.a_get_job_info = info
    running, _ = drain(ray, policy=WaitPolicy(poll_interval_s=1.0), within_s=3.0)
    assert isinstance(running, Running)
    assert running.cursor.lines == 2
    assert running.cursor.submission_id == SID
    # Polled at the interval until then, no faster: each poll costs the dashboard CPU beside the ranks.
    assert asked_at == [0.0, 1.0, 2.0, 3.0]
