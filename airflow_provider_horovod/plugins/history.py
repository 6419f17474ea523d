"""A retraining DAG's history: for each run of its training tasks, by logical date, the final metrics,
the evaluation (numbers the DAG's other tasks returned), whether the champion moved (a ``promoted``
key in a task's return value), the duration, the cost and the state.

All of it comes from what Airflow already stores (dag runs, task instances, their return values and
``ray_job`` XComs) in ONE query; shaping the rows is pure, so it is tested without a database.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

from airflow_provider_horovod.plugins.curves import COUNTERS, metric_order, numbers
from airflow_provider_horovod.plugins.data import JOB_KEY, KIND_TRAIN, RETURN_KEY, TRAINING_OPERATORS

DEFAULT_RUNS = 200
MAX_RUNS = 1000
PROMOTED_KEY = "promoted"
# Numbers of a training's own result that are not evaluation results of it.
RESULT_NUMBERS = frozenset({"attempt", "world_size", "map_index"})


def query(dag_id: str, limit: int):
    """The statement: the newest ``limit`` runs of the DAG, each with its task instances and their
    return values and ``ray_job`` XComs (outer joins: a run or task without them still shows)."""
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance as TI
    from airflow.models.xcom import XComModel as XCom
    from sqlalchemy import and_, func, select

    when = func.coalesce(DagRun.logical_date, DagRun.run_after)
    # A derived table, not ``IN (... LIMIT)``, which MySQL refuses.
    recent = (
        select(DagRun.id.label("id"))
        .where(DagRun.dag_id == dag_id)
        .order_by(when.desc())
        .limit(limit)
        .subquery("recent")
    )
    return (
        select(
            DagRun.run_id,
            DagRun.logical_date,
            DagRun.run_after,
            DagRun.state.label("run_state"),
            DagRun.start_date.label("run_start"),
            DagRun.end_date.label("run_end"),
            TI.task_id,
            TI.map_index,
            TI.state,
            TI.try_number,
            TI.start_date,
            TI.end_date,
            TI.duration,
            TI.operator,
            TI.custom_operator_name,
            XCom.key,
            XCom.value,
        )
        .join(recent, recent.c.id == DagRun.id)
        .outerjoin(TI, and_(TI.dag_id == DagRun.dag_id, TI.run_id == DagRun.run_id))
        .outerjoin(
            XCom,
            and_(
                XCom.dag_run_id == DagRun.id,
                XCom.task_id == TI.task_id,
                XCom.map_index == TI.map_index,
                XCom.key.in_((RETURN_KEY, JOB_KEY)),
            ),
        )
    )


def fetch(session, dag_id: str, limit: int) -> list[dict]:
    """The rows of :func:`query` as dicts, XCom values decoded as Airflow does."""
    from airflow.models.xcom import XComModel

    rows = []
    for row in session.execute(query(dag_id, limit)):
        item = dict(row._mapping)
        item["value"] = XComModel.deserialize_value(row) if row.value is not None else None
        rows.append(item)
    return rows


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def is_training_result(value: Any) -> bool:
    return isinstance(value, dict) and bool(value.get("storage_uri")) and "attempt" in value and "metrics" in value


def cost_summary(cost: Any) -> dict[str, Any] | None:
    """What a task run cost, from the ``cost`` its result and its records keep (every attempt, failed
    ones too): worker-seconds, the amount where prices were given, how many attempts failed; None where
    nothing was counted."""
    total = cost.get("total") if isinstance(cost, dict) else None
    if not isinstance(total, dict) or not total.get("attempts"):
        return None
    return {
        "worker_s": total.get("worker_s"),
        "cpu_s": total.get("cpu_s"),
        "gpu_s": total.get("gpu_s"),
        "amount": total.get("amount"),
        "currency": (cost.get("prices") or {}).get("currency") or "",
        "attempts": total.get("attempts"),
        "failed_attempts": total.get("failed_attempts") or 0,
        "failed_worker_s": total.get("failed_worker_s") or 0,
    }


def evaluation_numbers(value: Any) -> dict[str, float]:
    """What a task's return value says in numbers: a number itself, or a dict's top-level numbers."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return {"": float(value)}
    if isinstance(value, dict):
        return {k: v for k, v in numbers(value).items() if k != PROMOTED_KEY}
    return {}


