"""RayHook against a real local Ray head with token auth on."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid

import pytest

from airflow_provider_horovod.exceptions import RayAuthenticationError, RayClusterUnreachableError
from airflow_provider_horovod.hooks.ray import RayHook

from ..conftest import free_port

pytestmark = pytest.mark.integration

PRINT_LINES = "python -c \"import time\nfor i in range(5): print('line', i, flush=True); time.sleep(0.2)\""


def wait_terminal(hook, sid, timeout=60):
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
    assert ray_hook.submit_job(entrypoint=PRINT_LINES, submission_id=sid, metadata={"k": "v"}) == sid
    seen, offset = [], 0
    while True:
        status = ray_hook.get_job_status(sid)
        lines, offset = ray_hook.get_job_logs_since(sid, offset, final=status == "SUCCEEDED")
        seen += lines
        if status in ("SUCCEEDED", "FAILED", "STOPPED"):
            break
        time.sleep(0.2)
    assert status == "SUCCEEDED"
    assert [ln for ln in seen if ln.startswith("line ")] == [f"line {i}" for i in range(5)]  # none lost or repeated
    assert ray_hook.get_job_info(sid)["metadata"] == {"k": "v"}
    assert sid in [j["submission_id"] for j in ray_hook.list_jobs()]
    assert ray_hook.get_job_url(sid) == f"{ray_hook.get_dashboard_url()}/#/jobs/{sid}"

    long_id = f"hook-sleep-{uuid.uuid4().hex[:8]}"
    ray_hook.submit_job(entrypoint="sleep 300", submission_id=long_id)
    started = time.monotonic()
    assert ray_hook.stop_job(long_id)
    assert wait_terminal(ray_hook, long_id, timeout=15) == "STOPPED"
    assert time.monotonic() - started < 15
    assert ray_hook.stop_job(long_id) is False  # idempotent
    assert ray_hook.delete_job(long_id) and ray_hook.get_job_info(long_id) is None
    assert ray_hook.get_job_info("no-such-job") is None


def test_async_round_trip(ray_hook):
    """The async twins alone: submit, status, logs, stop, delete and the job's URL."""
    sid = f"hook-async-{uuid.uuid4().hex[:8]}"
    long_id = f"hook-async-sleep-{uuid.uuid4().hex[:8]}"

    async def go():
        hook = RayHook()
        assert await hook.a_submit_job(entrypoint=PRINT_LINES, submission_id=sid, metadata={"k": "v"}) == sid
        seen, offset = [], 0
        while (status := await hook.a_get_job_status(sid)) not in ("SUCCEEDED", "FAILED", "STOPPED"):
            lines, offset = await hook.a_get_job_logs_since(sid, offset)
            seen += lines
            await asyncio.sleep(0.2)
        lines, offset = await hook.a_get_job_logs_since(sid, offset, final=True)
        seen += lines
        info = await hook.a_get_job_info(sid)
        await hook.a_submit_job(entrypoint="sleep 300", submission_id=long_id)
        stopped = await hook.a_stop_job(long_id)
        deadline = time.monotonic() + 15
        while (await hook.a_get_job_status(long_id)) != "STOPPED" and time.monotonic() < deadline:
            await asyncio.sleep(0.3)
        deleted = await hook.a_delete_job(long_id)
        return (status, seen, info, stopped, deleted, await hook.a_get_job_info(long_id),
                await hook.a_get_job_url(sid), await hook.a_get_cluster_resources(),
                await hook.a_get_job_info("no-such-job"))

    status, seen, info, stopped, deleted, gone, url, resources, missing = asyncio.run(go())
    assert status == "SUCCEEDED" and info["metadata"] == {"k": "v"}
    assert [ln for ln in seen if ln.startswith("line ")] == [f"line {i}" for i in range(5)]  # none lost or repeated
    assert stopped and deleted and gone is None and missing is None
    assert url == ray_hook.get_job_url(sid)
    assert resources.get("CPU", 0) >= 2 and resources == ray_hook.get_cluster_resources()


