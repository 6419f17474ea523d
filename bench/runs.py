"""Figures 1, 2 and 6 from one set of training runs: every way of ``WAYS`` once per repeat, in a rotating order,
so the machine's drifting load falls on all of them alike."""

from __future__ import annotations

import json
import sqlite3
import time

from bench.common import AIRFLOW_HOME, OUT, PY, dags_test, epoch, log, operator_times, run_logged, save_raw
from bench.markdown import Figure, Row, Sample, fmt, sample, table, target
from bench.submit_script import SUBMIT_TAG
from bench.train_script import RESULT_TAG
from harness.airflow_cli import tagged_json
from harness.tasks import jobs_of

# direct, ddp_direct: bench.train_script as a driver on the cluster (HorovodTrainer, TorchTrainer); plain_job: the
# same as a Ray job (bench.submit_script); operator_*: under `airflow dags test` (legacy: HorovodTrainer).
WAYS = ("direct", "plain_job", "operator_sync", "operator_deferred", "operator_deferred_v2", "ddp_direct")
DAG_IDS = {
    "operator_sync": "bench_train_sync_legacy",
    "operator_deferred": "bench_train_deferred_legacy",
    "operator_deferred_v2": "bench_train_deferred_v2",
}
TIMINGS_FILE = OUT / "operator-timings.jsonl"


def task_times(dag_id: str, run_id: str) -> tuple[float | None, float | None]:
    query = "select start_date, end_date from task_instance where dag_id=? and run_id=? and task_id='train'"
    with sqlite3.connect(AIRFLOW_HOME / "airflow.db") as db:
        start, end = db.execute(query, (dag_id, run_id)).fetchone()
    return epoch(start), epoch(end)


def job_info(hook, submission_id: str, tag: str) -> tuple[dict, dict]:
    """The job's start, end and status as Ray records them; and the result its log prints, ``tag``-ed."""
    info = hook.get_job_info(submission_id) or {}
    (result,) = tagged_json(hook.get_job_logs(submission_id), tag)
    start, end = (info.get("start_time") or 0) / 1000 or None, (info.get("end_time") or 0) / 1000 or None
    return {"job_start": start, "job_end": end, "job_status": info.get("status")}, result


def script(module: str, trainer: str, name: str, config: str, *extra: str, env=None):
    cmd = [PY, "-m", module, "--trainer", trainer, "--storage", str(OUT / "storage"), "--name", name]
    return run_logged([*cmd, "--config", config, *extra], f"{name}.log", env=env)


def run_direct(trainer: str, name: str, config: str, ray_env: dict) -> dict:
    run, wall = script("bench.train_script", trainer, name, config, "--direct", env=ray_env)
    (result,) = tagged_json(run.stdout, RESULT_TAG)
    return {"process_wall_s": wall, "wall_s": wall, "steps_per_s": result["metrics"].get("steps_per_s")}


def run_plain_job(hook, name: str, config: str) -> dict:
    run, wall = script("bench.submit_script", "horovod", name, config)
    (submit,) = tagged_json(run.stdout, SUBMIT_TAG)
    info, result = job_info(hook, submit["submission_id"], RESULT_TAG)
    found = {"process_wall_s": wall, "wall_s": submit["submit_to_done_s"], **info}
    found["latency_s"] = submit["done_at"] - info["job_end"]
    return {**found, "steps_per_s": result["metrics"].get("steps_per_s")}


def run_operator(hook, way: str, name: str, config: str) -> dict:
    dag_id = DAG_IDS[way]
    env = {"BENCH_TIMINGS_FILE": str(TIMINGS_FILE), "BENCH_TRAIN_CONFIG": config}
    _, wall = dags_test(dag_id, f"{name}.log", env=env)
    run_id, start, done = operator_times(TIMINGS_FILE, dag_id)
    task_start, task_end = task_times(dag_id, run_id)
    (job,) = jobs_of(hook, run_id, dag_id)
    info, record = job_info(hook, job["submission_id"], "AHP_RESULT")
    found = {"process_wall_s": wall, "wall_s": done - start, "task_s": task_end - task_start, **info}
    found.update(latency_s=task_end - info["job_end"], result_latency_s=done - info["job_end"])
    return {**found, "steps_per_s": record["metrics"].get("steps_per_s"), "submission_id": job["submission_id"]}


