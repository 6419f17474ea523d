"""docker/: what can be checked without a Docker engine. hadolint on each Dockerfile, the compose
file against the Compose specification, the connections it configures, and its health checks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

DOCKER = Path(__file__).resolve().parents[2] / "docker"
DOCKERFILES = sorted(DOCKER.glob("*.Dockerfile"))
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def interpolate(value: str) -> str:
    """Compose's `${VAR:-default}` with the defaults (no .env)."""
    import re

    return re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: os.environ.get(m.group(1), m.group(2)), value)


def test_both_images_are_there():
    assert [p.name for p in DOCKERFILES] == ["airflow.Dockerfile", "ray.Dockerfile"]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint(dockerfile):
    run = subprocess.run([str(BIN / "hadolint"), str(dockerfile)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr


def test_compose_file_follows_the_compose_specification():
    run = subprocess.run([str(BIN / "check-jsonschema"), "--builtin-schema", "vendor.compose-spec",
                          str(DOCKER / "compose.yaml")], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_images_are_the_pinned_ones():
    airflow = (DOCKER / "airflow.Dockerfile").read_text()
    ray = (DOCKER / "ray.Dockerfile").read_text()
    assert "FROM apache/airflow:3.3.2-python3.11" in airflow
    assert "rayproject/ray:2.60.0-py311-cpu" in ray and "rayproject/ray:2.60.0-py311-cu" in ray
    assert '"torch==2.13.0"' in ray and "scripts/build_horovod.sh" in ray
    assert "HOROVOD_GPU_OPERATIONS=NCCL" in ray


def test_connections_parse_into_what_the_provider_expects(compose, tmp_path):
    from airflow.models.connection import Connection

    from airflow_provider_horovod.hooks.ray import dashboard_url, parse_extras

    env = {k: interpolate(v) for k, v in compose["x-airflow"]["environment"].items()}
    # What with_ray_token.sh does in the container: the token comes from the secret file.
    token_file = tmp_path / "ray_token"
    token_file.write_text("token-from-the-secret\n")
    script = DOCKER / "with_ray_token.sh"
    body = script.read_text().split("exec /usr/bin/dumb-init")[0] + 'printf %s "$AIRFLOW_CONN_RAY_DEFAULT"\n'
    run = subprocess.run(["bash", "-c", body], capture_output=True, text=True, timeout=60,
                         env={"PATH": f"{BIN}:{os.environ['PATH']}", "AHP_RAY_TOKEN_FILE": str(token_file),
                              "AHP_RAY_CONN_JSON": env["AHP_RAY_CONN_JSON"]})
    assert run.returncode == 0, run.stderr

    ray = Connection.from_json(run.stdout, conn_id="ray_default")
    assert ray.conn_type == "ray" and ray.password == "token-from-the-secret"
    assert dashboard_url(ray.host, ray.port, ray.schema) == "http://ray-head:8265"
    assert parse_extras("ray_default", ray.extra_dejson) == (False, {}, {})
    assert "password" not in env["AHP_RAY_CONN_JSON"]

    aws = Connection.from_json(env["AIRFLOW_CONN_AWS_DEFAULT"], conn_id="aws_default")
    assert (aws.conn_type, aws.login, aws.password) == ("aws", "minioadmin", "minioadmin")
    assert aws.extra_dejson["endpoint_url"] == "http://minio:9000"
    # The DAGs' storage is the bucket that minio-init creates.
    bucket = env["HOROVOD_RETRAINING_STORAGE"].split("/")[2]
    assert f"local/{bucket}" in " ".join(compose["services"]["minio-init"]["command"])


def test_every_service_waited_on_has_a_health_check(compose):
    services = compose["services"]
    waited = set()
    for name, service in services.items():
        for dependency, rule in (service.get("depends_on") or {}).items():
            assert dependency in services, f"{name} depends on unknown {dependency}"
            assert rule.get("condition") in ("service_healthy", "service_completed_successfully"), (name, dependency)
            if rule["condition"] == "service_healthy":
                waited.add(dependency)
    assert {"postgres", "minio", "ray-head", "airflow-apiserver"} <= waited
    for name in waited:
        assert services[name].get("healthcheck", {}).get("test"), f"{name} is waited on but has no health check"
    for name in ("airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer"):
        assert name in services and services[name]["healthcheck"]["test"], name


def test_the_ray_token_is_a_secret_and_never_written_down(compose):
    assert compose["secrets"]["ray_token"] == {"file": "./secrets/ray_token"}
    for name in ("ray-head", "ray-worker", "airflow-scheduler", "airflow-triggerer"):
        assert "ray_token" in compose["services"][name]["secrets"], name
    assert compose["x-ray"]["environment"]["RAY_AUTH_TOKEN_PATH"] == "/run/secrets/ray_token"
    text = (DOCKER / "compose.yaml").read_text() + "".join(p.read_text() for p in DOCKERFILES)
    assert "RAY_AUTH_TOKEN:" not in text and "RAY_AUTH_TOKEN=" not in text
    assert "docker/secrets/" in (DOCKER.parent / ".gitignore").read_text().splitlines()
