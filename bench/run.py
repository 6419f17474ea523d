"""`make bench`: runs every figure and writes bench/results.md (raw data and logs in bench/out/).

    python -m bench.run            # every figure
    BENCH_ONLY=3,4b,5 python -m bench.run

A moto S3 server and the embedded local Ray cluster (under bench/out/airflow-home) are started for
the run and stopped at its end, also when a figure fails. A figure that fails is reported as such
in the results; the others still run.
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
import time
import traceback
from importlib.metadata import version

from bench.common import (
    AIRFLOW_BIN,
    BENCH,
    OUT,
    RAY_ADDRESS_ENV,
    Figure,
    Target,
    figure_key,
    log,
    plain_table,
    repeats,
    run_logged,
    save_raw,
)

RESULTS = BENCH / "results.md"
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


def selected() -> set[str]:
    only = os.environ.get("BENCH_ONLY")
    want = {x.strip() for x in only.split(",")} if only else set(TITLES)
    if unknown := want - set(TITLES):
        raise SystemExit(f"BENCH_ONLY: no figure {sorted(unknown)}; the figures are {sorted(TITLES, key=figure_key)}")
    return want


def failed(number: str, err: BaseException, seconds: float) -> Figure:
    fig = Figure(
        number, TITLES[number], f"**This figure failed:** `{type(err).__name__}: {err}`"[:2000], seconds=seconds
    )
    fig.targets.append(Target(f"{number}. {TITLES[number]}", None, "not measured: the figure failed"))
    return fig


def timed(number: str, make) -> Figure:
    started = time.monotonic()
    log(f"figure {number}: {TITLES[number]}")
    try:
        fig = make()
    except Exception as err:  # one figure's failure must not lose the others
        traceback.print_exc()
        fig = failed(number, err, time.monotonic() - started)
    fig.seconds = max(fig.seconds, time.monotonic() - started)  # a figure may count its earlier runs
    log(f"figure {number} done in {fig.seconds:.0f} s")
    keep(fig)
    return fig


FIGURES = OUT / "figures"


def keep(fig: Figure) -> None:
    """Every figure as measured, so results.md can be assembled from figures run one at a time."""
    import dataclasses
    import json

    FIGURES.mkdir(parents=True, exist_ok=True)
    data = dataclasses.asdict(fig)
    data["measured_at"] = time.time()
    (FIGURES / f"{fig.number}.json").write_text(json.dumps(data, indent=1))


def last_run_conditions() -> str | None:
    """The conditions table of the last run that wrote results.md (the run most figures come from)."""
    try:
        text = RESULTS.read_text()
    except OSError:
        return None
    if "## Conditions\n\n" not in text or "\n\n## Targets" not in text:
        return None
    table_text = text.split("## Conditions\n\n", 1)[1].split("\n\n## Targets", 1)[0]
    table_text = "\n".join(
        line for line in table_text.splitlines() if not line.startswith(("| each figure measured at", "| note |"))
    )
    return table_text.replace("| `make bench` took |", "| the run took (figures assembled: see below) |")


def assemble(want: set[str]) -> tuple[list[Figure], dict[str, float]]:
    """``BENCH_ASSEMBLE=1``: the figures last measured (bench/out/figures), none run now; and when
    each was measured."""
    import json

    figures, when = [], {}
    for number in sorted(want, key=figure_key):
        path = FIGURES / f"{number}.json"
        if not path.exists():
            log(f"figure {number} was never measured: left out")
            continue
        data = json.loads(path.read_text())
        when[number] = data.pop("measured_at", 0.0)
        data["targets"] = [Target(**t) for t in data["targets"]]
        figures.append(Figure(**data))
    return figures, when


def load() -> str:
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


def other_activity() -> str:
    """What else ran on the machine: processes of other Ray clusters and pytest sessions."""
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout.splitlines()
    pytest = sum(1 for line in out if "pytest" in line)
    clusters = sum(1 for line in out if "gcs_server" in line)
    return f"{pytest} pytest process(es), {clusters} Ray cluster(s) running (ours included, when up)"


def conditions(started_wall: float, seconds: float, load_start: str, activity_start: str) -> str:
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30)
    rows = [
        ["date (UTC)", time.strftime("%Y-%m-%d %H:%M", time.gmtime(started_wall))],
        ["`make bench` took", f"{seconds / 60:.1f} min"],
        ["machine", f"{os.cpu_count()} CPU cores, {mem:.0f} GiB memory, no GPU, {platform.platform()}"],
        ["load average (1, 5, 15 min) at start / at end", f"{load_start} / {load()}"],
        ["other work at start / end", f"{activity_start} / {other_activity()}"],
        [
            "stack",
            f"Python {platform.python_version()}, apache-airflow {version('apache-airflow')}, "
            f"ray {version('ray')}, torch {version('torch')}, horovod {version('horovod')}, "
            f"moto {version('moto')}, boto3 {version('boto3')}, pyarrow {version('pyarrow')}",
        ],
        [
            "settings",
            f"BENCH_REPEATS={repeats(3)}"
            + "".join(
                f", {k}={v}"
                for k, v in sorted(os.environ.items())
                if k.startswith("BENCH_") and k != "BENCH_REPEATS" and k != RAY_ADDRESS_ENV
            ),
        ],
    ]
    return plain_table(["", ""], rows)


def targets_table(figures: list[Figure]) -> str:
    rows = []
    for fig in sorted(figures, key=lambda f: figure_key(f.number)):
        for t in fig.targets:
            state = {True: "**met**", False: "**missed**", None: "not measured"}[t.met]
            rows.append([t.name, state, t.detail, t.closing or "-"])
    return plain_table(["target", "", "by how much", "what would close a miss"], rows)


def chaos_figure() -> str:
    """The figure `make chaos` wrote at the end of results.md (bench/chaos.py), kept as it is."""
    from bench.chaos import BEGIN

    text = RESULTS.read_text() if RESULTS.exists() else ""
    return "\n" + text[text.index(BEGIN) :] if BEGIN in text else ""


def write(figures: list[Figure], header: str) -> None:
    parts = [
        "# Benchmarks: results",
        "",
        "Written by `make bench` (`python -m bench.run`); how each figure is measured: "
        "[README.md](README.md) and each figure's own text below. Raw measurements and logs: `bench/out/`.",
        "",
        "Ratios are the point: this machine is small and was shared (see the conditions), so absolute "
        "times only hold here; A and B of a row ran interleaved, under the same load.",
        "",
        "## Conditions",
        "",
        header,
        "",
        "## Targets",
        "",
        targets_table(figures),
        "",
    ]
    for fig in sorted(figures, key=lambda f: figure_key(f.number)):
        parts += [fig.markdown(), ""]
    RESULTS.write_text("\n".join(parts) + chaos_figure())
    log(f"wrote {RESULTS}")


def replace_in_results(figures: list[Figure]) -> None:
    """``BENCH_REPLACE=1``: the figures just measured take the place of their sections and of their rows of
    the targets table in the results.md there is; the other figures, and the conditions of the run they
    came from, stay (the time of a replaced figure is in its own section)."""
    text = RESULTS.read_text()
    head, rest = text.split("\n## Targets\n\n", 1)
    targets_text, sections = rest.split("\n\n", 1)
    new_numbers = {str(f.number) for f in figures}
    rows = targets_text.splitlines()
    kept = [row for row in rows[2:] if row.split(" | ", 1)[0].lstrip("| ").split(". ", 1)[0] not in new_numbers]
    added = targets_table(figures).splitlines()[2:]
    ordered = sorted(kept + added, key=lambda row: figure_key(row.lstrip("| ").split(". ", 1)[0]))
    for fig in figures:
        start = sections.index(f"## {fig.number}. ")
        end = sections.find("\n## ", start + 1)
        sections = sections[:start] + fig.markdown() + "\n" + (sections[end:] if end != -1 else "\n")
        head = re.sub(rf"(\| each figure measured at[^\n]*?\b{fig.number}: )[^,|]*", r"\g<1>see its section ", head)
    RESULTS.write_text(head + "\n## Targets\n\n" + "\n".join(rows[:2] + ordered) + "\n\n" + sections)
    log(f"replaced figures {sorted(new_numbers, key=figure_key)} in {RESULTS}")


def main() -> int:
    started, started_wall = time.monotonic(), time.time()
    load_start, activity_start = load(), other_activity()
    OUT.mkdir(parents=True, exist_ok=True)
    want = selected()
    figures: list[Figure] = []
    if os.environ.get("BENCH_ASSEMBLE"):
        figures, when = assemble(want)
        seconds = sum(f.seconds for f in figures)
        header = last_run_conditions() or conditions(started_wall, seconds, load_start, activity_start).replace(
            "| `make bench` took |", "| the figures took (sum of their own times; assembled) |"
        )
        header += (
            "\n| each figure measured at (UTC, its end) | "
            + ", ".join(f"{n}: {time.strftime('%H:%M', time.gmtime(t))}" for n, t in when.items())
            + " |"
        )
        if note := os.environ.get("BENCH_NOTE"):
            header += f"\n| note | {note} |"
        write(figures, header)
        return 0 if all(t.met is not None for f in figures for t in f.targets) else 1
    run_logged([AIRFLOW_BIN, "db", "migrate"], "airflow-db-migrate.log")

    if "3" in want:  # no cluster needed: parse while the machine is as quiet as it gets
        from bench import parse

        figures.append(timed("3", parse.figure))

    if "8" in want:  # no cluster either: the views read the metadata database and local storage
        from bench import ui

        figures.append(timed("8", ui.figure))

    if "11" in want:  # the embedded cluster the provider starts itself, with 2 CPUs, as on a CI runner
        from bench import smoke

        figures.append(timed("11", smoke.figure))

    if "9" in want:  # hosts of its own (network namespaces), with their own Ray cluster and S3
        from bench import multihost

        figures.append(timed("9", multihost.figure))

    if "10" in want:  # figure 9's hosts again, with airflow dags test against them
        from bench import fixedcost

        figures.append(timed("10", fixedcost.figure))

    if want & {"1", "2", "4", "4b", "5", "6"}:
        from bench.cluster import moto_server, ray_cluster

        with moto_server(), ray_cluster() as cluster:
            if want & {"1", "2", "6"}:
                figures += training_figures(want, cluster)
            if "5" in want:
                from bench import checkpoint_io

                figures.append(timed("5", checkpoint_io.figure))
            if "4b" in want:
                from bench import logstream

                figures.append(timed("4b", lambda: logstream.figure(cluster)))
            if "4" in want:
                from bench import triggerer

                figures.append(timed("4", lambda: triggerer.figure(cluster)))

    if "7" in want:  # pip and the disk, no cluster: last, so its downloads disturb no other figure
        from bench import install_size

        figures.append(timed("7", install_size.figure))

    seconds = time.monotonic() - started
    if os.environ.get("BENCH_REPLACE"):
        replace_in_results(figures)
        return 0 if all(t.met is not None for f in figures for t in f.targets) else 1
    write(figures, conditions(started_wall, seconds, load_start, activity_start))
    log(f"make bench took {seconds / 60:.1f} min")
    return 0 if all(t.met is not None for f in figures for t in f.targets) else 1


def training_figures(want: set[str], cluster) -> list[Figure]:
    """Figures 1, 2 and 6 share the training runs; figure 2 adds the hand-written pollers."""
    import json

    from airflow_provider_horovod import local
    from bench import latency, overhead, runs, training
    from bench.workload import DEFAULT_CONFIG

    config = {**DEFAULT_CONFIG, **json.loads(os.environ.get("BENCH_TRAIN_CONFIG") or "{}")}
    # Single-machine mode as the embedded cluster runs: a driver left to translate 127.0.0.1 into the
    # machine's address waits for a GCS that listens on loopback only.
    ray_env = {
        "RAY_ADDRESS": cluster.gcs_address,
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": os.path.join(local.state_dir(), local.TOKEN_FILE),
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    }
    started = time.monotonic()
    try:
        records = runs.training_runs(repeats(3), config, ray_env)
    except Exception as err:
        traceback.print_exc()
        return [failed(n, err, time.monotonic() - started) for n in sorted(want & {"1", "2", "6"})]
    save_raw("training_runs", records)
    runs_s = time.monotonic() - started
    figures = []
    if "1" in want:
        figures.append(timed("1", lambda: overhead.figure(records, config)))
        figures[-1].seconds += runs_s
        figures[-1].notes.append(f"The training runs behind figures 1, 2 and 6 took {runs_s / 60:.1f} min together.")
    if "2" in want:

        def latency_figure():
            hand = latency.handwritten_runs([1.0, 10.0], max(5, repeats(3) + 2))
            save_raw("handwritten_latency", hand)
            return latency.figure(records, hand)

        figures.append(timed("2", latency_figure))
    if "6" in want:
        figures.append(timed("6", lambda: training.figure(records, config)))
    return figures


if __name__ == "__main__":
    sys.exit(main())
