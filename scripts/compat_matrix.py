"""make compat: every tested Ray minor and every torch of the Horovod build against the same checks, and
docs/compatibility.md written from the results.

    python scripts/compat_matrix.py [--minors 2.50.1,2.55.1] [--torch 3.11:2.1.2,...] [--skip-ray] [--skip-torch]
                             [--doc-only]

For each Ray minor (the latest patch of each, ``MINORS``): Ray laid over the cluster's environment
(scripts/setup_ray_layer.sh; the newest is .venv's own), the cluster-side probes
(tests/unit/runtime/test_ray_compat.py) run on it, and tests/integration/test_ray_versions.py against a
head of it, from Airflow's environment, as make test runs them. For each (Python, torch) of ``TORCH``:
a fresh environment with that torch, Horovod built there by the provider's build command (the wheel
cached under .build/compat/wheels: only the first run compiles), its check
(`horovodrun --check-build`), and a 2-rank Gloo allreduce. Results are kept in .build/compat/results.json
(a later run with --minors adds to them); the page is written from all of them. Standard library only.
"""

from __future__ import annotations

import argparse
import datetime
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / ".build" / "compat"
RESULTS = OUT / "results.json"
DOC = REPO / "docs" / "compatibility.md"
CLUSTER_PYTHON = REPO / ".venv" / "bin" / "python"
AIRFLOW_PYTEST = REPO / ".venv-airflow" / "bin" / "pytest"
# The latest patch of every minor of contract.RAY_VERSIONS; the newest is the cluster environment's own.
MINORS = ("2.50.1", "2.51.2", "2.52.1", "2.53.0", "2.54.1", "2.55.1", "2.56.1", "2.57.1", "2.58.1", "2.59.0", "2.60.0")
# (cluster Python, torch): the oldest torch pyproject.toml claims on each Python (torch 2.1 has no
# Python 3.12 wheels: 2.2 is the oldest there), and the newest release.
TORCH = (("3.11", "2.1.2"), ("3.11", "2.15.0"), ("3.12", "2.2.2"), ("3.12", "2.15.0"))
# The GPU architecture whose kernels a torch build compiles (sm_90: H100, H200).
CUDA_CC_LIST = "90"
ALLREDUCE = (
    "import horovod.torch as hvd, torch; hvd.init(); "
    "total = hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum, name='ones').item(); "
    "assert total == hvd.size() == 2, total; print('allreduce', total)"
)
# The integration checks: (column, test name, parameter) of tests/integration/test_ray_versions.py.
TRAIN, BUG = (
    "test_a_killed_worker_resumes_from_its_checkpoint_and_the_checkpoint_reaches_xcom",
    "test_a_users_bug_fails_the_task_once_with_its_class",
)
APIS = ("auto", "v2", "legacy")
# auto runs legacy on the oldest minor and v2 on the newest: there, the other API runs too.
DEFAULT_APIS = {MINORS[0]: ("auto", "v2"), MINORS[-1]: ("auto", "legacy")}
COLUMNS = (
    *[(f"{api}: trains, resumes", TRAIN, api) for api in APIS],
    *[(f"{api}: user's bug fails once", BUG, api) for api in APIS],
    ("@task.ray", "test_a_ray_task_returns_its_value", None),
    ("elastic num_workers", "test_elastic_workers_need_elastic_scaling", None),
    ("no-token connection", "test_a_connection_without_a_token_works", None),
)


def say(line: str) -> None:
    print(f"[compat] {line}", flush=True)


def load() -> dict:
    return json.loads(RESULTS.read_text()) if RESULTS.exists() else {"ray": {}, "torch": {}}


