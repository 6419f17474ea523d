"""A retraining DAG for the history view's browser test, in seconds: ``train`` stands in for a
training (no Ray job) by leaving what one leaves, as the provider lays it out: the ``ray_job`` XCom,
the attempt's metric history and checkpoint folders, and a result as its return value; then
``evaluate`` and ``promote`` return numbers and whether the champion moved, as
``dags/horovod_retraining.py`` does. The real provider writing these is what the Training view's
test checks, on a real training."""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import dag, get_current_context, task


@task
def train() -> dict:
    import json
    import time

    from airflow_provider_horovod import cost
    from airflow_provider_horovod.contract import HISTORY_FILE, XCOM_JOB, attempt_uri, result_uri

    context = get_current_context()
    ti = context["ti"]
    day = context["dag_run"].logical_date.day
    storage = os.path.join(os.environ["AIRFLOW_HOME"], "view-history", context["run_id"].replace(":", "_"))
    job = {
        "submission_id": f"stand-in-{day}",
        "storage_uri": storage,
        "attempt": 1,
        "dashboard_url": "http://127.0.0.1:8265/#/jobs/stand-in",
        "kind": "train",
        "trainer_api": "v2",
        "checkpoint_score_attribute": "val_loss",
    }
    ti.xcom_push(key=XCOM_JOB, value=job)
    folder = attempt_uri(storage, 1)
    os.makedirs(folder, exist_ok=True)
    # Each day trains a bit better: the curves differ from run to run.
    history = []
    for step in range(8):
        point = {
            "report": step + 1,
            "time": time.time() + step,
            "metrics": {"epoch": step, "loss": 1.0 / (step + 1) / day},
            "checkpoint": None,
        }
        if step % 2:
            point["metrics"]["val_loss"] = 1.2 / (step + 1) / day
            point["checkpoint"] = f"checkpoint_{step:06d}"
            if step >= 5:  # Ray keeps the last two
                os.makedirs(os.path.join(folder, point["checkpoint"]), exist_ok=True)
                with open(os.path.join(folder, point["checkpoint"], "model.txt"), "w") as f:
                    f.write(str(step))
        history.append(point)
    last = history[-1]
    # What the run cost, as the finish step reckons it: two workers held for the training's 12.5 s.
    started = time.time() - 14.0
    attempt = cost.attempt_cost(
        {"attempt": 1, "submission_id": job["submission_id"], "timings": {"fit_s": 12.5}, "world_size": 2},
        failed=False,
        submitted_at=started,
        ended_at=started + 14.0,
        worker_groups=[{"started_at": started + 1.0, "world_size": 2}],
        per_worker={"CPU": 1.0},
        prices=None,
    )
    with open(f"{folder}/{HISTORY_FILE}", "w") as f:
        json.dump(history, f)
    checkpoint = f"{folder}/{last['checkpoint']}"
    result = {
        "checkpoint_uri": checkpoint,
        "best_checkpoint_uri": checkpoint,
        "metrics": last["metrics"],
        "storage_uri": storage,
        "run_uri": folder,
        "world_size": 2,
        "attempt": 1,
        "trainer_api": "v2",
        "resumed_from": None,
        "timings": {"fit_s": 12.5},
        "return_value": None,
        "timeline_uri": None,
        "submission_id": job["submission_id"],
        "dashboard_url": job["dashboard_url"],
        "checkpoint_score_attribute": "val_loss",
        "cost": cost.task_run_cost([attempt], per_worker={"CPU": 1.0}, prices=None),
    }
    with open(result_uri(storage, 1), "w") as f:
        json.dump({**result, "history": history}, f)
    return result


@task
def evaluate(result: dict) -> dict:
    return {"checkpoint_uri": result["checkpoint_uri"], "holdout_mse": result["metrics"]["val_loss"] * 1.1}


@task
def promote(evaluation: dict) -> dict:
    day = get_current_context()["dag_run"].logical_date.day
    return {**evaluation, "promoted": day != 2}


@dag(schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False)
def ahp_stack_view_history():
    promote(evaluate(train()))


ahp_stack_view_history()
