"""The plugin's views in Airflow's own UI, in a real browser (Debian's Chromium, headless, driven by
Playwright) on the real stack: the Training tab of a task instance (live while a real training runs,
then its checkpoints) and the Training history tab of a retraining DAG. Screenshots go to
docs/screenshots. The tests that need no training also run on the oldest supported Airflow, whose
UI loads React app plugins too."""

from __future__ import annotations

import base64
import re
import time
from importlib.metadata import version
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from playwright.sync_api import Error as PlaywrightError
from support.browser import chromium, new_context

from airflow_provider_horovod.contract import TaskRun
from harness.ports import free_port
from harness.stack import Stack
from harness.tasks import HUNG_S, wait_for_status

# One Airflow deployment (the session's `stack`) serves these tests: they run on one pytest-xdist worker.
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("stack")]

REPO = Path(__file__).resolve().parents[2]
SCREENSHOTS = REPO / "docs" / "screenshots"
TRAINING, HISTORY = "ahp_stack_view_training", "ahp_stack_view_history"
HISTORY_DAYS = ("2026-11-01", "2026-11-02", "2026-11-03")
VIEW = "[data-testid=training-view]"
# The oldest supported Airflow runs the tests marked oldest_airflow too: its screenshots apart from
# those of the Airflow the project is tested with first (scripts/versions.env).
NEWEST = re.search(r"^AIRFLOW=(\S+)", (REPO / "scripts" / "versions.env").read_text(), re.M).group(1)
AIRFLOW_SUFFIX = "" if version("apache-airflow") == NEWEST else f"-airflow-{version('apache-airflow')}"
# Airflow before 3.3 signs every user in with a `_token` cookie (and then opens its home page again);
# 3.3, every user an admin, sets none.
SETS_TOKEN = tuple(int(part) for part in version("apache-airflow").split(".")[:2]) < (3, 3)


@pytest.fixture(scope="module")
def history_runs(stack):
    """Three runs of the retraining DAG on three logical dates (seconds each)."""
    return [
        stack.api(
            "POST", f"/dags/{HISTORY}/dagRuns", json={"dag_run_id": f"view_{day}", "logical_date": f"{day}T00:00:00Z"}
        )["dag_run_id"]
        for day in HISTORY_DAYS
    ]


@pytest.fixture(scope="module")
def runs(stack, history_runs):
    """A real training (about a minute); the history's runs go on meanwhile."""
    return {"training": stack.trigger(TRAINING), "history": history_runs}


@pytest.fixture(scope="module")
def browser_session():
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with chromium() as launched:
        launched.ahp_sessions = {}  # (server, colour scheme) -> its browser context (open_page)
        yield launched


@pytest.fixture
def browser(browser_session):
    """The module's browser; the pages a test opened are closed after it (Airflow's UI and the views poll
    while open: a page left open keeps a core's fraction busy for the rest of the run)."""
    yield browser_session
    for context in browser_session.contexts:
        for page in context.pages:
            page.close()


