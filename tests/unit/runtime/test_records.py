"""The attempt's records on the cluster: its newest checkpoint as both Ray Train APIs lay them out, and
each start of a worker group noted with its size."""

from airflow_provider_horovod.runtime.records import (
    is_checkpoint_folder,
    latest_checkpoint,
    note_worker_group,
    read_json,
)


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


def test_a_checkpoint_whose_copy_did_not_finish_is_not_taken(tmp_path):
    """A copy cut short (a full volume, a lost node) leaves its marker beside a folder of some files."""
    attempt = tmp_path / "attempt-1"
    whole = make_checkpoint(attempt / "checkpoint_2026-11-22_18-22-06.486595")
    make_checkpoint(attempt / "checkpoint_2026-11-22_18-22-09.000000")
    (attempt / ".checkpoint_2026-11-22_18-22-09.000000.unfinished").write_bytes(b"")
    assert latest_checkpoint(str(attempt)) == str(whole)


def test_only_the_folders_each_api_stores_a_checkpoint_in_are_marked_while_copied():
    assert is_checkpoint_folder("bucket/run/attempt-1/TorchTrainer_x/checkpoint_000002")
    assert is_checkpoint_folder("/storage/attempt-1/checkpoint_2026-11-22_18-22-06.486595/")
    assert not is_checkpoint_folder("/tmp/checkpoint_tmp_3f2a9c")  # a checkpoint downloaded to read it
    assert not is_checkpoint_folder("/storage/attempt-1/checkpoint_weights")


def test_an_attempt_without_checkpoints_has_none(tmp_path):
    assert latest_checkpoint(str(tmp_path / "attempt-1")) is None
    make_checkpoint(tmp_path / "attempt-1" / "other")
    assert latest_checkpoint(str(tmp_path / "attempt-1")) is None


def test_each_start_of_a_worker_group_is_noted_with_its_size_from_when_its_process_started(tmp_path):
    import psutil

    uri = str(tmp_path / "attempt-1" / "worker_groups.json")
    note_worker_group(uri, 4)
    note_worker_group(uri, 2)  # restarted smaller (a lost worker, an elastic resize)
    groups = read_json(uri)
    assert [g["world_size"] for g in groups] == [4, 2]
    # Ray starts a worker's process once its resources are granted: held from then.
    assert [g["started_at"] for g in groups] == [round(psutil.Process().create_time(), 3)] * 2
