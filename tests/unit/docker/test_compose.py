"""docker/compose.yaml, as far as it can be checked without a Docker engine: the Compose specification, the
connections it configures, its health checks and the way the Ray token travels."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from unit.docker.files import AIRFLOW_DOCKERFILE, BIN, DOCKER, DOCKERFILES, RAY_DOCKERFILE, instructions

AIRFLOW_SERVICES = ("airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer")
TOKEN = "token-from-the-secret"


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
    return subprocess.run(
        ["bash", "-c", head + 'printf %s "$AIRFLOW_CONN_RAY_DEFAULT"\n'],
        capture_output=True,
        text=True,
        timeout=60,
        env={
            "PATH": f"{BIN}:{os.environ['PATH']}",
            "AHP_RAY_TOKEN_FILE": str(token_file),
            "AHP_RAY_CONN_JSON": conn_json,
        },
    )


def test_compose_file_follows_the_compose_specification():
    # The schema ships inside check-jsonschema: no network needed.
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "check_jsonschema",
            "--builtin-schema",
            "vendor.compose-spec",
            str(DOCKER / "compose.yaml"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_compose_builds_with_the_args_the_dockerfiles_declare(compose):
    for anchor, dockerfile in (("x-airflow", AIRFLOW_DOCKERFILE), ("x-ray", RAY_DOCKERFILE)):
        build = compose[anchor]["build"]
        assert build["context"] == ".."
        assert build["dockerfile"] == f"docker/{dockerfile.name}"
        declared = {a.split("=")[0] for k, a in instructions(dockerfile) if k == "ARG"}
        assert set(build.get("args") or {}) <= declared, (anchor, build.get("args"), declared)
    assert set(compose["x-ray"]["build"]["args"]) == {"VARIANT"}


def test_connections_parse_into_what_the_provider_expects(compose, tmp_path, monkeypatch):
    from airflow.sdk import Connection

    from airflow_provider_horovod.hooks.ray import RayHook
    from airflow_provider_horovod.hooks.ray_connection import dashboard_url, read_extras
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
    assert read_extras("ray_default", ray.extra) == {}
    # What the hook makes of it, found the way a task finds it (the hook's own lookup would fall back
    # to an embedded local cluster if it found nothing: ask for the connection first).
    monkeypatch.setenv("AIRFLOW_CONN_RAY_DEFAULT", run.stdout)
    hook = RayHook()
    assert hook.get_connection("ray_default").host == "ray-head"
    endpoint = hook.endpoint
    assert endpoint.url == "http://ray-head:8265"
    assert endpoint.verify is True
    assert endpoint.runtime_env == {}
    assert dict(endpoint.headers) == {"Authorization": f"Bearer {TOKEN}"}
    # A real cluster, whose storage is the bucket: no shared disk with Airflow (shared_storage unset).
    assert endpoint.embedded is False
    assert endpoint.shared_storage is False

    aws = Connection.from_json(env["AIRFLOW_CONN_AWS_DEFAULT"], conn_id="aws_default")
    assert (aws.conn_type, aws.login, aws.password) == ("aws", "minioadmin", "minioadmin")
    assert aws.extra_dejson == {"endpoint_url": "http://minio:9000", "region_name": "us-east-1"}
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", env["AIRFLOW_CONN_AWS_DEFAULT"])
    s3 = Storage("aws_default")._s3
    assert s3.meta.endpoint_url == "http://minio:9000"
    assert s3.meta.region_name == "us-east-1"
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
    assert run.returncode == 1
    assert run.stdout == ""
    assert "no Ray token" in run.stderr


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


def test_the_jwt_secret_recipe_makes_a_secret_airflow_signs_with_and_no_key_length_warning(compose):
    import warnings

    from airflow.api_fastapi.auth.tokens import JWTGenerator
    from jwt import InsecureKeyLengthWarning

    recipe = re.compile(r'python3? -c "(import secrets; [^"]+)" > docker/secrets/airflow_jwt_secret')
    codes = {recipe.search((DOCKER / name).read_text())[1] for name in ("README.md", "compose.yaml")}
    assert len(codes) == 1, codes  # the README and the compose file give the same recipe
    assert compose["services"]["airflow-apiserver"]["environment"]["AIRFLOW__API_AUTH__JWT_SECRET_CMD"] == (
        "cat /run/secrets/airflow_jwt_secret"
    )

    def sign(secret: str) -> str:
        generator = JWTGenerator(secret_key=secret, valid_for=60, audience="apache-airflow")
        return generator.generate({"sub": "admin"})

    # What `cat` gives Airflow: the printed secret, its newline too.
    secret = subprocess.run([sys.executable, "-c", codes.pop()], capture_output=True, text=True, check=True).stdout
    with warnings.catch_warnings():
        warnings.simplefilter("error", InsecureKeyLengthWarning)
        assert sign(secret).count(".") == 2
        assert sign(secret.strip()).count(".") == 2
        # The check can fail: the old recipe's 43 characters are under HS512's 64 bytes.
        with pytest.raises(InsecureKeyLengthWarning):
            sign(
                subprocess.run(
                    [sys.executable, "-c", "import secrets; print(secrets.token_urlsafe(32))"],
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout.strip()
            )
