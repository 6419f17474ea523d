"""Shared fixtures. Airflow's home for the tests is a fresh folder in the checkout (ignored by git),
set before Airflow is imported.

The tests run in Airflow's environment, where the provider is installed from its wheel with no
training stack; the Ray head runs from the cluster's environment (``harness/cluster.py``) and
is reached through the ``ray_default`` connection, as in a deployment.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# The harness package (clusters, stacks, hosts, S3) from the checkout, after the installed provider.
sys.path.append(str(REPO))
TEST_HOME = REPO / ".test-airflow" / f"home-{os.getpid()}"

os.environ["AIRFLOW_HOME"] = str(TEST_HOME)
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(REPO / "tests" / "dags")
os.environ["AIRFLOW__CORE__UNIT_TEST_MODE"] = "False"
os.environ.pop("AIRFLOW_CONN_RAY_DEFAULT", None)  # set by the ray_cluster fixture
TEST_HOME.mkdir(parents=True, exist_ok=True)


def pytest_configure(config):
    if os.environ.get("AHP_TIMINGS_DIR"):
        from support.timing import Timings

        config.pluginmanager.register(Timings(), "ahp-timings")


# The checks of each Ray minor (tests/integration/test_ray_versions.py) run where they are asked for: make
# compat and make test's oldest-Ray run set it. On the newest minor make test runs the same paths in other files.
RAY_VERSIONS_ENV = "AHP_RAY_VERSIONS"


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/integration" in str(item.fspath):
            item.add_marker(pytest.mark.integration)
        if item.get_closest_marker("ray_versions") and os.environ.get(RAY_VERSIONS_ENV) != "1":
            item.add_marker(pytest.mark.skip(reason=f"the checks of a Ray minor: make compat, or {RAY_VERSIONS_ENV}=1"))


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(TEST_HOME, ignore_errors=True)


@pytest.fixture(scope="session")
def airflow_db():
    """Airflow's metadata database for `airflow dags test` and in-process tasks, as CI runs them:
    SQLite in the test home, migrated once. (The real-stack tests run on PostgreSQL.)"""
    airflow = str(Path(sys.executable).with_name("airflow"))
    subprocess.run([airflow, "db", "migrate"], check=True, capture_output=True, timeout=300)
    return TEST_HOME


@pytest.fixture(scope="session")
def moto_server():
    """A real S3-protocol server (moto's server mode) on 127.0.0.1. Its address and test
    credentials go into the environment, so the Ray head started afterwards inherits them."""
    from harness.s3 import MotoServer

    with MotoServer() as server:
        os.environ.update(server.env())
        yield server


@dataclasses.dataclass(frozen=True)
class Cluster:
    dashboard_url: str
    gcs_address: str
    token: str = dataclasses.field(repr=False)
    state: str = ""


@pytest.fixture(scope="session")
def ray_cluster(moto_server):
    """A Ray head (token auth on) started from the cluster's environment, reached through the
    ``ray_default`` connection; its local storage is this machine's disk, shared with Airflow."""
    from harness import cluster

    state = str(TEST_HOME / "ray-cluster")
    # Ray sets up a failing runtime_env three times, a second apart (a pip install each); the tests of
    # such failures check what the task says, so once is enough here.
    head = cluster.start_head(
        state, num_cpus=int(os.environ.get("AHP_TEST_CLUSTER_CPUS", "4")), env={"RUNTIME_ENV_RETRY_TIMES": "1"}
    )
    os.environ["AIRFLOW_CONN_RAY_DEFAULT"] = cluster.connection(head)
    yield Cluster(head["dashboard_url"], head["gcs_address"], head["token"], state)
    try:
        from support.timing import save_jobs

        from airflow_provider_horovod.hooks.ray import RayHook

        save_jobs(RayHook().list_jobs())
    except Exception as error:  # a figure for the record; the head may be gone with a test's fault
        print(f"the session's Ray jobs were not recorded: {error}")
    os.environ.pop("AIRFLOW_CONN_RAY_DEFAULT", None)
    cluster.down(state)


@pytest.fixture
def ray_hook(ray_cluster):
    from airflow_provider_horovod.hooks.ray import RayHook

    return RayHook()


@pytest.fixture
def quick_jobs(monkeypatch):
    """The operator's training jobs replaced by a quick real Ray job (``support/ahp_quick_job``) under
    the same submission id, payload and storage: it writes the checkpoint and result record a
    training would, in a second or two."""
    from support.quick import use_quick_jobs

    use_quick_jobs(monkeypatch.setattr)
