"""Figure 6: training path. Steps per second of the same model and workers: our operator against
Ray's own Horovod path run directly, and Horovod against torch DDP (Ray's TorchTrainer, Gloo).
The runs are figure 1's (see bench.runs)."""

from __future__ import annotations

from bench.common import Figure, Row, Sample, Target, fmt, table

TARGET = 0.98

HOW = """
Steps/s is measured inside `bench.workload.train_mlp` by rank 0: the training steps of epochs 2 and
later ({timed} steps; epoch 1 is warm-up), forward, backward and the gradient exchange, without Ray
Train's start-up or the checkpoints. Model: MLP {features}-{hidden}-{hidden}-1 ({params} parameters),
batch {batch} per worker, SGD, 2 workers of 1 CPU each, `torch.set_num_threads(1)`. The same
function runs everywhere; only the launcher and the gradient exchange differ:

- *operator, Train V2*: HorovodTrainOperator's default, Ray Train V2 with the provider's Horovod
  backend (figure 1's `operator deferred v2` runs);
- *operator, legacy*: `trainer_api="legacy"`, Ray's own `HorovodTrainer` (figure 1's operator runs);
- *direct*: Ray's own Horovod path, the quickstart's `HorovodTrainer`, run directly on the cluster;
- *DDP*: Ray's `TorchTrainer` (Train V2), `prepare_model` (DistributedDataParallel), Gloo.

No GPU on this machine: the GPU/NCCL comparison the issue asks for where a GPU is at hand was not run
(the same workload runs there with `use_gpu=True`; Horovod would need to be built with NCCL).
"""


def steps(records: list[dict], *ways: str) -> Sample:
    return Sample([r["steps_per_s"] for r in records if r["way"] in ways and r.get("steps_per_s")])


def paired(records: list[dict], a: str, b: str) -> Sample:
    """A/B within each repeat: the two runs were close in time, so the load they met was similar."""
    out = []
    for rep in sorted({r["repeat"] for r in records}):
        ra = [r["steps_per_s"] for r in records if r["repeat"] == rep and r["way"] == a and r.get("steps_per_s")]
        rb = [r["steps_per_s"] for r in records if r["repeat"] == rep and r["way"] == b and r.get("steps_per_s")]
        if ra and rb:
            out.append(ra[0] / rb[0])
    return out and Sample(out) or Sample()


def figure(records: list[dict], config: dict) -> Figure:
    features, hidden = config["features"], config["hidden"]
    params = features * hidden + hidden + hidden * hidden + hidden + hidden + 1
    fig = Figure(
        6,
        "Training path",
        HOW.format(
            timed=config["steps_per_epoch"] * (config["num_epochs"] - 1),
            features=features,
            hidden=hidden,
            params=f"{params:,}",
            batch=config["batch_size"],
        ),
    )
    rows = [
        Row(
            "training steps",
            "operator, Train V2 (default)",
            steps(records, "operator_deferred_v2"),
            "direct HorovodTrainer",
            steps(records, "direct"),
            "steps/s",
            "target A/B >= 0.98",
        ),
        Row(
            "training steps",
            "operator, legacy HorovodTrainer",
            steps(records, "operator_sync", "operator_deferred"),
            "direct HorovodTrainer",
            steps(records, "direct"),
            "steps/s",
            "same trainer on both sides",
        ),
        Row(
            "training steps",
            "plain Ray job, HorovodTrainer",
            steps(records, "plain_job"),
            "direct HorovodTrainer",
            steps(records, "direct"),
            "steps/s",
            "the noise floor: identical code",
        ),
        Row(
            "training steps",
            "Horovod: operator, Train V2",
            steps(records, "operator_deferred_v2"),
            "DDP: TorchTrainer, Gloo",
            steps(records, "ddp_direct"),
            "steps/s",
            "Horovod vs DDP",
        ),
        Row(
            "training steps",
            "Horovod: direct HorovodTrainer",
            steps(records, "direct"),
            "DDP: TorchTrainer, Gloo",
            steps(records, "ddp_direct"),
            "steps/s",
            "Horovod vs DDP",
        ),
    ]
    fig.tables.append(table(rows))
    pair = paired(records, "operator_deferred_v2", "direct")
    pair_ddp = paired(records, "operator_deferred_v2", "ddp_direct")
    fig.notes.append(
        f"Within each repeat (runs next to each other in time): operator V2 / direct has median "
        f"{fmt(pair.median)} ({pair.spread()}, {pair.n} repeats); operator V2 / DDP "
        f"{fmt(pair_ddp.median)} ({pair_ddp.spread()})."
    )
    r = rows[0].ratio
    met = r >= TARGET if r == r else None
    legacy, floor = rows[1].ratio, rows[2].ratio
    closing = ""
    if met is False:
        closing = (
            f"same runs: operator legacy / direct = {fmt(legacy)}, plain job / direct = {fmt(floor)} (identical "
            "code and trainer: the noise floor here). "
        )
        if r < min(legacy, floor) - 0.05:
            closing += (
                "The V2 runs are slower than that noise: the training step is the same Horovod code, so "
                "look at what Train V2 runs beside the workers (controller polling, more actors) on 2 "
                "cores; `trainer_api='legacy'` is the workaround."
            )
        else:
            closing += "The gap is within that noise: rerun with BENCH_REPEATS=5 on a quiet machine."
    fig.targets.append(
        Target(
            "6. steps/s through our operator at least 0.98 of Ray's own Horovod path run directly",
            met,
            f"A/B = {fmt(r)} (target >= {TARGET}); {'met' if met else 'missed'} by {fmt(abs(r - TARGET))}; "
            f"paired within repeats {fmt(pair.median)}",
            closing,
        )
    )
    return fig
