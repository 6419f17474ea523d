"""What a task run's attempts cost, reckoned once here from what the resources held and when: Ray's
own timestamps of each job (submitted, ended), the starts of its worker groups (rank 0 records each,
``WORKER_GROUPS_FILE``; an elastic run's ``segments`` in the record win), what one worker holds, and,
when given, the prices per CPU-hour and GPU-hour. Failed attempts count as much as the one that
succeeded, marked ``failed``. Pure: the finish step reads the inputs and keeps the answer in XCom,
the attempt's record and the task log.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from airflow_provider_horovod.documents import AttemptCost, Cost

# The figures that add up over attempts.
SUMMED = ("wall_s", "queued_s", "held_s", "worker_s", "cpu_s", "gpu_s")


def segments_of(
    starts: Sequence[Mapping[str, Any]], end: float | None, not_before: float | None = None
) -> list[dict[str, Any]]:
    """Worker groups as intervals: each holds its ``world_size`` workers from its start (``not_before`` at
    the earliest) until its own end when it names one, else until the next one starts, the last until
    ``end`` (an elastic run's segments, or the restarts after a lost worker). A start is ``started_at``
    (or ``start_time``), in seconds."""

    def begin_of(group: Mapping[str, Any]) -> float | None:
        begin = _first(group.get("started_at"), group.get("start_time"))
        return max(begin, not_before) if begin is not None and not_before is not None else begin

    ordered = sorted((g for g in starts if begin_of(g) is not None), key=lambda g: begin_of(g) or 0.0)
    found = []
    for index, group in enumerate(ordered):
        begin = begin_of(group) or 0.0
        following = begin_of(ordered[index + 1]) if index + 1 < len(ordered) else end
        stop = _first(group.get("ended_at"), group.get("end_time"), following)
        found.append(
            {
                **group,
                "started_at": begin,
                "ended_at": max(begin, stop) if stop is not None else begin,
                "world_size": int(group.get("world_size") or 0),
            }
        )
    return found


def amount(cpu_s: float, gpu_s: float, prices: Mapping[str, Any] | None) -> float | None:
    """The price of the CPU- and GPU-seconds (None without prices)."""
    if not prices:
        return None
    due = cpu_s / 3600 * float(prices.get("cpu_hour") or 0) + gpu_s / 3600 * float(prices.get("gpu_hour") or 0)
    return round(due, 6)


def attempt_cost(
    record: Mapping[str, Any],
    *,
    failed: bool,
    submitted_at: float | None,
    ended_at: float | None,
    worker_groups: Sequence[Mapping[str, Any]],
    per_worker: Mapping[str, float],
    prices: Mapping[str, Any] | None,
) -> AttemptCost:
    """One attempt's cost. ``record``: its result record as JSON (``timings``: when its driver started and
    finished; ``segments`` of an elastic run). ``submitted_at``/``ended_at``: Ray's job start and end times,
    in seconds (None where unknown: the driver's own times stand in). ``worker_groups``: ``{"started_at",
    "world_size"}`` per start of its worker group."""
    timings = record.get("timings") or {}
    submitted = _first(submitted_at, timings.get("started_at"))
    ended = _first(ended_at, timings.get("finished_at"))
    # The workers stop when the driver's fit() returns or raises: the driver's own end, else the job's;
    # none holds anything before the driver starts (or its fit(), where the record says when that began).
    workers_end = _first(timings.get("finished_at"), ended)
    fit_started = workers_end - float(timings["fit_s"]) if workers_end is not None and timings.get("fit_s") else None
    segments = segments_of(
        list(record.get("segments") or worker_groups),
        workers_end,
        not_before=_first(fit_started, timings.get("started_at")),
    )
    workers_started = segments[0]["started_at"] if segments else None
    worker_s = sum(s["world_size"] * (s["ended_at"] - s["started_at"]) for s in segments)
    cpu_s = worker_s * float(per_worker.get("CPU") or 0)
    gpu_s = worker_s * float(per_worker.get("GPU") or 0)
    wall = max(0.0, ended - submitted) if ended is not None and submitted is not None else 0.0
    queued_until = workers_started if workers_started is not None else ended
    queued = max(0.0, queued_until - submitted) if queued_until is not None and submitted is not None else 0.0
    held = sum(s["ended_at"] - s["started_at"] for s in segments)
    size = record.get("world_size")
    return AttemptCost(
        attempt=int(record.get("attempt") or 0),
        submission_id=record.get("submission_id"),
        failed=failed,
        submitted_at=submitted,
        workers_started_at=workers_started,
        ended_at=ended,
        wall_s=round(wall, 3),
        queued_s=round(queued, 3),
        held_s=round(held, 3),
        world_size=max((s["world_size"] for s in segments), default=size if isinstance(size, int) else 0),
        worker_s=round(worker_s, 3),
        cpu_s=round(cpu_s, 3),
        gpu_s=round(gpu_s, 3),
        amount=amount(cpu_s, gpu_s, prices),
    )


def task_run_cost(
    attempts: list[AttemptCost], *, per_worker: Mapping[str, float], prices: Mapping[str, Any] | None
) -> Cost:
    """The attempts' costs, in order, and their total (failed ones included, and again apart)."""
    ordered = sorted(attempts, key=lambda a: a["attempt"])
    rows: list[Mapping[str, Any]] = list(ordered)
    total: dict[str, Any] = {key: round(sum(float(a.get(key) or 0.0) for a in rows), 3) for key in SUMMED}
    failed = [a for a in ordered if a["failed"]]
    total["attempts"], total["failed_attempts"] = len(ordered), len(failed)
    total["failed_worker_s"] = round(sum(a["worker_s"] for a in failed), 3)
    priced = prices is not None and all(a["amount"] is not None for a in ordered)
    total["amount"] = round(sum(a["amount"] or 0.0 for a in ordered), 6) if priced else None
    total["failed_amount"] = round(sum(a["amount"] or 0.0 for a in failed), 6) if priced else None
    return Cost(
        attempts=ordered, total=total, resources_per_worker=dict(per_worker), prices=dict(prices) if prices else None
    )


def summary(cost: Mapping[str, Any]) -> str:
    """The task log's line: the total, and the failed attempts' share."""
    total = cost["total"]
    line = (
        f"Cost: {total['attempts']} attempt(s), wall {total['wall_s']:.1f} s, queued {total['queued_s']:.1f} s, "
        f"{total['worker_s']:.1f} worker-s (CPU {total['cpu_s']:.1f} s, GPU {total['gpu_s']:.1f} s)"
    )
    if total.get("amount") is not None:
        line += f", {total['amount']:.4f} {(cost.get('prices') or {}).get('currency') or ''}".rstrip()
    if total["failed_attempts"]:
        line += f"; of which {total['failed_attempts']} failed attempt(s): {total['failed_worker_s']:.1f} worker-s"
        if total.get("failed_amount") is not None:
            line += f", {total['failed_amount']:.4f}"
    return line


def _first(*values: Any) -> float | None:
    return next((float(v) for v in values if v is not None), None)
