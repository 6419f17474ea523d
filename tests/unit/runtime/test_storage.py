"""Storage on the cluster: finding an attempt's newest checkpoint as both Ray Train APIs lay them out;
checkpoint uploads to S3 through boto3's transfer manager against a real S3-protocol server (moto's
server mode), in parallel parts, read back bit-identical, every other copy left to Ray's own; and
rank 0's reports, recorded as the training curve and written as they come."""

import hashlib
import json
import os

import pytest

from airflow_provider_horovod.runtime import storage
from airflow_provider_horovod.runtime.storage import latest_checkpoint


# --- the newest checkpoint --------------------------------------------------------------------------
def make_checkpoint(folder, *, empty=False):
    folder.mkdir(parents=True)
    if not empty:
        (folder / "state.json").write_text("{}")
    return folder


def test_train_v1_checkpoints_are_ordered_by_index(tmp_path):
    run = tmp_path / "attempt-1" / "HorovodTrainer_2026-11-22_18-00-00" / "HorovodTrainer_abc_00000"
    for index in (2, 10, 9):
        make_checkpoint(run / f"checkpoint_{index:06d}")
    assert latest_checkpoint(str(tmp_path / "attempt-1")) == str(run / "checkpoint_000010")


def test_train_v2_checkpoints_are_ordered_by_their_timestamp(tmp_path):
    attempt = tmp_path / "attempt-1"
    for stamp in ("2026-11-22_18-22-06.486595", "2026-11-22_18-22-07.000376", "2026-11-22_18-22-06.999999"):
        make_checkpoint(attempt / f"checkpoint_{stamp}")
    assert latest_checkpoint(str(attempt)) == str(attempt / "checkpoint_2026-11-22_18-22-07.000376")


def test_empty_and_nested_checkpoint_folders_are_not_taken(tmp_path):
    attempt = tmp_path / "attempt-1"
    newest = make_checkpoint(attempt / "checkpoint_2026-11-22_18-22-06.486595")
    # A folder the training function saved inside its checkpoint, and a checkpoint cut off before
    # any file reached it.
    make_checkpoint(newest / "checkpoint_weights")
    make_checkpoint(attempt / "checkpoint_2026-11-22_18-22-09.000000", empty=True)
    assert latest_checkpoint(str(attempt)) == str(newest)


def test_an_attempt_without_checkpoints_has_none(tmp_path):
    assert latest_checkpoint(str(tmp_path / "attempt-1")) is None
    make_checkpoint(tmp_path / "attempt-1" / "other")
    assert latest_checkpoint(str(tmp_path / "attempt-1")) is None


# --- checkpoint uploads -----------------------------------------------------------------------------


@pytest.fixture
def s3(monkeypatch):
    from harness.s3 import MotoServer

    with MotoServer() as server:
        for name, value in server.env().items():
            monkeypatch.setenv(name, value)
        server.make_bucket("ckpt")
        yield server.endpoint_url


def pyarrow_s3(endpoint):
    import pyarrow.fs

    return pyarrow.fs.S3FileSystem(
        access_key="testing", secret_key="testing", endpoint_override=endpoint, region="us-east-1", scheme="http"
    )


def make_big_checkpoint(folder):
    rng = __import__("random").Random(7)
    files = {
        "model.pt": rng.randbytes(40 * 1024 * 1024),
        "meta.json": b'{"epoch": 3}',
        "shards/part-0": rng.randbytes(3 * 1024 * 1024),
        "shards/part-1": b"",
    }
    for name, data in files.items():
        os.makedirs(os.path.dirname(os.path.join(folder, name)), exist_ok=True)
        with open(os.path.join(folder, name), "wb") as f:
            f.write(data)
    return {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}


def digests(folder):
    return {
        os.path.relpath(os.path.join(root, f), folder): hashlib.sha256(
            open(os.path.join(root, f), "rb").read()
        ).hexdigest()
        for root, _, names in os.walk(folder)
        for f in names
    }


def test_a_checkpoint_goes_up_in_parts_and_reads_back_bit_identical(s3, tmp_path):
    import boto3

    made = make_big_checkpoint(tmp_path / "ckpt")
    fs = pyarrow_s3(s3)
    calls = []

    def refuse(*args, **kwargs):
        calls.append(args)

    storage.copy_files(
        refuse, str(tmp_path / "ckpt"), "ckpt/run/checkpoint_000001", source_filesystem=None, destination_filesystem=fs
    )
    uploaded = boto3.client("s3").head_object(Bucket="ckpt", Key="run/checkpoint_000001/model.pt")
    assert uploaded["ETag"].strip('"').endswith("-3")  # 40 MiB in 16 MiB parts: a multipart upload
    assert calls == []
    # Reads stay Ray's own copy (pyarrow, threads on): handed to the original helper.
    storage.copy_files(refuse, "ckpt/run/checkpoint_000001", str(tmp_path / "back"), source_filesystem=fs)
    assert calls == [("ckpt/run/checkpoint_000001", str(tmp_path / "back"))]
    import pyarrow.fs

    pyarrow.fs.copy_files("ckpt/run/checkpoint_000001", str(tmp_path / "back"), source_filesystem=fs)
    assert digests(tmp_path / "back") == made


