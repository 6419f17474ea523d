"""Running a task's operator in this process (a test's, a benchmark's) against a real cluster: a
task instance with enough for execute() (ids and an XCom store), a task_state_store, and waiting on
Ray jobs."""

from __future__ import annotations

import asyncio
import functools
import os
import threading
import time
from types import SimpleNamespace

from airflow_provider_horovod.contract import JOB_STOP_WAIT_S, JobStatus, TaskRun, attempt_uri

DAG_ID = "dag"
RUN_ID = "scheduled__2026-11-01T00:00:00+00:00"
# How long a test waits on a task's progress before it calls the task hung. Not a bound on speed: such a
# wait also ends as soon as the task ends, and a machine under load is several times slower than an idle one.
HUNG_S = 1200


class FakeTI(SimpleNamespace):
    """A task instance as execute() sees it: its ids, its try number and an XCom store."""

    def __init__(self, run_id=RUN_ID, *, dag_id=DAG_ID, task_id="train", map_index=-1, try_number=1):
        super().__init__(
            dag_id=dag_id, task_id=task_id, run_id=run_id, map_index=map_index, try_number=try_number, xcoms={}
        )

    def xcom_push(self, key, value):
        self.xcoms[key] = value

    @property
    def task_run(self) -> TaskRun:
        return TaskRun.of(self)


class StateStore(dict):
    """A task instance's task_state_store: unlike XCom it outlives a try (there is no API server here)."""

    def set(self, key, value, **_):
        self[key] = value


def run_in_thread(op, context, run=None):
    """Run the task (``op.execute``, or ``run(op, context)``) in a thread; its result or error lands in the dict."""
    outcome = {}

    def target():
        try:
            outcome["result"] = run(op, context) if run else op.execute(context)
        except BaseException as err:  # noqa: BLE001 - the test inspects it
            outcome["error"] = err

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, outcome


def wait_for_status(hook, sid, states, timeout=HUNG_S):
    """The job's status once it is one of ``states``; AssertionError at once if the job ends otherwise (an ended
    job's status never changes again), or after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    info = None
    while time.monotonic() < deadline:
        info = hook.get_job_info(sid)
        if info and info["status"] in states:
            return info["status"]
        if info and JobStatus.of(info["status"]).is_terminal:
            raise AssertionError(f"job {sid} ended {info['status']} instead of reaching {states}")
        time.sleep(0.5)
    raise AssertionError(f"job {sid} did not reach {states} within {timeout:g} s: {info and info['status']}")


def retry_waits() -> list[float]:
    """The waits the Ray transport's retry policy (as it is set now) puts after each try, the last try's
    included (the wait a further try would have come after)."""
    from airflow_provider_horovod.hooks import ray_transport

    wait = ray_transport.retry_args()["wait"]
    return [wait(SimpleNamespace(attempt_number=n)) for n in range(1, ray_transport.RETRIES + 1)]


def retry_waits_s() -> float:
    """The waits the Ray transport's retry policy puts between its tries, in all."""
    return sum(retry_waits()[:-1])


def running_after(hook, sid: str, since: float) -> float:
    """Seconds from ``since`` (a time.monotonic() before the task started) to the job's RUNNING: the start a
    test of a stop bounds that stop by, measured on the same machine in the same run."""
    wait_for_status(hook, sid, {"RUNNING"})
    return time.monotonic() - since


def assert_stopped(hook, sid: str, asked_at: float, start_s: float) -> None:
    """The job ended STOPPED (a job left to run would have ended otherwise), within Ray's wait for its driver
    (SIGTERM, then SIGKILL JOB_STOP_WAIT_S later) and twice its start ``start_s``: Ray's own steps to stop a
    job, stretched by load as its start was."""
    assert wait_for_status(hook, sid, {"STOPPED"}) == "STOPPED"
    took = time.monotonic() - asked_at
    assert took < JOB_STOP_WAIT_S + 2 * start_s, f"stopped {took:.1f} s after asked, its start {start_s:.1f} s"


