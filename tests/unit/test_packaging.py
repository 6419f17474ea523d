"""The package as users install it: the wheel and sdist `make test` built (`python -m build`), what
they hold, what they ask pip for, and `twine check`."""

from __future__ import annotations

import re
import subprocess
import zipfile
from pathlib import Path

import pytest
import tomllib

REPO = Path(__file__).resolve().parents[2]
DIST = REPO / ".build" / "dist"


def built(pattern: str) -> Path:
    found = sorted(DIST.glob(pattern))
    if not found:
        pytest.fail(f"no {pattern} in {DIST}: `make setup-test` builds it")
    return found[-1]


def metadata() -> str:
    with zipfile.ZipFile(built("*.whl")) as wheel:
        name = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
        return wheel.read(name).decode()


def test_the_wheel_holds_the_package_runtime_and_examples_but_no_tests_or_benchmarks():
    with zipfile.ZipFile(built("*.whl")) as wheel:
        names = wheel.namelist()
    for module in (
        "airflow_provider_horovod/runtime/entrypoint.py",
        "airflow_provider_horovod/runtime/horovod_backend.py",
        "airflow_provider_horovod/examples/quickstart.py",
        "airflow_provider_horovod/build_horovod.py",
        "airflow_provider_horovod/py.typed",
    ):
        assert module in names, module
    assert not [n for n in names if n.startswith(("tests/", "bench/", "dags/", "docker/"))]
    assert any(n.endswith("entry_points.txt") for n in names)


def test_core_dependencies_are_the_airflow_sides_as_ranges():
    requires = re.findall(r"^Requires-Dist: (.+)$", metadata(), re.M)
    core = [r for r in requires if "extra ==" not in r]
    assert any(r.startswith("apache-airflow>=3.1") for r in core)
    assert not any("==" in r for r in core), core
    for heavy in ("torch", "horovod", "ray", "boto3", "pyarrow"):
        assert not any(re.match(rf"{heavy}\b", r) for r in core), (heavy, core)
    cluster = [r for r in requires if 'extra == "cluster"' in r]
    assert any(r.startswith("ray[default,train]") for r in cluster)
    assert any(r.startswith("torch") for r in cluster)
    assert any(r.startswith("apache-airflow-providers-amazon") for r in requires if 'extra == "amazon"' in r)
    assert not any("horovod" in r for r in requires)  # built by the package's own command instead


def test_the_cluster_extra_declares_the_ray_range_the_runtime_checks():
    from airflow_provider_horovod.contract import RAY_VERSIONS

    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["cluster"]
    (ray,) = [r for r in extra if r.startswith("ray[")]
    low, high = (".".join(map(str, v)) for v in RAY_VERSIONS)
    assert ray.endswith(f">={low},<{high}"), ray


def test_twine_check_passes_on_the_wheel_and_the_sdist():
    from harness.cluster import cluster_python

    done = subprocess.run(
        [cluster_python(), "-m", "twine", "check", str(built("*.whl")), str(built("*.tar.gz"))],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("PASSED") == 2, done.stdout + done.stderr


def test_the_readme_table_shows_the_tested_versions():
    versions = dict(
        line.split("=", 1)
        for line in (REPO / "scripts" / "versions.env").read_text().splitlines()
        if line and not line.startswith("#")
    )
    readme = (REPO / "README.md").read_text()
    table = readme.split("## Tested", 1)[1].split("\n## ", 1)[0]
    assert f"| {versions['PYTHON_AIRFLOW']} | {versions['AIRFLOW']} (with the Amazon and OpenLineage" in table
    assert f"| {versions['PYTHON_AIRFLOW_OLDEST']} | {versions['AIRFLOW_OLDEST']} |" in table
    assert f"| {versions['RAY']} | {versions['TORCH']} (CPU) | {versions['HOROVOD']}, built here |" in table
    assert f"| {versions['RAY_OLDEST']} | {versions['TORCH']} (CPU) | {versions['HOROVOD']}, built here |" in table
