"""A busy cluster, as backfills make it: more trainings than the cluster fits, workers that can never
start, a training that stops making progress, and retraining runs that overlap. Every run trains,
waits in line, or fails saying why; none hangs (each test is bounded by its timeout)."""

from __future__ import annotations

import asyncio
import collections
import threading
import time
import types
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from airflow_provider_horovod.exceptions import CapacityError, InfrastructureError
from harness.tasks import FakeTI, JobWatch, StateStore, defer, jobs_of, wait_for_status

from .test_operator import make_operator

pytestmark = pytest.mark.integration

QUICKSTART = "airflow_provider_horovod.examples.quickstart:train_func"
# What Ray Train's controller logs as it asks for the worker group's resources.
REQUESTING = "Requesting resources"


def csv_data(folder, rows: int = 256) -> str:
    """The quickstart's data as a CSV file: Ray Data reads it with a read task, which needs a CPU."""
    folder.mkdir()
    lines = ["x,y"] + [f"{i / rows},{2 * i / rows + 1}" for i in range(rows)]
    (folder / "train.csv").write_text("\n".join(lines) + "\n")
    return str(folder / "train.csv")


@pytest.mark.timeout(900)
def test_more_trainings_than_the_cluster_fits_queue_and_all_finish(ray_cluster, ray_hook, tmp_path):
    """Three trainings of 2 workers (1 CPU each) with Ray Data inputs, at once, on a cluster of 4 CPUs:
    the datasets are read before the workers start, so no training holds the CPUs its reads need."""
    data = csv_data(tmp_path / "data")
    token = uuid.uuid4().hex[:6]
    tis = [FakeTI(f"busy-{i}-{token}", dag_id="ahp_busy") for i in range(3)]

    def make():
        return make_operator(
            tmp_path / "storage",
            train_fn=QUICKSTART,
            deferrable=True,
            poll_interval_seconds=2,
            train_loop_config={"num_epochs": 2, "lr": 0.1, "batch_size": 16},
            datasets={"train": data},
        )

    with ThreadPoolExecutor(3) as pool:
        deferrals = list(pool.map(lambda ti: defer(make(), ti), tis))

    async def triggerer():
        return await asyncio.gather(*(anext(d.trigger.run()) for d in deferrals))

    events = [e.payload for e in asyncio.run(triggerer())]
    assert [e["outcome"] for e in events] == ["success"] * 3, [e["message"][-500:] for e in events]
    results = [getattr(make(), d.method_name)({"ti": ti}, e) for ti, d, e in zip(tis, deferrals, events)]
    assert len({r["checkpoint_uri"] for r in results}) == 3
    for ti in tis:  # one Ray job per task run
        assert [j["status"] for j in jobs_of(ray_hook, ti.run_id, dag_id="ahp_busy")] == ["SUCCEEDED"]
    logs = ray_hook.get_job_logs(results[0]["submission_id"])
    assert "Reading the datasets ['train'] before the workers start." in logs


def test_workers_that_can_never_start_fail_within_the_pending_timeout_while_running(ray_hook, tmp_path):
    """The job's driver runs (RUNNING) while its worker group waits for GPUs no node has."""
    ti = FakeTI(f"nogpu-{uuid.uuid4().hex[:6]}")
    op = make_operator(tmp_path, use_gpu=True, check_cluster_resources=False, pending_timeout_seconds=8)
    sid = ti.task_run.submission_id(1)
    with JobWatch(ray_hook, sid, marks=[REQUESTING]) as watch, pytest.raises(CapacityError) as err:
        op.execute({"ti": ti})
    took = time.monotonic() - watch.started
    message = str(err.value)
    assert "ended FAILED" in message
    assert "capacity:" in message
    assert "within 8 s" in message
    assert '{"GPU": 1.0}' in message
    assert "the cluster has" in message  # asked, and what there is
    assert "RUNNING" in watch.seen  # it was the worker group that waited, not the job
    assert ray_hook.get_job_info(sid)["status"] == "FAILED"
    # The start this run took to ask for the workers, the timeout, and an end that costs at most twice that start.
    start_s = watch.at(REQUESTING)
    assert took < start_s + 8 + 2 * start_s, (took, watch.seen)


