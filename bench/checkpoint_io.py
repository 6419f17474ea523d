"""Figure 5: checkpoint I/O to S3 (moto) through the operator's path, against boto3's TransferManager moving the
same bytes in the same worker, up and down (``workload.checkpoint_io``)."""

from __future__ import annotations

import time
import uuid

from bench.common import BUCKET, env_int, log, repeats, save_raw
from bench.markdown import Figure, Row, Sample, fmt, ratio, sample, table, target
from harness.airflow_cli import tagged_json

TARGET = 0.9
BOTO3, PYARROW = "boto3 TransferManager", "pyarrow copy_files, Ray's settings"
UP, DOWN = "report() via operator (checkpoint_io)", "Checkpoint.as_directory() (Ray's pyarrow)"
UP_BEFORE, DOWN_DIRECT = "Ray Train's upload before the routing", "the copy under A, called directly"


def figure(cluster) -> Figure:
    from airflow_provider_horovod.hooks.ray import RayHook
    from airflow_provider_horovod.operators.horovod import HorovodTrainOperator
    from bench.workload import CHECKPOINT_SHARES, CKPT_TAG, checkpoint_io
    from harness.tasks import FakeTI

    size_mb = env_int("BENCH_CKPT_MB", 300)
    rounds = env_int("BENCH_CKPT_ROUNDS", repeats() + 1)
    op = HorovodTrainOperator(
        task_id="train",
        train_fn=checkpoint_io,
        num_workers=1,
        deferrable=False,
        train_loop_config={"size_mb": size_mb, "repeats": rounds, "bucket": BUCKET},
        storage_path=f"s3://{BUCKET}/checkpoint-io",
        checkpoint_num_to_keep=1,
        runtime_env={"env_vars": {"RAY_ADDRESS": cluster.gcs_address}},
    )
    log(f"checkpoint I/O: {rounds} rounds of {size_mb} MiB, ours vs boto3's TransferManager, up and down")
    started = time.monotonic()
    result = op.execute({"ti": FakeTI(f"ckpt-{uuid.uuid4().hex[:8]}", dag_id="bench_checkpoint_io")})
    log(f"  job done in {time.monotonic() - started:.0f} s")
    (timings,) = tagged_json(RayHook().get_job_logs(result["submission_id"]), CKPT_TAG)[:1]
    save_raw("checkpoint_io", timings)
    if not timings:
        raise RuntimeError("the checkpoint job reported no rounds")
    mb = [t["bytes"] / (1 << 20) for t in timings]

    def rate(key: str) -> Sample:
        return Sample([m / t[key] for m, t in zip(mb, timings)])

    goal = f"target A/B >= {TARGET}"
    rows = [
        Row("upload throughput", UP, rate("ray_up_s"), BOTO3, rate("boto3_up_s"), "MiB/s", goal),
        Row("upload throughput", PYARROW, rate("pyarrow_up_s"), BOTO3, rate("boto3_up_s"), "MiB/s", UP_BEFORE),
        Row("download throughput", DOWN, rate("ray_down_s"), BOTO3, rate("boto3_down_s"), "MiB/s", goal),
        Row("download throughput", PYARROW, rate("pyarrow_down_s"), BOTO3, rate("boto3_down_s"), "MiB/s", DOWN_DIRECT),
        Row("upload time", UP, sample(timings, "ray_up_s"), BOTO3, sample(timings, "boto3_up_s"), "s"),
        Row("download time", DOWN, sample(timings, "ray_down_s"), BOTO3, sample(timings, "boto3_down_s"), "s"),
    ]
    fig = Figure(5, tables=[table(rows)])
    pair_up = Sample([t["boto3_up_s"] / t["ray_up_s"] for t in timings])
    pair_down = Sample([t["boto3_down_s"] / t["ray_down_s"] for t in timings])
    fig.notes.append(
        f"Round by round (each round runs every way back to back), the throughput ratio A/B has median "
        f"{fmt(pair_up.median)} up ({pair_up.spread()}) and {fmt(pair_down.median)} down ({pair_down.spread()}), "
        f"{pair_up.n} rounds."
    )
    routed = "in place" if all(t.get("routed") for t in timings) else "**not** in place"
    matched = "matched" if all(t.get("read_back_ok") for t in timings) else "**did not match**"
    fig.notes.append(
        f"The provider's routing was {routed} in the worker (`ray.train.v2._internal.execution.storage."
        f"_pyarrow_fs_copy_files` wrapped); every read-back {matched} the checkpoint's files and sizes."
    )
    fig.notes.append(
        f"Uploads through the routing ran {fmt(ratio(rows[0].a.median, rows[1].a.median))}x as fast as Ray Train's "
        "own pyarrow upload (single-threaded: `use_threads=False`)."
    )
    closing = "compare the transfer settings of `runtime/checkpoint_io.py` with TransferConfig()'s"
    for what, row in (("upload", rows[0]), ("download (read back)", rows[2])):
        detail = f"A/B = {fmt(row.ratio)} ({fmt(row.a.median)} against {fmt(row.b.median)} MiB/s, {size_mb} MiB in "
        detail += f"{len(CHECKPOINT_SHARES) + 1} files; target >= {TARGET})"
        name = f"5. checkpoint {what} at least 0.9 of boto3's TransferManager"
        fig.targets.append(target(name, row.ratio, TARGET, detail, closing, at_most=False))
    return fig
