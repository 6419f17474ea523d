"""Airflow as deployed: the api-server, scheduler, dag-processor and triggerer as separate processes
(LocalExecutor on PostgreSQL), driven through the REST API; and the UI in a real browser (Debian's
Chromium, headless, driven by Playwright). What `airflow dags test` cannot show: the real triggerer,
its restart, a kill through the API, the connection form, the extra link, the training view."""

from __future__ import annotations

import re
import time
from datetime import datetime
from pathlib import Path

import pytest
from support.browser import chromium, new_context

from airflow_provider_horovod.contract import TaskRun
from harness.tasks import HUNG_S, assert_stopped, jobs_of, running_after, wait_for_status

# One Airflow deployment (the session's `stack`) serves these tests: they run on one pytest-xdist worker.
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("stack")]

REPO = Path(__file__).resolve().parents[2]
SCREENSHOTS = REPO / "docs" / "screenshots"
TRAINING, QUICK, SHORT, SLOT = "ahp_stack_training", "ahp_stack_quick", "ahp_stack_short", "ahp_stack_slot"
DEFERRED = "Pausing task as DEFERRED"  # what Airflow's task runner logs when a task defers


def job_end_to_task_end_s(ti: dict, job: dict) -> float:
    """From the Ray job's end to the task instance's (printed for the record: a figure, not a test)."""
    return datetime.fromisoformat(ti["end_date"]).timestamp() - job["end_time"] / 1000


def streamed(records: list[dict]) -> list[str]:
    """The job's lines the task log holds."""
    return [r["event"][len("[ray] ") :] for r in records if str(r.get("event", "")).startswith("[ray] ")]


@pytest.fixture(scope="module")
def trained(stack, ray_cluster):
    """A run of the training DAG, its triggerer restarted while the training streams its log."""
    from airflow_provider_horovod.hooks.ray import RayHook

    ray_hook = RayHook()
    run_id = stack.trigger(TRAINING)
    stack.wait_for_state(TRAINING, run_id, "train", {"deferred"})
    sid = TaskRun(TRAINING, "train", run_id).submission_id(1)
    wait_for_status(ray_hook, sid, {"RUNNING"})
    deadline = time.monotonic() + HUNG_S
    while len(streamed(stack.task_log(TRAINING, run_id, "train"))) < 5:
        assert time.monotonic() < deadline, "the triggerer streamed nothing"
        time.sleep(1)
    stack.restart("triggerer")  # mid-run: the trigger starts again in the new triggerer
    ti = stack.wait_for_state(TRAINING, run_id, "train", {"success", "failed", "up_for_retry"})
    return {"run_id": run_id, "sid": sid, "ti": ti}


def test_a_training_runs_deferred_in_the_real_triggerer_and_a_restart_repeats_no_line(stack, trained, ray_hook):
    assert trained["ti"]["state"] == "success", stack.log_tail("triggerer")
    # One Ray job for the run, re-attached by the restarted trigger, not submitted again.
    (job,) = jobs_of(ray_hook, trained["run_id"], dag_id=TRAINING)
    assert job["submission_id"] == trained["sid"]
    print(f"deferred training: job end to task end {job_end_to_task_end_s(trained['ti'], job):.2f} s")
    records = stack.task_log(TRAINING, trained["run_id"], "train")
    # The job's log in the task log, each line once, in order, across the restart.
    assert streamed(records) == ray_hook.get_job_logs(trained["sid"]).splitlines()
    # No "nothing streamed yet" error from the triggerer, no error-level record in a good run's log.
    assert "XCom not found" not in stack.log_tail("triggerer", chars=10**7)
    assert [r for r in records if str(r.get("level", "")).lower() in ("error", "critical")] == []


def test_a_training_defers_by_default_on_airflows_default_configuration(stack, trained):
    # The DAG sets no `deferrable`, and the deployment leaves [operators] default_deferrable as it is (off).
    assert "AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE" not in stack.env
    assert stack.config("operators", "default_deferrable").lower() == "false"
    assert any(DEFERRED in str(r.get("event")) for r in stack.task_log(TRAINING, trained["run_id"], "train"))


def test_a_job_of_a_second_never_defers_and_succeeds_20_times_in_a_row(stack, ray_hook):
    run_ids = [stack.trigger(SHORT) for _ in range(20)]
    tis = [stack.wait_for_state(SHORT, run_id, "short", {"success", "failed", "up_for_retry"}) for run_id in run_ids]
    assert [ti["state"] for ti in tis] == ["success"] * 20, stack.log_tail("scheduler")
    for run_id in run_ids:
        records = stack.task_log(SHORT, run_id, "short")
        if any(DEFERRED in str(r.get("event")) for r in records):
            # Only a job that outlasted the worker's follow may defer: on a loaded machine, its start alone
            # (runtime_env, driver) can take that long. The follow starts just before Ray's start_time.
            [job] = jobs_of(ray_hook, run_id, dag_id=SHORT, task_id="short")
            took_s = (job["end_time"] - job["start_time"]) / 1000
            assert took_s > float(stack.config("horovod", "defer_after_seconds")) - 1, (run_id, took_s)
        assert stack.xcom(SHORT, run_id, "short") == 42


