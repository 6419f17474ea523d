"""HorovodTrainOperator against the real stack, from Airflow's own environment: a Ray head with token
auth started from the cluster's environment. The in-process tests of the Airflow side (failure, kill,
stop, re-attach) run quick real Ray jobs under the operator's own submission ids (``quick_jobs``).
Real trainings through the operator: deferred in the lineage test (test_lineage.py), to S3 with the
sensor example (test_dags.py), and in the tests of failures, tracking and a busy cluster."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest
import structlog.testing

from airflow_provider_horovod.exceptions import InfrastructureError, RayJobError
from airflow_provider_horovod.operators.horovod import HorovodTrainOperator
from harness.tasks import (
    HUNG_S,
    FakeTI,
    StateStore,
    assert_stopped,
    jobs_of,
    run_in_thread,
    running_after,
    slow_train,
    wait_for_status,
)

pytestmark = pytest.mark.integration


# --- in-process: a task's operator driven directly, with the real cluster -----------------------


def make_operator(storage_path, train_fn=slow_train, **kwargs):
    kwargs = {"deferrable": False, "poll_interval_seconds": 0.5, **kwargs}
    return HorovodTrainOperator(
        task_id="train", train_fn=train_fn, num_workers=2, storage_path=str(storage_path), **kwargs
    )


def long_quick_job(seconds: int = 300) -> dict:
    """The quick job's config for a job that prints a line a second and runs until stopped."""
    return {"quick_lines": seconds, "quick_line_s": 1}


def test_on_kill_stops_the_job(ray_hook, tmp_path, quick_jobs):
    ti = FakeTI(f"kill-{uuid.uuid4().hex[:6]}")
    op = make_operator(tmp_path, train_loop_config=long_quick_job())
    begun = time.monotonic()
    thread, outcome = run_in_thread(op, {"ti": ti})
    sid = ti.task_run.submission_id(1)
    start_s = running_after(ray_hook, sid, begun)
    asked = time.monotonic()
    op.on_kill()
    assert_stopped(ray_hook, sid, asked, start_s)
    thread.join(HUNG_S)
    assert isinstance(outcome.get("error"), RayJobError)


def test_a_failed_job_fails_the_task_with_its_class_and_what_to_do(ray_hook, tmp_path, quick_jobs):
    ti = FakeTI(f"fail-{uuid.uuid4().hex[:6]}")
    op = make_operator(
        tmp_path,
        train_loop_config={"quick_lines": 60, "quick_fail": "boom-in-training", "quick_fail_class": "infrastructure"},
    )
    with pytest.raises(InfrastructureError) as err:
        op.execute({"ti": ti})
    message = str(err.value)
    # Ray's error type, then the runtime's verdict: the class, what failed, what to do.
    assert "ended FAILED (JOB_ENTRYPOINT_COMMAND_ERROR)" in message, message
    assert "infrastructure: QuickJobError: boom-in-training" in message
    assert message.splitlines()[-1].startswith("What to do: nothing in the task")
    assert "quick-line-0001" not in message  # the log is in the task log already, not in the answer
    assert err.value.status == "FAILED"
    assert "checkpoint_uri" not in ti.xcoms


def test_stopped_job_fails_the_task(ray_hook, tmp_path, quick_jobs):
    ti = FakeTI(f"stop-{uuid.uuid4().hex[:6]}")
    op = make_operator(tmp_path, train_loop_config=long_quick_job())
    thread, outcome = run_in_thread(op, {"ti": ti})
    sid = ti.task_run.submission_id(1)
    wait_for_status(ray_hook, sid, {"RUNNING"})
    ray_hook.stop_job(sid)
    thread.join(HUNG_S)
    err = outcome.get("error")
    assert isinstance(err, RayJobError), outcome
    assert "ended STOPPED" in str(err), outcome


def streamed_lines(events: list[dict]) -> list[str]:
    """The job's log lines the operator wrote to the task log since the last call (and forget them)."""
    lines = [e["event"][len("[ray] ") :] for e in events if str(e.get("event", "")).startswith("[ray] ")]
    events.clear()
    return lines


