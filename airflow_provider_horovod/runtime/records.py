"""The attempt's records and checkpoints in storage, through ``pyarrow.fs`` (what Ray Train itself
uses): a record written in one step, JSON read back, the newest checkpoint of an attempt."""

from __future__ import annotations

import json
import os
import re

from airflow_provider_horovod.atomic_files import write_atomically

# Train V1 names checkpoints checkpoint_000002, Train V2 checkpoint_2026-11-22_18-22-06.486595: both
# sort in the order they were written.
_CHECKPOINT_DIR = re.compile(r"^checkpoint_(\d+$)?")
# Beside a checkpoint's folder while its copy to storage is under way (``runtime.uploads``): a copy cut
# short (a full volume, a lost node) leaves it, and no retry resumes from that folder.
UNFINISHED = ".unfinished"


# The names each API gives a checkpoint's folder in storage (not a download's checkpoint_tmp_...).
_STORED_CHECKPOINT = re.compile(r"^checkpoint_(\d+|\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d\.\d+)$")


def is_checkpoint_folder(path: str) -> bool:
    return _STORED_CHECKPOINT.match(path.rstrip("/").rsplit("/", 1)[-1]) is not None


def unfinished_marker(checkpoint_path: str) -> str:
    """The marker of a checkpoint folder's copy under way: ``.<folder's name>.unfinished`` beside it."""
    parent, _, name = checkpoint_path.rstrip("/").rpartition("/")
    return f"{parent}/.{name}{UNFINISHED}"


def filesystem(uri: str):
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

    fs, path = filesystem(uri)
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

    fs, path = filesystem(uri)
    return fs.get_file_info(path).type != pyarrow.fs.FileType.NotFound


def write_text(uri: str, text: str) -> None:
    """Write in one step: a local temp file renamed into place, or a single S3 PUT."""
    body = text.encode("utf-8")
    if "://" not in uri or uri.startswith("file://"):
        write_atomically(uri[len("file://") :] if uri.startswith("file://") else uri, body)
        return
    fs, path = filesystem(uri)
    # An S3 object appears only when its single PUT completes.
    with fs.open_output_stream(path) as out:
        out.write(body)


def latest_checkpoint(attempt_uri: str) -> str | None:
    """The newest non-empty ``checkpoint_*`` folder anywhere under an attempt's folder whose copy finished, as
    a URI."""
    import pyarrow.fs

    fs, root = filesystem(attempt_uri)
    if fs.get_file_info(root).type == pyarrow.fs.FileType.NotFound:
        return None
    found: list[tuple[int, str, str]] = []
    listed = fs.get_file_info(pyarrow.fs.FileSelector(root, recursive=True))
    unfinished = {info.path for info in listed if info.base_name.endswith(UNFINISHED)}
    for info in listed:
        match = _CHECKPOINT_DIR.match(info.base_name)
        if info.type == pyarrow.fs.FileType.Directory and match and unfinished_marker(info.path) not in unfinished:
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
