"""The GPU path, on a machine with NVIDIA GPUs: a check, and figure 6 (training path) on the GPU.

    python -m bench.gpu          # BENCH_REPEATS=3 by default; writes bench/results-gpu.md

Needs Ray, torch with CUDA and Horovod built with NCCL (`HOROVOD_GPU_OPERATIONS=NCCL
scripts/build_horovod.sh PYTHON`); no Airflow, as on a Ray node. It runs what the operator's Ray
job runs, the provider's entrypoint ``python -m airflow_provider_horovod.runtime.job <payload>``
with a training spec of ``use_gpu=True``, against a local Ray head that has the machine's GPUs:

1. *check*: on each trainer API, every rank pins its GPU (``torch.cuda.set_device(hvd.local_rank())``)
   and allreduces a CUDA tensor through Horovod (NCCL); the sum, the devices each rank sees, the
   checkpoint and the result record are checked;
2. *figure*: steps/s of ``bench.workload.train_mlp`` on the GPUs through our entrypoint (Train V2
   and legacy) against Ray's ``HorovodTrainer`` run directly, and against DDP over NCCL.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

from airflow_provider_horovod.local import end_cluster
from bench.common import (
    BENCH,
    OUT,
    PY,
    REPO,
    Row,
    Sample,
    fmt,
    log,
    plain_table,
    repeats,
    run_logged,
    save_raw,
    table,
    tagged_json,
)
from harness.ports import free_port

RESULTS = BENCH / "results-gpu.md"
CONFIG = {"features": 1024, "hidden": 4096, "batch_size": 512, "steps_per_epoch": 300, "num_epochs": 3}
TARGET = 0.98


def gpu_probe(config: dict) -> None:
    """Every rank adds rank + 1 on its GPU through Horovod; rank 0 checkpoints what it saw."""
    import json
    import os
    import tempfile

    import horovod.torch as hvd
    import ray.train
    import torch
    from ray.train import Checkpoint

    hvd.init()
    device = torch.device("cuda", hvd.local_rank())
    torch.cuda.set_device(device)
    summed = hvd.allreduce(torch.tensor([hvd.rank() + 1.0], device=device), op=hvd.Sum, name="probe")
    seen = hvd.allgather_object(
        {
            "rank": hvd.rank(),
            "local_rank": hvd.local_rank(),
            "local_size": hvd.local_size(),
            "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "result_device": str(summed.device),
            "gpu": torch.cuda.get_device_name(device),
        }
    )
    metrics = {
        "sum": summed.item(),
        "size": hvd.size(),
        "nccl_built": bool(hvd.nccl_built()),
        "ranks": json.dumps(seen),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())),
    }
    if hvd.rank() == 0:
        with tempfile.TemporaryDirectory() as folder:
            torch.save({"sum": summed.cpu()}, os.path.join(folder, "probe.pt"))
            ray.train.report(metrics, checkpoint=Checkpoint.from_directory(folder))
    else:
        ray.train.report(metrics)


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def start_head(temp_dir: str, gpus: int) -> str:
    """A local Ray head with the machine's GPUs; NCCL_DEBUG reaches the workers through it."""
    port = free_port()
    ray_cli = [PY, "-m", "ray.scripts.scripts"]
    env = {**os.environ, "NCCL_DEBUG": "INFO", "RAY_USAGE_STATS_ENABLED": "0"}
    subprocess.run(
        [
            *ray_cli,
            "start",
            "--head",
            "--node-ip-address=127.0.0.1",
            f"--port={port}",
            f"--num-gpus={gpus}",
            f"--num-cpus={os.cpu_count()}",
            "--include-dashboard=false",
            f"--temp-dir={temp_dir}",
            "--disable-usage-stats",
        ],
        check=True,
        env=env,
        capture_output=True,
    )
    return f"127.0.0.1:{port}"


