"""A local file written in one step: a reader sees the old content or the new, and a failed write
leaves neither a partial file nor its temporary beside it."""

from __future__ import annotations

import os

import pytest

from airflow_provider_horovod.atomic_files import write_atomically


def test_the_file_is_written_whole_in_a_folder_made_for_it(tmp_path):
    path = tmp_path / "run" / "attempt-1" / "result.json"
    write_atomically(str(path), b'{"a": 1}')
    assert path.read_bytes() == b'{"a": 1}'
    write_atomically(str(path), b'{"a": 2}')
    assert path.read_bytes() == b'{"a": 2}'
    assert os.listdir(path.parent) == ["result.json"]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "result.json"
    path.write_bytes(b"old")

    def refused(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", refused)
    with pytest.raises(OSError, match="disk full"):
        write_atomically(str(path), b"new")
    assert path.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["result.json"]
