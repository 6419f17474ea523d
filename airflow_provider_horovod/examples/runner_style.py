"""A training function as HorovodRunner users write it: its data made in the function, its settings
as keyword arguments (``hr.run(train, learning_rate=0.1, epochs=4)``), the model saved on rank 0.
``dags/horovod_taskflow.py`` runs it with ``@task.horovod``; Ray Train reports it: each epoch's
loss, and a checkpoint. Heavy imports live inside the function, so importing this module costs nothing.
"""

from __future__ import annotations


def train(learning_rate: float = 0.1, epochs: int = 4, samples: int = 512) -> dict:
    """Fit y = 3x - 1 with Horovod; rank 0 returns the final loss (it reaches XCom)."""
    import os
    import tempfile

    import horovod.torch as hvd
    import ray.train
    import torch
    from ray.train import Checkpoint

    hvd.init()
    torch.manual_seed(hvd.rank())
    # Each rank makes its own share of the data, as HorovodRunner's users load theirs.
    x = torch.rand(samples // hvd.size(), 1)
    y = 3 * x - 1
    model = torch.nn.Linear(1, 1)
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=learning_rate * hvd.size()), named_parameters=model.named_parameters()
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    loss = torch.tensor(0.0)
    for epoch in range(epochs):
        for batch in range(0, len(x), 32):
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x[batch : batch + 32]), y[batch : batch + 32])
            loss.backward()
            optimizer.step()
        loss = hvd.allreduce(loss.detach(), name="loss")
        metrics = {"epoch": epoch, "loss": float(loss)}
        if hvd.rank() == 0:
            with tempfile.TemporaryDirectory() as folder:
                torch.save(model.state_dict(), os.path.join(folder, "model.pt"))
                ray.train.report(metrics, checkpoint=Checkpoint.from_directory(folder))
        else:
            ray.train.report(metrics)
    return {"learning_rate": learning_rate, "loss": float(loss)}


def evaluate(checkpoint_uri: str) -> dict:
    """On the cluster (``@task.ray``): the checkpoint's model against the line it learnt."""
    import os

    import torch
    from ray.train import Checkpoint

    model = torch.nn.Linear(1, 1)
    with Checkpoint(path=checkpoint_uri).as_directory() as folder:
        model.load_state_dict(torch.load(os.path.join(folder, "model.pt")))
    x = torch.linspace(0, 1, 101).unsqueeze(1)
    with torch.no_grad():
        error = float(torch.nn.functional.mse_loss(model(x), 3 * x - 1))
    print(f"checkpoint: {checkpoint_uri}\nerror: {error:.5f}", flush=True)
    return {"checkpoint_uri": checkpoint_uri, "error": error}
