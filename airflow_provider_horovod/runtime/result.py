"""Storage on the cluster, through pyarrow.fs (what Ray Train itself uses): the result record,
finding checkpoints, and URIs with their scheme."""

from __future__ import annotations

import json
import os
import re
import tempfile

from airflow_provider_horovod.spec import ResultRecord

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


def exists(uri: str) -> bool:
    import pyarrow.fs

    fs, path = _fs(uri)
    return fs.get_file_info(path).type != pyarrow.fs.FileType.NotFound


def write_text(uri: str, text: str) -> None:
    """Write in one step: a local temp file renamed into place, or a single S3 PUT."""
    body = text.encode("utf-8")
    if "://" not in uri or uri.startswith("file://"):
        path = uri[len("file://"):] if uri.startswith("file://") else uri
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
        with os.fdopen(fd, "wb") as f:
            f.write(body)
        os.replace(tmp, path)
        return
    fs, path = _fs(uri)
    # An S3 object appears only when its single PUT completes.
    with fs.open_output_stream(path) as out:
        out.write(body)


def read_record(uri: str) -> ResultRecord | None:
    data = read_json(uri)
    return None if data is None else ResultRecord.from_json(json.dumps(data))


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
