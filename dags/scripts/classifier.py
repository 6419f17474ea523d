"""The model and the data of ``train_classifier.py``: a neighbour module the script imports, as scripts do.

A small classifier and a synthetic data set of its own (two Gaussian blobs), so the example needs no
download and runs on the CPU.
"""

import torch


def make_model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))


def make_data(rows: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 2, (rows,), generator=generator)
    features = torch.randn(rows, 8, generator=generator) + labels[:, None].float() * 2.0
    return features, labels


def accuracy(model: torch.nn.Module, features: torch.Tensor, labels: torch.Tensor) -> float:
    with torch.no_grad():
        return (model(features).argmax(dim=1) == labels).float().mean().item()


def evaluate(result) -> dict:
    """Runs on the cluster as a Ray job (the DAG's evaluate task): load the script's model from its
    checkpoint (a local path or S3, read as Ray Train reads it) and score it on data the training never saw.
    ``result`` is the training task's XCom."""
    from ray.train import Checkpoint

    uri = result["checkpoint_uri"]
    with Checkpoint(path=uri).as_directory() as folder:
        saved = torch.load(f"{folder}/model.pt")
    model = make_model()
    model.load_state_dict(saved["model"])
    score = accuracy(model, *make_data(256, seed=1000))
    print(f"checkpoint: {uri} (epoch {saved['epoch']}, data of {saved['date']!r})\nholdout accuracy: {score:.4f}")
    return {"checkpoint_uri": uri, "holdout_accuracy": score, "epoch": saved["epoch"]}
