"""The wait of a new user (issue 52, bench/README.md): its block of bench/results.md, logs in bench/out/setup-time/.
Standard library only: ``python3 -m bench.setup_time`` (``BENCH_SETUP_DIR``: where the clones go)."""

from __future__ import annotations

import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.markdown import plain_table

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
RESULTS = BENCH / "results.md"
LOGS = BENCH / "out" / "setup-time"
# This figure's block of results.md (bench/run.py leaves it as it is); the text around it is people's.
BEGIN, END = "<!-- setup: written by python3 -m bench.setup_time -->", "<!-- /setup -->"
HEADING = "Set-up time: a first `make demo` from nothing"
# The targets of issue 52, in seconds.
COLD_S, WARM_S, SETUP_TEST_S = 180, 60, 30
# The variables that would point a cache elsewhere than XDG_CACHE_HOME.
CACHE_VARS = ("PIP_CACHE_DIR", "UV_CACHE_DIR", "HOROVOD_WHEEL_CACHE", "npm_config_cache", "NPM_CONFIG_CACHE")


def received_bytes() -> int:
    """Bytes received by the machine's network interfaces but loopback (/proc/net/dev)."""
    total = 0
    for line in Path("/proc/net/dev").read_text().splitlines()[2:]:
        name, data = line.split(":", 1)
        if name.strip() != "lo":
            total += int(data.split()[0])
    return total


def load() -> str:
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


def run(cmd: list[str], cwd: Path, env: dict, log: Path) -> tuple[float, list[tuple[float, str]]]:
    """Run cmd; its wall time, and each line of its output with the seconds since its start."""
    started = time.monotonic()
    lines = []
    with (
        open(log, "w") as out,
        subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc,
    ):
        for line in proc.stdout:
            at = time.monotonic() - started
            lines.append((at, line.rstrip("\n")))
            out.write(f"{at:7.1f} {line}")
        if proc.wait() != 0:
            raise SystemExit(f"{' '.join(cmd)} failed in {cwd} (exit {proc.returncode}); see {log}")
    return time.monotonic() - started, lines


def first(lines: list[tuple[float, str]], pattern: str) -> float | None:
    return next((at for at, line in lines if re.search(pattern, line)), None)


def du(path: Path) -> int:
    if not path.exists():
        return 0
    return int(subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True).stdout.split()[0])


def cold_run(n: int, root: Path) -> dict:
    clone, cache = root / f"clone-{n}", root / f"cache-{n}"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    cache.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in CACHE_VARS}
    env.update(XDG_CACHE_HOME=str(cache), npm_config_cache=str(cache / "npm"))
    row = {"load_start": load()}
    rx, wall_start = received_bytes(), time.time()
    row["demo_s"], lines = run(["make", "demo"], clone, env, LOGS / f"cold-{n}.log")
    row["downloaded"] = received_bytes() - rx
    row["load_end"] = load()
    # Set-up ends when both its steps have touched their stamps; demo.sh follows.
    stamps = [clone / ".venv" / ".ready", clone / ".build" / "ui.ready"]
    row["setup_s"] = max(p.stat().st_mtime for p in stamps) - wall_start
    row["venv_s"] = first(lines, r"\] \.venv: packages installed")
    row["compile_from"] = first(lines, r"\]   compiling \(")
    row["compile_to"] = first(lines, r"\]   cached ")
    row["ui_s"] = first(lines, r"\[build_ui\] the Training views built")
    row["horovod_s"] = first(lines, r"\] \.venv: Horovod built and installed")
    row["caches"] = {name: du(cache / name) for name in ("uv", "npm", "pip", "airflow-provider-horovod")}
    return {**row, "clone": clone, "env": env}


def fmt(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.0f} s"


def mb(n: int) -> str:
    return f"{n / 1e6:.0f} MB"


