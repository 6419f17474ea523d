"""`make bench`: runs the figures (``BENCH_ONLY``: some) and writes each one's block of bench/results.md, or
writes the blocks again from bench/out/figures/ (``BENCH_ASSEMBLE=1``); a figure that fails says so, the others run."""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from importlib.metadata import version

from bench.common import OUT, RAY_ADDRESS_ENV, env_names, log, moto_server, ray_cluster, repeats, run_logged
from bench.markdown import TITLES, Figure, Target, figure_key, measured, plain_table, put_measured
from bench.setup_time import RESULTS, load  # the same results.md and load average
from harness.stack import airflow_bin

FIGURES = OUT / "figures"


def failed(number: str, err: BaseException, seconds: float) -> Figure:
    note = f"**This figure failed:** `{type(err).__name__}: {err}`"[:2000]
    missed = Target(f"{number}. {TITLES[number]}", None, "not measured: the figure failed")
    return Figure(number, targets=[missed], notes=[note], seconds=seconds)


def timed(number: str, make) -> Figure:
    started = time.monotonic()
    log(f"figure {number}: {TITLES[number]}")
    try:
        fig = make()
    except Exception as err:  # one figure's failure must not lose the others
        traceback.print_exc()
        fig = failed(number, err, time.monotonic() - started)
    fig.seconds = max(fig.seconds, time.monotonic() - started)  # a figure may count its earlier runs
    fig.measured_at = time.time()
    log(f"figure {number} done in {fig.seconds:.0f} s")
    FIGURES.mkdir(parents=True, exist_ok=True)  # so results.md can be written again without measuring
    (FIGURES / f"{fig.number}.json").write_text(json.dumps(dataclasses.asdict(fig), indent=1))
    return fig


def assemble(want: set[str]) -> list[Figure]:
    """``BENCH_ASSEMBLE=1``: the figures as last measured (bench/out/figures), none measured now."""
    figures = []
    for number in sorted(want, key=figure_key):
        path = FIGURES / f"{number}.json"
        if not path.exists():
            log(f"figure {number} was never measured: left as it is")
            continue
        data = json.loads(path.read_text())
        data.pop("how", None)  # written by earlier code: how a figure is measured is people's text now
        data["targets"] = [Target(**t) for t in data["targets"]]
        figures.append(Figure(**data))
    return figures


def other_activity() -> str:
    """What else ran on the machine: processes of other Ray clusters and pytest sessions."""
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout.splitlines()
    pytest = sum(1 for line in out if "pytest" in line)
    clusters = sum(1 for line in out if "gcs_server" in line)
    return f"{pytest} pytest process(es), {clusters} Ray cluster(s) running (ours included, when up)"


def conditions(want: set[str], started_wall: float, seconds: float, load_start: str, activity_start: str) -> str:
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30)
    others = sorted(
        (k, v) for k, v in os.environ.items() if k.startswith("BENCH_") and k not in ("BENCH_REPEATS", RAY_ADDRESS_ENV)
    )
    packages = ("apache-airflow", "ray", "torch", "horovod", "moto", "boto3", "pyarrow")
    stack = f"Python {platform.python_version()}, " + ", ".join(f"{p} {version(p)}" for p in packages)
    rows = [
        ["date (UTC)", time.strftime("%Y-%m-%d %H:%M", time.gmtime(started_wall))],
        ["figures measured", ", ".join(sorted(want, key=figure_key))],
        ["the run took", f"{seconds / 60:.1f} min"],
        ["machine", f"{os.cpu_count()} CPU cores, {mem:.0f} GiB memory, no GPU, {platform.platform()}"],
        ["load average (1, 5, 15 min) at start / at end", f"{load_start} / {load()}"],
        ["other work at start / end", f"{activity_start} / {other_activity()}"],
        ["stack", stack],
        ["settings", ", ".join([f"BENCH_REPEATS={repeats()}"] + [f"{k}={v}" for k, v in others])],
    ]
    return plain_table(["", ""], rows)


def figure_of(row: str) -> str:
    """The figure a row of the targets table is of (its name starts with the figure's number)."""
    return row.split(" | ", 1)[0].lstrip("| ").split(". ", 1)[0]


