"""`make chaos`'s own parts that need no deployment: its schedule is a pure function of the seed, and
its invariants catch what they are meant to (chaos/schedule.py, chaos/checks.py)."""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

from chaos import checks, schedule

REPO = Path(__file__).resolve().parents[2]


# --- the schedule ------------------------------------------------------------------------------------


def test_the_same_seed_gives_the_same_schedule_in_another_interpreter():
    code = (
        "import json; from chaos import schedule as s; "
        "print(json.dumps([[f.to_dict() for f in s.fault_schedule(77, 20)], "
        "[r.to_dict() for r in s.workload_schedule(77, 20)]]))"
    )
    runs = [
        subprocess.run(
            [sys.executable, "-c", code],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": str(hash_seed), "PATH": ""},
        ).stdout
        for hash_seed in (1, 2)
    ]
    assert runs[0] == runs[1]
    here = [
        [f.to_dict() for f in schedule.fault_schedule(77, 20)],
        [r.to_dict() for r in schedule.workload_schedule(77, 20)],
    ]
    import json

    assert json.loads(runs[0]) == here


def test_another_seed_gives_another_schedule():
    assert schedule.fault_schedule(1, 20) != schedule.fault_schedule(2, 20)
    assert schedule.workload_schedule(1, 20) != schedule.workload_schedule(2, 20)


def test_twenty_minutes_hold_every_kind_of_fault_between_the_quiet_start_and_end():
    faults = schedule.fault_schedule(5, 20)
    assert {f.kind for f in faults} == set(schedule.FAULT_KINDS)
    assert all(90 <= f.at_s <= 20 * 60 - 60 for f in faults)
    assert [f.at_s for f in faults] == sorted(f.at_s for f in faults)
    assert all(0 <= f.pick < 1 for f in faults)
    lasting = [f for f in faults if f.kind in schedule.DURATIONS_S]
    assert all(schedule.DURATIONS_S[f.kind][0] <= f.duration_s <= schedule.DURATIONS_S[f.kind][1] for f in lasting)


def test_the_workload_has_daily_runs_day_after_day_a_backfill_sweeps_and_elastic_trainings():
    requests = schedule.workload_schedule(9, 20)
    days = [r.day for r in requests if r.dag_id == schedule.RETRAINING and not r.backfill_days]
    assert days == sorted(days)
    assert len(set(days)) == len(days) >= 4
    assert [r.backfill_days for r in requests if r.backfill_days] == [3]
    assert {r.dag_id for r in requests} == set(schedule.WORKLOAD_DAGS)
    assert all(r.at_s <= 20 * 60 - 60 for r in requests)


def test_the_spread_deployment_asks_for_runs_at_half_the_pace():
    single = schedule.workload_schedule(9, 60, pace=schedule.PACE["single"])
    spread = schedule.workload_schedule(9, 60, pace=schedule.PACE["spread"])
    assert single == schedule.workload_schedule(9, 60)  # the single deployment's schedules are as they were
    assert len(spread) < 0.7 * len(single)
    assert {r.dag_id for r in spread} == set(schedule.WORKLOAD_DAGS)


def test_a_fault_picks_among_the_candidates_by_its_fraction():
    assert schedule.pick([], 0.5) is None
    assert [schedule.pick(["a", "b", "c"], f) for f in (0.0, 0.34, 0.99)] == ["a", "b", "c"]


# --- the invariants ------------------------------------------------------------------------------------


def ti(dag="chaos_retraining", task="train", run="r1", index=-1, state="success", try_number=1):
    return {
        "dag_id": dag,
        "task_id": task,
        "dag_run_id": run,
        "map_index": index,
        "state": state,
        "try_number": try_number,
    }


def failed_log(exc_type):
    return [[{"event": "Task failed with exception", "error_detail": [{"exc_type": exc_type, "exc_value": "why"}]}]]


