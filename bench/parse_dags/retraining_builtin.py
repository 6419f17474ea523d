"""Figure 3's baseline: ``dags/horovod_retraining.py`` as a user would write it with Airflow's own operators only
(the same tasks, schedule, Asset and templates; Ray jobs submitted by hand, a lock file for the compare-and-swap).
Like the original, it imports no model code at parse time, so the comparison isolates what the provider costs."""

from __future__ import annotations

import json
import os

import pendulum
from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import Asset, dag, task

STORAGE = os.environ.get("HOROVOD_RETRAINING_STORAGE") or os.path.join(
    os.environ.get("AIRFLOW_HOME") or os.path.expanduser("~/airflow"), "horovod-storage"
)
ROOT = f"{STORAGE.rstrip('/')}/horovod_retraining"
CHAMPION = f"{ROOT}/champion.json"
CHAMPION_ASSET = Asset(name="horovod_retraining_champion_builtin")


def run_on_ray(code: str, env: dict, poll_s: float = 10) -> str:
    """Submit ``python -c code`` as a Ray job and poll it: what the provider does, by hand. Returns
    the job's log (the code prints its JSON result as its last line)."""
    import shlex
    import time

    from ray.job_submission import JobStatus, JobSubmissionClient

    client = JobSubmissionClient(os.environ.get("RAY_DASHBOARD", "http://127.0.0.1:8265"))
    submission_id = client.submit_job(
        entrypoint=f"python -c {shlex.quote(code)}",
        runtime_env={"env_vars": {k: json.dumps(v) for k, v in env.items()}},
    )
    while (status := client.get_job_status(submission_id)) not in (
        JobStatus.SUCCEEDED,
        JobStatus.FAILED,
        JobStatus.STOPPED,
    ):
        time.sleep(poll_s)
    logs = client.get_job_logs(submission_id)
    if status != JobStatus.SUCCEEDED:
        raise RuntimeError(f"Ray job {submission_id} ended {status}:\n{logs[-2000:]}")
    return logs


def last_json(logs: str) -> dict:
    return json.loads(logs.strip().splitlines()[-1])


def train_with_ray(train_loop_config: dict, dataset_uri: str, storage_path: str, run_id: str) -> dict:
    """The training as a Ray job running Ray's HorovodTrainer (the model's own function, by import path)."""
    code = (
        "import json, os; from ray.train import RunConfig, ScalingConfig, CheckpointConfig; "
        "from ray.train.horovod import HorovodTrainer; import ray.data; "
        "from airflow_provider_horovod.examples.retraining import train_regressor; "
        "r = HorovodTrainer(train_regressor, train_loop_config=json.loads(os.environ['CONFIG']), "
        "datasets={'train': ray.data.read_parquet(json.loads(os.environ['DATA']))}, "
        "scaling_config=ScalingConfig(num_workers=2), run_config=RunConfig(storage_path="
        "json.loads(os.environ['STORAGE']), checkpoint_config=CheckpointConfig(num_to_keep=2))).fit(); "
        "print(json.dumps({'checkpoint_uri': r.checkpoint.path, 'metrics': r.metrics}))"
    )
    logs = run_on_ray(code, {"CONFIG": train_loop_config, "DATA": dataset_uri, "STORAGE": f"{storage_path}/{run_id}"})
    return last_json(logs)


@dag(
    schedule="@daily",
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    catchup=False,
    tags=["horovod", "retraining", "example"],
)
def horovod_retraining_builtin():
    @task
    def prepare_data(day: str) -> dict:
        """Write this interval's training and holdout data, in a Ray job."""
        code = (
            "import json, os; from datetime import date; "
            "from airflow_provider_horovod.examples.retraining import write_data; "
            "day = json.loads(os.environ['DAY']); seed = (date.fromisoformat(day) - date(1970, 1, 1)).days; "
            "print(json.dumps(write_data(seed, json.loads(os.environ['FOLDER']) + '/' + day.replace('-', ''))))"
        )
        return last_json(run_on_ray(code, {"DAY": day, "FOLDER": f"{ROOT}/data"}))

    @task
    def champion_checkpoint() -> str:
        """The champion's checkpoint URI to warm-start from ("" when there is none yet)."""
        try:
            with open(CHAMPION) as f:
                return json.load(f)["checkpoint_uri"]
        except FileNotFoundError:
            return ""

    data = prepare_data("{{ ds }}")
    warm_start = champion_checkpoint()

    train = PythonOperator(
        task_id="train",
        python_callable=train_with_ray,
        op_kwargs={
            "train_loop_config": {"num_epochs": 5, "lr": 0.01, "batch_size": 32, "init_checkpoint": warm_start},
            "dataset_uri": "{{ ti.xcom_pull(task_ids='prepare_data')['train'] }}",
            "storage_path": STORAGE,
            "run_id": "{{ run_id }}",
        },
        max_active_tis_per_dag=1,
    )
    data >> train

    @task
    def evaluate(result: dict, data: dict) -> dict:
        """Score the trained model on the holdout data, next to the untrained baseline, in a Ray job."""
        code = (
            "import json, os; from airflow_provider_horovod.examples.retraining import evaluate; "
            "print(json.dumps(evaluate(json.loads(os.environ['CKPT']), json.loads(os.environ['HOLDOUT']))))"
        )
        scores = last_json(run_on_ray(code, {"CKPT": result["checkpoint_uri"], "HOLDOUT": data["holdout"]}))
        return {"checkpoint_uri": result["checkpoint_uri"], **scores}

    @task
    def promote(evaluation: dict, ds=None, run_id=None) -> dict:
        """Move the champion pointer when the candidate is newer and better: compare-and-swap under a lock."""
        import fcntl

        candidate = {**evaluation, "logical_date": ds, "run_id": run_id}
        os.makedirs(os.path.dirname(CHAMPION), exist_ok=True)
        with open(CHAMPION + ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                with open(CHAMPION) as f:
                    champion = json.load(f)
            except FileNotFoundError:
                champion = None
            promoted = champion is None or (
                candidate["logical_date"] > champion.get("logical_date", "")
                and candidate["holdout_mse"] < champion["holdout_mse"]
            )
            if promoted:
                with open(CHAMPION + ".tmp", "w") as f:
                    json.dump(candidate, f)
                os.replace(CHAMPION + ".tmp", CHAMPION)
        summary = {
            **candidate,
            "promoted": promoted,
            "champion_before": {k: champion[k] for k in ("logical_date", "holdout_mse")} if champion else None,
        }
        print("AHP_RETRAINING " + json.dumps(summary))
        return summary

    @task(outlets=[CHAMPION_ASSET])
    def publish_champion(summary: dict, outlet_events=None) -> None:
        """An Asset event for downstream DAGs, only when the champion moved: a skipped task emits none."""
        from airflow.exceptions import AirflowSkipException

        if not summary["promoted"]:
            raise AirflowSkipException("The champion stays; nothing new for downstream DAGs.")
        outlet_events[CHAMPION_ASSET].extra = {
            "checkpoint_uri": summary["checkpoint_uri"],
            "holdout_mse": summary["holdout_mse"],
        }

    publish_champion(promote(evaluate(train.output, data)))


horovod_retraining_builtin()
