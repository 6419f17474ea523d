"""Daily retraining with Horovod on Ray: data -> train -> evaluate -> promote.

Each run works on its own data interval (``catchup=True``, so a backfill of N days is N runs), and
writes under its own storage folder, so backfills and reruns never overwrite each other.

- ``prepare_data`` writes the run's training and holdout data as parquet. Here it is a small
  synthetic regression problem generated from the logical date; a real pipeline reads the data
  interval from its warehouse or lake instead (see the comment in the task).
- ``train`` runs ``train_regressor`` on 2 Horovod workers on Ray, warm-started from the current
  champion's checkpoint when there is one, and pushes the checkpoint URI to XCom.
- ``evaluate`` loads the model from that checkpoint (local path or S3) and scores it on the
  holdout data, next to the untrained baseline.
- ``promote`` moves the champion pointer (a small JSON record in storage) to the new checkpoint,
  atomically, only when it beats the champion, and emits an Asset event for downstream DAGs.

Where it runs. With no ``ray_default`` connection it trains on an embedded local Ray cluster and
stores everything under ``$AIRFLOW_HOME/horovod-storage``. For a real cluster and bucket:

- create the ``ray_default`` connection (host/port of the Ray dashboard, the Ray auth token as the
  password), e.g. ``AIRFLOW_CONN_RAY_DEFAULT='{"conn_type": "ray", "host": "ray-head", "port":
  8265, "password": "..."}'``;
- set the Airflow Variable (or environment variable) ``HOROVOD_RETRAINING_STORAGE`` to
  ``s3://my-bucket/retraining``; the Ray nodes need write access to it (instance role or their
  environment), Airflow reads it with ``aws_conn_id`` or its own AWS environment.

For a model too big for an Airflow worker, ``evaluate_on_ray`` shows the same evaluation as a Ray
job (set ``HOROVOD_RETRAINING_EVALUATE_ON_RAY=1``).

This file imports no torch, horovod or ray.train: the scheduler parses it often.
"""

from __future__ import annotations

import json
import os

import pendulum
from airflow.sdk import Asset, dag, task

from airflow_provider_horovod.operators.horovod import HorovodTrainOperator
from airflow_provider_horovod.training import default_storage_path

STORAGE = os.environ.get("HOROVOD_RETRAINING_STORAGE") or default_storage_path()
ROOT = f"{STORAGE.rstrip('/')}/horovod_retraining"
CHAMPION = f"{ROOT}/champion.json"
# Downstream DAGs can be scheduled on this; each event's extra carries the new checkpoint URI.
CHAMPION_ASSET = Asset(name="horovod_retraining_champion")
N_FEATURES = 4
TRUE_WEIGHTS = [1.5, -2.0, 0.5, 1.0]


def train_regressor(config: dict) -> None:
    """Runs on every Horovod worker (shipped by value with cloudpickle)."""
    import json
    import os
    import tempfile

    import horovod.torch as hvd
    import ray.train
    import torch
    from ray.train import Checkpoint

    hvd.init()
    torch.manual_seed(0)
    model = build_model()
    start_epoch = 0
    # Resume from this run's own checkpoint (a retried job) before warm-starting from the champion.
    resume = ray.train.get_checkpoint()
    source = resume or (Checkpoint(path=config["init_checkpoint"]) if config.get("init_checkpoint") else None)
    if source is not None:
        with source.as_directory() as folder:
            model.load_state_dict(torch.load(os.path.join(folder, "model.pt")))
            if resume is not None:
                with open(os.path.join(folder, "meta.json")) as f:
                    start_epoch = json.load(f)["epoch"] + 1
    optimizer = torch.optim.Adam(model.parameters(), lr=config.get("lr", 0.01))
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    loss_fn = torch.nn.MSELoss()
    shard = ray.train.get_dataset_shard("train")
    features = [f"f{i}" for i in range(N_FEATURES)]
    for epoch in range(start_epoch, config.get("num_epochs", 10)):
        total, count = 0.0, 0
        for batch in shard.iter_torch_batches(batch_size=config.get("batch_size", 32), dtypes=torch.float32):
            x = torch.stack([batch[f] for f in features], dim=1)
            y = batch["y"].unsqueeze(1)
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            total, count = total + loss.item() * len(y), count + len(y)
        train_mse = hvd.allreduce(torch.tensor(total / max(count, 1)), name="train_mse").item()
        metrics = {"train_mse": train_mse, "epoch": epoch}
        if hvd.rank() == 0:
            with tempfile.TemporaryDirectory() as folder:
                torch.save(model.state_dict(), os.path.join(folder, "model.pt"))
                with open(os.path.join(folder, "meta.json"), "w") as f:
                    json.dump({"epoch": epoch, "n_features": N_FEATURES}, f)
                ray.train.report(metrics, checkpoint=Checkpoint.from_directory(folder))
        else:
            ray.train.report(metrics)