def test_a_training_that_stops_making_progress_fails_and_its_retry_resumes(ray_hook, tmp_path, quick_jobs):
    ti = FakeTI(f"stall-{uuid.uuid4().hex[:6]}")
    store = StateStore()
    config = {"quick_lines": 3, "quick_stall_s": 300, "run": ti.run_id}
    op = make_operator(tmp_path, train_loop_config=config, stall_timeout_seconds=6)
    last_line = "quick-line-0002"
    with JobWatch(ray_hook, ti.task_run.submission_id(1), marks=[last_line]) as watch:
        with pytest.raises(InfrastructureError) as err:
            op.execute({"ti": ti, "task_state_store": store})
    took = time.monotonic() - watch.started
    # The start to the job's last line, the stall timeout, and a stop that costs at most twice that start.
    start_s = watch.at(last_line)
    assert took < start_s + 6 + 2 * start_s, (took, watch.seen)
    message = str(err.value)
    assert "showed no progress for" in message
    assert "(stall_timeout_seconds)" in message
    assert "was stopped" in message
    assert wait_for_status(ray_hook, ti.task_run.submission_id(1), {"STOPPED"}) == "STOPPED"

    ti.try_number = 2
    result = make_operator(tmp_path, train_loop_config=config, stall_timeout_seconds=6).execute(
        {"ti": ti, "task_state_store": store}
    )
    assert result["attempt"] == 2
    assert result["submission_id"] == ti.task_run.submission_id(2)
    # The second attempt was told to resume from the first's folder.
    assert f"resume from ['{ti.task_run.storage_uri(str(tmp_path))}/attempt-1']" in ray_hook.get_job_logs(
        result["submission_id"]
    )


@pytest.mark.parametrize("where", ["local", "s3"])
def test_overlapping_retraining_runs_keep_a_consistent_log_of_champion_moves(where, tmp_path, moto_server, monkeypatch):
    """Four days' runs promote at once, in an order unlike their dates, through the example DAG's own
    promote task: no run's move is lost, each was a win over the champion in force on its day when it
    was recorded, and the current champion is the latest day's."""
    storage = (
        str(tmp_path) if where == "local" else f"s3://{moto_server.make_bucket(f'ahp-champ-{uuid.uuid4().hex[:6]}')}"
    )
    monkeypatch.setenv("HOROVOD_RETRAINING_STORAGE", storage)
    import importlib

    from airflow.dag_processing.dagbag import DagBag

    from airflow_provider_horovod.examples.retraining import current_champion, with_move
    from airflow_provider_horovod.storage import Storage

    bag = DagBag(dag_folder=str(importlib.import_module("harness.cluster").REPO / "dags" / "horovod_retraining.py"))
    promote = bag.dags["horovod_retraining"].get_task("promote").python_callable
    champion_uri = f"{storage}/horovod_retraining/champion.json"
    # Day 3 is the best; day 4 is worse than day 3; day 2 beats day 1. Run in a scrambled order, at once.
    scores = {"2026-11-01": 0.5, "2026-11-02": 0.3, "2026-11-03": 0.1, "2026-11-04": 0.2}
    barrier = threading.Barrier(len(scores))

    def run(day: str) -> dict:
        barrier.wait()
        return promote(
            {"checkpoint_uri": f"{storage}/{day}", "holdout_mse": scores[day], "submission_id": day},
            "",
            day,
            run_id=f"scheduled__{day}",
        )

    with ThreadPoolExecutor(len(scores)) as pool:
        summaries = list(pool.map(run, ["2026-11-04", "2026-11-02", "2026-11-03", "2026-11-01"]))
    record = Storage().read_json(champion_uri)
    moves = record["moves"]
    promoted = [s for s in summaries if s["promoted"]]
    # Every win is in the log, once: no writer lost another's move.
    assert sorted(m["run_id"] for m in moves) == sorted(s["run_id"] for s in promoted)
    # Each beat the champion in force on its day (none later) when it was recorded: replaying the log agrees.
    replayed = None
    for move in moves:
        replayed = with_move(replayed, move)
        assert replayed is not None, move
    for summary in promoted:
        before = summary["champion_before"]
        assert before is None or (
            before["logical_date"] <= summary["logical_date"] and summary["holdout_mse"] < before["holdout_mse"]
        ), summary
    assert "2026-11-03" in {m["logical_date"] for m in moves}  # the best day wins whatever the order
    # The current champion is the latest day's move, and its run said it moved the current champion.
    assert record["current"] == current_champion(moves)
    assert record["current"]["logical_date"] == max(m["logical_date"] for m in moves)
    assert record["current"]["run_id"] in {s["run_id"] for s in summaries if s["current"]}

    # Then a backfill of an earlier day that beats the champion of its time: recorded as such, the current
    # champion (a newer day's) stays, and nothing is published.
    backfill = promote(
        {"checkpoint_uri": f"{storage}/2026-10-30", "holdout_mse": 0.05, "submission_id": "b"},
        "",
        "2026-10-30",
        run_id="backfill__2026-10-30",
    )
    assert backfill["promoted"]
    assert not backfill["current"]
    assert backfill["champion_before"] is None
    after = Storage().read_json(champion_uri)
    assert after["moves"][-1]["run_id"] == "backfill__2026-10-30"
    assert after["current"] == record["current"]
    # Downstream DAGs hear of the current champion's moves only.
    from airflow.providers.common.compat.sdk import AirflowSkipException

    publish = bag.dags["horovod_retraining"].get_task("publish_champion").python_callable
    with pytest.raises(AirflowSkipException):
        publish(backfill, outlet_events={})
    events = collections.defaultdict(types.SimpleNamespace)
    publish({**backfill, "current": True}, outlet_events=events)
    assert [e.extra for e in events.values()] == [{"checkpoint_uri": f"{storage}/2026-10-30", "holdout_mse": 0.05}]
