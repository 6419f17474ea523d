"""A user's Horovod script run unchanged on every worker, as ``horovodrun -np N python train.py ARGS``
would run it: as ``__main__``, with that ``sys.argv``, from the job's copy of the script's folder.

What the script leaves becomes the run's record without an import of Ray: the files rank 0 writes under
``$AHP_CHECKPOINT_DIR`` are the attempt's checkpoint (copied to storage whenever they settle, so a restart
resumes from them, and reported to Ray Train when the script ends), and rank 0's lines printed as
``METRICS name=value ...`` are its metrics. Each rank's lines are marked ``[rank]`` as horovodrun marks them.
"""

from __future__ import annotations

import contextlib
import datetime
import glob
import json
import os
import runpy
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from typing import Any

from airflow_provider_horovod.contract import (
    RANKS_AT_NICENESS_0,
    SCRIPT_CHECKPOINT_ENV,
    SCRIPT_LINE_MARK,
    SCRIPT_METRICS_PREFIX,
)
from airflow_provider_horovod.documents import TrainingSpec
from airflow_provider_horovod.exceptions import ScriptEndedEarlyError, ScriptExitError, ScriptMissingError, SmokeRunDone
from airflow_provider_horovod.runtime.history import HISTORY, point
from airflow_provider_horovod.runtime.records import exists, latest_checkpoint, read_json, write_json

# How often rank 0 looks at its checkpoint folder, and how long a changed folder must hold still before it
# is copied (a file half written is not a checkpoint).
SNAPSHOT_INTERVAL_S = 1.0
SETTLE_S = 0.5
# Horovod's message on the ranks still in a collective once another rank has shut it down.
HOROVOD_SHUT_DOWN = "Horovod has been shut down"
# A worker's scratch folder (its checkpoint folder and stored copies) in the node's temp folder: this, its pid.
SCRATCH_PREFIX = "ahp-script-"
# Which ranks' scripts ended, beside the attempt's checkpoints; and a smoke run's signal to stop.
ENDED_FILE = "script-ended.json"
SMOKE_STOP_FILE = "smoke-stop.json"


def name_of(script: dict[str, Any]) -> str:
    return script.get("path") or f"-m {script['module']}"


def parse_metrics(line: str) -> dict[str, float] | None:
    """``METRICS loss=0.25 epoch=3`` or ``METRICS {"loss": 0.25}``: the numbers of a metrics line; None for
    any other line, or one whose values are not numbers."""
    if not line.startswith(SCRIPT_METRICS_PREFIX):
        return None
    body = line[len(SCRIPT_METRICS_PREFIX) :].strip()
    try:
        pairs = json.loads(body).items() if body.startswith("{") else (p.split("=", 1) for p in body.split())
        metrics = {str(k): float(v) for k, v in pairs}
    except (ValueError, TypeError, AttributeError):
        return None
    return metrics or None


class RankLines:
    """A stream that writes each whole line with the rank's mark before it (``[1]<stdout>:``, as horovodrun
    does), and shows each line to ``on_line``. Anything else (``fileno``, ``encoding``) is the stream's."""

    def __init__(self, stream: Any, mark: str, on_line: Callable[[str], None] | None = None) -> None:
        self._stream, self._mark, self._on_line = stream, mark, on_line
        self._partial = ""
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:
            lines = (self._partial + text).split("\n")
            self._partial = lines.pop()
            for line in lines:
                self._stream.write(f"{self._mark}{line}\n")
                if self._on_line:
                    self._on_line(line)
        return len(text)

    def close_line(self) -> None:
        if self._partial:
            self.write("\n")
        self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


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


class SmokeStop(threading.Thread):
    """A smoke run's bound: once rank 0 has stored its first checkpoint folder, the script of every rank is
    stopped (``SmokeRunDone`` raised in its thread) and the run ends with that checkpoint."""

    def __init__(self, spec: TrainingSpec, script_thread: int) -> None:
        super().__init__(name="ahp-smoke-stop", daemon=True)
        self.flag, self.script_thread = f"{spec.run_uri}/{SMOKE_STOP_FILE}", script_thread
        self.fired = False
        self._cancelled = threading.Event()

    def run(self) -> None:
        while not self._cancelled.wait(1.0):
            if exists(self.flag):
                self.fired = True
                async_raise(self.script_thread, SmokeRunDone)
                return

    def cancel(self) -> None:
        self._cancelled.set()
        self.join()
        async_raise(self.script_thread, None)  # one raised as the script ended must not land in what follows


def async_raise(thread_id: int, error: type[BaseException] | None) -> None:
    """Raise ``error`` in the thread at its next Python instruction (None: take back one not raised yet)."""
    import ctypes

    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(error) if error else None)


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


