"""Figure 7: install size of the Airflow side. A fresh virtual environment with stock Airflow, then
the provider's wheel (core), then its ``[amazon]`` extra; and, for contrast, what the previous
packaging added (``ray[default]``, which the Airflow side needed before the hook spoke HTTP).

The environments live under bench/out/install-size and are deleted once measured. pip uses its
cache, the machine's pip configuration (indexes, constraints) and PyPI.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path

from bench.common import OUT, REPO, Figure, Target, fmt, log, plain_table, run_logged

AIRFLOW = os.environ.get("BENCH_INSTALL_AIRFLOW") or "apache-airflow==3.3.2"
RAY = os.environ.get("BENCH_INSTALL_RAY") or "ray[default]==2.60.0"
TARGET_MB = 50.0
MB = 1e6

HOW = """
Sizes are the apparent bytes of every file in the virtual environment (`du --apparent-size`),
in MB (10^6 bytes), byte-compiled `.pyc` files included as pip writes them. Steps, each installed
with `pip install` on top of the one before (pip's cache, the machine's pip configuration):

1. a fresh venv of Python {python} with stock `{airflow}`;
2. + the provider's wheel (`{wheel}`), core: what every Airflow image that runs the provider needs;
3. + its `[amazon]` extra (S3 storage and forwarded credentials through the Amazon provider);
4. for contrast, on a copy of step 1: + `{ray}`, what the Airflow side installed before the hook
   spoke HTTP (the previous packaging's Ray client on the Airflow side).
"""


def size(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def top_level(venv: Path) -> dict[str, int]:
    """Bytes per top-level entry of the venv's site-packages."""
    (site,) = glob.glob(str(venv / "lib" / "python*" / "site-packages"))
    out = {}
    for entry in os.scandir(site):
        out[entry.name] = size(Path(entry.path)) if entry.is_dir(follow_symlinks=False) else entry.stat().st_size
    return out


def clean_env() -> dict[str, str]:
    """The environment without the benchmarks' PYTHONPATH: with the checkout on the path, pip would
    take the provider for installed already."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}


def freeze(venv: Path) -> set[str]:
    run = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "list", "--format=freeze"],
        capture_output=True,
        text=True,
        check=True,
        env=clean_env(),
        cwd=venv,
    )
    return {line.split("==")[0].lower() for line in run.stdout.splitlines() if "==" in line}


def pip_install(venv: Path, args: list[str], log_name: str, expect: str | None = None) -> float:
    import time

    cmd = [str(venv / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check", *args]
    started = time.monotonic()
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, env=clean_env(), cwd=venv)
    wall = time.monotonic() - started
    (OUT / "logs").mkdir(parents=True, exist_ok=True)
    (OUT / "logs" / log_name).write_text(
        f"$ {' '.join(cmd)}\nrc={run.returncode} wall={wall:.2f}s\n--- stdout\n{run.stdout}\n--- stderr\n{run.stderr}"
    )
    if run.returncode != 0:
        raise RuntimeError(f"pip install {args} failed (rc {run.returncode}); see {OUT / 'logs' / log_name}")
    installed = [line for line in run.stdout.splitlines() if line.startswith("Successfully installed")]
    if expect and not any(expect in line for line in installed):
        raise RuntimeError(
            f"pip did not install {expect} (found installed already: a path leaking into the venv?); "
            f"see {OUT / 'logs' / log_name}"
        )
    return wall


def base_python() -> str:
    """Python 3.11 as the cluster's venv was made from (its base interpreter)."""
    base = getattr(sys, "_base_executable", None) or sys.executable
    return base if "3.11" in os.path.basename(base) or sys.version_info[:2] == (3, 11) else shutil.which("python3.11")


def wheel() -> Path:
    wheels = sorted(glob.glob(str(REPO / ".build" / "dist" / "*.whl")), key=os.path.getmtime)
    if not wheels:
        log("no wheel in .build/dist: building it")
        run_logged(
            [sys.executable, "-m", "build", "--wheel", "--outdir", str(REPO / ".build" / "dist"), str(REPO)],
            "install-size-build.log",
            timeout=600,
        )
        wheels = sorted(glob.glob(str(REPO / ".build" / "dist" / "*.whl")), key=os.path.getmtime)
    return Path(wheels[-1])


def step(name: str, venv: Path, before: dict | None, wall: float, packages_before: set[str] | None) -> dict:
    total = size(venv)
    entries = top_level(venv)
    packages = freeze(venv)
    record = {"step": name, "bytes": total, "install_s": wall, "packages": sorted(packages)}
    if before is not None:
        grown = {k: v - before["entries"].get(k, 0) for k, v in entries.items()}
        record["added_bytes"] = total - before["bytes"]
        record["biggest"] = sorted(((k, v) for k, v in grown.items() if v > 0), key=lambda kv: -kv[1])[:6]
        record["new_packages"] = sorted(packages - (packages_before or set()))
    record["entries"] = entries
    log(f"  {name}: {total / MB:.0f} MB")
    return record


def figure() -> Figure:
    python = base_python()
    whl = wheel()
    root = OUT / "install-size"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    stock, contrast = root / "stock", root / "contrast"
    records = []
    version = subprocess.run(
        [python, "-c", "import platform; print(platform.python_version())"], capture_output=True, text=True
    ).stdout.strip()
    fig = Figure(
        7, "Install size of the Airflow side", HOW.format(python=version, airflow=AIRFLOW, wheel=whl.name, ray=RAY)
    )
    try:
        log(f"fresh venv ({python}) + {AIRFLOW}")
        subprocess.run([python, "-m", "venv", str(stock)], check=True)
        empty = step("empty venv", stock, None, 0.0, None)
        wall = pip_install(stock, [AIRFLOW], "install-size-airflow.log")
        records.append(step(f"stock {AIRFLOW}", stock, empty, wall, set(empty["packages"])))
        shutil.copytree(stock, contrast, symlinks=True)
        log(f"+ provider core ({whl.name})")
        wall = pip_install(stock, [str(whl)], "install-size-core.log", expect="airflow-provider-horovod")
        records.append(step("+ provider (core)", stock, records[0], wall, set(records[0]["packages"])))
        log("+ [amazon]")
        wall = pip_install(stock, [f"{whl}[amazon]"], "install-size-amazon.log")
        records.append(step("+ [amazon]", stock, records[1], wall, set(records[1]["packages"])))
        log(f"contrast: stock + {RAY}")
        wall = pip_install(contrast, [RAY], "install-size-ray.log")
        records.append(
            step(f"stock + {RAY} (previous packaging)", contrast, records[0], wall, set(records[0]["packages"]))
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    from bench.common import save_raw

    save_raw("install_size", [{k: v for k, v in r.items() if k != "entries"} for r in records])
    body = []
    for r in records:
        added = r.get("added_bytes")
        biggest = ", ".join(f"{k} {v / MB:.1f}" for k, v in r.get("biggest", [])) or "-"
        body.append(
            [
                r["step"],
                fmt(r["bytes"] / MB),
                "-" if added is None or r is records[0] else fmt(added / MB),
                str(len(r.get("new_packages", []))) if r is not records[0] else str(len(r["packages"])),
                biggest,
                f"{r['install_s']:.0f}",
            ]
        )
    fig.tables.append(
        plain_table(
            [
                "step",
                "venv (MB)",
                "added (MB)",
                "distributions added",
                "biggest additions in site-packages (MB)",
                "pip install (s)",
            ],
            body,
        )
    )
    core, amazon, ray = records[1], records[2], records[3]
    fig.notes.append(f"Distributions the core adds to stock Airflow: {', '.join(core['new_packages']) or 'none'}.")
    fig.notes.append(f"`[amazon]` adds {len(amazon['new_packages'])}: {', '.join(amazon['new_packages'])}.")
    fig.notes.append(f"{RAY} adds {len(ray['new_packages'])}: {', '.join(ray['new_packages'])}.")
    added = core["added_bytes"] / MB
    met = added <= TARGET_MB
    fig.targets.append(
        Target(
            "7. provider core adds at most 50 MB to stock Airflow",
            met,
            f"+{fmt(added)} MB over stock Airflow's {fmt(records[0]['bytes'] / MB)} MB; "
            f"{'met' if met else 'missed'} by "
            f"{fmt(abs(TARGET_MB - added))} MB (`[amazon]` adds {fmt(amazon['added_bytes'] / MB)} MB more; the "
            f"previous packaging's {RAY} added {fmt(ray['added_bytes'] / MB)} MB)",
            "" if met else "see the biggest additions: move what only the cluster needs out of the core dependencies",
        )
    )
    return fig
