"""docker/compose.yaml run for real: checked through its containers only (Airflow's REST API, the Ray
dashboard's port, `compose exec`). `make docker-test` (scripts/docker_test.sh) builds the images, brings
the deployment up and runs this module; anywhere else it is skipped.

The tests run in file order and share the deployment: the last one takes it down."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import subprocess
import time
from pathlib import Path

import pytest

if not os.environ.get("DOCKER_TEST_COMPOSE"):
    pytest.skip("needs the deployment that make docker-test brings up", allow_module_level=True)

import httpx

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = shlex.split(os.environ["DOCKER_TEST_COMPOSE"])
DOCKER = os.environ.get("DOCKER_TEST_DOCKER", "docker")
PROJECT = os.environ["DOCKER_TEST_PROJECT"]
AIRFLOW = f"http://localhost:{os.environ['AIRFLOW_PORT']}"
RAY = f"http://localhost:{os.environ['RAY_DASHBOARD_PORT']}"
DAG = "horovod_retraining"
TOKEN = (ROOT / "docker" / "secrets" / "ray_token").read_text().strip()
# Services with a health check, and the one-shot ones that must have exited 0.
HEALTHY = {
    "postgres",
    "minio",
    "ray-head",
    "ray-worker",
    "airflow-apiserver",
    "airflow-scheduler",
    "airflow-dag-processor",
    "airflow-triggerer",
}
ONE_SHOT = {"airflow-init", "minio-init"}
# A training of the example (5 epochs, 2 workers) on shared cores; the first one also builds the job's package.
RUN_TIMEOUT_S = 1500


def run(*args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise AssertionError(
            f"{shlex.join(args)} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    return done


def compose(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return run(*COMPOSE, *args, **kwargs)


def exec_in(service: str, *command: str, **kwargs) -> str:
    return compose("exec", "-T", service, *command, **kwargs).stdout


def containers() -> dict[str, dict]:
    """The project's containers (stopped ones too), by service, as `docker inspect` gives them."""
    ids = run(DOCKER, "ps", "-aq", "--filter", f"label=com.docker.compose.project={PROJECT}").stdout.split()
    if not ids:
        return {}
    found = json.loads(run(DOCKER, "inspect", *ids).stdout)
    return {c["Config"]["Labels"]["com.docker.compose.service"]: c for c in found}


