"""Figure 11: a smoke run of a production DAG (docs/ci.md) on the embedded cluster with 2 CPUs and no GPU, as a
CI runner has it: its wall time, and the same DAG with a bug planted in each of three places."""

from __future__ import annotations

import json
import os
import shutil

from bench.common import OUT, dags_test, log, repeats, save_raw
from bench.markdown import Figure, Target, median, plain_table, target
from harness.example_dag import PRODUCTION, edited_copy

DAG_ID = "horovod_retraining"
TARGET_S = 60.0
CLUSTER_CPUS = "2"
TRAIN_FN = 'train_fn="airflow_provider_horovod.examples.retraining:train_regressor"'
SCORE = 'score(result["checkpoint_uri"], data["holdout"])'
# Each bug: (where, the edit, what the failed run's output must name).
BUGS = [
    ("training function's import", {TRAIN_FN: TRAIN_FN.replace("regressor", "regresor")}, "train_regresor"),
    ("evaluation's checkpoint read", {SCORE: SCORE.replace("_uri", "")}, "KeyError: 'checkpoint'"),
    ("template", {"['train'] }}": "['trian'] }}"}, "has no attribute 'trian'"),
]


def dag_folder(name: str, edits: dict[str, str]) -> str:
    """The example DAG as production would configure it, ``edits`` made too, in a folder of its own."""
    return str(edited_copy(OUT / "smoke" / "dags" / name, {**PRODUCTION, **edits}))


def smoke_run(name: str, folder: str, day: int, *, check: bool = True):
    storage = OUT / "smoke" / "storage" / name
    shutil.rmtree(storage, ignore_errors=True)
    env = {
        "AIRFLOW__HOROVOD__SMOKE_RUN": "True",
        "AIRFLOW__CORE__DAGS_FOLDER": folder,
        "HOROVOD_RETRAINING_STORAGE": str(storage),
        "AIRFLOW_PROVIDER_HOROVOD_LOCAL_NUM_CPUS": CLUSTER_CPUS,
    }
    # Days of the DAG's own (its start_date is 2026-11-01: a run before it has no tasks).
    run, wall = dags_test(DAG_ID, f"smoke-{name}.log", logical_date=f"2026-11-{day:02d}", env=env, check=check)
    if check and "Smoke run: 8 GPU" not in run.stdout + run.stderr:
        raise RuntimeError(f"the {name} run trained no smoke run: see bench/out/logs/smoke-{name}.log")
    return run, wall


def figure() -> Figure:
    from airflow_provider_horovod import local

    # The embedded cluster the provider starts itself (no ray_default connection), with 2 CPUs.
    os.environ.pop("AIRFLOW_CONN_RAY_DEFAULT", None)
    local.down()
    try:
        production = dag_folder("production", {})
        _, first_s = smoke_run("first", production, 1)  # starts the cluster; the environments' bytecode is written
        walls = []
        for i in range(repeats()):
            run, wall = smoke_run(f"warm-{i + 1}", production, 2 + i)
            walls.append(wall)
            log(f"smoke run {i + 1}: {wall:.1f} s")
        last = (run.stdout + run.stderr).splitlines()
        said = [line.split("Smoke run: ", 1)[1].split(" [airflow", 1)[0] for line in last if "Smoke run: 8 GPU" in line]
        promoted = [json.loads(line.split("AHP_RETRAINING ", 1)[1]) for line in last if "AHP_RETRAINING " in line]
        bugs = []
        for n, (where, edits, expected) in enumerate(BUGS):
            run, wall = smoke_run(f"bug-{n + 1}", dag_folder(f"bug-{n + 1}", edits), 20 + n, check=False)
            named = expected in run.stdout + run.stderr
            bugs.append({"where": where, "rc": run.returncode, "named": named, "expected": expected, "wall_s": wall})
            log(f"planted bug ({where}): rc {run.returncode}, named: {named}, {wall:.1f} s")
    finally:
        local.down()
    raw = {"first_s": first_s, "warm_s": walls, "bugs": bugs, "said": said[:1], "promote": promoted}
    save_raw("smoke", raw)
    return figure_of(raw)


def figure_of(raw: dict) -> Figure:
    first_s, walls, bugs, said, promoted = (raw[k] for k in ("first_s", "warm_s", "bugs", "said", "promote"))
    warm = median(walls)
    rows = [
        ["first run (starts the embedded cluster)", f"{first_s:.1f}"],
        [f"warm, median of {len(walls)}", f"{warm:.1f}"],
        ["warm, each", ", ".join(f"{w:.1f}" for w in walls)],
    ]
    bug_rows = [
        [b["where"], "failed" if b["rc"] else "**passed**", "yes" if b["named"] else "**no**", f"`{b['expected']}`"]
        + [f"{b['wall_s']:.1f}"]
        for b in bugs
    ]
    fig = Figure(11)
    fig.tables.append(plain_table(["`airflow dags test`, smoke run", "wall s"], rows))
    fig.tables.append(plain_table(["planted bug", "the run", "message names it", "looked for", "wall s"], bug_rows))
    if said:
        fig.notes.append(f"The training's task log: `Smoke run: {said[0]}`")
    if promoted:
        fig.notes.append(
            f"The promotion: promoted={promoted[-1].get('promoted')}, smoke_run={promoted[-1].get('smoke_run')}."
        )
    name, detail = "11. Production DAG under the smoke switch, warm", f"median {warm:.1f} s against {TARGET_S:.0f} s"
    fig.targets.append(target(name, warm, TARGET_S, detail, "the fixed cost of a training task (figure 10)", unit=" s"))
    caught = sum(b["rc"] != 0 and b["named"] for b in bugs)
    name = "11. Each planted bug fails the smoke run, named"
    fig.targets.append(Target(name, caught == len(bugs), f"{caught} of {len(bugs)}"))
    return fig
