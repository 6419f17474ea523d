"""Figure 8: answer time of the plugin's views, through a real ``airflow api-server`` (one worker) on
the benchmarks' own metadata database: the Training history of a DAG with 500 runs, and the Training
view of a task instance whose history holds 10,000 reports.

The runs are written straight into Airflow's tables as its scheduler and workers leave them (dag runs,
task instances, their XComs, a retraining DAG's five tasks per run), and the histories as the runtime
writes them, so the figure needs no cluster; it takes about 3 minutes, most of them B's REST calls.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import time
from datetime import datetime, timedelta, timezone

from bench.common import AIRFLOW_BIN, OUT, Figure, Row, Sample, Target, fmt, log, repeats, save_raw, table
from harness.ports import free_port

HISTORY_DAG, TRAINING_DAG = "bench_ui_history", "bench_ui_training"
BUNDLE = "bench-ui"
RUNS = (100, 500)
REPORTS = (1_000, 10_000)
TARGET_S = 1.0
STORAGE = OUT / "ui-storage"
DAY = datetime(2025, 1, 1, tzinfo=timezone.utc)
# The tasks of a run of dags/horovod_retraining.py: (task id, operator, return value of run n).
TASKS = (
    ("prepare_data", "_RayDecoratedOperator", "@task.ray", lambda n: {"train": f"s3://b/d/{n}/train", "rows": 4096}),
    ("champion_checkpoint", "_PythonDecoratedOperator", "@task", lambda n: f"s3://b/ckpt/{n - 1}"),
    ("train", "HorovodTrainOperator", None, None),
    (
        "evaluate",
        "_RayDecoratedOperator",
        "@task.ray",
        lambda n: {
            "checkpoint_uri": f"s3://b/ckpt/{n}",
            "holdout_mse": 0.1 + 0.05 * math.sin(n),
            "baseline_mse": 2.0,
            "submission_id": f"ahp-evaluate-{n}",
        },
    ),
    (
        "promote",
        "_PythonDecoratedOperator",
        "@task",
        lambda n: {"promoted": n % 3 == 0, "holdout_mse": 0.1 + 0.05 * math.sin(n), "logical_date": str(n)},
    ),
)

HOW = """
Through a real `airflow api-server` (one worker, the simple auth manager, a bearer token) on the
benchmarks' own SQLite metadata database; each request timed by the client over one kept-alive
connection, after 3 unmeasured ones (B of the history: 1).

- **History**: `GET /horovod/api/history?dag_id=...&runs=N` for a DAG of N runs of the example
  retraining DAG's five tasks (prepare_data, champion_checkpoint, train, evaluate, promote), each
  with its return value, the training's `ray_job` and a few more XComs as the provider pushes them.
  Against (B) what a script would do with Airflow's REST API for the same table: the runs, their task
  instances (pages of 100), then each task instance's return value.
- **Training view**: `GET /horovod/api/training?...` for a finished training whose
  `metrics_history.json` (local storage) holds R reports of 5 metrics (one of them on every 10th
  report only), a checkpoint every 100 reports, Ray keeping 2. Against (B) the same server's plain
  one-row answer, `GET /api/v2/dags/.../taskInstances/train`: the floor of any request here.
