"""What the benchmark jobs run on the cluster: one training function for every way of launching it,
and the checkpoint-upload workload. Heavy imports stay inside the functions.

``train_mlp`` is the same model, data, optimizer and checkpointing whether it runs under Horovod
(our operator, or Ray's own HorovodTrainer) or torch DDP (Ray's TorchTrainer): only the gradient
exchange differs. It times its own training steps, so steps per second leave out Ray Train's
start-up and the checkpoints.
"""

from __future__ import annotations

import json
import os
import tempfile
import time

DEFAULT_CONFIG = {
    "framework": "horovod",  # or "ddp"
    "num_epochs": 3,  # the first is warm-up: steps/s count from the second on
    "steps_per_epoch": 150,
    "batch_size": 64,
    "features": 64,
    "hidden": 512,
    "lr": 0.01,
    "use_gpu": False,
}


def build_model(features: int, hidden: int):
    import torch.nn as nn

    return nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, 1))


def train_mlp(config: dict) -> None:
    import ray.train
    import torch
    from ray.train import Checkpoint

    config = {**DEFAULT_CONFIG, **(config or {})}
    torch.set_num_threads(1)  # one CPU per worker, as Ray Train schedules them
    horovod = config["framework"] == "horovod"
    use_gpu = bool(config.get("use_gpu"))
    context = ray.train.get_context()
    rank, size = context.get_world_rank(), context.get_world_size()
    device = torch.device("cpu")
    if horovod:
        import horovod.torch as hvd

        hvd.init()
        if use_gpu:  # Horovod's rule: one GPU per local rank (Ray shares the node's GPUs with each worker)
            device = torch.device("cuda", hvd.local_rank())
            torch.cuda.set_device(device)
    elif use_gpu:
        import ray.train.torch

        device = ray.train.torch.get_device()
    torch.manual_seed(0)
    model = build_model(config["features"], config["hidden"]).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
    if horovod:
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        net = model
    else:
        import ray.train.torch

        net = ray.train.torch.prepare_model(model)  # DistributedDataParallel (Gloo, or NCCL on GPUs)
    # Synthetic data, different per rank, made up front so the loop times only the training step.
    generator = torch.Generator().manual_seed(rank)
    weights = torch.randn(config["features"], 1, generator=torch.Generator().manual_seed(42))
    batches = []
    for _ in range(16):
        x = torch.randn(config["batch_size"], config["features"], generator=generator)
        batches.append((x.to(device), (x @ weights).to(device)))
    loss_fn = torch.nn.MSELoss()
    timed_steps, timed_s = 0, 0.0
    for epoch in range(config["num_epochs"]):
        started = time.perf_counter()
        for step in range(config["steps_per_epoch"]):
            x, y = batches[step % len(batches)]
            optimizer.zero_grad()
            loss = loss_fn(net(x), y)
            loss.backward()
            optimizer.step()
        if use_gpu:
            torch.cuda.synchronize()  # GPU work is queued: count it in the epoch it belongs to
        epoch_s = time.perf_counter() - started
        if epoch > 0:
            timed_steps, timed_s = timed_steps + config["steps_per_epoch"], timed_s + epoch_s
        metrics = {
            "epoch": epoch, "loss": float(loss.detach()), "world_size": size, "device": str(device),
            "epoch_steps_per_s": config["steps_per_epoch"] / epoch_s,
            "steps_per_s": timed_steps / timed_s if timed_s else None,
        }
        if rank == 0:
            with tempfile.TemporaryDirectory() as folder:
                torch.save(model.state_dict(), os.path.join(folder, "model.pt"))
                with open(os.path.join(folder, "state.json"), "w") as f:
                    json.dump({"epoch": epoch}, f)
                ray.train.report(metrics, checkpoint=Checkpoint.from_directory(folder))
        else:
            ray.train.report(metrics)