def script_root(path: str) -> str:
    """The folder of the job's ``working_dir`` that holds the script: the worker's start folder, or an entry of
    its Python path (Ray gives a job's workers both)."""
    for folder in [os.getcwd(), *os.environ.get("PYTHONPATH", "").split(os.pathsep), *sys.path]:
        if folder and os.path.isfile(os.path.join(folder, path)):
            return folder
    raise ScriptMissingError(
        f"the script {path} is not in the job's working_dir on this node ({os.getcwd()}): give runtime_env a "
        "working_dir that holds it, or leave working_dir out to ship the script's own folder."
    )


def expand(args: list[str], folder: str) -> list[str]:
    """The arguments with ``$AHP_CHECKPOINT_DIR`` (or ``${...}``) as the shell would have expanded it."""
    return [
        a.replace("${" + SCRIPT_CHECKPOINT_ENV + "}", folder).replace("$" + SCRIPT_CHECKPOINT_ENV, folder) for a in args
    ]


@contextlib.contextmanager
def as_main(script: dict[str, Any], folder: str, rank: int, on_line: Callable[[str], None] | None) -> Iterator[None]:
    """sys.argv, the working directory, the Python path and the marked output a script sees under horovodrun."""
    saved = sys.argv, list(sys.path), os.getcwd(), sys.stdout, sys.stderr
    args = expand([str(a) for a in script.get("args") or []], folder)
    if "path" in script:
        root = script_root(script["path"])
        path = os.path.join(root, script["path"])
        sys.argv = [path, *args]
        sys.path.insert(0, os.path.dirname(path))  # its neighbour modules import, as under `python train.py`
        os.chdir(root)
    else:
        sys.argv = [script["module"], *args]
    out = sys.stdout = RankLines(saved[3], SCRIPT_LINE_MARK.format(rank=rank, stream="stdout"), on_line)
    err = sys.stderr = RankLines(saved[4], SCRIPT_LINE_MARK.format(rank=rank, stream="stderr"))
    try:
        yield
    finally:
        out.close_line()
        err.close_line()
        sys.argv, sys.path[:] = saved[0], saved[1]
        os.chdir(saved[2])
        sys.stdout, sys.stderr = saved[3], saved[4]


def ended_ranks(spec: TrainingSpec) -> str:
    """The ranks of this worker group whose script ended (exit code), as a failing rank names them; "" when
    none did (then a peer was lost: Horovod shuts down on the others as well)."""
    import psutil

    started = psutil.Process().create_time()  # each worker group runs in new processes
    ended = read_json(f"{spec.run_uri}/{ENDED_FILE}") or {}
    return ", ".join(
        f"rank {r} (exit code {note['code']})" for r, note in sorted(ended.items()) if note["at"] >= started
    )


def note_end(spec: TrainingSpec, rank: int, code: int) -> None:
    """Rank ``rank``'s script ended: a rank still in a collective names it (best effort, one small file)."""
    import time

    with contextlib.suppress(Exception):
        uri = f"{spec.run_uri}/{ENDED_FILE}"
        write_json(uri, {**(read_json(uri) or {}), str(rank): {"code": code, "at": time.time()}})


def connect_for_ranks_at_niceness_0() -> None:
    """In the driver of a script on Ray's HorovodTrainer (Train V1), before anything of Ray: connect so that
    the job's workers start at niceness 0, as horovodrun's ranks run. Ray starts its workers at 15, so every
    other process of the node (Ray's own, Airflow's beside them) takes the CPU from a rank first, and a rank
    held back holds all the others at their next allreduce. (V1 gives its workers no runtime env of their
    own; on V2 only the ranks' workers get it, ``trainers.build_v2_trainer``.)"""
    import ray

    ray.init(runtime_env={"env_vars": RANKS_AT_NICENESS_0})


def runner(spec: TrainingSpec) -> Callable[[], None]:
    """What every worker runs: the spec's script, then one report to Ray Train (rank 0's checkpoint folder,
    when it holds files, and its last metrics). A module-level function bound to the spec: Ray pickles it by
    reference, so on the worker it sees this module's ``HISTORY`` (a nested function would carry a copy of
    it, and the printed metrics would miss the history, the Training view and MLflow)."""
    import functools

    return functools.partial(run_script, spec)


def run_script(spec: TrainingSpec) -> None:
    """The script on this worker, in a scratch folder of its own (its checkpoint folder, the stored copies)."""
    import ray.train

    rank = ray.train.get_context().get_world_rank()
    remove_scratch_of_ended_workers()
    scratch = tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-")
    try:
        run_in(spec, rank, scratch)
    finally:  # the node outlives the job: what counts of these files is in storage by now
        shutil.rmtree(scratch, ignore_errors=True)


