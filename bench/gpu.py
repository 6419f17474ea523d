"""The GPU path on a machine with NVIDIA GPUs: a check, and figure 6 (training path) on the GPU through the
provider's job entrypoint (no Airflow, as on a Ray node) against Ray's own paths, into bench/results-gpu.md:
``python -m bench.gpu``, with Horovod built with HOROVOD_GPU_OPERATIONS=NCCL."""

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
from importlib.metadata import version

from airflow_provider_horovod.local import end_cluster
from bench.common import BENCH, OUT, PY, REPO, log, repeats, run_logged, save_raw
from bench.markdown import Row, Sample, fmt, plain_table, put_measured, table
from bench.train_script import RESULT_TAG
from harness.airflow_cli import tagged_json
from harness.ports import free_port

RESULTS = BENCH / "results-gpu.md"
CONFIG = {"features": 1024, "hidden": 4096, "batch_size": 512, "steps_per_epoch": 300, "num_epochs": 3}
TARGET = 0.98
DIRECT = "direct HorovodTrainer"
# HorovodTrainOperator's other parameters as its plan gets them (no Airflow on the GPU machine).
OPERATOR_DEFAULTS = dict.fromkeys(
    ("datasets", "resources_per_worker", "aws_conn_id", "mlflow_experiment_name", "prices")
)
OPERATOR_DEFAULTS.update(horovod_timeout_s=30, runtime_env={}, forward_aws_credentials=False, job_tags={})
OPERATOR_DEFAULTS.update(aws_credentials_ttl_seconds=3600, check_cluster_resources=False, ray_conn_id="ray_default")


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
    mine = {"rank": hvd.rank(), "local_rank": hvd.local_rank(), "local_size": hvd.local_size()}
    mine.update(visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"), result_device=str(summed.device))
    seen = hvd.allgather_object({**mine, "gpu": torch.cuda.get_device_name(device)})
    metrics = {"sum": summed.item(), "size": hvd.size(), "nccl_built": bool(hvd.nccl_built())}
    metrics.update(ranks=json.dumps(seen), torch=torch.__version__, cuda=torch.version.cuda)
    metrics["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    if hvd.rank() == 0:
        with tempfile.TemporaryDirectory() as folder:
            torch.save({"sum": summed.cpu()}, os.path.join(folder, "probe.pt"))
            ray.train.report(metrics, checkpoint=Checkpoint.from_directory(folder))
    else:
        ray.train.report(metrics)


def start_head(temp_dir: str, gpus: int) -> str:
    """A local Ray head with the machine's GPUs; NCCL_DEBUG reaches the workers through it."""
    port = free_port()
    start = [PY, "-m", "ray.scripts.scripts", "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}"]
    start += [f"--num-gpus={gpus}", f"--num-cpus={os.cpu_count()}", f"--temp-dir={temp_dir}"]
    start += ["--include-dashboard=false", "--disable-usage-stats"]
    env = {**os.environ, "NCCL_DEBUG": "INFO", "RAY_USAGE_STATS_ENABLED": "0"}
    subprocess.run(start, check=True, env=env, capture_output=True)
    return f"127.0.0.1:{port}"


def run_entrypoint(
    train_fn, config: dict, *, trainer_api: str, num_workers: int, storage: str, name: str, address: str
) -> tuple[dict, str, float]:
    """Run the provider's job entrypoint as the Ray job would; (result record, output, wall seconds)."""
    from airflow_provider_horovod.contract import TaskRun
    from airflow_provider_horovod.documents import ResultRecord
    from airflow_provider_horovod.plan import training_plan

    given = {**OPERATOR_DEFAULTS, "train_fn": train_fn, "train_loop_config": config, "num_workers": num_workers}
    given.update(use_gpu=True, trainer_api=trainer_api, storage_path=storage)
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
    cmd = [PY, "-m", "bench.train_script", "--trainer", trainer, "--storage", storage, "--name", name]
    cmd += ["--config", json.dumps(config), "--num-workers", str(num_workers), "--direct", "--use-gpu"]
    run, _ = run_logged(cmd, f"gpu-{name}.log", env={"RAY_ADDRESS": address}, timeout=600)
    (result,) = tagged_json(run.stdout, RESULT_TAG)
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
        checkpoint = record["checkpoint_uri"]
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
        if not checkpoint or not os.path.isfile(os.path.join(checkpoint, "probe.pt")):
            problems.append(f"no checkpoint at {checkpoint}")
        nccl_lines = [line for line in output.splitlines() if "NCCL INFO" in line]
        found = {"trainer_api": api, "world_size": record["world_size"], "sum": metrics["sum"], "expected": expected}
        found.update(ranks=ranks, checkpoint_uri=checkpoint, nccl_info_lines=len(nccl_lines), wall_s=wall)
        found.update(nccl_sample=nccl_lines[:8], versions={k: metrics[k] for k in ("torch", "cuda", "nccl")})
        checks.append({**found, "problems": problems})
        log(f"check {api}: sum {metrics['sum']} of {expected}, {len(nccl_lines)} NCCL lines, problems: {problems}")
    return checks


def measure(address: str, gpus: int, storage: str, n: int) -> list[dict]:
    from bench.workload import train_mlp

    ways = ["entrypoint_v2", "entrypoint_legacy", "direct_horovod", "ddp_nccl"]
    records = []
    for rep in range(n):
        for way in ways[rep % len(ways) :] + ways[: rep % len(ways)]:  # rotate the order
            config = {**CONFIG, "framework": "ddp" if way == "ddp_nccl" else "horovod", "use_gpu": True}
            name, where = f"{way}-r{rep}", {"num_workers": gpus, "storage": storage, "address": address}
            if way.startswith("entrypoint"):
                record, _, _ = run_entrypoint(train_mlp, config, trainer_api=way.split("_")[1], name=name, **where)
                metrics = record["metrics"]
            else:
                metrics = run_direct("torch" if way == "ddp_nccl" else "horovod", config, name=name, **where)
            steps, device = metrics.get("steps_per_s"), metrics.get("device")
            records.append({"repeat": rep, "way": way, "steps_per_s": steps, "device": device})
            log(f"{name}: {fmt(steps)} steps/s on {device}")
    return records


def write(gpus: int, checks: list[dict], records: list[dict], n: int, seconds: float) -> None:
    """The measured blocks of results-gpu.md: the conditions, the check, figure 6 on the GPU."""
    import torch

    def steps(way: str) -> Sample:
        return Sample([r["steps_per_s"] for r in records if r["way"] == way and r["steps_per_s"]])

    v2, direct = steps("entrypoint_v2"), steps("direct_horovod")
    legacy, ddp, same = steps("entrypoint_legacy"), steps("ddp_nccl"), "same trainer on both sides"
    what, unit, goal = "training steps", "steps/s", f"target A/B >= {TARGET}"
    rows = [
        Row(what, "entrypoint, Train V2 (default)", v2, DIRECT, direct, unit, goal),
        Row(what, "entrypoint, legacy HorovodTrainer", legacy, DIRECT, direct, unit, same),
        Row(what, "Horovod: entrypoint, Train V2", v2, "DDP: TorchTrainer, NCCL", ddp, unit, "Horovod vs DDP"),
    ]
    check_rows = [
        [c["trainer_api"], str(c["world_size"]), f"{c['sum']:g} (expected {c['expected']:g})"]
        + [", ".join(f"rank {r['rank']}: {r['result_device']}, sees {r['visible_devices']}" for r in c["ranks"])]
        + [str(c["nccl_info_lines"]), c["checkpoint_uri"], "; ".join(c["problems"]) or "none"]
        for c in checks
    ]
    versions = checks[0]["versions"] if checks else {}
    stack = f"Python {platform.python_version()}, torch {versions.get('torch')} (CUDA {versions.get('cuda')}, NCCL "
    stack += f"{versions.get('nccl')}), ray {version('ray')}, horovod {version('horovod')}"
    conditions = [
        ["date (UTC)", time.strftime("%Y-%m-%d %H:%M", time.gmtime())],
        ["took", f"{seconds / 60:.1f} min"],
        ["machine", f"{gpus} x {torch.cuda.get_device_name(0)}, {os.cpu_count()} CPU cores, {platform.platform()}"],
        ["stack", stack + " (built by scripts/build_horovod.sh with HOROVOD_GPU_OPERATIONS=NCCL)"],
        ["repeats", str(n)],
    ]
    params = CONFIG["features"] * CONFIG["hidden"] + CONFIG["hidden"] ** 2 + 3 * CONFIG["hidden"] + 1
    size = f"MLP {CONFIG['features']}-{CONFIG['hidden']}-{CONFIG['hidden']}-1 ({params:,} parameters), batch "
    size += f"{CONFIG['batch_size']} per worker, {CONFIG['steps_per_epoch'] * (CONFIG['num_epochs'] - 1)} timed steps, "
    size += f"{gpus} worker(s), one GPU each"
    met = "met" if rows[0].ratio >= TARGET else "missed"
    figure = f"{table(rows)}\n\n- {size}.\n- Target: steps/s through our path at least {TARGET} of Ray's own Horovod "
    figure += f"path: A/B = {fmt(rows[0].ratio)}, **{met}**."
    check_header = ["trainer_api", "world size", "allreduced sum", "ranks", "NCCL INFO lines", "checkpoint", "problems"]
    text = RESULTS.read_text() if RESULTS.exists() else "# Benchmarks on a GPU: results\n"
    text = put_measured(text, "gpu conditions", plain_table(["", ""], conditions), "## Conditions")
    text = put_measured(text, "gpu check", plain_table(check_header, check_rows), "## The GPU path")
    RESULTS.write_text(put_measured(text, "gpu figure 6", figure, "## 6. Training path on the GPU"))


def main() -> int:
    import torch

    if not (gpus := torch.cuda.device_count() if torch.cuda.is_available() else 0):
        print("bench.gpu needs a machine with NVIDIA GPUs and torch with CUDA.", file=sys.stderr)
        return 2
    started = time.monotonic()
    n = repeats()
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
    write(gpus, checks, records, n, time.monotonic() - started)
    log(f"wrote {RESULTS}")
    return 1 if any(c["problems"] for c in checks) else 0


if __name__ == "__main__":
    sys.exit(main())