def test_a_training_whose_job_ended_finishes_before_a_waiting_run_takes_its_slot(stack, ray_hook):
    """Under max_active_tis_per_dag=1 a deferred training would need the slot again to finish, and a
    waiting run of an earlier logical date would take it first: the finished one then waited for that
    run's whole training (seen on a deployment: 73-83 s). It waits in its worker instead."""
    later = stack.api("POST", f"/dags/{SLOT}/dagRuns", json={"logical_date": "2026-01-03T00:00:00Z"})["dag_run_id"]
    stack.wait_for_state(SLOT, later, "train", {"running", "deferred"})
    earlier = stack.api("POST", f"/dags/{SLOT}/dagRuns", json={"logical_date": "2026-01-02T00:00:00Z"})["dag_run_id"]
    first = stack.wait_for_state(SLOT, later, "train", {"success", "failed", "up_for_retry"})
    second = stack.wait_for_state(SLOT, earlier, "train", {"success", "failed", "up_for_retry"})
    assert first["state"] == second["state"] == "success", stack.log_tail("scheduler")
    # The first finished when its job did, before the second's training began, not after it.
    assert datetime.fromisoformat(first["end_date"]) <= datetime.fromisoformat(second["start_date"])
    assert any(
        "waiting for the job in this worker, not deferred" in str(r.get("event"))
        for r in stack.task_log(SLOT, later, "train")
    )
    (job,) = jobs_of(ray_hook, later, dag_id=SLOT)
    assert job["status"] == "SUCCEEDED"
    print(f"training under a task-level limit: job end to task end {job_end_to_task_end_s(first, job):.2f} s")


def test_the_example_retraining_dag_triggered_without_a_logical_date_runs_on_the_day_it_was_asked(stack, ray_hook):
    run_id = stack.trigger("horovod_retraining")  # "logical_date": null
    run = stack.api("GET", f"/dags/horovod_retraining/dagRuns/{run_id}")
    assert run["logical_date"] is None
    ti = stack.wait_for_state("horovod_retraining", run_id, "promote", {"success", "failed", "upstream_failed"})
    assert ti["state"] == "success", stack.log_tail("scheduler")
    summary = stack.xcom("horovod_retraining", run_id, "promote")
    assert summary["logical_date"] == run["run_after"][:10]
    assert summary["checkpoint_uri"]
    train = stack.api("GET", f"/dags/horovod_retraining/dagRuns/{run_id}/taskInstances/train")
    (job,) = jobs_of(ray_hook, run_id, dag_id="horovod_retraining")
    deferred = any(DEFERRED in str(r.get("event")) for r in stack.task_log("horovod_retraining", run_id, "train"))
    print(f"example's training (deferred: {deferred}): job end to task end {job_end_to_task_end_s(train, job):.2f} s")


def test_marking_a_deferred_task_failed_stops_its_job(stack, ray_hook):
    begun = time.monotonic()
    run_id = stack.trigger(QUICK)
    stack.wait_for_state(QUICK, run_id, "train", {"deferred"})
    sid = TaskRun(QUICK, "train", run_id).submission_id(1)
    start_s = running_after(ray_hook, sid, begun)  # the run's start, through the scheduler, to its job's
    # Failed before the triggerer picks the trigger up, nothing would stop the job (docs/reliability.md).
    stack.wait_for_trigger(QUICK, run_id, "train")
    asked = time.monotonic()
    stack.api("PATCH", f"/dags/{QUICK}/dagRuns/{run_id}/taskInstances/train", json={"new_state": "failed"})
    assert_stopped(ray_hook, sid, asked, start_s)


# --- the UI, in a real browser -------------------------------------------------------------------


@pytest.fixture(scope="module")
def page(stack):
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with chromium() as browser:
        yield new_context(browser, viewport={"width": 1400, "height": 900}).new_page()


def test_the_connection_form_shows_the_ray_fields_in_reading_order_with_switches(stack, page):
    page.goto(f"{stack.url}/connections", wait_until="networkidle")
    page.get_by_role("button", name=re.compile("Add Connection", re.I)).click()
    page.get_by_role("combobox").first.click()
    page.get_by_text("Ray", exact=True).first.click()
    address = page.get_by_text("Ray dashboard address", exact=True)
    token = page.get_by_text("Ray auth token", exact=True)
    assert address.first.is_visible()
    assert token.first.is_visible()
    assert address.first.bounding_box()["y"] < token.first.bounding_box()["y"]  # the address, then the token
    for hidden in ("Port", "Schema", "Login"):
        assert not page.get_by_text(hidden, exact=True).is_visible(), hidden
    assert page.get_by_placeholder("contents of ~/.ray/auth_token on the head node").is_visible()
    page.get_by_text("Extra Fields", exact=True).click()  # the connection's extras, from the provider info
    for label in ("Verify TLS", "CA bundle", "Local storage is shared", "Default runtime_env", "Extra HTTP headers"):
        page.get_by_text(label, exact=True).first.wait_for()
    # The two booleans are switches, not text boxes holding "true".
    assert page.locator("[data-scope='switch'], [role='switch'], input[type='checkbox']").count() >= 2
    page.screenshot(path=str(SCREENSHOTS / "connection-form.png"), full_page=True)
