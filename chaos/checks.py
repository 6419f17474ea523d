"""The invariants `make chaos` checks once the deployment drained, as pure functions over what it saw
(chaos/observe.py): each returns its violations, one line each, naming what broke. Zero
violations is the goal; every violation found is a defect of the provider (or of this harness).
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from airflow_provider_horovod.contract import attempt_of

INVARIANTS = (
    "runs_ended",
    "checkpoints_load",
    "no_orphan_jobs",
    "one_job_per_attempt",
    "log_lines_once",
    "champion_log",
    "failed_attempt_records",
    "no_secrets",
    "unstuck_after_heal",
    "partition_costs_no_retry",
)
# The six failure classes, as the task's exception names them (airflow_provider_horovod.exceptions).
CLASS_ERRORS = {
    "UserCodeError": "user_code",
    "ConfigurationError": "configuration",
    "InfrastructureError": "infrastructure",
    "PreemptionError": "preemption",
    "CapacityError": "capacity",
    "StorageError": "storage",
    # The provider's storage reads of a plain @task (the champion's log) fail as storage, too.
    "StorageUnavailableError": "storage",
    # A user's error or a wrong configuration, failing the task without retries (airflow_compat).
    "UserCodeFailed": "user_code",
    "ConfigurationFailed": "configuration",
}
CLASSES = {"user_code", "configuration", "infrastructure", "preemption", "capacity", "storage"}
TERMINAL_RUN = {"success", "failed"}
ENDED_TI = {"success", "failed", "upstream_failed", "skipped", "removed"}
TERMINAL_JOB = {"SUCCEEDED", "FAILED", "STOPPED"}
JOB_MARK = re.compile(r"^Ray job (\S+): ")
RAY_LINE = "[ray] "


def base_of(submission_id: str) -> str:
    """The task run's stem of a submission id (``...-a3`` -> ``...``)."""
    return submission_id.rsplit("-a", 1)[0] if attempt_of(submission_id) else submission_id


def job_ti(job: dict) -> str | None:
    meta = job.get("metadata") or {}
    if "airflow_dag_id" not in meta:
        return None
    index = int(meta.get("airflow_map_index") or -1)
    return f"{meta['airflow_dag_id']}/{meta['airflow_task_id']}/{meta['airflow_run_id']}/{index}"


def ti_key(ti: dict) -> str:
    index = ti.get("map_index")
    return f"{ti['dag_id']}/{ti['task_id']}/{ti['dag_run_id']}/{-1 if index is None else int(index)}"


# What Airflow writes in a task's log when something outside the task changed its state (a user, the REST
# API, the DAG run marked failed or timed out): the supervisor of a running task, the triggerer of a
# deferred one. The task's code then only stops its job; the state is not the provider's to give.
STOPPED_FROM_OUTSIDE = (
    "Server indicated the task shouldn't be running anymore",
    "Trigger cancelled by user action",
)


def failed_from_outside(records: Iterable[dict]) -> bool:
    """Whether a try's log shows Airflow stopping the task because its state was set to failed from outside
    (for a running task the supervisor names the new state; a deferred one's trigger is cancelled)."""
    for record in records:
        event = str(record.get("event", ""))
        if event.startswith(STOPPED_FROM_OUTSIDE[0]) and (record.get("detail") or {}).get("current_state") == "failed":
            return True
        if event.startswith(STOPPED_FROM_OUTSIDE[1]):
            return True
    return False


def error_types(records: Iterable[dict]) -> list[str]:
    """The exception types a try's log records name (Airflow's ``error_detail``)."""
    found = []
    for record in records:
        for detail in record.get("error_detail") or []:
            if isinstance(detail, dict) and detail.get("exc_type"):
                found.append(str(detail["exc_type"]))
    return found


# --- the invariants --------------------------------------------------------------------------------


def timed_out(run: dict, timeout_s: float | None) -> bool:
    """Whether Airflow failed the run at its DAG's ``dagrun_timeout`` (its reason ``timed_out``, its unfinished
    tasks skipped): failed, and at least that long after its start."""
    start, end = run.get("start_date"), run.get("end_date")
    if run.get("state") != "failed" or timeout_s is None or not start or not end:
        return False
    return (when(end) - when(start)).total_seconds() >= timeout_s


