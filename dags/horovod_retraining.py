"""Daily retraining with Horovod on Ray: data -> train -> evaluate -> promote.

Each run works on its own data interval (``catchup=True``, so a backfill of N days is N runs), and
writes under its own storage folder, so backfills and reruns never overwrite each other.

- ``prepare_data`` writes the run's training and holdout data as parquet. Here it is a small
  synthetic regression problem generated from the logical date; a real pipeline reads the data
  interval from its warehouse or lake instead (see the comment in the task).
- ``train`` runs ``train_regressor`` (in ``airflow_provider_horovod/examples/retraining.py``, the
  model's own module, as your model code would be in your package) on 2 Horovod workers on Ray, warm-started from the current
  champion's checkpoint when there is one, and pushes the checkpoint URI to XCom.
- ``evaluate`` loads the model from that checkpoint (local path or S3) and scores it on the
  holdout data, next to the untrained baseline.
- ``promote`` moves the champion pointer (a small JSON record in storage) to the new checkpoint,
  atomically, only when it beats the champion; then ``publish_champion`` emits an Asset event for
  downstream DAGs, carrying the new checkpoint URI (it is skipped, emitting nothing, otherwise).

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

For a model too big for an Airflow worker, the same evaluation runs as a Ray job on the cluster
(the ``evaluate_on_ray`` param: ``airflow dags trigger horovod_retraining --conf
'{"evaluate_on_ray": true}'``); the Airflow task only submits it, waits and reads the scores.

This file imports no torch, horovod or ray.train: the scheduler parses it often.
"""

from __future__ import annotations

import json
import os

import pendulum
from airflow.sdk import Asset, Param, dag, task

from airflow_provider_horovod.examples.retraining import holdout_mse, make_data, read_holdout
from airflow_provider_horovod.operators.horovod import HorovodTrainOperator
from airflow_provider_horovod.training import default_storage_path

STORAGE = os.environ.get("HOROVOD_RETRAINING_STORAGE") or default_storage_path()
ROOT = f"{STORAGE.rstrip('/')}/horovod_retraining"
CHAMPION = f"{ROOT}/champion.json"
# Downstream DAGs can be scheduled on this; each event's extra carries the new checkpoint URI.
CHAMPION_ASSET = Asset(name="horovod_retraining_champion")


def evaluate_on_ray(result: dict, holdout_uri: str, try_number: int) -> dict:
    """The evaluation as a Ray job: the cluster loads the checkpoint and writes the scores to storage;
    this task only submits and waits. A retry re-attaches to an earlier try's job that is still
    running or has succeeded, and submits a new one only after a failed one."""
    import shlex

    from airflow_provider_horovod.hooks.ray import RayHook
    from airflow_provider_horovod.storage import Storage
    from airflow_provider_horovod.training import provider_py_module

    hook = RayHook()
    for n in range(try_number, 0, -1):
        submission_id = f"{result['submission_id']}-eval-t{n}"
        info = hook.get_job_info(submission_id)
        if info and info["status"] not in ("FAILED", "STOPPED"):
            break
    else:
        submission_id = f"{result['submission_id']}-eval-t{try_number}"
    scores_uri = f"{result['storage_uri']}/{submission_id}.json"
    if hook.get_job_info(submission_id) is None:
        args = ["--checkpoint", result["checkpoint_uri"], "--holdout", holdout_uri, "--out", scores_uri]
        hook.submit_job(
            submission_id=submission_id,
            entrypoint="python -m airflow_provider_horovod.examples.retraining " + shlex.join(args),
            runtime_env={"py_modules": [provider_py_module()]},
        )
    print(f"Evaluating on Ray: {hook.get_job_url(submission_id)}")
    hook.wait_for_job(submission_id, timeout=3600)
    scores = Storage().read_json(scores_uri)
    if scores is None:
        raise RuntimeError(f"Ray job {submission_id} succeeded but wrote no scores to {scores_uri}.")
    return scores


