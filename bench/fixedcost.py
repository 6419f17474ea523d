"""Figure 10: the fixed cost of a training task. The same short Horovod work on the same two hosts
(figure 9's network namespaces, one rank per host) run two ways, each from nothing:

- A: a training task, ``HorovodTrainOperator`` (defaults: deferrable, Train V2) under ``airflow
  dags test`` (DAG ``bench_fixedcost`` in ``bench/dags/bench_dags.py``), the Ray cluster reached
  through its dashboard as a deployment does;
- B: ``horovodrun -np 2 -H <host1>:1,<host2>:1 --gloo`` run on host 1 (its ``ssh`` to host 2 the
  figure 9 stand-in).

Both run ``work``: rank 0 notes when the function starts, when torch and Horovod are imported, when
``hvd.init()`` returns and when the steps are done. With the stamps the operator, the runtime
(``timings`` of the result record), Ray (the job's start and end) and Airflow (the task log) leave,
A's wall time is cut into stages; so is B's. Meanwhile every process's CPU time is sampled from
/proc, so each stage's cost can be told by who spent it (both hosts share this machine's cores).

Needs root (namespaces); otherwise the figure says why it was not measured.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import uuid

from bench.common import (
    AIRFLOW_BIN,
    OUT,
    REPO,
    Figure,
    Row,
    Sample,
    Target,
    fmt,
    log,
    plain_table,
    repeats,
    run_logged,
    save_raw,
    table,
    tagged_json,
)
from bench.workload import STAMP, fixed_work

TARGET_S = 10.0
SUBNET = "10.80.0"  # apart from the tests' hosts and figure 9's
BUCKET = "bench-fixedcost"
CONN_ID = "ray_bench_fixedcost"
DAG_ID = "bench_fixedcost"
WORK = {"features": 256, "hidden": 1024, "batch": 64, "steps": 200}
TIMINGS_FILE = OUT / "fixedcost-operator-timings.jsonl"
SAMPLE_S = 0.2
# "cached" (default): Python's bytecode cached as a pip install leaves it. This machine's environment sets
# PYTHONDONTWRITEBYTECODE=1 and the project's venvs are installed with --no-compile, so otherwise every
# process compiles what it imports, Ray's and torch's modules included (about twice the CPU of each
# import). The cache goes under bench/out, not into the shared venvs. "off": as this machine has it.
BYTECODE = os.environ.get("BENCH_BYTECODE", "cached")


# --- the two ways ------------------------------------------------------------------------------------


def through_horovodrun(bench) -> dict:
    hosts = bench.hosts
    bin_dir = os.path.dirname(bench.testhosts.cluster_python())
    ssh_hosts = {h.address: [h.netns, h.name] for h in hosts.hosts}
    command = (
        f"cd {REPO} && {bin_dir}/horovodrun -np 2 -H {hosts[0].address}:1,{hosts[1].address}:1 --gloo "
        f"--start-timeout 60 {bench.testhosts.cluster_python()} -m bench.fixedcost worker '{json.dumps(WORK)}'"
    )
    env = hosts.env(
        PATH=f"{bench.ssh_dir}:{bin_dir}:{os.environ.get('PATH', '')}",
        AHP_BENCH_SSH_HOSTS=json.dumps(ssh_hosts),
        PYTHONPATH=str(REPO),
    )
    with CpuSampler() as cpu:
        started = time.time()
        done = hosts.run(hosts[0], ["sh", "-c", command], env=env, timeout=300)
        ended = time.time()
    found = tagged_json(done.stdout, STAMP)
    if not found:
        raise RuntimeError(f"horovodrun printed no stamps:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    s = found[-1]
    return {
        "total_s": ended - started,
        "stages": {
            "launch (horovodrun, ssh, Python)": s["fn_start"] - started,
            "import torch, horovod": s["imported"] - s["fn_start"],
            "rendezvous (hvd.init)": s["hvd_ready"] - s["imported"],
            "work": s["work_done"] - s["hvd_ready"],
            "end (ranks exit, launcher exits)": ended - s["work_done"],
        },
        "cpu": cpu.by_kind(),
        "machine_cpu_s": cpu.machine_s,
    }


def through_operator(bench) -> dict:
    from airflow_provider_horovod.hooks.ray import RayHook

    name = f"fixedcost-{uuid.uuid4().hex[:6]}"
    env = {
        "BENCH_TIMINGS_FILE": str(TIMINGS_FILE),
        "BENCH_FIXEDCOST_CONN": CONN_ID,
        "BENCH_FIXEDCOST_STORAGE": f"s3://{BUCKET}/runs",
        "BENCH_FIXEDCOST_RAY_ADDRESS": bench.hosts.gcs_address,
        "BENCH_FIXEDCOST_WORK": json.dumps(WORK),
    }
    before = TIMINGS_FILE.read_text().count("\n") if TIMINGS_FILE.exists() else 0
    with CpuSampler() as cpu:
        started = time.time()
        run, _ = run_logged([AIRFLOW_BIN, "dags", "test", DAG_ID], f"{name}.log", env=env)
        ended = time.time()
    notes = [json.loads(line) for line in TIMINGS_FILE.read_text().splitlines()[before:]]
    notes = [n for n in notes if n["dag_id"] == DAG_ID]
    run_id = notes[0]["run_id"]
    execute_at = min(n["t"] for n in notes if n["event"] == "start")
    result_at = max(n["t"] for n in notes if n["event"] == "done")
    hook = RayHook(ray_conn_id=CONN_ID)
    (job,) = [
        j
        for j in hook.list_jobs()
        if (j.get("metadata") or {}).get("airflow_run_id") == run_id
        and (j.get("metadata") or {}).get("airflow_dag_id") == DAG_ID
    ]
    logs = hook.get_job_logs(job["submission_id"])
    (s,) = tagged_json(logs, STAMP)[-1:]
    (record,) = tagged_json(logs, "AHP_RESULT")[-1:]
    t = record["timings"]
    job_start, job_end = job["start_time"] / 1000, job["end_time"] / 1000
    driver_at = t.get("process_started_at") or t["started_at"]
    fit_at = t.get("fit_started_at") or t["started_at"]
    fit_end = fit_at + t["fit_s"] if t.get("fit_started_at") else t["finished_at"]
    stages = {
        "Airflow: dags test start to the operator's execute": execute_at - started,
        "submit: plan, checks, package upload": job_start - execute_at,
        "Ray job: supervisor, runtime env, driver process": driver_at - job_start,
        "driver: imports, payload, trainer": fit_at - driver_at,
        "Train: controller, worker group, backend": s["fn_start"] - fit_at,
        "import torch, horovod": s["imported"] - s["fn_start"],
        "rendezvous (hvd.init)": s["hvd_ready"] - s["imported"],
        "work": s["work_done"] - s["hvd_ready"],
        "Train's end: workers done to fit() returned": fit_end - s["work_done"],
        "driver's end: record, exit, job ended": job_end - fit_end,
        "Airflow: job ended to the operator's result": result_at - job_end,
        "Airflow: task end, dags test exit": ended - result_at,
    }
    return {
        "total_s": ended - started,
        "stages": stages,
        "cpu": cpu.by_kind(),
        "machine_cpu_s": cpu.machine_s,
        "submission_id": job["submission_id"],
        "timings": t,
        "deferred": "deferring" in (run.stdout + run.stderr).lower() or "TaskDeferred" in (run.stdout + run.stderr),
    }


# --- CPU by process ------------------------------------------------------------------------------------


def process_kind(cmdline: list[str]) -> str:
    """A short name for what a process is, from its command line."""
    if not cmdline:
        return "?"
    first = cmdline[0]
    if first.startswith("ray::"):
        return first[len("ray::") :].split(".", 1)[0].split(" ", 1)[0] or "ray worker"
    text = " ".join(cmdline)
    if "pytest" in text or "::test_" in first:
        return "other work on the machine (pytest)"
    for needle, kind in (
        ("default_worker.py", "Ray worker, starting"),
        ("ray.dashboard.subprocesses", "dashboard module"),
        ("dags test", "airflow dags test"),
        ("runtime.entrypoint", "job driver (runtime entrypoint)"),
        ("bench.fixedcost worker", "horovodrun rank"),
        ("horovodrun", "horovodrun launcher"),
        ("raylet", "raylet"),
        ("gcs_server", "gcs_server"),
        ("dashboard/agent.py", "dashboard agent"),
        ("runtime_env/agent", "runtime env agent"),
        ("dashboard.py", "dashboard"),
        ("dashboard/modules", "dashboard module"),
        ("log_monitor", "log monitor"),
        ("monitor.py", "autoscaler monitor"),
        ("moto", "moto (S3)"),
        ("bench.run", "bench (this process)"),
    ):
        if needle in text:
            return kind
    return os.path.basename(first)


def _proc_cpu() -> dict[int, tuple[float, str]]:
    tick = os.sysconf("SC_CLK_TCK")
    found = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = [p.decode(errors="replace") for p in f.read().split(b"\0") if p]
        except OSError:
            continue
        found[int(pid)] = ((int(fields[11]) + int(fields[12])) / tick, process_kind(cmdline))
    return found


def _machine_cpu() -> float:
    with open("/proc/stat") as f:
        fields = f.readline().split()[1:]
    tick = os.sysconf("SC_CLK_TCK")
    busy = sum(int(v) for i, v in enumerate(fields) if i not in (3, 4))  # all but idle and iowait
    return busy / tick


class CpuSampler:
    """CPU seconds each process spent while the block ran, by kind (sampled from /proc every
    ``SAMPLE_S``: a process that ends loses at most its last interval), and the machine's."""

    def __init__(self) -> None:
        self.first: dict[int, float] = {}
        self.last: dict[int, tuple[float, str]] = {}
        self.stop = threading.Event()
        self.machine_s = 0.0

    def _sample(self) -> None:
        for pid, (cpu, kind) in _proc_cpu().items():
            if pid not in self.last or self.last[pid][1] == "?" or cpu >= self.last[pid][0]:
                self.last[pid] = (cpu, kind if kind != "?" else self.last.get(pid, (0, "?"))[1])

    def _loop(self) -> None:
        while not self.stop.wait(SAMPLE_S):
            self._sample()

    def __enter__(self) -> CpuSampler:
        self.first = {pid: cpu for pid, (cpu, _) in _proc_cpu().items()}
        self.machine_start = _machine_cpu()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()
        self._sample()
        self.machine_s = _machine_cpu() - self.machine_start

    def by_kind(self) -> dict[str, float]:
        totals: dict[str, float] = {}
        for pid, (cpu, kind) in self.last.items():
            spent = cpu - self.first.get(pid, 0.0)
            if spent > 0.005:
                totals[kind] = totals.get(kind, 0.0) + spent
        return dict(sorted(totals.items(), key=lambda kv: -kv[1]))


