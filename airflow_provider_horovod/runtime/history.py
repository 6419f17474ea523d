"""The attempt's metric history: rank 0's reports as points, sampled to a bound, written beside the
record while it trains (the Training view reads it live)."""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable

from airflow_provider_horovod.runtime.records import read_json, write_json

# Points kept: every report, or an even sample of them (the first and the last kept).
MAX_POINTS = 10_000
# How often rank 0 rewrites the live history while it trains (and always after its last report):
# often enough for a live chart, seldom enough that a long run does not rewrite it at every step.
HISTORY_WRITE_S = 5.0
_RECORDED = "_ahp_recorded"


def point(metrics: dict, step: int, checkpoint: str | None) -> dict:
    """One report: its number, time, numeric metrics, and the name of the checkpoint folder it saved."""
    import math
    import time

    numbers = {
        k: float(v)
        for k, v in metrics.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }
    return {"report": step, "time": round(time.time(), 3), "metrics": numbers, "checkpoint": checkpoint}


def sampled(points: list[dict], limit: int = MAX_POINTS) -> list[dict]:
    """An even sample of ``points`` (the first and the last kept), at most ``limit`` long."""
    if len(points) <= limit:
        return list(points)
    step = (len(points) - 1) / (limit - 1)
    return [points[round(i * step)] for i in range(limit)]


class History:
    """Rank 0's reports in this worker process, written to the attempt's history file as they come
    (a worker group that restarts within the attempt goes on from the file).

    A report is recorded when rank 0 makes it, before Ray Train takes it over (Train V2 may hold a report
    for up to its poll interval), and the file is rewritten at most every ``HISTORY_WRITE_S``; what is not
    written yet is written when the training function ends, when it raises on rank 0, and when Ray Train
    stops the workers (``write`` from the backend's worker callback): so a failure on any rank keeps every
    report rank 0 made. A report Ray had not returned from when the workers stopped keeps its metrics, not
    its checkpoint (Ray may not have stored it)."""

    def __init__(self) -> None:
        self.points: list[dict] = []
        self.uri: str | None = None
        self.written_at = 0.0
        # Called with each point as it is recorded (runtime.tracking logs it to MLflow).
        self.listeners: list[Callable[[dict], None]] = []
        # The next report repeats the last point (a script's closing report): it only names the checkpoint.
        self.repeat_next = False

    def record(self, uri: str) -> None:
        """Wrap Ray Train's report (each API's that imports) so rank 0's reports land in ``uri``."""
        from airflow_provider_horovod.runtime.ray_compat import REPORT_METHODS

        self.uri = uri
        for module_name, class_name, sync in REPORT_METHODS:
            try:
                cls = getattr(importlib.import_module(module_name), class_name)
            except (ImportError, AttributeError):
                continue
            if getattr(cls.report, _RECORDED, False):
                continue
            cls.report = self._wrap(cls.report)
            if sync:  # Train V2 names a checkpoint's folder when the ranks agree on it: keep that name
                cls_sync = getattr(cls, sync)

                def named(context, *args, _sync=cls_sync, **kwargs):
                    context._ahp_checkpoint_dir = _sync(context, *args, **kwargs)
                    return context._ahp_checkpoint_dir

                setattr(cls, sync, named)

    def _wrap(self, report):
        history = self

        @functools.wraps(report)
        def recorded(context, metrics, checkpoint=None, *args, **kwargs):
            import ray.train

            if ray.train.get_context().get_world_rank() != 0:
                return report(context, metrics, checkpoint, *args, **kwargs)
            # Train V1 names the folder of the next checkpoint before it saves it; V2 once the ranks agree.
            v1_name = getattr(getattr(context, "storage", None), "checkpoint_dir_name", None)
            context._ahp_checkpoint_dir = None
            repeat, history.repeat_next = history.repeat_next and bool(history.points), False
            entry = (
                history.points[-1]
                if repeat
                else history.add(point(dict(metrics or {}), len(history.points) + 1, None), write=False)
            )
            result = report(context, metrics, checkpoint, *args, **kwargs)
            if checkpoint is not None:
                entry["checkpoint"] = getattr(context, "_ahp_checkpoint_dir", None) or v1_name
            history.write_if_due()
            return result

        setattr(recorded, _RECORDED, True)
        return recorded

    def resume(self) -> None:
        """Go on from what an earlier worker group of this attempt wrote."""
        if self.uri and not self.points:
            self.points = list(read_json(self.uri) or [])

    def add(self, entry: dict, *, write: bool = True) -> dict:
        self.points.append(entry)
        for listener in self.listeners:
            listener(entry)
        if write:
            self.write_if_due()
        return entry

    def write_if_due(self) -> None:
        import time

        if time.monotonic() - self.written_at >= HISTORY_WRITE_S:
            self.write()

    def write(self) -> None:
        import time

        if self.uri and self.points:
            write_json(self.uri, sampled(self.points))
            self.written_at = time.monotonic()

    def write_or_say(self) -> None:
        """``write`` after the user's function failed: a storage that fails too (full, say) is printed, not
        raised, so that the error Ray Train reports is the function's."""
        try:
            self.write()
        except Exception as err:
            print(f"The reports' history could not be written: {err}", flush=True)


HISTORY = History()
