"""Experiment tracking against a real MLflow tracking server (``mlflow server`` on SQLite, from
``.venv-mlflow``, which ``make setup-test`` installs): a real two-worker Horovod training through the
operator logs its parameters, every report at its step, the Airflow identifiers and the checkpoint
URI; its failed first attempt and the retry that resumes from its checkpoint are one MLflow run.
What the server holds is read back with MLflow's own client."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from airflow_provider_horovod.links.mlflow import MlflowRunLink
from harness.ports import free_port
from harness.tasks import HUNG_S, FakeTI

from .test_operator import make_operator

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
MLFLOW_VENV = REPO / ".venv-mlflow"
CONN_ID = "ahp_mlflow"
PASSWORD = f"ahp-mlflow-secret-{uuid.uuid4().hex[:8]}"


class MlflowServer:
    def __init__(self, uri: str):
        self.uri = uri

    def read(self, experiment_name: str, metric_keys: tuple[str, ...]) -> dict:
        """The experiment's runs as MLflow's client reads them: info, params, tags, metric histories."""
        code = f"""
import json
from mlflow.tracking import MlflowClient
client = MlflowClient({self.uri!r})
experiment = client.get_experiment_by_name({experiment_name!r})
runs = client.search_runs([experiment.experiment_id]) if experiment else []
print(json.dumps({{"experiment_id": experiment and experiment.experiment_id, "runs": [
    {{"run_id": r.info.run_id, "status": r.info.status, "params": r.data.params, "tags": r.data.tags,
      "history": {{key: [(m.step, m.value) for m in client.get_metric_history(r.info.run_id, key)]
                   for key in {list(metric_keys)!r}}}}} for r in runs]}}))
"""
        done = subprocess.run(
            [str(MLFLOW_VENV / "bin" / "python"), "-c", code],
            capture_output=True,
            text=True,
            timeout=HUNG_S,
            check=True,
        )
        return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """``mlflow server`` on 127.0.0.1 (a free port), its runs in SQLite, for the session."""
    mlflow = MLFLOW_VENV / "bin" / "mlflow"
    assert mlflow.exists(), f"{mlflow} is missing: `make setup-test` installs it (scripts/setup_mlflow_server.sh)"
    folder = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    log = open(folder / "server.log", "wb")
    # Tracking only: MLflow 3's job execution (GenAI scorers, periodic tasks) would start a job runner
    # and ten huey consumers, each importing mlflow, about 30 CPU-s that no test here uses.
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    server = subprocess.Popen(
        [
            str(mlflow),
            "server",
            "--backend-store-uri",
            f"sqlite:///{folder}/mlflow.db",
            "--default-artifact-root",
            str(folder / "artifacts"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env=env,
    )
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + HUNG_S
        while True:
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            assert server.poll() is None, (folder / "server.log").read_text()[-3000:]
            assert time.monotonic() < deadline, (folder / "server.log").read_text()[-3000:]
            time.sleep(0.5)
        yield MlflowServer(uri)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:  # uvicorn waits for open connections to close
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(10)
        log.close()


def train_fails_once(config):
    """``epochs`` epochs on two Horovod ranks, a checkpoint each; a run that did not resume fails on
    every rank after epoch ``fail_after_epoch``, as a crash would. Reports nothing to MLflow itself."""
    import json
    import os
    import tempfile

    import horovod.torch as hvd
    import ray.train
    import torch
    from ray.train import Checkpoint

    hvd.init()
    checkpoint = ray.train.get_checkpoint()
    start = 0
    if checkpoint:
        with checkpoint.as_directory() as folder, open(os.path.join(folder, "state.json")) as f:
            start = json.load(f)["epoch"] + 1
    for epoch in range(start, config["epochs"]):
        loss = hvd.allreduce(torch.tensor(1.0 / (epoch + 1)), name=f"loss{epoch}").item()
        metrics = {"epoch": epoch, "loss": loss, "start_epoch": start}
        if hvd.rank() == 0:
            with tempfile.TemporaryDirectory() as folder:
                with open(os.path.join(folder, "state.json"), "w") as f:
                    json.dump({"epoch": epoch}, f)
                ray.train.report(metrics, checkpoint=Checkpoint.from_directory(folder))
        else:
            ray.train.report(metrics)
        if checkpoint is None and epoch == config["fail_after_epoch"]:
            raise RuntimeError("failing on purpose, to be resumed")


def test_a_failed_then_resumed_training_logs_one_mlflow_run(
    mlflow_server, ray_cluster, ray_hook, tmp_path, monkeypatch
):
    from airflow_provider_horovod.exceptions import UserCodeError

    experiment = f"ahp-tracking-{uuid.uuid4().hex[:8]}"
    # An MLflow connection with credentials: the server does not ask for them, and they must not show.
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{CONN_ID.upper()}",
        json.dumps({"conn_type": "http", "host": mlflow_server.uri, "login": "ahp", "password": PASSWORD}),
    )
    config = {"epochs": 4, "fail_after_epoch": 1, "optimizer": {"name": "sgd", "lr": 0.5}}
    op = make_operator(
        tmp_path / "storage",
        train_fn=train_fails_once,
        train_loop_config=config,
        retry_on_user_error=True,
        mlflow_conn_id=CONN_ID,
        mlflow_experiment_name=experiment,
    )
    ti = FakeTI(f"mlflow-{uuid.uuid4().hex[:6]}")
    started = time.monotonic()
    with pytest.raises(UserCodeError):  # retried by Airflow: retry_on_user_error
        op.execute({"ti": ti})
    first = mlflow_server.read(experiment, ("epoch",))
    (failed,) = first["runs"]
    assert failed["status"] == "FAILED", failed
    assert failed["history"]["epoch"] == [[1, 0.0], [2, 1.0]], failed

    ti.try_number = 2
    result = op.execute({"ti": ti})
    elapsed = time.monotonic() - started
    assert result["attempt"] == 2
    assert result["metrics"]["start_epoch"] == 2  # resumed from epoch 1's checkpoint

    read = mlflow_server.read(experiment, ("epoch", "loss", "start_epoch"))
    (run,) = read["runs"]  # the retry went on with the first attempt's run
    assert run["run_id"] == failed["run_id"]
    assert run["status"] == "FINISHED"
    # Every report of both attempts, at its step, in order.
    assert run["history"]["epoch"] == [[1, 0.0], [2, 1.0], [3, 2.0], [4, 3.0]]
    assert [step for step, _ in run["history"]["loss"]] == [1, 2, 3, 4]
    assert run["history"]["loss"][-1][1] == pytest.approx(0.25)  # both ranks' 1/4, averaged by Horovod
    assert run["history"]["start_epoch"] == [[1, 0.0], [2, 0.0], [3, 2.0], [4, 2.0]]
    assert run["params"] == {
        "epochs": "4",
        "fail_after_epoch": "1",
        "optimizer.name": "sgd",
        "optimizer.lr": "0.5",
        "world_size": "2",
        "trainer": "horovod",
        "trainer_api": "v2",
        "use_gpu": "False",
    }
    tags = run["tags"]
    assert {
        k: tags.get(k)
        for k in (
            "airflow.dag_id",
            "airflow.task_id",
            "airflow.run_id",
            "airflow.map_index",
            "airflow.try_number",
            "ray.attempt",
            "ray.submission_id",
        )
    } == {
        "airflow.dag_id": ti.dag_id,
        "airflow.task_id": "train",
        "airflow.run_id": ti.run_id,
        "airflow.map_index": "-1",
        "airflow.try_number": "2",
        "ray.attempt": "2",
        "ray.submission_id": result["submission_id"],
    }
    assert tags["checkpoint_uri"] == result["checkpoint_uri"]
    assert "/attempt-2/" in tags["checkpoint_uri"]
    assert tags["mlflow.runName"] == f"train {ti.run_id}"

    # The run in the task's result and on its extra link.
    url = f"{mlflow_server.uri}/#/experiments/{read['experiment_id']}/runs/{run['run_id']}"
    assert result["mlflow"] == {"run_id": run["run_id"], "experiment_id": read["experiment_id"], "run_url": url}
    assert MlflowRunLink().get_link(op, ti_key=None) == url
    with urllib.request.urlopen(f"{mlflow_server.uri}/ajax-api/2.0/mlflow/runs/get?run_id={run['run_id']}") as page:
        assert page.status == 200

    # The connection's password is in no job's info (runtime_env, metadata, entrypoint), log, or XCom.
    for attempt in (1, 2):
        sid = ti.task_run.submission_id(attempt)
        assert PASSWORD not in json.dumps(ray_hook.get_job_info(sid)) + ray_hook.get_job_logs(sid)
    assert PASSWORD not in json.dumps(result) + json.dumps(ti.xcoms, default=str)
    print(f"two attempts with MLflow tracking: {elapsed:.1f} s")


# A script with no import of Ray: rank 0 prints its metrics in the documented form and saves a model.
SCRIPT = """
import os
import horovod.torch as hvd
import torch

