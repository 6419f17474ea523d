"""What the benchmark jobs run on the cluster (figures 1, 2, 6: ``train_mlp``; 5: ``checkpoint_io``; 9 and 10:
``fixed_work``, also ``python -m bench.workload '<config>'``); heavy imports stay inside the functions."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time

# The lines rank 0 of ``fixed_work`` prints its stamps on, and ``checkpoint_io`` its timings.
STAMP, CKPT_TAG = "AHP_BENCH_STAMPS", "AHP_BENCH_CKPT"
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

    return nn.Sequential(
        nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1)
    )


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
    else:
        import ray.train.torch

        if use_gpu:
            device = ray.train.torch.get_device()
    torch.manual_seed(0)
    model = build_model(config["features"], config["hidden"]).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
    if horovod:
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        net = model
    else:
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
            "epoch": epoch,
            "loss": float(loss.detach()),
            "world_size": size,
            "device": str(device),
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


CHUNK = 64 * 1024 * 1024  # Ray Train's chunk size for pyarrow's copies
# Figure 5's checkpoint files (shares of its size), as a sharded model checkpoint has them; plus a small JSON file.
CHECKPOINT_SHARES = (
    ("model-00001.bin", 0.40),
    ("model-00002.bin", 0.25),
    ("optimizer.bin", 0.20),
    ("model-00003.bin", 0.10),
    ("scheduler.bin", 0.05),
)


def write_checkpoint_folder(folder: str, size_mb: int) -> int:
    """Incompressible bytes, like trained weights, in the files of ``CHECKPOINT_SHARES``; total bytes."""
    for name, share in CHECKPOINT_SHARES:
        with open(os.path.join(folder, name), "wb") as f:
            remaining = int(size_mb * share * (1 << 20))
            while remaining:
                chunk = min(remaining, 8 << 20)
                f.write(os.urandom(chunk))
                remaining -= chunk
    with open(os.path.join(folder, "state.json"), "w") as f:
        json.dump({"size_mb": size_mb, "files": [n for n, _ in CHECKPOINT_SHARES]}, f)
    return sum(os.path.getsize(os.path.join(folder, n)) for n in os.listdir(folder))


def checkpoint_io(config: dict) -> None:
    """Figure 5, in a training worker of the operator (the provider's checkpoint_io installed): every way up and
    down, back to back, round after round, so all meet the same conditions; the first round is not counted."""
    import shutil

    import boto3
    import pyarrow.fs
    import ray.train
    from boto3.s3.transfer import TransferConfig, create_transfer_manager
    from ray.train import Checkpoint

    size_mb, rounds, bucket = config["size_mb"], config["repeats"], config["bucket"]
    s3 = boto3.client("s3")
    arrow_fs, arrow_root = pyarrow.fs.FileSystem.from_uri(f"s3://{bucket}/pyarrow")
    # Is the provider's routing in place in this worker? (It is installed by the operator's runtime.)
    from ray.train.v2._internal.execution import storage as v2_storage

    routed = hasattr(v2_storage, "_ahp_original_copy")

    def boto3_upload(folder: str, prefix: str) -> None:
        with create_transfer_manager(s3, TransferConfig()) as manager:
            names = sorted(os.listdir(folder))
            futures = [manager.upload(os.path.join(folder, name), bucket, f"{prefix}/{name}") for name in names]
            for future in futures:
                future.result()

    def boto3_download(prefix: str, target: str) -> None:
        listed = s3.list_objects_v2(Bucket=bucket, Prefix=prefix + "/").get("Contents", [])
        keys = [o["Key"] for o in listed if not o["Key"].endswith("/")]
        os.makedirs(target, exist_ok=True)
        with create_transfer_manager(s3, TransferConfig()) as manager:
            futures = [manager.download(bucket, key, os.path.join(target, key[len(prefix) + 1 :])) for key in keys]
            for future in futures:
                future.result()

    def delete_prefix(prefix: str) -> None:
        objects = s3.list_objects_v2(Bucket=bucket, Prefix=prefix + "/").get("Contents", [])
        if objects:
            s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": o["Key"]} for o in objects]})

    def same_files(a: str, b: str) -> bool:
        names = sorted(os.listdir(a))
        return names == sorted(os.listdir(b)) and all(
            os.path.getsize(os.path.join(a, n)) == os.path.getsize(os.path.join(b, n)) for n in names
        )

    @contextlib.contextmanager
    def timed(took: dict, name: str):
        started = time.perf_counter()
        yield
        took[name] = time.perf_counter() - started

    timings = []
    scratch = tempfile.mkdtemp(prefix="ahp-bench-ckpt-")
    try:
        folder = os.path.join(scratch, "checkpoint")
        os.makedirs(folder)
        total = write_checkpoint_folder(folder, size_mb)
        files = len(os.listdir(folder))
        for i in range(rounds + 1):
            took: dict = {}
            with timed(took, "ray_up_s"):
                checkpoint = Checkpoint.from_directory(folder)
                ray.train.report({"round": i}, checkpoint=checkpoint, delete_local_checkpoint_after_upload=False)
            time.sleep(2.5)  # Train V2 takes a report over when it next polls the workers (~2 s)
            prefix, target = f"boto3/round-{i}", f"{arrow_root}/round-{i}"
            with timed(took, "boto3_up_s"):
                boto3_upload(folder, prefix)
            with timed(took, "pyarrow_up_s"):
                arrow_fs.create_dir(target)
                pyarrow.fs.copy_files(
                    folder, target, destination_filesystem=arrow_fs, use_threads=False, chunk_size=CHUNK
                )
            arrow_fs.delete_dir(target)
            # Reading back the objects B uploaded, three ways.
            started = time.perf_counter()
            with Checkpoint(path=f"s3://{bucket}/{prefix}").as_directory() as local:
                took["ray_down_s"] = time.perf_counter() - started
                ok_a = same_files(folder, local)
            down_b, down_arrow = os.path.join(scratch, f"boto3-{i}"), os.path.join(scratch, f"pyarrow-{i}")
            with timed(took, "boto3_down_s"):
                boto3_download(prefix, down_b)
            ok_b = same_files(folder, down_b)
            shutil.rmtree(down_b)
            os.makedirs(down_arrow)
            with timed(took, "pyarrow_down_s"):
                pyarrow.fs.copy_files(f"{bucket}/{prefix}", down_arrow, source_filesystem=arrow_fs, chunk_size=CHUNK)
            shutil.rmtree(down_arrow)
            delete_prefix(prefix)
            if i:
                timings.append({"round": i, "bytes": total, "files": files, "routed": routed, **took})
                timings[-1]["read_back_ok"] = ok_a and ok_b
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"{CKPT_TAG} {json.dumps(timings)}", flush=True)


def fixed_work(config: dict) -> dict:
    """The same steps under every launcher: rank 0's stamps of each stage, the steps/s after ``warmup`` steps,
    and with ``hosts`` the host of each rank."""
    started = time.time()
    import horovod.torch as hvd
    import torch

    imported = time.time()
    hvd.init()
    ready = time.time()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = build_model(config["features"], config["hidden"])
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.001), named_parameters=model.named_parameters()
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    x, y = torch.randn(config["batch"], config["features"]), torch.randn(config["batch"], 1)
    warmup = config.get("warmup", 0)
    timed_from = time.perf_counter()
    for i in range(warmup + config["steps"]):
        if i == warmup:
            timed_from = time.perf_counter()
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    steps_per_s, done = config["steps"] / (time.perf_counter() - timed_from), time.time()
    stamps = {"fn_start": started, "imported": imported, "hvd_ready": ready, "work_done": done, "size": hvd.size()}
    stamps["steps_per_s"] = steps_per_s
    if config.get("hosts"):
        import socket

        stamps["hosts"] = hvd.allgather_object(socket.gethostname())
    if hvd.rank() == 0:
        print(f"{STAMP} {json.dumps(stamps)}", flush=True)
    if config.get("ray"):  # the operator's task needs a checkpoint: rank 0 reports the model's
        import ray.train

        with tempfile.TemporaryDirectory() as folder:
            checkpoint = None
            if hvd.rank() == 0:
                torch.save(model.state_dict(), os.path.join(folder, "model.pt"))
                checkpoint = ray.train.Checkpoint.from_directory(folder)
            ray.train.report({"steps": config["steps"]}, checkpoint=checkpoint)
    return stamps


if __name__ == "__main__":  # a rank under horovodrun (figures 9 and 10)
    import sys

    fixed_work(json.loads(sys.argv[1]))
