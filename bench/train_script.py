"""The script a user writes without the operator: Ray's own trainer around ``bench.workload``, as a Ray job or,
``--direct``, as a driver on the cluster; prints one ``AHP_BENCH_RESULT {json}`` line. ``horovod``: ``HorovodTrainer``
(Train V1: Ray 2.60 refuses it under V2); ``torch``: ``TorchTrainer`` with DDP (Gloo; NCCL with ``--use-gpu``)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

RESULT_TAG = "AHP_BENCH_RESULT"


def parser() -> argparse.ArgumentParser:
    """The script's arguments; ``bench.submit_script`` takes the same and hands them on."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--trainer", choices=("horovod", "torch"), required=True)
    parser.add_argument("--storage", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--config", default="{}")
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--direct", action="store_true")
    parser.add_argument("--use-gpu", action="store_true")
    return parser


def main() -> int:
    args = parser().parse_args()
    started = time.monotonic()
    if args.trainer == "horovod":
        os.environ["RAY_TRAIN_V2_ENABLED"] = "0"  # before ray.train is imported
    import cloudpickle
    import ray
    from ray.train import CheckpointConfig, RunConfig, ScalingConfig

    import bench.workload

    # The workload is not installed on the cluster: its code travels inside the pickle.
    cloudpickle.register_pickle_by_value(bench.workload)
    if args.direct:
        address = os.environ["RAY_ADDRESS"]
        ray.init(address=address, runtime_env={"env_vars": {"RAY_ADDRESS": address}}, log_to_driver=True)
    framework = "horovod" if args.trainer == "horovod" else "ddp"
    config = {**json.loads(args.config), "framework": framework, "use_gpu": args.use_gpu}
    scaling = {"num_workers": args.num_workers, "use_gpu": args.use_gpu}
    run_config = RunConfig(storage_path=args.storage, name=args.name, checkpoint_config=CheckpointConfig(num_to_keep=2))
    given = {"train_loop_config": config, "run_config": run_config}
    if args.trainer == "horovod":
        from ray.train.horovod import HorovodTrainer

        # As the operator's legacy path: the coordinator takes no worker's CPU.
        scaling_config = ScalingConfig(**scaling, trainer_resources={"CPU": 0})
        trainer = HorovodTrainer(bench.workload.train_mlp, scaling_config=scaling_config, **given)
    else:
        from ray.train.torch import TorchConfig, TorchTrainer

        backend = TorchConfig(backend="nccl" if args.use_gpu else "gloo")
        trainer = TorchTrainer(
            bench.workload.train_mlp, torch_config=backend, scaling_config=ScalingConfig(**scaling), **given
        )
    fit_started = time.monotonic()
    result = trainer.fit()
    fit_s = time.monotonic() - fit_started
    if getattr(result, "error", None):
        raise result.error
    metrics = {k: v for k, v in (result.metrics or {}).items() if isinstance(v, (int, float, str))}
    found = {"metrics": metrics, "checkpoint": result.checkpoint.path if result.checkpoint else None, "fit_s": fit_s}
    print(f"{RESULT_TAG} {json.dumps({**found, 'script_s': time.monotonic() - started})}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
