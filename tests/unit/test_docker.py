"""docker/: what can be checked without a Docker engine. hadolint on each Dockerfile, what each image
installs (and at which versions: scripts/versions.env), the compose file against the Compose
specification, the connections it configures, its health checks and the way the Ray token travels."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
import yaml
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
DOCKERFILES = sorted(DOCKER.glob("*.Dockerfile"))
AIRFLOW_DOCKERFILE = DOCKER / "airflow.Dockerfile"
RAY_DOCKERFILE = DOCKER / "ray.Dockerfile"
# The training stack, which the Airflow side must not install.
CLUSTER_ONLY = ("torch", "ray", "horovod")
BIN = Path(sys.executable).parent
AIRFLOW_SERVICES = ("airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer")
TOKEN = "token-from-the-secret"


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


@pytest.fixture(scope="module")
def versions() -> dict[str, str]:
    """scripts/versions.env, the stack's versions (KEY=VALUE lines, # comments)."""
    out = {}
    for line in (ROOT / "scripts" / "versions.env").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, sep, value = line.partition("=")
            assert sep, f"versions.env: {line!r} is not KEY=VALUE"
            out[key.strip()] = value.strip().strip("\"'")
    assert {"AIRFLOW", "RAY", "TORCH", "HOROVOD", "PYTHON_CLUSTER", "PYTHON_AIRFLOW"} <= set(out)
    return out


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of each instruction, comment lines dropped and continued lines joined,
    as Docker reads them."""
    out, current = [], ""
    for line in dockerfile.read_text().splitlines():
        if line.strip().startswith("#"):
            continue
        current = f"{current} {line.strip()}".strip()
        if current.endswith("\\"):
            current = current[:-1].rstrip()
            continue
        if current:
            keyword, _, arguments = current.partition(" ")
            out.append((keyword.upper(), arguments.strip()))
        current = ""
    assert not current, f"{dockerfile.name} ends inside a continued line"
    return out


def stages(dockerfile: Path) -> list[list[tuple[str, str]]]:
    """The build stages, each from its FROM on (instructions before the first FROM: global ARGs)."""
    out: list[list[tuple[str, str]]] = []
    for instruction in instructions(dockerfile):
        if instruction[0] == "FROM":
            out.append([])
        if out:
            out[-1].append(instruction)
    return out


def stage_named(dockerfile: Path, name: str) -> list[tuple[str, str]]:
    found = [s for s in stages(dockerfile) if s[0][1].lower().endswith(f" as {name}")]
    assert len(found) == 1, f"{dockerfile.name}: no single stage named {name!r}"
    return found[0]


def runs(stage: list[tuple[str, str]]) -> list[str]:
    return [arguments for keyword, arguments in stage if keyword == "RUN"]


def pip_installs(run: str) -> list[list[str]]:
    """The arguments of each `pip install` in a RUN command, up to the next `;`, `&&` or `||`."""
    return [shlex.split(m) for m in re.findall(r"\bpip install\b([^;&|]*)", run)]


def requirement_names(specs: list[str]) -> set[str]:
    return {Requirement(spec).name.lower().replace("_", "-") for spec in specs}


def wheel_with_extra(run: str, extra: str) -> list[str]:
    """The pip arguments that install the provider's wheel with `extra`: a path of the provider's
    wheel, or a shell variable given that path in the same RUN, followed by [extra]."""
    found = []
    for args in pip_installs(run):
        for arg in args:
            target, sep, _ = arg.partition(f"[{extra}]")
            if not sep or not arg.endswith(f"[{extra}]"):
                continue
            variable = re.fullmatch(r"\$\{?(\w+)(\[0\])?\}?", target)
            if variable:
                assigned = re.search(rf"\b{variable.group(1)}=\(?([^\s)]+)", run)
                target = assigned.group(1) if assigned else ""
            if re.fullmatch(r"/\S+/airflow_provider_horovod-[^/\s]*\.whl", target):
                found.append(arg)
    return found


def provider_wheel_is_built_and_copied(dockerfile: Path) -> None:
    """A first stage builds the provider's wheel from the repository; the final stage copies it."""
    builder = stage_named(dockerfile, "provider")
    copies = [arguments for keyword, arguments in builder if keyword == "COPY"]
    copied = {source for c in copies for source in c.split()[:-1] if not source.startswith("--")}
    assert {"pyproject.toml", "README.md", "airflow_provider_horovod"} <= copied, copies
    assert any("python -m build --wheel" in r or "pip wheel" in r for r in runs(builder)), runs(builder)
    final = stages(dockerfile)[-1]
    assert any(keyword == "COPY" and "--from=provider" in arguments for keyword, arguments in final), final


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