def test_runs_that_failed_need_a_failure_class_unless_the_injector_failed_them():
    runs = [
        {"dag_id": "chaos_retraining", "dag_run_id": "r1", "state": "failed"},
        {"dag_id": "chaos_retraining", "dag_run_id": "r2", "state": "failed"},
        {"dag_id": "chaos_retraining", "dag_run_id": "r3", "state": "failed"},
        {"dag_id": "chaos_retraining", "dag_run_id": "r4", "state": "running"},
    ]
    tis = [ti(run="r1", state="failed"), ti(run="r2", state="failed"), ti(run="r3", state="failed")]
    logs = {
        "chaos_retraining/train/r1/-1": failed_log("InfrastructureError"),
        "chaos_retraining/train/r2/-1": failed_log("KeyError"),
        "chaos_retraining/train/r3/-1": failed_log("KeyError"),
    }
    found = checks.runs_ended(runs, tis, logs, marked={"chaos_retraining/train/r3/-1"}, timeouts_s={})
    assert len(found) == 2
    assert "r2" in found[0]
    assert "KeyError" in found[0]
    assert "r4" in found[1]


def test_a_run_failed_at_its_dagrun_timeout_ended_and_one_failed_sooner_without_a_failed_task_did_not():
    def run(run_id, end):
        return {
            "dag_id": "chaos_sweep",
            "dag_run_id": run_id,
            "state": "failed",
            "start_date": "2026-11-30T00:00:00Z",
            "end_date": f"2026-11-30T00:{end}Z",
        }

    runs = [run("r1", "25:01"), run("r2", "12:00")]
    tis = [ti(dag="chaos_sweep", run=r, state="skipped") for r in ("r1", "r2")]
    found = checks.runs_ended(runs, tis, {}, marked=set(), timeouts_s={"chaos_sweep": 25 * 60})
    assert [line.split()[1] for line in found] == ["r2"]
    assert checks.timed_out(runs[0], 25 * 60)
    assert not checks.timed_out(runs[0], None)  # a DAG without a dagrun_timeout


def test_a_users_error_failing_without_retries_has_its_class():
    """``UserCodeFailed`` (and ``ConfigurationFailed``) is how a user's error fails the task for good."""
    runs = [{"dag_id": "chaos_retraining", "dag_run_id": f"r{i}", "state": "failed"} for i in (1, 2)]
    tis = [ti(run="r1", state="failed"), ti(run="r2", state="failed")]
    logs = {
        "chaos_retraining/train/r1/-1": failed_log("UserCodeFailed"),
        "chaos_retraining/train/r2/-1": failed_log("ConfigurationFailed"),
    }
    assert checks.runs_ended(runs, tis, logs, marked=set(), timeouts_s={}) == []


def test_a_task_failed_from_outside_needs_no_failure_class():
    """Marked failed by someone else than the injector (a person, the drain cut short): Airflow stops the
    task, whose code only stops its job (the chaos run: a bare "Task killed" error, or none in a deferred
    task's log). Only that sign in the last try's log excuses the missing class."""
    runs = [{"dag_id": "chaos_retraining", "dag_run_id": r, "state": "failed"} for r in ("r1", "r2", "r3", "r4")]
    tis = [ti(run=r, state="failed") for r in ("r1", "r2", "r3", "r4")]
    killed = {"event": "Task failed with exception", "error_detail": [{"exc_type": "TaskKilledError"}]}
    supervisor = {
        "event": "Server indicated the task shouldn't be running anymore. Terminating process",
        "detail": {"reason": "not_running", "current_state": "failed"},
    }
    logs = {
        "chaos_retraining/train/r1/-1": [[supervisor, killed]],
        "chaos_retraining/train/r2/-1": [[{"event": "Trigger cancelled by user action, invoking on_kill"}]],
        "chaos_retraining/train/r3/-1": [[{**supervisor, "detail": {"current_state": "skipped"}}, killed]],
        "chaos_retraining/train/r4/-1": [[supervisor], [killed]],  # an earlier try's sign excuses nothing
    }
    found = checks.runs_ended(runs, tis, logs, marked=set(), timeouts_s={})
    assert [line.split("/")[2] for line in found] == ["r3", "r4"]


