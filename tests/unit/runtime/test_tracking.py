"""Experiment tracking on the cluster, its own logic: what a training logs (parameters, tags, metric
names, steps across attempts, the run's page), how a retry finds its run, rank 0 logging every
recorded report, a tracking server that fails stopping the logging and not the training, and no
MLflow imported anywhere when tracking is off. The MLflow client here is a fake that records calls;
the real server is tests/integration/test_tracking.py's."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

import airflow_provider_horovod.runtime.history as runtime_history
from airflow_provider_horovod.contract import MLFLOW_AUTH_FILE
from airflow_provider_horovod.documents import TrainingSpec
from airflow_provider_horovod.runtime import tracking

URI = "http://mlflow.internal:5000"
RUN_KEY = "ahp-dag-train-0123456789"


def spec(**changes) -> TrainingSpec:
    base = dict(
        submission_id=f"{RUN_KEY}-a2",
        storage_uri="/s",
        attempt=2,
        num_workers=4,
        trainer_api="v2",  # the runtime chose it (entrypoint.with_trainer) before tracking starts
        train_loop_config={"lr": 0.1, "model": {"layers": [64, 32], "act": "relu"}, "tag": None},
        tracking={
            "tracking_uri": URI,
            "experiment_name": "dag",
            "run_name": "train r1",
            "run_key": RUN_KEY,
            "tags": {"airflow.dag_id": "dag", "airflow.try_number": "3"},
        },
    )
    return TrainingSpec(**{**base, **changes})


# --- what is logged ---------------------------------------------------------------------------------


def test_the_parameters_are_the_config_flattened_the_world_size_and_the_trainer():
    assert tracking.params(spec()) == {
        "lr": "0.1",
        "model.layers": "[64, 32]",
        "model.act": "relu",
        "tag": "null",
        "world_size": "4",
        "trainer": "horovod",
        "trainer_api": "v2",
        "use_gpu": "False",
    }


def test_a_task_horovod_calls_arguments_are_its_parameters():
    called = spec(
        train_loop_config={}, train_args=[1, "a"], train_kwargs={"epochs": 3, "opt": {"lr": 0.5}}, num_workers=[2, 4]
    )
    assert tracking.params(called) == {
        "epochs": "3",
        "opt.lr": "0.5",
        "args": '[1, "a"]',
        "world_size": "[2, 4]",
        "trainer": "horovod",
        "trainer_api": "v2",
        "use_gpu": "False",
    }


def test_long_values_are_cut_to_what_mlflow_keeps():
    assert len(tracking.params(spec(train_loop_config={"text": "x" * 10_000}))["text"]) == tracking.PARAM_CHARS


def test_the_tags_are_the_airflow_sides_with_the_attempt_and_the_key_a_retry_finds_the_run_by():
    assert tracking.tags(spec()) == {
        "airflow.dag_id": "dag",
        "airflow.try_number": "3",
        tracking.TASK_RUN_TAG: RUN_KEY,
        "ray.submission_id": f"{RUN_KEY}-a2",
        "ray.attempt": "2",
    }
    assert tracking.run_filter(RUN_KEY) == f"tags.`airflow_provider_horovod.task_run` = '{RUN_KEY}'"


@pytest.mark.parametrize(
    ("name", "key"), [("loss", "loss"), ("val/acc@1", "val/acc_1"), ("a:b(c)", "a_b_c_"), ("", "_")]
)
def test_metric_names_become_what_mlflow_takes(name, key):
    assert tracking.metric_key(name) == key


@pytest.mark.parametrize(
    ("uri", "url"),
    [
        ("http://mlflow:5000", "http://mlflow:5000/#/experiments/7/runs/r1"),
        ("https://host/mlflow/", "https://host/mlflow/#/experiments/7/runs/r1"),
        ("http://user:pw@mlflow:5000", "http://mlflow:5000/#/experiments/7/runs/r1"),
        ("databricks", None),
    ],
)
def test_the_runs_page_is_known_for_a_tracking_server_and_never_carries_credentials(uri, url):
    assert tracking.run_url(uri, "7", "r1") == url


def test_steps_go_on_after_the_steps_of_earlier_attempts():
    assert [tracking.step_of({"report": n}, 0) for n in (1, 2)] == [1, 2]
    assert [tracking.step_of({"report": n}, 2) for n in (1, 2)] == [3, 4]


def test_the_summary_is_the_run_or_nothing():
    assert tracking.summary(spec()) is None  # not started
    assert tracking.summary(spec(tracking=None)) is None
    started = spec(tracking={**spec().tracking, "run_id": "r1", "experiment_id": "7", "run_url": "u", "step_offset": 2})
    assert tracking.summary(started) == {"run_id": "r1", "experiment_id": "7", "run_url": "u"}


def test_a_connections_credentials_become_mlflows_variables(tmp_path):
    assert tracking.auth_env(str(tmp_path)) == {}
    (tmp_path / MLFLOW_AUTH_FILE).write_text(json.dumps({"username": "u", "password": "p"}))
    assert tracking.auth_env(str(tmp_path)) == {"MLFLOW_TRACKING_USERNAME": "u", "MLFLOW_TRACKING_PASSWORD": "p"}
    (tmp_path / MLFLOW_AUTH_FILE).write_text(json.dumps({"token": "t", "other": "x"}))
    assert tracking.auth_env(str(tmp_path)) == {"MLFLOW_TRACKING_TOKEN": "t"}


# --- finding the run --------------------------------------------------------------------------------


class FakeClient:
    """MLflow's client as the tracking code calls it: runs and metric histories in memory."""

    def __init__(self, runs=(), history=None, fail=False):
        self.runs = list(runs)
        self.history = history or {}
        self.calls: list[tuple] = []
        self.fail = fail

    def search_runs(self, experiments, filter_string, max_results, order_by):
        self.calls.append(("search", experiments, filter_string))
        return self.runs[:max_results]

    def update_run(self, run_id, status):
        self.calls.append(("update", run_id, status))

    def create_run(self, experiment, tags, run_name):
        self.calls.append(("create", experiment, tags, run_name))
        return SimpleNamespace(info=SimpleNamespace(run_id="new"))

    def get_metric_history(self, run_id, key):
        return [SimpleNamespace(step=s) for s in self.history.get(key, [])]

    def log_batch(self, run_id, metrics=(), params=(), tags=()):
        if self.fail:
            raise ConnectionError("tracking server gone")
        self.calls.append(("log", run_id, [(m.key, m.value, m.step) for m in metrics]))


