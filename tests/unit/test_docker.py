"""docker/: what can be checked without a Docker engine. hadolint on each Dockerfile, the compose
file against the Compose specification, the connections it configures, its health checks and the
way the Ray token travels."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

DOCKER = Path(__file__).resolve().parents[2] / "docker"
DOCKERFILES = sorted(DOCKER.glob("*.Dockerfile"))
BIN = Path(sys.executable).parent
AIRFLOW_SERVICES = ("airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer")
TOKEN = "token-from-the-secret"


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def tool(name: str) -> str:
    """A test tool from the venv (next to this python), else from PATH."""
    found = BIN / name if (BIN / name).exists() else shutil.which(name)
    assert found, f"{name} is not installed: pip install -e '.[test]'"
    return str(found)


def interpolate(value: str) -> str:
    """Compose's `${VAR:-default}`, with the defaults (no .env)."""
    return re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: m.group(2), value)


def airflow_env(compose: dict) -> dict[str, str]:
    return {k: interpolate(str(v)) for k, v in compose["x-airflow"]["environment"].items()}


def run_token_wrapper(conn_json: str, token_file: Path) -> subprocess.CompletedProcess:
    """docker/with_ray_token.sh up to its exec of Airflow's entrypoint, then print the connection."""
    script = (DOCKER / "with_ray_token.sh").read_text()
    head, marker, _ = script.partition("exec /usr/bin/dumb-init")
    assert marker, "with_ray_token.sh no longer ends by starting Airflow's entrypoint"
    return subprocess.run(["bash", "-c", head + 'printf %s "$AIRFLOW_CONN_RAY_DEFAULT"\n'],
                          capture_output=True, text=True, timeout=60,
                          env={"PATH": f"{BIN}:{os.environ['PATH']}", "AHP_RAY_TOKEN_FILE": str(token_file),
                               "AHP_RAY_CONN_JSON": conn_json})