def checkpoint_io(config: dict) -> None:
    """Persist the same checkpoint folder to S3 three ways, back to back, in one worker process:
    Ray Train's path (``ray.train.report`` with the checkpoint: it uploads the folder to the run's
    storage before returning), a plain boto3 multipart upload of the same files, and the pyarrow
    call Ray Train makes underneath (``pyarrow.fs.copy_files`` with Ray's settings), which tells
    Ray's own overhead from pyarrow's; and, as the fix to try, ``ray.train.report`` with a
    ``checkpoint_upload_fn`` that uploads with boto3. Doing them in one process, round after round,
    puts all of them under the same conditions on a noisy machine."""
    import boto3
    import pyarrow.fs
    import ray.train
    from boto3.s3.transfer import TransferConfig
    from ray.train import Checkpoint

    size_mb, rounds, bucket = config["size_mb"], config["repeats"], config["bucket"]
    s3 = boto3.client("s3")
    transfer = TransferConfig()  # boto3's defaults: 8 MiB parts, 10 threads
    arrow_fs, arrow_root = pyarrow.fs.FileSystem.from_uri(f"s3://{bucket}/pyarrow")
    storage = ray.train.get_context().get_storage()

    def upload_with_boto3(checkpoint, checkpoint_dir_name: str):
        """Ray Train's checkpoint_upload_fn hook: the same destination, boto3's multipart upload."""
        destination = storage.build_checkpoint_path_from_name(checkpoint_dir_name)  # "bucket/key..."
        dest_bucket, _, key = destination.partition("/")
        for name in os.listdir(checkpoint.path):
            s3.upload_file(os.path.join(checkpoint.path, name), dest_bucket, f"{key}/{name}", Config=transfer)
        return Checkpoint(path=destination, filesystem=storage.storage_filesystem)

    timings = []
    with tempfile.TemporaryDirectory() as folder:
        # Incompressible bytes, like trained weights; one big file and a small one, like model + state.
        with open(os.path.join(folder, "model.bin"), "wb") as f:
            for _ in range(size_mb):
                f.write(os.urandom(1 << 20))
        with open(os.path.join(folder, "state.json"), "w") as f:
            json.dump({"size_mb": size_mb}, f)
        total = sum(os.path.getsize(os.path.join(folder, n)) for n in os.listdir(folder))
        for i in range(rounds + 1):  # the first round warms every path up and is not counted
            started = time.perf_counter()
            ray.train.report({"round": i}, checkpoint=Checkpoint.from_directory(folder),
                             delete_local_checkpoint_after_upload=False)
            ray_s = time.perf_counter() - started

            prefix = f"boto3/round-{i}"
            started = time.perf_counter()
            for name in os.listdir(folder):
                s3.upload_file(os.path.join(folder, name), bucket, f"{prefix}/{name}", Config=transfer)
            boto3_s = time.perf_counter() - started
            for name in os.listdir(folder):
                s3.delete_object(Bucket=bucket, Key=f"{prefix}/{name}")

            target = f"{arrow_root}/round-{i}"
            started = time.perf_counter()
            arrow_fs.create_dir(target)
            # Ray Train's settings for S3 uploads (ray.train._internal.storage._pyarrow_fs_copy_files).
            pyarrow.fs.copy_files(folder, target, destination_filesystem=arrow_fs, use_threads=False,
                                  chunk_size=64 * 1024 * 1024)
            pyarrow_s = time.perf_counter() - started
            arrow_fs.delete_dir(target)
            time.sleep(2.5)  # Train V2 takes a report over when it next polls the workers (~2 s)

            started = time.perf_counter()
            ray.train.report({"round": i, "upload": "boto3"}, checkpoint=Checkpoint.from_directory(folder),
                             checkpoint_upload_fn=upload_with_boto3,
                             delete_local_checkpoint_after_upload=False)
            ray_boto3_s = time.perf_counter() - started
            if i:
                timings.append({"round": i, "bytes": total, "ray_train_s": ray_s, "boto3_s": boto3_s,
                                "pyarrow_s": pyarrow_s, "ray_train_boto3_s": ray_boto3_s})
            time.sleep(2.5)
    print("AHP_BENCH_CKPT " + json.dumps(timings), flush=True)
