"""A script's rank as a process of its own, seen from the Ray worker that starts it and stays beside it, as
horovodrun's launcher stays beside each rank it starts: the rank's lines marked ``[rank]`` in the worker's
output, what they show handled in the worker, the script's own calls of Ray Train answered there (where Ray
Train's session is), and the worker below its rank for CPU while the rank runs. The rank's process may be
started with its worker's (Ray's worker process setup hook), importing while Ray Train sets up the worker
group, and handed its script once the group is ready. The rank's own side is ``runtime.script_rank``; what a
script's run does around it, ``runtime.script``."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import IO, Any

from airflow_provider_horovod.contract import (
    RAY_WORKER_NICENESS,
    SCRIPT_BRIDGE_FD_ENV,
    SCRIPT_CHECKPOINT_ENV,
    SCRIPT_EARLY_IMPORTS_ENV,
    SCRIPT_LINE_MARK,
    SCRIPT_PARENT_PID_ENV,
)
from airflow_provider_horovod.exceptions import ScriptMissingError, SmokeRunDone

# Once the rank's process has ended, how long its output may stay open with no line coming before it is left.
OUTPUT_DRAIN_S = 5.0
# What a rank started early may import before its script is handed to it, when the script imports it: the heavy
# modules of a torch script, which read none of the rank's variables at import (Horovod and NCCL read them at
# ``hvd.init()``, torch reads CUDA_VISIBLE_DEVICES at its first use of CUDA).
EARLY_IMPORTS = ("numpy", "torch", "horovod.torch")
# This worker's rank's process started early (``start_in_worker``), waiting for its script: at most one.
_EARLY: list[RankProcess] = []


def early_start_env(script: dict[str, Any]) -> dict[str, str]:
    """The variables of a script's Ray workers that start its rank's process as each worker's process starts
    (``start_in_worker``, Ray's worker process setup hook), importing what the script imports of
    ``EARLY_IMPORTS``: while Ray Train sets up the worker group, as horovodrun's ranks import while nothing else
    runs. {} when the job has a setup hook of its own (its ranks then start with their script)."""
    from airflow_provider_horovod.runtime import ray_compat

    try:
        hook = ray_compat.worker_setup_hook_env(f"{__name__}.start_in_worker")
    except Exception:  # noqa: BLE001 - a Ray without it: the ranks start with their script
        return {}
    return {**hook, SCRIPT_EARLY_IMPORTS_ENV: ",".join(imports_of(script))} if hook else {}


def start_in_worker() -> None:
    """Ray's setup hook in each of a script's workers, as its process starts: the rank's process started (its
    rank not known yet), importing ``SCRIPT_EARLY_IMPORTS_ENV``'s modules; it never fails the worker's start."""
    with contextlib.suppress(Exception):
        imports = [m for m in os.environ.get(SCRIPT_EARLY_IMPORTS_ENV, "").split(",") if m]
        _EARLY[:] = [RankProcess(None, imports).start()]


def take(rank: int) -> RankProcess:
    """This worker's process for rank ``rank``: the one started early when it still waits, else one started now."""
    early = _EARLY.pop() if _EARLY else None
    if early is not None and early.process is not None and early.process.poll() is None:
        early.rank = rank
        return early
    return RankProcess(rank).start()


def imports_of(script: dict[str, Any]) -> list[str]:
    """Which of ``EARLY_IMPORTS`` the script's source imports, anywhere in it; none when it cannot be read."""
    import ast
    import importlib.util

    try:
        if "path" in script:
            path = os.path.join(script_root(script["path"]), script["path"])
        else:
            path = str(importlib.util.find_spec(script["module"]).origin)  # type: ignore[union-attr]
        with open(path) as f:
            tree = ast.parse(f.read())
    except Exception:  # noqa: BLE001 - a missing or broken script fails as it runs, saying why
        return []
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.update([node.module, *(f"{node.module}.{alias.name}" for alias in node.names)])
    return [m for m in EARLY_IMPORTS if any(n == m or n.startswith(f"{m}.") for n in names)]