def test_a_job_running_long_after_its_task_ended_is_an_orphan():
    meta = {"airflow_dag_id": "d", "airflow_task_id": "t", "airflow_run_id": "r", "airflow_map_index": "-1"}
    jobs = [{"submission_id": "ahp-d-t-x-a1", "head_epoch": 0, "metadata": meta, "status": "RUNNING"}]
    ti_polls = [(0.0, {"d/t/r/-1": "running"}), (10.0, {"d/t/r/-1": "failed"})]
    job_polls = [(t, 0, [("ahp-d-t-x-a1", "RUNNING")]) for t in (5.0, 20.0, 50.0, 90.0)]
    assert len(checks.no_orphan_jobs(jobs, job_polls, ti_polls, [], grace_s=60)) == 1
    assert checks.no_orphan_jobs(jobs, job_polls[:3], ti_polls, [], grace_s=60) == []
    assert len(checks.no_orphan_jobs(jobs, [], ti_polls, jobs, grace_s=60)) == 1


def test_a_deferred_tasks_job_is_no_orphan_while_the_triggerer_stalled():
    """The soak of seed 1535922735: a deferred task marked failed while a new trigger runner stalled 86 s
    (its start, at a load of 30); its kill reached the trigger after that. A running task gets no excuse."""
    meta = {"airflow_dag_id": "d", "airflow_task_id": "t", "airflow_run_id": "r", "airflow_map_index": "-1"}
    jobs = [{"submission_id": "ahp-d-t-x-a1", "head_epoch": 0, "metadata": meta, "status": "RUNNING"}]
    log = (
        "2026-11-30T14:16:55.796802Z [error    ] TriggerRunner subprocess event loop appears deadlocked\n"
        "2026-11-30T14:16:57.797112Z [info     ] Heartbeat recovered after 86.08 seconds [airflow.jobs.job.Job]\n"
    )
    started = datetime(2026, 11, 30, 14, 15, tzinfo=timezone.utc).timestamp()
    stalls = checks.triggerer_stalls(log, started)
    assert [(round(a, 2), round(b, 2)) for a, b in stalls] == [(31.72, 117.8)]
    job_polls = [(t, 0, [("ahp-d-t-x-a1", "RUNNING")]) for t in (95.0, 120.0, 150.0, 161.0)]
    for before, found in (("deferred", 0), ("running", 1)):
        ti_polls = [(0.0, {"d/t/r/-1": before}), (93.0, {"d/t/r/-1": "failed"})]
        assert len(checks.no_orphan_jobs(jobs, job_polls, ti_polls, [], grace_s=60, stalls=stalls)) == found
    ti_polls = [(0.0, {"d/t/r/-1": "deferred"}), (93.0, {"d/t/r/-1": "failed"})]
    longer = [*job_polls, (190.0, 0, [("ahp-d-t-x-a1", "RUNNING")])]  # 72 s after its kill, less the stall
    (line,) = checks.no_orphan_jobs(jobs, longer, ti_polls, [], grace_s=60, stalls=stalls)
    assert "while the triggerer stalled" in line


def test_two_jobs_of_one_task_run_at_once_or_one_attempt_on_two_heads_are_violations():
    meta = {"airflow_dag_id": "d", "airflow_task_id": "t", "airflow_run_id": "r", "airflow_map_index": "-1"}
    polls = [
        (1.0, 0, [("ahp-d-t-x-a1", "RUNNING")]),
        (4.0, 0, [("ahp-d-t-x-a1", "RUNNING"), ("ahp-d-t-x-a2", "PENDING")]),
    ]
    assert len(checks.one_job_per_attempt([], polls)) == 1
    jobs = [{"submission_id": "ahp-d-t-x-a1", "head_epoch": e, "metadata": meta} for e in (0, 1)]
    assert "submitted 2 times (head epochs [0, 1])" in checks.one_job_per_attempt(jobs, [])[0]
    jobs = [{**job, "start_time": 1000 + job["head_epoch"]} for job in jobs]
    assert len(checks.one_job_per_attempt(jobs, [])) == 1
    # One job (one start time) listed under two epochs, the head replaced around the listing: one job.
    same = [{**job, "start_time": 1000} for job in jobs]
    assert checks.one_job_per_attempt(same, []) == []


