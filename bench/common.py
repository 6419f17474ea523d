"""What every benchmark shares. Import it before anything imports Airflow: it points ``AIRFLOW_HOME`` at the
benchmarks' own home, so their Ray cluster and database never meet the test suite's or the demo's."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from bench.markdown import plain_table
from harness import airflow_cli

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"
OUT = BENCH / "out"
AIRFLOW_HOME = OUT / "airflow-home"
BENCH_DAGS = BENCH / "dags"
PY = sys.executable

os.environ["AIRFLOW_HOME"] = str(AIRFLOW_HOME)
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ["AIRFLOW__CORE__UNIT_TEST_MODE"] = "False"
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(BENCH_DAGS)
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
# The bench module must be importable by `airflow dags test` and by scripts run from anywhere.
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
# Where Ray Train's actors find their own cluster, not another on the machine (the test suite's).
RAY_ADDRESS_ENV = "BENCH_RAY_ADDRESS"


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name) or default)


def repeats() -> int:
    return env_int("BENCH_REPEATS", 3)


def quantile(values: list[float], q: float) -> float:
    """Linear-interpolated quantile (q in [0, 1]), as numpy's default."""
    data = sorted(values)
    if not data:
        return float("nan")
    pos = (len(data) - 1) * q
    low = int(pos)
    high = min(low + 1, len(data) - 1)
    return data[low] + (data[high] - data[low]) * (pos - low)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


@dataclass
class Sample:
    values: list[float] = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def median(self) -> float:
        return median(self.values)

    def spread(self) -> str:
        """IQR for 4 or more values (what noise looks like), min-max below that."""
        if not self.values:
            return "-"
        if len(self.values) >= 4:
            return f"IQR {fmt(quantile(self.values, 0.25))}-{fmt(quantile(self.values, 0.75))}"
        return f"{fmt(min(self.values))}-{fmt(max(self.values))}"


def sample(runs: list[dict], value) -> Sample:
    """``value`` of each run: a key, or a function of the run; a None is left out."""
    values = (value(r) if callable(value) else r.get(value) for r in runs)
    return Sample([v for v in values if v is not None])


def fmt(value: float | None) -> str:
    if value is None or value != value:  # NaN
        return "-"
    if value == 0:
        return "0"
    if abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.3g}"


def ratio(ours: float, other: float) -> float:
    return ours / other if other else float("nan")


@dataclass
class Row:
    """One comparison: ``a`` (ours, where one side is ours) against ``b``, each a Sample in ``unit``."""

    what: str
    a_label: str
    a: Sample
    b_label: str
    b: Sample
    unit: str
    note: str = ""

    @property
    def ratio(self) -> float:
        return ratio(self.a.median, self.b.median)


def table(rows: list[Row]) -> str:
    header = ["measure", "ours (A)", "A median", "A spread", "alternative (B)", "B median", "B spread", "A / B"]
    body = [
        [f"{r.what} ({r.unit})", r.a_label, fmt(r.a.median), r.a.spread(), r.b_label, fmt(r.b.median), r.b.spread()]
        + [fmt(r.ratio), f"{r.a.n}, {r.b.n}", r.note]
        for r in rows
    ]
    return plain_table([*header, "repeats A, B", "note"], body)


@dataclass
class Target:
    """A target of the issue: met or missed, by how much, and what would close a miss."""

    name: str
    met: bool | None  # None: could not be measured
    detail: str
    closing: str = ""


def target(name: str, value: float, goal: float, detail: str, closing: str = "", *, at_most=True, unit="") -> Target:
    """Met when ``value`` is at most ``goal`` (``at_most=False``: at least); ``closing`` on a miss only."""
    if value != value:  # NaN: nothing to compare
        return Target(name, None, f"{detail}; not measured")
    met = value <= goal if at_most else value >= goal
    detail = f"{detail}; {'met' if met else 'missed'} by {fmt(abs(goal - value))}{unit}"
    return Target(name, met, detail, "" if met else closing)


def figure_key(number) -> tuple[int, str]:
    """Figures in order: 1, 2, ..., 4, 4b, 5, ..."""
    text = str(number)
    digits = "".join(c for c in text if c.isdigit())
    return int(digits or 0), text