@dag(
    schedule="@daily",
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    catchup=True,
    max_active_runs=1,  # runs promote one after another, so the champion moves in date order
    tags=["horovod", "retraining", "example"],
    params={"evaluate_on_ray": Param(False, type="boolean",
                                     description_md="give true or false (JSON booleans): true scores the model "
                                                 "in a Ray job instead of the Airflow task")},
)
def horovod_retraining():
    @task
    def prepare_data(data_interval_start=None, ds_nodash=None, run_id=None) -> dict:
        """Write this interval's training and holdout data as parquet under the run's folder."""
        import io

        import pyarrow as pa
        import pyarrow.parquet as pq

        from airflow_provider_horovod.storage import Storage

        # A real pipeline reads the rows of [data_interval_start, data_interval_end) from its
        # source here (a warehouse query, a lake partition) instead of generating them.
        seed = int(data_interval_start.timestamp()) // 86400
        folder = f"{ROOT}/data/{ds_nodash}"
        storage = Storage()
        uris = {}
        for name, n, offset in (("train", 512, 0), ("holdout", 256, 1_000_000)):
            buffer = io.BytesIO()
            pq.write_table(pa.table(make_data(seed + offset, n)), buffer)
            uris[name] = f"{folder}/{name}.parquet"
            storage.write_bytes(uris[name], buffer.getvalue())
        return uris

    @task
    def champion_checkpoint() -> str:
        """The champion's checkpoint URI to warm-start from ("" when there is none yet)."""
        from airflow_provider_horovod.storage import Storage

        champion = Storage().read_json(CHAMPION)
        return champion["checkpoint_uri"] if champion else ""

    data = prepare_data()
    warm_start = champion_checkpoint()

    train = HorovodTrainOperator(
        task_id="train",
        train_fn="airflow_provider_horovod.examples.retraining:train_regressor",
        train_loop_config={
            "num_epochs": 5,
            "lr": 0.01,
            "batch_size": 32,
            "init_checkpoint": "{{ ti.xcom_pull(task_ids='champion_checkpoint') }}",
        },
        datasets={"train": "{{ ti.xcom_pull(task_ids='prepare_data')['train'] }}"},
        num_workers=2,
        storage_path=STORAGE,
        checkpoint_num_to_keep=2,
    )
    [data, warm_start] >> train

    @task
    def evaluate(result: dict, data: dict, params=None, ti=None) -> dict:
        """Score the trained model on the holdout data, next to the untrained baseline."""
        if params["evaluate_on_ray"]:
            scores = evaluate_on_ray(result, data["holdout"], try_number=ti.try_number)
        else:
            import tempfile

            from airflow_provider_horovod.storage import Storage

            # Load the model from its checkpoint (local path or S3) in this task.
            storage = Storage()
            with tempfile.TemporaryDirectory() as tmp:
                holdout = read_holdout(storage.download_file(data["holdout"], os.path.join(tmp, "holdout.parquet")))
                checkpoint = storage.download_folder(result["checkpoint_uri"], os.path.join(tmp, "ckpt"))
                scores = {"holdout_mse": holdout_mse(checkpoint, holdout), "baseline_mse": holdout_mse(None, holdout)}
        print(f"holdout MSE: baseline {scores['baseline_mse']:.4f}, trained {scores['holdout_mse']:.4f}")
        return {"checkpoint_uri": result["checkpoint_uri"], **scores, "submission_id": result["submission_id"]}

    @task
    def promote(evaluation: dict, run_id=None) -> dict:
        """Move the champion pointer to the new checkpoint when it is better."""
        from airflow_provider_horovod.storage import Storage

        storage = Storage()
        champion = storage.read_json(CHAMPION)
        promoted = champion is None or evaluation["holdout_mse"] < champion["holdout_mse"]
        if promoted:
            # One atomic write (rename or single S3 put): readers see the old or the new pointer.
            storage.write_json(CHAMPION, {**evaluation, "run_id": run_id})
        summary = {**evaluation, "promoted": promoted,
                   "champion_mse_before": champion["holdout_mse"] if champion else None}
        print("AHP_RETRAINING " + json.dumps(summary))
        return summary

    @task(outlets=[CHAMPION_ASSET])
    def publish_champion(summary: dict, outlet_events=None) -> None:
        """An Asset event for downstream DAGs, only when the champion moved: a skipped task emits none."""
        from airflow.sdk.exceptions import AirflowSkipException

        if not summary["promoted"]:
            raise AirflowSkipException("The champion stays; nothing new for downstream DAGs.")
        outlet_events[CHAMPION_ASSET].extra = {"checkpoint_uri": summary["checkpoint_uri"],
                                               "holdout_mse": summary["holdout_mse"]}

    publish_champion(promote(evaluate(train.output, data)))


horovod_retraining()
