"""One training's reports, shaped for its charts: which metrics, in which order, against which x axis,
and which points saved a checkpoint that Ray still keeps. Pure: from the history the runtime wrote
(rank 0's reports, ``{"report", "time", "metrics", "checkpoint"}``) and the checkpoint folders that
exist.

The answer is columnar and small: one column per x axis, and per metric only its own values and the
rows (reports) they belong to, so a metric reported on some reports only (a validation score every
few epochs) is drawn on its own points, and its checkpoint marks fall on those points.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

# Counters rather than metrics: when every report carries one, it becomes the x axis, not a chart.
COUNTERS = ("epoch", "global_step", "step", "iteration", "iter", "training_iteration", "batch")
# Names of metrics that fall as a model improves, in the order a loss is looked for.
LOSS_WORDS = ("loss", "mse", "rmse", "mae", "nll", "error", "perplexity")
EVALUATION_WORDS = ("val", "valid", "eval", "test", "holdout")
REPORT, ELAPSED = "report", "elapsed_s"


def is_loss(name: str) -> bool:
    lower = name.lower()
    return any(word in lower for word in LOSS_WORDS)


def metric_order(names: Iterable[str], chosen: str | None = None) -> list[str]:
    """The metric that ranks checkpoints first; then losses, those on held-out data first; then the rest,
    each group by name."""

    def rank(name: str) -> tuple:
        lower = name.lower()
        held_out = any(lower.startswith(w) or f"_{w}" in lower or f"{w}_" in lower for w in EVALUATION_WORDS)
        return (name != chosen, not is_loss(name), not held_out, name)

    return sorted(set(names), key=rank)


def chosen_metric(names: Iterable[str], score_attribute: str | None) -> str | None:
    """The metric that matters: the checkpoint score attribute when reported, else a loss."""
    names = list(names)
    if score_attribute and score_attribute in names:
        return score_attribute
    losses = [n for n in metric_order(names) if is_loss(n)]
    return losses[0] if losses else None


def numbers(metrics: dict | None) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in (metrics or {}).items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }


def counter_axes(points: list[dict]) -> list[str]:
    """The counters that every report carries and that never go back: the x axes they can be, the
    first one the default; none of them is charted as a metric."""
    found = []
    for name in COUNTERS:
        values = [numbers(p.get("metrics")).get(name) for p in points]
        column = [value for value in values if value is not None]
        if column and len(column) == len(values) and all(a <= b for a, b in zip(column, column[1:])):
            found.append(name)
    return found


def checkpoint_name(point: dict) -> str | None:
    """The checkpoint's folder name; ``""`` for a record older than names (``True``); None: no checkpoint."""
    value = point.get("checkpoint")
    if isinstance(value, str) and value:
        return value
    return "" if value is True else None


def shape(
    points: list[dict],
    *,
    score_attribute: str | None = None,
    kept: set[str] | None = None,
    latest: str | None = None,
    best: str | None = None,
) -> dict:
    """The charts' data. ``kept``: checkpoint folders that still exist (None: unknown); ``latest`` and
    ``best``: checkpoint URIs of the result, to tell those checkpoints apart."""
    counters = counter_axes(points)
    first_time = next((p["time"] for p in points if isinstance(p.get("time"), (int, float))), None)
    columns: dict[str, list] = {REPORT: [p.get("report", i + 1) for i, p in enumerate(points)]}
    if first_time is not None:
        columns[ELAPSED] = [
            round(p["time"] - first_time, 3) if isinstance(p.get("time"), (int, float)) else None for p in points
        ]
    for counter in counters:
        columns[counter] = [numbers(p.get("metrics"))[counter] for p in points]
    axes = [*counters, REPORT] + ([ELAPSED] if ELAPSED in columns else [])

    rows_of: dict[str, list[int]] = {}
    values_of: dict[str, list[float]] = {}
    for row, point in enumerate(points):
        for name, value in numbers(point.get("metrics")).items():
            if name in counters:
                continue
            rows_of.setdefault(name, []).append(row)
            values_of.setdefault(name, []).append(value)

    checkpoints = []
    saved_at: dict[int, bool | None] = {}  # row -> kept (None: not known)
    for row, point in enumerate(points):
        folder = checkpoint_name(point)
        if folder is None:
            continue
        exists = None if kept is None or not folder else folder in kept
        saved_at[row] = exists
        checkpoints.append(
            {
                "name": folder or None,
                "row": row,
                "report": columns[REPORT][row],
                "exists": exists,
                "metrics": numbers(point.get("metrics")),
                "latest": bool(folder and latest and latest.rstrip("/").endswith("/" + folder)),
                "best": bool(folder and best and best.rstrip("/").endswith("/" + folder)),
            }
        )

    chosen = chosen_metric(values_of, score_attribute)
    metrics = []
    for name in metric_order(values_of, chosen):
        rows = rows_of[name]
        marks = [(i, saved_at[r]) for i, r in enumerate(rows) if r in saved_at]
        metrics.append(
            {
                "name": name,
                "chosen": name == chosen,
                # None: the metric is on every report (the x columns as they are).
                "rows": None if len(rows) == len(points) else rows,
                "values": values_of[name],
                # Positions in ``values`` of the reports that saved a checkpoint, Ray's kept ones apart.
                "kept_at": [i for i, exists in marks if exists is not False],
                "deleted_at": [i for i, exists in marks if exists is False],
                "last": values_of[name][-1],
                "min": min(values_of[name]),
                "max": max(values_of[name]),
            }
        )
    return {
        "reports": len(points),
        "axes": axes,
        "columns": columns,
        "metrics": metrics,
        "chosen": chosen,
        "score_attribute": score_attribute,
        "checkpoints": checkpoints,
    }
