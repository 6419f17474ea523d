"""The embedded local Ray cluster: what the provider uses when no ``ray_default`` connection exists.

A Ray head on 127.0.0.1 with the dashboard on and token auth on, on free ports, its state under
``$AIRFLOW_HOME/ray-local``. Started once and reused by every task (a file lock keeps concurrent
tasks from starting two).

    python -m airflow_provider_horovod.local up|status|down
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

NUM_CPUS_ENV = "AIRFLOW_PROVIDER_HOROVOD_LOCAL_NUM_CPUS"
# The training stack the embedded cluster runs jobs with, in this environment.
CLUSTER_MODULES = ("ray", "torch", "horovod")
STATE_FILE = "cluster.json"
TOKEN_FILE = "auth_token"


@dataclasses.dataclass(frozen=True)
class LocalCluster:
    dashboard_url: str
    gcs_address: str
    temp_dir: str
    token: str = dataclasses.field(repr=False)  # never printed

    @property
    def ray_version(self) -> str:
        return _version(self.dashboard_url, self.token) or ""


def state_dir() -> str:
    home = os.environ.get("AIRFLOW_HOME") or os.path.expanduser("~/airflow")
    return os.path.join(home, "ray-local")


def _temp_dir(state: str) -> str:
    """Ray's session folder. Unix socket paths are limited to 107 bytes and Ray nests its sockets
    deep in the session folder, so a long state path gets a short sibling under /tmp instead."""
    candidate = os.path.join(state, "tmp")
    if len(candidate) <= 40:
        return candidate
    digest = hashlib.sha256(os.path.abspath(state).encode()).hexdigest()[:10]
    return f"/tmp/ahp-ray-{digest}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _version(url: str, token: str, timeout: float = 3.0) -> str | None:
    request = urllib.request.Request(f"{url}/api/version", headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.load(response).get("ray_version")
    except (urllib.error.URLError, OSError, ValueError):
        return None


@contextlib.contextmanager
def _locked(state: str):
    os.makedirs(state, exist_ok=True)
    with open(os.path.join(state, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _read_state(state: str) -> dict | None:
    try:
        with open(os.path.join(state, STATE_FILE)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _token(state: str) -> str:
    path = os.path.join(state, TOKEN_FILE)
    if not os.path.exists(path):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
    with open(path) as f:
        return f.read().strip()


def _running(state: str) -> LocalCluster | None:
    data = _read_state(state)
    if not data:
        return None
    cluster = LocalCluster(data["dashboard_url"], data["gcs_address"], data["temp_dir"], _token(state))
    return cluster if _version(cluster.dashboard_url, cluster.token) else None


def status() -> LocalCluster | None:
    """The running local cluster, or None."""
    return _running(state_dir())


def missing_cluster_side() -> list[str]:
    """What of the training stack this environment lacks (Ray's CLI, torch, Horovod)."""
    import importlib.util

    missing = [m for m in CLUSTER_MODULES if importlib.util.find_spec(m) is None]
    if "ray" not in missing and not os.path.exists(_ray_cli()):
        missing.append("the `ray` command")
    return missing


def _ray_cli() -> str:
    return os.path.join(os.path.dirname(sys.executable), "ray")


def ensure_running(timeout: float = 120.0) -> LocalCluster:
    """Start the local head, or reuse the one already running."""
    if missing := missing_cluster_side():
        from airflow_provider_horovod.exceptions import MissingExtraError

        raise MissingExtraError(
            f"The embedded local Ray cluster (used when there is no ray_default connection) needs the training stack "
            f"where Airflow runs, and {', '.join(missing)} is missing. Install it with pip install "
            "'airflow-provider-horovod[cluster]' and build Horovod with python -m "
            "airflow_provider_horovod.build_horovod; "
            "or create the ray_default connection to your Ray cluster (type 'ray')."
        )
    state = state_dir()
    with _locked(state):
        if cluster := _running(state):
            return cluster
        _stop(state)  # leftovers of a head that died
        return _start(state, timeout)


def _ray_env(state: str) -> dict[str, str]:
    bin_dir = os.path.dirname(sys.executable)
    return {
        **os.environ,
        # The job's `python` must be this environment's, which has Ray, torch and Horovod.
        "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
        # Token auth on, with the token in our state folder rather than ~/.ray.
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": os.path.join(state, TOKEN_FILE),
        "RAY_USAGE_STATS_ENABLED": "0",
        # Ray's single-machine mode (its default on macOS and Windows): the node's address is
        # 127.0.0.1, not the machine's external one, so its agents and servers listen on loopback.
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    }


def _start(state: str, timeout: float, num_cpus: int | None = None, extra_args: tuple[str, ...] = ()) -> LocalCluster:
    token = _token(state)
    temp_dir = _temp_dir(state)
    os.makedirs(temp_dir, exist_ok=True)
    gcs, dashboard, agent, client = (_free_port() for _ in range(4))
    cpus = str(num_cpus or os.environ.get(NUM_CPUS_ENV) or max(4, os.cpu_count() or 1))
    # GPUs are left for Ray to detect: on a GPU workstation use_gpu=True trains on them, as
    # HorovodRunner's local mode trains on the driver's GPUs.
    cmd = [
        _ray_cli(),
        "start",
        "--head",
        "--node-ip-address=127.0.0.1",
        f"--port={gcs}",
        "--include-dashboard=true",
        "--dashboard-host=127.0.0.1",
        f"--dashboard-port={dashboard}",
        f"--dashboard-agent-listen-port={agent}",
        f"--ray-client-server-port={client}",
        f"--temp-dir={temp_dir}",
        f"--num-cpus={cpus}",
        "--disable-usage-stats",
        *extra_args,
    ]
    run = subprocess.run(cmd, env=_ray_env(state), capture_output=True, text=True, timeout=timeout)
    if run.returncode != 0:
        raise RuntimeError(f"Could not start the local Ray head:\n{run.stdout[-2000:]}\n{run.stderr[-2000:]}")
    cluster = LocalCluster(f"http://127.0.0.1:{dashboard}", f"127.0.0.1:{gcs}", temp_dir, token)
    deadline = time.monotonic() + timeout
    while not _version(cluster.dashboard_url, token):
        if time.monotonic() > deadline:
            raise RuntimeError(f"The local Ray dashboard did not answer at {cluster.dashboard_url}")
        time.sleep(0.5)
    with open(os.path.join(state, STATE_FILE), "w") as f:
        json.dump(
            {
                "dashboard_url": cluster.dashboard_url,
                "gcs_address": cluster.gcs_address,
                "temp_dir": temp_dir,
                "num_cpus": cpus,
            },
            f,
        )
    return cluster


def _cluster_pids(temp_dir: str) -> list[int]:
    """Processes of this cluster only: they name its temp folder on their command line or hold a
    file open in it (their logs; Ray's agents rename their command line). `ray stop` would stop
    every Ray cluster of the machine."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                mine = temp_dir in f.read().replace(b"\0", b" ").decode(errors="replace")
            if not mine:
                fds = f"/proc/{entry}/fd"
                mine = any(os.readlink(os.path.join(fds, fd)).startswith(temp_dir) for fd in os.listdir(fds))
        except OSError:
            continue
        if mine:
            pids.append(int(entry))
    return pids


def _is_gcs(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"gcs_server" in f.read()
    except OSError:
        return False


def _end(pids_of, timeout: float) -> None:
    """SIGTERM the processes ``pids_of()`` lists, SIGKILL those left after ``timeout``."""
    for sig, wait_s in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        for pid in pids_of():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while pids_of() and time.monotonic() < deadline:
            time.sleep(0.1)
        if not pids_of():
            return


def end_cluster(temp_dir: str, timeout: float = 5.0) -> None:
    """End the Ray cluster whose temp folder is ``temp_dir`` and no other (SIGTERM, then SIGKILL), its
    GCS last: signalled together with the processes that report to it, the GCS and the autoscaler's
    monitor outlive the SIGTERM by long; the others first, then the GCS, end at once."""
    _end(lambda: [p for p in _cluster_pids(temp_dir) if not _is_gcs(p)], timeout)
    _end(lambda: _cluster_pids(temp_dir), timeout)


def _stop(state: str, timeout: float = 5.0) -> bool:
    data = _read_state(state)
    if not data:
        return False
    temp_dir = data["temp_dir"]
    end_cluster(temp_dir, timeout)
    os.remove(os.path.join(state, STATE_FILE))
    # Ray's session folder is the cluster's own (its logs): it goes with the cluster.
    if temp_dir.startswith("/tmp/ahp-ray-") or temp_dir == os.path.join(state, "tmp"):
        shutil.rmtree(temp_dir, ignore_errors=True)
    return True


def start_head(state: str, *, num_cpus: int, extra_args: tuple[str, ...] = ()) -> LocalCluster:
    """A fresh head with its state in ``state`` (for tests that need a cluster of their own)."""
    with _locked(state):
        _stop(state)
        return _start(state, 120.0, num_cpus, extra_args)


def down(state: str | None = None) -> bool:
    """Stop the local cluster (or the one with its state in ``state``) and everything it started.
    True when one was running."""
    state = state or state_dir()
    with _locked(state):
        return _stop(state)


def main(argv: list[str] | None = None) -> int:
    command = (argv if argv is not None else sys.argv[1:]) or ["status"]
    token_file = os.path.join(state_dir(), TOKEN_FILE)
    # The dashboard asks for the token; `ray get-auth-token` looks in ~/.ray, not here.
    where = f"its token in {token_file} (the dashboard asks for it: cat {token_file})"
    if command[0] == "up":
        print(f"Ray dashboard: {ensure_running().dashboard_url}, {where}")
    elif command[0] == "status":
        running = status()
        print(f"running: {running.dashboard_url}, {where}" if running else "not running")
        return 0 if running else 1
    elif command[0] == "down":
        print("stopped" if down() else "not running")
    else:
        print("usage: python -m airflow_provider_horovod.local up|status|down", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
