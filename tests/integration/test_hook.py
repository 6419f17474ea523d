"""RayHook against a real Ray head with token auth on, from Airflow's environment (no Ray package
here: the hook speaks HTTP, uploads included)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import pytest

from airflow_provider_horovod.exceptions import RayAuthenticationError, RayClusterUnreachableError
from airflow_provider_horovod.hooks.ray import RayHook
from harness.ports import free_port
from harness.tasks import HUNG_S, assert_stopped, retry_waits_s

pytestmark = pytest.mark.integration

PRINT_LINES = "python -c \"import time\nfor i in range(5): print('line', i, flush=True); time.sleep(0.2)\""


def wait_terminal(hook, sid, timeout=HUNG_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = hook.get_job_status(sid)
        if status in ("SUCCEEDED", "FAILED", "STOPPED"):
            return status
        time.sleep(0.3)
    raise AssertionError(f"{sid} still {status}")


def test_submit_status_logs_stop_delete_round_trip(ray_hook):
    sid = f"hook-{uuid.uuid4().hex[:8]}"
    assert ray_hook.check_connection()["ray_version"]
    submitted = time.monotonic()
    assert ray_hook.submit_job(entrypoint=PRINT_LINES, submission_id=sid, metadata={"k": "v"}) == sid
    assert wait_terminal(ray_hook, sid) == "SUCCEEDED"
    start_s = time.monotonic() - submitted  # a job's whole run (a second of it its own), on this machine now
    assert [ln for ln in ray_hook.get_job_logs(sid).splitlines() if ln.startswith("line ")] == [
        f"line {i}" for i in range(5)
    ]
    assert ray_hook.get_job_info(sid)["metadata"] == {"k": "v"}
    assert sid in [j["submission_id"] for j in ray_hook.list_jobs()]
    assert ray_hook.get_job_url(sid) == f"{ray_hook.endpoint.url}/#/jobs/{sid}"

    long_id = f"hook-sleep-{uuid.uuid4().hex[:8]}"
    ray_hook.submit_job(entrypoint="sleep 300", submission_id=long_id)
    asked = time.monotonic()
    assert ray_hook.stop_job(long_id)
    assert_stopped(ray_hook, long_id, asked, start_s)
    # Idempotent: a second stop changes nothing. Its answer is Ray's: True while the job's supervisor is
    # still winding down (seen on a loaded machine), False once it is gone.
    ray_hook.stop_job(long_id)
    assert ray_hook.get_job_info(long_id)["status"] == "STOPPED"
    assert ray_hook.delete_job(long_id)
    assert ray_hook.get_job_info(long_id) is None
    assert ray_hook.get_job_info("no-such-job") is None


def test_async_round_trip(ray_hook):
    """The async calls a trigger makes, against jobs submitted as the operator submits them: status,
    logs, stop and the cluster's resources."""
    sid = f"hook-async-{uuid.uuid4().hex[:8]}"
    long_id = f"hook-async-sleep-{uuid.uuid4().hex[:8]}"
    ray_hook.submit_job(entrypoint=PRINT_LINES, submission_id=sid, metadata={"k": "v"})
    ray_hook.submit_job(entrypoint="sleep 300", submission_id=long_id)

    async def go():
        hook = RayHook()
        while (info := await hook.a_get_job_info(sid))["status"] not in ("SUCCEEDED", "FAILED", "STOPPED"):
            await asyncio.sleep(0.2)
        seen = (await hook.a_get_job_logs(sid)).splitlines()
        stopped = await hook.a_stop_job(long_id)
        deadline = time.monotonic() + 15
        while (await hook.a_get_job_info(long_id))["status"] != "STOPPED" and time.monotonic() < deadline:
            await asyncio.sleep(0.3)
        outcome = (
            info,
            seen,
            stopped,
            (await hook.a_get_job_info(long_id))["status"],
            await hook.a_get_cluster_resources(),
            await hook.a_get_job_info("no-such-job"),
        )
        await hook.aclose()
        return outcome

    info, seen, stopped, long_status, resources, missing = asyncio.run(go())
    assert info["status"] == "SUCCEEDED"
    assert info["metadata"] == {"k": "v"}
    assert [ln for ln in seen if ln.startswith("line ")] == [f"line {i}" for i in range(5)]  # none lost or repeated
    assert stopped
    assert long_status == "STOPPED"
    assert missing is None
    assert resources.get("CPU", 0) >= 2
    assert resources == ray_hook.get_cluster_resources()
    assert ray_hook.delete_job(long_id)