def when(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def runs_ended(
    runs: list[dict],
    tis: list[dict],
    logs: dict[str, list[list[dict]]],
    marked: set[str],
    timeouts_s: dict[str, float],
) -> list[str]:
    """Every DAG run ended: succeeded, or failed with a reason, which is one of the six classes (or the
    injector's own mark, or another mark from outside that the task's log shows: a person, the drain cut
    short), or Airflow's ``timed_out`` at the DAG's ``dagrun_timeout`` (``timeouts_s``), the bound that
    keeps a run from hanging (what that timeout stops, the other invariants check); none still running."""
    found = []
    by_run = defaultdict(list)
    for ti in tis:
        by_run[(ti["dag_id"], ti["dag_run_id"])].append(ti)
    for run in runs:
        where = f"{run['dag_id']} {run['dag_run_id']}"
        if run.get("state") not in TERMINAL_RUN:
            found.append(f"{where} did not end: {run.get('state')}")
            continue
        if run["state"] == "success":
            continue
        failed = [ti for ti in by_run[(run["dag_id"], run["dag_run_id"])] if ti.get("state") == "failed"]
        if not failed and not timed_out(run, timeouts_s.get(run["dag_id"])):
            found.append(f"{where} failed before its dagrun_timeout, and none of its tasks did")
        for ti in failed:
            key = ti_key(ti)
            if key in marked:
                continue
            tries = logs.get(key) or []
            last = tries[-1] if tries else []
            if failed_from_outside(last):
                continue
            types = error_types(last)
            if not any(t in CLASS_ERRORS for t in types):
                found.append(f"{key} failed without a failure class: {types or 'no exception in its last log'}")
    return found


def checkpoints_load(tis: list[dict], xcoms: dict[str, dict], loads: dict[str, str | None]) -> list[str]:
    """Every successful training's checkpoint URI is there and its model loads (``loads``: uri -> error or None)."""
    found = []
    for ti in tis:
        key = ti_key(ti)
        result = (xcoms.get(key) or {}).get("return_value")
        if ti.get("state") != "success" or not isinstance(result, dict) or "world_size" not in result:
            continue
        uri = result.get("checkpoint_uri")
        if not uri:
            found.append(f"{key} succeeded without a checkpoint URI")
        elif uri not in loads:
            found.append(f"{key}: {uri} was not checked")
        elif loads[uri] is not None:
            found.append(f"{key}: {uri} does not load: {loads[uri]}")
    return found


def triggerer_stalls(log: str, started_wall: float) -> list[tuple[float, float]]:
    """When the triggerer could not act, in the observer's seconds: (from, to) of each stall its log tells
    of ("Heartbeat recovered after N seconds"; a new trigger runner's start under load takes a minute)."""
    stalls = []
    for stamp, seconds in re.findall(r"^(\S+) .*Heartbeat recovered after ([\d.]+) seconds", log, re.M):
        end = datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() - started_wall
        stalls.append((end - float(seconds), end))
    return stalls


def no_orphan_jobs(
    jobs: list[dict],
    job_polls: list[tuple[float, int, list]],
    ti_polls: list[tuple[float, dict[str, str]]],
    jobs_now: list[dict],
    grace_s: float = 60.0,
    stalls: list[tuple[float, float]] | None = None,
) -> list[str]:
    """No Ray job runs or waits while its task instance has ended, for longer than ``grace_s`` (the
    task's kill stopping it, the poll intervals); none at all once everything drained. A deferred task's
    kill reaches its trigger only through the triggerer: the triggerer's ``stalls`` do not count."""
    found = []
    meta = {(job["head_epoch"], job["submission_id"]): job for job in jobs}
    orphaned_since: dict[tuple[int, str], float] = {}
    reported = set()
    ti_index = 0
    states: dict[str, str] = {}
    deferred: set[str] = set()  # task instances last seen deferred before they ended
    for t, epoch, unended in job_polls:
        while ti_index < len(ti_polls) and ti_polls[ti_index][0] <= t:
            states = ti_polls[ti_index][1]
            deferred = {ti for ti in deferred if states.get(ti) in ENDED_TI} | {
                ti for ti, state in states.items() if state == "deferred"
            }
            ti_index += 1
        alive = set()
        for sid, status in unended:
            key = (epoch, sid)
            ti = job_ti(meta.get(key) or {})
            if ti is None or states.get(ti) not in ENDED_TI:
                continue
            alive.add(key)
            since = orphaned_since.setdefault(key, t)
            stalled = sum(max(0.0, min(b, t) - max(a, since)) for a, b in stalls or ()) if ti in deferred else 0.0
            if t - since - stalled > grace_s and key not in reported:
                reported.add(key)
                found.append(
                    f"{sid} was {status} for {t - since:.0f} s after its task {ti} ended {states.get(ti)}"
                    + (f" ({stalled:.0f} s of it while the triggerer stalled)" if stalled else "")
                )
        orphaned_since = {k: v for k, v in orphaned_since.items() if k in alive}
    for job in jobs_now:
        if job_ti(job) and job.get("status") not in TERMINAL_JOB:
            found.append(f"{job['submission_id']} still {job.get('status')} after every DAG run ended")
    return found


def one_job_per_attempt(jobs: list[dict], job_polls: list[tuple[float, int, list]]) -> list[str]:
    """Each attempt (submission id) is one Ray job, submitted once (not again after the head was
    replaced); and a task run never has two jobs unended at once."""
    found = []
    epochs = defaultdict(dict)  # submission id -> {job's start time (Ray's, ms): head epoch}
    for job in jobs:
        if job_ti(job):
            # One job is one start time: listed under two epochs with the same one, it is the same job (the
            # head was replaced around that listing), not a second submission.
            epochs[job["submission_id"]].setdefault(
                job.get("start_time") or ("epoch", job["head_epoch"]), job["head_epoch"]
            )
    for sid, seen in sorted(epochs.items()):
        if len(seen) > 1:
            heads = sorted(set(seen.values()))
            found.append(f"{sid} was submitted {len(seen)} times (head epochs {heads}): one attempt, two jobs")
    reported = set()
    for t, _epoch, unended in job_polls:
        by_run = defaultdict(list)
        for sid, _ in unended:
            by_run[base_of(sid)].append(sid)
        for base, sids in by_run.items():
            if len(sids) > 1 and base not in reported:
                reported.add(base)
                found.append(f"{base}: jobs {sorted(sids)} unended at once at {t:.0f} s")
    return found


def job_lines_in_task_log(tries: list[list[dict]], submission_id: str) -> list[str]:
    """The job's lines the task's logs hold, across its tries, in order: the ``[ray]`` lines that follow
    the operator's ``Ray job <id>: <url>`` of that job in each try."""
    lines = []
    for records in tries:
        following = None
        for record in records:
            event = str(record.get("event", ""))
            if mark := JOB_MARK.match(event):
                following = mark.group(1)
            elif event.startswith(RAY_LINE) and following == submission_id:
                lines.append(event[len(RAY_LINE) :])
    return lines


def log_lines_once(
    tis: list[dict],
    xcoms: dict[str, dict],
    logs: dict[str, list[list[dict]]],
    job_logs: dict[str, str],
    jobs: list[dict],
) -> list[str]:
    """The task log of every training whose job survived (succeeded, and its log is still on the head)
    holds every line of the job's own log, once, in order. The job is the task's own, as its metadata
    names it: a task downstream that returns a training's result (the sweep's ``pick_best``) has none."""
    owners = {job["submission_id"]: job_ti(job) for job in jobs if job.get("submission_id")}
    found = []
    for ti in tis:
        key = ti_key(ti)
        result = (xcoms.get(key) or {}).get("return_value")
        if ti.get("state") != "success" or not isinstance(result, dict) or "world_size" not in result:
            continue
        sid = result.get("submission_id")
        if sid not in job_logs or owners.get(sid) != key:
            continue
        expected = job_logs[sid].splitlines()
        streamed = job_lines_in_task_log(logs.get(key) or [], sid)
        if streamed != expected:
            found.append(f"{key} ({sid}): {difference(expected, streamed)}")
    return found


def difference(expected: list[str], got: list[str]) -> str:
    """How the task log's lines differ from the job's: missing and repeated lines, or the first place."""
    missing = [line for line in expected if line not in got]
    repeated = sorted({line for line in got if got.count(line) > expected.count(line)})
    if missing or repeated:
        return (
            f"{len(expected)} lines in the job's log, {len(got)} in the task log; {len(missing)} missing "
            f"(first: {missing[:2]}), {len(repeated)} repeated (first: {repeated[:2]})"
        )
    first = next((i for i, (a, b) in enumerate(zip(expected, got)) if a != b), min(len(expected), len(got)))
    return f"the lines differ from line {first + 1} on"


def champion_log(snapshots: list[tuple[float, dict]], promoted: list[dict]) -> list[str]:
    """The champion's log never loses a move (each version extends the one before, and every move a
    ``promote`` task reported is in the last), and never moves to a worse score (each move beats the
    champion it replaced)."""
    found = []
    previous: list[dict] = []
    for t, record in snapshots:
        moves = list(record.get("moves") or [])
        if moves[: len(previous)] != previous:
            found.append(f"at {t:.0f} s the champion's log lost moves: {len(previous)} before, {len(moves)} now")
        for move in moves[len(previous) :]:
            replaced = move.get("replaces") or {}
            if replaced.get("holdout_mse") is not None and move["holdout_mse"] >= replaced["holdout_mse"]:
                found.append(
                    f"{move.get('run_id')} moved the champion of {move.get('logical_date')} to a worse score: "
                    f"{move['holdout_mse']} after {replaced['holdout_mse']}"
                )
        previous = moves
    last = {(m.get("run_id"), m.get("checkpoint_uri")) for m in previous}
    for summary in promoted:
        if summary.get("promoted") and (summary.get("run_id"), summary.get("checkpoint_uri")) not in last:
            found.append(f"{summary.get('run_id')} promoted {summary.get('checkpoint_uri')}, which the log lacks")
    return found


def failed_attempt_records(jobs: list[dict], records: dict[str, dict]) -> list[str]:
    """Each failed or stopped attempt left its record beside its checkpoints, with one of the six classes.
    An attempt lost with its Ray head (``lost_with_head``: its driver died with the head) gets its record
    from its task's next try, which finds it vanished before it submits the next attempt
    (docs/reliability.md, "An attempt lost with its Ray head"): it needs one only where a later attempt of
    its task run was submitted. One whose driver had finished before the head went, or before a stop reached
    it (its DAG run timed out as it exited), wrote its own record, a success (no failure, its result): it did
    not fail, only its end was cut short or never read."""
    latest: dict[str, int] = defaultdict(int)
    for job in jobs:
        sid = job.get("submission_id") or ""
        latest[base_of(sid)] = max(latest[base_of(sid)], attempt_of(sid) or 0)
    found = []
    seen = set()
    for job in jobs:
        meta = job.get("metadata") or {}
        uri = meta.get("ahp_result_uri")
        if not uri or job.get("status") not in ("FAILED", "STOPPED") or uri in seen:
            continue
        sid = job["submission_id"]
        if job.get("lost_with_head") and latest[base_of(sid)] <= (attempt_of(sid) or 0):
            continue
        seen.add(uri)
        record = records.get(uri)
        if record is None:
            found.append(f"{job['submission_id']} ended {job['status']} and left no record at {uri}")
            continue
        failure = record.get("failure") or {}
        if (job.get("lost_with_head") or job["status"] == "STOPPED") and record.get("failure") is None:
            continue  # its driver's own record: the attempt succeeded
        if failure.get("failure_class") not in CLASSES:
            found.append(f"{job['submission_id']}'s record at {uri} has no failure class: {failure or record}")
    return found


def no_secrets(secrets: dict[str, str], places: dict[str, Any]) -> list[str]:
    """No secret in any of ``places`` (name -> anything JSON): task logs, XComs, job infos and logs."""
    found = []
    for where, value in places.items():
        text = value if isinstance(value, str) else json.dumps(value, default=str)
        for name, secret in secrets.items():
            if secret and secret in text:
                found.append(f"the {name} is in {where}")
    return found


# --- counts (not invariants) -------------------------------------------------------------------------


def failed_attempts_by_class(records: dict[str, dict]) -> dict[str, int]:
    """How many attempts failed, by class, from their records."""
    counts: dict[str, int] = defaultdict(int)
    for record in records.values():
        if failure := record.get("failure"):
            counts[failure.get("failure_class") or "none"] += 1
    return dict(counts)


def lost_worker_seconds(records: dict[str, dict]) -> float:
    """Worker-seconds of failed attempts, per task run from its latest record with a cost."""
    latest: dict[str, tuple[int, dict]] = {}
    for record in records.values():
        cost = record.get("cost")
        storage, attempt = record.get("storage_uri"), int(record.get("attempt") or 0)
        if cost and storage and attempt >= latest.get(storage, (0, {}))[0]:
            latest[storage] = (attempt, cost)
    return round(
        sum(
            a.get("worker_s") or 0.0
            for _, cost in latest.values()
            for a in cost.get("attempts") or []
            if a.get("failed")
        ),
        1,
    )


# --- after a fault heals -----------------------------------------------------------------------------

STUCK_STATES = ("queued", "running", "deferred")
# The faults a partition's retries are not laid at when one overlaps it: they cost retries themselves.
CLEAN_KINDS = {"partition"}


def state_spans(ti_polls: list[tuple[float, dict[str, str]]]) -> dict[str, list[tuple[str, float, float, bool]]]:
    """Each task instance's states over the polls: (state, first seen, left at, left): ``left at`` is the
    first poll showing another state, or the last poll that saw it (``left`` False) when none did."""
    spans: dict[str, list[tuple[str, float, float, bool]]] = defaultdict(list)
    current: dict[str, tuple[str, float, float]] = {}
    for t, states in ti_polls:
        for key, state in states.items():
            seen = current.get(key)
            if seen is None:
                current[key] = (state, t, t)
            elif seen[0] != state:
                spans[key].append((seen[0], seen[1], t, True))
                current[key] = (state, t, t)
            else:
                current[key] = (state, seen[1], t)
    for key, (state, first, last) in current.items():
        spans[key].append((state, first, last, False))
    return dict(spans)


def start_time_s(spans: dict[str, list[tuple[str, float, float, bool]]], quantile: float = 0.9) -> float | None:
    """How long a queued task took to start running on this machine in this run (the ``quantile`` of the
    queued spans that were left), None when none was seen."""
    waits = sorted(
        end - first
        for key_spans in spans.values()
        for state, first, end, left in key_spans
        if left and state == "queued"
    )
    if not waits:
        return None
    return waits[min(int(quantile * len(waits)), len(waits) - 1)]


def stuck_after_heal(
    spans: dict[str, list[tuple[str, float, float, bool]]],
    jobs: list[dict],
    heals_s: list[float],
    bounds_s: dict[str, float],
) -> tuple[float, list[str]]:
    """The longest time a task instance stayed queued, running or deferred after the last fault before it
    healed while nothing held it there (queued: from the span's start; running or deferred: once every
    Ray job of its own had ended, a job still running being a reason to wait), and each stay past its
    state's bound. ``jobs``: the observer's, with ``first_seen_s`` and ``ended_s``."""
    own: dict[str, list[dict]] = defaultdict(list)
    for job in jobs:
        if key := job_ti(job):
            own[key].append(job)
    longest, found = 0.0, []
    heals = sorted(heals_s)
    for key, key_spans in spans.items():
        for state, first, end, _ in key_spans:
            if state not in STUCK_STATES:
                continue
            healed = [h for h in heals if h <= end]
            if not healed:
                continue
            free = first
            if state != "queued":
                mine = [j for j in own.get(key, []) if j.get("first_seen_s", 0.0) <= end]
                if any(j.get("ended_s") is None or j["ended_s"] > end for j in mine):
                    continue  # its job ran on: the task waited for it
                free = max([first] + [j["ended_s"] for j in mine])
            stuck = end - max(free, healed[-1])
            if stuck <= 0:
                continue
            longest = max(longest, stuck)
            if stuck > bounds_s[state]:
                found.append(
                    f"{key} stayed {state} {stuck:.0f} s after the fault that healed at {healed[-1]:.0f} s "
                    f"(bound {bounds_s[state]:.0f} s)"
                )
    return round(longest, 1), found


def partition_retries(
    fault_log: list[dict], ti_tries: dict[str, list[tuple[float, int, str]]], settle_s: float
) -> tuple[list[str], int]:
    """The Airflow retries each partition cost: a task's try number rising between the cut and
    ``settle_s`` after it healed (a try failed during it is retried after its delay). A partition that
    another kind of fault overlapped is not judged (those cost retries of their own); returns the
    retries found, and how many partitions were not judged."""
    windows = [
        (entry["kind"], entry.get("started_s", 0.0), entry.get("ended_s") or entry.get("started_s", 0.0))
        for entry in fault_log
        if "skipped" not in entry and "error" not in entry
    ]
    found, unjudged = [], 0
    for entry in fault_log:
        if entry.get("kind") != "partition" or "cut_s" not in entry:
            continue
        start, end = entry["cut_s"], entry["healed_s"] + settle_s
        if any(kind not in CLEAN_KINDS and a <= end and b + settle_s >= start for kind, a, b in windows):
            unjudged += 1
            continue
        for key, tries in ti_tries.items():
            for (_, before, _), (t, after, host) in zip(tries, tries[1:]):
                if before >= 1 and after > before and start <= t <= end:
                    found.append(
                        f"{key} went to try {after} at {t:.0f} s, during the partition {entry['target']} "
                        f"({start:.0f}-{entry['healed_s']:.0f} s){f' on {host}' if host else ''}"
                    )
    return found, unjudged