def run_entrypoint(
    train_fn, config: dict, *, trainer_api: str, num_workers: int, storage: str, name: str, address: str
) -> tuple[dict, str, float]:
    """Run the provider's job entrypoint as the Ray job would; (result record, output, wall seconds)."""
    from airflow_provider_horovod.contract import TaskRun
    from airflow_provider_horovod.documents import ResultRecord
    from airflow_provider_horovod.plan import training_plan

    # HorovodTrainOperator's parameters as its plan gets them, each checked (no Airflow on the GPU machine).
    given = {
        "train_fn": train_fn,
        "train_loop_config": config,
        "datasets": None,
        "num_workers": num_workers,
        "use_gpu": True,
        "resources_per_worker": None,
        "horovod_timeout_s": 30,
        "runtime_env": {},
        "trainer_api": trainer_api,
        "forward_aws_credentials": False,
        "aws_conn_id": None,
        "aws_credentials_ttl_seconds": 3600,
        "check_cluster_resources": False,
        "storage_path": storage,
        "mlflow_experiment_name": None,
        "ray_conn_id": "ray_default",
        "job_tags": {},
        "prices": None,
    }
    plan = training_plan(
        TaskRun("bench_gpu", name, f"gpu-{uuid.uuid4().hex[:6]}"), given, train_call=None, pending_timeout_s=120
    )
    request = plan.request(1)
    with tempfile.TemporaryDirectory() as parent:
        request.write_payload(parent)
        env = {
            "RAY_ADDRESS": address,
            **request.runtime_env["env_vars"],
            "PYTHONPATH": os.pathsep.join(p for p in (parent, str(REPO), os.environ.get("PYTHONPATH")) if p),
        }
        run, wall = run_logged([PY, "-m", *request.entrypoint.split()[2:]], f"gpu-{name}.log", env=env, timeout=600)
    result = plan.spec.result_uri
    if not os.path.exists(result):
        raise RuntimeError(f"{name}: no result record at {result}")
    with open(result, encoding="utf-8") as f:
        return vars(ResultRecord.from_json(f.read())), run.stdout + run.stderr, wall


def run_direct(trainer: str, config: dict, *, num_workers: int, storage: str, name: str, address: str) -> dict:
    run, _ = run_logged(
        [
            PY,
            "-m",
            "bench.train_script",
            "--trainer",
            trainer,
            "--storage",
            storage,
            "--name",
            name,
            "--config",
            json.dumps(config),
            "--num-workers",
            str(num_workers),
            "--direct",
            "--use-gpu",
        ],
        f"gpu-{name}.log",
        env={"RAY_ADDRESS": address},
        timeout=600,
    )
    (result,) = tagged_json(run.stdout, "AHP_BENCH_RESULT")
    return result["metrics"]


def check(address: str, gpus: int, storage: str) -> list[dict]:
    """The GPU path on both trainer APIs; raises when something is off."""
    checks = []
    for api in ("v2", "legacy"):
        record, output, wall = run_entrypoint(
            gpu_probe, {}, trainer_api=api, num_workers=gpus, storage=storage, name=f"check-{api}", address=address
        )
        metrics = record["metrics"]
        ranks = json.loads(metrics["ranks"])
        expected = gpus * (gpus + 1) / 2
        problems = []
        if metrics["sum"] != expected:
            problems.append(f"allreduced sum {metrics['sum']} != {expected}")
        if not metrics["nccl_built"]:
            problems.append("Horovod was built without NCCL")
        if any(not r["result_device"].startswith("cuda") for r in ranks):
            problems.append(f"a result is not on a GPU: {ranks}")
        # Horovod's rule needs every local rank to see all the node's GPUs it uses.
        if any(len((r["visible_devices"] or "").split(",")) < r["local_size"] for r in ranks):
            problems.append(f"a rank does not see its node's GPUs: {ranks}")
        if not record["checkpoint_uri"] or not os.path.isfile(os.path.join(record["checkpoint_uri"], "probe.pt")):
            problems.append(f"no checkpoint at {record['checkpoint_uri']}")
        nccl_lines = [line for line in output.splitlines() if "NCCL INFO" in line]
        checks.append(
            {
                "trainer_api": api,
                "world_size": record["world_size"],
                "sum": metrics["sum"],
                "expected": expected,
                "ranks": ranks,
                "checkpoint_uri": record["checkpoint_uri"],
                "nccl_info_lines": len(nccl_lines),
                "nccl_sample": nccl_lines[:8],
                "wall_s": wall,
                "versions": {k: metrics[k] for k in ("torch", "cuda", "nccl")},
                "problems": problems,
            }
        )
        log(
            f"check {api}: sum {metrics['sum']} (expected {expected}), {len(nccl_lines)} NCCL INFO lines, "
            f"problems: {problems or 'none'}"
        )
    return checks


