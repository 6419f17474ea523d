"""Ray Train's Horovod quickstart, adapted to learn correctly.

The original compares a (batch, 1) output with a (batch,) target, which broadcasts to a
(batch, batch) loss and learns nothing useful, and feeds raw x in [0, 32) to SGD at lr 0.1. Here
the target is shaped like the output and x is scaled to [0, 1). Otherwise it is the same
function: ``hvd.init()``, ``hvd.DistributedOptimizer``, ``hvd.broadcast_parameters``,
``ray.train.get_dataset_shard``, ``ray.train.report(..., checkpoint=...)`` and
``ray.train.get_checkpoint()`` to resume.

Heavy imports live inside the functions, so importing this module costs nothing.
"""

from __future__ import annotations

import json
import os

INPUT_SIZE, LAYER_SIZE, OUTPUT_SIZE = 1, 15, 1


def target(x: float) -> float:
    """What the model learns: y = 2x + 1 on x in [0, 1)."""
    return 2.0 * x + 1.0


def build_model():
    import torch.nn as nn

    return nn.Sequential(nn.Linear(INPUT_SIZE, LAYER_SIZE), nn.ReLU(), nn.Linear(LAYER_SIZE, OUTPUT_SIZE))


def make_dataset(n: int = 256):
    """The training data, as a Ray Dataset of {"x", "y"} rows."""
    import random

    import ray.data

    xs = [i / n for i in range(n)]
    # Sorted batches make SGD zig-zag; a fixed shuffle keeps runs reproducible.
    random.Random(0).shuffle(xs)
    return ray.data.from_items([{"x": x, "y": target(x)} for x in xs])


def train_func(config: dict) -> dict:
    import tempfile

    import horovod.torch as hvd
    import ray.train
    import torch
    import torch.nn as nn
    from ray.train import Checkpoint

    hvd.init()
    torch.manual_seed(0)
    model = build_model()
    start_epoch = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as folder:
            model.load_state_dict(torch.load(os.path.join(folder, "model.pt")))
            with open(os.path.join(folder, "state.json")) as f:
                start_epoch = json.load(f)["epoch"] + 1
        print(f"rank {hvd.rank()}: resumed from epoch {start_epoch - 1}", flush=True)
    # Horovod's rule: the effective batch grows with the workers, so does the learning rate.
    optimizer = torch.optim.SGD(model.parameters(), lr=config.get("lr", 0.1) * hvd.size())
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), op=hvd.Average)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    loss_fn = nn.MSELoss()
    shard = ray.train.get_dataset_shard("train")
    context = ray.train.get_context()
    loss_value = None
    for epoch in range(start_epoch, config.get("num_epochs", 5)):
        model.train()
        for batch in shard.iter_torch_batches(batch_size=config.get("batch_size", 16), dtypes=torch.float32):
            inputs, labels = batch["x"].unsqueeze(1), batch["y"].unsqueeze(1)
            loss = loss_fn(model(inputs), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        loss_value = hvd.allreduce(loss.detach(), name="loss").item()
        print(
            f"epoch {epoch}: loss {loss_value:.5f} (rank {context.get_world_rank()} of {context.get_world_size()})",
            flush=True,
        )
        metrics = {"loss": loss_value, "epoch": epoch, "world_size": context.get_world_size()}
        if hvd.rank() == 0:
            with tempfile.TemporaryDirectory() as folder:
                torch.save(model.state_dict(), os.path.join(folder, "model.pt"))
                with open(os.path.join(folder, "state.json"), "w") as f:
                    json.dump({"epoch": epoch}, f)
                ray.train.report(metrics, checkpoint=Checkpoint.from_directory(folder))
        else:
            ray.train.report(metrics)
    # Rank 0's return value reaches XCom (as `return_value`).
    return {"loss": loss_value, "epochs": config.get("num_epochs", 5), "lr": config.get("lr", 0.1)}


def load_model(checkpoint_dir: str):
    import torch

    model = build_model()
    model.load_state_dict(torch.load(os.path.join(checkpoint_dir, "model.pt")))
    model.eval()
    return model


def holdout_mse(checkpoint_dir: str, n: int = 100) -> float:
    """Mean squared error of the checkpoint's model on points between the training points."""
    import torch

    model = load_model(checkpoint_dir)
    x = torch.tensor([[(i + 0.5) / n] for i in range(n)])
    y = torch.tensor([[target((i + 0.5) / n)] for i in range(n)])
    with torch.no_grad():
        return float(torch.nn.functional.mse_loss(model(x), y))


def evaluate(result) -> dict:
    """Runs on the cluster, as a Ray job (``RayTaskOperator`` or ``@task.ray``): load the trained model
    from its checkpoint (local path or S3, read as Ray Train reads it) and score it. ``result`` is the
    training task's XCom, or a checkpoint URI."""
    from ray.train import Checkpoint

    uri = result["checkpoint_uri"] if isinstance(result, dict) else result
    with Checkpoint(path=uri).as_directory() as folder:
        mse = holdout_mse(folder)
    print(f"checkpoint: {uri}\nholdout MSE: {mse:.4f}", flush=True)
    return {"checkpoint_uri": uri, "holdout_mse": mse}
