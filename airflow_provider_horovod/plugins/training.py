"""The plugin: views of Horovod trainings inside Airflow's UI, served by Airflow's own api-server.

- "Training", a tab of every task instance: a training's curves (live while it runs), the
  checkpoints Ray still keeps, the run's facts and its Ray job; a neutral line for tasks that do not
  train (a tab cannot be shown on some task instances only).
- "Training history", a tab of every DAG: its runs of its training tasks by logical date.

Both are React app plugins (``react_apps``): Airflow's UI imports one bundle (``www/``, built into
``www/dist`` at set-up and shipped in the wheel) and renders its components inside its own React
tree, in its own theme. This module's FastAPI app answers their JSON and serves the bundle.
Registered as an ``airflow.plugins`` entry point (pyproject.toml).

Every Airflow process loads plugins (the scheduler, the dag-processor, each task): the app and the
views' entries are made only when Airflow reads them, which the api-server does. Their addresses carry
the path of ``[api] base_url``, so a deployment under a sub-path (``http://host/airflow``) serves them.
"""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path
from typing import Any

from airflow.plugins_manager import AirflowPlugin

from airflow_provider_horovod.plugins import curves
from airflow_provider_horovod.plugins.data import (
    JOB_KEY,
    KIND_TRAIN,
    RETURN_KEY,
    TRAINING_OPERATORS,
    AttemptFiles,
    Storage,
    read_attempt,
    stopped_by_request,
)
from airflow_provider_horovod.plugins.history import cost_summary, is_training_result

ROUTE = "/horovod"
DIST = Path(__file__).resolve().parent / "www" / "dist"
BUNDLE = "training.js"
# The names the bundle registers its components under (www/src/main.jsx): Airflow's UI looks a React
# app's component up on ``globalThis`` by the app's name.
TRAINING_VIEW, HISTORY_VIEW = "Training", "Training history"
# Task instance states in which a training may still report: the view refreshes while in one.
LIVE_STATES = frozenset(
    {"scheduled", "queued", "running", "deferred", "up_for_retry", "up_for_reschedule", "restarting"}
)
REFRESH_S = 5
# A task instance failed for good whose attempt left no result was killed when its on_kill stopped the
# job: before the wait saw the job end (a deferred task), no record of the attempt; after, a post-mortem
# that says only that Ray stopped the job (failures.stopped_by_request).
KILLED_STATE = "failed"
TRAINERS = {"v2": "Ray Train V2", "legacy": "Ray Train V1 (legacy)"}


def static_url(root_path: str, name: str) -> str:
    """A file of the bundle's folder, under the UI's root path (``/`` or a sub-path, ``/airflow/``)."""
    return f"{root_path.rstrip('/')}{ROUTE}/static/{name}"


def bundle_url(root_path: str) -> str:
    """The bundle's address, with its build time in it: a browser never runs a stale copy after an upgrade."""
    try:
        stamp = int((DIST / BUNDLE).stat().st_mtime)
    except OSError:
        stamp = 0
    return f"{static_url(root_path, BUNDLE)}?v={stamp}"


def react_apps(root_path: str) -> list[dict[str, str]]:
    """The two views as Airflow's UI takes them; their addresses under ``root_path``."""
    views = ((TRAINING_VIEW, "task_instance", "horovod_training"), (HISTORY_VIEW, "dag", "horovod_history"))
    return [
        {
            "name": name,
            "bundle_url": bundle_url(root_path),
            "destination": destination,
            "url_route": route,
            "icon": static_url(root_path, "chart.svg"),
            "icon_dark_mode": static_url(root_path, "chart-dark.svg"),
        }
        for name, destination, route in views
    ]


def api_root_path() -> str:
    """The path of ``[api] base_url``, as Airflow's api-server reads it (it serves everything under it)."""
    from airflow.api_fastapi.app import API_ROOT_PATH

    return API_ROOT_PATH


# --- the Training view -------------------------------------------------------------------------------


def load_task(session, dag_id: str, run_id: str, task_id: str, map_index: int) -> tuple[dict | None, dict]:
    """(the task instance, its ``return_value`` and ``ray_job`` XComs), in one query."""
    from airflow.models.taskinstance import TaskInstance as TI
    from airflow.models.xcom import XComModel as XCom
    from sqlalchemy import and_, select

    stmt = (
        select(TI.state, TI.try_number, TI.operator, TI.custom_operator_name, XCom.key, XCom.value)
        .outerjoin(
            XCom,
            and_(
                XCom.dag_id == TI.dag_id,
                XCom.run_id == TI.run_id,
                XCom.task_id == TI.task_id,
                XCom.map_index == TI.map_index,
                XCom.key.in_((RETURN_KEY, JOB_KEY)),
            ),
        )
        .where(TI.dag_id == dag_id, TI.run_id == run_id, TI.task_id == task_id, TI.map_index == map_index)
    )
    ti, xcoms = None, {}
    for row in session.execute(stmt):
        ti = ti or {
            "state": row.state,
            "try_number": row.try_number,
            "map_index": map_index,
            "operator": row.custom_operator_name or row.operator,
        }
        if row.key is not None:
            xcoms[row.key] = XCom.deserialize_value(row)
    return ti, xcoms


