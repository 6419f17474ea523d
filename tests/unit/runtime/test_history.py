"""Rank 0's reports, recorded as the training curve (sampled to a bound) and written as they come."""

import json

import pytest

import airflow_provider_horovod.runtime.history as runtime_history
from airflow_provider_horovod.runtime.history import MAX_POINTS, History, point, sampled


def test_a_point_keeps_the_numeric_metrics_only():
    p = point({"loss": 0.5, "epoch": 3, "ok": True, "name": "x", "nan": float("nan")}, 7, "checkpoint_000001")
    assert p["metrics"] == {"loss": 0.5, "epoch": 3.0}
    assert p["report"] == 7
    assert p["checkpoint"] == "checkpoint_000001"


@pytest.mark.parametrize("count", [1, 999, 10_000, 10_001, 25_000])
def test_an_even_sample_keeps_the_first_and_the_last_and_the_order(count):
    points = [{"report": i} for i in range(1, count + 1)]
    kept = sampled(points)
    assert len(kept) == min(count, MAX_POINTS)
    assert kept[0]["report"] == 1
    assert kept[-1]["report"] == count
    assert [p["report"] for p in kept] == sorted(p["report"] for p in kept)


class Rank:
    def __init__(self, rank):
        self.rank = rank

    def get_world_rank(self):
        return self.rank


@pytest.fixture
def train_v2(monkeypatch):
    """Train V2's report and checkpoint naming as they are called, without a worker group: every
    report lands in ``calls``; the ranks agree on the names ``names`` gives."""
    from ray.train.v2._internal.execution import context

    calls, names = [], iter(f"checkpoint_2026-11-24_10-00-0{i}.000000" for i in range(10))

    def report(self, metrics, checkpoint=None, *args, **kwargs):
        if checkpoint is not None:
            self._sync_checkpoint_dir_name_across_ranks(None)
        calls.append(metrics)

    monkeypatch.setattr(context.TrainContext, "report", report)
    monkeypatch.setattr(context.TrainContext, "_sync_checkpoint_dir_name_across_ranks", lambda self, name: next(names))
    return context.TrainContext, calls


def test_rank_0s_reports_are_recorded_once_wrapped_with_their_checkpoints_folder(train_v2, monkeypatch, tmp_path):
    import ray.train

    cls, calls = train_v2
    recorder = History()
    recorder.record(str(tmp_path / "metrics_history.json"))
    recorder.record(str(tmp_path / "metrics_history.json"))  # wrapped once
    monkeypatch.setattr(ray.train, "get_context", lambda: Rank(0))
    ctx = object.__new__(cls)
    cls.report(ctx, {"loss": 1.0}, checkpoint="c")
    cls.report(ctx, {"loss": 0.5})
    monkeypatch.setattr(ray.train, "get_context", lambda: Rank(1))
    cls.report(ctx, {"loss": 2.0})
    assert calls == [{"loss": 1.0}, {"loss": 0.5}, {"loss": 2.0}]  # every report still goes to Ray Train
    assert [(p["report"], p["metrics"]["loss"], p["checkpoint"]) for p in recorder.points] == [
        (1, 1.0, "checkpoint_2026-11-24_10-00-00.000000"),
        (2, 0.5, None),
    ]


def test_a_report_that_repeats_the_last_point_only_names_its_checkpoint(train_v2, monkeypatch, tmp_path):
    """A script's closing report carries the metrics it printed last: one point, logged to MLflow once."""
    import ray.train

    cls, calls = train_v2
    recorder, logged = History(), []
    recorder.listeners.append(logged.append)
    recorder.record(str(tmp_path / "metrics_history.json"))
    monkeypatch.setattr(ray.train, "get_context", lambda: Rank(0))
    recorder.add(point({"loss": 0.5}, 1, None))
    recorder.repeat_next = True
    cls.report(object.__new__(cls), {"loss": 0.5}, checkpoint="c")
    cls.report(object.__new__(cls), {"loss": 0.25})
    assert calls == [{"loss": 0.5}, {"loss": 0.25}]
    assert [(p["report"], p["checkpoint"]) for p in recorder.points] == [
        (1, "checkpoint_2026-11-24_10-00-00.000000"),
        (2, None),
    ]
    assert [p["metrics"]["loss"] for p in logged] == [0.5, 0.25]


def test_the_history_is_written_as_it_comes_and_a_restarted_worker_goes_on_from_it(train_v2, monkeypatch, tmp_path):
    import ray.train

    cls, _ = train_v2
    uri = str(tmp_path / "metrics_history.json")
    monkeypatch.setattr(ray.train, "get_context", lambda: Rank(0))
    first = History()
    first.record(uri)
    ctx = object.__new__(cls)
    cls.report(ctx, {"loss": 1.0})
    # The first report is on disk at once (a live chart shows it); later ones within HISTORY_WRITE_S wait.
    assert [p["report"] for p in json.load(open(uri))] == [1]
    cls.report(ctx, {"loss": 0.9})
    assert len(json.load(open(uri))) == 1
    first.write()  # after the last report
    assert [p["metrics"]["loss"] for p in json.load(open(uri))] == [1.0, 0.9]
    again = History()  # a worker group Ray Train restarted within the attempt
    again.record(uri)
    again.resume()
    again.add(point({"loss": 0.8}, len(again.points) + 1, None))
    assert [p["report"] for p in json.load(open(uri))] == [1, 2, 3]


def test_a_report_ray_never_returned_from_is_kept_when_the_workers_stop(train_v2, monkeypatch, tmp_path):
    """Rank 0's reports come within HISTORY_WRITE_S of each other (only the first is on disk); another rank
    fails and Ray Train stops the workers while rank 0's third report waits in Ray: the worker callback
    writes all three, the last without a checkpoint (Ray may not have stored it)."""
    import ray.train

    from airflow_provider_horovod.runtime.horovod_backend import KeepHistoryAtShutdown

    cls, _ = train_v2
    uri = str(tmp_path / "metrics_history.json")
    monkeypatch.setattr(ray.train, "get_context", lambda: Rank(0))
    history = History()
    monkeypatch.setattr(runtime_history, "HISTORY", history)
    history.record(uri)
    ctx = object.__new__(cls)
    cls.report(ctx, {"loss": 1.0}, checkpoint="c")
    cls.report(ctx, {"loss": 0.9}, checkpoint="c")
    assert len(json.load(open(uri))) == 1

    def stopped_while_held(self, metrics, checkpoint=None, *args, **kwargs):
        KeepHistoryAtShutdown().before_worker_shutdown()  # Ray Train stops the workers meanwhile
        raise SystemExit("the worker is killed")

    with pytest.raises(SystemExit):
        history._wrap(stopped_while_held)(ctx, {"loss": 0.8}, checkpoint="c")
    written = json.load(open(uri))
    assert [(p["report"], p["metrics"]["loss"]) for p in written] == [(1, 1.0), (2, 0.9), (3, 0.8)]
    assert [bool(p["checkpoint"]) for p in written] == [True, True, False]


def test_a_history_that_cannot_be_written_after_the_users_error_is_said_not_raised(monkeypatch, capsys):
    def full(uri, value):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(runtime_history, "write_json", full)
    recorder = History()
    recorder.uri, recorder.points = "/volume/history.json", [{"report": 1}]
    recorder.write_or_say()
    assert "could not be written: [Errno 28] No space left on device" in capsys.readouterr().out
    with pytest.raises(OSError):
        recorder.write()