def targets_table(figures: list[Figure], before: str | None) -> str:
    """The targets of the figures measured now; the rows of the others as they were."""
    rows = []
    for fig in figures:
        for t in fig.targets:
            state = {True: "**met**", False: "**missed**", None: "not measured"}[t.met]
            rows.append([t.name, state, t.detail, t.closing or "-"])
    table = plain_table(["target", "", "by how much", "what would close a miss"], rows).splitlines()
    new = {str(f.number) for f in figures}
    kept = [row for row in (before or "").splitlines()[2:] if figure_of(row) not in new]
    return "\n".join(table[:2] + sorted(table[2:] + kept, key=lambda row: figure_key(figure_of(row))))


def write(figures: list[Figure], header: str | None) -> None:
    """The measured blocks of results.md: the conditions (``header``, when measured now), the targets, each figure's."""
    text = RESULTS.read_text() if RESULTS.exists() else "# Benchmarks: results\n"
    if header is not None:
        text = put_measured(text, "conditions", header, "## Conditions")
    text = put_measured(text, "targets", targets_table(figures, measured(text, "targets")), "## Targets")
    for fig in sorted(figures, key=lambda f: figure_key(f.number)):
        text = put_measured(text, f"figure {fig.number}", fig.markdown(), f"## {fig.number}. {fig.title}")
    RESULTS.write_text(text)
    log(f"wrote {RESULTS}")


def main() -> int:
    started, started_wall = time.monotonic(), time.time()
    load_start, activity_start = load(), other_activity()
    OUT.mkdir(parents=True, exist_ok=True)
    want = set(env_names("BENCH_ONLY", ",".join(TITLES), TITLES))
    if os.environ.get("BENCH_ASSEMBLE"):
        figures = assemble(want)
        write(figures, None)
        return 0 if all(t.met is not None for f in figures for t in f.targets) else 1
    run_logged([airflow_bin(), "db", "migrate"], "airflow-db-migrate.log")
    figures: list[Figure] = []
    # Without a cluster first (3 while the machine is as quiet as it gets); 11 starts the embedded cluster itself,
    # 9 and 10 make hosts of their own with their own Ray cluster and S3.
    for number, name in (("3", "parse"), ("8", "ui"), ("11", "smoke"), ("9", "multihost"), ("10", "fixedcost")):
        if number in want:
            figures.append(timed(number, importlib.import_module(f"bench.{name}").figure))
    if want & {"1", "2", "4", "4b", "5", "6"}:
        with moto_server(), ray_cluster() as cluster:
            if want & {"1", "2", "6"}:
                figures += training_figures(want, cluster)
            for number, name in (("5", "checkpoint_io"), ("4b", "logstream"), ("4", "triggerer")):
                if number in want:
                    make = importlib.import_module(f"bench.{name}").figure
                    figures.append(timed(number, functools.partial(make, cluster)))
    if "7" in want:  # pip and the disk, no cluster: last, so its downloads disturb no other figure
        figures.append(timed("7", importlib.import_module("bench.install_size").figure))
    seconds = time.monotonic() - started
    write(figures, conditions(want, started_wall, seconds, load_start, activity_start))
    log(f"make bench took {seconds / 60:.1f} min")
    return 0 if all(t.met is not None for f in figures for t in f.targets) else 1


def training_figures(want: set[str], cluster) -> list[Figure]:
    """Figures 1, 2 and 6 share the training runs; figure 2 adds the hand-written pollers."""
    from airflow_provider_horovod import local
    from bench import runs
    from bench.workload import DEFAULT_CONFIG

    config = {**DEFAULT_CONFIG, **json.loads(os.environ.get("BENCH_TRAIN_CONFIG") or "{}")}
    # Single-machine mode, as the embedded cluster runs: a driver translating 127.0.0.1 into the machine's
    # address would wait for a GCS that listens on loopback only.
    ray_env = {
        "RAY_ADDRESS": cluster.gcs_address,
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": os.path.join(local.state_dir(), local.TOKEN_FILE),
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    }
    started = time.monotonic()
    try:
        records = runs.training_runs(repeats(), config, ray_env)
    except Exception as err:
        traceback.print_exc()
        return [failed(n, err, time.monotonic() - started) for n in sorted(want & {"1", "2", "6"})]
    runs_s = time.monotonic() - started
    makers = {
        "1": lambda: runs.overhead_figure(records, runs_s),
        "2": lambda: runs.latency_figure(records, runs.handwritten_runs([1.0, 10.0], max(5, repeats() + 2))),
        "6": lambda: runs.training_figure(records),
    }
    return [timed(number, make) for number, make in makers.items() if number in want]


if __name__ == "__main__":
    sys.exit(main())