hvd.init()
for epoch in range(3):
    loss = hvd.allreduce(torch.tensor(1.0 / (epoch + 1)), name=f"loss{epoch}").item()
    if hvd.rank() == 0:
        torch.save({"epoch": epoch}, os.path.join(os.environ["AHP_CHECKPOINT_DIR"], "model.pt"))
        print(f"METRICS epoch={epoch} loss={loss}")
"""


def test_a_scripts_printed_metrics_and_its_checkpoint_are_its_mlflow_run(mlflow_server, ray_hook, tmp_path):
    experiment = f"ahp-script-tracking-{uuid.uuid4().hex[:8]}"
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "train.py").write_text(SCRIPT)
    op = make_operator(
        tmp_path / "storage",
        train_fn=None,
        train_script=str(tmp_path / "scripts" / "train.py"),
        mlflow_tracking_uri=mlflow_server.uri,
        mlflow_experiment_name=experiment,
    )
    result = op.execute({"ti": FakeTI(f"mlflow-script-{uuid.uuid4().hex[:6]}")})
    (run,) = mlflow_server.read(experiment, ("epoch", "loss"))["runs"]
    assert run["status"] == "FINISHED"
    log = ray_hook.get_job_logs(result["submission_id"])
    assert run["history"]["epoch"] == [[1, 0.0], [2, 1.0], [3, 2.0]], log[-6000:]
    assert [round(value, 3) for _, value in run["history"]["loss"]] == [1.0, 0.5, 0.333]
    assert run["tags"]["checkpoint_uri"] == result["checkpoint_uri"]
    assert (Path(result["checkpoint_uri"]) / "model.pt").exists()
    assert result["mlflow"]["run_id"] == run["run_id"]