def test_both_images_are_there():
    assert [p.name for p in DOCKERFILES] == ["airflow.Dockerfile", "ray.Dockerfile"]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint(dockerfile):
    run = subprocess.run([tool("hadolint"), str(dockerfile)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr


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


def test_the_images_are_the_pinned_ones(versions):
    airflow_from = [a for k, a in stages(AIRFLOW_DOCKERFILE)[-1] if k == "FROM"]
    assert airflow_from == [f"apache/airflow:{versions['AIRFLOW']}-python{versions['PYTHON_AIRFLOW']}"]
    ray_froms = [s[0][1] for s in stages(RAY_DOCKERFILE)]
    py = versions["PYTHON_CLUSTER"].replace(".", "")
    assert f"rayproject/ray:{versions['RAY']}-py{py}-cpu AS base-cpu" in ray_froms, ray_froms
    assert f"rayproject/ray:{versions['RAY']}-py{py}-cu130 AS base-gpu" in ray_froms, ray_froms
    assert ray_froms[-1] == "base-${VARIANT}"
    # A function defined in a DAG file travels to the cluster pickled: one Python minor on both sides.
    assert versions["PYTHON_AIRFLOW"] == versions["PYTHON_CLUSTER"]
    for dockerfile in DOCKERFILES:
        builder = stage_named(dockerfile, "provider")[0][1]
        assert builder.startswith(f"python:{versions['PYTHON_CLUSTER']}-"), (dockerfile.name, builder)
    # Every version the Ray image names is versions.env's.
    ray_args = [a for r in runs(stages(RAY_DOCKERFILE)[-1]) for args in pip_installs(r) for a in args]
    torch = [a for a in ray_args if a.startswith("torch")]
    assert torch, torch
    assert set(torch) == {f"torch=={versions['TORCH']}"}, torch
    ray = [a for a in ray_args if re.match(r"ray\b", a)]
    assert ray == [f"ray[default,train]=={versions['RAY']}"], ray
    # The compose file's Airflow image carries the same version.
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    assert compose["x-airflow"]["image"].endswith(f":{versions['AIRFLOW']}")
    # And the README says so.
    readme = (DOCKER / "README.md").read_text()
    for words in (
        f"Airflow {versions['AIRFLOW']}",
        f"Ray {versions['RAY']} (Python {versions['PYTHON_CLUSTER']})",
        f"torch {versions['TORCH']}",
        f"Horovod {versions['HOROVOD']}",
        f"apache/airflow:{versions['AIRFLOW']}-python{versions['PYTHON_AIRFLOW']}",
    ):
        assert words in readme, words


def test_both_images_build_the_same_provider_wheel():
    for dockerfile in DOCKERFILES:
        provider_wheel_is_built_and_copied(dockerfile)
    builders = [stage_named(d, "provider") for d in DOCKERFILES]
    assert builders[0] == builders[1]


def test_the_airflow_image_installs_the_provider_wheel_with_its_amazon_extra(versions):
    text = AIRFLOW_DOCKERFILE.read_text()
    # A plain install, with the dependencies the provider declares.
    assert "--no-deps" not in text
    final = stages(AIRFLOW_DOCKERFILE)[-1]
    installs = [(r, args) for r in runs(final) for args in pip_installs(r)]
    # What the provider needs (the requirements stage's file), then the wheel: a change to the
    # provider's code rebuilds only the last.
    assert len(installs) == 2, installs
    (deps_run, deps), (run, args) = installs
    assert "-r" in deps and not wheel_with_extra(deps_run, "amazon"), deps
    assert (
        "COPY",
        "--from=requirements --chown=airflow:root /requirements.txt /tmp/provider-requirements.txt",
    ) in final
    assert wheel_with_extra(run, "amazon"), args
    assert not [a for a in args if a.endswith("]") and not a.endswith("[amazon]")], args
    # Airflow stays at the base image's version: its own AIRFLOW_VERSION (redefined nowhere), or that version.
    for arguments in (deps, args):
        pins = [a for a in arguments if a.startswith("apache-airflow")]
        assert pins in (["apache-airflow==${AIRFLOW_VERSION}"], [f"apache-airflow=={versions['AIRFLOW']}"]), pins
    assert not re.search(r"^\s*(ARG|ENV)\s+AIRFLOW_VERSION\b", text, re.MULTILINE | re.IGNORECASE)
    # The token wrapper stays the entrypoint.
    assert ("ENTRYPOINT", '["/opt/provider/with_ray_token.sh"]') in final
    assert any(k == "COPY" and a.endswith("docker/with_ray_token.sh /opt/provider/with_ray_token.sh") for k, a in final)


def test_the_airflow_side_has_neither_torch_nor_ray():
    for keyword, arguments in instructions(AIRFLOW_DOCKERFILE):
        for name in CLUSTER_ONLY:
            assert not re.search(rf"\b{name}\b", arguments, re.IGNORECASE), (keyword, arguments)
        assert "download.pytorch.org" not in arguments, arguments
        assert "EXAMPLES" not in arguments, arguments
    # What that install brings: the provider's core dependencies and its [amazon] extra.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = requirement_names([*project["dependencies"], *project["optional-dependencies"]["amazon"]])
    assert "apache-airflow" in names, names
    assert "apache-airflow-providers-amazon" in names, names
    assert not [n for n in names if n.startswith(CLUSTER_ONLY)], names
    assert {"ray", "torch"} <= requirement_names(project["optional-dependencies"]["cluster"])


def test_the_ray_image_installs_the_provider_with_its_cluster_extra_and_builds_horovod(versions):
    text = "\n".join(f"{k} {a}" for k, a in instructions(RAY_DOCKERFILE))  # comments may name them
    final = stages(RAY_DOCKERFILE)[-1]
    commands = runs(final)
    torch_at = [
        i for i, r in enumerate(commands) if f'"torch=={versions["TORCH"]}"' in r and "download.pytorch.org" in r
    ]
    build_at = [i for i, r in enumerate(commands) if "python -m airflow_provider_horovod.build_horovod" in r]
    deps_at = [i for i, r in enumerate(commands) if any("-r" in args for args in pip_installs(r))]
    provider_at = [i for i, r in enumerate(commands) if wheel_with_extra(r, "cluster")]
    assert len(torch_at) == len(build_at) == len(deps_at) == len(provider_at) == 1, commands
    # torch first (Horovod compiles against it), then Horovod, then what the provider needs, then the
    # provider: a change to the provider's code rebuilds only the last.
    assert torch_at[0] < build_at[0] < deps_at[0] < provider_at[0]
    branches = r'if \[ "\$\{VARIANT\}" = gpu \]; then (.*?) else (.*?) fi'
    gpu, cpu = re.search(branches, commands[torch_at[0]]).groups()
    assert "download.pytorch.org" not in gpu
    assert "--index-url https://download.pytorch.org/whl/cpu" in cpu
    gpu, cpu = re.search(branches, commands[build_at[0]]).groups()
    assert re.search(r"python -m airflow_provider_horovod\.build_horovod\b[^;&|]*\s--gpu\b", gpu), gpu
    assert "python -m airflow_provider_horovod.build_horovod" in cpu, cpu
    assert "--gpu" not in cpu, cpu
    # A plain install of the extra, which brings the runtime's packages: none named by hand.
    args = [a for r in commands for a in (x for xs in pip_installs(r) for x in xs)]
    assert "--no-deps" not in args
    assert not [a for a in args if re.match(r"(cloudpickle|boto3|pyarrow)\b", a)], args
    # The module does the C++17 edits and the --check-build check; the old script is gone.
    for gone in ("scripts/build_horovod.sh", "horovodrun", "sed ", "CMAKE_CXX_STANDARD"):
        assert gone not in text, gone
    # g++ and make as root, then the image's ray user again.
    assert any("apt-get install -y --no-install-recommends g++ make" in r for r in commands)
    users = [a for k, a in final if k == "USER"]
    assert users == ["0", "1000"], users


def test_horovod_s_layer_depends_only_on_torch_and_the_build_command_s_files():
    final = stages(RAY_DOCKERFILE)[-1]
    build = next(i for i, (k, a) in enumerate(final) if k == "RUN" and "airflow_provider_horovod.build_horovod" in a)
    copied = [a.split() for k, a in final[:build] if k == "COPY"]
    assert not [c for c in copied if any(w.startswith("--from") for w in c)], copied
    sources = [w for c in copied for w in c[:-1] if not w.startswith("--")]
    # What the build command imports from the provider, found from its own imports: all copied, nothing else.
    package = ROOT / "airflow_provider_horovod"
    needed, todo = set(), ["build_horovod"]
    while todo:
        module = todo.pop()
        needed.add(module)
        imported = re.findall(
            r"^from airflow_provider_horovod\.(\w+) import", (package / f"{module}.py").read_text(), re.M
        )
        todo += [m for m in imported if m not in needed]
    assert sorted(sources) == sorted(f"airflow_provider_horovod/{m}.py" for m in needed), sources
    # The package they form has no __init__.py (the provider's imports the rest of it).
    assert "__init__" not in "".join(sources)


@pytest.mark.parametrize(("dockerfile", "extra"), [(AIRFLOW_DOCKERFILE, "amazon"), (RAY_DOCKERFILE, "cluster")])
def test_the_requirements_layer_is_the_provider_s_dependencies_with_its_extra(dockerfile, extra):
    stage = stage_named(dockerfile, "requirements")
    copied = [a.split()[:-1] for k, a in stage if k == "COPY"]
    assert copied == [["pyproject.toml"]], copied
    (command,) = runs(stage)
    script = shlex.split(command.partition(">")[0])
    assert script[:2] == ["python", "-c"], script
    code = script[2].replace("/tmp/pyproject.toml", str(ROOT / "pyproject.toml"))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True).stdout
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert out.split("\n")[:-1] == [*project["dependencies"], *project["optional-dependencies"][extra]]
    # The final stage installs that file.
    copies = [a for k, a in stages(dockerfile)[-1] if k == "COPY" and a.startswith("--from=requirements ")]
    assert [c.split()[-2:] for c in copies] == [["/requirements.txt", "/tmp/provider-requirements.txt"]], copies


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


STANDINS = DOCKER / "standins"


@pytest.mark.parametrize("dockerfile", sorted(STANDINS.glob("*.Dockerfile")), ids=lambda p: p.name)
def test_hadolint_on_the_stand_ins(dockerfile):
    run = subprocess.run([tool("hadolint"), str(dockerfile)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr


def test_every_base_image_has_a_stand_in_at_the_stack_s_versions(compose, versions):
    """make docker-test replaces each image it cannot pull by a stand-in of the same name
    (scripts/docker_test.sh builds them from docker/standins/), at versions.env's versions."""
    script = (ROOT / "scripts" / "docker_test.sh").read_text()
    built = {b.strip('"') for b in re.findall(r"^\s*build (\S+) \"\$context/", script, re.MULTILINE)}
    # The MinIO images are built under the tags compose.yaml names, read from it by the script.
    minio = {s["image"] for s in compose["services"].values() if s.get("image", "").startswith("minio/")}
    assert {"$minio", "$mc"} <= built and len(minio) == 2, (built, minio)
    stages = {f"base-{v}" for v in ("cpu", "gpu")} | {"provider"}
    bases = {a.split()[0] for d in DOCKERFILES for k, a in instructions(d) if k == "FROM"}
    pulled = {b for b in bases if b not in stages and not b.startswith("base-$") and "cu130" not in b}
    pulled |= {s["image"] for s in compose["services"].values() if "build" not in s and "<<" not in s}
    pulled -= {s for s in pulled if s.startswith("airflow-provider-horovod/")}
    assert pulled - minio == built - {"$minio", "$mc"}, (pulled, built)
    airflow = (STANDINS / "airflow.Dockerfile").read_text()
    assert f"AIRFLOW_VERSION={versions['AIRFLOW']}" in airflow
    assert f'"ray[default]=={versions["RAY"]}"' in (STANDINS / "ray.Dockerfile").read_text()
    assert f"torch-{versions['TORCH']}+cpu-cp{versions['PYTHON_CLUSTER'].replace('.', '')}-" in script
