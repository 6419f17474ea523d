"""Submission ids and storage folders of a task run: known before anything is submitted, the same
on every try, distinct between runs and map indexes, and safe in URLs and paths."""

import re
from types import SimpleNamespace

import pytest

from airflow_provider_horovod.ids import TaskRun, attempt_of, default_storage_path, safe_name

SAFE = re.compile(r"^[A-Za-z0-9._-]+$")
RUN = "scheduled__2026-11-01T00:00:00+00:00"


def test_same_task_run_same_ids_on_every_call():
    a, b = TaskRun("dag", "train", RUN), TaskRun("dag", "train", RUN)
    assert a.submission_id(1) == b.submission_id(1)
    assert a.storage_uri("/data") == b.storage_uri("/data")
    assert a.submission_id(1) != a.submission_id(2)


@pytest.mark.parametrize("other", [
    TaskRun("dag", "train", "manual__2026-11-02T00:00:00+00:00"),
    TaskRun("dag", "train", RUN, map_index=0),
    TaskRun("dag", "train", RUN, map_index=1),
    TaskRun("dag", "evaluate", RUN),
    TaskRun("dag2", "train", RUN),
], ids=["run", "map0", "map1", "task", "dag"])
def test_every_other_task_run_gets_other_ids_and_storage(other):
    base = TaskRun("dag", "train", RUN)
    assert other.submission_id(1) != base.submission_id(1)
    assert other.storage_uri("/data") != base.storage_uri("/data")


def test_runs_that_sanitise_alike_still_differ():
    # ':' and '+' both become '_': the hash keeps them apart.
    a, b = TaskRun("d", "t", "run:1"), TaskRun("d", "t", "run+1")
    assert safe_name("run:1") == safe_name("run+1")
    assert a.submission_id(1) != b.submission_id(1)
    assert a.storage_uri("s3://b/p") != b.storage_uri("s3://b/p")


def test_ids_and_paths_use_safe_characters_only():
    run = TaskRun("my dag/ü", "group.task:x", "manual__2026-11-01T00:00:00+00:00 #?&", map_index=3)
    sid = run.submission_id(12)
    assert SAFE.match(sid) and sid.startswith("ahp-") and sid.endswith("-a12")
    uri = run.storage_uri("s3://bucket/prefix/")
    assert uri.startswith("s3://bucket/prefix/") and "//" not in uri[len("s3://"):]
    assert all(SAFE.match(part) for part in uri[len("s3://bucket/prefix/"):].split("/"))
    assert uri.endswith("/map-3")


def test_long_ids_are_bounded():
    run = TaskRun("d" * 300, "t" * 300, "r" * 300)
    assert len(run.submission_id(1)) < 120
    assert all(len(part) <= 120 for part in run.storage_uri("/s").split("/"))


def test_storage_uri_layout():
    run = TaskRun("dag", "train", "r1")
    uri = run.storage_uri("/data/")
    assert re.fullmatch(r"/data/dag/train/r1-[0-9a-f]{6}", uri)
    assert TaskRun("dag", "train", "r1", 0).storage_uri("/data") == uri + "/map-0"


def test_of_a_task_instance():
    ti = SimpleNamespace(dag_id="d", task_id="t", run_id="r", map_index=None)
    assert TaskRun.of(ti) == TaskRun("d", "t", "r", -1)
    assert TaskRun.of(SimpleNamespace(dag_id="d", task_id="t", run_id="r", map_index=2)).map_index == 2
    assert TaskRun.of(SimpleNamespace(dag_id="d", task_id="t", run_id="r")).map_index == -1


def test_metadata_names_the_task_run_in_strings():
    meta = TaskRun("d", "t", "r", 4).metadata()
    assert meta == {"airflow_dag_id": "d", "airflow_task_id": "t", "airflow_run_id": "r", "airflow_map_index": "4"}


@pytest.mark.parametrize("sid, attempt", [
    ("ahp-dag-train-0123456789-a1", 1),
    ("ahp-dag-train-0123456789-a12", 12),
    ("ahp-a-b-c-a3", 3),
    ("raysubmit_abc123", None),
    ("ahp-dag-train-a", None),
    ("-a3", None),
    ("ahp-x-ab", None),
    ("", None),
])
def test_attempt_of(sid, attempt):
    assert attempt_of(sid) == attempt


def test_attempt_of_reads_back_submission_ids():
    run = TaskRun("a-a1", "t-a2", "r-a3")
    assert [attempt_of(run.submission_id(n)) for n in (1, 2, 10)] == [1, 2, 10]


def test_default_storage_path_is_under_airflow_home(monkeypatch, tmp_path):
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    assert default_storage_path() == str(tmp_path / "horovod-storage")
