"""A Horovod training script as teams have them, run unchanged by ``dags/horovod_script.py``:

    horovodrun -np 2 python train_classifier.py --epochs 3 --checkpoint-dir ./checkpoints

``argparse`` at the top, ``hvd.init()`` at module level, ``hvd.DistributedOptimizer``, the parameters
broadcast from rank 0, and rank 0 saving the model with ``torch.save``. It resumes from the checkpoint
folder when it finds a model there. It imports nothing of Ray or Airflow: the one line it prints for the
provider, ``METRICS ...``, is a plain print.
"""

import argparse
import os

import horovod.torch as hvd
import torch
from classifier import accuracy, make_data, make_model

parser = argparse.ArgumentParser(description="Train a small classifier with Horovod.")
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--lr", type=float, default=0.05)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--rows", type=int, default=512)
parser.add_argument("--date", default="")
parser.add_argument("--checkpoint-dir", default="./checkpoints")
args = parser.parse_args()

hvd.init()
torch.manual_seed(0)
print(f"rank {hvd.rank()} of {hvd.size()} (local rank {hvd.local_rank()}, cross rank {hvd.cross_rank()})")

model = make_model()
optimizer = hvd.DistributedOptimizer(
    torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size()), named_parameters=model.named_parameters()
)
model_file = os.path.join(args.checkpoint_dir, "model.pt")
first_epoch = 0
if hvd.rank() == 0 and os.path.exists(model_file):
    saved = torch.load(model_file)
    model.load_state_dict(saved["model"])
    first_epoch = saved["epoch"] + 1
    print(f"resuming after epoch {saved['epoch']}")
first_epoch = hvd.broadcast_object(first_epoch, root_rank=0)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)

features, labels = make_data(args.rows, seed=hvd.rank())
for epoch in range(first_epoch, args.epochs):
    for start in range(0, args.rows, args.batch_size):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(
            model(features[start : start + args.batch_size]), labels[start : start + args.batch_size]
        )
        loss.backward()
        optimizer.step()
    mean_loss = hvd.allreduce(loss.detach(), name="loss").item()
    if hvd.rank() == 0:
        os.makedirs(args.checkpoint_dir, exist_ok=True)
        torch.save({"model": model.state_dict(), "epoch": epoch, "date": args.date}, model_file)
        print(f"METRICS epoch={epoch} loss={mean_loss:.4f} accuracy={accuracy(model, features, labels):.4f}")
