"""Figure 10: the fixed cost of a training task (DAG ``bench_fixedcost``) on figure 9's hosts, each way against
``horovodrun``: wall time cut into stages, CPU by kind of process. Needs root; else the figure says why not."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

from bench.common import (
    BENCH_DAGS,
    OUT,
    RAY_ADDRESS_ENV,
    commit,
    dags_test,
    env_names,
    epoch,
    log,
    operator_times,
    repeats,
    save_raw,
)
from bench.markdown import Figure, Row, Target, fmt, median, plain_table, sample, table, target
from bench.workload import STAMP
from harness.airflow_cli import tagged_json
from harness.processes import CpuSampler
from harness.tasks import jobs_of

TARGET_S = 10.0
SUBNET = "10.80.0"  # apart from the tests' hosts and figure 9's
BUCKET = "bench-fixedcost"
CONN_ID = "ray_bench_fixedcost"
DAG_ID = "bench_fixedcost"
FLOOR_DAG_ID = "bench_fixedcost_floor"  # a task of Airflow's own that does nothing: Airflow's floor
FOLLOW_S = 300  # the "following" way's sync_wait_before_defer_s: longer than the job
HVD = "horovodrun --gloo"
WORK = {"features": 256, "hidden": 1024, "batch": 64, "steps": 200}
TIMINGS_FILE = OUT / "fixedcost-operator-timings.jsonl"
SAMPLE_S = 0.2
# "cached": bytecode cached under bench/out, as a pip install leaves it (else every process compiles its imports).
BYTECODE = os.environ.get("BENCH_BYTECODE", "cached")
WAYS = {
    "dagstest": "A, `airflow dags test`",
    "deployment": "A, on a deployment",
    "following": "A, on a deployment, followed in the worker",
}
PROVIDER_IMPORTS = ("airflow_provider_horovod.plugins.training", "airflow_provider_horovod.operators.horovod")
# Processes of other sessions' work, by kind: their tests and their (nice'd) compiles.
OTHER_WORK = ("other work on the machine (pytest)", "cc1plus", "cc1", "ld", "as", "ninja", "cmake", "make")


def through_horovodrun(bench) -> dict:
    with CpuSampler(SAMPLE_S) as cpu:
        s, started, ended = bench.through_horovodrun(WORK)
    stages = {
        "launch (horovodrun, ssh, Python)": s["fn_start"] - started,
        **rank_stages(s),
        "end (ranks exit, launcher exits)": ended - s["work_done"],
    }
    return {"total_s": ended - started, "stages": stages, **sampled(cpu)}


def rank_stages(s: dict) -> dict:
    """Rank 0's stages from its stamps (``workload.fixed_work``), the same under every launcher."""
    return {
        "import torch, horovod": s["imported"] - s["fn_start"],
        "rendezvous (hvd.init)": s["hvd_ready"] - s["imported"],
        "work": s["work_done"] - s["hvd_ready"],
    }


def sampled(cpu: CpuSampler) -> dict:
    return {"cpu": cpu.by_kind(), "machine_cpu_s": cpu.machine_s}


def bench_env(bench, following: bool = False) -> dict[str, str]:
    """What the task of ``bench_fixedcost`` reads (``bench/dags/bench_dags.py``)."""
    env = {
        "BENCH_TIMINGS_FILE": str(TIMINGS_FILE),
        "BENCH_FIXEDCOST_CONN": CONN_ID,
        "BENCH_FIXEDCOST_STORAGE": f"s3://{BUCKET}/runs",
        "BENCH_FIXEDCOST_WORK": json.dumps(WORK),
        RAY_ADDRESS_ENV: bench.hosts.gcs_address,  # the DAG's runtime_env
    }
    if following:  # the task follows its job in the worker to the end, no deferral
        env["BENCH_FIXEDCOST_SYNC_WAIT_S"] = str(FOLLOW_S)
    return env


