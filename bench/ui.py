"""Figure 8: answer time of the plugin's views through a real ``airflow api-server``, on runs and histories
written straight into the benchmarks' metadata database and storage (no cluster)."""

from __future__ import annotations

import json
import math
import shutil
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from airflow_provider_horovod.contract import HISTORY_FILE, RESULT_FILE, XCOM_JOB, XCOM_LOG_CURSOR, attempt_uri
from bench.common import AIRFLOW_HOME, BENCH_DAGS, OUT, log, repeats, save_raw
from bench.markdown import Figure, Row, Sample, fmt, table, target
from harness.ports import free_port
from harness.stack import Stack

HISTORY_DAG, TRAINING_DAG = "bench_ui_history", "bench_ui_training"
BUNDLE = "bench-ui"
RUNS = (100, 500)
REPORTS = (1_000, 10_000)
TARGET_S = 1.0
STORAGE = OUT / "ui-storage"
DAY = datetime(2025, 1, 1, tzinfo=timezone.utc)
# The tasks of a run of dags/horovod_retraining.py: (task id, operator, custom name, return value of run n).
TASKS = (
    ("prepare_data", "_RayDecoratedOperator", "@task.ray", lambda n: {"train": f"s3://b/d/{n}/train", "rows": 4096}),
    ("champion_checkpoint", "_PythonDecoratedOperator", "@task", lambda n: f"s3://b/ckpt/{n - 1}"),
    ("train", "HorovodTrainOperator", None, None),
    ("evaluate", "_RayDecoratedOperator", "@task.ray", lambda n: evaluated(n)),
    ("promote", "_PythonDecoratedOperator", "@task", lambda n: {"promoted": n % 3 == 0, **evaluated(n, "promote")}),
)


def evaluated(n: int, task: str = "evaluate") -> dict:
    """The evaluation's return value of run n (or the promotion's, with its ``logical_date``)."""
    value = {"holdout_mse": 0.1 + 0.05 * math.sin(n)}
    if task == "promote":
        return {**value, "logical_date": str(n)}
    return {**value, "checkpoint_uri": f"s3://b/ckpt/{n}", "baseline_mse": 2.0, "submission_id": f"ahp-evaluate-{n}"}


def history_value(n: int) -> dict:
    """A training's result as the operator returns it."""
    value = {"checkpoint_uri": f"s3://b/ckpt/{n}", "best_checkpoint_uri": f"s3://b/ckpt/{n}", "run_uri": "x"}
    value.update(metrics={"train_mse": 0.2 + 0.1 * math.cos(n), "epoch": 4}, submission_id=f"ahp-train-{n}-a1")
    value.update(dashboard_url="http://ray:8265/#/jobs/x", storage_uri=f"s3://b/runs/{n}", world_size=2, attempt=1)
    value.update(trainer_api="v2", resumed_from=None, timings={"fit_s": 30.0}, return_value=None, timeline_uri=None)
    return value


def write_rows(session, dag_id: str, run_id: str, when: datetime, tasks: list[tuple]) -> None:
    """One dag run with its task instances and XComs: ``tasks`` of (task_id, operator, custom, xcoms)."""
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.xcom import XComModel
    from sqlalchemy import insert, select

    ids, ended = {"dag_id": dag_id, "run_id": run_id}, {"state": "success", "start_date": when}
    run_type = {"run_type": "scheduled", "logical_date": when, "run_after": when}
    session.execute(insert(DagRun).values(**ids, **run_type, **ended, end_date=when + timedelta(minutes=3)))
    run = session.scalar(select(DagRun.id).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id))
    for task_id, operator, custom, xcoms in tasks:
        row = {**ids, **ended, "task_id": task_id, "map_index": -1, "pool": "default_pool", "try_number": 1}
        row.update(operator=operator, custom_operator_name=custom, end_date=when + timedelta(seconds=40), duration=40.0)
        session.execute(insert(TaskInstance).values(**row))
        for key, value in xcoms.items():
            session.execute(
                insert(XComModel).values(**ids, dag_run_id=run, task_id=task_id, map_index=-1, key=key, value=value)
            )


