"""Storage on the cluster: the attempt's records and checkpoints through ``pyarrow.fs`` (what Ray
Train itself uses), checkpoint uploads at S3's speed, and forwarded AWS credentials.

Ray Train copies a checkpoint with ``pyarrow.fs.copy_files``, which turns threads off when the
target is an ``S3FileSystem``: one file after another, one stream each. ``route_uploads()`` routes
Ray Train's one copy helper (both trainer APIs, called on ``ray.train.report``) through boto3's
transfer manager for local-to-S3 copies: the files in parallel, each in parallel parts. Downloads
stay Ray's own: pyarrow reads with threads on, which measured more than twice as fast as boto3's
transfer manager.

Forwarded credentials (``forward_aws_credentials``, see ``airflow_provider_horovod.credentials``)
reach the driver through its environment, Ray Train through an explicit storage filesystem (it
travels to the controller and workers pickled, through Ray's object store, never through the job's
info), and the training function through its workers' environment.
"""

from __future__ import annotations

import concurrent.futures
import functools
import importlib
import json
import os
import posixpath
import re
import types
from collections.abc import Callable
from typing import Any, TypeVar

from airflow_provider_horovod.contract import SESSION_FILE, SPEC_FILE
from airflow_provider_horovod.local_files import write_atomically

T = TypeVar("T")

# --- the payload -----------------------------------------------------------------------------------


def read_payload(module: str, spec_class: type[T]) -> tuple[T, str]:
    """(spec, payload folder) of the payload package ``module``, which the Airflow side shipped as a
    Ray ``py_module`` holding the spec and any pickled code."""
    folder = list(importlib.import_module(module).__path__)[0]
    with open(os.path.join(folder, SPEC_FILE), encoding="utf-8") as f:
        return spec_class.from_json(f.read()), folder  # type: ignore[attr-defined]


def load_callable(ref: dict[str, str], folder: str) -> Callable:
    """A function from ``{"import": "pkg.mod:fn"}`` or ``{"pickle": "<file in the payload>"}``."""
    if "import" in ref:
        module, _, attr = ref["import"].partition(":")
        target: Any = importlib.import_module(module)
        for part in attr.split("."):
            if not hasattr(target, part):  # an import path that does not resolve here: configuration
                raise ImportError(f"{ref['import']} does not resolve on the cluster: {module} has no {part!r}")
            target = getattr(target, part)
        return target
    import cloudpickle

    with open(os.path.join(folder, ref["pickle"]), "rb") as f:
        fn = cloudpickle.load(f)
    if ref.get("source"):
        with_source_file(fn, ref["source"])
    return fn


# cloudpickle (3.1.3 on) names the code it ships by value so; tracebacks then lose the user's file.
DYNAMIC_CODE = "<dynamic-code>"