def test_the_task_log_must_hold_each_line_of_its_job_once_across_tries():
    tries = [
        [{"event": "Ray job s-a1: http://x"}, {"event": "[ray] one"}, {"event": "[ray] two"}],
        [{"event": "Ray job s-a2: http://x"}, {"event": "[ray] other"}],
        [{"event": "Ray job s-a2: http://x"}, {"event": "[ray] more"}],
    ]
    assert checks.job_lines_in_task_log(tries, "s-a2") == ["other", "more"]
    meta = {"airflow_dag_id": "chaos_retraining", "airflow_task_id": "train", "airflow_run_id": "r1"}
    jobs = [{"submission_id": "s-a2", "metadata": {**meta, "airflow_map_index": "-1"}}]
    tis = [ti()]
    xcoms = {"chaos_retraining/train/r1/-1": {"return_value": {"submission_id": "s-a2", "world_size": 2}}}
    logs = {"chaos_retraining/train/r1/-1": tries}
    assert checks.log_lines_once(tis, xcoms, logs, {"s-a2": "other\nmore\n"}, jobs) == []
    found = checks.log_lines_once(tis, xcoms, logs, {"s-a2": "other\nlost\nmore"}, jobs)
    assert "1 missing" in found[0]
    # A task downstream returning a training's result (the sweep's pick_best) is not that job's task.
    picked = {"chaos_retraining/pick_best/r1/-1": xcoms["chaos_retraining/train/r1/-1"]}
    assert checks.log_lines_once([ti(task="pick_best")], picked, {}, {"s-a2": "other\nmore\n"}, jobs) == []


def test_the_champions_log_may_only_grow_and_only_to_better_scores():
    move1 = {"logical_date": "2026-11-10", "holdout_mse": 0.5, "run_id": "r1", "checkpoint_uri": "c1", "replaces": None}
    move2 = {**move1, "holdout_mse": 0.4, "run_id": "r2", "checkpoint_uri": "c2", "replaces": {"holdout_mse": 0.5}}
    worse = {**move2, "holdout_mse": 0.6, "run_id": "r3", "checkpoint_uri": "c3", "replaces": {"holdout_mse": 0.4}}
    good = [(1.0, {"moves": [move1]}), (2.0, {"moves": [move1, move2]})]
    promoted = [{"promoted": True, "run_id": "r2", "checkpoint_uri": "c2"}]
    assert checks.champion_log(good, promoted) == []
    assert "lost moves" in checks.champion_log([*good, (3.0, {"moves": [move2]})], [])[0]
    assert "worse" in checks.champion_log([*good, (3.0, {"moves": [move1, move2, worse]})], [])[0]
    assert "lacks" in checks.champion_log(good[:1], promoted)[0]


def test_a_failed_attempt_needs_its_record_with_a_class():
    jobs = [
        {"submission_id": f"s-a{n}", "status": "FAILED", "metadata": {"ahp_result_uri": f"s3://b/a{n}/result.json"}}
        for n in (1, 2, 3)
    ]
    records = {"s3://b/a1/result.json": {"failure": {"failure_class": "infrastructure"}}, "s3://b/a2/result.json": {}}
    found = checks.failed_attempt_records(jobs, records)
    assert len(found) == 2
    assert "s-a2" in found[0]
    assert "left no record" in found[1]