def task_stages(run_id: str | None, start: float, end: float, names: tuple[str, str]) -> tuple[dict, dict]:
    """A task's stages from ``start`` to ``end`` (``names``: the first's and the last's), and their sources."""
    from airflow_provider_horovod.hooks.ray import RayHook

    run_id, execute_at, result_at = operator_times(TIMINGS_FILE, DAG_ID, run_id)
    hook = RayHook(ray_conn_id=CONN_ID)
    (job,) = jobs_of(hook, run_id, DAG_ID)
    logs = hook.get_job_logs(job["submission_id"])
    s, record = tagged_json(logs, STAMP)[-1], tagged_json(logs, "AHP_RESULT")[-1]
    t = record["timings"]
    job_start, job_end = job["start_time"] / 1000, job["end_time"] / 1000
    driver_at = t.get("process_started_at") or t["started_at"]
    fit_at = t.get("fit_started_at") or t["started_at"]
    fit_end = fit_at + t["fit_s"] if t.get("fit_started_at") else t["finished_at"]
    stages = {
        names[0]: execute_at - start,
        "submit: plan, checks, package upload": job_start - execute_at,
        "Ray job: supervisor, runtime env, driver process": driver_at - job_start,
        "driver: imports, payload, trainer": fit_at - driver_at,
        "Train: controller, worker group, backend": s["fn_start"] - fit_at,
        **rank_stages(s),
        "Train's end: workers done to fit() returned": fit_end - s["work_done"],
        "driver's end: record, exit, job ended": job_end - fit_end,
        "Airflow: job ended to the operator's result": result_at - job_end,
        names[1]: end - result_at,
    }
    return stages, {"submission_id": job["submission_id"], "timings": t, "job_end": job_end}


def through_dags_test(bench) -> dict:
    with CpuSampler(SAMPLE_S) as cpu:
        started = time.time()
        run, _ = dags_test(DAG_ID, f"fixedcost-{uuid.uuid4().hex[:6]}.log", env=bench_env(bench))
        ended = time.time()
    names = ("Airflow: dags test start to the operator's execute", "Airflow: task end, dags test exit")
    stages, facts = task_stages(None, started, ended, names)
    deferred = "new_state=deferred" in run.stdout + run.stderr
    return {"total_s": ended - started, "stages": stages, **sampled(cpu), "deferred": deferred, **facts}


def through_deployment(stack) -> dict:
    """The task on a deployment: its start to its end as Airflow records them, and from its first queuing (read
    while the run starts: a resume queues the task again)."""
    with CpuSampler(SAMPLE_S) as cpu:
        triggered = time.time()
        run_id = stack.trigger(DAG_ID)
        queued_at, ti = None, {}
        deadline = time.monotonic() + 300
        while ti.get("state") not in ("success", "failed", "upstream_failed"):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{DAG_ID} {run_id}: train never ended: {ti.get('state')}")
            time.sleep(0.5 if queued_at is None else 1.0)
            ti = stack.task_instance(DAG_ID, run_id, "train")
            if queued_at is None and ti.get("queued_when"):
                queued_at = epoch(ti["queued_when"])
    if ti["state"] != "success":
        raise RuntimeError(f"{DAG_ID} {run_id}: train {ti['state']}: {stack.log_tail('scheduler')}")
    start, end = epoch(ti["start_date"]), epoch(ti["end_date"])
    names = ("Airflow: task start to the operator's execute", "Airflow: the operator's result to the task's end")
    stages, facts = task_stages(run_id, start, end, names)
    deferred = any("defer" in str(r.get("event", "")).lower() for r in stack.task_log(DAG_ID, run_id, "train"))
    found = {"total_s": end - start, "from_queued_s": end - queued_at if queued_at else None, "stages": stages}
    found.update(from_trigger_s=end - triggered, queued_to_start_s=start - queued_at if queued_at else None)
    return {**found, **sampled(cpu), "deferred": deferred, "run_id": run_id, **facts}


