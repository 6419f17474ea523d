"""Which callbacks of an asyncio event loop held its thread longer than a threshold, told apart from a
machine too loaded to run them: for each callback, the thread's time on a CPU and its time waiting
for one come from the kernel (``/proc/thread-self/schedstat``), so what is left of the wall time is
time the thread slept inside the callback (a blocking call). A callback blocks the loop when it
computes for longer than the threshold, or sleeps for longer; waiting for a CPU on a loaded machine
is neither, whatever the wall time says (the triggerer's own check, ``block_watchdog``, counts it).
Python's garbage collector, which may run inside any callback of a process with a large heap (Airflow's),
is timed apart (``gc_s``): its pauses are the interpreter's, not the callback's code. So is the time the
process's other threads waited for a CPU (``others_runnable_s``): a thread descheduled while it holds the
GIL (a trigger's import in a worker thread) keeps the loop's thread asleep on the GIL, the machine's load.

    with watched(0.1) as watch:
        asyncio.run(main())
    assert not watch.slow, watch.longest
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import os
import threading
import time
from collections.abc import Iterator


@dataclasses.dataclass(frozen=True)
class Slow:
    what: str  # the task (its name and coroutine) or the callback
    wall_s: float
    cpu_s: float
    runnable_s: float  # waiting for a CPU: the machine's load, not the callback's doing
    asleep_s: float  # blocked in a system call (less the other threads' waits for a CPU)
    gc_s: float = 0.0  # of the time on a CPU, Python's garbage collector's
    others_runnable_s: float = 0.0  # the process's other threads waiting for a CPU meanwhile

    @property
    def held_s(self) -> float:
        """How long the callback itself held the loop: computing (less the collector) or asleep."""
        return max(self.cpu_s - self.gc_s, self.asleep_s)


@dataclasses.dataclass
class Watch:
    slow: list[Slow] = dataclasses.field(default_factory=list)  # held the loop longer than the threshold
    longest: Slow | None = None  # the callback that held it longest, whatever the threshold


def _schedstat() -> tuple[int, int]:
    with open("/proc/thread-self/schedstat") as f:
        on_cpu, waiting, _ = f.read().split()
    return int(on_cpu), int(waiting)


def _others_waiting(own: int) -> dict[str, int]:
    """Each other thread of the process: nanoseconds it has waited for a CPU."""
    waiting = {}
    for tid in os.listdir("/proc/self/task"):
        if tid != own:
            try:
                with open(f"/proc/self/task/{tid}/schedstat") as f:
                    waiting[tid] = int(f.read().split()[1])
            except OSError:  # ended meanwhile
                continue
    return waiting


def _what(handle: asyncio.Handle) -> str:
    """The callback; for a task's step, its coroutine and where the step left it (the innermost await)."""
    callback = getattr(handle, "_callback", None)
    task = getattr(callback, "__self__", None)
    if not isinstance(task, asyncio.Task):
        return repr(handle)
    coro = task.get_coro()
    what = f"task {task.get_name()} ({getattr(coro, '__qualname__', coro)})"
    where, inner = "", coro
    while (frame := getattr(inner, "cr_frame", None) or getattr(inner, "ag_frame", None)) is not None:
        where = f"{frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_lineno} {frame.f_code.co_name}"
        inner = getattr(inner, "cr_await", None) or getattr(inner, "ag_await", None)
    return f"{what}, left at {where}" if where else what


@contextlib.contextmanager
def watched(threshold_s: float = 0.1) -> Iterator[Watch]:
    """Callbacks run by loops in this thread while the block runs that computed or slept longer than
    ``threshold_s``, and the longest of all."""
    watch = Watch()
    thread, own = threading.get_ident(), str(threading.get_native_id())
    original = asyncio.events.Handle._run
    collecting = {"since": 0.0, "total": 0.0}

    def collected(phase: str, info: dict) -> None:
        if threading.get_ident() != thread:
            return
        if phase == "start":
            collecting["since"] = time.thread_time()
        else:
            collecting["total"] += time.thread_time() - collecting["since"]

    def run(handle: asyncio.Handle) -> None:
        if threading.get_ident() != thread:
            return original(handle)
        others0 = _others_waiting(own)
        cpu0, wait0 = _schedstat()
        gc0 = collecting["total"]
        started = time.monotonic()
        try:
            return original(handle)
        finally:
            wall = time.monotonic() - started
            cpu1, wait1 = _schedstat()
            others = sum(max(0, n - others0.get(tid, 0)) for tid, n in _others_waiting(own).items()) / 1e9
            cpu, runnable = (cpu1 - cpu0) / 1e9, (wait1 - wait0) / 1e9
            asleep = max(0.0, wall - cpu - runnable - others)
            held = max(cpu - (collecting["total"] - gc0), asleep)
            if held > threshold_s or watch.longest is None or held > watch.longest.held_s:
                seen = Slow(_what(handle), wall, cpu, runnable, asleep, collecting["total"] - gc0, others)
                if held > threshold_s:
                    watch.slow.append(seen)
                if watch.longest is None or held > watch.longest.held_s:
                    watch.longest = seen

    asyncio.events.Handle._run = run  # type: ignore[method-assign]
    gc.callbacks.append(collected)
    try:
        yield watch
    finally:
        gc.callbacks.remove(collected)
        asyncio.events.Handle._run = original  # type: ignore[method-assign]


def schedstat_available() -> bool:
    try:
        _schedstat()
        return True
    except OSError:
        return False
