"""A retraining DAG's history: its rows shaped per run and training task, and the one query that reads
them from a real Airflow metadata database."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from airflow_provider_horovod.plugins import history
from airflow_provider_horovod.plugins.data import JOB_KEY, RETURN_KEY

DAY = datetime(2026, 11, 1, tzinfo=timezone.utc)


def result(day: int, **extra) -> dict:
    return {
        "storage_uri": f"/s/run{day}",
        "attempt": 1,
        "metrics": {"loss": 1.0 / day, "epoch": 4.0},
        "submission_id": f"ahp-x-{day}-a1",
        "dashboard_url": "http://ray/#/jobs/x",
        "world_size": 2,
        **extra,
    }


def row(
    day: int,
    task_id: str,
    key: str | None = None,
    value=None,
    *,
    operator: str = "@task",
    state="success",
    map_index: int = -1,
    duration: float | None = 10.0,
) -> dict:
    """One row as history.fetch gives it: a run, a task instance of it, one of its XComs."""
    when = DAY + timedelta(days=day - 1)
    return {
        "run_id": f"scheduled__{when.date()}",
        "logical_date": when,
        "run_after": when,
        "run_state": "success",
        "run_start": when,
        "run_end": when + timedelta(seconds=60),
        "task_id": task_id,
        "map_index": map_index,
        "state": state,
        "try_number": 1,
        "start_date": when,
        "end_date": when,
        "duration": duration,
        "operator": None,
        "custom_operator_name": operator,
        "key": key,
        "value": value,
    }


def retraining(day: int, *, promoted: bool, mse: float) -> list[dict]:
    return [
        row(day, "prepare_data", RETURN_KEY, {"train": "s3://b/t", "rows": 1000}, operator="@task.ray"),
        row(day, "train", RETURN_KEY, result(day), operator="HorovodTrainOperator"),
        row(day, "train", JOB_KEY, {"kind": "train", "storage_uri": f"/s/run{day}", "attempt": 1}),
        row(day, "evaluate", RETURN_KEY, {"checkpoint_uri": "x", "holdout_mse": mse, "baseline_mse": 2.0}),
        row(day, "promote", RETURN_KEY, {"holdout_mse": mse, "promoted": promoted, "run_id": "r"}),
    ]


def test_each_run_of_the_training_task_gets_its_metrics_evaluation_champion_duration_and_state():
    rows = (
        retraining(3, promoted=False, mse=0.3)
        + retraining(1, promoted=True, mse=0.5)
        + retraining(2, promoted=True, mse=0.4)
    )
    shaped = history.shape(rows)
    assert shaped["runs"] == 3
    assert shaped["training_tasks"] == ["train"]
    assert [r["date"] for r in shaped["rows"]] == [(DAY + timedelta(days=d)).isoformat() for d in range(3)]
    first = shaped["rows"][0]
    # epoch counts how far the training went, not how well: no metric column of its own.
    assert first["metrics"] == {"loss": 1.0}
    assert first["state"] == "success"
    assert first["duration_s"] == 10.0
    assert first["run_duration_s"] == 60.0
    assert first["attempt"] == 1
    # evaluate and promote both say holdout_mse, with the same value: one number. rows (of prepare_data) too.
    assert first["evaluation"] == {"holdout_mse": 0.5, "baseline_mse": 2.0, "rows": 1000.0}
    assert [r["promoted"] for r in shaped["rows"]] == [True, True, False]
    assert shaped["metrics"] == ["loss"]
    assert shaped["evaluation"] == ["holdout_mse", "baseline_mse", "rows"]  # the held-out loss first


def cost(worker_s: float, *, failed: int = 0, prices: dict | None = None) -> dict:
    """A task run's cost as the finish step keeps it (cost.task_run_cost's shape)."""
    amount = round(worker_s / 3600 * prices["cpu_hour"], 6) if prices else None
    total = {"wall_s": 30.0, "queued_s": 1.0, "held_s": worker_s / 2, "worker_s": worker_s, "cpu_s": worker_s}
    total |= {"gpu_s": 0.0, "attempts": 1 + failed, "failed_attempts": failed, "failed_worker_s": 4.0 * failed}
    total |= {"amount": amount, "failed_amount": None}
    return {"attempts": [], "total": total, "resources_per_worker": {"CPU": 1.0}, "prices": prices}


def test_each_run_shows_what_it_cost_failed_attempts_included():
    rows = [
        row(1, "train", RETURN_KEY, result(1, cost=cost(48.0)), operator="@task.horovod"),
        row(2, "train", RETURN_KEY, result(2, cost=cost(60.0, failed=1, prices={"cpu_hour": 3.6, "currency": "EUR"}))),
        row(3, "train", RETURN_KEY, result(3), operator="@task.horovod"),  # a result from before costs were kept
        row(4, "train", operator="@task.horovod", state="failed"),
    ]
    costs = [r["cost"] for r in history.shape(rows)["rows"]]
    assert costs[0] == {
        "worker_s": 48.0,
        "cpu_s": 48.0,
        "gpu_s": 0.0,
        "amount": None,
        "currency": "",
        "attempts": 1,
        "failed_attempts": 0,
        "failed_worker_s": 0,
    }
    assert costs[1]["amount"] == 0.06
    assert costs[1]["currency"] == "EUR"
    assert (costs[1]["failed_attempts"], costs[1]["failed_worker_s"]) == (1, 4.0)
    assert costs[2:] == [None, None]


def test_a_number_two_tasks_report_differently_is_named_after_each_task():
    rows = [
        row(1, "train", RETURN_KEY, result(1), operator="@task.horovod"),
        row(1, "evaluate", RETURN_KEY, {"mse": 0.5}),
        row(1, "evaluate_old", RETURN_KEY, {"mse": 0.7}),
        row(1, "count", RETURN_KEY, 42),
    ]
    assert history.shape(rows)["rows"][0]["evaluation"] == {"evaluate.mse": 0.5, "evaluate_old.mse": 0.7, "count": 42.0}


def test_a_training_that_failed_before_it_pushed_anything_still_has_its_row():
    rows = retraining(1, promoted=True, mse=0.5) + [
        row(2, "train", operator="HorovodTrainOperator", state="failed"),
        row(2, "evaluate", state="upstream_failed"),
        row(2, "promote", state="upstream_failed"),
        # A running training: only its ray_job so far; a plain task of its own operator is no training.
        row(
            3,
            "train",
            JOB_KEY,
            {"kind": "train", "attempt": 2, "submission_id": "ahp-3-a2"},
            operator="Custom",
            state="running",
            duration=None,
        ),
    ]
    shaped = history.shape(rows)
    assert [(r["state"], r["metrics"], r["promoted"], r["attempt"]) for r in shaped["rows"]] == [
        ("success", {"loss": 1.0}, True, 1),
        ("failed", {}, None, None),
        ("running", {}, None, 2),
    ]
    assert shaped["rows"][2]["submission_id"] == "ahp-3-a2"


def test_mapped_trainings_get_a_row_each_and_the_score_attribute_leads_the_metrics():
    rows = [
        row(
            1,
            "train",
            RETURN_KEY,
            result(1, checkpoint_score_attribute="acc", metrics={"loss": 0.1, "acc": i}),
            map_index=i,
            operator="HorovodTrainOperator",
        )
        for i in (1, 0)
    ]
    shaped = history.shape(rows)
    assert [r["map_index"] for r in shaped["rows"]] == [0, 1]
    assert shaped["score_attribute"] == "acc"
    assert shaped["metrics"] == ["acc", "loss"]


def test_a_run_with_no_training_counts_as_a_run_and_gives_no_row():
    shaped = history.shape([row(1, "evaluate", RETURN_KEY, 1.0), {**row(2, None), "task_id": None}])
    assert shaped["runs"] == 2
    assert shaped["rows"] == []
    assert shaped["training_tasks"] == []


# --- the query, against Airflow's own tables -------------------------------------------------------


def add_runs(session, dag_id: str, days: int) -> None:
    """``days`` runs of a retraining DAG (train, evaluate, promote) as Airflow stores them."""
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.xcom import XComModel
    from sqlalchemy import insert, select

    for day in range(1, days + 1):
        when = DAY + timedelta(days=day - 1)
        run_id = f"scheduled__{when.isoformat()}"
        session.execute(
            insert(DagRun).values(
                dag_id=dag_id,
                run_id=run_id,
                run_type="scheduled",
                logical_date=when,
                run_after=when,
                state="success",
                start_date=when,
                end_date=when + timedelta(minutes=2),
            )
        )
        run = session.scalar(select(DagRun.id).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id))
        for task_id, operator, value in (
            ("train", "HorovodTrainOperator", result(day)),
            ("evaluate", "_PythonDecoratedOperator", {"holdout_mse": 0.1 * day}),
            ("promote", "_PythonDecoratedOperator", {"promoted": day % 2 == 1}),
        ):
            session.execute(
                insert(TaskInstance).values(
                    dag_id=dag_id,
                    run_id=run_id,
                    task_id=task_id,
                    map_index=-1,
                    pool="default_pool",
                    state="success",
                    try_number=1,
                    operator=operator,
                    duration=30.0,
                    start_date=when,
                    end_date=when,
                )
            )
            keys = [(RETURN_KEY, value)] + ([(JOB_KEY, {"kind": "train", "attempt": 1})] if task_id == "train" else [])
            for key, xcom in keys + [("checkpoint_uri", "s3://not/read")]:
                session.execute(
                    insert(XComModel).values(
                        dag_run_id=run, dag_id=dag_id, run_id=run_id, task_id=task_id, map_index=-1, key=key, value=xcom
                    )
                )


@pytest.fixture
def stored_runs(airflow_db):
    from airflow.utils.session import create_session

    dag_id = "ahp_history_unit"
    with create_session() as session:
        add_runs(session, dag_id, 6)
        add_runs(session, "ahp_history_other", 2)  # another DAG's runs stay out
    yield dag_id
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.xcom import XComModel
    from sqlalchemy import delete

    with create_session() as session:
        for model in (XComModel, TaskInstance, DagRun):
            session.execute(delete(model).where(model.dag_id.in_((dag_id, "ahp_history_other"))))


def test_the_newest_runs_come_from_one_query_and_their_xcoms_are_decoded(stored_runs):
    from airflow import settings
    from airflow.utils.session import create_session
    from sqlalchemy import event

    statements = []

    def count(conn, cursor, statement, *args):
        statements.append(statement)

    event.listen(settings.engine, "before_cursor_execute", count)
    try:
        with create_session() as session:
            rows = history.fetch(session, stored_runs, 4)
    finally:
        event.remove(settings.engine, "before_cursor_execute", count)
    assert len([s for s in statements if s.lstrip().upper().startswith("SELECT")]) == 1
    shaped = history.shape(rows)
    assert shaped["runs"] == 4  # the newest 4 of 6
    assert [r["date"][:10] for r in shaped["rows"]] == ["2026-11-03", "2026-11-04", "2026-11-05", "2026-11-06"]
    assert [r["evaluation"] for r in shaped["rows"]] == [{"holdout_mse": pytest.approx(0.1 * d)} for d in (3, 4, 5, 6)]
    assert [r["promoted"] for r in shaped["rows"]] == [True, False, True, False]
    assert shaped["rows"][-1]["metrics"] == {"loss": pytest.approx(1 / 6)}
    assert {r["key"] for r in rows} == {RETURN_KEY, JOB_KEY}  # other XComs are not read


def test_a_training_that_waited_for_a_slot_to_resume_shows_its_own_duration_and_the_wait_apart():
    # Deferred at once, its job ended at 75 s (the trigger fired: scheduled), queued for its resume only
    # at 150 s (another training held the one slot), done at 152 s. Airflow keeps the first start.
    waited = row(1, "train", RETURN_KEY, result(1), operator="HorovodTrainOperator", duration=152.0)
    start = waited["start_date"]
    waited.update(
        scheduled_dttm=start + timedelta(seconds=75),
        queued_dttm=start + timedelta(seconds=150),
        end_date=start + timedelta(seconds=152),
    )
    # Never deferred: scheduled and queued before it started.
    plain = row(2, "train", RETURN_KEY, result(2), operator="HorovodTrainOperator", duration=80.0)
    plain.update(
        scheduled_dttm=plain["start_date"] - timedelta(seconds=2),
        queued_dttm=plain["start_date"] - timedelta(seconds=1),
        end_date=plain["start_date"] + timedelta(seconds=80),
    )
    first, second = history.shape([waited, plain])["rows"]
    assert (first["duration_s"], first["slot_wait_s"]) == (77.0, 75.0)
    assert (second["duration_s"], second["slot_wait_s"]) == (80.0, None)
