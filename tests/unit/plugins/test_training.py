"""The Training view's plugin: registered where Airflow loads it, its bundle where Airflow's UI looks,
what the view answers for each kind of task instance, and its routes behind Airflow's access control."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from airflow_provider_horovod.plugins import training
from airflow_provider_horovod.plugins.data import JOB_KEY, RETURN_KEY, Storage
from airflow_provider_horovod.plugins.training import HorovodTrainingPlugin, answer

REPO = Path(__file__).resolve().parents[3]
WWW = REPO / "airflow_provider_horovod" / "plugins" / "www"


def test_the_plugin_is_an_airflow_plugins_entry_point_of_the_installed_provider():
    # Airflow loads provider-info plugins only with lazy_discover_providers off; entry points always.
    found = [e for e in entry_points(group="airflow.plugins") if e.name == "horovod_training"]
    assert [e.load() for e in found] == [HorovodTrainingPlugin]


@pytest.mark.parametrize("root_path", ["/", "/airflow/"])
def test_airflow_finds_each_view_under_the_name_the_bundle_registers_it_by(monkeypatch, root_path):
    monkeypatch.setattr(training, "api_root_path", lambda: root_path)
    plugin = HorovodTrainingPlugin()
    apps = {app["destination"]: app for app in plugin.react_apps}
    assert set(apps) == {"task_instance", "dag"}
    entry = (WWW / "src" / "main.jsx").read_text()
    prefix = root_path.rstrip("/")
    for app in apps.values():
        # Airflow's UI renders globalThis[<the app's name>] once it has imported the bundle.
        assert f'globalThis["{app["name"]}"] = ' in entry, app["name"]
        # Under the UI's root path: a deployment under a sub-path serves nothing outside it.
        assert app["bundle_url"].startswith(f"{prefix}{training.ROUTE}/static/{training.BUNDLE}?v=")
        assert app["icon"] == f"{prefix}{training.ROUTE}/static/chart.svg"
        assert app["icon_dark_mode"] == f"{prefix}{training.ROUTE}/static/chart-dark.svg"
    assert apps["task_instance"]["url_route"] == "horovod_training"
    assert plugin.external_views == []  # no iframe of its own any more


def test_the_root_path_is_the_one_airflow_serves_under(monkeypatch):
    import airflow.api_fastapi.app as api_app

    monkeypatch.setattr(api_app, "API_ROOT_PATH", "/airflow/")
    assert training.api_root_path() == "/airflow/"


def test_the_app_is_made_where_airflow_reads_it_once_not_where_the_plugin_loads(monkeypatch):
    made = []
    monkeypatch.setattr(training, "make_app", lambda: made.append(1) or object())
    plugin = HorovodTrainingPlugin()
    assert plugin.name == "horovod_training"
    assert made == []
    (app,) = plugin.fastapi_apps
    assert app["url_prefix"] == training.ROUTE
    assert made == [1]
    assert plugin.fastapi_apps[0]["app"] is app["app"]
    assert made == [1]


def test_loading_plugins_as_every_airflow_process_does_imports_no_web_framework(tmp_path):
    # The scheduler, the dag-processor and each task load every plugin; only the api-server serves them.
    code = (
        "import sys\n"
        "from airflow import plugins_manager\n"
        "plugins, _ = plugins_manager._get_plugins()\n"
        "assert 'horovod_training' in [p.name for p in plugins]\n"
        "print(sorted(m for m in ('fastapi', 'starlette') if m in sys.modules))\n"
    )
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_the_wheel_carries_the_built_bundle_and_not_its_sources():
    wheels = sorted((REPO / ".build" / "dist").glob("*.whl"))
    if not wheels:
        pytest.fail("no wheel in .build/dist: `make setup-test` builds it (scripts/build_ui.sh first)")
    names = zipfile.ZipFile(wheels[-1]).namelist()
    assert "airflow_provider_horovod/plugins/www/dist/training.js" in names
    sources = ("/www/src/", "/www/test/", "node_modules", "package.json", "eslint.config.js")
    assert not [n for n in names if any(part in n for part in sources)]


# --- what the view answers -----------------------------------------------------------------------


def ti(state: str = "success", operator: str = "@task", map_index: int = -1) -> dict:
    return {"state": state, "try_number": 1, "map_index": map_index, "operator": operator}


def write_attempt(storage: Path, *, history: list[dict] | None, record: dict | None, kept: list[str]) -> None:
    folder = storage / "attempt-2"
    folder.mkdir(parents=True)
    if history is not None:
        (folder / "metrics_history.json").write_text(json.dumps(history))
    if record is not None:
        (folder / "result.json").write_text(json.dumps(record))
    for name in kept:
        (folder / name).mkdir()
        (folder / name / "model.pt").write_text("weights")


HISTORY = [
    {
        "report": n,
        "time": 100.0 + n,
        "metrics": {"epoch": n - 1, "loss": 1.0 / n},
        "checkpoint": f"checkpoint_{n:06d}" if n % 2 == 0 else None,
    }
    for n in range(1, 7)
]


def job(storage: Path, kind: str = "train") -> dict:
    return {
        "submission_id": "ahp-d-train-x-a2",
        "storage_uri": str(storage),
        "attempt": 2,
        "kind": kind,
        "dashboard_url": "http://ray:8265/#/jobs/ahp-d-train-x-a2",
        "trainer_api": "v2",
    }


def test_a_task_that_does_not_train_gets_a_neutral_line_not_an_error():
    assert answer(None, {}) == {
        "found": False,
        "trains": False,
        "live": False,
        "message": "There is no such task instance.",
    }
    plain = answer(ti(), {RETURN_KEY: {"holdout_mse": 0.1}})
    assert (plain["trains"], plain["live"], plain.get("problem")) == (False, False, None)
    assert plain["message"] == "This task does not train with Horovod: there are no training curves here."
    ray_task = answer(ti("running", "@task.ray"), {JOB_KEY: job(Path("/s"), kind="task")})
    assert ray_task["message"] == "This task runs a Ray job, not a training: it has no training curves."
    assert ray_task["live"]
    assert ray_task["facts"] == [
        {"label": "Ray job", "value": "ahp-d-train-x-a2", "href": "http://ray:8265/#/jobs/ahp-d-train-x-a2"}
    ]
    waiting = answer(ti("queued", "HorovodTrainOperator"), {})
    assert (waiting["trains"], waiting["live"], waiting["message"]) == (
        False,
        True,
        "The training has not been submitted yet.",
    )


def test_a_running_training_is_drawn_from_its_live_history_and_refreshes(tmp_path):
    write_attempt(tmp_path, history=HISTORY[:3], record=None, kept=["checkpoint_000002"])
    running = answer(ti("deferred", "@task.horovod", map_index=3), {JOB_KEY: job(tmp_path)})
    assert (running["trains"], running["live"], running["refresh_s"], running["map_index"]) == (True, True, 5, 3)
    assert running["attempt"] == 2
    assert running["message"] == ""
    assert running["problem"] == ""
    curves = running["curves"]
    assert curves["reports"] == 3
    assert curves["axes"] == ["epoch", "report", "elapsed_s"]
    assert [(c["name"], c["exists"], c["uri"]) for c in curves["checkpoints"]] == [
        ("checkpoint_000002", True, f"{tmp_path}/attempt-2/checkpoint_000002")
    ]
    assert {
        "label": "Ray job",
        "value": "ahp-d-train-x-a2",
        "href": "http://ray:8265/#/jobs/ahp-d-train-x-a2",
    } in running["facts"]
    before_the_first_report = answer(ti("running", "HorovodTrainOperator"), {JOB_KEY: job(tmp_path / "new")})
    assert before_the_first_report["message"] == "Waiting for the first report."
    assert before_the_first_report["curves"]["metrics"] == []


def test_a_finished_training_lists_the_checkpoints_ray_kept_and_marks_those_it_deleted(tmp_path):
    latest = f"{tmp_path}/attempt-2/checkpoint_000006"
    result = {
        **job(tmp_path),
        "metrics": {"loss": 1 / 6},
        "checkpoint_uri": latest,
        "best_checkpoint_uri": latest,
        "world_size": 4,
        "timings": {"fit_s": 900.0},
        "checkpoint_score_attribute": "loss",
        "cost": {
            "total": {
                "attempts": 2,
                "worker_s": 3700.0,
                "cpu_s": 3700.0,
                "gpu_s": 0.0,
                "amount": 0.25,
                "failed_attempts": 1,
                "failed_worker_s": 100.0,
            },
            "prices": {"cpu_hour": 0.05, "gpu_hour": 2.0, "currency": "USD"},
        },
    }
    # The live history file is gone (or never was): the record's history is drawn.
    write_attempt(
        tmp_path,
        history=None,
        record={"history": HISTORY, "world_size": 4},
        kept=["checkpoint_000004", "checkpoint_000006"],
    )
    done = answer(ti(), {RETURN_KEY: result, JOB_KEY: job(tmp_path)})
    assert (done["trains"], done["live"], done["map_index"]) == (True, False, None)
    checkpoints = done["curves"]["checkpoints"]
    assert [(c["name"], c["exists"], c["latest"]) for c in checkpoints] == [
        ("checkpoint_000002", False, False),
        ("checkpoint_000004", True, False),
        ("checkpoint_000006", True, True),
    ]
    loss = done["curves"]["metrics"][0]
    assert loss["name"] == "loss"
    assert loss["chosen"]
    assert loss["kept_at"] == [3, 5]
    assert loss["deleted_at"] == [1]
    assert done["curves"]["score_attribute"] == "loss"
    facts = {f["label"]: f["value"] for f in done["facts"]}
    assert facts["workers"] == "4"
    assert facts["training time"] == "900.0 s"
    assert facts["cost"] == (
        "3700.0 worker-s (CPU 3700.0 s, GPU 0.0 s), 0.2500 USD; 1 failed attempt(s): 100.0 worker-s"
    )
    assert {"label": "latest checkpoint", "value": latest} in done["uris"]


def test_storage_that_cannot_be_read_is_said_on_the_page_with_what_was_read(tmp_path):
    class Unreachable(Storage):
        def read_text(self, uri):
            raise ConnectionError("the S3 endpoint does not answer")

    broken = answer(ti("running", "HorovodTrainOperator"), {JOB_KEY: job(tmp_path)}, storage=Unreachable())
    assert broken["trains"]
    assert broken["live"]
    assert broken["curves"]["metrics"] == []
    assert broken["problem"] == (
        f"The training's files at {tmp_path}/attempt-2 cannot be read: the S3 endpoint does not answer"
    )


# --- the routes -----------------------------------------------------------------------------------


def test_the_routes_ask_airflow_who_is_asking_and_the_bundle_is_served(monkeypatch, tmp_path):
    from fastapi.testclient import TestClient

    (tmp_path / "training.js").write_text("globalThis.x = 1;")
    monkeypatch.setattr(training, "DIST", tmp_path)
    client = TestClient(training.make_app())
    for path in ("/api/training?dag_id=d&run_id=r&task_id=t", "/api/history?dag_id=d"):
        assert client.get(path).status_code == 401, path  # no token, no data
    bundle = client.get("/static/training.js")
    assert bundle.status_code == 200
    assert re.search("javascript", bundle.headers["content-type"])
    monkeypatch.setattr(training, "DIST", tmp_path / "never-built")
    missing = TestClient(training.make_app()).get("/static/training.js")
    assert missing.status_code == 404
    assert "scripts/build_ui.sh" in missing.json()["detail"]


def test_why_each_attempt_failed_is_shown_from_the_records_they_left(tmp_path):
    first = tmp_path / "attempt-1"
    first.mkdir()
    (first / "result.json").write_text(
        json.dumps(
            {
                "failure": {
                    "failure_class": "infrastructure",
                    "summary": "ActorDiedError: a worker died",
                    "rank": None,
                    "traceback": "",
                    "hint": "nothing in the task: a worker or node was lost.",
                }
            }
        )
    )
    failure = {
        "failure_class": "user_code",
        "summary": "ZeroDivisionError: division by zero",
        "rank": 1,
        "traceback": 'File "train.py", line 9, in train\n    1 / 0',
        "hint": "fix the training function.",
    }
    write_attempt(tmp_path, history=HISTORY[:2], record={"failure": failure, "history": HISTORY[:2]}, kept=[])
    failed = answer(ti("failed", "HorovodTrainOperator"), {JOB_KEY: job(tmp_path)})
    assert failed["trains"]
    assert [(f["attempt"], f["class"], f["rank"]) for f in failed["failures"]] == [
        (1, "infrastructure", None),
        (2, "user code", 1),
    ]
    assert failed["failures"][1]["traceback"].endswith("1 / 0")
    assert failed["curves"]["reports"] == 2
    # A training that never failed lists none.
    assert answer(ti("running", "HorovodTrainOperator"), {JOB_KEY: job(tmp_path / "fine")})["failures"] == []


def test_a_killed_attempt_says_it_was_killed_and_its_job_stopped(tmp_path):
    # Killed before its first report: no history, no record (the wait never saw the job end).
    (tmp_path / "attempt-2").mkdir()
    killed = answer(ti("failed", "HorovodTrainOperator"), {JOB_KEY: job(tmp_path)})
    assert killed["trains"]
    assert killed["killed"]
    assert killed["curves"]["reports"] == 0
    assert killed["message"] == (
        "Attempt 2 was killed before its training ended, and its Ray job ahp-d-train-x-a2 was stopped with it. "
        "It reported no metrics."
    )
    # Killed after some reports: they are drawn, and the message says where they end.
    write_attempt(tmp_path / "later", history=HISTORY[:3], record=None, kept=[])
    later = answer(ti("failed", "HorovodTrainOperator"), {JOB_KEY: job(tmp_path / "later")})
    assert later["killed"]
    assert later["message"].endswith("Its reports until then are below.")
    assert later["curves"]["reports"] == 3
    # Killed while the task still followed the job in the worker: the wait saw Ray stop it and kept a
    # post-mortem (as a real kill left it): the message tells the kill, not a failure of the training's.
    stopped = {
        "error_type": None,
        "failure_class": "infrastructure",
        "hint": "nothing in the task: a worker, a node or the network failed.",
        "message": "Job was intentionally stopped.",
        "rank": None,
        "summary": "STOPPED: Job was intentionally stopped.",
        "traceback": "",
    }
    write_attempt(tmp_path / "seen", history=None, record={"attempt": 2, "failure": stopped}, kept=[])
    seen = answer(ti("failed", "HorovodTrainOperator"), {JOB_KEY: job(tmp_path / "seen")})
    assert seen["killed"]
    assert seen["message"] == killed["message"]
    assert seen["failures"] == []
    # An attempt whose job ended as the provider saw it left a record: its failure says why, not a kill.
    write_attempt(tmp_path / "failed", history=[], record={"failure": {"failure_class": "user_code"}}, kept=[])
    failed = answer(ti("failed", "HorovodTrainOperator"), {JOB_KEY: job(tmp_path / "failed")})
    assert not failed["killed"]
    assert failed["message"] == "This training reported no metrics."
    # Still running, waiting for its retry (whose view is live), or done: no kill.
    for state in ("running", "up_for_retry", "success"):
        assert not answer(ti(state, "HorovodTrainOperator"), {JOB_KEY: job(tmp_path)})["killed"], state


def test_a_smoke_run_says_so_in_the_facts_and_beside_its_cost():
    from airflow_provider_horovod.plugins.training import facts

    cost = {"total": {"attempts": 1, "worker_s": 4.0, "cpu_s": 4.0, "gpu_s": 0.0, "amount": None}}
    shown = {f["label"]: f["value"] for f in facts({"smoke_run": True, "world_size": 2, "cost": cost}, {}, {})}
    assert shown["smoke run"].startswith("yes")
    assert shown["cost"].endswith("(smoke run)")
    assert "smoke run" not in {f["label"] for f in facts({"world_size": 2, "cost": cost}, {}, {})}