def shape(rows: list[dict], *, score_attribute: str | None = None) -> dict:
    """Rows of :func:`fetch` -> one entry per run and training task instance, oldest first."""
    tasks: dict[tuple, dict] = {}
    runs: dict[str, dict] = {}
    for row in rows:
        run = runs.setdefault(
            row["run_id"],
            {
                "run_id": row["run_id"],
                "date": _iso(row["logical_date"] or row["run_after"]),
                "logical_date": _iso(row["logical_date"]),
                "run_state": row["run_state"],
                "run_duration_s": (row["run_end"] - row["run_start"]).total_seconds()
                if row["run_start"] and row["run_end"]
                else None,
            },
        )
        if row["task_id"] is None:
            continue
        ti = tasks.setdefault(
            (row["run_id"], row["task_id"], row["map_index"]),
            {
                "run": run,
                "task_id": row["task_id"],
                "map_index": row["map_index"],
                "state": row["state"],
                "try_number": row["try_number"],
                "duration_s": row["duration"],
                "start_date": _iso(row["start_date"]),
                "end_date": _iso(row["end_date"]),
                "operator": row["custom_operator_name"] or row["operator"],
                "result": None,
                "job": None,
            },
        )
        if row["key"] == RETURN_KEY:
            ti["result"] = row["value"]
        elif row["key"] == JOB_KEY and isinstance(row["value"], dict):
            ti["job"] = row["value"]

    def trains(ti: dict) -> bool:
        return (
            is_training_result(ti["result"])
            or (ti["job"] or {}).get("kind") == KIND_TRAIN
            or ti["operator"] in TRAINING_OPERATORS
        )

    training_ids = {ti["task_id"] for ti in tasks.values() if trains(ti)}
    # Per run: what the other tasks returned (evaluation numbers) and whether the champion moved.
    evaluation: dict[str, dict[tuple[str, str], float]] = {}
    promoted: dict[str, bool] = {}
    for (run_id, task_id, _), ti in tasks.items():
        if task_id in training_ids:
            continue
        for key, value in evaluation_numbers(ti["result"]).items():
            evaluation.setdefault(run_id, {})[(task_id, key)] = value
        if isinstance(ti["result"], dict) and PROMOTED_KEY in ti["result"]:
            promoted[run_id] = promoted.get(run_id, False) or bool(ti["result"][PROMOTED_KEY])
    labels = _evaluation_labels(evaluation)

    entries = []
    for (run_id, task_id, map_index), ti in tasks.items():
        if task_id not in training_ids:
            continue
        result = ti["result"] if is_training_result(ti["result"]) else {}
        job = ti["job"] or {}
        entries.append(
            {
                **{k: ti["run"][k] for k in ("run_id", "date", "logical_date", "run_state", "run_duration_s")},
                "task_id": task_id,
                "map_index": map_index,
                "state": ti["state"],
                "try_number": ti["try_number"],
                "duration_s": ti["duration_s"],
                "start_date": ti["start_date"],
                "end_date": ti["end_date"],
                # What the training reported last; its counters (epoch, step) say how far, not how well.
                "metrics": {k: v for k, v in numbers(result.get("metrics")).items() if k not in COUNTERS},
                "cost": cost_summary(result.get("cost")),
                "attempt": result.get("attempt") or job.get("attempt"),
                "submission_id": result.get("submission_id") or job.get("submission_id"),
                "dashboard_url": result.get("dashboard_url") or job.get("dashboard_url"),
                "score_attribute": result.get("checkpoint_score_attribute") or job.get("checkpoint_score_attribute"),
                "evaluation": {labels[key]: v for key, v in evaluation.get(run_id, {}).items()},
                "promoted": promoted.get(run_id),
            }
        )
    entries.sort(key=lambda e: (e["date"] or "", e["run_id"], e["task_id"], e["map_index"]))
    score = score_attribute or next((e["score_attribute"] for e in reversed(entries) if e["score_attribute"]), None)
    metric_names = metric_order({k for e in entries for k in e["metrics"]}, score)
    evaluation_names = metric_order({k for e in entries for k in e["evaluation"]})
    return {
        "runs": len(runs),
        "rows": entries,
        "metrics": metric_names,
        "evaluation": evaluation_names,
        "score_attribute": score,
        "training_tasks": sorted(training_ids),
    }


def _evaluation_labels(evaluation: dict[str, dict[tuple[str, str], float]]) -> dict[tuple[str, str], str]:
    """A number's column: its key; ``task.key`` when, in some run, tasks report that key with different
    values (the same key and value from two tasks, say evaluate and promote, is one number repeated); a
    task's plain number is named after the task."""
    ambiguous = {
        key
        for per_run in evaluation.values()
        for (_, key) in per_run
        if len({v for (_, k), v in per_run.items() if k == key}) > 1
    }
    return {
        (task_id, key): task_id if not key else f"{task_id}.{key}" if key in ambiguous else key
        for per_run in evaluation.values()
        for (task_id, key) in per_run
    }
