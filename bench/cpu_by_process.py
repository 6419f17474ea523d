"""Where a command's CPU goes, by kind of process: ``python -m bench.cpu_by_process OUT.json -- CMD ...``
runs CMD (``make test``, say) and, every second meanwhile, reads the CPU time of every process of the
machine started since (Ray's daemons leave CMD's process tree) from /proc,
then writes the CPU-seconds of each kind (Ray's daemons, each Ray actor class, Ray jobs' drivers,
Airflow's components, task processes, pytest runs, PostgreSQL, the browser, ...) and prints them.

An estimate: a process is sampled once a second, so one that lives under a second is missed and the
last second of each is lost (``lost_upper_s`` bounds it). Not a test; for deciding what to cut.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections import Counter

TICK = os.sysconf("SC_CLK_TCK")
KINDS = (  # (kind, a pattern of the command line), first match wins
    ("ray: gcs_server", r"/gcs_server "),
    ("ray: raylet", r"/raylet "),
    ("ray: dashboard", r"ray/dashboard/dashboard\.py"),
    ("ray: dashboard agent", r"ray::DashboardAgent|dashboard/agent\.py"),
    ("ray: runtime env agent", r"ray::RuntimeEnvAgent|runtime_env/agent/main\.py"),
    (
        "ray: log monitor, monitor, client server",
        r"log_monitor\.py|autoscaler/_private/monitor\.py|ray\.util\.client\.server",
    ),
    ("ray: job driver (provider entrypoint)", r"airflow_provider_horovod\.runtime\.entrypoint"),
    ("ray: idle worker", r"^ray::IDLE"),
    ("ray: actor or task", r"^ray::"),
    ("ray: default_worker", r"default_worker\.py"),
    ("airflow: scheduler", r"airflow scheduler"),
    ("airflow: triggerer", r"airflow triggerer"),
    ("airflow: dag-processor", r"airflow dag-processor|dag-processor"),
    ("airflow: api-server", r"airflow api-server|uvicorn|gunicorn"),
    ("airflow: dags test (CLI)", r"airflow dags test"),
    ("airflow: task process", r"airflow.sdk.execution_time|task-runner|airflow tasks run|LocalExecutor"),
    ("airflow: other CLI", r"bin/airflow "),
    ("pytest", r"pytest"),
    ("postgres", r"^postgres"),
    ("browser", r"chrom|playwright"),
    ("moto s3", r"moto"),
    ("mlflow", r"mlflow"),
    ("horovodrun, mpirun, gloo", r"horovodrun|mpirun"),
    # By the program's own name: a Python script's text may hold "ld " ("threshold = ") or "gcc".
    ("compilers", r"^(\S*/)?([\w.-]+-)?(cc1|cc1plus|collect2|ld(\.\w+)?|as|g\+\+|gcc|cc|nvcc)( |$)"),
)
ACTOR = re.compile(r"^ray::([A-Za-z_][\w.]*)")


def kind_of(cmdline: str) -> str:
    for kind, pattern in KINDS:
        if re.search(pattern, cmdline):
            if kind == "ray: actor or task" and (name := ACTOR.match(cmdline)):
                return f"ray: {name.group(1)}"
            return kind
    first = cmdline.split(" ", 1)[0]
    return f"other: {os.path.basename(first)[:30]}" if first else "other: (kernel or unnamed)"


def snapshot() -> dict[int, tuple[float, str]]:
    """Each process: its CPU seconds so far (user + system) and its command line."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        found[int(name)] = ((int(fields[11]) + int(fields[12])) / TICK, cmdline)
    return found


def measure(cmd: list[str]) -> dict:
    before = set(snapshot())  # what ran before CMD is not CMD's; what starts meanwhile is (Ray daemonizes)
    seen: set[int] = set()
    cpu_of: dict[int, float] = {}
    kinds: dict[int, str] = {}
    started = time.monotonic()
    proc = subprocess.Popen(cmd)
    lost = 0.0
    while True:
        done = proc.poll() is not None
        now = {pid: value for pid, value in snapshot().items() if pid not in before}
        for pid, (cpu, cmdline) in now.items():
            # A process counts as what it became: Ray's workers are forked by the raylet, then idle, then
            # named after the actor they hold.
            kind = kind_of(cmdline)
            # An ended process waiting to be reaped has no command line: it keeps the kind it had.
            if pid not in kinds or (cmdline and kind != "ray: idle worker"):
                kinds[pid] = kind
            cpu_of[pid] = cpu
        lost += sum(1 for pid in seen if pid not in now) * 1.0
        seen = set(now)
        if done:
            break
        time.sleep(1.0)
    wall = time.monotonic() - started
    by_kind: Counter[str] = Counter()
    for pid, cpu in cpu_of.items():
        by_kind[kinds[pid]] += cpu
    return {
        "command": cmd,
        "exit_code": proc.returncode,
        "wall_s": round(wall, 1),
        "cpu_s": round(sum(by_kind.values()), 1),
        "lost_upper_s": round(lost, 1),
        "by_kind": {kind: round(cpu, 1) for kind, cpu in by_kind.most_common() if cpu >= 0.05},
    }


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print(__doc__, file=sys.stderr)
        return 2
    result = measure(argv[2:])
    with open(argv[0], "w") as f:
        json.dump(result, f, indent=1)
    print(f"\n{result['wall_s']} s wall, {result['cpu_s']} CPU-s (at most {result['lost_upper_s']} CPU-s missed)")
    for kind, cpu in result["by_kind"].items():
        print(f"{cpu:9.1f} CPU-s {100 * cpu / max(result['cpu_s'], 1e-9):5.1f} %  {kind}")
    return result["exit_code"]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
