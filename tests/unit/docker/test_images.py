"""docker/'s images, as far as they can be checked without a Docker engine: hadolint on each Dockerfile,
what each image installs and at which versions (scripts/versions.env), and the stand-ins make
docker-test builds for images it cannot pull."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
import yaml
from packaging.requirements import Requirement

from unit.docker.files import AIRFLOW_DOCKERFILE, DOCKER, DOCKERFILES, RAY_DOCKERFILE, ROOT, instructions, tool

# The training stack, which the Airflow side must not install.
CLUSTER_ONLY = ("torch", "ray", "horovod")


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


def test_both_images_are_there():
    assert [p.name for p in DOCKERFILES] == ["airflow.Dockerfile", "ray.Dockerfile"]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint(dockerfile):
    run = subprocess.run([tool("hadolint"), str(dockerfile)], capture_output=True, text=True, timeout=60)
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
    assert "-r" in deps, deps
    assert not wheel_with_extra(deps_run, "amazon"), deps
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