def test_a_first_attempt_creates_the_run_with_its_tags_and_name():
    client = FakeClient()
    assert tracking.find_or_create_run(client, spec(), "7") == ("new", 0)
    assert client.calls[0] == ("search", ["7"], tracking.run_filter(RUN_KEY))
    assert client.calls[1] == ("create", "7", tracking.tags(spec()), "train r1")


def test_a_retry_goes_on_with_the_task_runs_run_after_its_last_step():
    earlier = SimpleNamespace(info=SimpleNamespace(run_id="r1"), data=SimpleNamespace(metrics={"loss": 1, "acc": 2}))
    client = FakeClient(runs=[earlier], history={"loss": [1, 2, 3], "acc": [2]})
    assert tracking.find_or_create_run(client, spec(), "7") == ("r1", 3)
    assert ("update", "r1", "RUNNING") in client.calls
    assert not [c for c in client.calls if c[0] == "create"]


def test_without_tracking_nothing_starts_and_nothing_ends(tmp_path):
    plain = spec(tracking=None)
    assert tracking.started(plain, str(tmp_path)) is plain
    tracking.ended(plain, None)


def test_a_tracking_server_that_cannot_be_reached_does_not_fail_the_training(tmp_path, capsys, monkeypatch):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    unreachable = spec(tracking={**spec().tracking, "tracking_uri": f"http://127.0.0.1:{port}"})
    assert tracking.started(unreachable, str(tmp_path)) is unreachable  # the real client, refused
    assert "MLflow tracking is off for this attempt" in capsys.readouterr().out


