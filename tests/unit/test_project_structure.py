"""The package's shape, checked rather than hoped for: every module has its mirrored unit test file;
imports flow one way, from the operators down to the contract, with no cycle anywhere; the code that
runs on the Ray cluster imports nothing of Airflow or of the provider's Airflow side; and the
modules a DAG file imports pay nothing for the training stack."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "airflow_provider_horovod"
NAME = PACKAGE.name

# Modules without a unit test file of their own, and why.
NOT_MIRRORED = {
    "operators/base": "the shared flow, tested once through RayTaskOperator: tests/unit/operators/test_ray.py",
    "runtime/aws_session": "tested with the Airflow side that makes the session: tests/unit/test_credentials.py",
    "local": "the embedded cluster starts real Ray processes: tests/integration/test_environments.py",
    "examples/quickstart": "an example's model code, trained by the DAG tests (tests/integration/test_dags.py)",
    "examples/retraining": "an example's model code, trained by the DAG tests (tests/integration/test_dags.py)",
    "examples/runner_style": "an example's model code, trained by the DAG tests (tests/integration/test_dags.py)",
}

# Who may import whom: a module imports only modules of its own layer or of lower ones. The
# runtime is a tower of its own beside the Airflow side, on the contract.
LAYERS = [
    ["exceptions", "contract", "documents", "failures", "atomic_files"],
    [
        "checks",
        "runtime_env_checks",
        "mlflow_checks",
        "horovodrun",
        "script_checks",
        "functions",
        "airflow_compat",
        "storage",
        "credentials",
        "local",
        "links/ray",
        "links/mlflow",
        "build_horovod",
        "horovod_source_edits",
        "cost",
        "lineage",
        "attempts",
        "parameters",
        "xcoms",
    ],
    [
        "plan",
        "smoke_plan",
        "hooks/ray_connection",
        "hooks/ray_routes",
        "hooks/ray_transport",
        "hooks/ray_packages",
        "hooks/ray",
    ],
    ["jobs/api", "jobs/events", "jobs/logs", "jobs/wait", "jobs/submit", "jobs/finish", "jobs/stop"],
    ["triggers/ray"],
    ["operators/base", "operators/ray", "operators/horovod", "sensors/ray"],
    ["decorators/horovod", "decorators/ray", "plugins/*"],
]
RUNTIME_MAY_IMPORT = {"contract", "documents", "exceptions", "failures", "atomic_files"}
CLUSTER_LIBRARIES = {
    "ray",
    "torch",
    "horovod",
    "pyarrow",
    "boto3",
    "botocore",
    "cloudpickle",
    "psutil",
    "numpy",
    "pandas",
    "mlflow",
}
# Optional on the cluster (an extra): imported only inside functions, only when a spec asks for it.
OPTIONAL_LIBRARIES = {"mlflow"}
STDLIB = set(sys.stdlib_module_names)


def modules() -> dict[str, Path]:
    """``jobs/wait`` -> its file, for every module of the package but the package faces."""
    return {
        path.relative_to(PACKAGE).with_suffix("").as_posix(): path
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "__init__.py"
    }


def imports(path: Path) -> list[tuple[str, int]]:
    """Every module ``path`` imports (at its top or inside a function), with the line."""
    tree = ast.parse(path.read_text(), str(path))
    package = path.relative_to(REPO).with_suffix("").parts[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[: len(package) - node.level + 1]) if node.level else ""
            module = ".".join(p for p in (base, node.module) if p)
            found += [(f"{module}.{alias.name}" if not node.module else module, node.lineno) for alias in node.names]
    return found


def own(imported: str, known: dict[str, Path]) -> str | None:
    """The package module an import names (``airflow_provider_horovod.jobs.wait`` -> ``jobs/wait``)."""
    if not imported.startswith(NAME + "."):
        return None
    parts = imported.split(".")[1:]
    while parts:
        key = "/".join(parts)
        if key in known:
            return key
        parts.pop()
    return None


def layer(module: str) -> int:
    for number, names in enumerate(LAYERS):
        if module in names or any(n.endswith("/*") and module.startswith(n[:-1]) for n in names):
            return number
    raise AssertionError(f"{module} is on no layer of this test: place it in LAYERS")


KNOWN = modules()
AIRFLOW_SIDE = [m for m in KNOWN if not m.startswith(("runtime/", "examples/"))]


@pytest.mark.parametrize("module", sorted(KNOWN))
def test_every_module_has_its_mirrored_unit_test_file(module):
    if module in NOT_MIRRORED:
        return
    folder, _, name = module.rpartition("/")
    mirror = REPO / "tests" / "unit" / folder / f"test_{name}.py"
    assert mirror.is_file(), f"{module}.py has no {mirror.relative_to(REPO)} (or a reason in NOT_MIRRORED)"


def test_the_exemptions_name_modules_that_exist():
    assert set(NOT_MIRRORED) <= set(KNOWN)


@pytest.mark.parametrize("module", sorted(AIRFLOW_SIDE))
def test_imports_flow_down_the_layers(module):
    mine = layer(module)
    for imported, line in imports(KNOWN[module]):
        target = own(imported, KNOWN)
        if target is None:
            continue
        assert not target.startswith("runtime/"), f"{module}.py:{line} imports the cluster's {target}"
        assert layer(target) <= mine, f"{module}.py:{line} imports {target}, a layer above it: a call back up"


@pytest.mark.parametrize("module", sorted(m for m in KNOWN if m.startswith("runtime/")) + sorted(RUNTIME_MAY_IMPORT))
def test_the_cluster_side_imports_no_airflow_and_nothing_of_the_airflow_side(module):
    for imported, line in imports(KNOWN[module]):
        top = imported.split(".")[0]
        target = own(imported, KNOWN)
        if target is not None:
            assert target.startswith("runtime/") or target in RUNTIME_MAY_IMPORT, f"{module}.py:{line} imports {target}"
        elif top != NAME:
            allowed = STDLIB | (CLUSTER_LIBRARIES if module.startswith("runtime/") else set())
            assert top in allowed, f"{module}.py:{line} imports {imported}, which a Ray image may not have"


def test_no_import_cycle_anywhere():
    graph = {m: {t for i, _ in imports(p) if (t := own(i, KNOWN)) and t != m} for m, p in KNOWN.items()}
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            assert state.get(nxt) != 1, f"import cycle: {' -> '.join(path[path.index(nxt) :] + [node, nxt])}"
            if nxt not in state:
                visit(nxt, [*path, node])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [])


@pytest.mark.parametrize("module", sorted(AIRFLOW_SIDE))
def test_the_airflow_side_imports_the_training_stack_only_inside_functions(module):
    tree = ast.parse(KNOWN[module].read_text())
    for node in tree.body:
        names = (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
            if isinstance(node, ast.ImportFrom)
            else []
        )
        heavy = [n for n in names if n.split(".")[0] in {"torch", "horovod", "ray", "pyarrow", *OPTIONAL_LIBRARIES}]
        assert not heavy, f"{module}.py imports {heavy} at its top: every DAG parse would pay for it"


@pytest.mark.parametrize("module", sorted(KNOWN))
def test_optional_libraries_are_imported_only_inside_functions(module):
    tree = ast.parse(KNOWN[module].read_text())
    for node in tree.body:
        names = (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
            if isinstance(node, ast.ImportFrom)
            else []
        )
        optional = [n for n in names if n.split(".")[0] in OPTIONAL_LIBRARIES]
        assert not optional, f"{module}.py imports {optional} at its top: every training would need it installed"