def floor(stack) -> dict:
    """Airflow's floor, the same way: ``airflow dags test`` start to exit, or the deployment's task times."""
    if stack is None:
        _, wall = dags_test(FLOOR_DAG_ID, f"fixedcost-floor-{uuid.uuid4().hex[:6]}.log")
        return {"total_s": wall}
    run_id = stack.trigger(FLOOR_DAG_ID)
    ti = stack.wait_for_state(FLOOR_DAG_ID, run_id, "nothing", {"success", "failed"}, timeout=120)
    start, end = epoch(ti["start_date"]), epoch(ti["end_date"])
    return {"total_s": end - start, "from_queued_s": end - epoch(ti["queued_when"])}


def provider_import_s() -> dict[str, float]:
    """Seconds the provider's plugin and operator add to a process with Airflow loaded (``-X importtime``)."""
    code = "import airflow.plugins_manager, airflow.sdk\n" + "".join(f"import {m}\n" for m in PROVIDER_IMPORTS)
    found: dict[str, list[float]] = {m: [] for m in PROVIDER_IMPORTS}
    for _ in range(3):
        done = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True)
        for line in done.stderr.splitlines():
            parts = line.split("|")
            if len(parts) == 3 and parts[2].strip() in found:
                found[parts[2].strip()].append(int(parts[1]) / 1e6)
    return {m: median(v) for m, v in found.items() if v}


def measure_way(way: str, n: int) -> dict:
    """One way of A against B on fresh hosts; the raw data, saved."""
    from bench.multihost import Bench
    from harness.stack import deployment

    raw: dict = {"way": way, "a": [], "horovodrun": [], "floor": [], "bytecode": BYTECODE}
    raw["load_start"], raw["started_at"] = os.getloadavg(), time.time()
    with Bench(subnet=SUBNET, bucket=BUCKET, conn_id=CONN_ID) as bench:
        airflow = contextlib.nullcontext()
        if way != "dagstest":  # a running Airflow on PostgreSQL of its own, the bench's DAGs
            env = bench_env(bench, following=way == "following")
            airflow = deployment(OUT / "fixedcost-deployment", BENCH_DAGS, env=env, dag_ids=(DAG_ID, FLOOR_DAG_ID))
        with airflow as stack:
            run_a = (lambda: through_deployment(stack)) if stack else (lambda: through_dags_test(bench))
            # One unmeasured run each: the first job on a fresh cluster also starts Ray's once-per-cluster actors.
            through_horovodrun(bench)
            run_a()
            for i in range(n):
                raw["horovodrun"].append(through_horovodrun(bench))
                raw["a"].append(run_a())
                raw["floor"].append(floor(stack))
                b, a = raw["horovodrun"][-1]["total_s"], raw["a"][-1]["total_s"]
                log(f"  {way} {i + 1}/{n}: horovodrun {b:.1f} s, A {a:.1f} s")
    raw.update(ended_at=time.time(), load_end=os.getloadavg(), provider_import_s=provider_import_s(), commit=commit())
    save_raw(f"fixedcost-{way}", raw)
    return raw


def load_raws(folder: Path = OUT) -> dict[str, dict]:
    paths = {way: folder / f"fixedcost-{way}.json" for way in WAYS}
    return {way: json.loads(path.read_text()) for way, path in paths.items() if path.exists()}


def figure() -> Figure:
    from harness import hosts, postgres

    fig = Figure(10)
    if reason := hosts.unavailable_reason():
        fig.targets.append(Target("10. a training task's excess over horovodrun at most 10 s", None, reason))
        return fig
    if BYTECODE == "cached":  # inherited by the hosts' Ray nodes and the deployment, so by every process
        os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
        os.environ["PYTHONPYCACHEPREFIX"] = str(OUT / "pycache")
    # The ways measured now; the figure shows every way last measured.
    for way in env_names("BENCH_FIXEDCOST_WAYS", "dagstest,deployment", WAYS):
        if way != "dagstest" and (reason := postgres.unavailable_reason()):
            fig.notes.append(f"The deployment way was not measured: {reason}.")
            continue
        measure_way(way, repeats())
    before = os.environ.get("BENCH_FIXEDCOST_BEFORE")
    return figure_of(fig, load_raws(), load_raws(Path(before)) if before else {})


