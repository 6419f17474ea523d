"""This machine's processes as /proc tells them: command lines, CPU seconds, the kind of each (Ray's
daemons, each Ray actor class, Airflow's components, ...), and a sampler that sums CPU by kind while
a block runs. Shared by the benchmarks, the chaos run and the tests' timings.

    with CpuSampler() as cpu:
        run_something()
    cpu.by_kind()      # {kind: CPU-s}, "raylet", "RayTrainWorker", ...; cpu.machine_s: the whole machine's
"""

from __future__ import annotations

import os
import re
import threading

TICK = os.sysconf("SC_CLK_TCK")
IDLE = "Ray worker, idle"
# A Ray worker is named by the actor or task it holds (``ray::RayTrainWorker.__init__``: "RayTrainWorker").
RAY_WORKERS = {"IDLE": IDLE, "DashboardAgent": "dashboard agent", "RuntimeEnvAgent": "runtime env agent"}
ACTOR = re.compile(r"^ray::([A-Za-z_]\w*)")
# Any other process: (kind, a pattern of its command line); the first match wins.
KINDS = (
    ("other work on the machine (pytest)", r"pytest|::test_"),
    ("Ray worker, starting", r"default_worker\.py"),
    ("dashboard module", r"^ray-dashboard-|ray\.dashboard\.subprocesses|dashboard/modules"),
    ("airflow dags test", r"dags test"),
    ("Airflow task runner (deployment)", r"task runner|airflow\.sdk\.execution_time|airflow tasks run"),
    ("Airflow task supervisor (deployment)", r"supervisor|^airflow worker -- "),
    ("LocalExecutor worker (deployment)", r"LocalExecutor"),
    ("Airflow scheduler (deployment)", r"airflow scheduler"),
    ("Airflow triggerer (deployment)", r"airflow triggerer"),
    ("Airflow api-server (deployment)", r"airflow api-server|uvicorn|gunicorn"),
    ("Airflow dag-processor (deployment)", r"dag-processor"),
    ("airflow, other command", r"bin/airflow "),
    ("PostgreSQL (deployment)", r"^postgres"),
    ("job driver (runtime entrypoint)", r"runtime\.entrypoint"),
    ("horovodrun rank", r"-m bench\.workload "),
    ("horovodrun launcher", r"horovodrun|mpirun"),
    ("raylet", r"/raylet "),
    ("gcs_server", r"/gcs_server "),
    ("dashboard agent", r"dashboard/agent\.py"),
    ("runtime env agent", r"runtime_env/agent"),
    ("dashboard", r"dashboard/dashboard\.py"),
    ("log monitor", r"log_monitor"),
    ("autoscaler monitor", r"autoscaler/_private/monitor\.py"),
    ("moto (S3)", r"moto"),
    ("mlflow", r"mlflow"),
    ("browser", r"chrom|playwright"),
    ("bench (this process)", r"bench\.run"),
)


def cmdline(pid: int) -> str:
    """The process's command line, its arguments joined by spaces ("" once it has ended)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def cpu_s(pid: int) -> float:
    """CPU seconds the process has used so far, user and system (0 once it has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def pids_named(prefix: str) -> list[int]:
    """The processes whose command line starts with ``prefix``."""
    return sorted(pid for pid in pids() if cmdline(pid).startswith(prefix))


def machine_busy_s() -> float:
    """Seconds of CPU the machine spent busy since boot, all cores together."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            fields = [int(v) for v in stat.readline().split()[1:]]
    except OSError:
        return 0.0
    # user nice system idle iowait irq softirq steal: everything but idle and iowait.
    return (sum(fields[:8]) - fields[3] - fields[4]) / TICK


def kind_of(command: str) -> str:
    """What a process is, from its command line."""
    if actor := ACTOR.match(command):
        return RAY_WORKERS.get(actor.group(1), actor.group(1))
    for kind, pattern in KINDS:
        if re.search(pattern, command):
            return kind
    name = os.path.basename(command.split(" ", 1)[0])
    return name if 0 < len(name) <= 40 else "unnamed process"


class CpuSampler:
    """CPU seconds each kind of process spent while the block ran, sampled from /proc every ``every``
    seconds: a process that ends loses at most its last interval (``lost_upper_s`` bounds it), one that
    lives less than an interval is missed. ``only_new``: only processes started after the block began
    (not other sessions' work). ``machine_s``: the whole machine's busy time over the block."""

    def __init__(self, every: float = 0.2, only_new: bool = False) -> None:
        self.every, self.only_new = every, only_new
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self.kinds: dict[int, str] = {}
        self.before: set[int] = set()
        self.lost_upper_s = self.machine_s = 0.0
        self.stop = threading.Event()

    def sample(self) -> None:
        seen = set()
        for pid in pids():
            if pid in self.before:
                continue
            command, used = cmdline(pid), cpu_s(pid)
            # A process counts as what it became (Ray's workers start idle, then hold an actor); one that
            # ended and waits to be reaped has no command line and keeps the kind it had.
            if command and (pid not in self.kinds or kind_of(command) != IDLE):
                self.kinds[pid] = kind_of(command)
            self.kinds.setdefault(pid, "unnamed process")
            self.last[pid] = max(used, self.last.get(pid, 0.0))
            seen.add(pid)
        self.lost_upper_s += self.every * sum(1 for pid in self.alive if pid not in seen)
        self.alive = seen

    def __enter__(self) -> CpuSampler:
        if self.only_new:
            self.before = set(pids())
        else:
            self.first = {pid: cpu_s(pid) for pid in pids()}
        self.alive: set[int] = set()
        self.machine_start = machine_busy_s()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()
        return self

    def _loop(self) -> None:
        while not self.stop.wait(self.every):
            self.sample()

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()
        self.sample()
        self.machine_s = machine_busy_s() - self.machine_start

    def by_kind(self) -> dict[str, float]:
        """CPU seconds by kind of process, the largest first."""
        totals: dict[str, float] = {}
        for pid, used in self.last.items():
            if (spent := used - self.first.get(pid, 0.0)) > 0.005:
                totals[self.kinds[pid]] = totals.get(self.kinds[pid], 0.0) + spent
        return dict(sorted(totals.items(), key=lambda kv: -kv[1]))