def test_an_attempt_lost_with_its_head_needs_its_record_once_a_later_attempt_was_submitted():
    """docs/reliability.md: its record is written by the task's next try, before that try submits the next
    attempt; with no next try there is none."""
    lost = {
        "submission_id": "ahp-d-t-x-a1",
        "status": "FAILED",
        "lost_with_head": True,
        "metadata": {"ahp_result_uri": "s3://b/attempt-1/result.json"},
    }
    assert checks.failed_attempt_records([lost], {}) == []
    later = {"submission_id": "ahp-d-t-x-a2", "status": "SUCCEEDED", "metadata": {}}
    assert "ahp-d-t-x-a1 ended FAILED and left no record" in checks.failed_attempt_records([lost, later], {})[0]
    record = {"s3://b/attempt-1/result.json": {"failure": {"failure_class": "infrastructure"}}}
    assert checks.failed_attempt_records([lost, later], record) == []
    # Its driver had finished before the head went: its own record says it succeeded, and it did.
    finished = {"s3://b/attempt-1/result.json": {"attempt": 1, "failure": None, "return_value": {"mse": 0.1}}}
    assert checks.failed_attempt_records([lost, later], finished) == []
    # A job that Ray saw fail needs the class whatever it wrote.
    assert "has no failure class" in checks.failed_attempt_records([{**lost, "lost_with_head": False}], finished)[0]


def test_a_job_stopped_after_its_driver_wrote_its_success_keeps_that_record():
    """Seen in the soak of seed 3512235: an evaluation wrote its result, then its DAG run's timeout stopped
    the job as its driver exited. The record tells what the attempt did; one without a record, or with a
    failure of no class, is still a violation."""
    stopped = {"submission_id": "ahp-d-t-x-a1", "status": "STOPPED", "metadata": {"ahp_result_uri": "s3://b/r.json"}}
    success = {"s3://b/r.json": {"attempt": 1, "failure": None, "return_value": {"mse": 0.1}}}
    assert checks.failed_attempt_records([stopped], success) == []
    assert "left no record" in checks.failed_attempt_records([stopped], {})[0]
    unclassed = {"s3://b/r.json": {"attempt": 1, "failure": {"summary": "stopped"}}}
    assert "has no failure class" in checks.failed_attempt_records([stopped], unclassed)[0]


def test_a_run_starts_from_an_empty_folder(tmp_path):
    """The last run's task logs are gone: Airflow would append this run's tries of the same run ids to them
    (seen: every line of a backfill's training twice in its task log)."""
    from chaos.run import fresh_folder

    old = tmp_path / "chaos" / "deployment" / "airflow" / "logs" / "attempt=1.log"
    old.parent.mkdir(parents=True)
    old.write_text("an earlier run's line\n")
    assert fresh_folder(tmp_path / "chaos") == tmp_path / "chaos"
    assert list((tmp_path / "chaos").iterdir()) == []
    assert fresh_folder(tmp_path / "new").is_dir()


def test_a_secret_anywhere_is_found_and_named():
    found = checks.no_secrets({"ray token": "tok-123"}, {"the log": [{"event": "x tok-123"}], "the XCom": {"a": 1}})
    assert found == ["the ray token is in the log"]


def test_worker_seconds_lost_count_failed_attempts_of_each_task_runs_latest_cost():
    cost = {"attempts": [{"failed": True, "worker_s": 30.0}, {"failed": False, "worker_s": 50.0}]}
    records = {
        "a1": {
            "storage_uri": "s",
            "attempt": 1,
            "failure": {"failure_class": "infrastructure"},
            "cost": {"attempts": [{"failed": True, "worker_s": 30.0}]},
        },
        "a2": {"storage_uri": "s", "attempt": 2, "cost": cost},
    }
    assert checks.lost_worker_seconds(records) == 30.0
    assert checks.failed_attempts_by_class(records) == {"infrastructure": 1}


# --- after a fault heals -------------------------------------------------------------------------------


