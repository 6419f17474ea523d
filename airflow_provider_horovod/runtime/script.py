"""A user's Horovod script run unchanged on every worker, as ``horovodrun -np N python train.py ARGS``
would run it: each rank a Python process of its own (``runtime.script_rank``), the script as ``__main__``
with that ``sys.argv``, from the job's copy of the script's folder. The rank's Ray worker starts it and
stays beside it (``runtime.rank_process``): it marks each line the rank prints ``[rank]`` as horovodrun
marks them, answers the script's own calls of Ray Train, and reports to Ray Train when the script ends.

What the script leaves becomes the run's record without an import of Ray: the files rank 0 writes under
``$AHP_CHECKPOINT_DIR`` are the attempt's checkpoint (copied to storage whenever they settle, so a restart
resumes from them, and reported to Ray Train when the script ends), and rank 0's lines printed as
``METRICS name=value ...`` are its metrics.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from airflow_provider_horovod.contract import (
    RANKS_AT_NICENESS_0,
    SCRIPT_CHECKPOINT_ENV,
    SCRIPT_METRICS_PREFIX,
)
from airflow_provider_horovod.documents import TrainingSpec
from airflow_provider_horovod.exceptions import (
    ScriptEndedEarlyError,
    ScriptExitError,
    ScriptRaisedError,
    ScriptRankLostError,
    SmokeRunDone,
)
from airflow_provider_horovod.runtime import rank_process
from airflow_provider_horovod.runtime.history import HISTORY, point
from airflow_provider_horovod.runtime.rank_process import RankProcess
from airflow_provider_horovod.runtime.records import exists, read_json, write_json
from airflow_provider_horovod.runtime.script_checkpoints import Snapshots, restore

# Horovod's message on the ranks still in a collective once another rank has shut it down.
HOROVOD_SHUT_DOWN = "Horovod has been shut down"
# A worker's scratch folder (its checkpoint folder and stored copies) in the node's temp folder: this, its pid.
SCRATCH_PREFIX = "ahp-script-"
# Which ranks' scripts ended, beside the attempt's checkpoints; and a smoke run's signal to stop.
ENDED_FILE = "script-ended.json"
SMOKE_STOP_FILE = "smoke-stop.json"
# How long a rank left alone in a collective looks for the note of the rank that ended.
ENDED_NOTE_WAIT_S = 5.0
# A smoke run's stop: how long a script stopped with Ctrl-C may take to end before it is killed.
SMOKE_KILL_AFTER_S = 30.0


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


class SmokeStop(threading.Thread):
    """A smoke run's bound: once rank 0 has stored its first checkpoint folder, the script of every rank is
    stopped (Ctrl-C, ``RankProcess.interrupt``; killed if it has not ended ``SMOKE_KILL_AFTER_S`` later) and the
    run ends with that checkpoint."""

    def __init__(self, spec: TrainingSpec, process: RankProcess) -> None:
        super().__init__(name="ahp-smoke-stop", daemon=True)
        self.flag, self.process = f"{spec.run_uri}/{SMOKE_STOP_FILE}", process
        self.fired = False
        self._cancelled = threading.Event()

    def run(self) -> None:
        while not self._cancelled.wait(1.0):
            if exists(self.flag):
                self.fired = True
                self.process.interrupt()
                if not self._cancelled.wait(SMOKE_KILL_AFTER_S):
                    self.process.end()
                return

    def cancel(self) -> None:
        self._cancelled.set()
        self.join()


def ended_ranks(spec: TrainingSpec, within_s: float = 0.0) -> str:
    """The ranks of this worker group whose script ended (exit code), as a failing rank names them, looked
    for up to ``within_s`` (a rank's worker notes its end once its process has gone, and Horovod shut down
    with that process); "" when none did (then a peer was lost: Horovod shuts down on the others as well)."""
    import psutil

    started = psutil.Process().create_time()  # each worker group runs in new processes
    deadline = time.monotonic() + within_s
    while True:
        ended = read_json(f"{spec.run_uri}/{ENDED_FILE}") or {}
        found = [f"rank {r} (exit code {n['code']})" for r, n in sorted(ended.items()) if n["at"] >= started]
        if found or time.monotonic() >= deadline:
            return ", ".join(found)
        time.sleep(0.2)


def note_end(spec: TrainingSpec, rank: int, code: int) -> None:
    """Rank ``rank``'s script ended: a rank still in a collective names it (best effort, one small file)."""
    with contextlib.suppress(Exception):
        uri = f"{spec.run_uri}/{ENDED_FILE}"
        write_json(uri, {**(read_json(uri) or {}), str(rank): {"code": code, "at": time.time()}})


def connect_at_niceness_0() -> None:
    """In the driver of a script, before anything of Ray: connect so that the job's workers start at niceness 0,
    as horovodrun's ranks run. Ray lowers each worker's Python thread to 15, so every other process of the node
    (Ray's own, Airflow's beside them) takes the CPU from a rank first, and a rank held back holds all the others
    at their next allreduce. Train's own actors start at 0 too: at 15 the synchronization actor's imports (a
    second of CPU) wait for the ranks and run in their timed loop instead of before it. Each rank's worker steps
    back to 15 once its rank runs (``rank_process.step_back_from_rank``)."""
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
    process = rank_process.take(rank)
    stop = SmokeStop(spec, process) if spec.smoke_run else None
    if snapshots:
        snapshots.start()
    try:
        process.run(script, folder, scratch, metrics_line if rank == 0 else None)
        if stop:
            stop.start()
        try:
            code = process.wait()
        finally:
            if stop:
                stop.cancel()
    finally:
        process.end()
        if snapshots:
            snapshots.stop()
    try:
        outcome = process.outcome()
        smoke_stopped = bool(stop and stop.fired)
        if smoke_stopped:
            code = 0
        elif outcome.get("smoke_run_done"):  # the script's own report with a checkpoint: as a function's ends
            raise SmokeRunDone()
        elif code < 0:
            lost(rank, code)
        elif error := outcome.get("error"):
            if HOROVOD_SHUT_DOWN in error and spec.smoke_run and exists(flag):  # a peer stopped first
                code, smoke_stopped = 0, True
            else:
                raise failed(spec, rank, outcome)
        note_end(spec, rank, code)  # as soon as it can be: a rank left alone in a collective looks for it
    finally:
        process.handled()  # every line the rank printed in its history before its end is reported or raised
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


def failed(spec: TrainingSpec, rank: int, outcome: dict[str, Any]) -> Exception:
    """What this worker raises for a script that raised: classed as in the rank's process (the user's error
    with its own frames, or a peer lost), or, for a rank left alone in a collective, naming who ended."""
    error = f"rank {rank}: {outcome['error']}"
    if HOROVOD_SHUT_DOWN in error and (ended := ended_ranks(spec, within_s=ENDED_NOTE_WAIT_S)):
        return ScriptEndedEarlyError(
            f"rank {rank} of {name_of(dict(spec.script or {}))} waited in a Horovod collective after {ended} had "
            "ended: every rank must make the same collective calls."
        )
    if not outcome.get("failure"):
        return ScriptRankLostError(error)
    raised = ScriptRaisedError(error)
    raised.ahp_user_error = outcome["failure"]  # type: ignore[attr-defined]
    return raised


def lost(rank: int, code: int) -> None:
    """The rank's process was killed (the kernel's OOM killer, a signal): this worker dies the same way, so Ray
    Train sees a lost worker, as when the script ran inside it, and restarts the group (``max_failures``)."""
    print(f"[{rank}] The script's process was ended by signal {-code}: its worker ends with it.", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


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
