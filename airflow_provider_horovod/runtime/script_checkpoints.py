"""A script's checkpoint folder (``$AHP_CHECKPOINT_DIR``) and the attempt's storage: rank 0's folder copied
there whenever it settles, so a restarted worker group or a retry resumes from it, and the last copy put
back into the folder of every rank that starts again."""

from __future__ import annotations

import contextlib
import datetime
import os
import shutil
import tempfile
import threading
from collections.abc import Callable

from airflow_provider_horovod.documents import TrainingSpec
from airflow_provider_horovod.runtime.records import latest_checkpoint

# How often rank 0 looks at its checkpoint folder, and how long a changed folder must hold still before it
# is copied (a file half written is not a checkpoint).
SNAPSHOT_INTERVAL_S = 1.0
SETTLE_S = 0.5


class Snapshots(threading.Thread):
    """On rank 0: the checkpoint folder copied to the attempt's folder whenever it changed and then held still
    for ``SETTLE_S``, as ``checkpoint_<time>`` (the name Train V2 gives its own, so resuming finds the newest).
    Only the newest copy is kept."""

    def __init__(self, folder: str, run_uri: str, scratch: str, on_first: Callable[[], None] | None = None) -> None:
        super().__init__(name="ahp-script-snapshots", daemon=True)
        self.folder, self.run_uri, self.scratch, self.on_first = folder, run_uri, scratch, on_first
        self.uploaded: list[str] = []
        # The local copy of the last stored folder: what a stopped smoke run reports.
        self.kept: str | None = None
        self._stop_event = threading.Event()
        self._stored_state: tuple | None = state(folder)  # what the folder held at the start is stored already

    def run(self) -> None:
        while not self._stop_event.wait(SNAPSHOT_INTERVAL_S):
            seen = state(self.folder)
            if not seen or seen == self._stored_state or self._stop_event.wait(SETTLE_S):
                continue
            if state(self.folder) != seen:  # still being written
                continue
            try:
                self.store(seen)
            except Exception as err:  # noqa: BLE001 - storage may refuse for a while: the next round tries again
                print(f"The checkpoint folder could not be stored ({type(err).__name__}: {err}).", flush=True)

    def store(self, expected: tuple) -> None:
        copy = tempfile.mkdtemp(prefix="snapshot-", dir=self.scratch)
        shutil.copytree(self.folder, copy, dirs_exist_ok=True)
        if state(self.folder) != expected:  # written to while being copied: the next round takes it
            shutil.rmtree(copy, ignore_errors=True)
            return
        uri = f"{self.run_uri}/checkpoint_{datetime.datetime.now():%Y-%m-%d_%H-%M-%S.%f}"
        copy_folder(copy, uri)
        if self.kept:
            shutil.rmtree(self.kept, ignore_errors=True)
        self._stored_state, self.kept = expected, copy
        print(f"Checkpoint folder stored: {uri}", flush=True)
        for old in self.uploaded:
            delete_folder(old)
        self.uploaded = [uri]
        if self.on_first:
            self.on_first()
            self.on_first = None

    def stop(self) -> None:
        self._stop_event.set()
        self.join()

    def discard(self) -> None:
        """The copies, once Ray Train holds the final checkpoint."""
        for uri in self.uploaded:
            delete_folder(uri)
        self.uploaded = []


def state(folder: str) -> tuple:
    """Each file's path, size and modification time: the folder changed when this did."""
    found = []
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            with contextlib.suppress(OSError):
                info = os.stat(path)
                found.append((os.path.relpath(path, folder), info.st_size, info.st_mtime_ns))
    return tuple(sorted(found))


def copy_folder(source: str, uri: str) -> None:
    import pyarrow.fs

    from airflow_provider_horovod.runtime.records import filesystem

    fs, path = filesystem(uri)
    fs.create_dir(path, recursive=True)  # a local destination's folder is not made by copy_files
    pyarrow.fs.copy_files(source, path, source_filesystem=pyarrow.fs.LocalFileSystem(), destination_filesystem=fs)


def delete_folder(uri: str) -> None:
    from airflow_provider_horovod.runtime.records import filesystem

    fs, path = filesystem(uri)
    with contextlib.suppress(OSError):
        fs.delete_dir(path)


def restore(spec: TrainingSpec, folder: str) -> str | None:
    """Fill the checkpoint folder with the last checkpoint: this attempt's newest (a restarted worker group),
    else the one Ray Train hands the workers (an earlier attempt's). Returns where it came from."""
    import ray.train

    if found := latest_checkpoint(spec.run_uri):
        import pyarrow.fs

        from airflow_provider_horovod.runtime.records import filesystem

        fs, path = filesystem(found)
        pyarrow.fs.copy_files(path, folder, source_filesystem=fs, destination_filesystem=pyarrow.fs.LocalFileSystem())
        return found
    if checkpoint := ray.train.get_checkpoint():
        checkpoint.to_directory(folder)
        return checkpoint.path
    return None
