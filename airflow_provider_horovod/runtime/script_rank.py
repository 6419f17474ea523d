"""One rank of a user's script, as a process of its own, as horovodrun starts ``python train.py`` for each
rank: ``python -m airflow_provider_horovod.runtime.script_rank [MODULE ...]``, started by the rank's Ray worker
(``runtime.rank_process``), which marks the lines it prints, stores its checkpoint folder and reports to Ray
Train. It imports the modules given, then waits for its script (the first line on the socket).

The script runs as ``__main__`` with its ``sys.argv``, in a plain Python process: inside a Ray worker, Ray's
own threads and imports beside it cost a script's rank a few percent of its CPU (bench/results.md, figure 9).
What it raised goes back to the worker in the outcome file, classed here as the worker would class it (its
class, message and own frames). The calls of Ray Train a script may make itself (``ray.train.report``,
``get_checkpoint``, ``get_context``) are answered by the worker, which holds Ray Train's session, over the
socket it passes (``SCRIPT_BRIDGE_FD_ENV``): one JSON line each way a call.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.util
import json
import os
import runpy
import signal
import socket
import sys
import threading
import traceback
from typing import Any

from airflow_provider_horovod import failures
from airflow_provider_horovod.contract import SCRIPT_BRIDGE_FD_ENV, SCRIPT_PARENT_PID_ENV
from airflow_provider_horovod.exceptions import SmokeRunDone

PR_SET_PDEATHSIG = 1


def main(argv: list[str]) -> int:
    """``argv``: modules to import while waiting for the script (``rank_process.start_in_worker``)."""
    die_with_worker()
    # Ctrl-C and SIGTERM as a rank started from a shell has them: a Ray worker ignores SIGINT and its threads
    # block signals, and a process started from one inherits both.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    bridge = Bridge(int(os.environ.pop(SCRIPT_BRIDGE_FD_ENV)))
    for module in argv:
        with contextlib.suppress(Exception):  # the script's own import says what is wrong
            importlib.import_module(module)
    request = bridge.receive()
    if request is None:  # the worker ended before handing over a script
        return 0
    # The worker's environment as the script was handed over (the rank's Horovod variables, its checkpoint
    # folder), from the script's folder, as a shell would start it.
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    sys.meta_path.insert(0, RayTrainThroughWorker(bridge))
    try:
        return run_as_main(request)
    except SmokeRunDone:  # the script's own report ended a smoke run
        write_outcome(request["outcome"], {"smoke_run_done": True})
        return 0
    except BaseException as err:  # as Python ends on an uncaught exception, and the worker learns which
        traceback.print_exc()
        failures.mark_user_error(err, request["rank"])
        found = getattr(err, "ahp_user_error", None)
        write_outcome(request["outcome"], {"error": f"{type(err).__name__}: {err}", "failure": found})
        return 1


def die_with_worker() -> None:
    """This process ends with its Ray worker (a lost node, a stopped job, a group Ray Train replaces): a rank
    left running would hold its CPU and its peers' collectives."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if str(os.getppid()) != os.environ.get(SCRIPT_PARENT_PID_ENV, str(os.getppid())):  # it ended already
        os._exit(1)


def run_as_main(request: dict[str, Any]) -> int:
    """The script as ``__main__``; its exit code (0 when it returned or called ``sys.exit(0)``)."""
    sys.argv = list(request["argv"])
    try:
        if path := request.get("path"):
            sys.path[0] = os.path.dirname(path)  # its neighbour modules import, as under `python train.py`
            runpy.run_path(path, run_name="__main__")
        else:
            sys.path[0] = os.getcwd()  # as under `python -m module` from the job's folder
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    except SystemExit as done:
        if done.code is None or done.code == 0:
            return 0
        if isinstance(done.code, int):
            return done.code
        print(done.code, file=sys.stderr)  # sys.exit("message"), as Python prints it
        return 1
    return 0


def write_outcome(path: str, outcome: dict[str, Any]) -> None:
    with open(path, "w") as f:
        json.dump(outcome, f)


class Bridge:
    """The script's end of the socket to its worker: one call at a time, a JSON line each way."""

    def __init__(self, fd: int) -> None:
        self._file = socket.socket(fileno=fd).makefile("rw", encoding="utf-8")
        self._lock = threading.Lock()

    def receive(self) -> dict[str, Any] | None:
        line = self._file.readline()
        return json.loads(line) if line else None

    def call(self, **request: Any) -> Any:
        with self._lock:
            self._file.write(json.dumps(request, default=float) + "\n")
            self._file.flush()
            reply = json.loads(self._file.readline() or '{"error": "the worker closed the bridge"}')
        if reply.get("smoke_run_done"):
            raise SmokeRunDone()
        if "error" in reply:
            raise (OSError if reply.get("os_error") else RuntimeError)(reply["error"])
        return reply.get("value")


class RayTrainThroughWorker(importlib.abc.MetaPathFinder):
    """Once the script imports ``ray.train``, its ``report``, ``get_checkpoint`` and ``get_context`` are
    answered by the worker. Checkpoints pass as local folders: this process and the worker share the node."""

    def __init__(self, bridge: Bridge) -> None:
        self.bridge = bridge

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "ray.train":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            load = spec.loader.exec_module

            def exec_module(module: Any) -> None:
                load(module)
                self.patch(module)

            spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec

    def patch(self, train: Any) -> None:
        bridge = self.bridge

        def report(metrics: dict, checkpoint: Any = None, **_: Any) -> None:
            if checkpoint is not None and not os.path.isdir(str(checkpoint.path)):
                raise ValueError(f"a script reports a checkpoint from a local folder, not {checkpoint.path}")
            bridge.call(call="report", metrics=metrics, checkpoint=checkpoint and str(checkpoint.path))

        def get_checkpoint() -> Any:
            folder = bridge.call(call="get_checkpoint")
            return train.Checkpoint.from_directory(folder) if folder else None

        class Context:
            def __getattr__(self, name: str) -> Any:
                if not name.startswith("get_"):
                    raise AttributeError(name)
                return lambda: bridge.call(call="context", name=name)

        train.report, train.get_checkpoint, train.get_context = report, get_checkpoint, Context


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