def _with_file(code: types.CodeType, source: str) -> types.CodeType:
    consts = tuple(_with_file(c, source) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    return code.replace(co_filename=source if code.co_filename == DYNAMIC_CODE else code.co_filename, co_consts=consts)


def with_source_file(fn: Any, source: str) -> None:
    """Give a function shipped by value, and the functions of its file it calls (its globals), back
    their file name, so tracebacks and a failure's "own frames" name the user's file and line."""
    shipped = [fn, *(getattr(fn, "__globals__", None) or {}).values()]
    for each in shipped:
        code = getattr(each, "__code__", None)
        if isinstance(code, types.CodeType) and code.co_filename == DYNAMIC_CODE:
            try:
                each.__code__ = _with_file(code, source)
            except (AttributeError, TypeError, ValueError):  # a bound method, say: only the name is lost
                pass


# --- records and checkpoints ---------------------------------------------------------------
# Train V1 names checkpoints checkpoint_000002, Train V2 checkpoint_2026-11-22_18-22-06.486595: both
# sort in the order they were written.
_CHECKPOINT_DIR = re.compile(r"^checkpoint_(\d+$)?")


def _fs(uri: str):
    """(filesystem, path) for a URI or a local path."""
    import pyarrow.fs

    if "://" not in uri:
        return pyarrow.fs.LocalFileSystem(), os.path.abspath(uri)
    return pyarrow.fs.FileSystem.from_uri(uri)


def to_uri(storage_uri: str, path: str) -> str:
    """A pyarrow path (no scheme for S3) back to a URI in the scheme of the storage."""
    if "://" in storage_uri and "://" not in path:
        scheme = storage_uri.split("://", 1)[0]
        if scheme != "file":
            return f"{scheme}://{path.lstrip('/')}"
    return path


def write_record(uri: str, record) -> None:
    """Write a record (``ResultRecord``, ``TaskRecord``) in one step: readers see it whole or not at all."""
    write_text(uri, record.to_json())


def write_json(uri: str, value) -> None:
    write_text(uri, json.dumps(value, sort_keys=True))


def read_json(uri: str):
    """The JSON file's value; None when there is no such file."""
    import pyarrow.fs

    fs, path = _fs(uri)
    if fs.get_file_info(path).type == pyarrow.fs.FileType.NotFound:
        return None
    with fs.open_input_stream(path) as f:
        return json.loads(f.read().decode("utf-8"))


def note_worker_group(uri: str, world_size: int, reason: str | None = None) -> None:
    """On rank 0, as a worker group starts: when its workers held their resources, and how many (each start
    of the attempt's worker group, a restart after a lost worker included, adds a line; the cost adds them up),
    and why it started (contract.SEGMENT_REASONS; None: not known). Ray starts a worker's process (the job's
    runtime_env makes it one of its own) once its resources are granted, so the process's start is when they
    began to be held; the cost keeps it within the driver's fit()."""
    import psutil

    started = psutil.Process().create_time()
    group = {"started_at": round(started, 3), "world_size": int(world_size), "reason": reason}
    write_json(uri, [*(read_json(uri) or []), group])


def exists(uri: str) -> bool:
    import pyarrow.fs

    fs, path = _fs(uri)
    return fs.get_file_info(path).type != pyarrow.fs.FileType.NotFound


def write_text(uri: str, text: str) -> None:
    """Write in one step: a local temp file renamed into place, or a single S3 PUT."""
    body = text.encode("utf-8")
    if "://" not in uri or uri.startswith("file://"):
        write_atomically(uri[len("file://") :] if uri.startswith("file://") else uri, body)
        return
    fs, path = _fs(uri)
    # An S3 object appears only when its single PUT completes.
    with fs.open_output_stream(path) as out:
        out.write(body)


def latest_checkpoint(attempt_uri: str) -> str | None:
    """The newest non-empty ``checkpoint_*`` folder anywhere under an attempt's folder, as a URI."""
    import pyarrow.fs

    fs, root = _fs(attempt_uri)
    if fs.get_file_info(root).type == pyarrow.fs.FileType.NotFound:
        return None
    found: list[tuple[int, str, str]] = []
    for info in fs.get_file_info(pyarrow.fs.FileSelector(root, recursive=True)):
        match = _CHECKPOINT_DIR.match(info.base_name)
        if info.type == pyarrow.fs.FileType.Directory and match:
            files = fs.get_file_info(pyarrow.fs.FileSelector(info.path, recursive=True))
            if any(f.type == pyarrow.fs.FileType.File for f in files):
                index = int(match.group(1)) if match.group(1) else -1
                found.append((index, info.base_name, info.path))
    # A checkpoint may hold folders of its own named checkpoint_*: only the outermost count.
    paths = [path for _, _, path in found]
    found = [c for c in found if not any(c[2].startswith(p + "/") for p in paths)]
    if not found:
        return None
    return to_uri(attempt_uri, max(found)[2])


# --- checkpoint uploads ----------------------------------------------------------------------
# Parallel files, and parallel parts within a file (boto3's TransferConfig).
FILE_WORKERS = 8
PART_WORKERS = 8
PART_BYTES = 16 * 1024 * 1024

_ORIGINAL = "_ahp_original_copy"


def _s3_client():
    import boto3
    from botocore.config import Config

    # Credentials and endpoint from the environment (the cluster's own, or forwarded ones).
    return boto3.client(
        "s3",
        config=Config(
            max_pool_connections=FILE_WORKERS * PART_WORKERS, retries={"max_attempts": 5, "mode": "standard"}
        ),
    )


def _transfer_config():
    from boto3.s3.transfer import TransferConfig

    return TransferConfig(
        multipart_threshold=PART_BYTES, multipart_chunksize=PART_BYTES, max_concurrency=PART_WORKERS, use_threads=True
    )


def _is_s3(fs) -> bool:
    import pyarrow.fs

    return isinstance(fs, pyarrow.fs.S3FileSystem)


def _is_local(fs) -> bool:
    import pyarrow.fs

    return fs is None or isinstance(fs, pyarrow.fs.LocalFileSystem)


def upload(local_path: str, bucket: str, key: str) -> int:
    """Upload a file, or a folder's files under ``key/``; the number of files."""
    client, config = _s3_client(), _transfer_config()
    if os.path.isfile(local_path):
        client.upload_file(local_path, bucket, key, Config=config)
        return 1
    files = [os.path.join(root, name) for root, _, names in os.walk(local_path) for name in names]
    with concurrent.futures.ThreadPoolExecutor(FILE_WORKERS) as pool:
        list(
            pool.map(
                lambda f: client.upload_file(
                    f, bucket, posixpath.join(key, os.path.relpath(f, local_path).replace(os.sep, "/")), Config=config
                ),
                files,
            )
        )
    return len(files)


def copy_files(original, source, destination, source_filesystem=None, destination_filesystem=None, **kwargs):
    """Ray Train's copy helper, with local-to-S3 copies made by boto3's transfer manager."""
    if _is_s3(destination_filesystem) and _is_local(source_filesystem):
        bucket, _, key = destination.partition("/")
        upload(source, bucket, key)
        return None
    return original(
        source,
        destination,
        source_filesystem=source_filesystem,
        destination_filesystem=destination_filesystem,
        **kwargs,
    )


def route_uploads() -> None:
    """Route Ray Train's checkpoint copies in this process through ``copy_files`` (once)."""
    from airflow_provider_horovod.runtime.ray_compat import COPY_HELPER, COPY_HELPER_MODULES

    for name in COPY_HELPER_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:  # a Ray without it (ray_compat's probe says so in the job's log)
            continue
        if hasattr(module, _ORIGINAL) or not hasattr(module, COPY_HELPER):
            continue
        original = getattr(module, COPY_HELPER)
        setattr(module, _ORIGINAL, original)
        setattr(module, COPY_HELPER, functools.partial(copy_files, original))


# --- forwarded AWS credentials -------------------------------------------------------------
ENV_NAMES = {
    "aws_access_key_id": "AWS_ACCESS_KEY_ID",
    "aws_secret_access_key": "AWS_SECRET_ACCESS_KEY",
    "aws_session_token": "AWS_SESSION_TOKEN",
}


def read_session(folder: str) -> dict | None:
    path = os.path.join(folder, SESSION_FILE)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def session_env(session: dict) -> dict[str, str]:
    """The AWS_* variables of the session; the cluster's own endpoint and region win over Airflow's."""
    env = {name: session[key] for key, name in ENV_NAMES.items()}
    if session.get("endpoint_url") and not os.environ.get("AWS_ENDPOINT_URL"):
        env["AWS_ENDPOINT_URL"] = session["endpoint_url"]
    if session.get("region_name") and not os.environ.get("AWS_DEFAULT_REGION"):
        env["AWS_DEFAULT_REGION"] = session["region_name"]
    return env


def s3_filesystem(env: dict[str, str]):
    import pyarrow.fs

    return pyarrow.fs.S3FileSystem(
        access_key=env["AWS_ACCESS_KEY_ID"],
        secret_key=env["AWS_SECRET_ACCESS_KEY"],
        session_token=env["AWS_SESSION_TOKEN"],
        endpoint_override=env.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL"),
        region=env.get("AWS_DEFAULT_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1",
    )


def with_env(train_fn: Callable, env: dict[str, str]) -> Callable:
    """The training function, run with ``env`` in its worker's environment (for its own boto3 or
    pyarrow calls)."""

    @functools.wraps(train_fn)
    def wrapped(*args, **kwargs):
        os.environ.update(env)
        return train_fn(*args, **kwargs)

    return wrapped


# --- the metric history -------------------------------------------------------------------------------

# Points kept: every report, or an even sample of them (the first and the last kept).
MAX_POINTS = 10_000
# How often rank 0 rewrites the live history while it trains (and always after its last report):
# often enough for a live chart, seldom enough that a long run does not rewrite it at every step.
HISTORY_WRITE_S = 5.0
_RECORDED = "_ahp_recorded"


def point(metrics: dict, step: int, checkpoint: str | None) -> dict:
    """One report: its number, time, numeric metrics, and the name of the checkpoint folder it saved."""
    import math
    import time

    numbers = {
        k: float(v)
        for k, v in metrics.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }
    return {"report": step, "time": round(time.time(), 3), "metrics": numbers, "checkpoint": checkpoint}


def sampled(points: list[dict], limit: int = MAX_POINTS) -> list[dict]:
    """An even sample of ``points`` (the first and the last kept), at most ``limit`` long."""
    if len(points) <= limit:
        return list(points)
    step = (len(points) - 1) / (limit - 1)
    return [points[round(i * step)] for i in range(limit)]


class History:
    """Rank 0's reports in this worker process, written to the attempt's history file as they come
    (a worker group that restarts within the attempt goes on from the file).

    A report is recorded when rank 0 makes it, before Ray Train takes it over (Train V2 may hold a report
    for up to its poll interval), and the file is rewritten at most every ``HISTORY_WRITE_S``; what is not
    written yet is written when the training function ends, when it raises on rank 0, and when Ray Train
    stops the workers (``write`` from the backend's worker callback): so a failure on any rank keeps every
    report rank 0 made. A report Ray had not returned from when the workers stopped keeps its metrics, not
    its checkpoint (Ray may not have stored it)."""

    def __init__(self) -> None:
        self.points: list[dict] = []
        self.uri: str | None = None
        self.written_at = 0.0
        # Called with each point as it is recorded (runtime.tracking logs it to MLflow).
        self.listeners: list[Callable[[dict], None]] = []

    def record(self, uri: str) -> None:
        """Wrap Ray Train's report (each API's that imports) so rank 0's reports land in ``uri``."""
        from airflow_provider_horovod.runtime.ray_compat import REPORT_METHODS

        self.uri = uri
        for module_name, class_name, sync in REPORT_METHODS:
            try:
                cls = getattr(importlib.import_module(module_name), class_name)
            except (ImportError, AttributeError):
                continue
            if getattr(cls.report, _RECORDED, False):
                continue
            cls.report = self._wrap(cls.report)
            if sync:  # Train V2 names a checkpoint's folder when the ranks agree on it: keep that name
                cls_sync = getattr(cls, sync)

                def named(context, *args, _sync=cls_sync, **kwargs):
                    context._ahp_checkpoint_dir = _sync(context, *args, **kwargs)
                    return context._ahp_checkpoint_dir

                setattr(cls, sync, named)

    def _wrap(self, report):
        history = self

        @functools.wraps(report)
        def recorded(context, metrics, checkpoint=None, *args, **kwargs):
            import ray.train

            if ray.train.get_context().get_world_rank() != 0:
                return report(context, metrics, checkpoint, *args, **kwargs)
            # Train V1 names the folder of the next checkpoint before it saves it; V2 once the ranks agree.
            v1_name = getattr(getattr(context, "storage", None), "checkpoint_dir_name", None)
            context._ahp_checkpoint_dir = None
            entry = history.add(point(dict(metrics or {}), len(history.points) + 1, None), write=False)
            result = report(context, metrics, checkpoint, *args, **kwargs)
            if checkpoint is not None:
                entry["checkpoint"] = getattr(context, "_ahp_checkpoint_dir", None) or v1_name
            history.write_if_due()
            return result

        setattr(recorded, _RECORDED, True)
        return recorded

    def resume(self) -> None:
        """Go on from what an earlier worker group of this attempt wrote."""
        if self.uri and not self.points:
            self.points = list(read_json(self.uri) or [])

    def add(self, entry: dict, *, write: bool = True) -> dict:
        self.points.append(entry)
        for listener in self.listeners:
            listener(entry)
        if write:
            self.write_if_due()
        return entry

    def write_if_due(self) -> None:
        import time

        if time.monotonic() - self.written_at >= HISTORY_WRITE_S:
            self.write()

    def write(self) -> None:
        import time

        if self.uri and self.points:
            write_json(self.uri, sampled(self.points))
            self.written_at = time.monotonic()


HISTORY = History()
