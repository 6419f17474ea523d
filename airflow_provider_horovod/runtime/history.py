"""What rank 0 reported, report after report: the training curve Airflow's UI draws (the plugin in
``airflow_provider_horovod.plugins``). Recorded in the worker, by wrapping Ray Train's report of
both trainer APIs, and kept in the attempt's result record."""

from __future__ import annotations

import functools
import importlib
import math
import time

# At most this many points reach the result record: every report, or an even sample of them.
MAX_POINTS = 1000
_REPORTS = (("ray.train.v2._internal.execution.context", "TrainContext"), ("ray.train._internal.session", "_TrainSession"))
_RECORDED = "_ahp_recorded"


def point(metrics: dict, step: int, checkpoint: bool) -> dict:
    """One report: its number, time, numeric metrics, and whether it saved a checkpoint."""
    numbers = {k: float(v) for k, v in metrics.items()
               if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
    return {"report": step, "time": round(time.time(), 3), "metrics": numbers, "checkpoint": checkpoint}


def sampled(points: list[dict], limit: int = MAX_POINTS) -> list[dict]:
    """An even sample of ``points`` (the first and the last kept), at most ``limit`` long."""
    if len(points) <= limit:
        return list(points)
    step = (len(points) - 1) / (limit - 1)
    return [points[round(i * step)] for i in range(limit)]


class History:
    """Rank 0's reports in this worker process."""

    def __init__(self) -> None:
        self.points: list[dict] = []

    def record(self) -> None:
        """Wrap Ray Train's report (each API's that imports) so rank 0's reports are kept (once)."""
        for module_name, class_name in _REPORTS:
            try:
                cls = getattr(importlib.import_module(module_name), class_name)
            except (ImportError, AttributeError):
                continue
            if getattr(cls.report, _RECORDED, False):
                continue
            cls.report = self._wrap(cls.report)

    def _wrap(self, report):
        history = self

        @functools.wraps(report)
        def recorded(context, metrics, checkpoint=None, *args, **kwargs):
            import ray.train

            if ray.train.get_context().get_world_rank() == 0:
                history.points.append(point(dict(metrics or {}), len(history.points) + 1, checkpoint is not None))
            return report(context, metrics, checkpoint, *args, **kwargs)

        setattr(recorded, _RECORDED, True)
        return recorded


HISTORY = History()
