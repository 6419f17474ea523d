"""Figure 5: checkpoint I/O. A multi-file checkpoint persisted to S3 (moto's server mode on
127.0.0.1) through our operator's normal path, where the provider routes Ray Train's copies through
boto3's transfer manager, against boto3's TransferManager moving the same bytes in the same worker;
up (``ray.train.report``) and down (``Checkpoint.as_directory``)."""

from __future__ import annotations

import time
import uuid
from types import SimpleNamespace

from bench.cluster import BUCKET
from bench.common import (
    RAY_ADDRESS_ENV,
    Figure,
    Row,
    Sample,
    Target,
    env_int,
    fmt,
    log,
    ratio,
    repeats,
    save_raw,
    table,
    tagged_json,
)

TARGET = 0.9

HOW = """
One Ray job through our operator (synchronous, 1 worker, `storage_path="s3://{bucket}/..."`, default
Train V2) runs `bench.workload.checkpoint_io` as its training function. The operator's runtime
installs the provider's checkpoint I/O (`runtime/checkpoint_io.py`) in the worker, as in every
training worker: Ray Train's copy helper goes through boto3's transfer manager. The function writes
a checkpoint folder of {size} MiB of random bytes in {files} files (five weight/optimizer shards of
40/25/20/10/5% and a small JSON file) and then, {rounds} times (after one warm-up round), moves it
to and from S3 each way, back to back in the same worker process:

- *up, A (ours)*: `ray.train.report(metrics, checkpoint=Checkpoint.from_directory(folder))`: Ray
  Train persists it to the run's storage before `report` returns, as every checkpoint of a job
  launched by the operator is persisted;
- *up, B*: boto3's `TransferManager` (`create_transfer_manager`, `TransferConfig()` defaults: 8 MiB
  parts, 10 threads) uploading the same files;
- *up, extra*: `pyarrow.fs.copy_files` with the settings Ray Train uses for S3 uploads
  (`use_threads=False`, 64 MiB chunks): what every checkpoint went through before the routing;
- *down, A (ours)*: `ray.train.Checkpoint(path="s3://...").as_directory()` of the files B
  uploaded (timed to the folder being there): Ray Train's own read (pyarrow, threads on), which the
  provider leaves as it is, having measured it faster than boto3's;
- *down, B*: boto3's `TransferManager` downloading the same objects;
- *down, extra*: `pyarrow.fs.copy_files` with Ray Train's download settings (threads on, 64 MiB
  chunks), called directly: the copy under A without Ray Train around it.

Throughput = bytes / time of the call. The S3 server is moto's server mode in a process of its own
on 127.0.0.1; its speed, not a network's, bounds every side, so the ratios are what carry over.
"""


class BenchTI(SimpleNamespace):
    """Enough of a task instance for the operator's execute(): ids and an XCom store."""

    def __init__(self, run_id: str):
        super().__init__(
            dag_id="bench_checkpoint_io", task_id="train", run_id=run_id, map_index=-1, try_number=1, xcoms={}
        )

    def xcom_push(self, key, value):
        self.xcoms[key] = value