# --- the figure ------------------------------------------------------------------------------------------


BYTECODE_HOW = {
    "cached": "cached, as a pip install leaves it (this machine's environment sets `PYTHONDONTWRITEBYTECODE=1` and "
    "the project's venvs are installed `--no-compile`: the figure caches bytecode under `bench/out/pycache` for "
    "every process on both paths, `PYTHONPYCACHEPREFIX`)",
    "off": "not cached, as this machine's environment has it (`PYTHONDONTWRITEBYTECODE=1`, venvs installed "
    "`--no-compile`): every process compiles the modules it imports",
}


def how(n: int) -> str:
    return f"""
Figure 9's two hosts (network namespaces on one bridge, Debian's `/etc/hosts`, a Ray node of 2 CPUs
on each, the head with token auth on host 1, moto for S3 in the root namespace), one rank per host
(`resources_per_worker={{"CPU": 2}}`). The same work on both paths, from a cold start each time
(`bench.workload.fixed_work`: import torch and Horovod, `hvd.init()`, {WORK["steps"]} SGD steps of an MLP
{WORK["features"]}-{WORK["hidden"]}-{WORK["hidden"]}-1 with `hvd.DistributedOptimizer`):

- *A*: `airflow dags test {DAG_ID}` (`bench/dags/bench_dags.py`): one `HorovodTrainOperator` task with
  its defaults (deferrable, Train V2, the provider's Horovod backend), the function by import path,
  checkpoints and the result record on S3 (moto), the cluster through its dashboard; from the
  command's start to its exit.
- *B*: `horovodrun -np 2 -H host1:1,host2:1 --gloo python -m bench.fixedcost worker` run on host 1, its
  `ssh` to host 2 a stand-in that runs the command in host 2's namespace; from the command's start
  to its exit.

A and B alternate, {n} times each, after one unmeasured run of each (its first job on a fresh cluster
also starts Ray's once-per-cluster actors). Python's bytecode: {BYTECODE_HOW[BYTECODE]}.

Stages come from stamps: rank 0's own (function start, imports done, `hvd.init()` returned, steps
done), the operator's (a timing subclass notes `execute`'s start and its result), the runtime's
record (`timings`: the driver process's start, `fit()`'s start and length), Ray's (the job's start
and end times). CPU seconds by process are sampled from /proc every
{SAMPLE_S:g} s (both hosts and Airflow share this machine's 2 cores, so CPU spent anywhere delays
everything else); "machine" is the whole machine's busy time over the run.
"""