def open_page(browser, url: str, *, scheme: str = "light", height: int = 1000, only_under: str | None = None):
    """A new page of the browser's session with the URL's server in ``scheme``, as a user's browser keeps
    one: signed in once, Airflow's UI from its cache after the first page. ``only_under``: a sub-path
    (``/airflow``); requests outside it are refused, as the proxy in front of a deployment under it does
    (and listed in ``page.refused``)."""
    origin = "{0.scheme}://{0.netloc}".format(urlsplit(url))
    context = browser.ahp_sessions.get((origin, scheme))
    signing_in = context is None
    if signing_in:
        context = browser.ahp_sessions[origin, scheme] = new_context(browser, color_scheme=scheme)
    page = context.new_page()
    page.set_viewport_size({"width": 1400, "height": height})
    errors: list[str] = []
    page.on("pageerror", lambda err: errors.append(str(err)))
    page.errors = errors
    page.refused = []
    if only_under is not None:

        def proxy(route):
            path = urlsplit(route.request.url).path
            if path == only_under or path.startswith(f"{only_under}/"):
                route.continue_()
            else:
                page.refused.append(route.request.url)
                route.abort()

        page.route("**/*", proxy)
    if not signing_in:
        page.goto(url, wait_until="networkidle")
        return page
    # Airflow 3.1 sends a new session to its home page after the login: the page is opened after it,
    # once the login has set the session's token (a loaded machine reaches networkidle before). With
    # every user an admin, Airflow 3.3 sets no token and answers the UI's "who am I" at once.
    signed_in = []
    if not SETS_TOKEN:
        page.on("response", lambda r: signed_in.append(r) if r.ok and r.url.endswith("/ui/auth/me") else None)
    page.goto(url.split("/dags/")[0] + "/", wait_until="networkidle")
    deadline = time.monotonic() + HUNG_S
    while not signed_in and not any(cookie["name"] == "_token" for cookie in context.cookies()):
        assert time.monotonic() < deadline, "the UI never logged in"
        page.wait_for_timeout(250)
    # The login's answer sets the token and sends the browser home: seen before that navigation ends, the
    # cookie lets the page's own navigation start, which the home redirect still in flight interrupts once.
    try:
        page.goto(url, wait_until="networkidle")
    except PlaywrightError as err:
        if "interrupted by another navigation" not in str(err):
            raise
        page.wait_for_load_state("networkidle")
        page.goto(url, wait_until="networkidle")
    return page


def training_tab(stack, dag_id: str, run_id: str, task_id: str) -> str:
    return f"{stack.url}/dags/{dag_id}/runs/{run_id}/tasks/{task_id}/plugin/horovod_training"


def points(page, metric: str) -> int:
    chart = page.locator(f'{VIEW} [data-metric="{metric}"]')
    return int(chart.get_attribute("data-points") or 0) if chart.count() else 0


def mean_brightness(page, png: bytes) -> float:
    """Mean luminance (0-255) of a screenshot, worked out by the browser's own PNG decoder."""
    return page.evaluate(
        """async (data) => {
        const image = new Image();
        image.src = `data:image/png;base64,${data}`;
        await image.decode();
        const canvas = document.createElement("canvas");
        canvas.width = image.width;
        canvas.height = image.height;
        const context = canvas.getContext("2d");
        context.drawImage(image, 0, 0);
        const pixels = context.getImageData(0, 0, canvas.width, canvas.height).data;
        let sum = 0;
        for (let i = 0; i < pixels.length; i += 4) {
            sum += 0.2126 * pixels[i] + 0.7152 * pixels[i + 1] + 0.0722 * pixels[i + 2];
        }
        return sum / (pixels.length / 4);
    }""",
        base64.b64encode(png).decode(),
    )


def test_the_training_view_of_a_running_training_shows_its_first_reports_before_the_job_ends(
    stack, runs, browser, ray_hook
):
    run_id = runs["training"]
    stack.wait_for_state(TRAINING, run_id, "train", {"deferred", "running"})
    sid = TaskRun(TRAINING, "train", run_id).submission_id(1)
    wait_for_status(ray_hook, sid, {"RUNNING"})
    page = open_page(browser, training_tab(stack, TRAINING, run_id, "train"))
    page.locator(f"{VIEW}[data-trains]").wait_for()  # its first answer is in
    assert page.locator(VIEW).get_attribute("data-trains") == "yes"
    assert page.locator(VIEW).get_attribute("data-live") == "yes"
    deadline = time.monotonic() + HUNG_S
    while points(page, "loss") < 2:  # the view refreshes by itself: no reload here
        assert time.monotonic() < deadline, f"no reports drawn: {page.locator(VIEW).inner_text()}"
        time.sleep(0.5)
    # Seen while the job still runs, and the task still waits for it.
    assert ray_hook.get_job_status(sid) == "RUNNING"
    assert stack.task_instance(TRAINING, run_id, "train")["state"] in ("deferred", "running")
    assert "refreshed every" in page.get_by_test_id("live").inner_text()
    page.screenshot(path=str(SCREENSHOTS / "training-view-live.png"))
    assert page.errors == []


