"""A user's Horovod script run unchanged on every worker, as ``horovodrun -np N python train.py ARGS``
would run it: each rank a Python process of its own (``runtime.script_rank``), the script as ``__main__``
with that ``sys.argv``, from the job's copy of the script's folder. The rank's Ray worker starts it and
stays beside it: it marks each line the rank prints ``[rank]`` as horovodrun marks them, answers the
script's own calls of Ray Train, and reports to Ray Train when the script ends.

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
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import IO, Any

from airflow_provider_horovod.contract import (
    RANKS_AT_NICENESS_0,
    RAY_WORKER_NICENESS,
    SCRIPT_BRIDGE_FD_ENV,
    SCRIPT_CHECKPOINT_ENV,
    SCRIPT_LINE_MARK,
    SCRIPT_METRICS_PREFIX,
    SCRIPT_PARENT_PID_ENV,
)
from airflow_provider_horovod.documents import TrainingSpec
from airflow_provider_horovod.exceptions import (
    ScriptEndedEarlyError,
    ScriptExitError,
    ScriptMissingError,
    ScriptRaisedError,
    ScriptRankLostError,
    SmokeRunDone,
)
from airflow_provider_horovod.runtime.history import HISTORY, point
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
# How long the rank's last lines may take to arrive once its process has ended.
OUTPUT_DRAIN_S = 5.0
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


class RankProcess:
    """The script's rank as a process of its own (``runtime.script_rank``), started from the job's copy of its
    folder: each line it prints marked with the rank (``[1]<stdout>:``, as horovodrun does) in this worker's
    output and shown to ``on_line``; its calls of Ray Train answered by this worker (``answer``)."""

    def __init__(self, script: dict[str, Any], folder: str, rank: int, scratch: str, on_line: Callable | None) -> None:
        self.rank, self.on_line = rank, on_line
        self.outcome_path = os.path.join(scratch, "outcome.json")
        args = expand([str(a) for a in script.get("args") or []], folder)
        if "path" in script:
            self.cwd = script_root(script["path"])
            path = os.path.join(self.cwd, script["path"])
            self.request: dict[str, Any] = {"argv": [path, *args], "path": path}
        else:
            self.cwd = os.getcwd()
            self.request = {"argv": [script["module"], *args], "module": script["module"]}
        self.request.update(rank=rank, outcome=self.outcome_path)
        self.request_path = os.path.join(scratch, "request.json")
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.request_path, "w") as f:
            json.dump(self.request, f)
        self.bridge, theirs = socket.socketpair()
        env = {
            **os.environ,
            SCRIPT_BRIDGE_FD_ENV: str(theirs.fileno()),
            SCRIPT_PARENT_PID_ENV: str(os.getpid()),
            # What this worker imports from (the job's working_dir and py_modules among it), the rank does too.
            "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
        }
        env.setdefault("PYTHONUNBUFFERED", "1")  # each line in the task log as it is printed
        command = [sys.executable, "-m", "airflow_provider_horovod.runtime.script_rank", self.request_path]
        with theirs:
            self.process = subprocess.Popen(
                command,
                cwd=self.cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(theirs.fileno(),),
            )
        step_back_from_rank()
        self.pumps = [
            threading.Thread(target=pump, args=(self.process.stdout, sys.stdout, self.mark("stdout"), self.on_line)),
            threading.Thread(target=pump, args=(self.process.stderr, sys.stderr, self.mark("stderr"), None)),
        ]
        for thread in self.pumps:
            thread.daemon = True
            thread.start()

    def mark(self, stream: str) -> str:
        return SCRIPT_LINE_MARK.format(rank=self.rank, stream=stream)

    def wait(self) -> int:
        """Answer the script's calls until its process ends; its exit code (negative: the signal that ended it)."""
        assert self.process is not None
        calls = self.bridge.makefile("rw", encoding="utf-8")
        while self.process.poll() is None:
            if not select.select([self.bridge], [], [], 0.2)[0]:
                continue
            if not (line := calls.readline()):  # the process closed its end: it is ending
                self.process.wait()
                break
            calls.write(json.dumps(answer(json.loads(line)), default=str) + "\n")
            calls.flush()
        for thread in self.pumps:  # a process the script started and left running may hold its output open
            thread.join(timeout=OUTPUT_DRAIN_S)
        self.bridge.close()
        return self.process.returncode

    def interrupt(self) -> None:
        """Ctrl-C, as a user stops a script: KeyboardInterrupt in it, its ``finally`` blocks run."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)

    def end(self) -> None:
        """Kill the process if it still runs (this worker's own training ended another way)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def outcome(self) -> dict[str, Any]:
        """What the rank's process said of its end: ``error`` (and ``failure``, classed there) when the script
        raised, ``smoke_run_done`` when its own report ended a smoke run; {} when it exited."""
        try:
            with open(self.outcome_path) as f:
                return json.load(f)
        except (OSError, ValueError):
            return {}


def step_back_from_rank() -> None:
    """This worker below its rank once the rank runs: each of its threads (Linux keeps a niceness per thread)
    at Ray's niceness for its processes, so what the worker does meanwhile (Ray's threads, the controller's
    polls, the rank's output) waits for the rank, as Ray's processes wait for horovodrun's ranks."""
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError, ValueError):
            niceness = os.getpriority(os.PRIO_PROCESS, int(tid))
            os.setpriority(os.PRIO_PROCESS, int(tid), max(niceness, RAY_WORKER_NICENESS))


def pump(source: IO[bytes], sink: IO[str], mark: str, on_line: Callable[[str], None] | None) -> None:
    """Each line of the rank's stream into this worker's, marked; a last line without its newline too."""
    for raw in iter(source.readline, b""):
        line = raw.decode(errors="replace").rstrip("\n")
        sink.write(f"{mark}{line}\n")
        sink.flush()
        if on_line:
            on_line(line)


def answer(request: dict[str, Any]) -> dict[str, Any]:
    """One call of Ray Train made by the script in its process, made here, where Ray Train's session is."""
    import ray.train

    try:
        if request["call"] == "report":
            folder = request.get("checkpoint")
            checkpoint = ray.train.Checkpoint.from_directory(folder) if folder else None
            ray.train.report(request.get("metrics") or {}, checkpoint=checkpoint)
            return {}
        if request["call"] == "get_checkpoint":
            found = ray.train.get_checkpoint()
            return {"value": found.to_directory() if found else None}
        if request["call"] == "context":
            return {"value": getattr(ray.train.get_context(), request["name"])()}
        return {"error": f"no such call: {request['call']}"}
    except SmokeRunDone:
        return {"smoke_run_done": True}
    except Exception as err:  # noqa: BLE001 - raised in the script, where it was called
        return {"error": f"{type(err).__name__}: {err}", "os_error": isinstance(err, OSError)}


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
    process = RankProcess(script, folder, rank, scratch, metrics_line if rank == 0 else None)
    stop = SmokeStop(spec, process) if spec.smoke_run else None
    if snapshots:
        snapshots.start()
    try:
        process.start()
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
    note_end(spec, rank, code)
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
