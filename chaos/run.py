"""`make chaos`: faults at random, under load, on a deployment as users run one; what survives.

    CHAOS_MINUTES=20 CHAOS_SEED=1234 python -m chaos     # root: it makes network namespaces

For ``CHAOS_MINUTES`` (20) from ``CHAOS_SEED`` (drawn and printed when not given): the deployment of
chaos/deployment.py (Airflow's four components with the LocalExecutor on PostgreSQL, a Ray head with
token auth and a second Ray host in network namespaces, S3 on moto), the workload of chaos/dags
(daily retraining runs and a backfill, mapped ``@task.horovod`` sweeps, ``@task.ray`` evaluations, an
elastic training; deferred and not), asked for on the schedule the seed gives, while the injector
(chaos/faults.py) does the faults the seed gives. Then no more faults, everything mended, and
the runs drain; the invariants of chaos/checks.py are checked and counted.

Writes ``bench/out/chaos.json`` (the raw counts: ``seed``, ``runs``, ``faults`` by kind, ``violations``
by invariant, retries by class, worker-seconds lost to faults; with what was seen, in
``bench/out/chaos/``) and the figure's block in ``bench/results.md``, beside the benchmarks' figures. Exits
1 when an invariant was violated.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path

from chaos import checks, schedule
from chaos.deployment import Deployment
from chaos.faults import Injector
from chaos.observe import POLL_S, Observer, collect, ti_key

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "out"
RESULTS = REPO / "bench" / "results.md"
HEADING = "## Chaos: faults at random, under load (`make chaos`)"
# Each deployment's figure: its block in bench/results.md, and the heading a new block goes under.
FIGURES = {
    "single": ("chaos", HEADING),
    "spread": (
        "chaos-spread",
        "## Chaos over hosts: partitions, lossy links, restarts (`CHAOS_DEPLOYMENT=spread make chaos`)",
    ),
}
DRAIN_MARGIN_S = 120.0
RETRY_DELAY_S = 10.0  # the workload's tasks' retry_delay (chaos/dags)
TRAININGS = {("chaos_retraining", "train"), ("chaos_sweep", "train"), ("chaos_elastic", "train")}


def fresh_folder(folder: Path) -> Path:
    """The run's folder, emptied: every run asks for the same DAG runs (the same run ids, so the same Ray
    submission ids on its empty bucket), and Airflow appends a try's log to a file an earlier run left."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