def training_runs(repeats: int, config: dict, ray_env: dict) -> list[dict]:
    """Run every way ``repeats`` times; one record per run, kept in bench/out/training_runs.json."""
    from airflow_provider_horovod.hooks.ray import RayHook

    hook = RayHook()
    text = json.dumps(config)
    records = []
    for rep in range(repeats):
        for way in WAYS[rep % len(WAYS) :] + WAYS[: rep % len(WAYS)]:
            name = f"{way}-{rep}-{int(time.time())}"
            log(f"training run {way} (repeat {rep + 1}/{repeats})")
            if way in ("direct", "ddp_direct"):
                record = run_direct("horovod" if way == "direct" else "torch", name, text, ray_env)
            else:
                record = run_plain_job(hook, name, text) if way == "plain_job" else run_operator(hook, way, name, text)
            records.append({"way": way, "repeat": rep, **record})
            log(f"  {way}: wall {record['wall_s']:.1f} s, steps/s {record.get('steps_per_s')}")
    save_raw("training_runs", records)
    return records


OVERHEAD_TARGET = 1.05
# Issue 27: the time outside the job, deferred too, no more than a hand-written script's.
OUTSIDE_TARGET = 1.0
LATENCY_TARGET_S = 0.5
HANDWRITTEN_DAG = "bench_handwritten_poll"
STEPS_TARGET = 0.98
DIRECT = "direct HorovodTrainer"


def of(records: list[dict], value, *ways: str) -> Sample:
    return sample([r for r in records if r["way"] in ways], value)


def job_s(r: dict) -> float | None:
    """The Ray job alone, as Ray records it."""
    return r["job_end"] - r["job_start"] if r.get("job_end") and r.get("job_start") else None


def outside_s(r: dict) -> float | None:
    return None if job_s(r) is None else r["wall_s"] - job_s(r)


def overhead_figure(records: list[dict], runs_s: float) -> Figure:
    """Figure 1; ``runs_s``: how long the runs of figures 1, 2 and 6 took, the figure's time."""

    def vs(what: str, a: str, value, note: str, b: str = "plain_job", b_value=None) -> Row:
        a_sample, b_sample = of(records, value, a), of(records, b_value or value, b)
        return Row(what, a.replace("_", " "), a_sample, b.replace("_", " "), b_sample, "s", note)

    what, ok, out = "operator wall vs plain job wall", "target A/B <= 1.05", "wall - job runtime"
    deferred, jobs_api = "operator_deferred", "what the Jobs API costs against a driver on the cluster"
    rows = [
        vs(what, deferred, "wall_s", ok),
        vs(what, "operator_sync", "wall_s", ok),
        vs(what, "operator_deferred_v2", "wall_s", "default trainer: Train V2 starts more actors"),
        vs("outside the Ray job", deferred, outside_s, out),
        vs("outside the Ray job", "operator_sync", outside_s, out),
        vs("Ray job runtime", deferred, job_s, "the job alone, as Ray records it"),
        vs("task vs plain job wall", deferred, "task_s", "Airflow task start-up included", b_value="wall_s"),
        vs("process", deferred, "process_wall_s", "`airflow dags test` vs `python submit_script`"),
        vs("process", "plain_job", "process_wall_s", jobs_api, "direct"),
    ]
    fig = Figure(1, tables=[table(rows)], seconds=runs_s)
    fig.notes.append(f"The training runs behind figures 1, 2 and 6 took {runs_s / 60:.1f} min together.")
    plain_out = rows[3].b.median
    for row, out in ((rows[0], rows[3].a.median), (rows[1], rows[4].a.median)):
        detail = f"A/B = {fmt(row.ratio)} (target <= {OVERHEAD_TARGET}); time outside the job {fmt(out)} s against "
        detail += f"the plain job's {fmt(plain_out)} s"
        closing = f"outside the job, ours adds {fmt(out - plain_out)} s over the plain job's {fmt(plain_out)} s; the "
        closing += f"Ray job itself ran {fmt(rows[5].ratio)}x as long as the plain job's (load, not orchestration)"
        name = f"1. {row.a_label}: wall within 5% of the plain Ray job's"
        fig.targets.append(target(name, row.ratio, OVERHEAD_TARGET, detail, closing))
    for row in rows[3:5]:
        detail = f"A/B = {fmt(row.ratio)} ({fmt(row.a.median)} s against {fmt(row.b.median)} s; "
        detail += f"target <= {OUTSIDE_TARGET:g})"
        name = f"1. {row.a_label}: time outside the Ray job at most the plain script's"
        closing = "see figure 2: the job's end seen sooner, and the submission's own requests"
        fig.targets.append(target(name, row.ratio, OUTSIDE_TARGET, detail, closing))
    return fig


