"""The retraining example's champion rules (``examples/retraining.py``), which decide what a backfilled
day warm-starts from and whether its result is recorded: pure functions over the champion record."""

from airflow_provider_horovod.examples.retraining import champion_as_of, current_champion, with_move


def move(day: str, mse: float) -> dict:
    return {"logical_date": day, "holdout_mse": mse, "checkpoint_uri": f"/c/{day}", "run_id": f"r-{day}"}


def test_a_day_with_no_champion_of_its_own_time_starts_cold_though_a_newer_one_exists():
    newer = with_move(None, move("2026-11-10", 0.32))
    assert champion_as_of(newer, "2026-11-01") is None
    assert champion_as_of(None, "2026-11-01") is None
    assert champion_as_of(newer, "2026-11-11")["logical_date"] == "2026-11-10"


def test_a_run_warm_starts_from_the_day_before_and_is_judged_by_the_champion_in_force_on_its_day():
    record = with_move(with_move(None, move("2026-11-01", 0.5)), move("2026-11-10", 0.32))
    assert champion_as_of(record, "2026-11-02")["logical_date"] == "2026-11-01"
    assert champion_as_of(record, "2026-11-10")["logical_date"] == "2026-11-01"
    assert champion_as_of(record, "2026-11-10", inclusive=True)["logical_date"] == "2026-11-10"


def test_a_backfilled_win_is_the_champion_of_its_day_and_the_current_one_stays():
    record = with_move(with_move(None, move("2026-11-01", 0.5)), move("2026-11-10", 0.32))
    assert with_move(record, move("2026-11-02", 0.6)) is None  # no better than 11-01's: not recorded
    won = with_move(record, move("2026-11-02", 0.4))
    assert won["moves"][-1]["replaces"] == {"logical_date": "2026-11-01", "holdout_mse": 0.5, "run_id": "r-2026-11-01"}
    assert won["current"]["logical_date"] == "2026-11-10" == current_champion(won["moves"])["logical_date"]
    assert champion_as_of(won, "2026-11-03")["logical_date"] == "2026-11-02"