def work(run: dict) -> float:
    return run["stages"]["work"]


def outside_work(run: dict) -> float:
    """A run's wall time less its own steps: the launch, the start and the end."""
    return run["total_s"] - work(run)


def figure_of(fig: Figure, raws: dict[str, dict], earlier: dict[str, dict]) -> Figure:
    """The tables and targets from the raw data of each way (and of an earlier code's, to compare)."""
    for way, raw in raws.items():
        way_of(fig, way, raw)
    fig.tables += [stage_table(raws), cpu_table(raws)] + ([before_after(earlier, raws)] if earlier else [])
    fig.tables.append(conditions_table(raws))
    if imports := next(iter(raws.values()), {}).get("provider_import_s"):
        plugin, operator = (fmt(imports.get(m)) for m in PROVIDER_IMPORTS)
        fig.notes.append(
            f"Importing the provider in an Airflow process that has Airflow loaded (`-X importtime`, medians of 3): "
            f"its plugin {plugin} s, the operator {operator} s."
        )
    fig.seconds = sum(raw["ended_at"] - raw["started_at"] for raw in raws.values())  # its runs
    return fig


def way_of(fig: Figure, way: str, raw: dict) -> None:
    """One way's table of A against horovodrun, and its targets."""
    a, b, name, dagstest = raw["a"], raw["horovodrun"], WAYS[way], way == "dagstest"
    label = "training task (airflow dags test)" if dagstest else "training task on a deployment"
    when = f"measured {time.strftime('%H:%M', time.gmtime(raw['ended_at']))} UTC, code {raw['commit']}"

    def vs(what: str, value, unit: str = "s", note: str = "", b_value=None) -> Row:
        return Row(f"{name}: {what}", label, sample(a, value), HVD, sample(b, b_value or value), unit, note)

    rows = [
        vs("wall", "total_s", note=when),
        vs("the work itself", work, note="same steps"),
        vs("machine CPU over the run", "machine_cpu_s", "CPU-s", "2 cores"),
        vs("outside the work (wall less the steps)", outside_work, note="the fixed cost"),
    ]
    queued = sample(a, "from_queued_s").values
    if not dagstest:
        rows.append(vs("from the first queuing to the end", "from_queued_s", b_value="total_s"))
    fig.tables.append(table(rows))
    what = "`airflow dags test`, start to exit" if dagstest else f"{name[3:]}, the task's start to its end"
    closing = "see the stages: Ray Train's processes and Ray's job starting on 2 shared cores"
    if dagstest:
        floor_s = median([f["total_s"] for f in raw.get("floor", [])])
        closing = f"`airflow dags test` of a task of Airflow's own that does nothing takes {fmt(floor_s)} s here"
    for goal, row in (
        (f"a training task's excess over horovodrun on the same hosts, same work ({what})", rows[0]),
        (f"the same, outside the work itself (each way's wall less its own steps; {what})", rows[3]),
    ):
        excess = row.a.median - row.b.median
        detail = f"{fmt(excess)} s ({fmt(row.a.median)} s against {fmt(row.b.median)} s, medians of {row.a.n})"
        if queued and row is rows[0]:
            detail += f"; from the first queuing {fmt(median(queued) - row.b.median)} s"
        fig.targets.append(target(f"10. {goal}: at most 10 s", excess, TARGET_S, detail, closing, unit=" s"))