# --- rank 0: every recorded report -----------------------------------------------------------------


def started_spec() -> TrainingSpec:
    return spec(tracking={**spec().tracking, "run_id": "r1", "experiment_id": "7", "run_url": "u", "step_offset": 2})


def test_rank_0_logs_every_recorded_report_at_its_step_in_the_run(tmp_path):
    history, tracker, client = runtime_history.History(), tracking.Tracker(), FakeClient()
    tracker.client = client
    history.uri = str(tmp_path / "metrics_history.json")
    tracker.follow(started_spec(), history.listeners)
    tracker.follow(started_spec(), history.listeners)  # a restarted worker group: still once
    assert len(history.listeners) == 1
    history.add(runtime_history.point({"loss": 0.5, "acc@1": 0.9, "name": "x"}, 1, None))
    history.add(runtime_history.point({"epoch": 1}, 2, "checkpoint_1"))
    history.add(runtime_history.point({"text": "no number"}, 3, None))  # nothing to log
    assert client.calls == [("log", "r1", [("acc_1", 0.9, 3), ("loss", 0.5, 3)]), ("log", "r1", [("epoch", 1.0, 4)])]


def test_without_a_run_rank_0_logs_nothing():
    listeners: list = []
    tracking.Tracker().follow(spec(), listeners)
    assert listeners == []


def test_a_failing_tracking_server_stops_the_logging_not_the_training(capsys):
    tracker, client = tracking.Tracker(), FakeClient(fail=True)
    tracker.client = client
    listeners: list = []
    tracker.follow(started_spec(), listeners)
    listeners[0](runtime_history.point({"loss": 1.0}, 1, None))  # does not raise
    client.fail = False
    listeners[0](runtime_history.point({"loss": 0.9}, 2, None))
    assert tracker.stopped
    assert client.calls == []
    assert "MLflow: logging metrics to run r1 stopped: ConnectionError" in capsys.readouterr().out


# --- nothing of MLflow without tracking --------------------------------------------------------------


def test_without_tracking_neither_side_imports_mlflow():
    """In a fresh interpreter of the cluster's environment (where MLflow is installed): the provider's
    Airflow side and the runtime, a training planned and its runtime steps run without tracking."""
    code = """
import sys
import airflow_provider_horovod
import airflow_provider_horovod.operators.horovod, airflow_provider_horovod.decorators.horovod
import airflow_provider_horovod.links.mlflow
from airflow_provider_horovod.contract import TaskRun
from airflow_provider_horovod.plan import training_plan
from airflow_provider_horovod.runtime import entrypoint, trainers, tracking
from airflow_provider_horovod.runtime.history import HISTORY, point

op = airflow_provider_horovod.operators.horovod.HorovodTrainOperator(task_id="t", train_fn="json:dumps",
    train_loop_config={"lr": 1}, check_cluster_resources=False, storage_path="/tmp/ahp-no-mlflow")
plan = training_plan(TaskRun("d", "t", "r"), op.parameters.checked(op), train_call=None, pending_timeout_s=None)
assert plan.spec.tracking is None
spec = tracking.started(plan.spec, "/nonexistent")
tracking.TRACKER.follow(spec, HISTORY.listeners)
HISTORY.add(point({"loss": 1.0}, 1, None))
tracking.ended(spec, {"checkpoint_uri": "/c"})
assert tracking.summary(spec) is None
loaded = sorted(m for m in sys.modules if m == "mlflow" or m.startswith("mlflow."))
print("MLFLOW", loaded)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "MLFLOW []" in done.stdout
    # The test can fail: the same interpreter does import it when asked.
    assert subprocess.run([sys.executable, "-c", "import mlflow.tracking"], timeout=120).returncode == 0
