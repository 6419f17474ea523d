"""What every benchmark shares: where things live, how many repeats, the statistics and the tables.

Import this before anything imports Airflow: it points ``AIRFLOW_HOME`` at the benchmarks' own
home, so their Ray cluster and database never meet the test suite's or the demo's.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"
OUT = BENCH / "out"
AIRFLOW_HOME = OUT / "airflow-home"
BENCH_DAGS = BENCH / "dags"
PY = sys.executable
AIRFLOW_BIN = str(Path(sys.executable).with_name("airflow"))

os.environ["AIRFLOW_HOME"] = str(AIRFLOW_HOME)
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ["AIRFLOW__CORE__UNIT_TEST_MODE"] = "False"
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(BENCH_DAGS)
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
# The bench module must be importable by `airflow dags test` and by scripts run from anywhere.
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
# Ray lets actors find the dashboard from this; with a second Ray cluster on the machine (the test
# suite's) they could otherwise find the wrong one.
RAY_ADDRESS_ENV = "BENCH_RAY_ADDRESS"


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name) or default)


def repeats(default: int = 3) -> int:
    """``BENCH_REPEATS`` scales every figure's repeats (the defaults fit ~30 minutes on 2 cores)."""
    return env_int("BENCH_REPEATS", default)


# --- statistics ---------------------------------------------------------------------------------


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
    """Repeated measurements of one quantity."""

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


def fmt(value: float | None, digits: int = 3) -> str:
    if value is None or value != value:  # NaN
        return "-"
    if value == 0:
        return "0"
    if abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.{digits}g}"


def ratio(ours: float, other: float) -> float:
    return ours / other if other else float("nan")


# --- tables -------------------------------------------------------------------------------------


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
    header = [
        "measure",
        "ours (A)",
        "A median",
        "A spread",
        "alternative (B)",
        "B median",
        "B spread",
        "A / B",
        "repeats A, B",
        "note",
    ]
    body = [
        [
            f"{r.what} ({r.unit})",
            r.a_label,
            fmt(r.a.median),
            r.a.spread(),
            r.b_label,
            fmt(r.b.median),
            r.b.spread(),
            fmt(r.ratio),
            f"{r.a.n}, {r.b.n}",
            r.note,
        ]
        for r in rows
    ]
    return plain_table(header, body)


@dataclass
class Target:
    """A target of the issue: met or missed, by how much, and what would close a miss."""

    name: str
    met: bool | None  # None: could not be measured
    detail: str
    closing: str = ""


def figure_key(number) -> tuple[int, str]:
    """Figures in order: 1, 2, ..., 4, 4b, 5, ..."""
    text = str(number)
    digits = "".join(c for c in text if c.isdigit())
    return int(digits or 0), text


@dataclass
class Figure:
    number: int | str
    title: str
    how: str
    tables: list[str] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def markdown(self) -> str:
        parts = [f"## {self.number}. {self.title}", "", self.how.strip(), ""]
        for t in self.tables:
            parts += [t, ""]
        for n in self.notes:
            parts += [f"- {n}"]
        if self.notes:
            parts.append("")
        parts.append(f"_Took {self.seconds:.0f} s._")
        return "\n".join(parts)


def plain_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


# --- raw data and processes ---------------------------------------------------------------------


def save_raw(name: str, data) -> Path:
    """Every figure keeps its raw measurements in bench/out, so the tables can be checked."""
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{name}.json"
    path.write_text(json.dumps(data, indent=1, default=str))
    return path


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", flush=True)


def run_logged(
    cmd: list[str], log_name: str, *, env: dict | None = None, timeout: float = 600, check: bool = True
) -> tuple[subprocess.CompletedProcess, float]:
    """Run a command with its output in bench/out/logs/<log_name>; (result, wall seconds)."""
    logs = OUT / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    run = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}, cwd=REPO
    )
    wall = time.monotonic() - started
    (logs / log_name).write_text(
        f"$ {' '.join(cmd)}\nrc={run.returncode} wall={wall:.2f}s\n--- stdout\n{run.stdout}\n--- stderr\n{run.stderr}"
    )
    if check and run.returncode != 0:
        raise RuntimeError(
            f"{cmd[:4]} failed (rc {run.returncode}); see {logs / log_name}:\n{(run.stdout + run.stderr)[-3000:]}"
        )
    return run, wall


def tagged_json(output: str, tag: str) -> list[dict]:
    """Objects printed as ``<tag> {json}`` lines (``<tag>:<token> {json}``: the runtime's marked lines)."""
    pattern = re.compile(re.escape(tag) + r"(?::[0-9a-f]+)? (.*)")
    return [json.loads(found[1]) for line in output.splitlines() if (found := pattern.search(line))]