def test_once_trained_the_view_lists_the_checkpoints_ray_kept_and_marks_those_it_deleted(stack, runs, browser):
    run_id = runs["training"]
    assert stack.wait_for_state(TRAINING, run_id, "train", {"success", "failed"})["state"] == "success"
    sid = TaskRun(TRAINING, "train", run_id).submission_id(1)
    # The task's Details tab links its Ray job too (the operator's extra link).
    details = open_page(
        browser, training_tab(stack, TRAINING, run_id, "train").replace("plugin/horovod_training", "details")
    )
    link = details.get_by_role("link", name=re.compile("Ray job"))
    link.first.wait_for()
    assert link.first.get_attribute("href").endswith(f"/#/jobs/{sid}")
    details.screenshot(path=str(SCREENSHOTS / "task-details-ray-job-link.png"), full_page=True)
    page = open_page(browser, training_tab(stack, TRAINING, run_id, "train"), height=1500)
    page.get_by_test_id("checkpoints").wait_for()
    assert page.locator(VIEW).get_attribute("data-live") == "no"
    # 4 checkpoints (every third report), Ray keeps 2 (checkpoint_num_to_keep).
    assert page.locator("[data-testid=checkpoints] tbody tr").count() == 2
    assert page.get_by_test_id("deleted-checkpoints").get_attribute("data-count") == "2"
    charts = page.locator(f"{VIEW} .ahp-chart")
    # val_loss ranks the checkpoints: first, drawn on its own 4 reports, its 4 checkpoints marked on them.
    assert charts.first.get_attribute("data-metric") == "val_loss"
    assert [charts.first.get_attribute(a) for a in ("data-points", "data-kept", "data-deleted")] == ["4", "2", "2"]
    loss = page.locator(f'{VIEW} [data-metric="loss"]')
    assert [loss.get_attribute(a) for a in ("data-points", "data-kept", "data-deleted")] == ["12", "2", "2"]
    assert page.locator(f"{VIEW} a.ray-job").get_attribute("href").endswith(f"/#/jobs/{sid}")
    page.screenshot(path=str(SCREENSHOTS / "training-view.png"))
    assert page.errors == []


def test_in_dark_mode_the_view_is_dark(stack, runs, browser):
    url = training_tab(stack, TRAINING, runs["training"], "train")
    shots = {}
    for scheme in ("light", "dark"):
        page = open_page(browser, url, scheme=scheme, height=1500)
        page.get_by_test_id("checkpoints").wait_for()
        assert page.evaluate("document.documentElement.classList.contains('dark')") == (scheme == "dark")
        shots[scheme] = mean_brightness(page, page.locator(VIEW).screenshot())
        if scheme == "dark":
            page.screenshot(path=str(SCREENSHOTS / "training-view-dark.png"))
    assert shots["light"] > 200, shots
    assert shots["dark"] < 60, shots


@pytest.mark.oldest_airflow
def test_a_task_that_does_not_train_shows_a_neutral_line_and_no_error(stack, history_runs, browser):
    run_id = history_runs[0]
    stack.wait_for_state(HISTORY, run_id, "promote", {"success"})
    page = open_page(browser, training_tab(stack, HISTORY, run_id, "evaluate"))
    message = page.get_by_test_id("message")
    message.wait_for()
    assert message.inner_text() == "This task does not train with Horovod: there are no training curves here."
    assert page.locator(VIEW).get_attribute("data-trains") == "no"
    assert page.get_by_test_id("problem").count() == 0
    assert page.locator(f"{VIEW} .ahp-chart").count() == 0
    assert page.errors == []


