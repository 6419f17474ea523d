"""Wall time against CPU time per test, so waiting (which can overlap) is told apart from work (which
cannot on a small machine). CPU is the whole machine's busy time over the test (every process: the
Ray head, Airflow's components, the test itself), from ``/proc/stat`` (``harness/processes.py``).

Registered by ``tests/conftest.py`` when ``AHP_TIMINGS_DIR`` is set: each pytest run writes
``$AHP_TIMINGS_DIR/<run name>.json`` (the name from ``AHP_TIMINGS_NAME``), and
``python tests/support/timing.py DIR`` prints the total and the slowest tests of all runs together.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest


def machine_busy_s() -> float:
    """Seconds of CPU the machine spent busy since boot (``harness/processes.py``; imported on call, since
    ``python tests/support/timing.py`` runs without the checkout's root on its path)."""
    from harness.processes import machine_busy_s as busy

    return busy()


class Timings:
    def __init__(self) -> None:
        self.rows: dict[str, dict[str, float]] = {}
        self.started = time.monotonic()
        self.busy_started = machine_busy_s()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        wall, busy = time.monotonic(), machine_busy_s()
        yield
        self.rows[item.nodeid] = {
            "wall_s": round(time.monotonic() - wall, 2),
            "cpu_s": round(machine_busy_s() - busy, 2),
        }

    def pytest_sessionfinish(self, session, exitstatus):
        folder = os.environ.get("AHP_TIMINGS_DIR")
        if not folder or not self.rows:
            return
        worker = os.environ.get("PYTEST_XDIST_WORKER", "")
        name = os.environ.get("AHP_TIMINGS_NAME", "tests") + (f"-{worker}" if worker else "")
        Path(folder).mkdir(parents=True, exist_ok=True)
        summary = {
            "wall_s": round(time.monotonic() - self.started, 1),
            "cpu_s": round(machine_busy_s() - self.busy_started, 1),
            "tests": self.rows,
        }
        Path(folder, f"{name}.json").write_text(json.dumps(summary, indent=1, sort_keys=True))


def job_wall_s(job: dict) -> float:
    """A Ray job's time from its start to its end (to now while it runs; 0 if it never started)."""
    if not job.get("start_time"):
        return 0.0
    return round(((job.get("end_time") or time.time() * 1000) - job["start_time"]) / 1000, 1)


def save_jobs(jobs: list[dict]) -> None:
    """The Ray jobs a run's head ran (``$AHP_TIMINGS_DIR/jobs/<run name>.json``): how many, and for how
    long, so work nobody checks (a job left running, a run started behind the tests) shows."""
    folder = os.environ.get("AHP_TIMINGS_DIR")
    if not folder:
        return
    rows = [
        {
            "submission_id": job.get("submission_id") or job.get("job_id"),
            "task": "/".join(
                str((job.get("metadata") or {}).get(k, "")) for k in ("airflow_dag_id", "airflow_task_id")
            ),
            "status": job.get("status"),
            "wall_s": job_wall_s(job),
        }
        for job in jobs
    ]
    name = os.environ.get("AHP_TIMINGS_NAME", "tests")
    Path(folder, "jobs").mkdir(parents=True, exist_ok=True)
    Path(folder, "jobs", f"{name}.json").write_text(json.dumps(rows, indent=1))


def report(folder: str, slowest: int = 20) -> str:
    runs = {p.stem: json.loads(p.read_text()) for p in sorted(Path(folder).glob("*.json"))}
    rows = [(nodeid, run, t) for run, data in runs.items() for nodeid, t in data["tests"].items()]
    jobs = {p.stem: json.loads(p.read_text()) for p in sorted(Path(folder).glob("jobs/*.json"))}
    lines = [f"{'run':<28} {'tests':>6} {'wall':>9} {'cpu':>9} {'ray jobs':>9}"]
    for run, data in runs.items():
        counted = str(len(jobs[run])) if run in jobs else "-"
        lines.append(f"{run:<28} {len(data['tests']):>6} {data['wall_s']:>8.1f}s {data['cpu_s']:>8.1f}s {counted:>9}")
    lines.append(f"\n{slowest} slowest tests (wall; cpu = the whole machine's busy seconds meanwhile):")
    for nodeid, run, t in sorted(rows, key=lambda r: -r[2]["wall_s"])[:slowest]:
        lines.append(f"{t['wall_s']:>8.1f}s {t['cpu_s']:>8.1f}s  [{run}] {nodeid}")
    longest = sorted(((job, run) for run, rows_ in jobs.items() for job in rows_), key=lambda r: -r[0]["wall_s"])
    if longest:
        lines.append("\nThe longest Ray jobs of the runs' own heads:")
        for job, run in longest[:5]:
            lines.append(f"{job['wall_s']:>8.1f}s  [{run}] {job['submission_id']} {job['task']} {job['status']}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(report(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 20))
