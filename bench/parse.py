"""Figure 3: DAG parse cost, ours against the same DAG of Airflow's own operators, in fresh interpreters.
``python -m bench.parse FILE``: one parse, printed as one ``AHP_BENCH_PARSE {json}`` line."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from bench.common import BENCH, REPO, log, repeats, run_logged
from bench.markdown import Figure, Row, Target, fmt, plain_table, sample, table, target
from harness.airflow_cli import tagged_json

OURS = REPO / "dags" / "horovod_retraining.py"
BUILTIN = BENCH / "parse_dags" / "retraining_builtin.py"
HEAVY = ("torch", "horovod", "ray.train")
TARGET_MS = 50.0
TAG = "AHP_BENCH_PARSE"  # the child's line of what it found


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
    n = repeats() * 2
    results = {"ours": [], "builtin": []}
    log(f"parsing each DAG file {n} times, alternately, each in a fresh interpreter")
    for i in range(n):
        order = (("ours", OURS), ("builtin", BUILTIN))
        for name, path in order if i % 2 == 0 else order[::-1]:
            run, _ = run_logged([sys.executable, "-m", "bench.parse", str(path)], f"parse-{name}-{i}.log")
            (result,) = tagged_json(run.stdout, TAG)
            if result["errors"] or not result["dags"]:
                raise RuntimeError(f"{path} did not parse: {result['errors']}")
            results[name].append(result)

    def row(what: str, key: str, unit: str, note: str = "") -> Row:
        ours, builtin = sample(results["ours"], key), sample(results["builtin"], key)
        return Row(what, "horovod_retraining.py", ours, "built-in operators only", builtin, unit, note)

    rows = [
        row("parse + serialize", "total_ms", "ms", f"target: A - B <= {TARGET_MS:g} ms"),
        row("parse (import + build)", "parse_ms", "ms"),
        row("modules imported by the file", "new_modules", "count"),
    ]
    ours, builtin = results["ours"][-1], results["builtin"][-1]
    heavy = {name: sorted({m for r in results[name] for m in r["heavy"]}) for name in results}
    header = ["file", "torch / horovod / ray.train imported", "ray imported", "top-level packages it imports"]
    files = (("horovod_retraining.py", "ours", ours), ("built-in baseline", "builtin", builtin))
    body = [
        [label, ", ".join(heavy[name]) or "none", str(last["ray_imported"]), ", ".join(last["new_top_level"])]
        for label, name, last in files
    ]
    fig = Figure(3, tables=[table(rows), plain_table(header, body)])
    extra = sorted(set(ours["new_top_level"]) - set(builtin["new_top_level"]))
    extra_modules = sorted(set(ours["new_names"]) - set(builtin["new_names"]))
    a, b = rows[0].a.median, rows[0].b.median
    detail = f"{fmt(a)} ms against {fmt(b)} ms: {fmt(a - b)} ms more (A/B = {fmt(rows[0].ratio)})"
    closing = "import lazily what the operator's module chain loads at parse time and a parse does not use (extra "
    closing += f"modules here: {', '.join(m for m in extra_modules if not m.startswith('airflow_provider'))})"
    name = "3. DAG parse within 50 ms of the built-in equivalent"
    fig.targets.append(target(name, a - b, TARGET_MS, detail, closing, unit=" ms"))
    name, imported = "3. no torch, horovod or ray.train imported by the DAG file", ", ".join(heavy["ours"])
    closing = "move those imports into the functions that run on the cluster" if imported else ""
    fig.targets.append(Target(name, not imported, f"imported: {imported}" if imported else "none imported", closing))
    after_ours, after_builtin = rows[0].a.median - rows[1].a.median, rows[0].b.median - rows[1].b.median
    fig.notes.append(
        f"Serialization alone takes {fmt(after_ours)} ms after our file's parse and {fmt(after_builtin)} ms after the "
        "baseline's."
    )
    fig.notes.append(
        f"Modules the provider's DAG imports that the baseline does not: {', '.join(extra_modules) or 'none'} "
        f"(top-level packages: {', '.join(extra) or 'none'})."
    )
    return fig


if __name__ == "__main__":
    print(f"{TAG} " + json.dumps(parse_once(sys.argv[1])), flush=True)
