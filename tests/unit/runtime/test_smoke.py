"""A smoke run on the cluster: the first rows of each dataset, and the training function ended on the
report that carries the first checkpoint, that report still recorded and sent to Ray Train. (The ranks'
agreement over Horovod, and the run as a whole, are checked by tests/integration/test_smoke.py.)"""

import pytest

import airflow_provider_horovod.runtime.history as runtime_history
from airflow_provider_horovod.runtime import smoke, trainers
from unit.runtime.test_history import Rank, train_v2  # noqa: F401  (the fixture)


class Rows:
    def __init__(self, n):
        self.n = n

    def limit(self, n):
        return Rows(min(self.n, n))


def test_each_dataset_is_cut_to_its_first_rows(capsys):
    cut = smoke.limited({"train": Rows(1000), "valid": Rows(10)}, 64)
    assert {name: ds.n for name, ds in cut.items()} == {"train": 64, "valid": 10}
    assert "first 64 rows of each dataset ['train', 'valid']" in capsys.readouterr().out
    assert smoke.limited({"train": Rows(5)}, None)["train"].n == 5


def test_without_horovod_running_a_rank_decides_on_its_own_report():
    assert smoke.any_rank(True) is True
    assert smoke.any_rank(False) is False


def test_the_training_ends_on_the_first_checkpoint_after_it_is_recorded(train_v2, monkeypatch, tmp_path, capsys):  # noqa: F811
    import ray.train

    cls, calls = train_v2
    recorder = runtime_history.History()
    monkeypatch.setattr(runtime_history, "HISTORY", recorder)
    monkeypatch.setattr(ray.train, "get_context", lambda: Rank(0))
    recorder.record(str(tmp_path / "metrics_history.json"))
    smoke.stop_after_first_checkpoint()
    smoke.stop_after_first_checkpoint()  # wrapped once
    ctx = object.__new__(cls)

    def train(config):
        for epoch in range(100):
            try:
                cls.report(ctx, {"epoch": epoch}, checkpoint="c" if epoch == 2 else None)
            except Exception:  # a user's broad except does not keep the training going
                pass
        return "finished all epochs"

    assert trainers.call(train, {}) is None
    assert calls == [{"epoch": 0}, {"epoch": 1}, {"epoch": 2}]  # every report up to the checkpoint's went to Ray
    assert [p["metrics"]["epoch"] for p in recorder.points] == [0.0, 1.0, 2.0]
    assert recorder.points[-1]["checkpoint"] is not None
    assert "every rank stops here" in capsys.readouterr().out


def test_any_other_exception_still_fails_the_training(monkeypatch):
    import ray.train

    monkeypatch.setattr(ray.train, "get_context", lambda: Rank(0))

    def train():
        raise ValueError("a real bug")

    with pytest.raises(ValueError, match="a real bug"):
        trainers.call(train)