def test_wrong_token_is_a_clear_error(ray_cluster, monkeypatch):
    port = int(ray_cluster.dashboard_url.rsplit(":", 1)[1])
    monkeypatch.setenv("AIRFLOW_CONN_RAY_BAD", json.dumps(
        {"conn_type": "ray", "host": "127.0.0.1", "port": port, "password": "wrong-token"}))
    started = time.monotonic()
    with pytest.raises(RayAuthenticationError) as err:
        RayHook("ray_bad").check_connection()
    assert time.monotonic() - started < 10
    assert "403" in str(err.value) and "password of connection 'ray_bad'" in str(err.value)
    assert "wrong-token" not in str(err.value)


def test_unreachable_cluster_is_a_clear_error_within_bounded_time(monkeypatch):
    port = free_port()  # nothing listens there
    monkeypatch.setenv("AIRFLOW_CONN_RAY_GONE", json.dumps({"conn_type": "ray", "host": "127.0.0.1", "port": port}))
    started = time.monotonic()
    with pytest.raises(RayClusterUnreachableError) as err:
        RayHook("ray_gone").get_job_info("x")
    # Retried with backoff (about 15 s, to ride out a dashboard restart), then given up.
    assert 10 < time.monotonic() - started < 30
    assert f"http://127.0.0.1:{port}" in str(err.value) and "'ray_gone'" in str(err.value)


HOROVOD_ALLREDUCE = '''
import os
os.environ["RAY_TRAIN_V2_ENABLED"] = "0"
import ray
from ray.train import ScalingConfig
from ray.train.horovod import HorovodTrainer

def allreduce():
    import horovod.torch as hvd
    import torch
    hvd.init()
    total = hvd.allreduce(torch.tensor([hvd.rank() + 1.0]), op=hvd.Sum)
    print(f"ALLREDUCE rank={hvd.rank()} size={hvd.size()} sum={total.item()}", flush=True)

HorovodTrainer(allreduce, scaling_config=ScalingConfig(num_workers=2, trainer_resources={"CPU": 0})).fit()
'''


def test_horovod_build_allreduces_over_gloo_on_ray(ray_hook, tmp_path):
    (tmp_path / "allreduce.py").write_text(HOROVOD_ALLREDUCE)
    sid = f"hook-hvd-{uuid.uuid4().hex[:8]}"
    ray_hook.submit_job(entrypoint="python allreduce.py", submission_id=sid,
                        runtime_env={"working_dir": str(tmp_path), "env_vars": {"RAY_TRAIN_V2_ENABLED": "0"}})
    assert wait_terminal(ray_hook, sid, timeout=180) == "SUCCEEDED", ray_hook.get_job_logs(sid)[-3000:]
    logs = ray_hook.get_job_logs(sid)
    for rank in (0, 1):
        assert f"ALLREDUCE rank={rank} size=2 sum=3.0" in logs, logs[-3000:]


def test_horovodrun_check_build_shows_pytorch_and_gloo():
    out = subprocess.run([os.path.join(os.path.dirname(sys.executable), "horovodrun"), "--check-build"],
                         capture_output=True, text=True, timeout=60).stdout
    assert "[X] PyTorch" in out and "[X] Gloo" in out


def test_local_cluster_cli_up_status_down_leaves_nothing(tmp_path):
    from airflow_provider_horovod.local import _cluster_pids

    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path)}
    cli = [sys.executable, "-m", "airflow_provider_horovod.local"]
    up = subprocess.run([*cli, "up"], env=env, capture_output=True, text=True, timeout=180)
    assert up.returncode == 0 and "Ray dashboard: http://127.0.0.1:" in up.stdout, up.stderr[-2000:]
    token = (tmp_path / "ray-local" / "auth_token").read_text()
    assert token not in up.stdout + up.stderr
    assert oct((tmp_path / "ray-local" / "auth_token").stat().st_mode & 0o777) == "0o600"
    assert subprocess.run([*cli, "status"], env=env, capture_output=True, text=True).stdout.startswith("running")
    temp_dir = json.loads((tmp_path / "ray-local" / "cluster.json").read_text())["temp_dir"]
    assert _cluster_pids(temp_dir)
    assert subprocess.run([*cli, "down"], env=env, capture_output=True, text=True, timeout=60).returncode == 0
    assert _cluster_pids(temp_dir) == []
    assert subprocess.run([*cli, "status"], env=env, capture_output=True, text=True).returncode == 1
