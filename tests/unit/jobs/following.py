"""A job followed to its end as the operator and the trigger take ``follow``'s updates, against a
stand-in for the Ray dashboard (``unit.fakes.FakeRay``) whose job moves through scripted states while
its log grows. Shared by test_wait_follow.py and test_wait_timing.py."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

from airflow_provider_horovod.jobs.logs import LogCursor
from airflow_provider_horovod.jobs.wait import WaitPolicy, follow
from unit.fakes import FakeRay

SID = "ahp-dag-train-0123456789-a1"
TINY = 1e-6  # seconds between polls: as fast as the tests go


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