def figure() -> Figure:
    from bench.multihost import Bench

    n = repeats(3)
    fig = Figure(10, "Fixed cost of a training task", how(n))
    from harness import hosts as testhosts

    if reason := testhosts.unavailable_reason():
        fig.targets.append(Target("10. a training task's excess over horovodrun at most 10 s", None, reason))
        return fig
    raw: dict = {"operator": [], "horovodrun": [], "bytecode": BYTECODE}
    if BYTECODE == "cached":  # inherited by the hosts' Ray nodes, so by every job's process
        os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
        os.environ["PYTHONPYCACHEPREFIX"] = str(OUT / "pycache")
    with Bench(subnet=SUBNET, bucket=BUCKET, conn_id=CONN_ID) as bench:
        # One unmeasured run each: the first job on a fresh cluster also starts Ray's once-per-cluster actors.
        through_horovodrun(bench)
        through_operator(bench)
        for i in range(n):
            raw["horovodrun"].append(through_horovodrun(bench))
            log(f"  horovodrun {i + 1}/{n}: {raw['horovodrun'][-1]['total_s']:.1f} s")
            raw["operator"].append(through_operator(bench))
            log(f"  operator {i + 1}/{n}: {raw['operator'][-1]['total_s']:.1f} s")
    save_raw("fixedcost", raw)
    ours = Sample([r["total_s"] for r in raw["operator"]])
    theirs = Sample([r["total_s"] for r in raw["horovodrun"]])
    work_a = Sample([r["stages"]["work"] for r in raw["operator"]])
    work_b = Sample([r["stages"]["work"] for r in raw["horovodrun"]])
    rows = [
        Row("wall, start to exit", "training task (airflow dags test)", ours, "horovodrun --gloo", theirs, "s", ""),
        Row("of which the work itself", "training task", work_a, "horovodrun --gloo", work_b, "s", "same steps"),
        Row(
            "machine CPU over the run",
            "training task",
            Sample([r["machine_cpu_s"] for r in raw["operator"]]),
            "horovodrun --gloo",
            Sample([r["machine_cpu_s"] for r in raw["horovodrun"]]),
            "CPU-s",
            "2 cores",
        ),
    ]
    fig.tables.append(table(rows))
    fig.tables.append(stage_table(raw))
    fig.tables.append(cpu_table(raw))
    excess = ours.median - theirs.median
    fig.targets.append(
        Target(
            "10. a training task's excess over horovodrun on the same hosts, same work: at most 10 s",
            excess <= TARGET_S,
            f"{fmt(excess)} s ({fmt(ours.median)} s against {fmt(theirs.median)} s, medians of {n}); "
            f"{'met' if excess <= TARGET_S else 'missed'} by {fmt(abs(TARGET_S - excess))} s",
        )
    )
    return fig


