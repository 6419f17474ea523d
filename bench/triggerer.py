"""Figure 4: N ``RayJobTrigger``s in one asyncio loop (one triggerer) over long-running jobs, against a minimal poller
that only asks each job's status. One measurement per child: ``python -m bench.triggerer VARIANT N INTERVAL WINDOW
SETUP_JSON``, printed as one ``AHP_BENCH_TRIGGERS`` line."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import threading
import time
import urllib.request

from bench.common import OUT, PY, env_int, log, run_logged
from bench.markdown import Figure, Row, Sample, fmt, plain_table, quantile, table, target
from harness.airflow_cli import tagged_json
from harness.processes import cmdline, cpu_s, kind_of
from harness.tasks import wait_for_status

OURS, MINIMAL = "RayJobTrigger", "minimal poller"
NO_LOGS = "ours_nologs"  # at the largest N only: our trigger without log streaming, the log's share of the cost
LAG_TICK_S = 0.05
TARGET_CPU, TARGET_LAG_MS = 0.10, 50.0
TAG = "AHP_BENCH_TRIGGERS"  # the child's line of what it measured
STAMP = "bench-line-at "
STAMPED = re.compile(re.escape(STAMP) + r"(\d+\.\d+)")
QUIET_S = (15, 45)  # a job's quiet spells between its stamped lines, seconds (longer than the interval)
# The head's processes that answer the triggers, by role (harness/processes.py's kinds of each).
ROLES = {"dashboard": ("dashboard", "dashboard module"), "dashboard agent": ("dashboard agent",)}
ROLES.update(gcs=("gcs_server",))


class Requests:
    """Times every request the pollers make (status polls counted apart)."""

    def __init__(self) -> None:
        self.done: list[tuple[float, float, bool, int]] = []  # (end time, seconds, was a status poll, bytes)
        self.failed = 0

    def wrap(self, fn, is_status):
        async def timed(*args, **kwargs):
            started, answer = time.perf_counter(), None
            try:
                answer = await fn(*args, **kwargs)
                return answer
            except Exception:
                self.failed += 1
                raise
            finally:
                end = time.perf_counter()
                size = len(answer[1]) if isinstance(answer, tuple) else 0  # the hook's (status, text), not a status
                self.done.append((end, end - started, is_status(*args, **kwargs), size))

        return timed


async def lag_monitor(samples: list[tuple[float, float]]) -> None:
    while True:
        started = time.perf_counter()
        await asyncio.sleep(LAG_TICK_S)
        now = time.perf_counter()
        samples.append((now, now - started - LAG_TICK_S))


class StreamedLog:
    """A trigger's logger noting the triggers that have written a line of their job's log (``streamed``), and
    how late each stamped line was written (``latencies``: written at, seconds late)."""

    streamed: set[int] = set()
    latencies: list[tuple[float, float]] = []

    def __init__(self, log, index: int):
        self._log, self.index = log, index

    def log(self, level, message, *args, **kwargs):
        if isinstance(message, str) and message.startswith("[ray] "):
            self.streamed.add(self.index)
            if stamped := STAMPED.search(message):  # not the entrypoint's own echo of the script
                now = time.time()
                self.latencies.append((now, now - float(stamped[1])))
        return self._log.log(level, message, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._log, name)


async def ours(submission_id: str, interval: float, stream_logs: bool, index: int) -> None:
    from airflow_provider_horovod.triggers.ray import RayJobTrigger

    # No task instance (so no XCom for the cursor) and no pending/stall limits: only the polling.
    trigger = RayJobTrigger(
        submission_id=submission_id,
        stream_logs=stream_logs,
        policy={"poll_interval_s": interval, "pending_timeout_s": None, "stall_timeout_s": None},
    )
    trigger._log = StreamedLog(trigger.log, index)
    async for event in trigger.run():  # the jobs outlive the measurement: this never yields
        raise RuntimeError(f"trigger {index} ended before the measurement did: {event.payload}")


async def minimal_status(session, url: str, headers: dict, submission_id: str) -> str | None:
    """One status request of the minimal poller, over its shared keep-alive session."""
    async with session.get(f"{url}/api/jobs/{submission_id}", headers=headers) as response:
        return (await response.json()).get("status")


def cluster_cpu(groups: dict[str, list[int]]) -> dict[str, float]:
    """CPU seconds used so far by each group of cluster processes."""
    return {name: sum(cpu_s(pid) for pid in pids) for name, pids in groups.items()}


async def measure(variant: str, n: int, interval: float, window: float, setup: dict) -> dict:
    import aiohttp

    from airflow_provider_horovod.hooks.ray import RayHook

    jobs, requests = setup["jobs"], Requests()
    # New TCP connections, counted where both httpx (through anyio) and aiohttp open them.
    loop = asyncio.get_running_loop()
    connects: list[float] = []
    create_connection = loop.create_connection

    async def counted_connection(*args, **kwargs):
        connects.append(time.perf_counter())
        return await create_connection(*args, **kwargs)

    loop.create_connection = counted_connection
    lags: list[tuple[float, float]] = []
    tasks = [asyncio.create_task(lag_monitor(lags))]
    session = None
    polls: list[float] = []  # when each status asked was answered
    if variant != "minimal":
        # Every request timed (status lists and requests, log windows); a poll is a status asked and answered.
        RayHook._a_request = requests.wrap(
            RayHook._a_request, lambda self, route, **request: not route.path.startswith("/api/v0/logs")
        )
        get_info = RayHook.a_get_job_info

        async def polled(self, *args, **kwargs):
            info = await get_info(self, *args, **kwargs)
            polls.append(time.perf_counter())
            return info

        RayHook.a_get_job_info = polled
    else:
        from airflow_provider_horovod.local import ensure_running

        cluster = await asyncio.to_thread(ensure_running)
        session = aiohttp.ClientSession()
        headers = {"Authorization": f"Bearer {cluster.token}"}
        status = requests.wrap(minimal_status, lambda *a, **k: True)

    async def start(i: int):
        await asyncio.sleep(i * interval / n)
        sid = jobs[i % len(jobs)]
        if variant != "minimal":
            await ours(sid, interval, stream_logs=variant == "ours", index=i)
        else:
            while await status(session, cluster.dashboard_url, headers, sid) not in ("SUCCEEDED", "FAILED", "STOPPED"):
                polls.append(time.perf_counter())
                await asyncio.sleep(interval)

    started = time.perf_counter()
    tasks += [asyncio.create_task(start(i)) for i in range(n)]
    # Warm-up: every trigger polled once (and streamed its job's whole log), its log reads settled.
    settle = setup["settle"] if variant == "ours" else 0.0  # only the log reads need to settle
    while (
        len(polls) < n
        or time.perf_counter() - started < max(interval, settle)
        or (variant == "ours" and len(StreamedLog.streamed) < n)
    ):
        await asyncio.sleep(0.2)
        if time.perf_counter() - started > 600:
            raise RuntimeError(f"warm-up of {n} pollers did not end in 600 s")
    warmup_s = time.perf_counter() - started
    t0, w0, cpu0, c0 = time.perf_counter(), time.time(), time.process_time(), cluster_cpu(setup["groups"])
    await asyncio.sleep(window)
    t1, w1, cpu1, c1 = time.perf_counter(), time.time(), time.process_time(), cluster_cpu(setup["groups"])
    ended = [task.exception() for task in tasks if task.done() and not task.cancelled() and task.exception()]
    if ended:
        raise RuntimeError(f"{len(ended)} pollers ended early, the first: {ended[0]}")
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    if session is not None:
        await session.close()
    in_window = [r for r in requests.done if t0 <= r[0] <= t1]
    statuses, logs = [r for r in in_window if r[2]], [r for r in in_window if not r[2]]
    found = {"variant": variant, "n": n, "interval_s": interval, "window_s": t1 - t0, "wall_window": [w0, w1]}
    found.update(warmup_s=warmup_s, cpu_s=cpu1 - cpu0, polls=sum(1 for t in polls if t0 <= t <= t1))
    found.update(requests=len(in_window), status_requests=len(statuses), expected_polls=n * (t1 - t0) / interval)
    found["line_latency_s"] = [late for at, late in StreamedLog.latencies if w0 <= at <= w1]
    found.update(failed_requests=requests.failed, request_ms=[r[1] * 1000 for r in in_window])
    found.update(lag_ms=[lag * 1000 for t, lag in lags if t0 <= t <= t1], cluster_cpu_s={k: c1[k] - c0[k] for k in c0})
    found.update(log_bytes=sum(r[3] for r in logs), log_requests=len(logs))
    return {**found, "new_connections": sum(1 for t in connects if t0 <= t <= t1)}


def process_groups(temp_dir: str) -> dict[str, list[int]]:
    from airflow_provider_horovod.local import _cluster_pids

    kinds = {pid: kind_of(cmdline(pid)) for pid in _cluster_pids(temp_dir)}
    return {role: [pid for pid, kind in kinds.items() if kind in of] for role, of in ROLES.items()}


def start_jobs(count: int, lines: int) -> list[str]:
    from airflow_provider_horovod.hooks.ray import RayHook

    hook = RayHook()
    low, high = QUIET_S
    script = (
        f'for i in $(seq 1 {lines}); do echo "epoch $i: loss 0.$i (a line of a training log)"; done; '
        f'while true; do sleep $(( {low} + RANDOM % {high - low + 1} )); echo "{STAMP}$(date +%s.%N)"; done'
    )
    sids = [f"bench-sleep-{os.getpid()}-{i}" for i in range(count)]
    for sid in sids:
        hook.submit_job(entrypoint=f"bash -c '{script}'", submission_id=sid, metadata={"bench": "triggerer"})
    for sid in sids:
        if (status := wait_for_status(hook, sid, {"RUNNING", "FAILED", "STOPPED", "SUCCEEDED"}, 300)) != "RUNNING":
            raise RuntimeError(f"sleep job {sid} did not start: {status}")
    return sids


def list_cost_ms(count: int) -> float:
    """CPU milliseconds of parsing a status list of ``count`` unended jobs (the real list's entries repeated):
    this figure's list holds only its few jobs, a triggerer waiting for ``count`` trainings gets theirs."""
    from airflow_provider_horovod.hooks.ray import RayHook

    async def listed() -> list[dict]:
        async with RayHook() as hook:
            return await hook._a_list_unended()

    jobs = asyncio.run(listed())
    entries = [dict(jobs[i % len(jobs)], submission_id=f"job-{i}") for i in range(count)]
    text = json.dumps({"data": {"result": {"result": entries}}})
    times = []
    for _ in range(5):
        started = time.process_time()
        entries = json.loads(text)["data"]["result"]["result"]
        {job["submission_id"]: job for job in entries if job.get("submission_id")}
        times.append((time.process_time() - started) * 1000)
    return quantile(times, 0.5)


def stop_jobs(sids: list[str]) -> None:
    from airflow_provider_horovod.hooks.ray import RayHook

    hook = RayHook()
    for sid in sids:
        try:
            hook.stop_job(sid)
        except Exception as err:  # the cluster goes down next anyway
            log(f"could not stop {sid}: {err}")


class Probe(threading.Thread):
    """Asks one job's status every 0.25 s from outside the loop under test; notes the answer time."""

    def __init__(self, url: str, token: str, sid: str):
        super().__init__(daemon=True)
        self.request = urllib.request.Request(f"{url}/api/jobs/{sid}", headers={"Authorization": f"Bearer {token}"})
        self.samples: list[tuple[float, float]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.25):
            started = time.perf_counter()
            try:
                urllib.request.urlopen(self.request, timeout=30).read()
            except OSError:
                continue
            self.samples.append((time.time(), (time.perf_counter() - started) * 1000))


def figure(cluster) -> Figure:
    ns = [int(x) for x in (os.environ.get("BENCH_TRIGGER_N") or "10,100,1000").split(",")]
    interval = float(os.environ.get("BENCH_TRIGGER_INTERVAL") or 10)
    window = float(os.environ.get("BENCH_TRIGGER_WINDOW") or 60)
    settle = float(os.environ.get("BENCH_TRIGGER_SETTLE") or 3 * interval)
    job_count = env_int("BENCH_TRIGGER_JOBS", 24)
    log(f"starting {job_count} long-running jobs")
    sids = start_jobs(job_count, env_int("BENCH_TRIGGER_LOG_LINES", 200))
    results = []
    try:
        parse_ms = list_cost_ms(max(ns))
        setup = json.dumps({"jobs": sids, "groups": process_groups(cluster.temp_dir), "settle": settle})
        for n in ns:
            for variant in ("ours", "minimal") + ((NO_LOGS,) if n == max(ns) else ()):
                probe = Probe(cluster.dashboard_url, cluster.token, sids[0])
                probe.start()
                log(f"{n} {variant} pollers at {interval:g} s, {window:g} s window")
                try:
                    command = [PY, "-m", "bench.triggerer", variant, str(n), str(interval), str(window), setup]
                    run, _ = run_logged(command, f"triggerer-{variant}-{n}.log", timeout=900)
                finally:
                    probe.stop.set()
                    probe.join()
                (result,) = tagged_json(run.stdout, TAG)
                w0, w1 = result["wall_window"]
                result["probe_ms"] = [ms for t, ms in probe.samples if w0 <= t <= w1]
                (OUT / f"triggerer-{variant}-{n}.json").write_text(json.dumps(result))  # with the probe's answers
                results.append(result)
    finally:
        stop_jobs(sids)
    return build(Figure(4), results, interval, parse_ms)


def build(fig: Figure, results: list[dict], interval: float, parse_ms: float) -> Figure:
    """``parse_ms``: what parsing a status list of the largest N's jobs costs (``list_cost_ms``)."""
    by = {(r["variant"], r["n"]): r for r in results}

    def head(r: dict) -> float:
        return sum(r["cluster_cpu_s"].values()) / r["window_s"] * 100

    def per_poll(r: dict) -> float:
        return r["cpu_s"] / r["polls"] * 1000 if r["polls"] else float("nan")

    measures = (  # what, value, unit, note, note at N=1000 only
        ("CPU per poll", per_poll, "ms", "ours: status (shared list) + log window; B: status", ""),
        ("CPU share of one core", cpu_share, "%", "", "target < 10% at N=1000"),
        ("loop lag p99", lambda r: quantile(r["lag_ms"], 0.99), "ms", "", "target < 50 ms at N=1000"),
        ("head CPU (dashboard + agent + GCS)", head, "% of a core", "what the polling costs the head", ""),
    )
    rows = []
    for n in sorted({r["n"] for r in results}):
        a, b = by[("ours", n)], by[("minimal", n)]
        for what, value, unit, note, at_1000 in measures:
            note = note or (at_1000 if n == 1000 else "")
            rows.append(Row(f"N={n}: {what}", OURS, Sample([value(a)]), MINIMAL, Sample([value(b)]), unit, note))
    fig.tables.append(table(rows))
    fig.tables.append(details(results))
    most, added = max(n for _, n in by), parse_ms / 1000 / (interval / 2) * 100
    fig.notes.append(
        f"The status list here holds the figure's few jobs; waiting for {most} trainings, it would hold "
        f"{most}: parsing such a list (the real entries repeated) takes {fmt(parse_ms)} ms of CPU, "
        f"at one list per half interval {fmt(added)}% of a core more than measured above."
    )
    top = by.get(("ours", 1000)) or by[("ours", most)]
    n, cpu, lag99 = top["n"], cpu_share(top) / 100, quantile(top["lag_ms"], 0.99)
    on_head = {k: fmt(v / top["window_s"] * 100) for k, v in top["cluster_cpu_s"].items()}
    name = f"4. {n} triggers at {interval:g} s (log streaming on): under 10% of one core"
    detail = f"{fmt(cpu * 100)}% of a core; the head meanwhile: dashboard {on_head.get('dashboard')}%, agent "
    detail += f"{on_head.get('dashboard agent')}%, GCS {on_head.get('gcs')}% of a core"
    fig.targets.append(target(name, cpu * 100, TARGET_CPU * 100, detail, closing(by, n), unit=" points"))
    late = top.get("line_latency_s") or []
    p50, p99, most = (quantile(late, q) for q in (0.5, 0.99, 1))
    name = f"4. {n} triggers: a new line reaches the task log within two poll intervals ({2 * interval:g} s, p99), "
    detail = f"p99 {fmt(p99)} s over {len(late)} lines written (p50 {fmt(p50)} s, max {fmt(most)} s)"
    closing_ = "see the loop lag and the answer times: the reads fall behind their polls"
    fig.targets.append(target(name + "in the same window", p99, 2 * interval, detail, closing_, unit=" s"))
    name = f"4. {n} triggers: loop lag p99 under 50 ms"
    closing_ = "the same as for the CPU: less work per poll on the loop"
    fig.targets.append(target(name, lag99, TARGET_LAG_MS, f"p99 {fmt(lag99)} ms", closing_, unit=" ms"))
    done = top["polls"] / top["expected_polls"]
    detail = f"{top['polls']} of {top['expected_polls']:.0f} polls asked for were done in the window "
    detail += f"({fmt(done * 100)}%; counted as kept up from 95%)"
    closing_ = "the polls queue behind the loop or the dashboard: see the answer times"
    fig.targets.append(target(f"4. {n} triggers: no poll falling behind", done, 0.95, detail, closing_, at_most=False))
    return fig


def details(results: list[dict]) -> str:
    def p(values: list[float], *qs: float) -> str:
        return " / ".join(fmt(quantile(values, q)) for q in qs)

    body = []
    for r in results:
        cpu = {k: fmt(v / r["window_s"] * 100) for k, v in r["cluster_cpu_s"].items()}
        late = r.get("line_latency_s")
        polls = r["polls"] or float("nan")
        body.append(
            [r["variant"], str(r["n"]), f"{r['polls']} / {r['expected_polls']:.0f}", fmt(cpu_share(r))]
            + [p(r["lag_ms"], 0.5, 0.99, 1), p(r["request_ms"], 0.5, 0.99), p(r["probe_ms"], 0.5, 0.99)]
            + [cpu.get(k, "-") for k in ROLES]
            + [fmt(r.get("log_bytes", 0) / polls) if r["variant"] == "ours" else "-"]
            + [fmt(r.get("status_requests", r["polls"]) / polls)]
            + [f"{p(late, 0.5, 0.99, 1)} ({len(late)} lines)" if late else "-"]
            + [fmt(r["new_connections"] / polls) if "new_connections" in r else "-", str(r["failed_requests"])]
        )
    header = ["variant", "N", "polls done / asked", "CPU %", "lag p50 / p99 / max (ms)", "own requests p50 / p99 (ms)"]
    header += ["probe answer p50 / p99 (ms)", "dashboard CPU %", "agent CPU %", "GCS CPU %", "log window bytes / poll"]
    header += ["status requests / poll", "line latency p50 / p99 / max (s)", "new TCP connections / poll"]
    return plain_table(header + ["failed requests"], body)


def cpu_share(r: dict | None) -> float:
    """The pollers' CPU over the window, in % of one core."""
    return r["cpu_s"] / r["window_s"] * 100 if r else float("nan")


def closing(by: dict, n: int) -> str:
    """What the measurements say of our trigger's cost: the log windows' share, the hook's share."""
    share = {variant: fmt(cpu_share(by.get((variant, n)))) for variant in ("ours", NO_LOGS, "minimal")}
    text = f"at N={n}: {share['ours']}% with log streaming, {share[NO_LOGS]}% without it, {share['minimal']}% for "
    text += "the minimal poller (status only, one shared session)"
    ours = by.get(("ours", n)) or {}
    if ours.get("polls") and ours.get("new_connections", 0) / ours["polls"] > 0.5:
        text += f"; ours opened {fmt(ours['new_connections'] / ours['polls'])} new TCP connection(s) per poll"
    return text


if __name__ == "__main__":
    variant, n, interval, window, setup = sys.argv[1:]
    found = asyncio.run(measure(variant, int(n), float(interval), float(window), json.loads(setup)))
    print(f"{TAG} {json.dumps(found)}", flush=True)