def stage_table(raws: dict[str, dict]) -> str:
    rows = []

    def add(label: str, stage: str, values: list[float], bold: bool = False) -> None:
        value = f"**{fmt(median(values))}**" if bold else fmt(median(values))
        rows.append([label, f"**{stage}**" if bold else stage, value, f"{fmt(min(values))}-{fmt(max(values))}"])

    for way, raw in raws.items():
        for label, runs in ((WAYS[way], raw["a"]), (f"B (beside {WAYS[way]})", raw["horovodrun"])):
            for name in runs[0]["stages"]:
                add(label, name, [r["stages"][name] for r in runs])
            add(label, "total", [r["total_s"] for r in runs], bold=True)
        for key, what in (("total_s", "total"), ("from_queued_s", "from its first queuing")):
            if values := [f[key] for f in raw.get("floor", []) if f.get(key) is not None]:
                add(f"Airflow alone, {WAYS[way][3:]}", f"a task of Airflow's own that does nothing: {what}", values)
    return plain_table(["way", "stage", "median (s)", "min-max (s)"], rows)


def before_after(before: dict[str, dict], after: dict[str, dict]) -> str:
    """Each way's stages, medians, before (``BENCH_FIXEDCOST_BEFORE``: raw data of an earlier code) and now."""

    def medians(raw: dict) -> dict[str, float]:
        a, b = raw["a"], raw["horovodrun"]
        found = {name: median([r["stages"][name] for r in a if name in r["stages"]]) for name in a[0]["stages"]}
        totals = (sample(a, "total_s").median, sample(b, "total_s").median)
        return {
            **found,
            "**total A**": totals[0],
            "B (horovodrun)": totals[1],
            "**excess**": totals[0] - totals[1],
            "**excess outside the work**": sample(a, outside_work).median - sample(b, outside_work).median,
        }

    rows = []
    for way in after:
        if way in before:
            old, new = medians(before[way]), medians(after[way])
            rows += [[WAYS[way], name, fmt(old.get(name)), fmt(value)] for name, value in new.items()]

    def code(raws: dict[str, dict]) -> str:
        return ", ".join(sorted({r.get("commit", "?") for r in raws.values()}))

    return plain_table(["way", "stage (medians, s)", f"before ({code(before)})", f"after ({code(after)})"], rows)


def cpu_table(raws: dict[str, dict]) -> str:
    columns = []
    for way, raw in raws.items():
        columns += [(f"{WAYS[way]}: CPU-s", raw["a"]), ("B beside it: CPU-s", raw["horovodrun"])]
    kinds = {kind for _, runs in columns for r in runs for kind in r["cpu"]}
    cells = {kind: [median([r["cpu"].get(kind, 0.0) for r in runs]) for _, runs in columns] for kind in kinds}
    order = sorted(kinds, key=lambda k: -sum(cells[k]))[:16]
    header = ["process (by kind), medians"] + [c for c, _ in columns]
    return plain_table(header, [[k] + [fmt(c) for c in cells[k]] for k in order])


def conditions_table(raws: dict[str, dict]) -> str:
    """The machine while each way ran: when, which code, the load, what else ran, how noisy B's steps were."""
    rows = []
    for way, raw in raws.items():
        work_b = [work(r) for r in raw["horovodrun"]]
        others = [sum(r["cpu"].get(k, 0.0) for k in OTHER_WORK) for r in raw["a"] + raw["horovodrun"]]
        began, ended = (time.strftime("%Y-%m-%d %H:%M", time.gmtime(raw[k])) for k in ("started_at", "ended_at"))
        load = " / ".join(", ".join(f"{x:.1f}" for x in raw[k]) for k in ("load_start", "load_end"))
        row = [WAYS[way], f"{began}-{ended[11:]}", raw["commit"], raw.get("bytecode", "-"), load]
        rows.append(row + [fmt(max(others or [0.0])), f"{fmt(min(work_b))}-{fmt(max(work_b))}"])
    header = ["way (against B)", "measured (UTC)", "code", "bytecode", "load average, start / end"]
    return plain_table(header + ["others' CPU-s per run, at most", f"B's {WORK['steps']} steps (s)"], rows)