def _median(values: list[float]) -> float:
    from bench.common import median

    return median(values)


def stage_table(raw: dict) -> str:
    rows = []
    for way, label in (("operator", "A"), ("horovodrun", "B")):
        names = list(raw[way][0]["stages"])
        for name in names:
            values = [r["stages"][name] for r in raw[way]]
            rows.append([label, name, fmt(_median(values)), f"{fmt(min(values))}-{fmt(max(values))}"])
        totals = [r["total_s"] for r in raw[way]]
        rows.append([label, "**total**", f"**{fmt(_median(totals))}**", f"{fmt(min(totals))}-{fmt(max(totals))}"])
    return plain_table(["way", "stage", "median (s)", "min-max (s)"], rows)


def cpu_table(raw: dict, top: int = 14) -> str:
    kinds: dict[str, list[float]] = {}
    for way in ("operator", "horovodrun"):
        for r in raw[way]:
            for kind in r["cpu"]:
                kinds.setdefault(kind, [])
    rows = []
    for kind in kinds:
        a = _median([r["cpu"].get(kind, 0.0) for r in raw["operator"]])
        b = _median([r["cpu"].get(kind, 0.0) for r in raw["horovodrun"]])
        rows.append((a + b, [kind, fmt(a), fmt(b)]))
    rows.sort(key=lambda r: -r[0])
    return plain_table(["process (by kind)", "A: CPU-s (median)", "B: CPU-s (median)"], [r[1] for r in rows[:top]])


if __name__ == "__main__":  # a rank under horovodrun: python -m bench.fixedcost worker '<json>'
    if sys.argv[1:2] == ["worker"]:
        fixed_work(json.loads(sys.argv[2]))