def measure(address: str, gpus: int, storage: str, n: int) -> list[dict]:
    ways = ["entrypoint_v2", "entrypoint_legacy", "direct_horovod", "ddp_nccl"]
    records = []
    for rep in range(n):
        for way in ways[rep % len(ways) :] + ways[: rep % len(ways)]:  # rotate the order
            config = {**CONFIG, "framework": "ddp" if way == "ddp_nccl" else "horovod", "use_gpu": True}
            name = f"{way}-r{rep}"
            from bench.workload import train_mlp

            if way.startswith("entrypoint"):
                record, _, _ = run_entrypoint(
                    train_mlp,
                    config,
                    trainer_api=way.split("_")[1],
                    num_workers=gpus,
                    storage=storage,
                    name=name,
                    address=address,
                )
                metrics = record["metrics"]
            else:
                metrics = run_direct(
                    "torch" if way == "ddp_nccl" else "horovod",
                    config,
                    num_workers=gpus,
                    storage=storage,
                    name=name,
                    address=address,
                )
            records.append(
                {"repeat": rep, "way": way, "steps_per_s": metrics.get("steps_per_s"), "device": metrics.get("device")}
            )
            log(f"{name}: {fmt(metrics.get('steps_per_s'))} steps/s on {metrics.get('device')}")
    return records


