"""The model of ``dags/horovod_retraining.py``: training function, data and evaluation.

Everything here runs on the Ray cluster, where torch is: the data is written by a ``@task.ray``
job, the Horovod workers train with ``train_regressor``, and another ``@task.ray`` job evaluates the
checkpoint. In your project this is your own package, shipped to the cluster in its image or
``runtime_env``.

Heavy imports live inside the functions, so importing this module costs nothing.
"""

from __future__ import annotations

import json
import os
import tempfile

N_FEATURES = 4
TRUE_WEIGHTS = [1.5, -2.0, 0.5, 1.0]


def train_regressor(config: dict) -> None:
    """Runs on every Horovod worker, written as for Ray's own HorovodTrainer."""
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


def make_data(seed: int, n: int) -> dict:
    """The synthetic problem: y = x.w + 0.5 sin(3 x0) + noise. Same seed, same data."""
    import numpy as np

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, N_FEATURES)).astype("float32")
    y = x @ np.array(TRUE_WEIGHTS, dtype="float32") + 0.5 * np.sin(3 * x[:, 0]) + rng.normal(0, 0.05, n)
    return {**{f"f{i}": x[:, i] for i in range(N_FEATURES)}, "y": y.astype("float32")}


def read_holdout(parquet_file: str) -> dict:
    import numpy as np
    import pyarrow.parquet as pq

    return {k: np.asarray(v, dtype="float32") for k, v in pq.read_table(parquet_file).to_pydict().items()}


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


def write_data(seed: int, folder_uri: str) -> dict:
    """Runs on the cluster: this interval's training and holdout data as parquet under ``folder_uri``
    (local path or S3, with the cluster's own credentials). A real pipeline reads its interval from
    a warehouse or a lake here instead of generating it."""
    import pyarrow as pa
    import pyarrow.fs
    import pyarrow.parquet as pq

    uris = {}
    for name, n, offset in (("train", 512, 0), ("holdout", 256, 1_000_000)):
        uris[name] = f"{folder_uri.rstrip('/')}/{name}.parquet"
        fs, path = _fs(uris[name])
        fs.create_dir(os.path.dirname(path), recursive=True)
        with fs.open_output_stream(path) as out:
            pq.write_table(pa.table(make_data(seed + offset, n)), out)
    return uris


def evaluate(checkpoint_uri: str, holdout_uri: str) -> dict:
    """Runs on the cluster, where the model fits (a ``@task.ray`` job): the holdout MSE of the
    checkpoint's model, next to the untrained baseline's."""
    import pyarrow.fs
    from ray.train import Checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        fs, path = _fs(holdout_uri)
        local_holdout = os.path.join(tmp, "holdout.parquet")
        pyarrow.fs.copy_files(
            path, local_holdout, source_filesystem=fs, destination_filesystem=pyarrow.fs.LocalFileSystem()
        )
        holdout = read_holdout(local_holdout)
        with Checkpoint(path=checkpoint_uri).as_directory() as folder:
            scores = {"holdout_mse": holdout_mse(folder, holdout), "baseline_mse": holdout_mse(None, holdout)}
    print(f"holdout MSE: baseline {scores['baseline_mse']:.4f}, trained {scores['holdout_mse']:.4f}", flush=True)
    return scores


def _fs(uri: str):
    import pyarrow.fs

    if "://" not in uri:
        return pyarrow.fs.LocalFileSystem(), os.path.abspath(uri)
    return pyarrow.fs.FileSystem.from_uri(uri)


# --- the champion, as a log of moves ------------------------------------------------------------
# The champion record is {"current": <move>, "moves": [<move>, ...]}; a move is {"logical_date",
# "holdout_mse", "checkpoint_uri", "run_id", "submission_id", "replaces"}: the model that became the
# champion for its logical date, and the one it beat then. Moves are kept in the order recorded; a
# run of day D sees only the moves of days up to D, so a backfill of last week reproduces last week.


def moves_of(record: dict | None) -> list[dict]:
    """The moves of a champion record (the single-record format of earlier versions read as one move)."""
    if not record:
        return []
    if "moves" in record:
        return list(record["moves"])
    return [record] if record.get("checkpoint_uri") else []


def champion_as_of(record: dict | None, day: str, *, inclusive: bool = False) -> dict | None:
    """The champion in force for a run of ``day`` (``YYYY-MM-DD``): the last move recorded for the latest
    day before it (``inclusive``: on or before it). A run warm-starts from the champion before its own day
    and is judged against the one in force on its day, whatever was promoted for later days since."""
    return current_champion(
        [m for m in moves_of(record) if m["logical_date"] < day or (inclusive and m["logical_date"] == day)]
    )


def with_move(record: dict | None, candidate: dict) -> dict | None:
    """The champion record with ``candidate`` (its ``logical_date``, ``holdout_mse``, ``checkpoint_uri``,
    ``run_id``, ``submission_id``) recorded as a move when it beats the champion in force on its day (or
    there is none); else None. The current champion is the move of the latest day: a backfilled day that
    wins is recorded as the champion of its time, and the current one stays where it is."""
    before = champion_as_of(record, candidate["logical_date"], inclusive=True)
    if before is not None and candidate["holdout_mse"] >= before["holdout_mse"]:
        return None
    move = {
        key: candidate.get(key) for key in ("logical_date", "holdout_mse", "checkpoint_uri", "run_id", "submission_id")
    }
    move["replaces"] = {key: before.get(key) for key in ("logical_date", "holdout_mse", "run_id")} if before else None
    moves = [*moves_of(record), move]
    return {"current": current_champion(moves), "moves": moves}


def current_champion(moves: list[dict]) -> dict | None:
    """The champion downstream uses: the last move recorded for the latest day (sorted() keeps the
    recorded order among the moves of one day)."""
    return sorted(moves, key=lambda m: m["logical_date"])[-1] if moves else None
