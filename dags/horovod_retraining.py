"""Daily retraining with Horovod on Ray: data -> train -> evaluate -> promote.

Each run works on its own data interval and writes under its own storage folder, so backfills and
reruns never overwrite each other. Everything heavy runs on the Ray cluster; the Airflow tasks only
move small JSON records.

Each run works on one day: its logical date, or, for a run triggered without one (the REST API
allows ``"logical_date": null``), the day it was asked to run (``dag_run.run_after``). ``DAY`` below
is that choice, made once and used by every task.

The champion is a log of moves (``champion.json``: ``{"current": ..., "moves": [...]}``, each move the
day, the holdout score, the checkpoint, the run and the champion it replaced). A run of day D
warm-starts from the champion *as of D*: the last one promoted for a day before D. It is judged
against the champion in force on D, and when it wins it is recorded as the champion of D.

**What a backfill does to the champion.** A backfill of last week (``airflow backfill create --dag-id
horovod_retraining --from-date 2026-11-01 --to-date 2026-11-07 --max-active-runs 1``) reproduces
last week: each day warm-starts from the champion of its own time, never from a model that has
already seen the days after it, so rerunning a day gives that day's model. A backfilled day that
beats the champion of its time is recorded in the log as such, even when a newer champion exists;
the *current* champion (the one of the latest day, which downstream DAGs load) does not move back to
older data, so a backfill never replaces it, and its Asset event is not emitted. Later days are not
retrained by a backfill of earlier ones: backfill them too if their models should learn from it.
Run a backfill with ``--max-active-runs 1``, so each day sees the moves of the days before it.

One run at a time (``max_active_runs=1``): the scheduled runs go day after day, each whole run
before the next, so trainings never overlap and a run's training, once its job has ended, finishes at
once. No limit sits on ``train`` itself: a deferred training whose job ends must be scheduled again to
finish, and a task-level limit (``max_active_tis_per_dag``, or a pool counting deferred tasks) would
hand that slot to a waiting training of another run first, so the finished one would wait a whole
training. A backfill running beside the daily run (``--max-active-runs 1``) may bring a second
training to the cluster: it waits there for its workers, deferred, holding no worker slot, for up to
``pending_timeout_seconds``. Unpausing the DAG runs today's interval only (``catchup=False``).

- ``prepare_data`` (``@task.ray``) writes the run's training and holdout data as parquet. Here it is a
  small synthetic regression problem generated from the logical date; a real pipeline reads the
  data interval from its warehouse or lake instead.
- ``train`` runs ``train_regressor`` (in ``airflow_provider_horovod/examples/retraining.py``, the
  model's own module, as your model code would be in your package) on 2 Horovod workers,
  warm-started from the champion as of the run's day when there is one, and pushes the checkpoint
  URI to XCom. Its ``job_tags`` (team, model, cost centre) label the Ray job, and its XCom carries
  what the training cost (``cost``: wall time, queueing, worker-, CPU- and GPU-seconds, every attempt).
- ``evaluate`` (``@task.ray``) loads the model from that checkpoint where torch is, on the cluster,
  and scores it on the holdout data next to the untrained baseline.
- ``promote`` refuses a smoke run's model (``[horovod] smoke_run``, the CI check of docs/ci.md): it
  records nothing and ``publish_champion`` emits nothing. Otherwise it records the new checkpoint as
  a move of the champion (a small JSON record in storage) when it beats the champion in force on its
  day, as one compare-and-swap (a lock beside a local record, a conditional write on S3); then
  ``publish_champion`` emits an Asset event for downstream DAGs, carrying the new checkpoint URI, when
  the *current* champion moved (it is skipped, emitting nothing, otherwise: no win, or a backfilled
  day's win).

Where it runs. With no ``ray_default`` connection it trains on an embedded local Ray cluster and
stores everything under ``$AIRFLOW_HOME/horovod-storage``. For a real cluster and bucket:

- create the ``ray_default`` connection (host/port of the Ray dashboard, the Ray auth token as the
  password), e.g. ``AIRFLOW_CONN_RAY_DEFAULT='{"conn_type": "ray", "host": "ray-head", "port":
  8265, "password": "..."}'``;
- set the environment variable ``HOROVOD_RETRAINING_STORAGE`` (of the scheduler, DAG processor
  and workers) to ``s3://my-bucket/retraining``; the Ray nodes need write access to it (instance
  role or their environment), Airflow reads it with its own AWS environment. (It is read when the
  file is parsed, so it is an environment variable rather than an Airflow Variable, which would
  cost a metadata database query at every parse.)

This file imports no torch, horovod or ray.train: the scheduler parses it often.
"""

from __future__ import annotations

import json
import os

import pendulum
from airflow.sdk import Asset, dag, task

from airflow_provider_horovod.contract import default_storage_path
from airflow_provider_horovod.operators.horovod import HorovodTrainOperator