def history_tasks(n: int) -> list[tuple]:
    tasks = []
    for task_id, operator, custom, value in TASKS:
        if task_id == "train":
            result = history_value(n)
            job = {k: result[k] for k in ("submission_id", "storage_uri", "attempt", "dashboard_url", "trainer_api")}
            xcoms = {"return_value": result, XCOM_JOB: {**job, "kind": "train"}, XCOM_LOG_CURSOR: {"lines": 812}}
            xcoms["checkpoint_uri"] = result["checkpoint_uri"]
        else:
            returned = value(n)
            # @task with a dict return pushes each key as well (multiple_outputs).
            xcoms = {"return_value": returned, **(returned if isinstance(returned, dict) else {})}
        tasks.append((task_id, operator, custom, xcoms))
    return tasks


def report_history(reports: int) -> tuple[list[dict], list[str]]:
    """A training's history as the runtime writes it, and the checkpoints Ray keeps (the last 2)."""
    points, names = [], []
    for i in range(reports):
        loss = 1.0 / (1 + i / 50)
        metrics = {"epoch": i // 100, "loss": loss, "accuracy": 1 - 0.5 / (1 + i / 50), "lr": 0.01 * 0.999**i}
        checkpoint = None
        if i % 10 == 9:
            metrics["val_loss"] = 1.1 / (1 + i / 50)
        if i % 100 == 99:
            checkpoint = f"checkpoint_{i // 100:06d}"
            names.append(checkpoint)
        points.append({"report": i + 1, "time": 1.7e9 + i * 0.5, "metrics": metrics, "checkpoint": checkpoint})
    return points, names[-2:]


def populate() -> None:
    from airflow.models.dag import DagModel
    from airflow.models.dagbundle import DagBundleModel
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import delete, insert

    dag_ids = [f"{HISTORY_DAG}_{n}" for n in RUNS] + [TRAINING_DAG]
    shutil.rmtree(STORAGE, ignore_errors=True)
    with create_session() as session:
        for model in (XComModel, TaskInstance, DagRun, DagModel):
            session.execute(delete(model).where(model.dag_id.in_(dag_ids)))
        # Airflow's REST API answers for the DAGs it knows (B's calls); a DAG belongs to a bundle.
        if not session.get(DagBundleModel, BUNDLE):
            session.add(DagBundleModel(name=BUNDLE))
            session.flush()
        dag = {"bundle_name": BUNDLE, "max_active_tasks": 16, "max_consecutive_failed_dag_runs": 0, "is_paused": True}
        session.execute(insert(DagModel), [{**dag, "dag_id": d, "has_task_concurrency_limits": False} for d in dag_ids])
        for count in RUNS:
            for n in range(1, count + 1):
                when = DAY + timedelta(days=n)
                write_rows(session, f"{HISTORY_DAG}_{count}", f"scheduled__{when.isoformat()}", when, history_tasks(n))
        for i, reports in enumerate(REPORTS):
            storage = STORAGE / f"reports-{reports}"
            folder = Path(attempt_uri(str(storage), 1))
            points, kept = report_history(reports)
            folder.mkdir(parents=True)
            (folder / HISTORY_FILE).write_text(json.dumps(points))
            for name in kept:
                (folder / name).mkdir()
                (folder / name / "model.pt").write_bytes(b"0" * 1024)
            result = {**history_value(reports), "storage_uri": str(storage), "run_uri": str(folder)}
            result.update(checkpoint_uri=str(folder / kept[-1]), best_checkpoint_uri=str(folder / kept[-1]))
            result.update(metrics=points[-1]["metrics"], checkpoint_score_attribute="val_loss")
            (folder / RESULT_FILE).write_text(json.dumps({**result, "history": points[:: max(1, reports // 1000)]}))
            job = {"kind": "train", "storage_uri": str(storage), "attempt": 1, "submission_id": "x"}
            train = ("train", "HorovodTrainOperator", None, {"return_value": result, XCOM_JOB: job})
            write_rows(session, TRAINING_DAG, f"reports_{reports}", DAY + timedelta(days=i), [train])


def get(server, path: str, **params):
    response = server.client.get(path, params=params)
    response.raise_for_status()
    return response


def timed(call, n: int, warmup: int = 3) -> tuple[Sample, int]:
    """Seconds per call over ``n`` calls after ``warmup`` unmeasured ones, and the last answer's size in bytes."""
    for _ in range(warmup):
        answer = call()
    values = []
    for _ in range(n):
        started = time.perf_counter()
        answer = call()
        values.append(time.perf_counter() - started)
    return Sample(values), len(answer.content)


def rest_history(server: Stack, dag_id: str):
    """What a script gathers through Airflow's REST API for the same table; the last response."""

    def every(path: str, key: str, **params) -> list[dict]:
        found, offset = [], 0
        while True:
            page = get(server, path, limit=100, offset=offset, **params).json()  # Airflow's largest page
            found += page[key]
            offset += 100
            if offset >= page["total_entries"]:
                return found

    # Across all DAGs, filtered by the DAG id: the per-DAG listings look up the serialized DAG, which these lack.
    every("/api/v2/dags/~/dagRuns", "dag_runs", dag_id_pattern=dag_id)
    tis = every("/api/v2/dags/~/dagRuns/~/taskInstances", "task_instances", dag_id_pattern=dag_id)
    last = None
    for ti in tis:
        task = f"/api/v2/dags/{dag_id}/dagRuns/{ti['dag_run_id']}/taskInstances/{ti['task_id']}"
        last = get(server, f"{task}/xcomEntries/return_value")
    if len(tis) != 5 * len({ti["dag_run_id"] for ti in tis}):
        raise RuntimeError(f"the REST API listed {len(tis)} task instances of {dag_id}")
    return last


def figure() -> Figure:
    fig = Figure(8)
    log("writing the benchmark's runs into the metadata database")
    started = time.monotonic()
    populate()
    fig.notes.append(f"Writing {sum(RUNS)} runs and {len(REPORTS)} histories took {time.monotonic() - started:.0f} s.")
    n = repeats() * 7
    rows, raw = [], {}
    database = f"sqlite:///{AIRFLOW_HOME / 'airflow.db'}"
    server = Stack(OUT / "ui-api-server", BENCH_DAGS, free_port(), database, env={"AIRFLOW__API__WORKERS": "1"})
    try:
        server.serve()
        for count in RUNS:
            dag_id = f"{HISTORY_DAG}_{count}"
            ours, size = timed(lambda d=dag_id, c=count: get(server, "/horovod/api/history", dag_id=d, runs=c), n)
            answer = get(server, "/horovod/api/history", dag_id=dag_id, runs=count).json()
            if len(answer["rows"]) != count:
                raise RuntimeError(f"the history of {dag_id} has {len(answer['rows'])} rows, not {count}")
            # B makes thousands of requests a time: measured on the largest DAG only, after one warm-up.
            rest = Sample()
            if count == max(RUNS):
                rest, _ = timed(lambda d=dag_id: rest_history(server, d), max(2, repeats() - 1), warmup=1)
            what, note = f"history, {count} runs", f"answer {size / 1000:.0f} kB"
            rows.append(Row(what, "plugin, one query", ours, "REST API calls" if rest.n else "-", rest, "s", note))
            raw[f"history_{count}"] = {"ours": ours.values, "rest": rest.values, "bytes": size}
        for reports in REPORTS:
            params = {"dag_id": TRAINING_DAG, "run_id": f"reports_{reports}", "task_id": "train"}
            ours, size = timed(lambda p=params: get(server, "/horovod/api/training", **p), n)
            answer = get(server, "/horovod/api/training", **params).json()
            if answer["curves"]["reports"] != reports or answer["problem"]:
                raise RuntimeError(f"the training view read {answer['curves']['reports']} reports: {answer['problem']}")
            path = f"/api/v2/dags/{TRAINING_DAG}/dagRuns/reports_{reports}/taskInstances/train"
            floor, _ = timed(lambda p=path: get(server, p), n)
            what, note = f"training view, {reports:,} reports", f"answer {size / 1000:.0f} kB"
            rows.append(Row(what, "plugin", ours, "one task instance (REST)", floor, "s", note))
            raw[f"training_{reports}"] = {"ours": ours.values, "floor": floor.values, "bytes": size}
    finally:
        server.stop()
    save_raw("ui_answer_times", raw)
    fig.tables.append(table(rows))
    closing = "profile the answer (query, storage read, JSON); sample the points"
    for name, row in (
        ("8. History view of 500 runs answers within 1 s", rows[len(RUNS) - 1]),
        ("8. Training view of 10,000 reports answers within 1 s", rows[-1]),
    ):
        detail = f"median {fmt(row.a.median)} s ({row.a.spread()}), {row.note}"
        fig.targets.append(target(name, row.a.median, TARGET_S, detail, closing, unit=" s"))
    return fig