def test_state_spans_follow_each_task_instance_across_the_polls():
    polls = [(0.0, {"a": "queued"}), (3.0, {"a": "queued", "b": "running"}), (6.0, {"a": "running", "b": "running"})]
    assert checks.state_spans(polls) == {
        "a": [("queued", 0.0, 6.0, True), ("running", 6.0, 6.0, False)],
        "b": [("running", 3.0, 6.0, False)],
    }
    assert checks.start_time_s(checks.state_spans(polls)) == 6.0
    assert checks.start_time_s({}) is None


def job(key="chaos_sweep/train/r1/0", first=0.0, ended=None):
    dag, task, run, index = key.split("/")
    meta = {"airflow_dag_id": dag, "airflow_task_id": task, "airflow_run_id": run, "airflow_map_index": index}
    return {"metadata": meta, "first_seen_s": first, "ended_s": ended}


def test_a_task_left_waiting_with_nothing_to_wait_for_after_a_heal_is_stuck():
    key = "chaos_sweep/train/r1/0"
    bounds = {"queued": 100.0, "running": 100.0, "deferred": 100.0}
    # Deferred from 10 to 400 s, its job ended at 50 s, the fault healed at 40 s: stuck 350 s.
    spans = {key: [("deferred", 10.0, 400.0, True)]}
    longest, found = checks.stuck_after_heal(spans, [job(key, 12.0, 50.0)], [40.0], bounds)
    assert longest == 350.0
    assert found == [f"{key} stayed deferred 350 s after the fault that healed at 40 s (bound 100 s)"]
    # Its job ran until the task left: it waited for the job, not stuck.
    assert checks.stuck_after_heal(spans, [job(key, 12.0, None)], [40.0], bounds) == (0.0, [])
    assert checks.stuck_after_heal(spans, [job(key, 12.0, 399.0)], [40.0], bounds) == (1.0, [])
    # Queued counts from the fault's heal (or the span's start, if later); no heal before it: not judged.
    queued = {key: [("queued", 100.0, 180.0, True)]}
    assert checks.stuck_after_heal(queued, [], [150.0], bounds) == (30.0, [])
    assert checks.stuck_after_heal(queued, [], [20.0], bounds) == (80.0, [])
    assert checks.stuck_after_heal(queued, [], [500.0], bounds) == (0.0, [])


def test_a_retry_during_a_partition_is_counted_unless_another_fault_overlapped():
    partition = {"kind": "partition", "started_s": 100.0, "ended_s": 140.0, "cut_s": 100.0, "healed_s": 140.0}
    partition["target"] = "worker-ray_head: airflow-worker1 <-> ray-head"
    tries = {
        "k": [(0.0, 1, "airflow-worker1"), (150.0, 2, "airflow-worker2")],
        "first": [(90.0, 0, ""), (120.0, 1, "w")],
    }
    found, unjudged = checks.partition_retries([partition], tries, settle_s=30.0)
    assert len(found) == 1, found
    assert found[0].startswith("k went to try 2 at 150 s, during the partition worker-ray_head")
    assert unjudged == 0
    # After the settling time: not the partition's.
    assert checks.partition_retries([partition], {"k": [(0.0, 1, ""), (200.0, 2, "")]}, settle_s=30.0) == ([], 0)
    kill = {"kind": "kill_task_process", "started_s": 80.0, "ended_s": 80.5, "target": "x"}
    assert checks.partition_retries([partition, kill], tries, settle_s=30.0) == ([], 1)


