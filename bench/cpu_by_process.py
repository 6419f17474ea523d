"""Where a command's CPU goes, by kind of process (bench/README.md); ``lost_upper_s`` bounds what is missed.
Usage: python -m bench.cpu_by_process OUT.json -- CMD ..."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from harness.processes import CpuSampler


def measure(cmd: list[str]) -> dict:
    with CpuSampler(every=1.0, only_new=True) as cpu:
        started = time.monotonic()
        code = subprocess.run(cmd).returncode
        wall = time.monotonic() - started
    by_kind = cpu.by_kind()
    return {
        "command": cmd,
        "exit_code": code,
        "wall_s": round(wall, 1),
        "cpu_s": round(sum(by_kind.values()), 1),
        "lost_upper_s": round(cpu.lost_upper_s, 1),
        "by_kind": {kind: round(seconds, 1) for kind, seconds in by_kind.items() if seconds >= 0.05},
    }


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print(__doc__, file=sys.stderr)
        return 2
    result = measure(argv[2:])
    with open(argv[0], "w") as f:
        json.dump(result, f, indent=1)
    print(f"\n{result['wall_s']} s wall, {result['cpu_s']} CPU-s (at most {result['lost_upper_s']} CPU-s missed)")
    for kind, cpu in result["by_kind"].items():
        print(f"{cpu:9.1f} CPU-s {100 * cpu / max(result['cpu_s'], 1e-9):5.1f} %  {kind}")
    return result["exit_code"]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