def wait_until(predicate, timeout: float, what: str, outcome: dict | None = None):
    """``predicate()``'s first true answer, asked every 0.25 s; raises ``outcome``'s error (a task run by
    ``run_in_thread``) as soon as there is one, and AssertionError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if outcome and "error" in outcome:
            raise outcome["error"]
        if found := predicate():
            return found
        time.sleep(0.25)
    raise AssertionError(f"{what} did not happen within {timeout:g} s")


@functools.cache
def _storage(endpoint: str | None, key_id: str | None):
    from airflow_provider_horovod.storage import Storage

    return Storage()


def storage():
    """A ``Storage`` for polls, one per S3 endpoint and key: making its S3 client takes a few tenths of a
    CPU-second, which a poll every 0.25 s would pay again and again."""
    return _storage(os.environ.get("AWS_ENDPOINT_URL"), os.environ.get("AWS_ACCESS_KEY_ID"))


def checkpoints_registered(storage_uri: str, attempt: int = 1) -> list[dict]:
    """The metrics of each checkpoint Ray Train V2's controller holds for an attempt (a restart resumes from
    the latest): its checkpoint manager's snapshot, which it writes to the attempt's folder at each one.
    The legacy API writes none."""
    try:
        snapshot = storage().read_json(f"{attempt_uri(storage_uri, attempt)}/checkpoint_manager_snapshot.json")
    except ValueError:  # caught mid-write
        return []
    return [result["metrics"] for result in (snapshot or {}).get("checkpoint_results", [])]


class JobWatch(threading.Thread):
    """When, in seconds from its start, a job first had each status and its log first held each of ``marks``
    (looked at every 0.5 s). A test of a timeout bounds the run by the timeout and this start, measured on the
    same machine in the same run (an end stretched by load as the start was), not by a margin that holds only
    on a fast machine."""

    def __init__(self, hook, submission_id: str, marks=()) -> None:
        super().__init__(daemon=True)
        self.hook, self.submission_id, self.marks = hook, submission_id, marks
        self.seen: dict[str, float] = {}
        self.started = time.monotonic()
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(0.5):
            now = time.monotonic() - self.started
            if info := self.hook.get_job_info(self.submission_id):
                self.seen.setdefault(info["status"], now)
                if any(mark not in self.seen for mark in self.marks):
                    logs = self.hook.get_job_logs(self.submission_id) or ""
                    for mark in self.marks:
                        if mark in logs:
                            self.seen.setdefault(mark, now)

    def __enter__(self) -> JobWatch:
        self.start()
        return self

    def __exit__(self, *_) -> None:
        self._done.set()
        self.join()

    def at(self, what: str) -> float:
        assert what in self.seen, f"job {self.submission_id} never showed {what!r}: {self.seen}"
        return self.seen[what]


def jobs_of(hook, run_id, dag_id=DAG_ID, task_id="train"):
    base = TaskRun(dag_id, task_id, run_id).base_id
    return [j for j in hook.list_jobs() if (j.get("submission_id") or "").startswith(base + "-a")]


def defer(op, ti, context=None):
    """execute() up to its deferral, at once: the job is submitted; the TaskDeferred carries the trigger."""
    import pytest
    from airflow.providers.common.compat.sdk import TaskDeferred

    op.sync_wait_before_defer_s = 0  # no wait in the worker first: the test is about the deferral
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(context or {"ti": ti})
    return deferred.value


def trigger_event(deferred, timeout: float = HUNG_S) -> dict:
    """The trigger run to its one event, in an event loop of its own (as the triggerer runs it)."""

    async def first():
        return await asyncio.wait_for(anext(deferred.trigger.run()), timeout)

    return asyncio.run(first()).payload


def run_deferred(op, context):
    """execute -> the trigger in an event loop (as the triggerer) -> execute_complete."""
    from airflow.providers.common.compat.sdk import TaskDeferred

    try:
        return op.execute(context)
    except TaskDeferred as deferred:
        event = asyncio.run(anext(deferred.trigger.run()))
        return getattr(op, deferred.method_name)(context, event.payload)


def slow_train(config):
    """A training that waits to be killed."""
    import time

    import horovod.torch as hvd

    hvd.init()
    print("slow_train started", flush=True)
    time.sleep(300)