def test_a_spread_runs_report_names_its_deployment_and_counts_what_happened_after_heals():
    import os
    from types import SimpleNamespace

    from chaos import run

    environment = dict(os.environ)

    key = "chaos_sweep/train/r1/0"
    partition = {
        "kind": "partition",
        "at_s": 100.0,
        "started_s": 100.0,
        "ended_s": 140.0,
        "cut_s": 100.0,
        "healed_s": 140.0,
        "target": "worker-ray_head: airflow-worker1 <-> ray-head",
    }
    observer = SimpleNamespace(
        to_dict=lambda: {"jobs": [{**job(key, 20.0, 50.0), "submission_id": "s-a1", "head_epoch": 0}]},
        job_polls=[],
        ti_polls=[(10.0, {key: "queued"}), (16.0, {key: "deferred"}), (700.0, {key: "success"})],
        ti_tries={key: [(10.0, 1, "airflow-worker1"), (150.0, 2, "airflow-worker2")]},
        champion=[],
        errors=[],
    )
    deployment = SimpleNamespace(
        name="spread",
        executor="CeleryExecutor",
        host_roles=lambda: {"airflow-worker1": "Airflow Celery worker"},
        secrets=lambda: {"ray token": "tok"},
        restarted=[{"component": "scheduler", "exit_code": 1, "at_s": 710.0}],
    )
    injector = SimpleNamespace(done=[partition], marked_failed=set())
    collected = {
        "tis": [],
        "xcoms": {},
        "logs": {},
        "runs": [],
        "job_logs": {},
        "jobs_now": [],
        "records": {},
        "head_epoch": 0,
        "recovery_s": {"queued": 300.0, "running": 300.0, "deferred": 300.0},
    }
    report = run.assess(
        7, 5, deployment, observer, injector, collected, {}, [], {"drain_s": 1, "stuck": [], "timeouts_s": {}}, 9
    )
    assert (report["deployment"], report["executor"]) == ("spread", "CeleryExecutor")
    assert report["hosts"] == {"airflow-worker1": "Airflow Celery worker"}
    assert set(report["faults"]) == set(schedule.SPREAD_FAULT_KINDS)
    assert report["faults"]["partition"] == {"done": 1, "no_target": 0, "error": 0}
    # Deferred from 16 s to 700 s, its job ended at 50 s, the partition healed at 140 s: stuck 560 s,
    # past 300 s and the measured start (6 s) and two polls.
    assert report["after_heal"]["longest_stuck_s"] == 560.0
    assert report["after_heal"]["bounds_s"]["deferred"] == 312.0
    assert len(report["violations"]["unstuck_after_heal"]) == 1
    assert report["after_heal"]["partition_retries"] == 1
    text = run.figure_markdown(report)
    assert "The spread deployment (CeleryExecutor): airflow-worker1: Airflow Celery worker." in text
    assert "after a fault healed: 560 s" in text
    assert "the service manager started again: scheduler 1x." in text
    # Writing the figure leaves this process's environment alone (the test session's Airflow home with it).
    assert dict(os.environ) == environment


def test_the_service_manager_starts_again_a_component_that_exited_but_not_one_the_injector_took(tmp_path, monkeypatch):
    # Seen in a spread run: PostgreSQL's restart ended the scheduler, triggerer and dag-processor, and
    # nothing scheduled until the run's end mended them.
    import time
    from types import SimpleNamespace

    from chaos import spread

    monkeypatch.setattr(spread, "SUPERVISE_S", 0.05)
    monkeypatch.setattr(spread, "RESTART_AFTER_S", 0.2)
    launched = []
    processes = {"scheduler": subprocess.Popen(["true"]), "api-server": subprocess.Popen(["sleep", "30"])}

    def launch(name):
        launched.append(name)
        processes[name] = subprocess.Popen(["sleep", "30"])

    deployment = spread.SpreadDeployment(tmp_path)
    deployment.stack = SimpleNamespace(processes=processes, launch=launch)
    deployment._supervising.set()
    deployment._supervisor.start()
    try:
        deadline = time.monotonic() + 10
        while not deployment.restarted and time.monotonic() < deadline:
            time.sleep(0.05)
        assert launched == ["scheduler"]
        assert deployment.restarted[0]["component"] == "scheduler"
        assert deployment.restarted[0]["exit_code"] == 0
        processes.pop("api-server").kill()  # as the injector's restart: out of the table first
        time.sleep(0.5)
        assert launched == ["scheduler"]
    finally:
        deployment._supervising.clear()
        deployment._supervisor.join(5)
        for process in processes.values():
            process.kill()
            process.wait()
