"""RayHook submitting a job to the stand-in dashboard: the cluster's Ray version checked first (read
once), local packages uploaded, the job posted, a duplicate re-attached, a refusal raised."""

from __future__ import annotations

import json

import pytest

from airflow_provider_horovod.contract import RAY_VERSIONS
from airflow_provider_horovod.exceptions import RayJobError, RayVersionMismatchError
from airflow_provider_horovod.hooks.ray import RayHook
from airflow_provider_horovod.hooks.ray_packages import package_folder
from unit.hooks.dashboard import TOKEN

pytestmark = pytest.mark.usefixtures("quick_retries")


# --- the cluster's version ------------------------------------------------------------------------


def test_check_connection(hook, dashboard):
    assert hook.check_connection()["ray_version"] == "2.60.0"
    assert hook.test_connection() == (True, f"Connected to Ray 2.60.0 at {dashboard.url}")


@pytest.mark.parametrize("version", ["2.49.2", None])
def test_an_older_ray_version_is_refused_naming_both(hook, dashboard, version):
    dashboard.answer("GET", "/api/version", 200, {"ray_version": version} if version else {})
    (low, _) = RAY_VERSIONS
    with pytest.raises(RayVersionMismatchError) as err:
        hook.check_connection()
    message = str(err.value)
    assert "connection 'ray_test'" in message
    assert f"ray[default,train]>={low[0]}.{low[1]}" in message
    assert (version or "of an unknown version") in message
    ok, text = hook.test_connection()
    assert not ok
    assert text == message


@pytest.mark.parametrize("version", ["2.50.1", "2.55.0"])
def test_the_oldest_tested_ray_is_accepted_and_its_version_read_once(hook, dashboard, version):
    dashboard.answer("GET", "/api/version", 200, {"ray_version": version})
    assert hook.ray_version() == version
    dashboard.answer("GET", "/api/version", 200, {"ray_version": "2.60.0"})
    assert hook.ray_version() == version  # the hook's first answer


def test_a_newer_untested_ray_is_accepted_with_a_warning(hook, dashboard):
    import structlog.testing

    dashboard.answer("GET", "/api/version", 200, {"ray_version": "2.61.0"})
    with structlog.testing.capture_logs() as logged:
        assert hook.check_connection()["ray_version"] == "2.61.0"
    (warning,) = [e for e in logged if e.get("log_level") == "warning"]
    text = warning["event"] % warning.get("positional_args", ())
    assert "Ray 2.61.0 is newer than the minors" in text
    assert "connection 'ray_test'" in text


# --- submitting -----------------------------------------------------------------------------------


def make_module(tmp_path):
    folder = tmp_path / "mymod"
    folder.mkdir()
    (folder / "__init__.py").write_text("VALUE = 1\n")
    return folder


def test_submit_uploads_local_packages_and_posts_the_job(hook, dashboard, tmp_path, monkeypatch):
    monkeypatch.setenv(
        "AIRFLOW_CONN_RAY_TEST",
        json.dumps(
            {
                "conn_type": "ray",
                "host": "127.0.0.1",
                "port": dashboard.port,
                "password": TOKEN,
                "extra": {"runtime_env": {"env_vars": {"FROM_CONN": "1", "MODE": "conn"}, "pip": ["requests"]}},
            }
        ),
    )
    hook = RayHook(ray_conn_id="ray_test")
    module = make_module(tmp_path)
    package = package_folder(str(module), keep_name=True)
    put = f"/api/packages/gcs/{package.name}"
    dashboard.answer("PUT", put, 200, "")
    dashboard.answer("POST", "/api/jobs/", 200, {"submission_id": "sid-a1", "job_id": "02000000"})
    sid = hook.submit_job(
        entrypoint="python -m x",
        submission_id="sid-a1",
        runtime_env={"py_modules": [str(module), "gcs://_ray_pkg_given.zip"], "env_vars": {"MODE": "job"}},
        metadata={"airflow_dag_id": "d"},
        entrypoint_num_cpus=1,
    )
    assert sid == "sid-a1"
    assert [r["method"] for r in dashboard.asked("GET", put)] == ["GET"]  # asked whether Ray has it: 404
    (upload,) = dashboard.asked("PUT", put)
    assert upload["body"] == package.data
    (posted,) = dashboard.asked("POST", "/api/jobs/")
    body = json.loads(posted["body"])
    assert body == {
        "entrypoint": "python -m x",
        "submission_id": "sid-a1",
        "metadata": {"airflow_dag_id": "d"},
        "runtime_env": {
            "py_modules": [package.uri, "gcs://_ray_pkg_given.zip"],
            "pip": ["requests"],
            "env_vars": {"FROM_CONN": "1", "MODE": "job"},
        },
        "entrypoint_num_cpus": 1,
        "entrypoint_num_gpus": None,
        "entrypoint_memory": None,
        "entrypoint_resources": None,
    }

    # A second job: the cluster has the package now, and the version was checked once.
    dashboard.answer("GET", put, 200, "")
    dashboard.answer("POST", "/api/jobs/", 200, {"submission_id": "sid-a2"})
    assert (
        hook.submit_job(entrypoint="python -m x", submission_id="sid-a2", runtime_env={"py_modules": [str(module)]})
        == "sid-a2"
    )
    assert len(dashboard.asked("PUT", put)) == 1
    assert len(dashboard.asked("GET", "/api/version")) == 1


def test_submit_on_a_cluster_of_another_version_submits_nothing(hook, dashboard):
    dashboard.answer("GET", "/api/version", 200, {"ray_version": "2.49.2"})
    with pytest.raises(RayVersionMismatchError):
        hook.submit_job(entrypoint="python -m x", submission_id="sid-a1")
    assert dashboard.asked("POST", "/api/jobs/") == []


def test_a_duplicate_of_a_job_that_exists_returns_its_id(hook, dashboard):
    dashboard.answer("POST", "/api/jobs/", 500, "Job with submission_id sid-a1 already exists. Please use a different")
    dashboard.answer("GET", "/api/jobs/sid-a1", 200, {"status": "RUNNING"})
    assert hook.submit_job(entrypoint="python -m x", submission_id="sid-a1") == "sid-a1"


def test_a_refused_job_raises(hook, dashboard):
    dashboard.answer("POST", "/api/jobs/", 400, "runtime_env is invalid: pip")
    with pytest.raises(RayJobError, match="Ray refused job sid-a1: HTTP 400: runtime_env is invalid") as err:
        hook.submit_job(entrypoint="python -m x", submission_id="sid-a1")
    assert err.value.submission_id == "sid-a1"
    dashboard.answer("POST", "/api/jobs/", 500, "already exists")  # ... but no such job
    with pytest.raises(RayJobError, match="HTTP 500: already exists"):
        hook.submit_job(entrypoint="python -m x", submission_id="sid-a1")