def ray_get(path: str) -> dict:
    response = httpx.get(f"{RAY}{path}", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
    response.raise_for_status()
    return response.json()


class Airflow:
    """Airflow's REST API, with a token from the simple auth manager (every user an admin here)."""

    def __init__(self) -> None:
        token = httpx.get(f"{AIRFLOW}/auth/token", timeout=30).json()["access_token"]
        self.client = httpx.Client(
            base_url=f"{AIRFLOW}/api/v2", headers={"Authorization": f"Bearer {token}"}, timeout=60
        )

    def api(self, method: str, path: str, **kwargs) -> dict:
        response = self.client.request(method, path, **kwargs)
        response.raise_for_status()
        return response.json() if response.content else {}

    def trigger(self, conf: dict | None = None, logical_date: str | None = None) -> str:
        body = {"logical_date": logical_date, "conf": conf or {}}
        return self.api("POST", f"/dags/{DAG}/dagRuns", json=body)["dag_run_id"]

    def task(self, run_id: str, task_id: str) -> dict:
        return self.api("GET", f"/dags/{DAG}/dagRuns/{run_id}/taskInstances/{task_id}")

    def wait_for_task(self, run_id: str, task_id: str, states: set[str], timeout: float = RUN_TIMEOUT_S) -> dict:
        deadline = time.monotonic() + timeout
        ti: dict = {}
        while time.monotonic() < deadline:
            ti = self.task(run_id, task_id)
            if ti.get("state") in states:
                return ti
            if ti.get("state") in {"failed", "upstream_failed"} - states:
                break
            time.sleep(3)
        raise AssertionError(
            f"{task_id} of {run_id} is {ti.get('state')}, not {states}:\n{self.log_text(run_id, task_id)[-4000:]}"
        )

    def wait_for_run(self, run_id: str, timeout: float = RUN_TIMEOUT_S) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.api("GET", f"/dags/{DAG}/dagRuns/{run_id}")["state"]
            if state in ("success", "failed"):
                return state
            time.sleep(5)
        raise AssertionError(f"{run_id} did not finish in {timeout} s")

    def xcom(self, run_id: str, task_id: str):
        path = f"/dags/{DAG}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/return_value"
        return self.api("GET", path, params={"deserialize": True, "stringify": False})["value"]

    def log_text(self, run_id: str, task_id: str, try_number: int = 1) -> str:
        response = self.client.get(
            f"/dags/{DAG}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}", params={"full_content": True}
        )
        if response.status_code == 404:
            return ""
        response.raise_for_status()
        content = response.json().get("content") or []
        return "\n".join(str(e.get("event", "")) if isinstance(e, dict) else str(e) for e in content)


@pytest.fixture(scope="module")
def airflow() -> Airflow:
    return Airflow()


def job_of(submission_id: str) -> dict:
    return ray_get(f"/api/jobs/{submission_id}")


def training_job(run_id: str) -> dict:
    """The Ray job of the run's `train` task, its latest attempt, once submitted (found by its metadata)."""
    jobs = [
        job
        for job in ray_get("/api/jobs/")
        if (job.get("metadata") or {}).get("airflow_run_id") == run_id
        and (job.get("metadata") or {}).get("airflow_task_id") == "train"
    ]
    return max(jobs, key=lambda job: job.get("start_time") or 0, default={})


def ray_lines(text: str) -> list[str]:
    """The job's lines as the task log carries them (the trigger logs each as `[ray] LINE`)."""
    return [line[len("[ray] ") :] for line in text.splitlines() if line.startswith("[ray] ")]


def wait_for_training_job(airflow: Airflow, run_id: str, timeout: float = 900) -> dict:
    """The run's training job, once RUNNING on the cluster with the task deferred on it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = training_job(run_id)
        if job.get("status") == "RUNNING" and airflow.task(run_id, "train").get("state") == "deferred":
            return job
        time.sleep(3)
    raise AssertionError(f"no running training for {run_id}: {airflow.log_text(run_id, 'train')[-3000:]}")


def test_every_service_is_healthy():
    deadline = time.monotonic() + 900
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        found = containers()
        states = {
            name: (c["State"].get("Health") or {}).get("Status") or c["State"]["Status"] for name, c in found.items()
        }
        done = {name: found[name]["State"]["ExitCode"] for name in ONE_SHOT if states.get(name) == "exited"}
        if all(states.get(name) == "healthy" for name in HEALTHY) and done == dict.fromkeys(ONE_SHOT, 0):
            break
        assert not [v for k, v in done.items() if v != 0], states
        time.sleep(5)
    assert set(states) == HEALTHY | ONE_SHOT, states
    assert {name: states[name] for name in HEALTHY} == dict.fromkeys(HEALTHY, "healthy"), states


def test_the_database_was_migrated_once_by_airflow_init():
    found = containers()
    init = found["airflow-init"]
    assert (init["State"]["Status"], init["State"]["ExitCode"], init["RestartCount"]) == ("exited", 0, 0)
    logs = {
        name: run(DOCKER, "logs", c["Id"]).stdout + run(DOCKER, "logs", c["Id"]).stderr for name, c in found.items()
    }
    assert "Database migration done!" in logs["airflow-init"], logs["airflow-init"][-2000:]
    for name in ("airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer"):
        assert "Running upgrade" not in logs[name], name
    # The schema is the one this Airflow expects (exits non-zero otherwise).
    exec_in("airflow-scheduler", "airflow", "db", "check-migrations", "-t", "0")


def test_the_ray_default_connection_is_built_from_the_token_secret():
    # The connection as the provider's hook reads it, and a call to the head's dashboard with it; the
    # token itself is compared by digest, never printed.
    script = (
        "import hashlib, json\n"
        "from airflow_provider_horovod.hooks.ray import RayHook\n"
        "hook = RayHook()\n"
        "conn = hook.get_connection('ray_default')\n"
        "endpoint = hook.endpoint\n"
        "import httpx\n"
        "status = httpx.get(endpoint.url + '/api/version', headers=dict(endpoint.headers), timeout=30).status_code\n"
        "print(json.dumps({'host': conn.host, 'port': conn.port, 'url': endpoint.url, 'status': status,\n"
        "                  'embedded': endpoint.embedded,\n"
        "                  'digest': hashlib.sha256(conn.password.encode()).hexdigest()}))\n"
    )
    # Through the services' own entrypoint (`compose exec` alone skips it, and so has no connection).
    out = exec_in("airflow-scheduler", "/opt/provider/with_ray_token.sh", "python", "-c", script)
    out = json.loads(out.strip().splitlines()[-1])
    assert out == {
        "host": "ray-head",
        "port": 8265,
        "url": "http://ray-head:8265",
        "status": 200,
        "embedded": False,
        "digest": hashlib.sha256(TOKEN.encode()).hexdigest(),
    }
    # And without the token the head refuses (token auth is on).
    assert httpx.get(f"{RAY}/api/version", timeout=30).status_code in (401, 403)


def test_the_provider_is_listed_by_airflow():
    providers = json.loads(exec_in("airflow-scheduler", "airflow", "providers", "list", "-o", "json"))
    names = {p["package_name"] for p in providers}
    assert "airflow-provider-horovod" in names, names
    assert "apache-airflow-providers-amazon" in names, names


def test_horovod_is_built_with_pytorch_and_gloo_on_the_ray_image():
    out = exec_in("ray-worker", "horovodrun", "--check-build")
    assert re.search(r"\[X\] PyTorch", out), out
    assert re.search(r"\[X\] Gloo", out), out


def test_the_ray_cluster_has_two_nodes():
    nodes = ray_get("/api/v0/nodes?detail=1")["data"]["result"]["result"]
    alive = [n for n in nodes if n["state"] == "ALIVE"]
    assert len(alive) == 2, nodes
    assert sorted(n["is_head_node"] for n in alive) == [False, True]


def test_the_retraining_dag_trains_on_both_nodes_evaluates_and_promotes(airflow):
    deadline = time.monotonic() + 300
    while airflow.client.get(f"/dags/{DAG}").status_code != 200:
        assert time.monotonic() < deadline, "the DAG was never parsed"
        time.sleep(3)
    # Unpausing starts the latest daily interval's run, which would train first (one run at a time)
    # and become the champion that this run must beat. Triggered for that interval's logical date
    # while paused, this run takes its place (the scheduler creates no run where one exists), and
    # its model, the first, is promoted.
    interval = airflow.api("GET", f"/dags/{DAG}")["next_dagrun_logical_date"]
    run_id = airflow.trigger(logical_date=interval)
    airflow.api("PATCH", f"/dags/{DAG}", json={"is_paused": False})
    state = airflow.wait_for_run(run_id)
    runs = airflow.api("GET", f"/dags/{DAG}/dagRuns")["dag_runs"]
    assert [r["dag_run_id"] for r in runs] == [run_id], runs
    states = {t: airflow.task(run_id, t)["state"] for t in ("prepare_data", "train", "evaluate", "promote")}
    assert state == "success", (states, airflow.log_text(run_id, "train")[-4000:])

    result = airflow.xcom(run_id, "train")
    uri = result["checkpoint_uri"]
    assert uri.startswith("s3://horovod/retraining/"), result
    summary = airflow.xcom(run_id, "promote")
    assert summary["promoted"] is True, summary
    assert summary["checkpoint_uri"] == uri, summary
    # The checkpoint is in the compose's bucket, read from an Airflow container with its AWS environment.
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    listing = exec_in(
        "airflow-scheduler",
        "python",
        "-c",
        "import boto3, sys\n"
        "listed = boto3.client('s3').list_objects_v2(Bucket=sys.argv[1], Prefix=sys.argv[2])\n"
        "print('\\n'.join(o['Key'] for o in listed.get('Contents', [])))",
        bucket,
        prefix,
    ).split()
    assert listing, f"nothing under {uri}"
    # The job's own log in the task log, as the API serves it.
    job = job_of(result["submission_id"])
    assert job["status"] == "SUCCEEDED", job
    job_log = ray_get(f"/api/jobs/{result['submission_id']}/logs")["logs"]
    task_log = airflow.log_text(run_id, "train")
    assert job_log.strip(), job
    assert ray_lines(task_log) == job_log.splitlines(), task_log[-3000:]
    TRAINED["job"] = job


# The retraining's Ray job, for the check below.
TRAINED: dict = {}


def test_the_training_ran_on_both_ray_nodes():
    """Horovod's two workers on the head and on the worker, so that Gloo spans the containers."""
    if not TRAINED:
        pytest.fail("the retraining did not run")
    job_id = TRAINED["job"]["job_id"]
    actors = ray_get(f"/api/v0/actors?detail=1&filter_keys=job_id&filter_predicates=%3D&filter_values={job_id}")
    workers = [a for a in actors["data"]["result"]["result"] if a.get("class_name") == "RayTrainWorker"]
    assert len(workers) == 2, actors
    assert len({a["node_id"] for a in workers}) == 2, [(a["class_name"], a["node_id"]) for a in workers]


def test_a_task_killed_through_the_api_stops_its_ray_job(airflow):
    run_id = airflow.trigger()
    job = wait_for_training_job(airflow, run_id)
    # What the UI's "mark as failed" does to a running task.
    airflow.api("PATCH", f"/dags/{DAG}/dagRuns/{run_id}/taskInstances/train", json={"new_state": "failed"})
    deadline = time.monotonic() + 120
    while job_of(job["submission_id"])["status"] not in ("STOPPED", "FAILED"):
        assert time.monotonic() < deadline, job_of(job["submission_id"])
        time.sleep(2)
    assert airflow.wait_for_run(run_id, timeout=300) == "failed"


def test_a_triggerer_restarted_during_a_training_loses_and_repeats_no_line(airflow):
    run_id = airflow.trigger()
    job = wait_for_training_job(airflow, run_id)
    deadline = time.monotonic() + 300
    while not ray_lines(airflow.log_text(run_id, "train")):
        assert time.monotonic() < deadline, "the triggerer streamed no line of the job"
        time.sleep(1)
    # The restart comes during the training, not after it.
    assert job_of(job["submission_id"])["status"] == "RUNNING", job_of(job["submission_id"])
    compose("restart", "airflow-triggerer")
    assert airflow.wait_for_run(run_id) == "success", airflow.log_text(run_id, "train")[-4000:]
    job_log = ray_get(f"/api/jobs/{job['submission_id']}/logs")["logs"]
    assert ray_lines(airflow.log_text(run_id, "train")) == job_log.splitlines()  # each line once, in order


def test_compose_down_leaves_no_container_network_or_volume():
    compose("down", "-v", "--remove-orphans", timeout=600)
    label = f"label=com.docker.compose.project={PROJECT}"
    assert run(DOCKER, "ps", "-aq", "--filter", label).stdout.split() == []
    assert run(DOCKER, "network", "ls", "-q", "--filter", label).stdout.split() == []
    assert run(DOCKER, "volume", "ls", "-q", "--filter", label).stdout.split() == []