def test_both_images_are_there():
    assert [p.name for p in DOCKERFILES] == ["airflow.Dockerfile", "ray.Dockerfile"]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint(dockerfile):
    run = subprocess.run([tool("hadolint"), str(dockerfile)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr


def test_compose_file_follows_the_compose_specification():
    # The schema ships inside check-jsonschema: no network needed.
    run = subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec",
                          str(DOCKER / "compose.yaml")], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_images_are_the_pinned_ones():
    airflow = (DOCKER / "airflow.Dockerfile").read_text()
    ray = (DOCKER / "ray.Dockerfile").read_text()
    assert "FROM apache/airflow:3.3.2-python3.11" in airflow
    assert '"apache-airflow==3.3.2"' in airflow and '"ray[default]==2.60.0"' in airflow
    assert "FROM rayproject/ray:2.60.0-py311-cpu " in ray and "FROM rayproject/ray:2.60.0-py311-cu130 " in ray
    assert '"torch==2.13.0"' in ray and "COPY --chown=1000:100 scripts/build_horovod.sh" in ray
    assert "HOROVOD_GPU_OPERATIONS=NCCL" in ray
    # The C++17 edits live in the script only.
    assert "sed " not in ray and "CMAKE_CXX_STANDARD" not in ray


def test_connections_parse_into_what_the_provider_expects(compose, tmp_path, monkeypatch):
    from airflow.sdk import Connection

    from airflow_provider_horovod.hooks.ray import RayHook, dashboard_url, parse_extras
    from airflow_provider_horovod.storage import Storage

    env = airflow_env(compose)
    assert "password" not in env["AHP_RAY_CONN_JSON"]
    token_file = tmp_path / "ray_token"
    token_file.write_text(TOKEN + "\n")
    run = run_token_wrapper(env["AHP_RAY_CONN_JSON"], token_file)
    assert run.returncode == 0, run.stderr

    ray = Connection.from_json(run.stdout, conn_id="ray_default")
    assert (ray.conn_type, ray.host, ray.port, ray.schema, ray.password) == ("ray", "ray-head", 8265, "http", TOKEN)
    assert dashboard_url(ray.host, ray.port, ray.schema) == "http://ray-head:8265"
    assert parse_extras("ray_default", ray.extra_dejson) == (True, {}, {})
    # What the hook makes of it, found the way a task finds it (the hook's own lookup would fall back
    # to an embedded local cluster if it found nothing: ask for the connection first).
    monkeypatch.setenv("AIRFLOW_CONN_RAY_DEFAULT", run.stdout)
    hook = RayHook()
    endpoint = hook._endpoint_from(hook.get_connection("ray_default"))
    assert endpoint.url == "http://ray-head:8265" and endpoint.verify is True
    assert dict(endpoint.headers) == {"Authorization": f"Bearer {TOKEN}"}

    aws = Connection.from_json(env["AIRFLOW_CONN_AWS_DEFAULT"], conn_id="aws_default")
    assert (aws.conn_type, aws.login, aws.password) == ("aws", "minioadmin", "minioadmin")
    assert aws.extra_dejson == {"endpoint_url": "http://minio:9000", "region_name": "us-east-1"}
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", env["AIRFLOW_CONN_AWS_DEFAULT"])
    s3 = Storage("aws_default")._s3
    assert s3.meta.endpoint_url == "http://minio:9000" and s3.meta.region_name == "us-east-1"
    assert s3._request_signer._credentials.access_key == "minioadmin"

    # The example DAGs use the task's AWS environment; Ray Train uses the nodes'. Both reach MinIO.
    ray_env = {k: interpolate(str(v)) for k, v in compose["x-ray"]["environment"].items()}
    for e in (env, ray_env):
        assert e["AWS_ENDPOINT_URL"] == "http://minio:9000"
        assert (e["AWS_ACCESS_KEY_ID"], e["AWS_SECRET_ACCESS_KEY"]) == ("minioadmin", "minioadmin")
    # The retraining DAG's storage is the bucket that minio-init creates.
    bucket = env["HOROVOD_RETRAINING_STORAGE"].split("/")[2]
    assert f"mc mb --ignore-existing local/{bucket}" in " ".join(compose["services"]["minio-init"]["command"])


def test_the_token_wrapper_refuses_to_start_without_a_token(compose, tmp_path):
    # Without a ray_default connection the provider would start its own Ray cluster in Airflow.
    run = run_token_wrapper(airflow_env(compose)["AHP_RAY_CONN_JSON"], tmp_path / "missing")
    assert run.returncode == 1 and run.stdout == "" and "no Ray token" in run.stderr


def test_every_service_waited_on_has_a_health_check(compose):
    services = compose["services"]
    waited = set()
    for name, service in services.items():
        depends_on = service.get("depends_on") or {}
        assert isinstance(depends_on, dict), f"{name}: give depends_on with conditions, not a list"
        for dependency, rule in depends_on.items():
            assert dependency in services, f"{name} depends on unknown {dependency}"
            assert rule.get("condition") in ("service_healthy", "service_completed_successfully"), (name, dependency)
            if rule["condition"] == "service_healthy":
                waited.add(dependency)
    assert waited == {"postgres", "minio", "ray-head", "airflow-apiserver"}
    for name in waited:
        assert services[name].get("healthcheck", {}).get("test"), f"{name} is waited on but has no health check"
    for name in (*AIRFLOW_SERVICES, "ray-worker"):
        assert services[name]["healthcheck"]["test"], name
    # Those that run tasks start once Ray and the bucket are ready.
    for name in ("airflow-scheduler", "airflow-triggerer"):
        assert {"ray-head", "minio-init", "postgres", "airflow-init"} <= set(services[name]["depends_on"]), name


def test_the_ray_token_is_a_secret_and_never_written_down(compose):
    assert compose["secrets"]["ray_token"] == {"file": "./secrets/ray_token"}
    services = compose["services"]
    for name in ("ray-head", "ray-worker", *AIRFLOW_SERVICES):
        assert "ray_token" in services[name]["secrets"], name
    assert compose["x-ray"]["environment"]["RAY_AUTH_MODE"] == "token"
    assert compose["x-ray"]["environment"]["RAY_AUTH_TOKEN_PATH"] == "/run/secrets/ray_token"
    for name, service in services.items():
        environment = service.get("environment") or {}
        assert "AIRFLOW_CONN_RAY_DEFAULT" not in environment, name
        assert "RAY_AUTH_TOKEN" not in environment, name
    texts = {p.name: p.read_text() for p in [*DOCKERFILES, DOCKER / "compose.yaml"]}
    for name, text in texts.items():
        assert not re.search(r"\bRAY_AUTH_TOKEN\b\s*[:=]", text), name
        assert not re.search(r"^\s*(ENV|ARG)\b.*TOKEN", text, re.MULTILINE), name
        # A generated token (hex or url-safe: 32 characters or more, with digits and lower case).
        words = re.findall(r"[A-Za-z0-9_-]{32,}", text)
        assert not [w for w in words if re.search(r"\d", w) and re.search(r"[a-z]", w)], name
    assert "docker/secrets/" in (DOCKER.parent / ".gitignore").read_text().splitlines()
