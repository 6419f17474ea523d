"""A training's reports shaped for its charts: metric order, x axis, sparse metrics, checkpoints."""

from airflow_provider_horovod.plugins.curves import chosen_metric, counter_axes, metric_order, shape


def point(report: int, checkpoint=None, **metrics) -> dict:
    return {"report": report, "time": 1000.0 + 2 * report, "metrics": metrics, "checkpoint": checkpoint}


# Six reports; val_loss on the 3rd and the 6th only; checkpoints saved on the 2nd (no val_loss) and 6th.
HISTORY = [
    point(1, epoch=0, loss=1.0, accuracy=0.1),
    point(2, "checkpoint_000000", epoch=1, loss=0.5, accuracy=0.2),
    point(3, epoch=2, loss=0.4, accuracy=0.3, val_loss=0.6),
    point(4, epoch=3, loss=0.3, accuracy=0.4),
    point(5, epoch=4, loss=0.2, accuracy=0.5),
    point(6, "checkpoint_000001", epoch=5, loss=0.1, accuracy=0.6, val_loss=0.3),
]


def by_name(shaped: dict) -> dict:
    return {m["name"]: m for m in shaped["metrics"]}


def test_the_metric_that_ranks_checkpoints_comes_first_else_a_loss_on_held_out_data():
    assert metric_order(["accuracy", "loss", "val_loss", "lr"], "accuracy") == ["accuracy", "val_loss", "loss", "lr"]
    assert metric_order(["accuracy", "loss", "val_loss", "lr"]) == ["val_loss", "loss", "accuracy", "lr"]
    assert metric_order(["train_mse", "lr"]) == ["train_mse", "lr"]  # an error measure is a loss too
    assert chosen_metric(["accuracy", "train_mse"], "accuracy") == "accuracy"
    assert chosen_metric(["accuracy", "train_mse"], "not_reported") == "train_mse"
    assert chosen_metric(["accuracy"], None) is None
    shaped = shape(HISTORY, score_attribute="accuracy")
    assert [m["name"] for m in shaped["metrics"]] == ["accuracy", "val_loss", "loss"]
    assert [m["name"] for m in shaped["metrics"] if m["chosen"]] == ["accuracy"] == [shaped["chosen"]]


def test_a_counter_every_report_carries_is_the_x_axis_not_a_chart():
    shaped = shape(HISTORY)
    assert shaped["axes"] == ["epoch", "report", "elapsed_s"]
    assert shaped["columns"]["epoch"] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert shaped["columns"]["elapsed_s"] == [0, 2, 4, 6, 8, 10]
    assert "epoch" not in by_name(shaped)
    # Not on every report, or going back: no counter axis, and the counter is charted like a metric.
    assert counter_axes([point(1, epoch=0), point(2, loss=1.0)]) == []
    assert counter_axes([point(1, step=5), point(2, step=3)]) == []
    assert shape([point(1, epoch=0, loss=1.0), point(2, loss=0.5)])["axes"] == ["report", "elapsed_s"]


def test_every_counter_that_can_be_the_x_axis_is_one_and_none_is_charted():
    reports = [point(n, epoch=n // 2, global_step=10 * n, step=n % 2, loss=1.0 / n) for n in range(1, 5)]
    shaped = shape(reports)
    # step goes back (it counts within an epoch): charted; epoch and global_step: axes, epoch first.
    assert shaped["axes"] == ["epoch", "global_step", "report", "elapsed_s"]
    assert shaped["columns"]["global_step"] == [10.0, 20.0, 30.0, 40.0]
    assert [m["name"] for m in shaped["metrics"]] == ["loss", "step"]


def test_a_sparse_metric_is_drawn_on_its_own_reports_and_marked_where_they_saved_a_checkpoint():
    metrics = by_name(shape(HISTORY, kept={"checkpoint_000000", "checkpoint_000001"}))
    val = metrics["val_loss"]
    assert val["rows"] == [2, 5]
    assert val["values"] == [0.6, 0.3]
    # The 2nd report saved a checkpoint but reported no val_loss: only the 6th marks val_loss, on its 2nd point.
    assert val["kept_at"] == [1]
    assert val["deleted_at"] == []
    loss = metrics["loss"]
    assert loss["rows"] is None
    assert len(loss["values"]) == 6  # on every report
    assert loss["kept_at"] == [1, 5]
    assert (val["last"], val["min"], val["max"]) == (0.3, 0.3, 0.6)


def test_checkpoints_ray_deleted_are_marked_apart_from_those_it_keeps():
    shaped = shape(
        HISTORY,
        kept={"checkpoint_000001"},
        latest="/s/attempt-1/checkpoint_000001",
        best="/s/attempt-1/checkpoint_000001/",
    )
    assert [(c["name"], c["report"], c["exists"], c["latest"], c["best"]) for c in shaped["checkpoints"]] == [
        ("checkpoint_000000", 2, False, False, False),
        ("checkpoint_000001", 6, True, True, True),
    ]
    loss = by_name(shaped)["loss"]
    assert loss["kept_at"] == [5]
    assert loss["deleted_at"] == [1]
    assert by_name(shaped)["val_loss"]["deleted_at"] == []  # the deleted one is not on a val_loss point
    assert shaped["checkpoints"][1]["metrics"]["val_loss"] == 0.3


def test_an_older_record_without_checkpoint_names_is_marked_without_claiming_what_ray_kept():
    old = [point(1, False, loss=1.0), point(2, True, loss=0.5)]
    shaped = shape(old, kept=set())
    assert [(c["name"], c["exists"]) for c in shaped["checkpoints"]] == [(None, None)]
    assert by_name(shaped)["loss"]["kept_at"] == [1]
    assert by_name(shaped)["loss"]["deleted_at"] == []


def test_what_is_not_a_finite_number_is_left_out_and_no_reports_is_no_charts():
    shaped = shape([point(1, loss=float("nan"), note="text", ok=True), point(2, loss=0.5)])
    assert by_name(shaped)["loss"]["values"] == [0.5]
    assert set(by_name(shaped)) == {"loss"}
    assert shape([]) == {
        "reports": 0,
        "axes": ["report"],
        "columns": {"report": []},
        "metrics": [],
        "chosen": None,
        "score_attribute": None,
        "checkpoints": [],
    }