TITLES = {
    "1": "Orchestration overhead",
    "2": "Completion latency",
    "3": "DAG parse cost",
    "4": "Triggerer load",
    "4b": "Following a growing log",
    "5": "Checkpoint I/O",
    "6": "Training path",
    "7": "Install size of the Airflow side",
    "8": "Answer time of the Training views",
    "9": "Across hosts",
    "10": "Fixed cost of a training task",
    "11": "Smoke run of a production DAG",
}


@dataclass
class Figure:
    """A figure's measured block: its tables, notes from its data, its targets; the prose around it is people's."""

    number: int | str
    title: str = ""  # "": its title in TITLES
    tables: list[str] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    measured_at: float = 0.0

    def __post_init__(self) -> None:
        self.title = self.title or TITLES[str(self.number)]

    def markdown(self) -> str:
        parts = [t + "\n" for t in self.tables]
        if self.notes:
            parts.append("\n".join(f"- {n}" for n in self.notes) + "\n")
        when = f", measured {time.strftime('%Y-%m-%d %H:%M', time.gmtime(self.measured_at))} UTC"
        parts.append(f"_Took {self.seconds:.0f} s{when if self.measured_at else ''}._")
        return "\n".join(parts)


def save_raw(name: str, data) -> None:
    """Every figure keeps its raw measurements in bench/out, so the tables can be checked."""
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{name}.json").write_text(json.dumps(data, indent=1, default=str))


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", flush=True)


def logged(call, log_name: str, check: bool) -> tuple[subprocess.CompletedProcess, float]:
    """Run ``call`` (a command's run), timed, its output in bench/out/logs/<log_name>; (result, wall seconds)."""
    started = time.monotonic()
    run = call()
    wall = time.monotonic() - started
    path = OUT / "logs" / log_name
    path.parent.mkdir(parents=True, exist_ok=True)
    command = " ".join(map(str, run.args))
    path.write_text(
        f"$ {command}\nrc={run.returncode} wall={wall:.2f}s\n--- stdout\n{run.stdout}\n--- stderr\n{run.stderr}"
    )
    if check and run.returncode != 0:
        output = (run.stdout + run.stderr)[-3000:]
        raise RuntimeError(f"{run.args[:4]} failed (rc {run.returncode}); see {path}:\n{output}")
    return run, wall


def run_logged(
    cmd: list[str], log_name: str, *, env: dict | None = None, timeout: float = 600, cwd=REPO
) -> tuple[subprocess.CompletedProcess, float]:
    """A command, ``logged``; ``env`` is added to this process's (a None value leaves that variable out)."""
    env = {k: v for k, v in {**os.environ, **(env or {})}.items() if v is not None}
    return logged(
        lambda: subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd), log_name, True
    )


def dags_test(
    dag_id: str, log_name: str, *, logical_date: str | None = None, env=None, timeout: float = 600, check=True
) -> tuple[subprocess.CompletedProcess, float]:
    """`airflow dags test` (the harness's runner), its output logged; (result, wall seconds)."""
    return logged(
        lambda: airflow_cli.dags_test(dag_id, logical_date=logical_date, env=env, timeout=timeout), log_name, check
    )


def epoch(stamp: str | None) -> float | None:
    """Seconds since the epoch of an Airflow time: the REST API's, or the metadata database's naive UTC one."""
    if not stamp:
        return None
    when = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    return (when if when.tzinfo else when.replace(tzinfo=timezone.utc)).timestamp()


def lines_in(path: Path) -> int:
    return path.read_text().count("\n") if path.exists() else 0


def operator_times(path: Path, since: int, dag_id: str, run_id: str | None = None) -> tuple[str, float, float]:
    """What the timed operator (``bench/dags/bench_dags.py``) noted in ``path`` after its line ``since``, for
    a run of ``dag_id`` (``run_id``, or the first): the run id, ``execute``'s start, the result's time."""
    notes = [json.loads(line) for line in path.read_text().splitlines()[since:]]
    notes = [n for n in notes if n["dag_id"] == dag_id and run_id in (None, n["run_id"])]
    run_id = notes[0]["run_id"]
    starts, ends = ([n["t"] for n in notes if n["run_id"] == run_id and n["event"] == e] for e in ("start", "done"))
    return run_id, min(starts), max(ends)


def commit() -> str:
    """The checkout's commit, ``+changes`` when the provider's code differs from it."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO)
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "airflow_provider_horovod"], capture_output=True, text=True, cwd=REPO
    )
    return head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")
