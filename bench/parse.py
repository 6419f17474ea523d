"""Figure 3: DAG parse cost. ``dags/horovod_retraining.py`` against the same DAG built from
Airflow's own operators only (``bench/parse_dags/retraining_builtin.py``).

Each parse runs in a fresh interpreter, as Airflow's DAG processor parses each file in a fresh
child process: Airflow itself is imported first (the processor has it already), then the file is
parsed the way the processor does it (``BundleDagBag``, then ``DagSerialization.to_dict``), timed,
and the modules it brought in are counted.

    python -m bench.parse FILE    # one parse, prints one AHP_BENCH_PARSE {json} line
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from bench.common import (
    BENCH,
    REPO,
    Figure,
    Row,
    Sample,
    Target,
    fmt,
    log,
    plain_table,
    repeats,
    run_logged,
    table,
    tagged_json,
)

OURS = REPO / "dags" / "horovod_retraining.py"
BUILTIN = BENCH / "parse_dags" / "retraining_builtin.py"
HEAVY = ("torch", "horovod", "ray.train")
TARGET_MS = 50.0

HOW = """
Each parse runs in a fresh interpreter, as Airflow's DAG processor parses a file in a fresh child
process. Airflow (`airflow.sdk`, the DagBag and the serializer) is imported first, as the processor
has it loaded; then the file is parsed as the processor does it (`BundleDagBag(...)` then
`DagSerialization.to_dict` per DAG) and timed, and the modules the file brought in are counted. The
baseline is `bench/parse_dags/retraining_builtin.py`: the same DAG (prepare_data -> train -> evaluate
-> promote -> publish_champion, champion_checkpoint beside; schedule, Asset, templates,
`max_active_tis_per_dag`) from Airflow's own operators: what runs on the cluster (`@task.ray`, the
operator) is submitted by `@task`/`PythonOperator` functions through Ray's `JobSubmissionClient`,
and the champion's compare-and-swap is a lock file beside the record. Neither file imports model code
at parse time. The two files are parsed alternately.
"""


def parse_once(path: str) -> dict:
    """Runs in the child: import Airflow, then time one parse of ``path``."""
    import airflow.sdk  # noqa: F401 - what the DAG processor has loaded before it parses
    from airflow.dag_processing.dagbag import BundleDagBag
    from airflow.serialization.serialized_objects import DagSerialization

    before = set(sys.modules)
    started = time.perf_counter()
    bag = BundleDagBag(dag_folder=path, bundle_path=Path(path).parent, bundle_name="bench", load_op_links=False)
    parsed = time.perf_counter()
    for dag in bag.dags.values():
        DagSerialization.to_dict(dag)
    serialized = time.perf_counter()
    new = sorted(set(sys.modules) - before)
    return {
        "file": path,
        "dags": len(bag.dags),
        "errors": bag.import_errors,
        "parse_ms": (parsed - started) * 1000,
        "total_ms": (serialized - started) * 1000,
        "new_modules": len(new),
        "heavy": [m for m in sys.modules if any(m == h or m.startswith(h + ".") for h in HEAVY)],
        "ray_imported": "ray" in sys.modules,
        # Airflow names the DAG file's own module unusual_prefix_<hash>_<name>: not an import.
        "new_top_level": sorted({m.split(".")[0] for m in new if not m.startswith("unusual_prefix_")}),
        "new_names": [m for m in new if not m.startswith("unusual_prefix_")],
    }


def figure() -> Figure:
    fig = Figure(3, "DAG parse cost", HOW)
    n = repeats(3) * 2
    results = {"ours": [], "builtin": []}
    log(f"parsing each DAG file {n} times, alternately, each in a fresh interpreter")
    for i in range(n):
        order = (("ours", OURS), ("builtin", BUILTIN))
        for name, path in order if i % 2 == 0 else order[::-1]:
            run, _ = run_logged([sys.executable, "-m", "bench.parse", str(path)], f"parse-{name}-{i}.log")
            (result,) = tagged_json(run.stdout, "AHP_BENCH_PARSE")
            if result["errors"] or not result["dags"]:
                raise RuntimeError(f"{path} did not parse: {result['errors']}")
            results[name].append(result)

    def s(name: str, key: str) -> Sample:
        return Sample([r[key] for r in results[name]])

    rows = [
        Row(
            "parse + serialize",
            "horovod_retraining.py",
            s("ours", "total_ms"),
            "built-in operators only",
            s("builtin", "total_ms"),
            "ms",
            f"target: A - B <= {TARGET_MS:g} ms",
        ),
        Row(
            "parse (import + build)",
            "horovod_retraining.py",
            s("ours", "parse_ms"),
            "built-in operators only",
            s("builtin", "parse_ms"),
            "ms",
            "",
        ),
        Row(
            "modules imported by the file",
            "horovod_retraining.py",
            s("ours", "new_modules"),
            "built-in operators only",
            s("builtin", "new_modules"),
            "count",
            "",
        ),
    ]
    fig.tables.append(table(rows))
    ours_last, builtin_last = results["ours"][-1], results["builtin"][-1]
    heavy = sorted({m for r in results["ours"] for m in r["heavy"]})
    extra = sorted(set(ours_last["new_top_level"]) - set(builtin_last["new_top_level"]))
    extra_modules = sorted(set(ours_last["new_names"]) - set(builtin_last["new_names"]))
    fig.tables.append(
        plain_table(
            ["file", "torch / horovod / ray.train imported", "ray imported", "top-level packages it imports"],
            [
                [
                    "horovod_retraining.py",
                    ", ".join(heavy) or "none",
                    str(ours_last["ray_imported"]),
                    ", ".join(ours_last["new_top_level"]),
                ],
                [
                    "built-in baseline",
                    ", ".join(sorted({m for r in results["builtin"] for m in r["heavy"]})) or "none",
                    str(builtin_last["ray_imported"]),
                    ", ".join(builtin_last["new_top_level"]),
                ],
            ],
        )
    )
    diff = rows[0].a.median - rows[0].b.median
    met = diff <= TARGET_MS
    fig.targets.append(
        Target(
            "3. DAG parse within 50 ms of the built-in equivalent",
            met,
            f"{fmt(rows[0].a.median)} ms against {fmt(rows[0].b.median)} ms: {fmt(diff)} ms more "
            f"(A/B = {fmt(rows[0].ratio)}); {'met' if met else 'missed'} by {fmt(abs(TARGET_MS - diff))} ms",
            ""
            if met
            else "import lazily what the operator's module chain loads at parse time and a parse does not "
            f"use (extra modules here: {', '.join(m for m in extra_modules if not m.startswith('airflow_provider'))})",
        )
    )
    fig.targets.append(
        Target(
            "3. no torch, horovod or ray.train imported by the DAG file",
            not heavy,
            "none imported" if not heavy else f"imported: {', '.join(heavy)}",
            "" if not heavy else "move those imports into the functions that run on the cluster",
        )
    )
    ser_a = rows[0].a.median - rows[1].a.median
    ser_b = rows[0].b.median - rows[1].b.median
    fig.notes.append(
        f"Serialization alone takes {fmt(ser_a)} ms after our file's parse and {fmt(ser_b)} ms after the "
        "baseline's: a one-off cost of a fresh process lands on a different side for each file (profiled "
        'with cProfile): our parse pays about 115 ms in `conf.getboolean("operators", '
        '"default_deferrable")`, a default argument evaluated when `operators/ray.py` defines '
        "`BaseRayJobOperator`; the baseline's serialization pays about 125 ms importing "
        "`airflow.providers.standard.operators.trigger_dagrun` (for its dependency detection). So the "
        "parse-only row overstates our cost; parse + serialize, what the processor does, is the "
        "comparison the target uses."
    )
    fig.notes.append(
        "Modules the provider's DAG imports that the baseline does not: "
        f"{', '.join(extra_modules) or 'none'}"
        f" (top-level packages: {', '.join(extra) or 'none'})."
    )
    return fig


if __name__ == "__main__":
    print("AHP_BENCH_PARSE " + json.dumps(parse_once(sys.argv[1])), flush=True)