"""


def history_value(n: int) -> dict:
    return {
        "checkpoint_uri": f"s3://b/ckpt/{n}",
        "best_checkpoint_uri": f"s3://b/ckpt/{n}",
        "metrics": {"train_mse": 0.2 + 0.1 * math.cos(n), "epoch": 4},
        "submission_id": f"ahp-train-{n}-a1",
        "dashboard_url": "http://ray:8265/#/jobs/x",
        "storage_uri": f"s3://b/runs/{n}",
        "run_uri": "x",
        "world_size": 2,
        "attempt": 1,
        "trainer_api": "v2",
        "resumed_from": None,
        "timings": {"fit_s": 30.0},
        "return_value": None,
        "timeline_uri": None,
    }


def write_rows(session, dag_id: str, run_id: str, when: datetime, tasks: list[tuple]) -> None:
    """One dag run with its task instances and XComs: ``tasks`` of (task_id, operator, custom, xcoms)."""
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.xcom import XComModel
    from sqlalchemy import insert, select

    session.execute(
        insert(DagRun).values(
            dag_id=dag_id,
            run_id=run_id,
            run_type="scheduled",
            logical_date=when,
            run_after=when,
            state="success",
            start_date=when,
            end_date=when + timedelta(minutes=3),
        )
    )
    run = session.scalar(select(DagRun.id).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id))
    for task_id, operator, custom, xcoms in tasks:
        session.execute(
            insert(TaskInstance).values(
                dag_id=dag_id,
                run_id=run_id,
                task_id=task_id,
                map_index=-1,
                pool="default_pool",
                state="success",
                try_number=1,
                operator=operator,
                custom_operator_name=custom,
                start_date=when,
                end_date=when + timedelta(seconds=40),
                duration=40.0,
            )
        )
        for key, value in xcoms.items():
            session.execute(
                insert(XComModel).values(
                    dag_run_id=run, dag_id=dag_id, run_id=run_id, task_id=task_id, map_index=-1, key=key, value=value
                )
            )


def history_tasks(n: int) -> list[tuple]:
    tasks = []
    for task_id, operator, custom, value in TASKS:
        if task_id == "train":
            result = history_value(n)
            job = {k: result[k] for k in ("submission_id", "storage_uri", "attempt", "dashboard_url", "trainer_api")}
            xcoms = {
                "return_value": result,
                "ray_job": {**job, "kind": "train"},
                "checkpoint_uri": result["checkpoint_uri"],
                "ray_log_cursor": {"lines": 812},
            }
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
        metrics = {
            "epoch": i // 100,
            "loss": 1.0 / (1 + i / 50),
            "accuracy": 1 - 0.5 / (1 + i / 50),
            "lr": 0.01 * 0.999**i,
        }
        checkpoint = None
        if i % 10 == 9:
            metrics["val_loss"] = 1.1 / (1 + i / 50)
        if i % 100 == 99:
            checkpoint = f"checkpoint_{i // 100:06d}"
            names.append(checkpoint)
        points.append({"report": i + 1, "time": 1.7e9 + i * 0.5, "metrics": metrics, "checkpoint": checkpoint})
    return points, names[-2:]


def populate() -> None:
    """The benchmark's runs, written anew."""
    import shutil

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
        session.execute(
            insert(DagModel),
            [
                {
                    "dag_id": dag_id,
                    "bundle_name": BUNDLE,
                    "max_active_tasks": 16,
                    "max_consecutive_failed_dag_runs": 0,
                    "has_task_concurrency_limits": False,
                    "is_paused": True,
                }
                for dag_id in dag_ids
            ],
        )
        for count in RUNS:
            for n in range(1, count + 1):
                when = DAY + timedelta(days=n)
                write_rows(session, f"{HISTORY_DAG}_{count}", f"scheduled__{when.isoformat()}", when, history_tasks(n))
        for i, reports in enumerate(REPORTS):
            storage = STORAGE / f"reports-{reports}"
            folder = storage / "attempt-1"
            points, kept = report_history(reports)
            folder.mkdir(parents=True)
            (folder / "metrics_history.json").write_text(json.dumps(points))
            for name in kept:
                (folder / name).mkdir()
                (folder / name / "model.pt").write_bytes(b"0" * 1024)
            result = {
                **history_value(reports),
                "storage_uri": str(storage),
                "run_uri": str(folder),
                "checkpoint_uri": str(folder / kept[-1]),
                "best_checkpoint_uri": str(folder / kept[-1]),
                "metrics": points[-1]["metrics"],
                "checkpoint_score_attribute": "val_loss",
            }
            (folder / "result.json").write_text(json.dumps({**result, "history": points[:: max(1, reports // 1000)]}))
            write_rows(
                session,
                TRAINING_DAG,
                f"reports_{reports}",
                DAY + timedelta(days=i),
                [
                    (
                        "train",
                        "HorovodTrainOperator",
                        None,
                        {
                            "return_value": result,
                            "ray_job": {
                                "kind": "train",
                                "storage_uri": str(storage),
                                "attempt": 1,
                                "submission_id": "x",
                            },
                        },
                    )
                ],
            )


class ApiServer:
    """``airflow api-server`` on a free port, with the simple auth manager's bearer token."""

    def __init__(self):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            "AIRFLOW__API_AUTH__JWT_SECRET": "ahp-bench-ui",
            "AIRFLOW__API__BASE_URL": self.url,
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API__PORT": str(self.port),
        }

    def __enter__(self):
        import httpx

        logs = OUT / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        self.log = open(logs / "ui-api-server.log", "wb")
        self.process = subprocess.Popen(
            [AIRFLOW_BIN, "api-server", "--port", str(self.port)],
            env=self.env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/api/v2/monitor/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if self.process.poll() is not None:
                raise RuntimeError(f"the api-server exited; see {logs / 'ui-api-server.log'}")
            time.sleep(1)
        else:
            raise RuntimeError("the api-server did not answer within 180 s")
        token = httpx.get(f"{self.url}/auth/token", timeout=30).json()["access_token"]
        self.client = httpx.Client(base_url=self.url, timeout=300, headers={"Authorization": f"Bearer {token}"})
        return self

    def __exit__(self, *exc):
        import signal

        self.client.close()
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)
        self.log.close()

    def get(self, path: str, **params):
        response = self.client.get(path, params=params)
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


def rest_history(server: ApiServer, dag_id: str):
    """What a script gathers through Airflow's REST API for the same table; the last response."""

    def every(path: str, key: str, **params) -> list[dict]:
        found, offset = [], 0
        while True:
            page = server.get(path, limit=100, offset=offset, **params).json()  # Airflow's largest page
            found += page[key]
            offset += 100
            if offset >= page["total_entries"]:
                return found

    # Across all DAGs, filtered by the DAG id: the written runs have no serialized DAG, which the
    # per-DAG listings look up first; the rows read are the same.
    every("/api/v2/dags/~/dagRuns", "dag_runs", dag_id_pattern=dag_id)
    tis = every("/api/v2/dags/~/dagRuns/~/taskInstances", "task_instances", dag_id_pattern=dag_id)
    last = None
    for ti in tis:
        last = server.get(
            f"/api/v2/dags/{dag_id}/dagRuns/{ti['dag_run_id']}/taskInstances/{ti['task_id']}/xcomEntries/return_value"
        )
    if len(tis) != 5 * len({ti["dag_run_id"] for ti in tis}):
        raise RuntimeError(f"the REST API listed {len(tis)} task instances of {dag_id}")
    return last


def figure() -> Figure:
    fig = Figure(8, "Answer time of the Training views", HOW)
    log("writing the benchmark's runs into the metadata database")
    started = time.monotonic()
    populate()
    fig.notes.append(f"Writing {sum(RUNS)} runs and {len(REPORTS)} histories took {time.monotonic() - started:.0f} s.")
    n = repeats(3) * 7
    rows, raw = [], {}
    with ApiServer() as server:
        for count in RUNS:
            dag_id = f"{HISTORY_DAG}_{count}"
            ours, size = timed(lambda d=dag_id, c=count: server.get("/horovod/api/history", dag_id=d, runs=c), n)
            answer = server.get("/horovod/api/history", dag_id=dag_id, runs=count).json()
            if len(answer["rows"]) != count:
                raise RuntimeError(f"the history of {dag_id} has {len(answer['rows'])} rows, not {count}")
            # B makes thousands of requests a time: measured on the largest DAG only, after one warm-up.
            rest, _ = (
                timed(lambda d=dag_id: rest_history(server, d), max(2, repeats(3) - 1), warmup=1)
                if count == max(RUNS)
                else (Sample(), 0)
            )
            rows.append(
                Row(
                    f"history, {count} runs",
                    "plugin, one query",
                    ours,
                    "REST API calls" if rest.n else "-",
                    rest,
                    "s",
                    f"answer {size / 1000:.0f} kB",
                )
            )
            raw[f"history_{count}"] = {"ours": ours.values, "rest": rest.values, "bytes": size}
        for reports in REPORTS:
            params = {"dag_id": TRAINING_DAG, "run_id": f"reports_{reports}", "task_id": "train"}
            ours, size = timed(lambda p=params: server.get("/horovod/api/training", **p), n)
            answer = server.get("/horovod/api/training", **params).json()
            if answer["curves"]["reports"] != reports or answer["problem"]:
                raise RuntimeError(f"the training view read {answer['curves']['reports']} reports: {answer['problem']}")
            floor, _ = timed(
                lambda r=reports: server.get(f"/api/v2/dags/{TRAINING_DAG}/dagRuns/reports_{r}/taskInstances/train"), n
            )
            rows.append(
                Row(
                    f"training view, {reports:,} reports",
                    "plugin",
                    ours,
                    "one task instance (REST)",
                    floor,
                    "s",
                    f"answer {size / 1000:.0f} kB",
                )
            )
            raw[f"training_{reports}"] = {"ours": ours.values, "floor": floor.values, "bytes": size}
    save_raw("ui_answer_times", raw)
    fig.tables.append(table(rows))
    history, training = rows[len(RUNS) - 1], rows[-1]
    for name, row in (
        ("8. History view of 500 runs answers within 1 s", history),
        ("8. Training view of 10,000 reports answers within 1 s", training),
    ):
        met = row.a.median < TARGET_S
        fig.targets.append(
            Target(
                name,
                met,
                f"median {fmt(row.a.median)} s ({row.a.spread()}), {row.note}",
                "" if met else "profile the answer (query, storage read, JSON); sample the points",
            )
        )
    return fig