def rank_env(extra: dict[str, str]) -> dict[str, str]:
    """The rank's environment: this worker's, and what it imports from (the job's working_dir and py_modules
    among it)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), **extra}
    env.setdefault("PYTHONUNBUFFERED", "1")  # each line in the task log as it is printed
    return env


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


class RankProcess:
    """The script's rank as a process of its own (``runtime.script_rank``): started (``start``), it imports what
    it was given and waits; handed its script (``run``), it runs it from the job's copy of its folder. Each line
    it prints is marked with the rank (``[1]<stdout>:``, as horovodrun does) in this worker's output and shown
    to ``on_line``; its calls of Ray Train are answered by this worker (``answer``)."""

    def __init__(self, rank: int | None, imports: Sequence[str] = ()) -> None:
        self.rank, self.imports = rank, list(imports)
        self.on_line: Callable[[str], None] | None = None
        self.outcome_path = ""
        self.process: subprocess.Popen | None = None
        self.parent = {SCRIPT_PARENT_PID_ENV: str(os.getpid())}

    def start(self) -> RankProcess:
        self.bridge, theirs = socket.socketpair()
        env = rank_env({SCRIPT_BRIDGE_FD_ENV: str(theirs.fileno()), **self.parent})
        command = [sys.executable, "-m", "airflow_provider_horovod.runtime.script_rank", *self.imports]
        with theirs:
            self.process = subprocess.Popen(
                command,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(theirs.fileno(),),
            )
        self.calls = self.bridge.makefile("rw", encoding="utf-8")
        self.read_at = time.monotonic()
        self.pumps = [
            threading.Thread(target=pump, args=(self.process.stdout, sys.stdout, self.marked("stdout"), self.read_out)),
            threading.Thread(target=pump, args=(self.process.stderr, sys.stderr, self.marked("stderr"), self.read_err)),
        ]
        # What a line shows (a metric to record, to MLflow) is handled apart from reading: a slow handling never
        # holds back the rank's output, and each line read is handled before the rank's end is reported.
        self.lines: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self.handler = threading.Thread(target=self.handle)
        for thread in [*self.pumps, self.handler]:
            thread.daemon = True
            thread.start()
        return self

    def run(self, script: dict[str, Any], folder: str, scratch: str, on_line: Callable[[str], None] | None) -> None:
        """Hand the started process its script: as ``__main__`` with its arguments (``folder``, the checkpoint
        folder, expanded in them), in this worker's environment as it is now."""
        self.on_line, self.outcome_path = on_line, os.path.join(scratch, "outcome.json")
        args = expand([str(a) for a in script.get("args") or []], folder)
        if "path" in script:
            cwd = script_root(script["path"])
            path = os.path.join(cwd, script["path"])
            request: dict[str, Any] = {"argv": [path, *args], "path": path}
        else:
            cwd, request = os.getcwd(), {"argv": [script["module"], *args], "module": script["module"]}
        request.update(rank=self.rank, outcome=self.outcome_path, cwd=cwd, env=rank_env(self.parent))
        self.calls.write(json.dumps(request) + "\n")
        self.calls.flush()
        step_back_from_rank()

    def read_out(self, line: str) -> None:
        self.read_at = time.monotonic()
        if self.on_line:
            self.lines.put(line)

    def read_err(self, line: str) -> None:
        self.read_at = time.monotonic()

    def handle(self) -> None:
        while (line := self.lines.get()) is not None:
            self.on_line(line)  # type: ignore[misc]

    def marked(self, stream: str) -> Callable[[], str]:
        """The mark of the stream's next line: its rank once known (a process started early learns it later)."""
        return lambda: SCRIPT_LINE_MARK.format(rank="?" if self.rank is None else self.rank, stream=stream)

    def wait(self) -> int:
        """Answer the script's calls until its process ends, and read its output to the end; its exit code
        (negative: the signal that ended it). What the lines show may still be in hand: ``handled``."""
        assert self.process is not None
        calls = self.calls
        while self.process.poll() is None:
            if not select.select([self.bridge], [], [], 0.2)[0]:
                continue
            if not (line := calls.readline()):  # the process closed its end: it is ending
                self.process.wait()
                break
            calls.write(json.dumps(answer(json.loads(line)), default=str) + "\n")
            calls.flush()
        self.drain()
        self.bridge.close()
        return self.process.returncode

    def drain(self) -> None:
        """The rank's last lines, once its process has ended: read until its output closes, or until none came
        for ``OUTPUT_DRAIN_S`` (a process the script started and left running may hold it open)."""
        ended_at = time.monotonic()
        while any(thread.is_alive() for thread in self.pumps):
            if time.monotonic() - max(self.read_at, ended_at) > OUTPUT_DRAIN_S:
                break
            for thread in self.pumps:
                thread.join(timeout=0.1)

    def handled(self) -> None:
        """Once ``wait`` has returned: until each line read has been handled, however long that takes (MLflow's
        client bounds its own calls)."""
        self.lines.put(None)
        self.handler.join()

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


def pump(source: IO[bytes], sink: IO[str], mark: Callable[[], str], read: Callable[[str], None]) -> None:
    """Each line of the rank's stream into this worker's, marked, then to ``read``; a last line without its
    newline too."""
    for raw in iter(source.readline, b""):
        line = raw.decode(errors="replace").rstrip("\n")
        sink.write(f"{mark()}{line}\n")
        sink.flush()
        read(line)


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
