"""Local files written in one step, by the Airflow side and the cluster alike: a reader sees the old
file or the new one whole, never a part (an attempt's record is read while a job may be writing it).
Standard library only: the runtime imports it on the cluster, which has no Airflow."""

from __future__ import annotations

import contextlib
import os
import tempfile


def write_atomically(path: str, body: bytes) -> None:
    """Write ``body`` to ``path``: a temporary file beside it, renamed into place (one step on POSIX)."""
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(body)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
