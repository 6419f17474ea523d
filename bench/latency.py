"""Figure 2: completion latency. From the Ray job reaching a terminal state to the Airflow task
finishing: our operator at its default poll interval against a hand-written PythonOperator polling
at a fixed interval (``bench_handwritten_poll`` in ``bench/dags/bench_dags.py``)."""

from __future__ import annotations

import sqlite3

from bench.common import AIRFLOW_HOME, Figure, Row, Sample, dags_test, fmt, log, table, target
from bench.runs import db_time

TARGET_S = 0.5
DAG_ID = "bench_handwritten_poll"
NEITHER = "no Airflow task around either"


def handwritten_runs(intervals: list[float], repeats: int) -> list[dict]:
    from airflow_provider_horovod.hooks.ray import RayHook

    env = {"BENCH_LATENCY_REPEATS": str(repeats), "BENCH_LATENCY_INTERVALS": ",".join(f"{i:g}" for i in intervals)}
    log(f"hand-written polling: {repeats} jobs at each of {intervals} s under airflow dags test")
    dags_test(DAG_ID, "handwritten-poll.log", env=env, timeout=1800)
    with sqlite3.connect(AIRFLOW_HOME / "airflow.db") as db:
        (run_id,) = db.execute(
            "select run_id from dag_run where dag_id=? order by id desc limit 1", (DAG_ID,)
        ).fetchone()
        query = "select map_index, end_date from task_instance where dag_id=? and run_id=?"
        ends = dict(db.execute(query, (DAG_ID, run_id)).fetchall())
    records = []
    for job in RayHook().list_jobs():
        meta = job.get("metadata") or {}
        if meta.get("bench") != "handwritten" or meta.get("run_id") != run_id:
            continue
        end = db_time(ends.get(int(meta["map_index"])))
        records.append(
            {
                "interval_s": float(meta["tag"].split("-")[1].rstrip("s")),
                "tag": meta["tag"],
                "job_end": job["end_time"] / 1000,
                "task_end": end,
                "latency_s": end - job["end_time"] / 1000,
            }
        )
    return records


def figure(training_records: list[dict], handwritten: list[dict]) -> Figure:
    def ours(way: str) -> Sample:
        return Sample([r["latency_s"] for r in training_records if r["way"] == way and r.get("latency_s") is not None])

    def hand(interval: float) -> Sample:
        return Sample([r["latency_s"] for r in handwritten if r["interval_s"] == interval])

    intervals = sorted({r["interval_s"] for r in handwritten})
    first, what, expected = intervals[0], "job end -> task end", "expected for fixed polling: ~interval/2 + task finish"
    deferred, sync, v2 = ours("operator_deferred"), ours("operator_sync"), ours("operator_deferred_v2")
    result = Sample([r["result_latency_s"] for r in training_records if r["way"] == "operator_deferred"])
    plain = ours("plain_job")
    rows = [
        Row(what, "operator deferred (poll 1 s)", deferred, f"PythonOperator, sleep {i:g} s", hand(i), "s", expected)
        for i in intervals
    ]
    rows += [
        Row(what, "operator sync (poll 1 s)", sync, f"PythonOperator, sleep {first:g} s", hand(first), "s"),
        Row(what, "operator deferred, Train V2 (poll 1 s)", v2, f"PythonOperator, sleep {first:g} s", hand(first), "s"),
        Row(
            "job end -> result in hand",
            "operator deferred (poll 1 s)",
            result,
            "plain script, poll 1 s",
            plain,
            "s",
            NEITHER,
        ),
    ]
    fig = Figure(2, "Completion latency", tables=[table(rows)])
    pooled = Sample(
        [r["latency_s"] for r in training_records if r["way"].startswith("operator") and r.get("latency_s") is not None]
    )
    resume_s = deferred.median - sync.median
    for label, sample in (("deferred", deferred), ("synchronous", sync), ("all operator runs", pooled)):
        closing = "the poll interval's half plus reading the result record: poll faster near the end"
        if label != "synchronous" and resume_s > 0:
            closing = f"deferred minus sync is {fmt(resume_s)} s: resuming a deferred task starts a new task process"
        name = f"2. completion latency, {label}: median at most {TARGET_S:g} s at the default poll interval"
        detail = f"median {fmt(sample.median)} s over {sample.n} runs"
        fig.targets.append(target(name, sample.median, TARGET_S, detail, closing, unit=" s"))
    return fig
