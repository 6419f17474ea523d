"""The results files' markdown: figures (tables of A against B, targets), plain tables, the measured blocks among
people's prose. No side effect on import, unlike ``bench.common``: ``make chaos`` and ``bench.setup_time`` use it."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field


def plain_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


END = "<!-- /measured -->"


def begin(name: str) -> str:
    return f"<!-- measured: {name} (written from data; the text around it is people's) -->"


def measured(text: str, name: str) -> str | None:
    """What the block ``name`` of a results file holds, or None."""
    if begin(name) not in text:
        return None
    return text.split(begin(name), 1)[1].split(END, 1)[0].strip("\n")


def put_measured(text: str, name: str, body: str, heading: str) -> str:
    """``text`` with ``body`` in block ``name``, the prose around it kept; a new block at the end, under ``heading``."""
    if begin(name) not in text:
        return f"{text.rstrip()}\n\n{heading}\n\n{begin(name)}\n{body}\n{END}\n"
    head, rest = text.split(begin(name), 1)
    return f"{head}{begin(name)}\n{body}\n{END}{rest.split(END, 1)[1]}"


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
