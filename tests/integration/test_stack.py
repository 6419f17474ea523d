"""Airflow as deployed: the api-server, scheduler, dag-processor and triggerer as separate processes
(LocalExecutor on SQLite), driven through the REST API; and the UI in a real browser (Debian's
Chromium, headless, driven by Playwright). What `airflow dags test` cannot show: the real triggerer,
its restart, a kill through the API, the connection form, the extra link, the training view."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from conftest import free_port
from support.stack import Stack
from support.tasks import jobs_of, wait_for_status

from airflow_provider_horovod.contract import TaskRun

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SCREENSHOTS = REPO / "docs" / "screenshots"
TRAINING, QUICK = "ahp_stack_training", "ahp_stack_quick"


def streamed(records: list[dict]) -> list[str]:
    """The job's lines the task log holds."""
    return [r["event"][len("[ray] "):] for r in records if str(r.get("event", "")).startswith("[ray] ")]


@pytest.fixture(scope="module")
def stack(ray_cluster, tmp_path_factory):
    running = Stack(tmp_path_factory.mktemp("stack"), REPO / "tests" / "dags_stack", free_port())
    try:
        running.start()
        running.wait_for_dag(TRAINING)
        running.wait_for_dag(QUICK)
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def trained(stack, ray_cluster):
    """A run of the training DAG, its triggerer restarted while the training streams its log."""
    from airflow_provider_horovod.hooks.ray import RayHook

    ray_hook = RayHook()
    run_id = stack.trigger(TRAINING)
    stack.wait_for_state(TRAINING, run_id, "train", {"deferred"}, timeout=300)
    sid = TaskRun(TRAINING, "train", run_id).submission_id(1)
    wait_for_status(ray_hook, sid, {"RUNNING"}, timeout=120)
    deadline = time.monotonic() + 180
    while len(streamed(stack.task_log(TRAINING, run_id, "train"))) < 5:
        assert time.monotonic() < deadline, "the triggerer streamed nothing"
        time.sleep(1)
    stack.restart("triggerer")  # mid-run: the trigger starts again in the new triggerer
    ti = stack.wait_for_state(TRAINING, run_id, "train", {"success", "failed", "up_for_retry"}, timeout=600)
    return {"run_id": run_id, "sid": sid, "ti": ti}


def test_a_training_runs_deferred_in_the_real_triggerer_and_a_restart_repeats_no_line(stack, trained, ray_hook):
    assert trained["ti"]["state"] == "success", stack.log_tail("triggerer")
    # One Ray job for the run, re-attached by the restarted trigger, not submitted again.
    assert [j["submission_id"] for j in jobs_of(ray_hook, trained["run_id"], dag_id=TRAINING)] == [trained["sid"]]
    records = stack.task_log(TRAINING, trained["run_id"], "train")
    # The job's log in the task log, each line once, in order, across the restart.
    assert streamed(records) == ray_hook.get_job_logs(trained["sid"]).splitlines()
    # No "nothing streamed yet" error from the triggerer, no error-level record in a good run's log.
    assert "XCom not found" not in stack.log_tail("triggerer", chars=10**7)
    assert [r for r in records if str(r.get("level", "")).lower() in ("error", "critical")] == []


def test_marking_a_deferred_task_failed_stops_its_job_within_15_s(stack, ray_hook):
    run_id = stack.trigger(QUICK)
    stack.wait_for_state(QUICK, run_id, "train", {"deferred"}, timeout=300)
    sid = TaskRun(QUICK, "train", run_id).submission_id(1)
    wait_for_status(ray_hook, sid, {"RUNNING"}, timeout=120)
    started = time.monotonic()
    stack.api("PATCH", f"/dags/{QUICK}/dagRuns/{run_id}/taskInstances/train", json={"new_state": "failed"})
    assert wait_for_status(ray_hook, sid, {"STOPPED"}, timeout=15) == "STOPPED"
    assert time.monotonic() - started < 15


# --- the UI, in a real browser -------------------------------------------------------------------

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--no-first-run", "--disable-sync"]


@pytest.fixture(scope="module")
def page(stack):
    from playwright.sync_api import sync_playwright

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 900})
            yield context.new_page()
        finally:
            browser.close()


def test_the_connection_form_shows_the_ray_fields_in_reading_order_with_switches(stack, page):
    page.goto(f"{stack.url}/connections", wait_until="networkidle")
    page.get_by_role("button", name=re.compile("Add Connection", re.I)).click()
    page.get_by_role("combobox").first.click()
    page.get_by_text("Ray", exact=True).first.click()
    address, token = page.get_by_text("Ray dashboard address", exact=True), page.get_by_text("Ray auth token", exact=True)
    assert address.first.is_visible() and token.first.is_visible()
    assert address.first.bounding_box()["y"] < token.first.bounding_box()["y"]  # the address, then the token
    for hidden in ("Port", "Schema", "Login"):
        assert not page.get_by_text(hidden, exact=True).is_visible(), hidden
    assert page.get_by_placeholder("contents of ~/.ray/auth_token on the head node").is_visible()
    page.get_by_text("Extra Fields", exact=True).click()  # the connection's extras, from the provider info
    for label in ("Verify TLS", "CA bundle", "Local storage is shared", "Default runtime_env", "Extra HTTP headers"):
        page.get_by_text(label, exact=True).first.wait_for(timeout=10_000)
    # The two booleans are switches, not text boxes holding "true".
    assert page.locator("[data-scope='switch'], [role='switch'], input[type='checkbox']").count() >= 2
    page.screenshot(path=str(SCREENSHOTS / "connection-form.png"), full_page=True)


def test_the_details_tab_links_the_ray_job_and_the_training_view_draws_the_curves(stack, trained, page):
    run_id = trained["run_id"]
    base = f"{stack.url}/dags/{TRAINING}/runs/{run_id}/tasks/train"
    page.goto(f"{base}/details", wait_until="networkidle")
    link = page.get_by_role("link", name=re.compile("Ray job"))
    link.first.wait_for(timeout=30_000)
    assert link.first.get_attribute("href").endswith(f"/#/jobs/{trained['sid']}")
    page.screenshot(path=str(SCREENSHOTS / "task-details-ray-job-link.png"), full_page=True)

    page.goto(f"{base}/plugin/horovod_training", wait_until="networkidle")
    page.screenshot(path=str(SCREENSHOTS / "training-view.png"), full_page=True)
    frame = page.frame_locator("iframe").first
    frame.locator("svg.chart").first.wait_for(timeout=30_000)
    assert frame.locator('svg.chart[data-metric="loss"]').count() == 1
    assert frame.locator("dd").first.inner_text()  # the run's facts: world size, attempt, ...
    assert frame.locator("a.ray-job").get_attribute("href").endswith(f"/#/jobs/{trained['sid']}")
    page.screenshot(path=str(SCREENSHOTS / "training-view.png"), full_page=True)
