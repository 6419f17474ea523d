"""Ray heads started from the cluster's environment, as deployed apart from Airflow's: Ray, torch and
the patched Horovod (``AHP_CLUSTER_PYTHON``, else the checkout's ``.venv``).

The tests and benchmarks run in Airflow's environment (the provider installed from its wheel, no
training stack) and reach the head through a Ray connection (``connection``), as a deployment does.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def cluster_python() -> str:
    return os.environ.get("AHP_CLUSTER_PYTHON") or str(REPO / ".venv" / "bin" / "python")


def cluster_env(env: dict | None = None) -> dict:
    """The environment of the cluster's processes: ours, with ``AHP_CLUSTER_PYTHONPATH`` first on their
    path (another Ray minor laid over the cluster's environment, scripts/setup_ray_layer.sh), and ``env``."""
    merged = {**os.environ, **(env or {})}
    if layer := os.environ.get("AHP_CLUSTER_PYTHONPATH"):
        merged["PYTHONPATH"] = os.pathsep.join(p for p in (layer, merged.get("PYTHONPATH")) if p)
    return merged


def run_in_cluster_env(code: str, *, env: dict | None = None, timeout: float = 300) -> str:
    """Run Python code in the cluster's environment; its stdout."""
    done = subprocess.run(
        [cluster_python(), "-c", code],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=cluster_env(env),
    )
    if done.returncode != 0:
        raise RuntimeError(f"cluster-side code failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done.stdout


def start_head(state: str, *, num_cpus: int, extra_args: tuple[str, ...] = (), env: dict | None = None) -> dict:
    """A Ray head with its state in ``state``; its dashboard URL, GCS address and token. ``env`` is
    added to the environment its processes start with."""
    out = run_in_cluster_env(
        "import json; from airflow_provider_horovod import local\n"
        f"c = local.start_head({state!r}, num_cpus={num_cpus}, extra_args={tuple(extra_args)!r})\n"
        "print('CLUSTER', json.dumps({'dashboard_url': c.dashboard_url, 'gcs_address': c.gcs_address, "
        "'token': c.token}))",
        env=env,
    )
    return json.loads(out.split("CLUSTER ", 1)[1])


def down(state: str) -> None:
    run_in_cluster_env(f"from airflow_provider_horovod import local; local.down({state!r})")


def connection(head: dict, *, shared_storage: bool = True, extra: dict | None = None) -> str:
    """An AIRFLOW_CONN_* value for the head. Its storage is on this machine's disk, which the head
    shares with Airflow: ``shared_storage`` says so."""
    host, port = head["dashboard_url"].rsplit("//", 1)[1].split(":")
    return json.dumps(
        {
            "conn_type": "ray",
            "host": host,
            "port": int(port),
            "password": head["token"],
            "extra": {"shared_storage": shared_storage, **(extra or {})},
        }
    )