def cost_text(cost: Any) -> str | None:
    """What the run cost, as the facts show it: worker-seconds by kind (and the amount, with prices),
    failed attempts included and told apart; None when nothing was counted."""
    total = cost_summary(cost)
    if total is None:
        return None
    text = f"{total['worker_s'] or 0:.1f} worker-s (CPU {total['cpu_s'] or 0:.1f} s, GPU {total['gpu_s'] or 0:.1f} s)"
    if total["amount"] is not None:
        text += f", {total['amount']:.4f} {total['currency']}".rstrip()
    if total["failed_attempts"]:
        text += f"; {total['failed_attempts']} failed attempt(s): {total['failed_worker_s']:.1f} worker-s"
    return text


def facts(result: dict, record: dict, job: dict) -> list[dict]:
    """The run's facts, as the view lists them (label, value, and a link where there is one); the
    attempt and the state are in the view's header."""
    timings = result.get("timings") or record.get("timings") or {}
    world_size = result.get("world_size") or record.get("world_size")
    fit_s = timings.get("fit_s")
    trainer = str(result.get("trainer_api") or job.get("trainer_api") or "")
    items = [
        ("workers", world_size),
        ("trainer", TRAINERS.get(trainer, trainer)),
        ("training time", f"{fit_s:.1f} s" if fit_s else None),
        ("cost", cost_text(result.get("cost") or record.get("cost"))),
        ("resumed from", result.get("resumed_from") or record.get("resumed_from")),
    ]
    out: list[dict[str, Any]] = [
        {"label": label, "value": str(value)} for label, value in items if value not in (None, "")
    ]
    submission = str(result.get("submission_id") or job.get("submission_id") or "")
    if submission:
        out.append(
            {
                "label": "Ray job",
                "value": submission,
                "href": result.get("dashboard_url") or job.get("dashboard_url") or None,
            }
        )
    return out


def failed_attempts(attempts: list[AttemptFiles]) -> list[dict]:
    """Why each of the attempts failed, from the records they left (the reason outlives the cluster):
    class, rank, summary, the user's own frames, what to do."""
    out = []
    for files in attempts:
        failure = (files.record or {}).get("failure")
        if isinstance(failure, dict):
            out.append(
                {
                    "attempt": files.attempt,
                    "class": str(failure.get("failure_class", "")).replace("_", " "),
                    "rank": failure.get("rank"),
                    "summary": failure.get("summary", ""),
                    "traceback": failure.get("traceback", ""),
                    "hint": failure.get("hint", ""),
                }
            )
    return out