def save(part: str, key: str, row: dict) -> dict:
    """Put one row into the kept results and return them all. The file is read again under a lock, so that a
    Ray run and a torch build running at once (hours apart in their starts) keep each other's rows."""
    OUT.mkdir(parents=True, exist_ok=True)
    with open(OUT / "results.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        results = load()
        results[part][key] = row
        partial = RESULTS.with_suffix(".partial")
        partial.write_text(json.dumps(results, indent=1, sort_keys=True))
        os.replace(partial, RESULTS)
    return results


# --- Ray minors ------------------------------------------------------------------------------------


def junit(path: Path) -> dict[str, dict]:
    """test id (``name[param]``) -> {"outcome": pass|fail|skip, "message", "properties", "time_s"}."""
    if not path.exists():
        return {}
    found = {}
    for case in ET.parse(path).iter("testcase"):
        outcome, message = "pass", ""
        for kind in ("failure", "error", "skipped"):
            node = case.find(kind)
            if node is not None:
                outcome = "skip" if kind == "skipped" else "fail"
                message = (node.get("message") or node.text or "").strip()
                break
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        found[case.get("name")] = {
            "outcome": outcome,
            "message": message,
            "properties": props,
            "time_s": round(float(case.get("time") or 0), 1),
        }
    return found


def run_minor(version: str, apis: tuple[str, ...]) -> dict:
    """The probes and the integration checks on one Ray minor, the trainer APIs' ones for ``apis``."""
    layer = ""
    if version != MINORS[-1]:
        layer = subprocess.run(
            ["scripts/setup_ray_layer.sh", version], cwd=REPO, check=True, capture_output=True, text=True
        ).stdout.strip()
    OUT.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    probes_xml = OUT / f"probes-{version}.xml"
    probes_env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (layer, str(REPO)) if p)}
    probes = subprocess.run(
        [str(CLUSTER_PYTHON), "-m", "pytest", "-p", "no:cacheprovider", "-q", f"--junitxml={probes_xml}",
         "tests/unit/runtime/test_ray_compat.py"],
        cwd=REPO, env=probes_env, capture_output=True, text=True,
    )  # fmt: skip
    say(f"Ray {version}: probes {'pass' if probes.returncode == 0 else 'FAIL'}")
    checks_xml = OUT / f"checks-{version}.xml"
    env = {
        **os.environ,
        "AHP_CLUSTER_PYTHON": str(CLUSTER_PYTHON),
        "AHP_CLUSTER_PYTHONPATH": layer,
        "AHP_RAY_VERSIONS": "1",
    }
    checks = subprocess.run(
        [str(AIRFLOW_PYTEST), "-p", "no:cacheprovider", "-q", f"--junitxml={checks_xml}",
         f"--basetemp={REPO}/.test-airflow/pytest-compat", "tests/integration/test_ray_versions.py",
         "-k", " and ".join(f"not {api}" for api in APIS if api not in apis) or "test"],
        cwd=REPO, env=env, capture_output=True, text=True,
    )  # fmt: skip
    tail = (checks.stdout + checks.stderr).strip().splitlines()[-1:] or [""]
    say(f"Ray {version}: checks exit {checks.returncode}: {tail[0]}")
    return {
        "version": version,
        "probes": {"outcome": "pass" if probes.returncode == 0 else "fail", "cases": junit(probes_xml)},
        "checks": junit(checks_xml),
        "wall_s": round(time.monotonic() - started, 1),
        "run_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


# --- torch builds ------------------------------------------------------------------------------------


def interpreter(python: str) -> tuple[str, dict]:
    """The command of a Python minor, and the environment that selects it (pyenv's, where there is one)."""
    env = dict(os.environ)
    if shutil.which("pyenv"):
        versions = subprocess.run(["pyenv", "versions", "--bare"], capture_output=True, text=True).stdout.split()
        if picked := sorted((v for v in versions if re.fullmatch(rf"{re.escape(python)}\.\d+", v)), reverse=True):
            env["PYENV_VERSION"] = picked[0]
    found = shutil.which(f"python{python}")
    if not found:
        raise SystemExit(f"scripts/compat_matrix.py: no python{python} on PATH")
    return found, env


def build_torch(python: str, torch_version: str) -> dict:
    """A fresh environment with this torch; Horovod built (or taken from the cache) and checked there."""
    venv = OUT / f"torch-{torch_version}-py{python}"
    shutil.rmtree(venv, ignore_errors=True)
    cmd, env = interpreter(python)
    py = str(venv / "bin" / "python")
    result: dict = {"python": python, "torch": torch_version}
    started = time.monotonic()
    try:
        subprocess.run([cmd, "-m", "venv", str(venv)], env=env, check=True, capture_output=True)
        # A machine-wide pip constraint (some images cap torch) must not pick another torch than this one.
        pip_env = {**os.environ, "PIP_CONSTRAINT": os.devnull}
        subprocess.run(
            [py, "-m", "pip", "install", "-q", "--no-compile", f"torch=={torch_version}"],
            env=pip_env, check=True, capture_output=True, text=True,
        )  # fmt: skip
        result["install_s"] = round(time.monotonic() - started, 1)
        started = time.monotonic()
        # PyPI's torch is a CUDA build, so Horovod compiles its CUDA kernels even for the CPU: for one
        # architecture only (the check runs on the CPU), unless the caller names others.
        # Its own wheel cache: a wheel with one architecture's kernels stays out of the user's.
        build_env = {
            "HOROVOD_BUILD_CUDA_CC_LIST": CUDA_CC_LIST,
            **os.environ,
            "HOROVOD_WHEEL_CACHE": str(OUT / "wheels"),
            "PYTHONPATH": str(REPO),
        }
        build = subprocess.run(
            [py, "-m", "airflow_provider_horovod.build_horovod"], env=build_env, capture_output=True, text=True
        )
        result["build_s"] = round(time.monotonic() - started, 1)
        # The whole build's output, for reading why it failed (the page has only its last line).
        (OUT / f"build-{torch_version}-py{python}.log").write_text(build.stdout + build.stderr)
        result["compiled"] = build.returncode == 0 and "building horovod" in build.stdout
        result["build_log_tail"] = build.stdout.strip().splitlines()[-3:]
        if build.returncode != 0:
            result.update(outcome="fail", reason=(build.stdout + build.stderr).strip().splitlines()[-1])
            return result
        run = subprocess.run(
            [str(venv / "bin" / "horovodrun"), "--gloo", "-np", "2", "-H", "localhost:2", py, "-c", ALLREDUCE],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        ok = run.returncode == 0 and "allreduce 2.0" in run.stdout
        result.update(
            outcome="pass" if ok else "fail",
            reason="" if ok else (run.stdout + run.stderr).strip().splitlines()[-1:],
            check="horovodrun --check-build: PyTorch, Gloo; 2-rank Gloo allreduce",
        )
    except subprocess.CalledProcessError as err:
        result.update(outcome="fail", reason=f"{err.cmd[:4]} exit {err.returncode}: {(err.stderr or '')[-300:]}")
    finally:
        result["run_at"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        shutil.rmtree(venv, ignore_errors=True)  # the wheel is in the cache; the environment is GBs of torch
    return result


# --- the page ------------------------------------------------------------------------------------------


def cell(case: dict | None) -> str:
    if case is None:
        return "not run"
    note = case["properties"].get("compat", "")
    if case["outcome"] == "pass":
        # A check that a minor refuses what it cannot do, as it should: not supported there, and checked.
        if note.startswith("not supported"):
            return f"{note} (checked)"
        return f"pass ({note})" if note else "pass"
    if case["outcome"] == "skip":
        return case["message"].removeprefix("Skipped: ")
    first = case["message"].splitlines()[0] if case["message"] else "failed"
    return "fail: " + first[:140].replace("|", "\\|")


def test_id(name: str, param: str | None) -> str:
    return f"{name}[{param}]" if param else name


def page(results: dict) -> str:
    lines = [
        "# Compatibility",
        "",
        "Written by `make compat` (scripts/compat_matrix.py) from its last run of each row; do not edit by hand.",
        "",
        "## Ray minors",
        "",
        "Each minor's latest patch, laid over the cluster's environment (torch "
        f"{_version('TORCH')}, Horovod {_version('HOROVOD')}, Python {_version('PYTHON_CLUSTER')}); a head of it"
        " with 4 CPUs; the checks of `tests/integration/test_ray_versions.py` driven from Airflow "
        f"{_version('AIRFLOW')}'s environment, and the cluster-side probes of `tests/unit/runtime/test_ray_compat.py`."
        " A trainer API's cells: the operator trains 2 Horovod workers over Gloo, a worker is killed at epoch 2"
        " and the run resumes from its checkpoint (the checkpoint URI in XCom, the job's log in the task log);"
        " a bug in the training function fails the task once with `UserCodeError`. `auto` (the default) names"
        " the API it chose; every minor runs it. The API auto does not choose runs on the oldest and the newest"
        ' minor (`--apis` for others); "not run" elsewhere, to keep `make compat` near half an hour on 2 cores.'
        " A row's cells come from its own last run.",
        "",
        "| Ray | probes | " + " | ".join(c[0] for c in COLUMNS) + " | run at | wall |",
        "|---|---|" + "---|" * len(COLUMNS) + "---|---|",
    ]
    for version in MINORS:
        row = results["ray"].get(version)
        if row is None:
            lines.append(f"| {version} | not run | " + " | ".join("not run" for _ in COLUMNS) + " | | |")
            continue
        cells = [cell(row["checks"].get(test_id(name, param))) for _, name, param in COLUMNS]
        lines.append(
            f"| {row['version']} | {row['probes']['outcome']} | " + " | ".join(cells) + f" | {row['run_at']} | "
            f"{row['wall_s'] / 60:.1f} min |"
        )
    lines += [
        "",
        "What differs between the minors, and who decides (runtime/ray_compat.py probes for it; the Airflow side",
        "knows the cluster's version from its dashboard and refuses what needs a newer one before submitting):",
        "",
        "| feature | needs | before it |",
        "|---|---|---|",
        "| Train V2 as Ray's default (`trainer_api=\"auto\"` runs the V2 backend) | 2.51 | auto runs Ray's "
        'HorovodTrainer (Train V1); `trainer_api="v2"` still runs V2 (the job sets `RAY_TRAIN_V2_ENABLED=1`) |',
        "| token authentication of the dashboard | 2.52 | a connection without a password (or with a proxy's "
        "headers) |",
        "| elastic `num_workers=(min, max)` | 2.55 | refused before submission, naming the cluster's version "
        "and 2.55 |",
        "| an elastic run seeing a lost or a new node at once (the autoscaling coordinator's fresh view) | 2.60 |"
        " Ray's own elastic policy, which sees it up to 20 s late; the job's log says so |",
        '| segment reason "node lost" for a preemption (`PreemptingState`) | 2.58 | a preemption is a restart |',
        "",
        "Older than 2.50: refused by the connection check and at the job's start, naming the version and the "
        "tested range. Newer than 2.60 (untested): the job runs, with a warning in the task log, when every "
        "probe of what its trainer API uses passes; it fails at its start naming the missing ones otherwise. "
        "The `[cluster]` extra installs a tested minor.",
        "",
        "## torch",
        "",
        "Horovod built by `python -m airflow_provider_horovod.build_horovod` in a fresh environment with only "
        "that torch (from PyPI: CUDA builds, run on the CPU here), checked by `horovodrun --check-build` "
        "(PyTorch, Gloo) and a 2-rank Gloo allreduce. PyPI's torch is a CUDA build, against which Horovod compiles"
        f" its CUDA parts even for the CPU (the CUDA toolkit found by the build command; kernels for sm_{CUDA_CC_LIST}"
        " only, `HOROVOD_BUILD_CUDA_CC_LIST`). Build time: the compile, at the lowest priority beside the Ray runs"
        " on this project's 2-core machine (a wheel already in the cache installs in seconds).",
        "",
        "| Python | torch | result | compile | run at |",
        "|---|---|---|---|---|",
    ]
    for python, torch_version in TORCH:
        row = results["torch"].get(f"{python}:{torch_version}")
        if row is None:
            lines.append(f"| {python} | {torch_version} | not run | | |")
            continue
        outcome = row["outcome"] if row["outcome"] == "pass" else f"fail: {row.get('reason')}"
        compile_s = row.get("compile_s")
        lines.append(
            f"| {python} | {torch_version} | {outcome} | "
            f"{f'{compile_s / 60:.1f} min' if compile_s else 'cached'} | {row['run_at']} |"
        )
    return "\n".join(lines) + "\n"


def _version(key: str) -> str:
    text = (REPO / "scripts" / "versions.env").read_text()
    found = re.search(rf"^{key}=(\S+)", text, re.M)
    return found.group(1) if found else "?"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minors", help="comma-separated Ray versions (default: all of MINORS)")
    parser.add_argument("--torch", help="comma-separated PYTHON:TORCH (default: all of TORCH)")
    parser.add_argument(
        "--apis",
        help="the trainer APIs whose checks run on each minor (default: auto, the one the runtime picks, on "
        "every minor, and the API auto does not pick on the oldest and the newest: DEFAULT_APIS)",
    )
    parser.add_argument("--skip-ray", action="store_true")
    parser.add_argument("--skip-torch", action="store_true")
    parser.add_argument("--doc-only", action="store_true", help="write the page from the kept results")
    args = parser.parse_args(argv)
    results = load()
    if not args.doc_only and not args.skip_ray and not os.access(CLUSTER_PYTHON, os.X_OK):
        raise SystemExit(f"scripts/compat_matrix.py: no cluster environment at {CLUSTER_PYTHON}: make setup-test first")
    if not args.doc_only and not args.skip_ray:
        for version in args.minors.split(",") if args.minors else MINORS:
            apis = tuple(args.apis.split(",")) if args.apis else DEFAULT_APIS.get(version, ("auto",))
            save("ray", version, run_minor(version, apis))
    if not args.doc_only and not args.skip_torch:
        pairs = [tuple(p.split(":")) for p in args.torch.split(",")] if args.torch else TORCH
        for python, torch_version in pairs:
            say(f"torch {torch_version} on Python {python}")
            row = build_torch(python, torch_version)
            key = f"{python}:{torch_version}"
            # The compile time is what it took when it compiled; a cached wheel keeps the earlier figure.
            earlier = load()["torch"].get(key, {}).get("compile_s")
            row["compile_s"] = row.get("build_s") if row.get("compiled") else earlier
            save("torch", key, row)
            say(f"torch {torch_version} on Python {python}: {row['outcome']} {row.get('reason') or ''}")
    results = load()  # with the rows another run kept meanwhile
    DOC.write_text(page(results))
    say(f"wrote {DOC.relative_to(REPO)}")
    failed = [v for v, r in results["ray"].items() if any(c["outcome"] == "fail" for c in r["checks"].values())]
    failed += [k for k, r in results["torch"].items() if r["outcome"] != "pass"]
    if failed:
        say(f"failures: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
