"""A script's checkpoint folder and the attempt's storage (local here): rank 0's folder copied there once it
holds still, only the newest copy kept, and put back into a starting rank's folder."""

import os
import time

from airflow_provider_horovod.runtime import script_checkpoints
from airflow_provider_horovod.runtime.script_checkpoints import Snapshots, copy_folder, state


def test_a_folder_changes_state_when_a_file_is_written(tmp_path):
    empty = state(str(tmp_path))
    (tmp_path / "model.pt").write_bytes(b"x")
    assert empty == ()
    assert state(str(tmp_path)) != empty


def stored(run):
    return sorted(name for name in os.listdir(run) if name.startswith("checkpoint_")) if run.exists() else []


def wait_for(condition, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)
    return condition()


def test_the_folder_is_stored_once_it_holds_still_and_only_the_newest_copy_is_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(script_checkpoints, "SNAPSHOT_INTERVAL_S", 0.05)
    monkeypatch.setattr(script_checkpoints, "SETTLE_S", 0.05)
    folder, run, scratch = tmp_path / "checkpoint", tmp_path / "run", tmp_path / "scratch"
    folder.mkdir()
    scratch.mkdir()
    firsts = []
    snapshots = Snapshots(str(folder), str(run), str(scratch), on_first=lambda: firsts.append(1))
    snapshots.start()
    try:
        (folder / "model.pt").write_bytes(b"epoch 1")
        assert wait_for(lambda: len(stored(run)) == 1)
        first = stored(run)[0]
        (folder / "model.pt").write_bytes(b"epoch 2, longer")
        assert wait_for(lambda: stored(run) and stored(run)[0] != first)
    finally:
        snapshots.stop()
    [newest] = stored(run)  # the earlier copy deleted
    assert (run / newest / "model.pt").read_bytes() == b"epoch 2, longer"
    assert firsts == [1]  # a smoke run's signal, once
    assert (tmp_path / "scratch" / os.path.basename(snapshots.kept) / "model.pt").read_bytes() == b"epoch 2, longer"
    snapshots.discard()
    assert stored(run) == []


def test_what_the_folder_held_at_the_start_is_not_stored_again(tmp_path, monkeypatch):
    """A restored checkpoint is in storage already."""
    monkeypatch.setattr(script_checkpoints, "SNAPSHOT_INTERVAL_S", 0.05)
    monkeypatch.setattr(script_checkpoints, "SETTLE_S", 0.05)
    folder, run = tmp_path / "checkpoint", tmp_path / "run"
    folder.mkdir()
    (folder / "model.pt").write_bytes(b"restored")
    (tmp_path / "scratch").mkdir()
    snapshots = Snapshots(str(folder), str(run), str(tmp_path / "scratch"))
    snapshots.start()
    time.sleep(0.5)
    snapshots.stop()
    assert stored(run) == []


def test_a_folder_is_copied_with_its_subfolders(tmp_path):
    (tmp_path / "src" / "sub").mkdir(parents=True)
    (tmp_path / "src" / "sub" / "w.bin").write_bytes(b"w")
    copy_folder(str(tmp_path / "src"), str(tmp_path / "dest" / "checkpoint_1"))
    assert (tmp_path / "dest" / "checkpoint_1" / "sub" / "w.bin").read_bytes() == b"w"