def section(rows: list[dict], warm_s: float, noop_s: float, setup_test_s: float) -> str:
    cold = statistics.median(r["demo_s"] for r in rows)
    compile_s = statistics.median(r["compile_to"] - r["compile_from"] for r in rows)
    dag_s = statistics.median(r["demo_s"] - r["setup_s"] for r in rows)
    header = ["run", "`make demo`", "set-up", ".venv's packages (uv)", "Horovod compiled", "Horovod in .venv"]
    header += ["UI built", "the DAG (`airflow dags test`)", "downloaded", "load average, start / end"]
    body = [
        [str(i), f"**{fmt(r['demo_s'])}**", fmt(r["setup_s"]), fmt(r["venv_s"])]
        + [f"{fmt(r['compile_from'])} to {fmt(r['compile_to'])}", fmt(r["horovod_s"]), fmt(r["ui_s"])]
        + [fmt(r["demo_s"] - r["setup_s"]), mb(r["downloaded"]), f"{r['load_start']} / {r['load_end']}"]
        for i, r in enumerate(rows, 1)
    ]
    caches = rows[-1]["caches"]

    def verdict(value: float, target: float) -> str:
        return f"**{'met' if value <= target else 'missed'}** ({value:.0f} s against {target} s)"

    return "\n".join(
        [
            plain_table(header, body),
            "",
            f"- A first `make demo` within {COLD_S} s, median of {len(rows)}: {verdict(cold, COLD_S)}. Of it "
            f"(medians): Horovod's compile (CMake's configure, make, the wheel) {compile_s:.0f} s, on the set-up's "
            f"critical path, and the DAG {dag_s:.0f} s.",
            f"- A second `make demo` within {WARM_S} s: {verdict(warm_s, WARM_S)}; its set-up, all done, "
            f"{noop_s:.1f} s (`make setup`).",
            f"- `make setup-test` on top within {SETUP_TEST_S} s: {verdict(setup_test_s, SETUP_TEST_S)}.",
            f"- The caches after a run: uv {mb(caches['uv'])} (unpacked; torch's {mb(du_torch(rows[-1]))} "
            f"of it), npm {mb(caches['npm'])}, pip {mb(caches['pip'])}, Horovod's wheel "
            f"{mb(caches['airflow-provider-horovod'])}.",
            "",
            f"Measured at {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC on {os.cpu_count()} cores.",
        ]
    )


def du_torch(row: dict) -> int:
    return sum(du(p) for p in (row["clone"] / ".venv" / "lib").glob("python*/site-packages/torch"))


def write(text: str) -> None:
    """Into results.md between BEGIN and END, the text around them people's: in place, else under a heading of
    its own before the chaos figure."""
    results = RESULTS.read_text()
    if BEGIN in results:
        start, end = results.index(BEGIN) + len(BEGIN), results.index(END)
        results = f"{results[:start]}\n{text}\n{results[end:]}"
    else:
        at = results.index("\n## Chaos") + 1 if "\n## Chaos" in results else len(results)
        results = f"{results[:at]}## {HEADING}\n\n{BEGIN}\n{text}\n{END}\n\n{results[at:]}"
    RESULTS.write_text(results)


def main() -> int:
    runs = int(os.environ.get("BENCH_RUNS", "3"))
    LOGS.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="ahp-setup-time-", dir=os.environ.get("BENCH_SETUP_DIR")))
    rows = []
    try:
        for n in range(1, runs + 1):
            rows.append(cold_run(n, root))
            print(f"cold run {n}: make demo {rows[-1]['demo_s']:.0f} s, set-up {rows[-1]['setup_s']:.0f} s", flush=True)
            if n < runs:
                shutil.rmtree(root / f"clone-{n}")
                shutil.rmtree(root / f"cache-{n}")
        last = rows[-1]
        warm_s, _ = run(["make", "demo"], last["clone"], last["env"], LOGS / "warm.log")
        noop_s, _ = run(["make", "setup"], last["clone"], last["env"], LOGS / "setup-noop.log")
        setup_test_s, _ = run(["make", "setup-test"], last["clone"], last["env"], LOGS / "setup-test.log")
        print(f"warm make demo {warm_s:.0f} s, make setup (done) {noop_s:.1f} s, make setup-test {setup_test_s:.0f} s")
        text = section(rows, warm_s, noop_s, setup_test_s)
    finally:
        if not os.environ.get("BENCH_KEEP"):
            shutil.rmtree(root, ignore_errors=True)
    write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
