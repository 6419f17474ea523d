"""The model of ``dags/horovod_retraining.py``: training function, data and evaluation.

It lives in a module (not the DAG file) because two sides use it: the Horovod workers train with
``train_regressor``, and the evaluation runs either in the Airflow task or, for a model too big for
an Airflow worker, as a Ray job (``python -m airflow_provider_horovod.examples.retraining``).
In your project this is your own package, shipped to the cluster in its image or ``runtime_env``.

Heavy imports live inside the functions, so importing this module costs nothing.
"""

from __future__ import annotations

import argparse
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


def evaluate_on_cluster(checkpoint_uri: str, holdout_uri: str, out_uri: str) -> dict:
    """The evaluation as a Ray job's entrypoint runs it: storage through pyarrow.fs (as Ray Train
    reads it, with the cluster's own credentials), the scores written to ``out_uri`` as JSON."""
    import pyarrow.fs

    def fs_path(uri: str):
        if "://" not in uri:
            return pyarrow.fs.LocalFileSystem(), os.path.abspath(uri)
        return pyarrow.fs.FileSystem.from_uri(uri)

    with tempfile.TemporaryDirectory() as tmp:
        src_fs, src = fs_path(checkpoint_uri)
        os.makedirs(os.path.join(tmp, "ckpt"))
        pyarrow.fs.copy_files(src, os.path.join(tmp, "ckpt"), source_filesystem=src_fs,
                              destination_filesystem=pyarrow.fs.LocalFileSystem())
        data_fs, data = fs_path(holdout_uri)
        local_holdout = os.path.join(tmp, "holdout.parquet")
        pyarrow.fs.copy_files(data, local_holdout, source_filesystem=data_fs,
                              destination_filesystem=pyarrow.fs.LocalFileSystem())
        holdout = read_holdout(local_holdout)
        scores = {"holdout_mse": holdout_mse(os.path.join(tmp, "ckpt"), holdout),
                  "baseline_mse": holdout_mse(None, holdout)}
    out_fs, out = fs_path(out_uri)
    out_fs.create_dir(os.path.dirname(out), recursive=True)
    with out_fs.open_output_stream(out) as f:
        f.write(json.dumps(scores).encode("utf-8"))
    return scores


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Score a checkpoint on holdout data (a Ray job's entrypoint).")
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--holdout", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    print(json.dumps(evaluate_on_cluster(args.checkpoint, args.holdout, args.out)))


if __name__ == "__main__":
    main()