def remove_scratch_of_ended_workers() -> None:
    """The scratch folders of this node's workers that ended without removing theirs (killed, as a worker
    group restarted after a failure is): named by their process, gone with it."""
    import psutil

    for path in glob.glob(os.path.join(tempfile.gettempdir(), f"{SCRATCH_PREFIX}*-*")):
        pid = os.path.basename(path)[len(SCRATCH_PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def run_in(spec: TrainingSpec, rank: int, scratch: str) -> None:
    from airflow_provider_horovod.runtime.horovod_backend import shut_down_horovod

    script = dict(spec.script or {})
    folder = os.path.join(scratch, "checkpoint")
    os.makedirs(folder)
    if source := restore(spec, folder):
        print(f"[{rank}] {SCRIPT_CHECKPOINT_ENV} holds the last checkpoint, {source}", flush=True)
    os.environ[SCRIPT_CHECKPOINT_ENV] = folder

    def metrics_line(line: str) -> None:
        if (metrics := parse_metrics(line)) is not None:
            HISTORY.add(point(metrics, len(HISTORY.points) + 1, None))

    flag = f"{spec.run_uri}/{SMOKE_STOP_FILE}"
    first_stored = (lambda: write_json(flag, {"stopped": True})) if spec.smoke_run else None
    snapshots = Snapshots(folder, spec.run_uri, scratch, first_stored) if rank == 0 else None
    stop = SmokeStop(spec, threading.get_ident()) if spec.smoke_run else None
    if snapshots:
        snapshots.start()
    if stop:
        stop.start()
    smoke_stopped = False
    try:
        try:
            code = run_as_main(script, folder, rank, metrics_line if rank == 0 else None)
        finally:  # before anything else: a stop raised as the script ended lands here, not further on
            if stop:
                stop.cancel()
    except SmokeRunDone:
        if not (stop and stop.fired):  # the script's own report with a checkpoint stopped it: that is the run's
            raise
        code, smoke_stopped = 0, True
    except Exception as err:
        if HOROVOD_SHUT_DOWN in str(err) and spec.smoke_run and exists(flag):  # a peer stopped first
            code, smoke_stopped = 0, True
        elif HOROVOD_SHUT_DOWN in str(err) and (ended := ended_ranks(spec)):
            raise ScriptEndedEarlyError(
                f"rank {rank} of {name_of(script)} waited in a Horovod collective after {ended} had ended: "
                "every rank must make the same collective calls."
            ) from err
        else:
            raise
    finally:
        if snapshots:
            snapshots.stop()
    note_end(spec, rank, code)
    shut_down_horovod()
    if code:
        raise ScriptExitError(f"rank {rank} (exit code {code}): {name_of(script)} exited with code {code}.")
    if smoke_stopped:
        print(f"[{rank}] Smoke run: the script was stopped after its first stored checkpoint.", flush=True)
        folder = (snapshots.kept if snapshots else None) or folder
    try:
        report(folder, rank)
    finally:
        if snapshots:
            snapshots.discard()


def run_as_main(script: dict[str, Any], folder: str, rank: int, on_line: Callable[[str], None] | None) -> int:
    """Run the script as ``__main__``; its exit code (0 when it returned or called ``sys.exit(0)``)."""
    with as_main(script, folder, rank, on_line):
        try:
            if "path" in script:
                runpy.run_path(sys.argv[0], run_name="__main__")
            else:
                runpy.run_module(script["module"], run_name="__main__", alter_sys=True)
        except SystemExit as done:
            if done.code is None or done.code == 0:
                return 0
            if isinstance(done.code, int):
                return done.code
            print(done.code, file=sys.stderr)  # sys.exit("message"), as Python prints it
            return 1
    return 0


def report(folder: str, rank: int) -> None:
    """Every rank reports once when its script has ended (Train V2 needs every rank's report): rank 0 its
    checkpoint folder when it holds files, with the last metrics the script printed or reported. That report
    repeats the history's last point: it names that point's checkpoint instead of adding a point."""
    import ray.train
    from ray.train import Checkpoint

    has_files = rank == 0 and any(files for _, _, files in os.walk(folder))
    metrics: dict[str, Any] = {}
    if rank == 0 and HISTORY.points:
        metrics = dict(HISTORY.points[-1].get("metrics") or {})
        HISTORY.repeat_next = True
    if rank == 0 and not has_files:
        print(f"The script left no checkpoint: {SCRIPT_CHECKPOINT_ENV} ({folder}) holds no file.", flush=True)
    ray.train.report(metrics, checkpoint=Checkpoint.from_directory(folder) if has_files else None)
    if rank == 0:
        HISTORY.write()