def handwritten_runs(intervals: list[float], repeats: int) -> list[dict]:
    """Figure 2's other side: ``bench_handwritten_poll``, ``repeats`` jobs at each interval; a record per job."""
    from airflow_provider_horovod.hooks.ray import RayHook

    env = {"BENCH_LATENCY_REPEATS": str(repeats), "BENCH_LATENCY_INTERVALS": ",".join(f"{i:g}" for i in intervals)}
    log(f"hand-written polling: {repeats} jobs at each of {intervals} s under airflow dags test")
    dags_test(HANDWRITTEN_DAG, "handwritten-poll.log", env=env, timeout=1800)
    with sqlite3.connect(AIRFLOW_HOME / "airflow.db") as db:
        query = "select run_id from dag_run where dag_id=? order by id desc limit 1"
        (run_id,) = db.execute(query, (HANDWRITTEN_DAG,)).fetchone()
        query = "select map_index, end_date from task_instance where dag_id=? and run_id=?"
        ends = dict(db.execute(query, (HANDWRITTEN_DAG, run_id)).fetchall())
    records = []
    for job in RayHook().list_jobs():
        meta = job.get("metadata") or {}
        if meta.get("bench") != "handwritten" or meta.get("run_id") != run_id:
            continue
        end, job_end = epoch(ends.get(int(meta["map_index"]))), job["end_time"] / 1000
        interval = float(meta["tag"].split("-")[1].rstrip("s"))
        record = {"interval_s": interval, "tag": meta["tag"], "job_end": job_end, "task_end": end}
        records.append({**record, "latency_s": end - job_end})
    save_raw("handwritten_latency", records)
    return records


def latency_figure(records: list[dict], handwritten: list[dict]) -> Figure:
    """Figure 2: from the Ray job's end to the Airflow task's, ours against the hand-written poller."""

    def hand(interval: float) -> Sample:
        return sample([r for r in handwritten if r["interval_s"] == interval], "latency_s")

    latency = "latency_s"
    deferred, sync = of(records, latency, "operator_deferred"), of(records, latency, "operator_sync")
    v2, plain = of(records, latency, "operator_deferred_v2"), of(records, latency, "plain_job")
    result = of(records, "result_latency_s", "operator_deferred")
    intervals = sorted({r["interval_s"] for r in handwritten})
    first, what, expected = intervals[0], "job end -> task end", "expected for fixed polling: ~interval/2 + task finish"
    ours, sleep = "operator deferred (poll 1 s)", f"PythonOperator, sleep {first:g} s"
    neither = "no Airflow task around either"
    rows = [Row(what, ours, deferred, f"PythonOperator, sleep {i:g} s", hand(i), "s", expected) for i in intervals]
    rows += [
        Row(what, "operator sync (poll 1 s)", sync, sleep, hand(first), "s"),
        Row(what, "operator deferred, Train V2 (poll 1 s)", v2, sleep, hand(first), "s"),
        Row("job end -> result in hand", ours, result, "plain script, poll 1 s", plain, "s", neither),
    ]
    fig = Figure(2, tables=[table(rows)])
    pooled = of(records, latency, "operator_sync", "operator_deferred", "operator_deferred_v2")
    resume_s = deferred.median - sync.median
    for label, got in (("deferred", deferred), ("synchronous", sync), ("all operator runs", pooled)):
        closing = "the poll interval's half plus reading the result record: poll faster near the end"
        if label != "synchronous" and resume_s > 0:
            closing = f"deferred minus sync is {fmt(resume_s)} s: resuming a deferred task starts a new task process"
        name = f"2. completion latency, {label}: median at most {LATENCY_TARGET_S:g} s at the default poll interval"
        detail = f"median {fmt(got.median)} s over {got.n} runs"
        fig.targets.append(target(name, got.median, LATENCY_TARGET_S, detail, closing, unit=" s"))
    return fig