def answer(ti: dict | None, xcoms: dict, storage: Storage | None = None) -> dict:
    """The Training view's data for one task instance. ``storage``: where the attempts' files are read
    (default: through the task's ``aws_conn_id``)."""
    if ti is None:
        return {"found": False, "trains": False, "live": False, "message": "There is no such task instance."}
    live = ti["state"] in LIVE_STATES
    base = {
        "found": True,
        "state": ti["state"],
        "try_number": ti["try_number"],
        "map_index": ti["map_index"] if ti["map_index"] >= 0 else None,
        "live": live,
        "refresh_s": REFRESH_S,
    }
    result: dict = xcoms[RETURN_KEY] if is_training_result(xcoms.get(RETURN_KEY)) else {}
    job: dict = xcoms[JOB_KEY] if isinstance(xcoms.get(JOB_KEY), dict) else {}
    source = result or (job if job.get("kind") == KIND_TRAIN and job.get("storage_uri") else None)
    if not source:
        if job:
            message = "This task runs a Ray job, not a training: it has no training curves."
        elif ti["operator"] in TRAINING_OPERATORS:
            message = (
                "The training has not been submitted yet." if live else "This task instance submitted no training."
            )
        else:
            message = "This task does not train with Horovod: there are no training curves here."
        link = (
            [{"label": "Ray job", "value": job["submission_id"], "href": job.get("dashboard_url")}]
            if job.get("submission_id")
            else []
        )
        return {**base, "trains": False, "message": message, "facts": link}

    attempt, storage_uri = int(source["attempt"]), source["storage_uri"]
    storage = storage or Storage(aws_conn_id=source.get("aws_conn_id"))
    # The record is written once the job ends.
    attempt_files = read_attempt(
        storage, storage_uri, attempt, record=bool(result) or not live, history=True, checkpoints=True
    )
    attempts = [*(read_attempt(storage, storage_uri, n) for n in range(1, attempt)), attempt_files]
    record: dict = attempt_files.record or {}
    points = attempt_files.history if attempt_files.history is not None else record.get("history")
    kept = set(attempt_files.checkpoints) if attempt_files.checkpoints is not None else None
    failed = failed_attempts(attempts)
    # Storage down or refused: say so on the page, with what was read.
    unread = next((err for files in attempts for err in files.unread.values()), None)
    problem = f"The training's files at {attempt_files.folder} cannot be read: {unread}" if unread else ""
    score = (
        result.get("checkpoint_score_attribute")
        or record.get("checkpoint_score_attribute")
        or job.get("checkpoint_score_attribute")
    )
    shaped = curves.shape(
        points or [],
        score_attribute=score,
        kept=kept,
        latest=result.get("checkpoint_uri") or record.get("checkpoint_uri"),
        best=result.get("best_checkpoint_uri") or record.get("best_checkpoint_uri"),
    )
    for checkpoint in shaped["checkpoints"]:
        checkpoint["uri"] = attempt_files.checkpoint_uri(checkpoint["name"]) if checkpoint["name"] else None
    failure = record.get("failure")
    killed = (
        ti["state"] == KILLED_STATE
        and not result
        and not problem
        and (not record or (isinstance(failure, dict) and stopped_by_request(failure)))
    )
    if killed:  # the message says why the attempt ended, not as a failure of the training's
        failed = [f for f in failed if f["attempt"] != attempt]
    if killed:
        ray_job = " ".join(filter(None, ["its Ray job", job.get("submission_id")]))
        message = f"Attempt {attempt} was killed before its training ended, and {ray_job} was stopped with it. " + (
            "Its reports until then are below." if points else "It reported no metrics."
        )
    elif not points and not problem:
        message = "Waiting for the first report." if live else "This training reported no metrics."
    else:
        message = ""
    uris = [
        (label, result.get(key) or record.get(key))
        for label, key in (
            ("latest checkpoint", "checkpoint_uri"),
            ("best checkpoint", "best_checkpoint_uri"),
            ("Horovod timeline", "timeline_uri"),
        )
    ] + [("attempt folder", attempt_files.folder)]
    return {
        **base,
        "trains": True,
        "message": message,
        "problem": problem,
        "killed": killed,
        "attempt": attempt,
        "facts": facts(result, record, job),
        "uris": [{"label": k, "value": v} for k, v in uris if v],
        "curves": shaped,
        "failures": failed,
    }


# --- the app -----------------------------------------------------------------------------------------


def json_response(payload: Any):
    """JSON as it is (FastAPI's encoder walks every one of 10,000 points again)."""
    from fastapi.responses import Response

    return Response(
        json.dumps(payload, separators=(",", ":")), media_type="application/json", headers={"Cache-Control": "no-store"}
    )


def make_app():
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
    from airflow.api_fastapi.core_api.security import requires_access_dag
    from airflow.utils.session import create_session
    from fastapi import Depends, FastAPI, HTTPException, Query
    from fastapi.staticfiles import StaticFiles

    from airflow_provider_horovod.plugins import history

    app = FastAPI(title="Horovod training")
    # What the views show: task instances and their XComs; the same rights Airflow's own pages ask.
    may_read = [
        Depends(requires_access_dag("GET", DagAccessEntity.TASK_INSTANCE)),
        Depends(requires_access_dag("GET", DagAccessEntity.XCOM)),
    ]

    @app.get("/api/training", dependencies=may_read)
    def training(dag_id: str, run_id: str, task_id: str, map_index: int = -1):
        with create_session() as session:
            ti, xcoms = load_task(session, dag_id, run_id, task_id, map_index)
        return json_response(answer(ti, xcoms))

    @app.get("/api/history", dependencies=may_read)
    def dag_history(dag_id: str, runs: int = Query(history.DEFAULT_RUNS, ge=1, le=history.MAX_RUNS)):
        with create_session() as session:
            rows = history.fetch(session, dag_id, runs)
        return json_response({"dag_id": dag_id, "limit": runs, **history.shape(rows)})

    if DIST.is_dir():
        app.mount("/static", StaticFiles(directory=DIST), name="static")
    else:  # a provider built without its bundle: the api-server still starts, the tab says what is missing

        @app.get("/static/{name}")
        def not_built(name: str):
            raise HTTPException(
                404,
                f"The Training views' bundle is not in {DIST}: this airflow-provider-horovod "
                "was built without it. Build it with scripts/build_ui.sh before the wheel.",
            )

    return app


class HorovodTrainingPlugin(AirflowPlugin):
    """The Training views. Airflow reads ``fastapi_apps`` and ``react_apps`` of the plugin's instance only
    where it serves them (the api-server; ``airflow plugins`` lists them): each is made there, once."""

    name = "horovod_training"

    # Read-only where the base class has plain lists: Airflow only reads them, from the instance.
    @cached_property
    def fastapi_apps(self) -> list[dict[str, Any]]:  # type: ignore[override]
        return [{"app": make_app(), "url_prefix": ROUTE, "name": "Horovod training"}]

    @cached_property
    def react_apps(self) -> list[dict[str, str]]:  # type: ignore[override]
        return react_apps(api_root_path())