STORAGE = os.environ.get("HOROVOD_RETRAINING_STORAGE") or default_storage_path()
ROOT = f"{STORAGE.rstrip('/')}/horovod_retraining"
CHAMPION = f"{ROOT}/champion.json"
# Downstream DAGs can be scheduled on this; each event's extra carries the new checkpoint URI.
CHAMPION_ASSET = Asset(name="horovod_retraining_champion")
# The run's day: its logical date, else (a run triggered without one) when it was asked to run.
DAY = "{{ (dag_run.logical_date or dag_run.run_after) | ds }}"


@dag(
    schedule="@daily",
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    catchup=False,  # a backfill is asked for (airflow backfill create), not started by unpausing
    # One run at a time, each day after the one before: trainings queue as runs, never as task slots.
    max_active_runs=1,
    tags=["horovod", "retraining", "example"],
)
def horovod_retraining():
    @task.ray(storage_path=STORAGE)
    def prepare_data(day: str) -> dict:
        """Write this interval's training and holdout data (on the cluster)."""
        from datetime import date

        from airflow_provider_horovod.examples.retraining import write_data

        seed = (date.fromisoformat(day) - date(1970, 1, 1)).days
        return write_data(seed, f"{ROOT}/data/{day.replace('-', '')}")

    @task
    def champion_checkpoint(day: str) -> str:
        """The checkpoint URI of the champion as of ``day`` to warm-start from ("" when there is none)."""
        from airflow_provider_horovod.examples.retraining import champion_as_of
        from airflow_provider_horovod.storage import Storage

        champion = champion_as_of(Storage().read_json(CHAMPION), day)
        return champion["checkpoint_uri"] if champion else ""

    data = prepare_data(DAY)
    warm_start = champion_checkpoint(DAY)

    train = HorovodTrainOperator(
        task_id="train",
        train_fn="airflow_provider_horovod.examples.retraining:train_regressor",
        train_loop_config={"num_epochs": 5, "lr": 0.01, "batch_size": 32, "init_checkpoint": warm_start},
        datasets={"train": "{{ ti.xcom_pull(task_ids='prepare_data')['train'] }}"},
        num_workers=2,
        storage_path=STORAGE,
        checkpoint_num_to_keep=2,
        # No max_active_tis_per_dag (or pool) here: the runs are serialised above, and a task-level
        # limit would make a finished training wait for another run's whole training to resume.
        # Who pays: Ray job metadata (the dashboard filters on it), returned in XCom with the cost.
        job_tags={"team": "forecasting", "model": "horovod_retraining", "cost_centre": "ml-platform"},
    )
    data >> train

    @task.ray(storage_path=STORAGE)
    def evaluate(result: dict, data: dict) -> dict:
        """Score the trained model on the holdout data, next to the untrained baseline (on the cluster)."""
        from airflow_provider_horovod.examples.retraining import evaluate as score

        scores = score(result["checkpoint_uri"], data["holdout"])
        return {
            "checkpoint_uri": result["checkpoint_uri"],
            **scores,
            "submission_id": result["submission_id"],
            "smoke_run": result.get("smoke_run", False),
        }

    @task
    def promote(evaluation: dict, warm_start: str, day: str, run_id=None) -> dict:
        """Record the new checkpoint as the champion of its day when it beats the champion in force then."""
        from airflow_provider_horovod.examples.retraining import champion_as_of, with_move
        from airflow_provider_horovod.storage import Storage

        candidate = {**evaluation, "logical_date": day, "run_id": run_id}
        if evaluation.get("smoke_run"):
            # A smoke run's model saw a few rows for one step: it checks the DAG, it never becomes a champion.
            print("Smoke run: the champion is left as it is (nothing promoted, no Asset event).")
            before, after = None, None
        else:
            before, after = Storage().swap_json(CHAMPION, lambda record: with_move(record, candidate))
        in_force = champion_as_of(before, day, inclusive=True)
        current = (after or before or {}).get("current") or {}
        summary = {
            **candidate,
            "warm_start": warm_start,
            "promoted": after is not None,
            # The champion downstream loads moved: a win on the latest day (a backfilled day's win does not).
            "current": after is not None and current.get("run_id") == run_id,
            "champion_before": {k: in_force[k] for k in ("logical_date", "holdout_mse")} if in_force else None,
        }
        print("AHP_RETRAINING " + json.dumps(summary))
        return summary

    @task(outlets=[CHAMPION_ASSET])
    def publish_champion(summary: dict, outlet_events=None) -> None:
        """An Asset event for downstream DAGs, only when the current champion moved: a skipped task emits none."""
        from airflow.providers.common.compat.sdk import AirflowSkipException

        if not summary["current"]:
            raise AirflowSkipException("The current champion stays; nothing new for downstream DAGs.")
        outlet_events[CHAMPION_ASSET].extra = {
            "checkpoint_uri": summary["checkpoint_uri"],
            "holdout_mse": summary["holdout_mse"],
        }

    publish_champion(promote(evaluate(train.output, data), warm_start, DAY))


horovod_retraining()