def test_wrong_token_is_a_clear_error(ray_cluster, monkeypatch):
    port = int(ray_cluster.dashboard_url.rsplit(":", 1)[1])
    monkeypatch.setenv(
        "AIRFLOW_CONN_RAY_BAD",
        json.dumps({"conn_type": "ray", "host": "127.0.0.1", "port": port, "password": "wrong-token"}),
    )
    started = time.monotonic()
    with pytest.raises(RayAuthenticationError) as err:
        RayHook("ray_bad").check_connection()
    # Not retried: a retried request would wait the retry policy's waits before it gave up.
    assert time.monotonic() - started < retry_waits_s()
    assert "401" in str(err.value) or "403" in str(err.value)
    assert "password of connection 'ray_bad'" in str(err.value)
    assert "wrong-token" not in str(err.value)


def test_unreachable_cluster_is_a_clear_error_within_bounded_time(monkeypatch):
    from airflow_provider_horovod.hooks import ray_transport

    port = free_port()  # nothing listens there
    monkeypatch.setenv("AIRFLOW_CONN_RAY_GONE", json.dumps({"conn_type": "ray", "host": "127.0.0.1", "port": port}))
    # The retries' waits (about 15 s in all, to ride out a dashboard restart) shortened for the test.
    full_waits_s = retry_waits_s()
    monkeypatch.setattr(ray_transport, "BACKOFF_S", 0.05)
    started = time.monotonic()
    with pytest.raises(RayClusterUnreachableError) as err:
        RayHook("ray_gone").get_job_info("x")
    # Retried with the shortened waits, then given up: well within the waits at their full length.
    assert time.monotonic() - started < full_waits_s
    assert f"after {ray_transport.RETRIES} tries" in str(err.value)
    assert f"http://127.0.0.1:{port}" in str(err.value)
    assert "'ray_gone'" in str(err.value)


def test_local_folders_travel_through_the_package_api(ray_hook, tmp_path):
    """working_dir and py_modules from this machine reach the job, uploaded over HTTP; a second
    submission of the same folders uploads nothing (Ray keeps packages by content)."""
    work = tmp_path / "work"
    module = tmp_path / "ahp_probe_module"
    work.mkdir()
    module.mkdir()
    (work / "data.txt").write_text("from-working-dir")
    (module / "__init__.py").write_text("VALUE = 'from-py-module'\n")
    (module / "__pycache__").mkdir()
    (module / "__pycache__" / "junk.pyc").write_bytes(b"x")
    code = (
        "import ahp_probe_module, os; print(open('data.txt').read(), ahp_probe_module.VALUE, os.path.exists("
        "os.path.join(os.path.dirname(ahp_probe_module.__file__), '__pycache__', 'junk.pyc')))"
    )
    env = {"working_dir": str(work), "py_modules": [str(module)]}
    first = f"hook-pkg-{uuid.uuid4().hex[:8]}"
    ray_hook.submit_job(entrypoint=f'python -c "{code}"', submission_id=first, runtime_env=env)
    assert wait_terminal(ray_hook, first) == "SUCCEEDED", ray_hook.get_job_logs(first)[-2000:]
    assert "from-working-dir from-py-module False" in ray_hook.get_job_logs(first)
    uploads = []
    real = ray_hook.upload_package
    ray_hook.upload_package = lambda uri, data: uploads.append(real(uri, data)) or uploads[-1]
    second = f"hook-pkg-{uuid.uuid4().hex[:8]}"
    ray_hook.submit_job(entrypoint=f'python -c "{code}"', submission_id=second, runtime_env=env)
    assert uploads == [False, False]  # both packages were on the cluster already
    assert wait_terminal(ray_hook, second) == "SUCCEEDED"


def test_a_second_submission_under_the_same_id_is_refused_by_ray_and_doubles_nothing(ray_hook):
    sid = f"hook-dup-{uuid.uuid4().hex[:8]}"
    ray_hook.submit_job(entrypoint="sleep 30", submission_id=sid)
    # What a retried POST of an earlier try that reached Ray does: the id is the job's.
    assert ray_hook.submit_job(entrypoint="sleep 30", submission_id=sid) == sid
    assert [j["submission_id"] for j in ray_hook.list_jobs()].count(sid) == 1
    ray_hook.stop_job(sid)
