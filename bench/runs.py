"""The training runs that figures 1 (overhead), 2 (completion latency) and 6 (training path) share.

Every way of running ``bench.workload.train_mlp`` on 2 workers, on the same local cluster, in turn
within each repeat (the order rotates from repeat to repeat), so the machine's drifting load falls
on all of them alike:

- ``direct``: ``bench.train_script`` run on the cluster as a plain driver, Ray's ``HorovodTrainer``.
- ``plain_job``: ``bench.submit_script``: the same script as a Ray job, polled every second.
- ``operator_sync`` / ``operator_deferred``: HorovodTrainOperator under ``airflow dags test``,
  ``trainer_api="legacy"``, so the job trains exactly as the two above (Ray's ``HorovodTrainer``).
- ``operator_deferred_v2``: the operator's defaults (deferred here, Train V2 with our Horovod backend).
- ``ddp_direct``: ``bench.train_script`` with Ray's ``TorchTrainer`` (DDP over Gloo).
"""

from __future__ import annotations

import json
import sqlite3
import time
from datetime import datetime, timezone

from bench.common import AIRFLOW_HOME, OUT, PY, dags_test, job_of_run, lines_in, log, operator_times, run_logged
from harness.airflow_cli import tagged_json

# The ways, as the module's docstring says; each runs once per repeat, in a rotating order.
WAYS = ("direct", "plain_job", "operator_sync", "operator_deferred", "operator_deferred_v2", "ddp_direct")
DAG_IDS = {
    "operator_sync": "bench_train_sync_legacy",
    "operator_deferred": "bench_train_deferred_legacy",
    "operator_deferred_v2": "bench_train_deferred_v2",
}
TIMINGS_FILE = OUT / "operator-timings.jsonl"


def db_time(text: str | None) -> float | None:
    """Airflow's sqlite timestamps are naive UTC."""
    if not text:
        return None
    return datetime.fromisoformat(text).replace(tzinfo=timezone.utc).timestamp()


def task_times(dag_id: str, run_id: str) -> tuple[float | None, float | None]:
    with sqlite3.connect(AIRFLOW_HOME / "airflow.db") as db:
        row = db.execute(
            "select start_date, end_date from task_instance where dag_id=? and run_id=? and task_id='train'",
            (dag_id, run_id),
        ).fetchone()
    return (db_time(row[0]), db_time(row[1])) if row else (None, None)


def job_info(hook, submission_id: str) -> dict:
    info = hook.get_job_info(submission_id) or {}
    return {
        "job_start": (info.get("start_time") or 0) / 1000 or None,
        "job_end": (info.get("end_time") or 0) / 1000 or None,
        "job_status": info.get("status"),
    }


def run_direct(trainer: str, name: str, config: str, ray_env: dict) -> dict:
    cmd = [PY, "-m", "bench.train_script", "--trainer", trainer, "--storage", str(OUT / "storage"), "--name", name]
    run, wall = run_logged([*cmd, "--config", config, "--direct"], f"{name}.log", env=ray_env)
    (result,) = tagged_json(run.stdout, "AHP_BENCH_RESULT")
    return {"process_wall_s": wall, "wall_s": wall, "steps_per_s": result["metrics"].get("steps_per_s")}


def run_plain_job(hook, name: str, config: str) -> dict:
    cmd = [PY, "-m", "bench.submit_script", "--trainer", "horovod", "--storage", str(OUT / "storage"), "--name", name]
    run, wall = run_logged([*cmd, "--config", config], f"{name}.log")
    (submit,) = tagged_json(run.stdout, "AHP_BENCH_SUBMIT")
    info = job_info(hook, submit["submission_id"])
    (result,) = tagged_json(hook.get_job_logs(submit["submission_id"]), "AHP_BENCH_RESULT")
    return {
        "process_wall_s": wall,
        "wall_s": submit["submit_to_done_s"],
        **info,
        "latency_s": submit["done_at"] - info["job_end"],
        "steps_per_s": result["metrics"].get("steps_per_s"),
    }


def run_operator(hook, way: str, name: str, config: str) -> dict:
    dag_id = DAG_IDS[way]
    env = {"BENCH_TIMINGS_FILE": str(TIMINGS_FILE), "BENCH_TRAIN_CONFIG": config}
    before = lines_in(TIMINGS_FILE)
    _, wall = dags_test(dag_id, f"{name}.log", env=env)
    run_id, start, done = operator_times(TIMINGS_FILE, before, dag_id)
    task_start, task_end = task_times(dag_id, run_id)
    job = job_of_run(hook, dag_id, run_id)
    info = job_info(hook, job["submission_id"])
    (record,) = tagged_json(hook.get_job_logs(job["submission_id"]), "AHP_RESULT")
    return {
        "process_wall_s": wall,
        "wall_s": done - start,
        "task_s": task_end - task_start,
        **info,
        "latency_s": task_end - info["job_end"],
        "result_latency_s": done - info["job_end"],
        "steps_per_s": record["metrics"].get("steps_per_s"),
        "submission_id": job["submission_id"],
    }


def training_runs(repeats: int, config: dict, ray_env: dict) -> list[dict]:
    """Run every way ``repeats`` times; one record per run (bench/out/runs.json keeps them)."""
    from airflow_provider_horovod.hooks.ray import RayHook

    hook = RayHook()
    text = json.dumps(config)
    ways = list(WAYS)
    records = []
    for rep in range(repeats):
        order = ways[rep % len(ways) :] + ways[: rep % len(ways)]
        for way in order:
            name = f"{way}-{rep}-{int(time.time())}"
            log(f"training run {way} (repeat {rep + 1}/{repeats})")
            if way == "direct":
                record = run_direct("horovod", name, text, ray_env)
            elif way == "ddp_direct":
                record = run_direct("torch", name, text, ray_env)
            elif way == "plain_job":
                record = run_plain_job(hook, name, text)
            else:
                record = run_operator(hook, way, name, text)
            records.append({"way": way, "repeat": rep, **record})
            log(f"  {way}: wall {record['wall_s']:.1f} s, steps/s {record.get('steps_per_s')}")
    return records
