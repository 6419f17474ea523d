"""What every benchmark shares to measure. Import it before anything imports Airflow: it points ``AIRFLOW_HOME`` at
the benchmarks' own home, so their Ray cluster and database never meet the test suite's or the demo's."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from bench.markdown import figure_key
from harness import airflow_cli

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"
OUT = BENCH / "out"
AIRFLOW_HOME = OUT / "airflow-home"
BENCH_DAGS = BENCH / "dags"
PY = sys.executable

os.environ["AIRFLOW_HOME"] = str(AIRFLOW_HOME)
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ["AIRFLOW__CORE__UNIT_TEST_MODE"] = "False"
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(BENCH_DAGS)
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
# The bench module must be importable by `airflow dags test` and by scripts run from anywhere.
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
# Where Ray Train's actors find their own cluster, not another on the machine (the test suite's).
RAY_ADDRESS_ENV = "BENCH_RAY_ADDRESS"
BUCKET = "ahp-bench"  # in moto_server's S3


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name) or default)


def env_names(name: str, default: str, known) -> list[str]:
    """The comma-separated names in ``name`` (``none``: none), each one of ``known``."""
    given = os.environ.get(name) or default
    wanted = [w.strip() for w in given.split(",") if w.strip() and given != "none"]
    if unknown := set(wanted) - set(known):
        raise SystemExit(f"{name}: no {sorted(unknown)}; there are {sorted(known, key=figure_key)}")
    return wanted


def repeats() -> int:
    return env_int("BENCH_REPEATS", 3)


def save_raw(name: str, data) -> None:
    """Every figure keeps its raw measurements in bench/out, so the tables can be checked."""
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{name}.json").write_text(json.dumps(data, indent=1, default=str))


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", flush=True)


def logged(call, log_name: str, check: bool) -> tuple[subprocess.CompletedProcess, float]:
    """Run ``call`` (a command's run), timed, its output in bench/out/logs/<log_name>; (result, wall seconds)."""
    started = time.monotonic()
    run = call()
    wall = time.monotonic() - started
    path = OUT / "logs" / log_name
    path.parent.mkdir(parents=True, exist_ok=True)
    command = " ".join(map(str, run.args))
    path.write_text(
        f"$ {command}\nrc={run.returncode} wall={wall:.2f}s\n--- stdout\n{run.stdout}\n--- stderr\n{run.stderr}"
    )
    if check and run.returncode != 0:
        output = (run.stdout + run.stderr)[-3000:]
        raise RuntimeError(f"{run.args[:4]} failed (rc {run.returncode}); see {path}:\n{output}")
    return run, wall


def run_logged(
    cmd: list[str], log_name: str, *, env: dict | None = None, timeout: float = 600, cwd=REPO
) -> tuple[subprocess.CompletedProcess, float]:
    """A command, ``logged``; ``env`` is added to this process's (a None value leaves that variable out)."""
    env = {k: v for k, v in {**os.environ, **(env or {})}.items() if v is not None}
    return logged(
        lambda: subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd), log_name, True
    )


def dags_test(dag_id: str, log_name: str, *, check: bool = True, **given) -> tuple[subprocess.CompletedProcess, float]:
    """`airflow dags test` (``harness.airflow_cli.dags_test``, ``given`` its arguments), its output logged."""
    return logged(lambda: airflow_cli.dags_test(dag_id, **given), log_name, check)


def epoch(stamp: str | None) -> float | None:
    """Seconds since the epoch of an Airflow time: the REST API's, or the metadata database's naive UTC one."""
    if not stamp:
        return None
    when = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    return (when if when.tzinfo else when.replace(tzinfo=timezone.utc)).timestamp()


def operator_times(path: Path, dag_id: str, run_id: str | None = None) -> tuple[str, float, float]:
    """What the timed operator (``bench/dags/bench_dags.py``) noted in ``path`` for a run of ``dag_id`` (``run_id``,
    or the last, as runs are one at a time): the run id, ``execute``'s start, the result's time."""
    notes = [n for n in map(json.loads, path.read_text().splitlines()) if n["dag_id"] == dag_id]
    run_id = run_id or notes[-1]["run_id"]
    starts, ends = ([n["t"] for n in notes if n["run_id"] == run_id and n["event"] == e] for e in ("start", "done"))
    return run_id, min(starts), max(ends)


def commit() -> str:
    """The checkout's commit, ``+changes`` when the provider's code differs from it."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO)
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "airflow_provider_horovod"], capture_output=True, text=True, cwd=REPO
    )
    return head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


@contextlib.contextmanager
def moto_server():
    """moto's S3 server in a process of its own (in ours it would share our GIL and skew figure 5); its address
    goes into the environment before the Ray head starts, so the cluster inherits it."""
    from harness.s3 import MotoServer

    (OUT / "logs").mkdir(parents=True, exist_ok=True)
    with MotoServer(own_process=True, log=OUT / "logs" / "moto.log") as server:
        os.environ.update(server.env())
        server.make_bucket(BUCKET)
        log(f"moto S3 server on {server.endpoint_url}, bucket {BUCKET}")
        yield server.endpoint_url


@contextlib.contextmanager
def ray_cluster():
    """The provider's embedded local Ray head (token auth on), under the benchmarks' AIRFLOW_HOME."""
    from airflow_provider_horovod import local

    local.down()  # leftovers of an interrupted run
    started = time.monotonic()
    try:
        cluster = local.ensure_running()
        os.environ[RAY_ADDRESS_ENV] = cluster.gcs_address  # passed on by jobs and scripts to Ray Train's actors
        log(f"Ray head up in {time.monotonic() - started:.1f} s: {cluster.dashboard_url}")
        yield cluster
    finally:
        log("stopping the Ray cluster")
        local.down()
