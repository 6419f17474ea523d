"""The contract between the Airflow side and the cluster: the ids and storage folder of a task run
(known before anything is submitted, the same on every try, distinct between runs and map indexes,
safe in URLs and paths) and the layout's inverse; the job states (an unknown one is an error); the
tested Ray versions. The spec, the records and a task's result: test_documents.py."""

import json
import re
import sys
import time
from types import SimpleNamespace

import pytest

from airflow_provider_horovod.contract import (
    RAY_VERSIONS,
    JobKind,
    JobStatus,
    TaskRun,
    TrainerApi,
    attempt_of,
    attempt_of_record,
    attempt_uri,
    check_ray_version,
    default_storage_path,
    elastic_ray_problem,
    python_minor,
    required_positional,
    result_uri,
    safe_name,
    storage_root,
    timings,
    untested_ray_version,
)
from airflow_provider_horovod.exceptions import UnknownJobStatusError

SAFE = re.compile(r"^[A-Za-z0-9._-]+$")
RUN = "scheduled__2026-11-01T00:00:00+00:00"


# --- ids and the storage layout ---------------------------------------------------------------------


def test_same_task_run_same_ids_on_every_call():
    a, b = TaskRun("dag", "train", RUN), TaskRun("dag", "train", RUN)
    assert a.submission_id(1) == b.submission_id(1)
    assert a.storage_uri("/data") == b.storage_uri("/data")
    assert a.submission_id(1) != a.submission_id(2)


@pytest.mark.parametrize(
    "other",
    [
        TaskRun("dag", "train", "manual__2026-11-02T00:00:00+00:00"),
        TaskRun("dag", "train", RUN, map_index=0),
        TaskRun("dag", "train", RUN, map_index=1),
        TaskRun("dag", "evaluate", RUN),
        TaskRun("dag2", "train", RUN),
    ],
    ids=["run", "map0", "map1", "task", "dag"],
)
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
    assert SAFE.match(sid)
    assert sid.startswith("ahp-")
    assert sid.endswith("-a12")
    uri = run.storage_uri("s3://bucket/prefix/")
    assert uri.startswith("s3://bucket/prefix/")
    assert "//" not in uri[len("s3://") :]
    assert all(SAFE.match(part) for part in uri[len("s3://bucket/prefix/") :].split("/"))
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


@pytest.mark.parametrize(
    "sid, attempt",
    [
        ("ahp-dag-train-0123456789-a1", 1),
        ("ahp-dag-train-0123456789-a12", 12),
        ("ahp-a-b-c-a3", 3),
        ("raysubmit_abc123", None),
        ("ahp-dag-train-a", None),
        ("-a3", None),
        ("ahp-x-ab", None),
        ("", None),
    ],
)
def test_attempt_of(sid, attempt):
    assert attempt_of(sid) == attempt


def test_attempt_of_reads_back_submission_ids():
    run = TaskRun("a-a1", "t-a2", "r-a3")
    assert [attempt_of(run.submission_id(n)) for n in (1, 2, 10)] == [1, 2, 10]


def test_an_attempts_record_uri_says_its_task_runs_folder_and_its_attempt():
    folder = TaskRun("dag", "train", RUN, map_index=3).storage_uri("s3://bucket/prefix")
    assert attempt_of_record(result_uri(folder, 12)) == (folder, 12)
    for other in (f"{folder}/attempt-x/result.json", f"{folder}/attempt-2/other.json", "result.json"):
        with pytest.raises(ValueError, match="is not the record of an attempt"):
            attempt_of_record(other)


def test_default_storage_path_is_under_airflow_home(monkeypatch, tmp_path):
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    assert default_storage_path() == str(tmp_path / "horovod-storage")


@pytest.mark.parametrize("root", ["/data/ckpt", "s3://bucket/prefix/deeper", "/home/me/airflow/horovod-storage"])
@pytest.mark.parametrize(
    "task_run",
    [
        TaskRun("dag", "train", RUN),
        TaskRun("dag", "train", RUN, map_index=3),
        TaskRun("d/a g", "t:x", "manual__2026+1"),
    ],
    ids=["unmapped", "mapped", "odd"],
)
def test_the_storage_root_is_read_back_from_a_task_runs_folder_and_its_attempts(root, task_run):
    folder = task_run.storage_uri(root)
    assert storage_root(folder) == root
    assert storage_root(attempt_uri(folder, 2)) == root
    assert storage_root(folder + "/") == root