def test_ray_trains_copy_helper_is_routed_through_it_once_installed(s3, tmp_path):
    import pyarrow.fs
    from ray.train import Checkpoint
    from ray.train._internal import storage as ray_storage

    made = make_big_checkpoint(tmp_path / "ckpt")
    storage.route_uploads()
    storage.route_uploads()  # idempotent
    assert ray_storage._pyarrow_fs_copy_files.func is storage.copy_files
    fs = pyarrow_s3(s3)
    ray_storage._pyarrow_fs_copy_files(str(tmp_path / "ckpt"), "ckpt/via-ray", destination_filesystem=fs)
    with Checkpoint(path="ckpt/via-ray", filesystem=fs).as_directory() as folder:
        assert digests(folder) == made
    # Local to local is still Ray's own copy.
    ray_storage._pyarrow_fs_copy_files(
        str(tmp_path / "ckpt"),
        str(tmp_path / "copy"),
        source_filesystem=pyarrow.fs.LocalFileSystem(),
        destination_filesystem=pyarrow.fs.LocalFileSystem(),
    )
    assert digests(tmp_path / "copy") == made


# --- the metric history -----------------------------------------------------------------------------


def test_a_point_keeps_the_numeric_metrics_only():
    p = storage.point({"loss": 0.5, "epoch": 3, "ok": True, "name": "x", "nan": float("nan")}, 7, "checkpoint_000001")
    assert p["metrics"] == {"loss": 0.5, "epoch": 3.0} and p["report"] == 7 and p["checkpoint"] == "checkpoint_000001"


@pytest.mark.parametrize("count", [1, 999, 10_000, 10_001, 25_000])
def test_an_even_sample_keeps_the_first_and_the_last_and_the_order(count):
    points = [{"report": i} for i in range(1, count + 1)]
    kept = storage.sampled(points)
    assert len(kept) == min(count, storage.MAX_POINTS)
    assert kept[0]["report"] == 1 and kept[-1]["report"] == count
    assert [p["report"] for p in kept] == sorted(p["report"] for p in kept)


class Rank:
    def __init__(self, rank):
        self.rank = rank

    def get_world_rank(self):
        return self.rank


@pytest.fixture
def train_v2(monkeypatch):
    """Train V2's report and checkpoint naming as they are called, without a worker group: every
    report lands in ``calls``; the ranks agree on the names ``names`` gives."""
    from ray.train.v2._internal.execution import context

    calls, names = [], iter(f"checkpoint_2026-11-24_10-00-0{i}.000000" for i in range(10))

    def report(self, metrics, checkpoint=None, *args, **kwargs):
        if checkpoint is not None:
            self._sync_checkpoint_dir_name_across_ranks(None)
        calls.append(metrics)

    monkeypatch.setattr(context.TrainContext, "report", report)
    monkeypatch.setattr(context.TrainContext, "_sync_checkpoint_dir_name_across_ranks", lambda self, name: next(names))
    return context.TrainContext, calls


def test_rank_0s_reports_are_recorded_once_wrapped_with_their_checkpoints_folder(train_v2, monkeypatch, tmp_path):
    import ray.train

    cls, calls = train_v2
    recorder = storage.History()
    recorder.record(str(tmp_path / "metrics_history.json"))
    recorder.record(str(tmp_path / "metrics_history.json"))  # wrapped once
    monkeypatch.setattr(ray.train, "get_context", lambda: Rank(0))
    ctx = object.__new__(cls)
    cls.report(ctx, {"loss": 1.0}, checkpoint="c")
    cls.report(ctx, {"loss": 0.5})
    monkeypatch.setattr(ray.train, "get_context", lambda: Rank(1))
    cls.report(ctx, {"loss": 2.0})
    assert calls == [{"loss": 1.0}, {"loss": 0.5}, {"loss": 2.0}]  # every report still goes to Ray Train
    assert [(p["report"], p["metrics"]["loss"], p["checkpoint"]) for p in recorder.points] == [
        (1, 1.0, "checkpoint_2026-11-24_10-00-00.000000"),
        (2, 0.5, None),
    ]


