"""Rank 0's reports, as the training curve keeps them."""

import pytest

from airflow_provider_horovod.runtime import history


def test_a_point_keeps_the_numeric_metrics_only():
    p = history.point({"loss": 0.5, "epoch": 3, "ok": True, "name": "x", "nan": float("nan")}, 7, True)
    assert p["metrics"] == {"loss": 0.5, "epoch": 3.0} and p["report"] == 7 and p["checkpoint"] is True


@pytest.mark.parametrize("count", [1, 999, 1000, 1001, 25_000])
def test_an_even_sample_keeps_the_first_and_the_last_and_the_order(count):
    points = [{"report": i} for i in range(1, count + 1)]
    kept = history.sampled(points)
    assert len(kept) == min(count, history.MAX_POINTS)
    assert kept[0]["report"] == 1 and kept[-1]["report"] == count
    assert [p["report"] for p in kept] == sorted(p["report"] for p in kept)


def test_rank_0s_reports_are_recorded_once_wrapped(monkeypatch):
    import ray.train
    from ray.train.v2._internal.execution import context

    class Rank:
        def __init__(self, rank):
            self.rank = rank

        def get_world_rank(self):
            return self.rank

    calls = []
    monkeypatch.setattr(context.TrainContext, "report", lambda self, metrics, checkpoint=None, *a, **k: calls.append(
        metrics))
    recorder = history.History()
    recorder.record()
    recorder.record()  # wrapped once
    monkeypatch.setattr(ray.train, "get_context", lambda: Rank(0))
    context.TrainContext.report(object(), {"loss": 1.0}, checkpoint="c")
    monkeypatch.setattr(ray.train, "get_context", lambda: Rank(1))
    context.TrainContext.report(object(), {"loss": 2.0})
    assert calls == [{"loss": 1.0}, {"loss": 2.0}]  # every report still goes to Ray Train
    assert [(p["report"], p["metrics"]["loss"], p["checkpoint"]) for p in recorder.points] == [(1, 1.0, True)]
