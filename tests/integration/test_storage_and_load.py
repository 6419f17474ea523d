"""Storage faults and a backfill's load, against the real stack: a Ray head with token auth,
checkpoints on local disk and on S3 (moto's server mode).

- S3 down when the task starts: the operator fails before submitting, naming the storage, the
  endpoint and what to do. S3 down once the job runs: the job fails, and so does the task.
- S3 down, or the checkpoint gone, when the operator checks the result: the task fails naming the
  URI, pushes no checkpoint URI, and its retry recovers (reuses the job, or trains a new attempt).
- A backfill: 20 task runs submitted at once, their 20 triggers in one event loop (as one
  triggerer runs them): every run succeeds with its own checkpoint, one Ray job per run.

What is checked here is the Airflow side, so the jobs are the quick stand-ins of the ``quick_jobs``
fixture: real Ray jobs under the operator's own submission ids, payloads and storage, which write a
real checkpoint and result record instead of training.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from airflow_provider_horovod.contract import META_RESULT_URI, XCOM_CHECKPOINT_URI, XCOM_SUBMISSION_ID
from airflow_provider_horovod.exceptions import StorageError, StorageUnavailableError, TrainingResultError
from airflow_provider_horovod.storage import Storage, split_uri
from harness.tasks import FakeTI, defer, jobs_of, trigger_event

from .test_operator import make_operator

pytestmark = pytest.mark.integration

RESULT_KEYS = {
    "checkpoint_uri",
    "best_checkpoint_uri",
    "metrics",
    "submission_id",
    "dashboard_url",
    "storage_uri",
    "world_size",
    "attempt",
}


def tiny_operator(storage_path, run: str, **kwargs):
    """A deferrable training task whose job is the quick stand-in (the ``quick_jobs`` fixture): it
    writes a real checkpoint and result record where the training would."""
    return make_operator(storage_path, train_loop_config={"run": run, "quick_lines": 2}, deferrable=True, **kwargs)


def complete(op_factory, ti, deferred, event):
    """execute_complete on a fresh operator instance, as Airflow resumes a deferred task."""
    return getattr(op_factory(), deferred.method_name)({"ti": ti}, event)


def no_result_pushed(ti) -> bool:
    return XCOM_CHECKPOINT_URI not in ti.xcoms and "return_value" not in ti.xcoms


def checkpoint_of(event: dict, aws_conn_id: str | None = None) -> str:
    record = Storage(aws_conn_id).read_json(event["metadata"][META_RESULT_URI])
    return record["checkpoint_uri"]


class S3Endpoint:
    """A second S3 endpoint onto the session's moto storage (moto's servers in one process share it),
    which can go down (connections refused), hang (connections accepted, never answered) and come back."""

    def __init__(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = None
        self.hung: socket.socket | None = None

    def up(self):
        from moto.server import ThreadedMotoServer

        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()

    def down(self):
        if self.server is not None:
            self.server.stop()
            self.server = None
        if self.hung is not None:
            self.hung.close()
            self.hung = None

    def hang(self):
        """Listening, so connections open, but nothing ever answers a request."""
        self.down()
        self.hung = socket.socket()
        self.hung.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.hung.bind(("127.0.0.1", self.port))
        self.hung.listen(64)


@pytest.fixture
def flaky_s3(ray_cluster, moto_server, monkeypatch, quick_jobs):
    """The endpoint, a bucket on it, and the AWS connection ``aws_flaky`` the Airflow side reads it with."""
    endpoint = S3Endpoint()
    endpoint.up()
    endpoint.bucket = moto_server.make_bucket(f"ahp-flaky-{uuid.uuid4().hex[:8]}")
    monkeypatch.setenv(
        "AIRFLOW_CONN_AWS_FLAKY",
        json.dumps(
            {
                "conn_type": "aws",
                "login": "testing",
                "password": "testing",
                "extra": {"endpoint_url": endpoint.url, "region_name": "us-east-1"},
            }
        ),
    )
    yield endpoint
    endpoint.down()


# --- S3 down when the task starts: nothing is submitted ---------------------------------------------


@pytest.mark.timeout(180)
@pytest.mark.parametrize("outage", ["refused", "hung"])
def test_s3_down_when_the_task_starts_fails_before_submission(flaky_s3, ray_hook, outage, monkeypatch):
    from airflow_provider_horovod import storage

    # The probe's bounds (5 s to connect, 10 s to read, 2 tries) shortened for the test.
    monkeypatch.setattr(
        storage,
        "S3_PROBE_CONFIG",
        {"connect_timeout": 1, "read_timeout": 2, "retries": {"max_attempts": 1, "mode": "standard"}},
    )
    run_id = f"s3down-{uuid.uuid4().hex[:6]}"
    storage_path = f"s3://{flaky_s3.bucket}/runs"
    if outage == "refused":
        flaky_s3.down()
    else:
        flaky_s3.hang()
    ti = FakeTI(run_id)
    op = tiny_operator(storage_path, run_id, aws_conn_id="aws_flaky")
    started = time.monotonic()
    with pytest.raises(StorageUnavailableError) as err:
        op.execute({"ti": ti})
    # The probe's short waits, not the task's S3 client's: a hung endpoint would hold that one a read timeout.
    assert time.monotonic() - started < storage.S3_CLIENT_CONFIG["read_timeout"]
    message = str(err.value)
    assert ti.task_run.storage_uri(storage_path) in message  # names the storage
    assert flaky_s3.url in message
    assert "'aws_flaky'" in message  # where it looked
    assert "does not answer" in message
    assert "Check that the S3 service is up" in message  # what to do
    assert jobs_of(ray_hook, run_id) == []  # nothing was submitted
    assert ti.xcoms == {}


@pytest.mark.timeout(120)
def test_a_missing_bucket_fails_before_submission(flaky_s3, ray_hook):
    run_id = f"nobucket-{uuid.uuid4().hex[:6]}"
    ti = FakeTI(run_id)
    op = tiny_operator("s3://ahp-no-such-bucket/runs", run_id, aws_conn_id="aws_flaky")
    with pytest.raises(StorageUnavailableError) as err:
        op.execute({"ti": ti})
    message = str(err.value)
    assert "the bucket 'ahp-no-such-bucket' does not exist" in message
    assert "Create it, or fix storage_path" in message
    assert jobs_of(ray_hook, run_id) == []


# --- S3 down once the job runs: the job fails, so does the task ------------------------------------


@pytest.mark.timeout(420)
def test_s3_down_after_submission_fails_the_job_and_the_task(flaky_s3, ray_hook, monkeypatch):
    from airflow_provider_horovod import storage

    # The failed attempt's record waits out an outage that passes; this one does not pass.
    monkeypatch.setattr(storage, "WAIT_OUT_REFUSAL_S", 3.0)
    run_id = f"s3gone-{uuid.uuid4().hex[:6]}"
    ti = FakeTI(run_id)
    # The job writes through the flaky endpoint too (the cluster's own S3 settings, for this job).
    kwargs = {"aws_conn_id": "aws_flaky", "runtime_env": {"env_vars": {"AWS_ENDPOINT_URL": flaky_s3.url}}}
    op = tiny_operator(f"s3://{flaky_s3.bucket}/runs", run_id, **kwargs)
    deferred = defer(op, ti)  # the bucket answered: the job is submitted
    flaky_s3.down()  # before the job's driver has even started
    event = trigger_event(deferred)
    assert event["outcome"] == "error", event
    assert event["job_status"] == "FAILED", event
    with pytest.raises(StorageError) as err:
        complete(lambda: tiny_operator(f"s3://{flaky_s3.bucket}/runs", run_id, **kwargs), ti, deferred, event)
    message = str(err.value)
    # The job's own words: it could not reach the bucket.
    assert "storage:" in message, message
    assert flaky_s3.bucket in message, message
    assert "connect" in message.lower(), message
    assert no_result_pushed(ti)
    assert [j["submission_id"] for j in jobs_of(ray_hook, run_id)] == [deferred.trigger.submission_id]


# --- the result checked when S3 is down, or the checkpoint is gone ---------------------------------


@pytest.mark.timeout(420)
def test_s3_down_when_the_operator_checks_fails_then_the_retry_reuses_the_job(flaky_s3, ray_hook):
    run_id = f"s3check-{uuid.uuid4().hex[:6]}"
    storage_path = f"s3://{flaky_s3.bucket}/runs"
    ti = FakeTI(run_id)
    make = lambda: tiny_operator(storage_path, run_id, aws_conn_id="aws_flaky")  # noqa: E731
    deferred = defer(make(), ti)
    event = trigger_event(deferred)
    assert event["outcome"] == "success", event
    flaky_s3.down()
    with pytest.raises(TrainingResultError) as err:
        complete(make, ti, deferred, event)
    message = str(err.value)
    assert event["metadata"][META_RESULT_URI] in message, message
    assert flaky_s3.url in message, message
    assert "does not answer" in message
    assert "retry the task" in message
    assert no_result_pushed(ti)

    flaky_s3.up()  # the storage is back: the retry re-attaches to the finished job, no second job
    retry_ti = FakeTI(run_id)
    retry_ti.try_number = 2
    # The job has ended: the retry finishes it in the worker, without a deferral.
    result = make().execute({"ti": retry_ti})
    assert retry_ti.xcoms[XCOM_SUBMISSION_ID] == deferred.trigger.submission_id
    assert result["checkpoint_uri"] == checkpoint_of(event)
    assert result["attempt"] == 1
    assert retry_ti.xcoms[XCOM_CHECKPOINT_URI] == result["checkpoint_uri"]
    assert len(jobs_of(ray_hook, run_id)) == 1


def delete_checkpoint(uri: str, moto_server) -> int:
    """Delete a checkpoint's files, as a lifecycle rule or a cleanup job does: the folder (local), or
    every object under the prefix but the folder markers (S3; an empty "folder" is no checkpoint).
    Returns how many files went."""
    scheme, path = split_uri(uri)
    if scheme == "":
        count = sum(len(files) for _, _, files in os.walk(path))
        shutil.rmtree(path)
        return count
    bucket, _, prefix = path.partition("/")
    client = moto_server.client()
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix=prefix + "/").get("Contents", [])]
    files = [key for key in keys if not key.endswith("/")]
    for key in files:
        client.delete_object(Bucket=bucket, Key=key)
    return len(files)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("where", ["s3", "local"])
def test_a_checkpoint_that_vanishes_before_the_check_fails_the_task(
    ray_cluster, moto_server, ray_hook, tmp_path, where, quick_jobs
):
    run_id = f"vanish-{where}-{uuid.uuid4().hex[:6]}"
    if where == "s3":
        storage_path = f"s3://{moto_server.make_bucket(f'ahp-vanish-{uuid.uuid4().hex[:8]}')}/runs"
    else:
        storage_path = str(tmp_path / "storage")
    make = lambda: tiny_operator(storage_path, run_id)  # noqa: E731
    ti = FakeTI(run_id)
    deferred = defer(make(), ti)
    event = trigger_event(deferred)
    assert event["outcome"] == "success", event
    checkpoint = checkpoint_of(event)
    assert checkpoint.startswith(storage_path + "/")
    assert delete_checkpoint(checkpoint, moto_server) > 0

    with pytest.raises(TrainingResultError) as err:
        complete(make, ti, deferred, event)
    message = str(err.value)
    assert f"checkpoint {checkpoint}, but it is missing or empty" in message, message
    assert "No checkpoint URI was pushed" in message
    assert "Retry or clear the task" in message
    assert no_result_pushed(ti)

    # The retry does not reuse the job whose checkpoint is gone (it would fail again): it trains anew.
    retry_ti = FakeTI(run_id)
    retry_ti.try_number = 2
    again = defer(make(), retry_ti)
    assert again.trigger.submission_id == ti.task_run.submission_id(2)
    result = complete(make, retry_ti, again, trigger_event(again))
    assert result["attempt"] == 2
    assert result["checkpoint_uri"] != checkpoint
    assert Storage().folder_has_files(result["checkpoint_uri"])
    assert retry_ti.xcoms[XCOM_CHECKPOINT_URI] == result["checkpoint_uri"]
    assert [j["submission_id"] for j in sorted(jobs_of(ray_hook, run_id), key=lambda j: j["submission_id"])] == [
        deferred.trigger.submission_id,
        again.trigger.submission_id,
    ]


# --- a backfill: 20 runs at once on one cluster -----------------------------------------------------

BACKFILL_RUNS = 20


class MemoryWatch:
    """The machine's lowest MemAvailable while the load runs (sampled every 0.5 s)."""

    def __init__(self):
        self.lowest_kb = self.available_kb()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)

    @staticmethod
    def available_kb() -> int:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:"))

    def _sample(self):
        while not self.stop.wait(0.5):
            self.lowest_kb = min(self.lowest_kb, self.available_kb())

    def __enter__(self):
        self.start_kb = self.available_kb()
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()

    @property
    def peak_used_gib(self) -> float:
        return (self.start_kb - self.lowest_kb) / 2**20


