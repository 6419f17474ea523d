"""Finding an attempt's newest checkpoint, as both Ray Train APIs lay them out."""

from airflow_provider_horovod.runtime.result import latest_checkpoint


def make_checkpoint(folder, *, empty=False):
    folder.mkdir(parents=True)
    if not empty:
        (folder / "state.json").write_text("{}")
    return folder


def test_train_v1_checkpoints_are_ordered_by_index(tmp_path):
    run = tmp_path / "attempt-1" / "HorovodTrainer_2026-11-22_18-00-00" / "HorovodTrainer_abc_00000"
    for index in (2, 10, 9):
        make_checkpoint(run / f"checkpoint_{index:06d}")
    assert latest_checkpoint(str(tmp_path / "attempt-1")) == str(run / "checkpoint_000010")


def test_train_v2_checkpoints_are_ordered_by_their_timestamp(tmp_path):
    attempt = tmp_path / "attempt-1"
    for stamp in ("2026-11-22_18-22-06.486595", "2026-11-22_18-22-07.000376", "2026-11-22_18-22-06.999999"):
        make_checkpoint(attempt / f"checkpoint_{stamp}")
    assert latest_checkpoint(str(attempt)) == str(attempt / "checkpoint_2026-11-22_18-22-07.000376")


def test_empty_and_nested_checkpoint_folders_are_not_taken(tmp_path):
    attempt = tmp_path / "attempt-1"
    newest = make_checkpoint(attempt / "checkpoint_2026-11-22_18-22-06.486595")
    # A folder the training function saved inside its checkpoint, and a checkpoint cut off before
    # any file reached it.
    make_checkpoint(newest / "checkpoint_weights")
    make_checkpoint(attempt / "checkpoint_2026-11-22_18-22-09.000000", empty=True)
    assert latest_checkpoint(str(attempt)) == str(newest)


def test_an_attempt_without_checkpoints_has_none(tmp_path):
    assert latest_checkpoint(str(tmp_path / "attempt-1")) is None
    make_checkpoint(tmp_path / "attempt-1" / "other")
    assert latest_checkpoint(str(tmp_path / "attempt-1")) is None