# --- job states and kinds ---------------------------------------------------------------------------


def test_job_status_is_a_string():
    assert JobStatus.RUNNING == "RUNNING"
    assert isinstance(JobStatus.FAILED, str)
    assert json.dumps({"s": JobStatus.SUCCEEDED}) == '{"s": "SUCCEEDED"}'
    assert {s.value for s in JobStatus} == {"PENDING", "RUNNING", "STOPPED", "SUCCEEDED", "FAILED"}


def test_terminal_states():
    assert {s for s in JobStatus if s.is_terminal} == {JobStatus.STOPPED, JobStatus.SUCCEEDED, JobStatus.FAILED}
    assert {s for s in JobStatus if s.ended_without_success} == {JobStatus.STOPPED, JobStatus.FAILED}


@pytest.mark.parametrize("value", ["failed", "DELETED", None, 3])
def test_a_state_this_provider_does_not_know_is_none_where_a_wait_asks_gently(value):
    assert JobStatus.known(value) is None
    assert JobStatus.known("RUNNING") is JobStatus.RUNNING


@pytest.mark.parametrize("value", ["failed", "DELETED", None, 3])
def test_an_unknown_status_is_an_error_naming_it(value):
    with pytest.raises(UnknownJobStatusError, match=re.escape(repr(value))):
        JobStatus.of(value)
    assert JobStatus.of("FAILED") is JobStatus.FAILED
    assert JobStatus.of(JobStatus.PENDING) is JobStatus.PENDING


def test_the_python_minor_version_and_a_records_timings():
    assert python_minor() == f"{sys.version_info.major}.{sys.version_info.minor}"
    started = time.time() - 2.0
    made = timings(started, fit_s=1.5)
    assert list(made) == ["started_at", "finished_at", "fit_s", "total_s"]
    assert made["fit_s"] == 1.5
    assert made["started_at"] == started
    assert made["total_s"] == round(made["finished_at"] - started, 3) >= 2.0


def test_trainer_apis_and_job_kinds_are_strings():
    assert [api.value for api in TrainerApi] == ["auto", "v2", "legacy"]
    assert TrainerApi.V2 == "v2"
    assert [kind.value for kind in JobKind] == ["train", "task"]


@pytest.mark.parametrize(
    "fn, count",
    [(lambda: 0, 0), (lambda config: 0, 1), (lambda config=None: 0, 0), (lambda a, b, *rest, c=1, **kw: 0, 2)],
)
def test_required_positional_parameters(fn, count):
    assert required_positional(fn) == count


# --- the documents ----------------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["2.50.0", "2.50.1", "2.55.1", "2.60.0", "2.60.0rc1", "2.60"])
def test_tested_ray_versions_run_without_a_warning(version):
    assert check_ray_version(version) is None
    assert untested_ray_version(version) is None


@pytest.mark.parametrize("version", ["2.61.0", "2.70.1", "3.0.0"])
def test_newer_ray_versions_run_with_a_warning_naming_the_tested_range(version):
    assert check_ray_version(version) is None
    warning = untested_ray_version(version)
    assert f"Ray {version} is newer" in warning
    assert "(2.50 to 2.60)" in warning
    assert "docs/compatibility.md" in warning


@pytest.mark.parametrize("version", ["2.49.2", "2.9.3", "1.60.0", None, "", "nightly"])
def test_older_ray_versions_are_refused_with_the_range_and_the_fix(version):
    problem = check_ray_version(version)
    (low, _) = RAY_VERSIONS
    assert problem is not None
    assert f"runs on Ray {low[0]}.{low[1]} or newer (tested: 2.50 to 2.60)" in problem
    assert f"ray[default,train]>={low[0]}.{low[1]}" in problem
    assert (f"it runs Ray {version}," if version else "of an unknown version") in problem


@pytest.mark.parametrize("version, refused", [("2.50.1", True), ("2.54.1", True), ("2.55.0", False), ("2.61.0", False)])
def test_elastic_training_needs_ray_2_55(version, refused):
    problem = elastic_ray_problem(version)
    assert (problem is not None) == refused
    if refused:
        assert f"the cluster's Ray {version} lacks" in problem
        assert "first comes with Ray 2.55" in problem