def training_figure(records: list[dict]) -> Figure:
    """Figure 6: steps/s through our operator against Ray's own Horovod path, and Horovod against DDP."""

    def steps(*ways: str) -> Sample:
        return of(records, lambda r: r.get("steps_per_s") or None, *ways)

    def paired(a: str, b: str) -> Sample:
        """A/B within each repeat: the two runs were close in time, so the load they met was similar."""
        got = {(r["way"], r["repeat"]): r.get("steps_per_s") for r in records}
        reps = sorted({r["repeat"] for r in records})
        return Sample([got[a, i] / got[b, i] for i in reps if got.get((a, i)) and got.get((b, i))])

    v2, direct, ddp = steps("operator_deferred_v2"), steps("direct"), steps("ddp_direct")
    legacy, plain = steps("operator_sync", "operator_deferred"), steps("plain_job")
    what, unit, ddp_label = "training steps", "steps/s", "DDP: TorchTrainer, Gloo"
    rows = [
        Row(what, "operator, Train V2 (default)", v2, DIRECT, direct, unit, f"target A/B >= {STEPS_TARGET}"),
        Row(what, "operator, legacy HorovodTrainer", legacy, DIRECT, direct, unit, "same trainer on both sides"),
        Row(what, "plain Ray job, HorovodTrainer", plain, DIRECT, direct, unit, "the noise floor: identical code"),
        Row(what, "Horovod: operator, Train V2", v2, ddp_label, ddp, unit, "Horovod vs DDP"),
        Row(what, "Horovod: direct HorovodTrainer", direct, ddp_label, ddp, unit, "Horovod vs DDP"),
    ]
    fig = Figure(6, tables=[table(rows)])
    pair, pair_ddp = paired("operator_deferred_v2", "direct"), paired("operator_deferred_v2", "ddp_direct")
    fig.notes.append(
        f"Within each repeat (runs next to each other in time): operator V2 / direct has median {fmt(pair.median)} "
        f"({pair.spread()}, {pair.n} repeats); operator V2 / DDP {fmt(pair_ddp.median)} ({pair_ddp.spread()})."
    )
    legacy, floor = rows[1].ratio, rows[2].ratio
    closing = f"same runs: operator legacy / direct = {fmt(legacy)}, plain job / direct = {fmt(floor)} (identical code "
    closing += "and trainer: the noise floor here). " + (
        "The V2 runs are slower than that noise: see what Train V2 runs beside the workers on 2 cores."
        if rows[0].ratio < min(legacy, floor) - 0.05
        else "The gap is within that noise: rerun with BENCH_REPEATS=5 on a quiet machine."
    )
    name = "6. steps/s through our operator at least 0.98 of Ray's own Horovod path run directly"
    detail = f"A/B = {fmt(rows[0].ratio)} (target >= {STEPS_TARGET}); paired within repeats {fmt(pair.median)}"
    fig.targets.append(target(name, rows[0].ratio, STEPS_TARGET, detail, closing, at_most=False))
    return fig