def say(message: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {message}", flush=True)


def make_deployment(name: str, out: Path) -> Deployment:
    """The deployment ``CHAOS_DEPLOYMENT`` names: ``single`` (the default) or ``spread``."""
    if name == "single":
        return Deployment(out)
    if name == "spread":
        from chaos.spread import SpreadDeployment

        return SpreadDeployment(out)
    raise SystemExit(f"CHAOS_DEPLOYMENT={name!r}: one of {sorted(schedule.DEPLOYMENTS)}")


def main() -> int:
    # A run stopped with SIGTERM still removes its deployment (PostgreSQL and Redis run outside the hosts).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    seed = int(os.environ.get("CHAOS_SEED") or schedule.draw_seed())
    minutes = float(os.environ.get("CHAOS_MINUTES") or 20)
    kind = os.environ.get("CHAOS_DEPLOYMENT") or "single"
    if kind not in schedule.DEPLOYMENTS:
        raise SystemExit(f"CHAOS_DEPLOYMENT={kind!r}: one of {sorted(schedule.DEPLOYMENTS)}")
    say(f"seed {seed} (CHAOS_SEED={seed} repeats this schedule), {minutes:g} minutes, the {kind} deployment")
    faults = schedule.fault_schedule(seed, minutes, kinds=schedule.DEPLOYMENTS[kind])
    workload = schedule.workload_schedule(seed, minutes, pace=schedule.PACE[kind])
    out = fresh_folder(OUT / "chaos")
    (out / "schedule.json").write_text(
        json.dumps({"faults": [f.to_dict() for f in faults], "workload": [r.to_dict() for r in workload]}, indent=1)
    )
    for name in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        os.environ.pop(name, None)  # Airflow reaches S3 through its connection only
    deployment = make_deployment(kind, out / "deployment")
    started_wall = time.time()
    try:
        say(f"starting the {kind} deployment (hosts, Ray, S3, PostgreSQL, Airflow)")
        deployment.up()
        stack = deployment.stack
        assert stack is not None
        for dag_id in schedule.WORKLOAD_DAGS:
            stack.wait_for_dag(dag_id)
        observer = Observer(deployment)
        injector = Injector(deployment, observer, faults, say)
        observer.start()
        injector.start()
        asked = ask_for_runs(deployment, observer, workload, minutes)
        say("the faults end; mending what they left")
        injector.stop()
        mend(deployment)
        say("draining: every DAG run to its end")
        drained = drain(deployment)
        observer.stop()
        say("collecting what Airflow, Ray and S3 hold")
        collected = collect(deployment, observer, schedule.WORKLOAD_DAGS)
        loads = load_checkpoints(deployment, collected)
        collected["recovery_s"] = deployment.recovery_s()
        collected["stalls"] = checks.triggerer_stalls(stack.log_tail("triggerer", chars=10**9), observer.started_wall)
        # Kept before the checks read it: a run's data outlives a check that fails on it.
        (out / "observed.json").write_text(
            json.dumps({**observer.to_dict(), **collected, "faults": injector.done, "loads": loads}, default=str)
        )
        report = assess(
            seed, minutes, deployment, observer, injector, collected, loads, asked, drained, time.time() - started_wall
        )
    finally:
        say("removing the deployment")
        deployment.down()
    (OUT / "chaos.json").write_text(json.dumps(report, indent=1, default=str))
    write_figure(report)
    violations = sum(len(v) for v in report["violations"].values())
    say(f"{violations} violation(s); bench/out/chaos.json, the figure in bench/results.md")
    return 1 if violations else 0


def ask_for_runs(deployment: Deployment, observer: Observer, workload: list[schedule.Request], minutes: float) -> list:
    """The workload's DAG runs, each at its second; returns what was asked and Airflow's answer."""
    stack = deployment.stack
    assert stack is not None
    asked = []
    for request in workload:
        time.sleep(max(0.0, request.at_s - observer.now()))
        entry = {**request.to_dict(), "asked_s": observer.now()}
        try:
            if request.backfill_days:
                day = datetime.fromisoformat(request.day or "").replace(tzinfo=timezone.utc)
                answer = stack.api(
                    "POST",
                    "/backfills",
                    json={
                        "dag_id": request.dag_id,
                        "from_date": (day - timedelta(days=request.backfill_days)).isoformat(),
                        "to_date": (day - timedelta(days=1)).isoformat(),
                        "max_active_runs": 1,
                        "reprocess_behavior": "none",
                    },
                )
                entry["backfill_id"] = answer.get("id")
            else:
                body = {"logical_date": f"{request.day}T00:00:00Z" if request.day else None, "conf": {}}
                entry["run_id"] = stack.api("POST", f"/dags/{request.dag_id}/dagRuns", json=body)["dag_run_id"]
        except Exception as err:  # noqa: BLE001 - Airflow may be restarting: the request is reported as refused
            entry["refused"] = f"{type(err).__name__}: {err}"
        answer = entry.get("run_id") or entry.get("backfill_id") or entry.get("refused")
        say(f"asked for {request.dag_id} {request.day or ''}: {answer}")
        asked.append(entry)
    time.sleep(max(0.0, minutes * 60 - observer.now()))
    return asked


def mend(deployment: Deployment) -> None:
    """After the last fault: S3 up, both Ray nodes alive, every Airflow component running."""
    stack = deployment.stack
    assert stack is not None and deployment.gate is not None
    for mended in deployment.mend_extras():
        say(f"mended: {mended}")
    if not deployment.gate.is_open:
        deployment.s3_up()
    if len(deployment.hosts.alive_nodes()) < 2:
        deployment.hosts.wait_for_nodes(2, timeout=120)
    for name, process in list(stack.processes.items()):
        if process.poll() is not None:
            say(f"{name} had ended ({process.returncode}): started again")
            stack.launch(name)


def drain(deployment: Deployment) -> dict:
    """Wait until every DAG run ended, or until each unended one is past its own timeout (dagrun_timeout)
    and a margin: then it is stuck, and the checks say so."""
    stack = deployment.stack
    assert stack is not None
    timeouts = {dag_id: dag_timeout(stack, dag_id) for dag_id in schedule.WORKLOAD_DAGS}
    started = time.monotonic()
    while True:
        unended = []
        for dag_id in schedule.WORKLOAD_DAGS:
            try:
                runs = stack.api("GET", f"/dags/{dag_id}/dagRuns", params={"limit": 1000})["dag_runs"]
            except Exception:  # noqa: BLE001 - the api-server restarting
                runs = [{"state": "unknown", "start_date": None, "dag_run_id": "?"}]
            unended += [(dag_id, run) for run in runs if run.get("state") not in checks.TERMINAL_RUN]
        if not unended:
            return {"drain_s": round(time.monotonic() - started, 1), "stuck": [], "timeouts_s": timeouts}
        now = datetime.now(timezone.utc)
        overdue = [
            (dag_id, run)
            for dag_id, run in unended
            if run.get("start_date")
            and now - checks.when(run["start_date"]) > timedelta(seconds=timeouts[dag_id] + DRAIN_MARGIN_S)
        ]
        if len(overdue) == len(unended):
            stuck = [r["dag_run_id"] for _, r in overdue]
            return {"drain_s": round(time.monotonic() - started, 1), "stuck": stuck, "timeouts_s": timeouts}
        time.sleep(10)


def dag_timeout(stack, dag_id: str) -> float:
    """The DAG's ``dagrun_timeout`` in seconds, as the REST API gives it (ISO 8601: ``PT25M``)."""
    text = stack.api("GET", f"/dags/{dag_id}/details").get("dag_run_timeout") or ""
    found = re.fullmatch(r"P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:([\d.]+)S)?)?", str(text))
    if not found or not any(found.groups()):
        raise RuntimeError(f"{dag_id} has no dagrun_timeout the drain can wait for: {text!r}")
    days, hours, minutes, seconds = (float(g or 0) for g in found.groups())
    return days * 86400 + hours * 3600 + minutes * 60 + seconds


# --- checkpoints ---------------------------------------------------------------------------------

LOAD_SCRIPT = """
import json, os, sys, tempfile
import pyarrow.fs, torch
results = {}
for uri in json.loads(sys.argv[1]):
    try:
        fs, path = pyarrow.fs.FileSystem.from_uri(uri)
        with tempfile.TemporaryDirectory() as folder:
            pyarrow.fs.copy_files(path, folder, source_filesystem=fs)
            models = [os.path.join(r, n) for r, _, names in os.walk(folder) for n in names if n.endswith(".pt")]
            if not models:
                raise FileNotFoundError(f"no model file in {sorted(os.listdir(folder))}")
            for model in models:
                torch.load(model)
        results[uri] = None
    except Exception as err:
        results[uri] = f"{type(err).__name__}: {err}"
print("LOADS " + json.dumps(results))
"""


def load_checkpoints(deployment: Deployment, collected: dict) -> dict[str, str | None]:
    """Each successful training's checkpoint, downloaded and its model loaded with torch, in the
    cluster's environment (as an evaluation would): uri -> None, or why it does not load."""
    from harness.cluster import cluster_python

    uris = sorted(
        {
            result["checkpoint_uri"]
            for key, values in collected["xcoms"].items()
            if isinstance(result := values.get("return_value"), dict) and result.get("checkpoint_uri")
        }
    )
    if not uris:
        return {}
    done = subprocess.run(
        [cluster_python(), "-c", LOAD_SCRIPT, json.dumps(uris)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **deployment.s3_env()},
    )
    for line in done.stdout.splitlines():
        if line.startswith("LOADS "):
            return json.loads(line[len("LOADS ") :])
    return {uri: f"the load script failed: {done.stderr[-500:]}" for uri in uris}


# --- the report ------------------------------------------------------------------------------------


def assess(seed, minutes, deployment, observer, injector, collected, loads, asked, drained, took_s) -> dict:
    tis, xcoms, logs = collected["tis"], collected["xcoms"], collected["logs"]
    jobs = observer.to_dict()["jobs"]
    lost_jobs = [
        {**job, "status": "FAILED", "lost_with_head": True}
        for job in jobs
        if job["head_epoch"] < collected["head_epoch"] and job.get("status") not in checks.TERMINAL_JOB
    ]
    lost = {(job["head_epoch"], job["submission_id"]) for job in lost_jobs}
    # Every attempt as it ended: those of a replaced head that had not ended, lost with it.
    attempt_jobs = [job for job in jobs if (job["head_epoch"], job["submission_id"]) not in lost] + lost_jobs
    promoted = [
        values["return_value"]
        for key, values in xcoms.items()
        if key.startswith("chaos_retraining/promote/") and isinstance(values.get("return_value"), dict)
    ]
    places: dict = {}
    for key, tries in logs.items():
        for number, records in enumerate(tries, 1):
            places[f"the task log of {key} try {number}"] = records
    for key, values in xcoms.items():
        places[f"the XComs of {key}"] = values
    for job in jobs:
        places[f"the job info of {job['submission_id']} (head {job['head_epoch']})"] = job
    for sid, text in collected["job_logs"].items():
        places[f"the job log of {sid}"] = text
    spans = checks.state_spans(observer.ti_polls)
    start_s = checks.start_time_s(spans)
    # A stay is stuck past the time Airflow itself gives the state before it recovers the task, plus a
    # start measured in this run (a queued task's wait for its process), plus two polls of the observer.
    settle_s = (start_s if start_s is not None else 60.0) + 2 * POLL_S
    bounds = {state: collected["recovery_s"][state] + settle_s for state in checks.STUCK_STATES}
    heals = [entry["ended_s"] for entry in injector.done if "ended_s" in entry and "skipped" not in entry]
    longest_stuck, stuck = checks.stuck_after_heal(spans, jobs, heals, bounds)
    partition_retries, unjudged = checks.partition_retries(injector.done, observer.ti_tries, RETRY_DELAY_S + settle_s)
    violations = {
        "unstuck_after_heal": stuck,
        "partition_costs_no_retry": partition_retries,
        "runs_ended": checks.runs_ended(collected["runs"], tis, logs, injector.marked_failed, drained["timeouts_s"])
        + [f"{run} still running past its timeout" for run in drained["stuck"]],
        "checkpoints_load": checks.checkpoints_load(tis, xcoms, loads),
        "no_orphan_jobs": checks.no_orphan_jobs(
            jobs, observer.job_polls, observer.ti_polls, collected["jobs_now"], stalls=collected.get("stalls")
        ),
        "one_job_per_attempt": checks.one_job_per_attempt(jobs, observer.job_polls),
        "log_lines_once": checks.log_lines_once(tis, xcoms, logs, collected["job_logs"], collected["jobs_now"]),
        "champion_log": checks.champion_log(observer.champion, promoted),
        "failed_attempt_records": checks.failed_attempt_records(attempt_jobs, collected["records"]),
        "no_secrets": checks.no_secrets(deployment.secrets(), places),
    }
    runs = Counter(f"{run['dag_id']} {run['state']}" for run in collected["runs"])
    trainings = [ti for ti in tis if (ti["dag_id"], ti["task_id"]) in TRAININGS]
    return {
        "seed": seed,
        "minutes": minutes,
        "deployment": deployment.name,
        "executor": deployment.executor,
        "hosts": deployment.host_roles(),
        "took_s": round(took_s),
        "drain_s": drained["drain_s"],
        "runs": {
            "total": len(collected["runs"]),
            "by_dag_and_state": dict(sorted(runs.items())),
            "asked": len(asked),
            "refused": sum(1 for a in asked if "refused" in a),
            "timed_out": sum(
                1 for run in collected["runs"] if checks.timed_out(run, drained["timeouts_s"].get(run["dag_id"]))
            ),
            "trainings": len(trainings),
            "trainings_succeeded": sum(1 for ti in trainings if ti.get("state") == "success"),
            "ray_jobs": len(jobs),
        },
        "faults": fault_counts(injector.done, schedule.DEPLOYMENTS[deployment.name]),
        "violations": {name: violations[name] for name in checks.INVARIANTS},
        "violation_counts": {name: len(violations[name]) for name in checks.INVARIANTS},
        "retries": {
            "failed_attempts_by_class": checks.failed_attempts_by_class(collected["records"]),
            "airflow_task_retries": sum(max(0, int(ti.get("try_number") or 0) - 1) for ti in tis),
            "marked_failed_by_injector": len(injector.marked_failed),
        },
        "worker_seconds_lost": checks.lost_worker_seconds(collected["records"]),
        "components_restarted": deployment.restarted,
        "after_heal": {
            "longest_stuck_s": longest_stuck,
            "bounds_s": {state: round(b, 1) for state, b in bounds.items()},
            "start_s": start_s,
            "partition_retries": len(partition_retries),
            "partitions_not_judged": unjudged,
        },
        "fault_log": injector.done,
        "asked": asked,
        "observer_errors": observer.errors[:50],
        "ti_states": dict(Counter(ti.get("state") for ti in tis)),
        "failed_tis": sorted(
            ti_key(ti["dag_id"], ti["task_id"], ti["dag_run_id"], ti.get("map_index"))
            for ti in tis
            if ti.get("state") == "failed"
        ),
    }


def fault_counts(done: list[dict], kinds: tuple[str, ...]) -> dict:
    counts: dict[str, dict[str, int]] = {kind: {"done": 0, "no_target": 0, "error": 0} for kind in kinds}
    for entry in done:
        outcome = "error" if "error" in entry else "no_target" if "skipped" in entry else "done"
        counts[entry["kind"]][outcome] += 1
    return counts


def write_figure(report: dict) -> None:
    """The figure's measured block in bench/results.md; the text around it is people's, and stays."""
    from bench.markdown import put_measured

    text = RESULTS.read_text() if RESULTS.exists() else "# Benchmarks: results\n"
    block, heading = FIGURES[report.get("deployment", "single")]
    RESULTS.write_text(put_measured(text, block, figure_markdown(report), heading))


def figure_markdown(report: dict) -> str:
    from bench.markdown import plain_table

    runs = report["runs"]
    faults = report["faults"]
    fault_rows = [[kind, str(c["done"]), str(c["no_target"]), str(c["error"])] for kind, c in faults.items()]
    violation_rows = [
        [name, str(len(found)), "; ".join(found[:3])[:300] or "-"] for name, found in report["violations"].items()
    ]
    retries = report["retries"]
    class_rows = [[cls, str(n)] for cls, n in sorted(retries["failed_attempts_by_class"].items())] or [["-", "0"]]
    total = sum(len(v) for v in report["violations"].values())
    lines = [
        f"Seed **{report['seed']}** (`CHAOS_SEED={report['seed']} make chaos` repeats the schedule), "
        f"{report['minutes']:g} minutes of faults and workload, then {report['drain_s']:.0f} s to drain; "
        f"the run took {report['took_s']} s in all.",
        "",
        f"**{total} violation(s)** of the invariants. {runs['total']} DAG runs "
        f"({', '.join(f'{k}: {v}' for k, v in runs['by_dag_and_state'].items())}); {runs['trainings']} training "
        f"tasks, {runs['trainings_succeeded']} succeeded; {runs['ray_jobs']} Ray jobs. "
        f"{runs.get('timed_out', 0)} of the runs failed at their `dagrun_timeout` (Airflow's `timed_out`).",
        "",
        plain_table(["fault", "done", "nothing to hit", "could not be done"], fault_rows),
        "",
        plain_table(["invariant", "violations", "first ones"], violation_rows),
        "",
        plain_table(["failed attempts by class", "count"], class_rows),
        "",
        f"- Airflow task retries: {retries['airflow_task_retries']}; task instances marked failed by the "
        f"injector: {retries['marked_failed_by_injector']}.",
        f"- Worker-seconds lost to faults (failed attempts' workers): {report['worker_seconds_lost']:.0f}.",
    ]
    if "after_heal" in report:
        heal = report["after_heal"]
        lines += [
            f"- The longest a task stayed queued, running or deferred, with nothing to wait for, after a fault "
            f"healed: {heal['longest_stuck_s']:.0f} s (bounds: "
            f"{', '.join(f'{state} {b:.0f} s' for state, b in heal['bounds_s'].items())}).",
            f"- Retries partitions cost: {heal['partition_retries']} ({heal['partitions_not_judged']} partition(s) "
            "overlapped by another fault, not judged).",
        ]
    if report.get("components_restarted"):
        restarted = Counter(entry["component"] for entry in report["components_restarted"])
        lines.append(
            "- Airflow components that exited on their own and the service manager started again: "
            + ", ".join(f"{name} {count}x" for name, count in sorted(restarted.items()))
            + "."
        )
    if "hosts" in report:
        lines.insert(
            1,
            f"\nThe {report['deployment']} deployment ({report['executor']}): "
            + "; ".join(f"{host}: {role}" for host, role in report["hosts"].items())
            + ".",
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