def markdown(gpus: int, checks: list[dict], records: list[dict], n: int, seconds: float) -> str:
    import torch

    def steps(way: str) -> Sample:
        return Sample([r["steps_per_s"] for r in records if r["way"] == way and r["steps_per_s"]])

    rows = [
        Row(
            "training steps",
            "entrypoint, Train V2 (default)",
            steps("entrypoint_v2"),
            "direct HorovodTrainer",
            steps("direct_horovod"),
            "steps/s",
            f"target A/B >= {TARGET}",
        ),
        Row(
            "training steps",
            "entrypoint, legacy HorovodTrainer",
            steps("entrypoint_legacy"),
            "direct HorovodTrainer",
            steps("direct_horovod"),
            "steps/s",
            "same trainer on both sides",
        ),
        Row(
            "training steps",
            "Horovod: entrypoint, Train V2",
            steps("entrypoint_v2"),
            "DDP: TorchTrainer, NCCL",
            steps("ddp_nccl"),
            "steps/s",
            "Horovod vs DDP",
        ),
    ]
    ratio = rows[0].ratio
    met = "met" if ratio >= TARGET else "missed"
    params = CONFIG["features"] * CONFIG["hidden"] + CONFIG["hidden"] ** 2 + 2 * CONFIG["hidden"] + CONFIG["hidden"] + 1
    check_rows = [
        [
            c["trainer_api"],
            str(c["world_size"]),
            f"{c['sum']:g} (expected {c['expected']:g})",
            ", ".join(f"rank {r['rank']}: {r['result_device']}, sees {r['visible_devices']}" for r in c["ranks"]),
            str(c["nccl_info_lines"]),
            c["checkpoint_uri"],
            "; ".join(c["problems"]) or "none",
        ]
        for c in checks
    ]
    versions = checks[0]["versions"] if checks else {}
    lines = [
        "# Benchmarks on a GPU: results",
        "",
        "Written by `python -m bench.gpu` (see its docstring); raw data in `bench/out/gpu.json`. The CPU figures "
        "are in [results.md](results.md).",
        "",
        "## Conditions",
        "",
        plain_table(
            ["", ""],
            [
                ["date (UTC)", time.strftime("%Y-%m-%d %H:%M", time.gmtime())],
                ["took", f"{seconds / 60:.1f} min"],
                [
                    "machine",
                    f"{gpus} x {torch.cuda.get_device_name(0)}, {os.cpu_count()} CPU cores, {platform.platform()}",
                ],
                [
                    "stack",
                    f"Python {platform.python_version()}, torch {versions.get('torch')} "
                    f"(CUDA {versions.get('cuda')}, NCCL {versions.get('nccl')}), ray {_version('ray')}, "
                    f"horovod {_version('horovod')} "
                    "(built by scripts/build_horovod.sh with HOROVOD_GPU_OPERATIONS=NCCL)",
                ],
                ["repeats", str(n)],
            ],
        ),
        "",
        "## The GPU path",
        "",
        "`use_gpu=True` through the job entrypoint the operator submits, on both trainer APIs: each rank pins "
        "`hvd.local_rank()`'s GPU and allreduces a CUDA tensor (rank + 1) through Horovod; `NCCL_DEBUG=INFO` "
        "lines in the job's output show NCCL at work.",
        "",
        plain_table(
            ["trainer_api", "world size", "allreduced sum", "ranks", "NCCL INFO lines", "checkpoint", "problems"],
            check_rows,
        ),
        "",
        "## 6. Training path on the GPU",
        "",
        f"`bench.workload.train_mlp` with `use_gpu=True`: MLP {CONFIG['features']}-{CONFIG['hidden']}-"
        f"{CONFIG['hidden']}-1 ({params:,} parameters), batch {CONFIG['batch_size']} per worker, "
        f"{CONFIG['steps_per_epoch'] * (CONFIG['num_epochs'] - 1)} timed steps (the first epoch is warm-up), "
        f"{gpus} worker(s), one GPU each. *entrypoint*: the provider's job entrypoint, as the operator's Ray job "
        "runs it; *direct*: Ray's own `HorovodTrainer`; *DDP*: Ray's `TorchTrainer` (NCCL).",
        "",
        table(rows),
        "",
        f"- Target: steps/s through our path at least {TARGET} of Ray's own Horovod path: A/B = {fmt(ratio)}, "
        f"**{met}**.",
    ]
    if gpus == 1:
        lines.append(
            "- With one GPU, Horovod and DDP have a world of one: Horovod's `DistributedOptimizer` and "
            "Ray's `prepare_model` skip the gradient exchange, so this compares the launch paths around "
            "the same training step; a multi-GPU machine is needed to compare NCCL exchanges."
        )
    return "\n".join(lines) + "\n"


def _version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "?"


def main() -> int:
    gpus = gpu_count()
    if not gpus:
        print("bench.gpu needs a machine with NVIDIA GPUs and torch with CUDA.", file=sys.stderr)
        return 2
    started = time.monotonic()
    n = repeats(3)
    temp_dir = tempfile.mkdtemp(prefix="ahp-gpu-")
    storage = str(OUT / "gpu-storage")
    shutil.rmtree(storage, ignore_errors=True)
    address = start_head(temp_dir, gpus)
    try:
        checks = check(address, gpus, storage)
        records = measure(address, gpus, storage, n)
    finally:
        end_cluster(temp_dir)  # this head's processes only: `ray stop` would end every cluster of the machine
        shutil.rmtree(temp_dir, ignore_errors=True)
    save_raw("gpu", {"checks": checks, "records": records, "config": CONFIG})
    RESULTS.write_text(markdown(gpus, checks, records, n, time.monotonic() - started))
    log(f"wrote {RESULTS}")
    return 1 if any(c["problems"] for c in checks) else 0


if __name__ == "__main__":
    sys.exit(main())
