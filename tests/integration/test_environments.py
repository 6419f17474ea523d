"""The two environments, as deployed: Airflow's (the provider from its wheel, no training stack) and
the cluster's (Ray, torch, the patched Horovod); and the embedded local cluster, which needs the
cluster side where Airflow runs."""

from __future__ import annotations

import importlib.util
import ipaddress
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import airflow_provider_horovod
from airflow_provider_horovod.local import _cluster_pids
from harness.cluster import REPO, cluster_python
from harness.tasks import HUNG_S

pytestmark = pytest.mark.integration


def listening_addresses(pids: list[int]) -> set[str]:
    """The addresses the processes listen on over TCP."""
    import psutil

    found = set()
    for pid in pids:
        try:
            found |= {
                c.laddr.ip for c in psutil.Process(pid).net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN
            }
        except psutil.Error:  # gone meanwhile
            continue
    return found


def test_airflow_runs_the_provider_from_its_wheel_without_the_training_stack():
    assert "site-packages" in airflow_provider_horovod.__file__, airflow_provider_horovod.__file__
    for module in ("torch", "horovod", "ray"):
        assert importlib.util.find_spec(module) is None, f"{module} is installed where Airflow runs"


def test_the_embedded_cluster_needs_the_cluster_side(airflow_db, monkeypatch):
    from airflow_provider_horovod.exceptions import MissingExtraError
    from airflow_provider_horovod.hooks.ray import RayHook

    monkeypatch.delenv("AIRFLOW_CONN_RAY_DEFAULT", raising=False)
    with pytest.raises(MissingExtraError) as err:
        RayHook().get_job_info("ahp-x-a1")
    message = str(err.value)
    assert "pip install 'airflow-provider-horovod[cluster]'" in message
    assert "python -m airflow_provider_horovod.build_horovod" in message
    assert "ray_default" in message


def test_the_embedded_cluster_runs_a_job_where_the_cluster_side_is_installed(tmp_path):
    """No ray_default connection, in the environment that has Airflow and the cluster side together
    (`make demo`'s): the hook starts a local Ray head, runs the job, and the result reaches XCom."""
    bin_dir = Path(cluster_python()).parent
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW_CONN_", "AWS_"))}
    env.update(
        {
            "AIRFLOW_HOME": str(tmp_path / "home"),
            "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "tests" / "dags"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        }
    )
    try:
        subprocess.run(
            [str(bin_dir / "airflow"), "db", "migrate"], env=env, check=True, capture_output=True, timeout=300
        )
        run = subprocess.run(
            [str(bin_dir / "airflow"), "dags", "test", "ahp_embedded"],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        output = run.stdout + run.stderr
        assert run.returncode == 0, output[-4000:]
        assert f"{sys.version_info[0]}.{sys.version_info[1]}" in output  # the job's Python answered
        assert "Submitting Ray job" in output
        # The embedded head stays up for the next task; `local` tells where, and stops it.
        cli = [cluster_python(), "-m", "airflow_provider_horovod.local"]
        status = subprocess.run([*cli, "status"], env=env, capture_output=True, text=True, timeout=HUNG_S)
        assert status.returncode == 0
        assert "running: http://127.0.0.1:" in status.stdout
        assert f"its token in {tmp_path / 'home' / 'ray-local' / 'auth_token'}" in status.stdout
        state = tmp_path / "home" / "ray-local"
        token = (state / "auth_token").read_text()
        assert oct((state / "auth_token").stat().st_mode & 0o777) == "0o600"
        assert token not in output + status.stdout
        temp_dir = json.loads((state / "cluster.json").read_text())["temp_dir"]
        assert _cluster_pids(temp_dir)
        # Loopback only: no port of the embedded cluster (GCS, raylet, agents, workers) is reachable
        # from another machine.
        listening = listening_addresses(_cluster_pids(temp_dir))
        assert listening, listening
        assert all(ipaddress.ip_address(ip.removeprefix("::ffff:")).is_loopback for ip in listening), listening
    finally:
        down = subprocess.run(
            [cluster_python(), "-m", "airflow_provider_horovod.local", "down"],
            env=env,
            capture_output=True,
            text=True,
            timeout=HUNG_S,
        )
    assert down.returncode == 0
    assert _cluster_pids(temp_dir) == []
    assert not os.path.exists(temp_dir)  # Ray's session folder (its logs) went with the cluster
    assert subprocess.run([*cli, "status"], env=env, capture_output=True, text=True, timeout=HUNG_S).returncode == 1


def pickled_train(config):
    return config


@pytest.mark.cross_python
def test_a_function_pickled_on_another_python_fails_at_the_jobs_start(ray_hook, tmp_path):
    """Airflow on another Python minor than the cluster (run from the oldest-Airflow environment):
    a callable travels pickled and cannot load there; the job says so at its start, and how to fix it."""
    from airflow_provider_horovod.exceptions import RayJobError
    from airflow_provider_horovod.operators.horovod import HorovodTrainOperator
    from harness.tasks import FakeTI

    airflow_python = f"{sys.version_info[0]}.{sys.version_info[1]}"
    cluster = subprocess.run(
        [cluster_python(), "-c", "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert airflow_python != cluster, "this test runs where Airflow's Python is not the cluster's"
    op = HorovodTrainOperator(
        task_id="train",
        train_fn=pickled_train,
        num_workers=2,
        storage_path=str(tmp_path),
        poll_interval_seconds=0.5,
        deferrable=False,
    )
    with pytest.raises(RayJobError) as err:
        op.execute({"ti": FakeTI("cross-python")})
    message = str(err.value)
    assert "ended FAILED" in message
    assert "train_fn travelled pickled" in message
    assert f"Airflow's Python {airflow_python}" in message
    assert f"runs Python {cluster}" in message
    assert 'import path "package.module:function"' in message
