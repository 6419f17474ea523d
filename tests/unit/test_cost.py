"""The cost of a task run's attempts, from Ray's timestamps and the worker groups' starts: figures
worked out by hand for each case."""

import pytest

from airflow_provider_horovod.cost import amount, attempt_cost, segments_of, summary, task_run_cost

CPU2 = {"CPU": 2.0}
PRICES = {"cpu_hour": 3.6, "gpu_hour": 36.0, "currency": "EUR"}


def record(attempt=1, started=100.0, finished=160.0, **more):
    return {
        "attempt": attempt,
        "submission_id": f"ahp-x-a{attempt}",
        "world_size": 2,
        "timings": {"started_at": started, "finished_at": finished},
        **more,
    }


def test_one_attempt_from_rays_times_and_its_worker_group():
    cost = attempt_cost(
        record(),
        failed=False,
        submitted_at=95.0,
        ended_at=162.0,
        worker_groups=[{"started_at": 110.0, "world_size": 2}],
        per_worker=CPU2,
        prices=PRICES,
    )
    # Submitted at 95, workers from 110 until the driver's fit ended at 160, the job ended at 162.
    assert (cost["wall_s"], cost["queued_s"], cost["held_s"]) == (67.0, 15.0, 50.0)
    assert (cost["world_size"], cost["worker_s"], cost["cpu_s"], cost["gpu_s"]) == (2, 100.0, 200.0, 0.0)
    assert cost["amount"] == pytest.approx(200 / 3600 * 3.6)  # 0.2 EUR
    assert (cost["submitted_at"], cost["workers_started_at"], cost["ended_at"]) == (95.0, 110.0, 162.0)
    assert cost["failed"] is False
    assert cost["attempt"] == 1


def test_a_restarted_worker_group_counts_each_group_at_its_own_size():
    groups = [{"started_at": 110.0, "world_size": 2}, {"started_at": 140.0, "world_size": 1}]
    cost = attempt_cost(
        record(),
        failed=False,
        submitted_at=100.0,
        ended_at=160.0,
        worker_groups=groups,
        per_worker={"CPU": 1.0, "GPU": 1.0},
        prices=None,
    )
    assert cost["worker_s"] == 2 * 30 + 1 * 20
    assert cost["gpu_s"] == 80.0
    assert cost["held_s"] == 50.0
    assert cost["world_size"] == 2
    assert cost["amount"] is None


def test_an_elastic_runs_segments_win_over_the_worker_groups():
    segments = [
        {"start_time": 120.0, "world_size": 4, "reason": "start"},
        {"start_time": 130.0, "world_size": 2, "reason": "node lost"},
    ]
    cost = attempt_cost(
        record(segments=segments),
        failed=False,
        submitted_at=100.0,
        ended_at=160.0,
        worker_groups=[{"started_at": 105.0, "world_size": 9}],
        per_worker={"CPU": 1.0},
        prices=None,
    )
    assert cost["worker_s"] == 4 * 10 + 2 * 30
    assert cost["queued_s"] == 20.0
    assert cost["world_size"] == 4


def test_a_driver_killed_before_its_record_falls_back_to_rays_times():
    cost = attempt_cost(
        {"attempt": 2},
        failed=True,
        submitted_at=10.0,
        ended_at=70.0,
        worker_groups=[{"started_at": 20.0, "world_size": 2}],
        per_worker={"CPU": 1.0},
        prices=None,
    )
    assert (cost["wall_s"], cost["queued_s"], cost["held_s"], cost["worker_s"]) == (60.0, 10.0, 50.0, 100.0)


def test_workers_that_never_started_cost_no_worker_seconds_and_queued_the_whole_attempt():
    cost = attempt_cost(
        record(started=100.0, finished=130.0),
        failed=True,
        submitted_at=99.0,
        ended_at=131.0,
        worker_groups=[],
        per_worker=CPU2,
        prices=PRICES,
    )
    assert (cost["wall_s"], cost["queued_s"], cost["worker_s"], cost["amount"]) == (32.0, 32.0, 0.0, 0.0)


def test_the_total_counts_failed_attempts_and_shows_their_share():
    first = attempt_cost(
        record(1, 0.0, 40.0),
        failed=True,
        submitted_at=0.0,
        ended_at=41.0,
        worker_groups=[{"started_at": 10.0, "world_size": 2}],
        per_worker=CPU2,
        prices=PRICES,
    )
    second = attempt_cost(
        record(2, 50.0, 110.0),
        failed=False,
        submitted_at=50.0,
        ended_at=111.0,
        worker_groups=[{"started_at": 60.0, "world_size": 2}],
        per_worker=CPU2,
        prices=PRICES,
    )
    cost = task_run_cost([second, first], per_worker=CPU2, prices=PRICES)
    assert [a["attempt"] for a in cost["attempts"]] == [1, 2]
    total = cost["total"]
    assert (total["worker_s"], total["cpu_s"], total["wall_s"]) == (60.0 + 100.0, 320.0, 102.0)
    assert (total["attempts"], total["failed_attempts"], total["failed_worker_s"]) == (2, 1, 60.0)
    assert total["amount"] == pytest.approx(320 / 3600 * 3.6)
    assert total["failed_amount"] == pytest.approx(0.12)
    assert cost["resources_per_worker"] == CPU2
    assert cost["prices"] == PRICES
    line = summary(cost)
    assert line.startswith("Cost: 2 attempt(s), wall 102.0 s, queued 20.0 s, 160.0 worker-s (CPU 320.0 s, GPU 0.0 s)")
    assert "0.3200 EUR" in line
    assert "1 failed attempt(s): 60.0 worker-s, 0.1200" in line


def test_without_prices_there_is_no_amount():
    only = attempt_cost(
        record(), failed=False, submitted_at=None, ended_at=None, worker_groups=[], per_worker=CPU2, prices=None
    )
    cost = task_run_cost([only], per_worker=CPU2, prices=None)
    assert cost["total"]["amount"] is None
    assert cost["prices"] is None
    assert only["wall_s"] == 60.0  # the driver's own times stand in for Ray's
    assert "EUR" not in summary(cost)
    assert "failed" not in summary(cost)
    assert amount(3600.0, 3600.0, {"gpu_hour": 2.0}) == 2.0


def test_segments_end_where_the_next_begins_and_never_before_they_start():
    found = segments_of([{"started_at": 5.0, "world_size": 2}, {"started_at": 1.0, "world_size": 1}], end=3.0)
    assert [(s["started_at"], s["ended_at"], s["world_size"]) for s in found] == [(1.0, 5.0, 1), (5.0, 5.0, 2)]


def test_no_worker_holds_anything_before_the_fit_began():
    # A worker process Ray had started earlier (say, for a dataset read) counts from the fit()'s start.
    cost = attempt_cost(
        record(timings={"started_at": 100.0, "finished_at": 160.0, "fit_s": 40.0}),
        failed=False,
        submitted_at=95.0,
        ended_at=161.0,
        worker_groups=[{"started_at": 101.0, "world_size": 2}],
        per_worker={"CPU": 1.0},
        prices=None,
    )
    assert (cost["workers_started_at"], cost["worker_s"], cost["queued_s"]) == (120.0, 80.0, 25.0)