def test_the_history_is_written_as_it_comes_and_a_restarted_worker_goes_on_from_it(train_v2, monkeypatch, tmp_path):
    import ray.train

    cls, _ = train_v2
    uri = str(tmp_path / "metrics_history.json")
    monkeypatch.setattr(ray.train, "get_context", lambda: Rank(0))
    first = storage.History()
    first.record(uri)
    ctx = object.__new__(cls)
    cls.report(ctx, {"loss": 1.0})
    # The first report is on disk at once (a live chart shows it); later ones within HISTORY_WRITE_S wait.
    assert [p["report"] for p in json.load(open(uri))] == [1]
    cls.report(ctx, {"loss": 0.9})
    assert len(json.load(open(uri))) == 1
    first.write()  # after the last report
    assert [p["metrics"]["loss"] for p in json.load(open(uri))] == [1.0, 0.9]
    again = storage.History()  # a worker group Ray Train restarted within the attempt
    again.record(uri)
    again.resume()
    again.add(storage.point({"loss": 0.8}, len(again.points) + 1, None))
    assert [p["report"] for p in json.load(open(uri))] == [1, 2, 3]


def test_a_report_ray_never_returned_from_is_kept_when_the_workers_stop(train_v2, monkeypatch, tmp_path):
    """Rank 0's reports come within HISTORY_WRITE_S of each other (only the first is on disk); another rank
    fails and Ray Train stops the workers while rank 0's third report waits in Ray: the worker callback
    writes all three, the last without a checkpoint (Ray may not have stored it)."""
    import ray.train

    from airflow_provider_horovod.runtime.horovod_backend import KeepHistoryAtShutdown

    cls, _ = train_v2
    uri = str(tmp_path / "metrics_history.json")
    monkeypatch.setattr(ray.train, "get_context", lambda: Rank(0))
    history = storage.History()
    monkeypatch.setattr(storage, "HISTORY", history)
    history.record(uri)
    ctx = object.__new__(cls)
    cls.report(ctx, {"loss": 1.0}, checkpoint="c")
    cls.report(ctx, {"loss": 0.9}, checkpoint="c")
    assert len(json.load(open(uri))) == 1

    def stopped_while_held(self, metrics, checkpoint=None, *args, **kwargs):
        KeepHistoryAtShutdown().before_worker_shutdown()  # Ray Train stops the workers meanwhile
        raise SystemExit("the worker is killed")

    with pytest.raises(SystemExit):
        history._wrap(stopped_while_held)(ctx, {"loss": 0.8}, checkpoint="c")
    written = json.load(open(uri))
    assert [(p["report"], p["metrics"]["loss"]) for p in written] == [(1, 1.0), (2, 0.9), (3, 0.8)]
    assert [bool(p["checkpoint"]) for p in written] == [True, True, False]


def test_each_start_of_a_worker_group_is_noted_with_its_size_from_when_its_process_started(tmp_path):
    import psutil

    uri = str(tmp_path / "attempt-1" / "worker_groups.json")
    storage.note_worker_group(uri, 4)
    storage.note_worker_group(uri, 2)  # restarted smaller (a lost worker, an elastic resize)
    groups = storage.read_json(uri)
    assert [g["world_size"] for g in groups] == [4, 2]
    # Ray starts a worker's process once its resources are granted: held from then.
    assert [g["started_at"] for g in groups] == [round(psutil.Process().create_time(), 3)] * 2


def _helper(x):
    return 1 / x


def _shipped(x):
    return _helper(x) + 1


def test_code_shipped_by_value_gets_its_file_back_for_tracebacks():
    import traceback
    import types

    from airflow_provider_horovod.runtime.storage import DYNAMIC_CODE, with_source_file

    # As cloudpickle >= 3.1.3 ships them: the function and the helper of its file it calls.
    helper = types.FunctionType(_helper.__code__.replace(co_filename=DYNAMIC_CODE), {})
    fn = types.FunctionType(_shipped.__code__.replace(co_filename=DYNAMIC_CODE), {"_helper": helper})
    with_source_file(fn, "/dags/my_dag.py")
    try:
        fn(0)
    except ZeroDivisionError as err:
        frames = traceback.extract_tb(err.__traceback__)
    assert [(f.filename, f.name) for f in frames[-2:]] == [
        ("/dags/my_dag.py", "_shipped"),
        ("/dags/my_dag.py", "_helper"),
    ]
    assert frames[-1].lineno == _helper.__code__.co_firstlineno + 1  # the lines stay right


def test_a_shipped_callable_whose_code_cannot_be_renamed_still_runs():
    import types

    from airflow_provider_horovod.runtime.storage import DYNAMIC_CODE, with_source_file

    class Model:
        def step(self, x):
            return x + 1

    method = Model().step
    Model.step.__code__ = Model.step.__code__.replace(co_filename=DYNAMIC_CODE)
    fn = types.FunctionType(_shipped.__code__.replace(co_filename=DYNAMIC_CODE), {"_helper": method})
    with_source_file(fn, "/dags/my_dag.py")  # a bound method's code cannot be set through it
    assert fn(1) == 3 and fn.__code__.co_filename == "/dags/my_dag.py"