@pytest.mark.timeout(1200)
def test_a_backfill_of_20_runs_at_once_completes_each_with_its_own_checkpoint(
    ray_cluster, ray_hook, tmp_path, quick_jobs
):
    storage_path = str(tmp_path / "storage")
    token = uuid.uuid4().hex[:6]
    tis = []
    for day in range(1, BACKFILL_RUNS + 1):
        ti = FakeTI(f"backfill__2026-10-{day:02d}T00:00:00+00:00-{token}")
        ti.dag_id = "ahp_backfill"
        tis.append(ti)
    # One epoch, and a triggerer's poll every 2 s: 20 triggers polling every 0.5 s would keep the
    # dashboard of this 2-core machine busy.
    make = {ti.run_id: (lambda run=ti.run_id: tiny_operator(storage_path, run, poll_interval_seconds=2)) for ti in tis}
    timings = {}

    with MemoryWatch() as memory:
        # 20 workers start their task at the same moment: each submits its job and defers.
        started, started_at = time.monotonic(), time.time()
        with ThreadPoolExecutor(max_workers=BACKFILL_RUNS) as pool:
            deferrals = list(pool.map(lambda ti: defer(make[ti.run_id](), ti), tis))
        timings["submit_s"] = time.monotonic() - started

        # One triggerer: the 20 triggers in one event loop.
        async def triggerer():
            return await asyncio.wait_for(asyncio.gather(*(anext(d.trigger.run()) for d in deferrals)), timeout=1000)

        events = [e.payload for e in asyncio.run(triggerer())]
        timings["all_done_s"] = time.monotonic() - started

    failed = {e["submission_id"]: (e["job_status"], e["message"][-300:]) for e in events if e["outcome"] != "success"}
    assert not failed, failed
    results = [complete(make[ti.run_id], ti, d, e) for ti, d, e in zip(tis, deferrals, events, strict=True)]

    # Every run: its own job, its own checkpoint under its own folder, a complete XCom.
    for ti, deferred, result in zip(tis, deferrals, results, strict=True):
        assert result["submission_id"] == deferred.trigger.submission_id == ti.task_run.submission_id(1)
        assert RESULT_KEYS <= set(result)
        assert result["world_size"] == 2
        assert result["attempt"] == 1
        assert result["metrics"]["run"] == ti.run_id
        assert result["metrics"]["size"] == 2  # its own config ran
        assert result["checkpoint_uri"].startswith(ti.task_run.storage_uri(storage_path))
        assert Storage().folder_has_files(result["checkpoint_uri"])
        assert ti.xcoms[XCOM_CHECKPOINT_URI] == result["checkpoint_uri"]
        assert ti.xcoms[XCOM_SUBMISSION_ID] == result["submission_id"]
    assert len({r["checkpoint_uri"] for r in results}) == BACKFILL_RUNS

    # The cluster ran exactly one job per run: none duplicated, none lost.
    bases = {ti.task_run.base_id for ti in tis}
    jobs = [j for j in ray_hook.list_jobs() if (j.get("submission_id") or "").rsplit("-a", 1)[0] in bases]
    assert sorted(j["submission_id"] for j in jobs) == sorted(r["submission_id"] for r in results)
    assert {j["status"] for j in jobs} == {"SUCCEEDED"}

    fit = sorted(r["timings"]["fit_s"] for r in results)
    ended = sorted(r["timings"]["finished_at"] - started_at for r in results)
    print(
        f"\nbackfill of {BACKFILL_RUNS}: submitted in {timings['submit_s']:.1f} s, all done in "
        f"{timings['all_done_s']:.1f} s; jobs ended from {ended[0]:.0f} s to {ended[-1]:.0f} s; "
        f"fit per job {fit[0]:.1f}-{fit[-1]:.1f} s; "
        f"peak memory used {memory.peak_used_gib:.1f} GiB (of {memory.start_kb / 2**20:.1f} GiB available)"
    )