@pytest.mark.oldest_airflow
def test_the_history_of_a_dag_with_three_runs_shows_three_rows_and_its_charts(stack, history_runs, browser):
    for run_id in history_runs:
        stack.wait_for_state(HISTORY, run_id, "promote", {"success"})
    page = open_page(browser, f"{stack.url}/dags/{HISTORY}/plugin/horovod_history", height=1700)
    table = page.get_by_test_id("history-table")
    table.wait_for()
    rows = table.locator("tbody tr")
    assert rows.count() == 3
    assert [rows.nth(i).get_attribute("data-run") for i in range(3)] == [f"view_{d}" for d in reversed(HISTORY_DAYS)]
    header = [h.strip() for h in table.locator("thead th").all_inner_texts()]
    # Every run's cost after its duration; then the metric that ranks checkpoints leads; epoch, which
    # counts rather than measures, is no column.
    assert header[header.index("duration") + 1 :][:2] == ["cost", "val_loss"]
    assert "holdout_mse" in header
    assert header[-1] == "champion"
    assert "epoch" not in header
    costs = table.locator("tbody td[data-cost]")
    assert [costs.nth(i).get_attribute("data-cost") for i in range(3)] == ["yes"] * 3
    assert all(re.fullmatch(r"[\d.]+ worker-s", text) for text in costs.all_inner_texts()), costs.all_inner_texts()
    assert [rows.nth(i).locator("td").last.inner_text() for i in range(3)] == ["moved", "kept", "moved"]
    charts = [c.get_attribute("data-chart") for c in page.locator("[data-testid=history-view] .ahp-chart").all()]
    assert charts[:1] == ["m-val_loss"]
    assert {"e-holdout_mse", "duration", "compare"} <= set(charts)
    compare = page.locator('[data-chart="compare"]')
    compare.wait_for()
    assert compare.get_attribute("data-series") == "2"  # two runs' curves on one chart
    page.screenshot(path=str(SCREENSHOTS / f"training-history{AIRFLOW_SUFFIX}.png"))
    assert page.errors == []


def test_a_killed_training_says_it_was_killed_and_its_job_stopped(stack, browser, ray_hook):
    run_id = stack.trigger(TRAINING)
    stack.wait_for_state(TRAINING, run_id, "train", {"deferred", "running"})
    sid = TaskRun(TRAINING, "train", run_id).submission_id(1)
    wait_for_status(ray_hook, sid, {"RUNNING"})
    # A user marks the running task failed: Airflow kills it, and the provider stops its job.
    stack.mark(TRAINING, run_id, "train", "failed")
    wait_for_status(ray_hook, sid, {"STOPPED"})
    page = open_page(browser, training_tab(stack, TRAINING, run_id, "train"))
    message = page.get_by_test_id("message")
    message.wait_for()
    assert message.get_attribute("data-killed") == "yes"
    assert message.inner_text().startswith(
        f"Attempt 1 was killed before its training ended, and its Ray job {sid} was stopped with it."
    )
    assert page.locator(VIEW).get_attribute("data-live") == "no"
    page.screenshot(path=str(SCREENSHOTS / "training-view-killed.png"))
    assert page.errors == []


@pytest.fixture(scope="module")
def sub_path(stack, tmp_path_factory):
    """A second api-server of the deployment, under ``[api] base_url = http://host:port/airflow``."""
    server = Stack(
        tmp_path_factory.mktemp("sub-path"),
        REPO / "tests" / "dags_stack",
        free_port(),
        path="/airflow",
        database_url=stack.database_url,
    )
    try:
        server.serve()
        yield server
    finally:
        server.stop()


@pytest.mark.oldest_airflow
def test_under_a_sub_path_both_views_load_their_bundle_and_icons_from_under_it(stack, history_runs, sub_path, browser):
    run_id = history_runs[0]
    stack.wait_for_state(HISTORY, run_id, "promote", {"success"})
    for url, ready in (
        (training_tab(sub_path, HISTORY, run_id, "train"), "[data-testid=checkpoints]"),
        (f"{sub_path.url}/dags/{HISTORY}/plugin/horovod_history", '[data-chart="compare"]'),
    ):
        page = open_page(browser, url, only_under="/airflow", height=1200)
        page.locator(ready).wait_for()
        assert page.refused == [], (page.refused, page.errors)
        assert page.errors == [], (page.refused, page.errors)
    # The views' entries as the UI gets them: the bundle and the icons under the sub-path, served there.
    (plugin,) = [p for p in sub_path.api("GET", "/plugins")["plugins"] if p["name"] == "horovod_training"]
    for app in plugin["react_apps"]:
        for key in ("bundle_url", "icon", "icon_dark_mode"):
            assert app[key].startswith("/airflow/horovod/static/"), (key, app[key])
            served = httpx.get(f"http://127.0.0.1:{sub_path.port}{app[key]}", timeout=30)
            assert served.status_code == 200, (key, served.status_code)
            assert served.content, (key, served.status_code)
