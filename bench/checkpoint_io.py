"""Figure 5: checkpoint I/O. Checkpoints persisted to S3 (moto's server mode on 127.0.0.1) by Ray
Train, through our operator, against a plain boto3 multipart upload of the same bytes."""

from __future__ import annotations

import json
import time
import uuid
from types import SimpleNamespace

from bench.cluster import BUCKET
from bench.common import (RAY_ADDRESS_ENV, Figure, Row, Sample, Target, env_int, fmt, log, repeats, save_raw,
                          table, tagged_json)

TARGET = 0.9

HOW = """
One Ray job through our operator (synchronous, 1 worker, `storage_path="s3://{bucket}/..."`, default
Train V2) runs `bench.workload.checkpoint_io`: it writes a checkpoint folder of {size} MiB of random
bytes (one large file and a small one, like weights and state) and then, {rounds} times (after one
warm-up round), persists it four ways, back to back in the same worker process:

- `ray.train.report(metrics, checkpoint=Checkpoint.from_directory(folder))`: Ray Train uploads it to
  the run's storage through `pyarrow.fs` before `report` returns (ours: what every checkpoint of a
  job launched by the operator goes through);
- boto3's `upload_file` of the same files (`TransferConfig()` defaults: 8 MiB parts, 10 threads);
- `pyarrow.fs.copy_files` alone with the settings Ray Train uses for S3 (`use_threads=False`,
  64 MiB chunks), to tell Ray Train's own overhead from pyarrow's;
- `ray.train.report(..., checkpoint_upload_fn=...)` with a function that uploads with boto3 to the
  same destination: the fix to try, still through Ray Train and the operator.

Throughput = bytes / time of the call. The S3 server is moto's server mode in a process of its own
on 127.0.0.1; its speed, not a network's, bounds every side, so the ratios are what carry over.
"""


class BenchTI(SimpleNamespace):
    """Enough of a task instance for the operator's execute(): ids and an XCom store."""

    def __init__(self, run_id: str):
        super().__init__(dag_id="bench_checkpoint_io", task_id="train", run_id=run_id, map_index=-1,
                         try_number=1, xcoms={})

    def xcom_push(self, key, value):
        self.xcoms[key] = value


def figure() -> Figure:
    import os

    from airflow_provider_horovod.operators.horovod import HorovodTrainOperator
    from bench.workload import checkpoint_io

    size_mb = env_int("BENCH_CKPT_MB", 128)
    rounds = repeats(3) * 2
    fig = Figure(5, "Checkpoint I/O", HOW.format(bucket=BUCKET, size=size_mb, rounds=rounds))
    address = os.environ.get(RAY_ADDRESS_ENV)
    op = HorovodTrainOperator(
        task_id="train", train_fn=checkpoint_io, num_workers=1, deferrable=False,
        train_loop_config={"size_mb": size_mb, "repeats": rounds, "bucket": BUCKET},
        storage_path=f"s3://{BUCKET}/checkpoint-io", checkpoint_num_to_keep=1,
        runtime_env={"env_vars": {"RAY_ADDRESS": address}} if address else None,
    )
    log(f"checkpoint I/O: {rounds} rounds of {size_mb} MiB, Ray Train vs boto3")
    started = time.monotonic()
    result = op.execute({"ti": BenchTI(f"ckpt-{uuid.uuid4().hex[:8]}")})
    log(f"  job done in {time.monotonic() - started:.0f} s")
    from airflow_provider_horovod.hooks.ray import RayHook

    (timings,) = tagged_json(RayHook().get_job_logs(result["submission_id"]), "AHP_BENCH_CKPT")[:1]
    save_raw("checkpoint_io", timings)
    mb = [t["bytes"] / (1 << 20) for t in timings]
    ray_rate = Sample([m / t["ray_train_s"] for m, t in zip(mb, timings)])
    boto_rate = Sample([m / t["boto3_s"] for m, t in zip(mb, timings)])
    pair = Sample([t["boto3_s"] / t["ray_train_s"] for t in timings])
    arrow_rate = Sample([m / t["pyarrow_s"] for m, t in zip(mb, timings)])
    fixed_rate = Sample([m / t["ray_train_boto3_s"] for m, t in zip(mb, timings)])
    rows = [
        Row("upload throughput", "Ray Train report() via operator", ray_rate, "boto3 upload_file (multipart)",
            boto_rate, "MiB/s", "target A/B >= 0.9"),
        Row("upload throughput", "pyarrow copy_files, Ray's settings", arrow_rate, "boto3 upload_file (multipart)",
            boto_rate, "MiB/s", "the call Ray Train makes, alone"),
        Row("upload throughput", "Ray Train report() via operator", ray_rate, "pyarrow copy_files, Ray's settings",
            arrow_rate, "MiB/s", "what Ray Train adds around it"),
        Row("upload throughput", "report() with a boto3 checkpoint_upload_fn", fixed_rate,
            "boto3 upload_file (multipart)", boto_rate, "MiB/s", "the fix to try, through the same operator"),
        Row("upload time", "Ray Train report() via operator", Sample([t["ray_train_s"] for t in timings]),
            "boto3 upload_file (multipart)", Sample([t["boto3_s"] for t in timings]), "s", ""),
    ]
    fig.tables.append(table(rows))
    fig.notes.append(f"Round by round (each round uploads both ways back to back), the throughput ratio has "
                     f"median {fmt(pair.median)} ({pair.spread()}, {pair.n} rounds).")
    r = rows[0].ratio
    met = r >= TARGET
    fig.targets.append(Target(
        "5. checkpoint persistence at least 0.9 of boto3's throughput", met,
        f"A/B = {fmt(r)} (target >= {TARGET}); {'met' if met else 'missed'} by {fmt(abs(r - TARGET))}",
        "" if met else "see the note: the gap is in the pyarrow upload Ray Train makes (single-threaded copy, "
        "`use_threads=False`), not in the operator"))
    return fig