def build_model():
    import torch

    return torch.nn.Sequential(torch.nn.Linear(N_FEATURES, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))


def make_data(seed: int, n: int):
    """The synthetic problem: y = x.w + 0.5 sin(3 x0) + noise. Same seed, same data."""
    import numpy as np

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, N_FEATURES)).astype("float32")
    y = x @ np.array(TRUE_WEIGHTS, dtype="float32") + 0.5 * np.sin(3 * x[:, 0]) + rng.normal(0, 0.05, n)
    return {**{f"f{i}": x[:, i] for i in range(N_FEATURES)}, "y": y.astype("float32")}


def holdout_mse(checkpoint_dir: str | None, holdout: dict) -> float:
    """MSE of the model in ``checkpoint_dir`` (None: the untrained baseline) on the holdout data."""
    import torch

    torch.manual_seed(0)
    model = build_model()
    if checkpoint_dir is not None:
        model.load_state_dict(torch.load(os.path.join(checkpoint_dir, "model.pt")))
    x = torch.stack([torch.as_tensor(holdout[f"f{i}"]) for i in range(N_FEATURES)], dim=1)
    y = torch.as_tensor(holdout["y"]).unsqueeze(1)
    with torch.no_grad():
        return float(torch.nn.functional.mse_loss(model(x), y))


@dag(
    schedule="@daily",
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    catchup=True,
    max_active_runs=1,  # runs promote one after another, so the champion moves in date order
    tags=["horovod", "retraining", "example"],
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
        train_fn=train_regressor,
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
    def evaluate(result: dict, data: dict) -> dict:
        """Load the trained model from its checkpoint and score it against the untrained baseline."""
        import tempfile

        import numpy as np
        import pyarrow.parquet as pq

        from airflow_provider_horovod.storage import Storage

        storage = Storage()
        with tempfile.TemporaryDirectory() as tmp:
            holdout_file = storage.download_file(data["holdout"], os.path.join(tmp, "holdout.parquet"))
            holdout = {k: np.asarray(v, dtype="float32") for k, v in pq.read_table(holdout_file).to_pydict().items()}
            checkpoint = storage.download_folder(result["checkpoint_uri"], os.path.join(tmp, "ckpt"))
            trained = holdout_mse(checkpoint, holdout)
        baseline = holdout_mse(None, holdout)
        print(f"holdout MSE: baseline {baseline:.4f}, trained {trained:.4f}")
        return {"checkpoint_uri": result["checkpoint_uri"], "holdout_mse": trained, "baseline_mse": baseline,
                "submission_id": result["submission_id"]}

    @task(outlets=[CHAMPION_ASSET])
    def promote(evaluation: dict, outlet_events=None, run_id=None) -> dict:
        """Move the champion pointer to the new checkpoint when it is better; emit an Asset event."""
        from airflow_provider_horovod.storage import Storage

        storage = Storage()
        champion = storage.read_json(CHAMPION)
        promoted = champion is None or evaluation["holdout_mse"] < champion["holdout_mse"]
        if promoted:
            # One atomic write (rename or single S3 put): readers see the old or the new pointer.
            storage.write_json(CHAMPION, {**evaluation, "run_id": run_id})
            outlet_events[CHAMPION_ASSET].extra = {"checkpoint_uri": evaluation["checkpoint_uri"],
                                                   "holdout_mse": evaluation["holdout_mse"]}
        summary = {**evaluation, "promoted": promoted,
                   "champion_mse_before": champion["holdout_mse"] if champion else None}
        print("AHP_RETRAINING " + json.dumps(summary))
        return summary

    promote(evaluate(train.output, data))


horovod_retraining()
