"""Figure 7: install size of the Airflow side: stock Airflow, then the provider's wheel, then its ``[amazon]``
extra, and ``ray[default]`` (the previous packaging) for contrast, in fresh venvs under bench/out."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path

from bench.common import OUT, REPO, log, run_logged, save_raw
from bench.markdown import Figure, fmt, plain_table, target

AIRFLOW = os.environ.get("BENCH_INSTALL_AIRFLOW") or "apache-airflow==3.3.2"
RAY = os.environ.get("BENCH_INSTALL_RAY") or "ray[default]==2.60.0"
TARGET_MB = 50.0
MB = 1e6


def size(path: Path) -> int:
    """Bytes of the files under ``path``, links as links (a venv is still while it is measured)."""
    return sum(os.lstat(os.path.join(root, name)).st_size for root, _, files in os.walk(path) for name in files)


def top_level(venv: Path) -> dict[str, int]:
    """Bytes per top-level entry of the venv's site-packages."""
    (site,) = glob.glob(str(venv / "lib" / "python*" / "site-packages"))
    return {
        e.name: size(Path(e.path)) if e.is_dir(follow_symlinks=False) else e.stat().st_size for e in os.scandir(site)
    }


# Without the benchmarks' PYTHONPATH: with the checkout on it, pip would take the provider for installed.
CLEAN = {"PYTHONPATH": None, "PYTHONHOME": None, "VIRTUAL_ENV": None}


def freeze(venv: Path) -> set[str]:
    cmd = [str(venv / "bin" / "python"), "-m", "pip", "list", "--format=freeze"]
    run, _ = run_logged(cmd, "pip-freeze.log", env=CLEAN, cwd=venv)
    return {line.split("==")[0].lower() for line in run.stdout.splitlines() if "==" in line}


def install(name: str, venv: Path, args: list[str], log_name: str, before: dict, expect: str | None = None) -> dict:
    """``pip install`` of ``args`` into ``venv``: the step's record, against the one ``before``."""
    log(f"{name}: pip install {' '.join(args)}")
    cmd = [str(venv / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check", *args]
    run, wall = run_logged(cmd, f"install-size-{log_name}.log", env=CLEAN, timeout=1200, cwd=venv)
    installed = [line for line in run.stdout.splitlines() if line.startswith("Successfully installed")]
    if expect and not any(expect in line for line in installed):
        raise RuntimeError(f"pip did not install {expect} (found installed already: a path leaking into the venv?)")
    return step(name, venv, before, wall)


def base_python() -> str:
    """Python 3.11 as the cluster's venv was made from (its base interpreter)."""
    base = getattr(sys, "_base_executable", None) or sys.executable
    return base if "3.11" in os.path.basename(base) or sys.version_info[:2] == (3, 11) else shutil.which("python3.11")


def wheel() -> Path:
    dist = REPO / ".build" / "dist"
    if not glob.glob(str(dist / "*.whl")):
        log("no wheel in .build/dist: building it")
        cmd = [sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(REPO)]
        run_logged(cmd, "install-size-build.log")
    return Path(sorted(glob.glob(str(dist / "*.whl")), key=os.path.getmtime)[-1])


def step(name: str, venv: Path, before: dict | None, wall: float) -> dict:
    total = size(venv)
    entries = top_level(venv)
    packages = freeze(venv)
    record = {"step": name, "bytes": total, "install_s": wall, "packages": sorted(packages)}
    if before is not None:
        grown = {k: v - before["entries"].get(k, 0) for k, v in entries.items()}
        record["added_bytes"] = total - before["bytes"]
        record["biggest"] = sorted(((k, v) for k, v in grown.items() if v > 0), key=lambda kv: -kv[1])[:6]
        record["new_packages"] = sorted(packages - set(before["packages"]))
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
    version = subprocess.check_output([python, "-V"], text=True).split()[1]  # "Python 3.11.9"
    fig = Figure(7)
    try:
        log(f"fresh venv ({python})")
        subprocess.run([python, "-m", "venv", str(stock)], check=True)
        records.append(install(f"stock {AIRFLOW}", stock, [AIRFLOW], "airflow", step("empty venv", stock, None, 0.0)))
        shutil.copytree(stock, contrast, symlinks=True)
        records.append(install("+ provider (core)", stock, [str(whl)], "core", records[0], "airflow-provider-horovod"))
        records.append(install("+ [amazon]", stock, [f"{whl}[amazon]"], "amazon", records[1]))
        records.append(install(f"stock + {RAY} (previous packaging)", contrast, [RAY], "ray", records[0]))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    save_raw("install_size", [{k: v for k, v in r.items() if k != "entries"} for r in records])
    body = [
        [r["step"], fmt(r["bytes"] / MB), fmt(r["added_bytes"] / MB) if r is not records[0] else "-"]
        + [str(len(r["new_packages"] if r is not records[0] else r["packages"]))]
        + [", ".join(f"{k} {v / MB:.1f}" for k, v in r.get("biggest", [])) or "-", f"{r['install_s']:.0f}"]
        for r in records
    ]
    header = ["step", "venv (MB)", "added (MB)", "distributions added", "biggest additions in site-packages (MB)"]
    fig.tables.append(plain_table([*header, "pip install (s)"], body))
    core, amazon, ray = records[1], records[2], records[3]
    fig.notes.append(f"A fresh venv of Python {version}; the provider's wheel {whl.name}.")
    fig.notes.append(f"Distributions the core adds to stock Airflow: {', '.join(core['new_packages']) or 'none'}.")
    fig.notes.append(f"`[amazon]` adds {len(amazon['new_packages'])}: {', '.join(amazon['new_packages'])}.")
    fig.notes.append(f"{RAY} adds {len(ray['new_packages'])}: {', '.join(ray['new_packages'])}.")
    added = core["added_bytes"] / MB
    detail = f"+{fmt(added)} MB over stock Airflow's {fmt(records[0]['bytes'] / MB)} MB (`[amazon]` adds "
    detail += f"{fmt(amazon['added_bytes'] / MB)} MB more; the previous packaging's {RAY} added "
    detail += f"{fmt(ray['added_bytes'] / MB)} MB)"
    closing = "see the biggest additions: move what only the cluster needs out of the core dependencies"
    name = "7. provider core adds at most 50 MB to stock Airflow"
    fig.targets.append(target(name, added, TARGET_MB, detail, closing, unit=" MB"))
    return fig
