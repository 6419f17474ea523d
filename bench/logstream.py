"""Figure 4b: following one growing log. One ``RayJobTrigger`` follows a job's steadily growing log into a file
(child A: ``python -m bench.logstream follow SID PREFIX``, until the job ends), against fetching the whole log every
poll (child B: ``... whole SID PREFIX``, in windows asked on stdin); per poll, at several log lengths."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from bench.common import OUT, PY, env_int, log, save_raw
from bench.markdown import Figure, Row, Sample, Target, fmt, median, plain_table, ratio, table, target

POLL_S = 1.0
TAG = "AHP_BENCH_WHOLE"
FLAT = 1.5  # "flat": the per-poll cost at the longest log within this factor of the shortest's
OURS, WHOLE = "RayJobTrigger (log windows)", "whole log every poll"
ALONE, BESIDE = "A's window, A alone", "B's window, minus A's"


class LineFile(logging.Handler):
    """Writes the streamed lines to a file (what the triggerer does with the task log), counting them."""

    def __init__(self, path: str):
        super().__init__(logging.INFO)
        self.file = open(path, "w")
        self.lines = 0

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        self.file.write(message + "\n")
        if message.startswith("[ray] "):
            self.lines += 1

    def close(self) -> None:
        self.file.close()
        super().close()

    def logger(self, name: str) -> logging.Logger:
        out = logging.getLogger(name)
        out.addHandler(self)
        out.setLevel(logging.INFO)
        out.propagate = False
        return out


async def follow(sid: str, prefix: str) -> None:
    """Child A: RayJobTrigger until the job ends; one progress line per poll."""
    from airflow_provider_horovod.hooks.ray import RayHook
    from airflow_provider_horovod.triggers.ray import RayJobTrigger

    handler = LineFile(prefix + "-lines.txt")
    fetched = {"bytes": 0, "requests": 0}
    progress = open(prefix + "-progress.jsonl", "w")
    original = RayHook._a_request

    async def noted(self, route, **request):
        if route.path.startswith("/api/jobs/"):  # a poll starts with its status request
            sample = [time.time(), time.process_time(), fetched["bytes"], fetched["requests"], handler.lines]
            progress.write(json.dumps(sample) + "\n")
            progress.flush()
        answer = await original(self, route, **request)
        if route.path == "/api/v0/logs/file":
            fetched["bytes"] += len(answer[1])
            fetched["requests"] += 1
        return answer

    RayHook._a_request = noted
    policy = {"poll_interval_s": POLL_S, "pending_timeout_s": None, "stall_timeout_s": None}
    trigger = RayJobTrigger(submission_id=sid, policy=policy)
    # Into a file through the same writer as B's, in place of the triggerer's routing into the task log.
    trigger._log = handler.logger("bench.follow")
    started = time.process_time()
    payload = (await anext(trigger.run())).payload  # its one event: the job ended
    summary = {"event": payload, "lines": handler.lines, "cpu_s": time.process_time() - started, "end": time.time()}
    summary.update(log_bytes=fetched["bytes"], log_requests=fetched["requests"])
    Path(prefix + "-summary.json").write_text(json.dumps(summary))
    handler.close()


async def whole(sid: str, prefix: str) -> None:
    """Child B: on each ``window K`` line of stdin, 1 + K polls of the whole log, one a second."""
    from airflow_provider_horovod.hooks.ray import RayHook
    from airflow_provider_horovod.hooks.ray_routes import JOB_LOGS

    out = LineFile(prefix + "-whole-lines.txt").logger("bench.whole")
    written = 0
    async with RayHook() as hook:
        while line := await asyncio.to_thread(sys.stdin.readline):
            polls = []
            for i in range(int(line.split()[1]) + 1):
                t0, c0 = time.perf_counter(), time.process_time()
                await hook.a_get_job_info(sid)
                status, text = await hook._a_request(JOB_LOGS, submission_id=sid)
                logs = JOB_LOGS.answer(status, text)
                lines = logs.split("\n")
                lines.pop()  # the unterminated last line comes next time
                for new in lines[written:]:
                    out.info("[ray] %s", new)
                written = max(written, len(lines))
                cpu, wall = time.process_time() - c0, time.perf_counter() - t0
                if i:  # the first poll of a window catches up on what came since the last: not counted
                    polls.append(
                        {"t": time.time(), "cpu_s": cpu, "wall_s": wall, "bytes": len(text), "log_lines": len(lines)}
                    )
                await asyncio.sleep(max(0.0, POLL_S - wall))
            print(TAG + " " + json.dumps(polls), flush=True)


def job_code(lines: int, rate: int) -> str:
    batch = max(1, rate // 10)
    return (
        "import sys, time\n"
        f"n, batch, period = {lines}, {batch}, {batch / rate!r}\n"
        "start = time.monotonic()\n"
        "for b in range(0, n, batch):\n"
        "    out = [f'step {i:06d} epoch {i // 5000} loss {1 / (1 + i):.8f} lr 0.00100 throughput 1234.5 samples/s'"
        " for i in range(b, min(n, b + batch))]\n"
        "    sys.stdout.write('\\n'.join(out) + '\\n'); sys.stdout.flush()\n"
        "    time.sleep(max(0.0, start + (b // batch + 1) * period - time.monotonic()))\n"
    )


def read_progress(path: Path) -> list[list[float]]:
    text = path.read_text() if path.exists() else ""
    return [json.loads(line) for line in text.splitlines() if line.endswith("]")]  # the last may be half written


def figure(cluster) -> Figure:
    from airflow_provider_horovod.hooks.ray import RayHook
    from bench.triggerer import cluster_cpu, process_groups, stop_jobs

    total = env_int("BENCH_LOGSTREAM_LINES", 100_000)
    rate = env_int("BENCH_LOGSTREAM_RATE", 300)
    window = env_int("BENCH_LOGSTREAM_WINDOW", 5)
    targets = [t for t in (1_000, 10_000, 50_000, 100_000) if t <= total]
    hook = RayHook()
    prefix = str(OUT / "logstream")
    for suffix in ("-progress.jsonl", "-summary.json", "-lines.txt", "-whole-lines.txt"):
        Path(prefix + suffix).unlink(missing_ok=True)
    sid = f"bench-logstream-{os.getpid()}-{int(time.time())}"
    code = shlex.quote(job_code(total, rate))
    hook.submit_job(entrypoint=f"python -c {code}", submission_id=sid, metadata={"bench": "logstream"})
    groups = {k: v for k, v in process_groups(cluster.temp_dir).items() if k in ("dashboard", "dashboard agent")}
    logs, progress_file = OUT / "logs", Path(prefix + "-progress.jsonl")
    logs.mkdir(parents=True, exist_ok=True)
    head0, wall0 = cluster_cpu(groups), time.time()
    a_out = open(logs / "logstream-follow.log", "w")
    a = subprocess.Popen([PY, "-m", "bench.logstream", "follow", sid, prefix], stdout=a_out, stderr=subprocess.STDOUT)
    b_err = open(logs / "logstream-whole.log", "w")
    whole_cmd = [PY, "-m", "bench.logstream", "whole", sid, prefix]
    b = subprocess.Popen(whole_cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=b_err, text=True)
    windows = []
    try:
        for target in targets:
            # The two windows end a second before the log reaches the target length.
            start_at = target - rate * (2 * window + 3)
            while True:
                samples = read_progress(progress_file)
                if a.poll() is not None:
                    raise RuntimeError(f"the following trigger ended early (rc {a.returncode}); see {a_out.name}")
                if len(samples) >= 3 and samples[-1][4] >= max(1, start_at):
                    break
                time.sleep(0.2)
            log(f"log at {samples[-1][4]} lines: windows for ~{target}")
            h0, t0 = cluster_cpu(groups), time.time()
            time.sleep(window)
            h1, t1 = cluster_cpu(groups), time.time()
            b.stdin.write(f"window {window}\n")
            b.stdin.flush()
            reply = b.stdout.readline()
            if TAG not in reply:
                raise RuntimeError(f"the whole-log poller did not answer; see {b_err.name}")
            polls = json.loads(reply.split(TAG + " ", 1)[1])
            h2, t2 = cluster_cpu(groups), time.time()
            found = {"target": target, "a_only": [t0, t1], "a_b": [t1, t2], "b_polls": polls}
            found["head_a"] = {k: (h1[k] - h0[k]) / (t1 - t0) for k in h0}
            windows.append({**found, "head_ab": {k: (h2[k] - h1[k]) / (t2 - t1) for k in h0}})
        a.wait(timeout=total / rate + 600)
        head1, wall1 = cluster_cpu(groups), time.time()
    finally:
        b.stdin.close()  # B ends at the end of its input; A has ended by now unless something failed
        for proc in (b, a):
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10 if proc is b else 0)
            if proc.poll() is None:
                proc.terminate()
                proc.wait(10)
        a_out.close()
        b_err.close()
        stop_jobs([sid])
    summary = json.loads((OUT / "logstream-summary.json").read_text())
    samples = read_progress(progress_file)
    job_log = hook.get_job_logs(sid)
    raw = {"sid": sid, "total": total, "rate": rate, "windows": windows, "samples": samples, "summary": summary}
    raw.update(head_run={k: (head1[k] - head0[k]) / (wall1 - wall0) for k in head0}, run_s=wall1 - wall0)
    raw["job_log_bytes"] = len(job_log)
    save_raw("logstream", raw)
    return build(Figure("4b"), raw, job_log)


def check_lines(job_log: str) -> tuple[bool, str]:
    """A's streamed lines against the job's whole log: the same, in order, each once."""
    written = (OUT / "logstream-lines.txt").read_text().split("\n")
    streamed = [line[len("[ray] ") :] for line in written if line.startswith("[ray] ")]
    expected = job_log.removesuffix("\n").split("\n") if job_log else []
    if streamed == expected:
        return True, f"all {len(expected):,} lines, in order, each once"
    seen = set()
    repeated = sum(1 for line in streamed if line in seen or seen.add(line))
    missing = len(set(expected) - set(streamed))
    first = next((i for i, (x, y) in enumerate(zip(streamed, expected)) if x != y), min(len(streamed), len(expected)))
    return False, (
        f"{len(streamed):,} lines streamed against {len(expected):,} in the job's log: {repeated} repeated, "
        f"{missing} missing, first difference at line {first + 1}"
    )


def build(fig: Figure, raw: dict, job_log: str) -> Figure:
    samples = raw["samples"]
    # Per poll of A: start time, CPU to the next poll, log bytes, log requests, lines before it, lines it brought.
    polls = [(s[0], n[1] - s[1], n[2] - s[2], n[3] - s[3], s[4], n[4] - s[4]) for s, n in zip(samples, samples[1:])]
    rows, details, lengths = [], [], []
    for w in raw["windows"]:
        mine = [p for p in polls if w["a_only"][0] <= p[0] < w["a_b"][1]]
        b = w["b_polls"]
        length = Sample([p[4] for p in mine])
        a_cpu, a_bytes = Sample([p[1] * 1000 for p in mine]), Sample([p[2] / 1024 for p in mine])
        b_cpu, b_bytes = Sample([p["cpu_s"] * 1000 for p in b]), Sample([p["bytes"] / 1024 for p in b])
        head_a, head_ab = ((w[k]["dashboard"] + w[k]["dashboard agent"]) * 100 for k in ("head_a", "head_ab"))
        label, at = f"log ~{w['target'] // 1000}k lines", f"log at {fmt(length.median)} lines (A's polls)"
        alone, beside = Sample([head_a]), Sample([head_ab - head_a])
        rows += [
            Row(f"{label}: triggerer CPU per poll", OURS, a_cpu, WHOLE, b_cpu, "ms", at),
            Row(f"{label}: log bytes fetched per poll", OURS, a_bytes, WHOLE, b_bytes, "KiB"),
            Row(f"{label}: head CPU (dashboard + agent)", ALONE, alone, BESIDE, beside, "% of a core"),
        ]
        details.append(
            [f"~{w['target']:,}", f"{fmt(min(length.values or [0]))}-{fmt(max(length.values or [0]))}", str(len(mine))]
            + [fmt(median([p[5] for p in mine])), fmt(median([p[3] for p in mine]))]
            + [fmt(a_cpu.median), fmt(a_bytes.median)]
            + [" / ".join(fmt(w[k][g] * 100) for g in ("dashboard", "dashboard agent")) for k in ("head_a", "head_ab")]
            + [str(len(b)), fmt(b_cpu.median), fmt(b_bytes.median)]
            + [fmt(median([p["wall_s"] * 1000 for p in b])), str(sum(1 for p in mine if p[0] < w["a_only"][1]))]
        )
        lengths.append((a_cpu, a_bytes, length))
    fig.tables.append(table(rows))
    header = ["log length (target)", "lines at A's polls", "A polls", "new lines / poll", "log requests / poll"]
    header += ["A CPU / poll (ms)", "A KiB / poll", "head, A alone: dashboard / agent %"]
    header += ["head, A + B: dashboard / agent %"]
    header += ["B polls", "B CPU / poll (ms)", "B KiB / poll", "B poll wall (ms)", "A polls in the A-only window"]
    fig.tables.append(plain_table(header, details))
    summary, run_s, head, log_bytes = raw["summary"], raw["run_s"], raw["head_run"], raw["job_log_bytes"]
    fetched, cpu_s, ended = summary["log_bytes"], summary["cpu_s"], summary["event"]
    ok, lines = check_lines(job_log)
    fig.notes.append(
        f"Whole run ({run_s:.0f} s, the job's {raw['total']:,} lines = {log_bytes / (1 << 20):.1f} MiB): A made "
        f"{len(samples)} polls and {summary['log_requests']} log-window requests, fetched {fetched / (1 << 20):.1f} "
        f"MiB of log ({fetched / max(1, log_bytes):.2f}x the log) and used {cpu_s:.1f} s of CPU "
        f"({cpu_s / run_s * 100:.1f}% of a core); the head's dashboard used {head['dashboard'] * 100:.1f}% and its "
        f"agent {head['dashboard agent'] * 100:.1f}% of a core over the run (B's windows included). The job ended "
        f"{ended.get('job_status') or ended.get('outcome')}."
    )
    fig.notes.append(f"Streamed lines against the job's log: {lines}.")
    name = "4b. per-poll cost flat as the log grows (longest log within 1.5x of the shortest)"
    if len(lengths) > 1:
        (cpu0, bytes0, length0), (cpu1, bytes1, length1) = lengths[0], lengths[-1]
        cpu_x, bytes_x = ratio(cpu1.median, cpu0.median), ratio(bytes1.median, bytes0.median)
        detail = (
            f"at {fmt(length1.median)} lines against {fmt(length0.median)}: CPU per poll {fmt(cpu1.median)} against "
            f"{fmt(cpu0.median)} ms ({fmt(cpu_x)}x), bytes per poll {fmt(bytes1.median)} against {fmt(bytes0.median)} "
            f"KiB ({fmt(bytes_x)}x)"
        )
        closing = "see the log requests per poll: a window that cannot be placed is asked for again, longer"
        fig.targets.append(target(name, max(cpu_x, bytes_x), FLAT, detail, closing, unit="x"))
    else:
        fig.targets.append(Target(name, None, "fewer than two log lengths measured"))
    closing = "" if ok else "see bench/out/logstream-lines.txt against the job's log"
    fig.targets.append(Target("4b. streamed lines equal the job's log, each once", ok, lines, closing))
    return fig


if __name__ == "__main__":
    mode, submission_id, out_prefix = sys.argv[1:4]
    asyncio.run(follow(submission_id, out_prefix) if mode == "follow" else whole(submission_id, out_prefix))