def figure() -> Figure:
    import os

    from airflow_provider_horovod.operators.horovod import HorovodTrainOperator
    from bench.workload import CHECKPOINT_SHARES, checkpoint_io

    size_mb = env_int("BENCH_CKPT_MB", 300)
    rounds = env_int("BENCH_CKPT_ROUNDS", repeats(3) + 1)
    fig = Figure(
        5, "Checkpoint I/O", HOW.format(bucket=BUCKET, size=size_mb, rounds=rounds, files=len(CHECKPOINT_SHARES) + 1)
    )
    address = os.environ.get(RAY_ADDRESS_ENV)
    op = HorovodTrainOperator(
        task_id="train",
        train_fn=checkpoint_io,
        num_workers=1,
        deferrable=False,
        train_loop_config={"size_mb": size_mb, "repeats": rounds, "bucket": BUCKET},
        storage_path=f"s3://{BUCKET}/checkpoint-io",
        checkpoint_num_to_keep=1,
        runtime_env={"env_vars": {"RAY_ADDRESS": address}} if address else None,
    )
    log(f"checkpoint I/O: {rounds} rounds of {size_mb} MiB, ours vs boto3's TransferManager, up and down")
    started = time.monotonic()
    result = op.execute({"ti": BenchTI(f"ckpt-{uuid.uuid4().hex[:8]}")})
    log(f"  job done in {time.monotonic() - started:.0f} s")
    from airflow_provider_horovod.hooks.ray import RayHook

    (timings,) = tagged_json(RayHook().get_job_logs(result["submission_id"]), "AHP_BENCH_CKPT")[:1]
    save_raw("checkpoint_io", timings)
    if not timings:
        raise RuntimeError("the checkpoint job reported no rounds")
    mb = [t["bytes"] / (1 << 20) for t in timings]

    def rate(key: str) -> Sample:
        return Sample([m / t[key] for m, t in zip(mb, timings)])

    def times(key: str) -> Sample:
        return Sample([t[key] for t in timings])

    rows = [
        Row(
            "upload throughput",
            "report() via operator (checkpoint_io)",
            rate("ray_up_s"),
            "boto3 TransferManager",
            rate("boto3_up_s"),
            "MiB/s",
            "target A/B >= 0.9",
        ),
        Row(
            "upload throughput",
            "pyarrow copy_files, Ray's settings",
            rate("pyarrow_up_s"),
            "boto3 TransferManager",
            rate("boto3_up_s"),
            "MiB/s",
            "Ray Train's upload before the routing",
        ),
        Row(
            "download throughput",
            "Checkpoint.as_directory() (Ray's pyarrow)",
            rate("ray_down_s"),
            "boto3 TransferManager",
            rate("boto3_down_s"),
            "MiB/s",
            "target A/B >= 0.9",
        ),
        Row(
            "download throughput",
            "pyarrow copy_files, Ray's settings",
            rate("pyarrow_down_s"),
            "boto3 TransferManager",
            rate("boto3_down_s"),
            "MiB/s",
            "the copy under A, called directly",
        ),
        Row(
            "upload time",
            "report() via operator (checkpoint_io)",
            times("ray_up_s"),
            "boto3 TransferManager",
            times("boto3_up_s"),
            "s",
            "",
        ),
        Row(
            "download time",
            "Checkpoint.as_directory() (Ray's pyarrow)",
            times("ray_down_s"),
            "boto3 TransferManager",
            times("boto3_down_s"),
            "s",
            "",
        ),
    ]
    fig.tables.append(table(rows))
    pair_up = Sample([t["boto3_up_s"] / t["ray_up_s"] for t in timings])
    pair_down = Sample([t["boto3_down_s"] / t["ray_down_s"] for t in timings])
    fig.notes.append(
        f"Round by round (each round runs every way back to back), the throughput ratio A/B has median "
        f"{fmt(pair_up.median)} up ({pair_up.spread()}) and {fmt(pair_down.median)} down "
        f"({pair_down.spread()}), {pair_up.n} rounds."
    )
    routed = all(t.get("routed") for t in timings)
    fig.notes.append(
        f"The provider's routing was {'in place' if routed else '**not** in place'} in the worker "
        "(`ray.train.v2._internal.execution.storage._pyarrow_fs_copy_files` wrapped); every read-back "
        f"{'matched' if all(t.get('read_back_ok') for t in timings) else '**did not match**'} the "
        "checkpoint's files and sizes."
    )
    fig.notes.append(
        "The previous run of this figure (128 MiB, one large file, Ray Train's own pyarrow upload) "
        "measured A/B = 0.456 against boto3's `upload_file`; the pyarrow rows above show that path "
        "on today's files."
    )
    up_vs_arrow = ratio(rows[0].a.median, rows[1].a.median)
    fig.notes.append(
        f"Uploads through the routing ran {fmt(up_vs_arrow)}x as fast as Ray Train's own pyarrow upload "
        "(single-threaded: `use_threads=False`). Downloads are not routed: Ray Train reads with threads "
        "on, which measured faster than boto3's TransferManager."
    )
    for what, row in (("upload", rows[0]), ("download (read back)", rows[2])):
        r = row.ratio
        met = r >= TARGET if r == r else None
        fig.targets.append(
            Target(
                f"5. checkpoint {what} at least 0.9 of boto3's TransferManager",
                met,
                f"A/B = {fmt(r)} ({fmt(row.a.median)} against {fmt(row.b.median)} MiB/s, {size_mb} MiB in "
                f"{len(CHECKPOINT_SHARES) + 1} files; target >= {TARGET}); {'met' if met else 'missed'} by "
                f"{fmt(abs(r - TARGET))}",
                ""
                if met
                else "compare the transfer settings of `runtime/checkpoint_io.py` (8 files x 8 parts of "
                "16 MiB) with TransferConfig()'s, and what Ray Train does around the copy (directory markers, listing)",
            )
        )
    return fig