def test_retry_reattaches_to_the_running_job(ray_hook, tmp_path, quick_jobs):
    with structlog.testing.capture_logs() as events:  # the task log, as the operator writes it
        ti = FakeTI(f"retry-{uuid.uuid4().hex[:6]}")
        store = StateStore()  # the task instance's, shared by its tries
        config = {"quick_lines": 12, "quick_line_s": 0.5}
        first = make_operator(tmp_path, train_loop_config=config)
        # A worker that dies mid-wait, once it has streamed some of the job's log: the job goes on.
        thread, _ = run_in_thread(first, {"ti": ti, "task_state_store": store})
        sid = ti.task_run.submission_id(1)
        deadline = time.monotonic() + HUNG_S
        while (store.get("ray_log_cursor") or {}).get("lines", 0) < 3:
            assert time.monotonic() < deadline, "the first try streamed no log line"
            time.sleep(0.2)
        first._killed.set()  # the first try's worker goes away, without stopping the job
        thread.join(HUNG_S)
        first_lines = streamed_lines(events)
        saved = store["ray_log_cursor"]
        assert first_lines
        assert (saved["submission_id"], saved["lines"]) == (sid, len(first_lines))
        assert wait_for_status(ray_hook, sid, {"RUNNING", "SUCCEEDED"})

        ti.try_number = 2
        result = make_operator(tmp_path, train_loop_config=config).execute({"ti": ti, "task_state_store": store})
        assert result["submission_id"] == sid
        assert [j["submission_id"] for j in jobs_of(ray_hook, ti.run_id)] == [sid]
        assert ti.xcoms["checkpoint_uri"] == result["checkpoint_uri"]
        # Across the two tries' task logs, every line of the job's log once, in order.
        assert first_lines + streamed_lines(events) == ray_hook.get_job_logs(sid).splitlines()


def forget(hook, sid: str, quiet_s: float = 3.0) -> None:
    """Delete an ended job until Ray keeps no record of it for ``quiet_s``: a job deleted just as it ended
    can come back as "Job supervisor actor died" when its supervisor's exit is noticed."""
    deadline, quiet_since = time.monotonic() + HUNG_S, None
    while True:
        if hook.get_job_info(sid) is not None:
            hook.delete_job(sid)
            quiet_since = None
        elif quiet_since is None:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= quiet_s:
            return
        assert time.monotonic() < deadline, f"Ray kept a record of {sid}"
        time.sleep(0.5)


def test_a_job_the_cluster_forgot_is_not_submitted_again_and_the_retry_resumes(ray_hook, tmp_path, quick_jobs):
    """A replaced Ray head forgets its jobs, and a driver killed with its head leaves no record (here: the
    job deleted, which leaves the head's job table as a new head's, and its record removed). The retry
    finds the attempt's submission noted but no such job: it keeps that attempt's record and submits the
    next attempt, resuming from it; the forgotten submission id is never submitted again."""
    ti = FakeTI(f"forgot-{uuid.uuid4().hex[:6]}")
    failing = {"quick_lines": 3, "quick_fail": "lost-with-its-head", "quick_fail_class": "infrastructure"}
    with pytest.raises(InfrastructureError):
        make_operator(tmp_path, train_loop_config=failing).execute({"ti": ti})
    first, second = ti.task_run.submission_id(1), ti.task_run.submission_id(2)
    forget(ray_hook, first)
    attempt_1 = Path(ti.task_run.storage_uri(str(tmp_path))) / "attempt-1"
    (attempt_1 / "result.json").unlink()

    ti.try_number = 2
    result = make_operator(tmp_path, train_loop_config={"quick_lines": 3}).execute({"ti": ti})
    assert (result["submission_id"], result["resumed_from"]) == (second, str(attempt_1))
    assert ray_hook.get_job_info(first) is None  # not submitted again
    failure = json.loads((attempt_1 / "result.json").read_text())["failure"]
    assert failure["failure_class"] == "infrastructure"
    assert f"Ray job {first} vanished" in failure["summary"]


def test_gpus_the_cluster_lacks_fail_before_submission(ray_hook, tmp_path):
    from airflow_provider_horovod.exceptions import RayJobPendingTimeoutError

    before = len(ray_hook.list_jobs())
    op = make_operator(tmp_path, use_gpu=True)
    with pytest.raises(RayJobPendingTimeoutError) as err:
        op.execute({"ti": FakeTI(f"gpu-{uuid.uuid4().hex[:6]}")})
    assert '"GPU": 2.0' in str(err.value)
    assert '"CPU": ' in str(err.value)
    assert "use_gpu=False" in str(err.value)
    assert len(ray_hook.list_jobs()) == before  # nothing was submitted


@pytest.mark.parametrize(
    "kwargs, parameter",
    [({"ray_conn_id": "no_such_ray"}, "no_such_ray"), ({"aws_conn_id": "no_such_aws"}, "aws_conn_id")],
)
def test_missing_connections_fail_before_submission(airflow_db, ray_cluster, tmp_path, kwargs, parameter):
    from airflow_provider_horovod.exceptions import HorovodProviderError

    op = make_operator(tmp_path, **kwargs)
    with pytest.raises(HorovodProviderError, match=parameter):
        op.execute({"ti": FakeTI("missing-conn")})
