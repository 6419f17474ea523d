"""``dags/horovod_retraining.py`` as a user would write it with Airflow's own operators only: the
same tasks, params, Asset and templates, with training submitted by a PythonOperator through Ray's
``JobSubmissionClient``. Figure 3 parses both; this one is the baseline.

It imports the same model module as the original (the user's own code, not the provider's
orchestration), so the comparison isolates what the operator costs at parse time.
"""

from __future__ import annotations

import json
import os

import pendulum
from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import Asset, Param, dag, task

from airflow_provider_horovod.examples.retraining import holdout_mse, make_data, read_holdout

STORAGE = os.environ.get("HOROVOD_RETRAINING_STORAGE") or os.path.join(
    os.environ.get("AIRFLOW_HOME") or os.path.expanduser("~/airflow"), "horovod-storage")
ROOT = f"{STORAGE.rstrip('/')}/horovod_retraining"
CHAMPION = f"{ROOT}/champion.json"
CHAMPION_ASSET = Asset(name="horovod_retraining_champion_builtin")


def train_with_ray(train_loop_config: dict, dataset_uri: str, storage_path: str, run_id: str) -> dict:
    """Submit the training as a Ray job and poll it: what the operator does, by hand."""
    import time

    from ray.job_submission import JobStatus, JobSubmissionClient

    client = JobSubmissionClient(os.environ.get("RAY_DASHBOARD", "http://127.0.0.1:8265"))
    submission_id = client.submit_job(
        entrypoint="python train.py",
        runtime_env={"env_vars": {"CONFIG": json.dumps(train_loop_config), "DATA": dataset_uri,
                                  "STORAGE": f"{storage_path}/{run_id}"}},
    )
    while (status := client.get_job_status(submission_id)) not in (JobStatus.SUCCEEDED, JobStatus.FAILED,
                                                                     JobStatus.STOPPED):
        time.sleep(10)
    if status != JobStatus.SUCCEEDED:
        raise RuntimeError(f"Ray job {submission_id} ended {status}")
    return {"submission_id": submission_id, "checkpoint_uri": f"{storage_path}/{run_id}/checkpoint"}


@dag(
    dag_id="horovod_retraining_builtin",
    schedule="@daily",
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    catchup=True,
    max_active_runs=1,
    tags=["horovod", "retraining", "example"],
    params={"evaluate_on_ray": Param(False, type="boolean",
                                     description="score the model in a Ray job instead of the Airflow task")},
)
def horovod_retraining_builtin():
    @task
    def prepare_data(data_interval_start=None, ds_nodash=None, run_id=None) -> dict:
        import io

        import pyarrow as pa
        import pyarrow.parquet as pq

        seed = int(data_interval_start.timestamp()) // 86400
        folder = f"{ROOT}/data/{ds_nodash}"
        os.makedirs(folder, exist_ok=True)
        uris = {}
        for name, n, offset in (("train", 512, 0), ("holdout", 256, 1_000_000)):
            buffer = io.BytesIO()
            pq.write_table(pa.table(make_data(seed + offset, n)), buffer)
            uris[name] = f"{folder}/{name}.parquet"
            with open(uris[name], "wb") as f:
                f.write(buffer.getvalue())
        return uris

    @task
    def champion_checkpoint() -> str:
        try:
            with open(CHAMPION) as f:
                return json.load(f)["checkpoint_uri"]
        except FileNotFoundError:
            return ""

    data = prepare_data()
    warm_start = champion_checkpoint()

    train = PythonOperator(
        task_id="train",
        python_callable=train_with_ray,
        op_kwargs={
            "train_loop_config": {"num_epochs": 5, "lr": 0.01, "batch_size": 32,
                                  "init_checkpoint": "{{ ti.xcom_pull(task_ids='champion_checkpoint') }}"},
            "dataset_uri": "{{ ti.xcom_pull(task_ids='prepare_data')['train'] }}",
            "storage_path": STORAGE,
            "run_id": "{{ run_id }}",
        },
    )
    [data, warm_start] >> train

    @task
    def evaluate(result: dict, data: dict, params=None, ti=None) -> dict:
        holdout = read_holdout(data["holdout"])
        scores = {"holdout_mse": holdout_mse(result["checkpoint_uri"], holdout),
                  "baseline_mse": holdout_mse(None, holdout)}
        return {"checkpoint_uri": result["checkpoint_uri"], **scores, "submission_id": result["submission_id"]}

    @task(outlets=[CHAMPION_ASSET])
    def promote(evaluation: dict, outlet_events=None, run_id=None) -> dict:
        try:
            with open(CHAMPION) as f:
                champion = json.load(f)
        except FileNotFoundError:
            champion = None
        promoted = champion is None or evaluation["holdout_mse"] < champion["holdout_mse"]
        if promoted:
            with open(CHAMPION + ".tmp", "w") as f:
                json.dump({**evaluation, "run_id": run_id}, f)
            os.replace(CHAMPION + ".tmp", CHAMPION)
            outlet_events[CHAMPION_ASSET].extra = {"checkpoint_uri": evaluation["checkpoint_uri"]}
        return {**evaluation, "promoted": promoted}

    promote(evaluate(train.output, data))


horovod_retraining_builtin()
