"""The example DAGs users copy, run as users run them: `airflow dags test` and `airflow tasks test`, or
``dag.test()`` in the test's process as docs/ci.md's pytest example does (where the command line is
not what a test checks), from Airflow's environment, training on the cluster's."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import types
import uuid
from pathlib import Path

import pytest
from support.airflow_cli import airflow_bin, dag_test, dags_test, tagged_json, xcom_values

from airflow_provider_horovod.contract import TaskRun
from airflow_provider_horovod.examples.retraining import champion_as_of
from harness.tasks import HUNG_S

pytestmark = pytest.mark.integration

DAGS = Path(__file__).resolve().parents[2] / "dags"
QUICK_DAGS = Path(__file__).resolve().parents[1] / "dags_quick"
DAG_ID = "horovod_retraining"


def test_every_dag_file_imports_without_the_training_stack():
    """The scheduler's environment has no torch, Horovod or Ray: the example DAG files parse there."""
    code = (
        "import importlib.util, sys\n"
        "from airflow.dag_processing.dagbag import DagBag\n"
        f"bag = DagBag(dag_folder={str(DAGS)!r})\n"
        "stack = [m for m in ('torch', 'horovod', 'ray') if importlib.util.find_spec(m)]\n"
        "print('RESULT', sorted(bag.dag_ids), dict(bag.import_errors), stack)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HUNG_S)
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT")]
    assert line, out.stderr[-3000:]
    assert "'horovod_quickstart', 'horovod_retraining', 'horovod_script', 'horovod_sensor_example'" in line[0], line[0]
    assert line[0].endswith("{} []"), line[0]


# On the newest Airflow its parts run in other tests: the quickstart's functions by import path (the
# sensor example), @task.horovod with task.ray scoring (the sweep), `airflow dags test` training (the smoke
# run); make test trains it on the oldest Airflow only (pytest without -m runs it on any).
@pytest.mark.oldest_airflow_only
def test_quickstart_example_trains_and_evaluates_on_the_cluster(airflow_db, ray_cluster, ray_hook, tmp_path):
    run = dags_test("horovod_quickstart", dags_folder=DAGS, conf={"storage_path": str(tmp_path)})
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-6000:]
    evaluation = float(re.findall(r"holdout MSE: ([0-9.]+)", output)[-1])
    assert evaluation < 0.05  # the model learnt, scored in a Ray job where torch is
    (checkpoint,) = set(re.findall(r"checkpoint: (\S+)", output))
    assert checkpoint.startswith(str(tmp_path))
    assert (Path(checkpoint) / "model.pt").is_file()


@pytest.fixture
def retraining_env(tmp_path, monkeypatch, airflow_db, ray_cluster):
    monkeypatch.setenv("HOROVOD_RETRAINING_STORAGE", str(tmp_path))
    return tmp_path


def run_retraining(date: str, capfd) -> dict:
    run = dag_test(DAG_ID, DAGS / f"{DAG_ID}.py", logical_date=date)
    captured = capfd.readouterr()
    output = captured.out + captured.err
    assert run.state == "success", output[-8000:]
    (summary,) = tagged_json(output, "AHP_RETRAINING")
    return summary


def champion(storage: Path) -> dict:
    """The champion record: ``{"current": <move>, "moves": [...]}``."""
    return json.loads((storage / DAG_ID / "champion.json").read_text())


def champion_events(storage: Path) -> list[dict]:
    """The extras of the champion Asset events the retraining runs under ``storage`` emitted."""
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = (
            session.query(AssetEvent.extra)
            .join(AssetModel, AssetModel.id == AssetEvent.asset_id)
            .filter(AssetModel.name == "horovod_retraining_champion")
            .order_by(AssetEvent.id)
            .all()
        )
    return [extra for (extra,) in rows if str(extra.get("checkpoint_uri", "")).startswith(str(storage))]


def seeded_checkpoint(folder: Path) -> str:
    """A checkpoint of the example's model as its training writes one (``model.pt``, ``meta.json``),
    made where torch is: an older champion's, untrained, for a backfilled day to warm-start from."""
    from harness.cluster import run_in_cluster_env

    run_in_cluster_env(
        "import json, os, torch\n"
        "from airflow_provider_horovod.examples.retraining import N_FEATURES, build_model\n"
        f"folder = {str(folder)!r}\n"
        "os.makedirs(folder)\n"
        "torch.manual_seed(1)\n"
        "torch.save(build_model().state_dict(), os.path.join(folder, 'model.pt'))\n"
        "json.dump({'epoch': 4, 'n_features': N_FEATURES}, open(os.path.join(folder, 'meta.json'), 'w'))\n"
    )
    return str(folder)


def test_a_backfill_after_a_newer_champion_reproduces_the_past(retraining_env, ray_hook, capfd):
    """Two champions were made: one on 2026-10-25 (a real checkpoint) and a newer one by the daily run
    of 2026-11-10 (its holdout MSE 0.32, as seen on a real deployment; its checkpoint does not exist, so a
    run that warm-starts from it fails). A past day is then backfilled: it trains, evaluates and
    warm-starts from the champion of its own time (the older one, not the newer), a win is recorded as
    the champion of its day, and the current champion, the newest day's, stays and is not published
    again. (A day with no champion of its own time starts cold: ``champion_as_of`` in the unit tests,
    and every first run, such as the stack's.)"""
    from airflow_provider_horovod.storage import Storage

    older = {
        "logical_date": "2026-10-25",
        "holdout_mse": 5.0,
        "run_id": "scheduled__2026-10-25",
        "checkpoint_uri": seeded_checkpoint(retraining_env / "older" / "checkpoint_000004"),
        "submission_id": "ahp-x-a0",
        "replaces": None,
    }
    newest = {
        "logical_date": "2026-11-10",
        "holdout_mse": 0.32,
        "run_id": "scheduled__2026-11-10",
        "checkpoint_uri": str(retraining_env / "gone" / "checkpoint_000004"),
        "submission_id": "ahp-x-a1",
        "replaces": {key: older[key] for key in ("logical_date", "holdout_mse", "run_id")},
    }
    Storage().write_json(str(retraining_env / DAG_ID / "champion.json"), {"current": newest, "moves": [older, newest]})

    day = "2026-11-02"
    summary = run_retraining(day, capfd)
    # Warm-started from the champion of its own time, the older one, not the newer one.
    assert champion_as_of(champion(retraining_env), day) == older
    assert summary["warm_start"] == older["checkpoint_uri"] != newest["checkpoint_uri"]
    assert summary["checkpoint_uri"].startswith(str(retraining_env))
    assert summary["holdout_mse"] < 0.2 * summary["baseline_mse"]  # it learnt
    # It beat the champion in force on its day: recorded as the champion of its day, though a newer exists.
    assert summary["holdout_mse"] < older["holdout_mse"]
    assert summary["promoted"], summary
    assert not summary["current"], summary
    record = champion(retraining_env)
    assert record["moves"][-1]["run_id"] == summary["run_id"]
    assert record["moves"][-1]["logical_date"] == day
    assert record["current"] == newest
    assert champion_as_of(record, "2026-11-03")["run_id"] == summary["run_id"]
    assert champion_as_of(record, "2026-11-01") == older
    assert champion_as_of(record, "2026-11-11") == newest
    # The data, the training and the evaluation ran as Ray jobs of their own (where torch is); the
    # training's job carries the DAG's job_tags.
    jobs = [j for j in ray_hook.list_jobs() if j.get("metadata", {}).get("airflow_dag_id") == DAG_ID]
    for task_id in ("prepare_data", "train", "evaluate"):
        assert [j["status"] for j in jobs if j["metadata"]["airflow_task_id"] == task_id] == ["SUCCEEDED"]
    assert {j["metadata"].get("team") for j in jobs if j["metadata"]["airflow_task_id"] == "train"} == {"forecasting"}
    # Downstream DAGs heard nothing: the current champion did not move.
    assert champion_events(retraining_env) == []


def test_the_retraining_days_come_from_the_run_after_date_without_a_logical_date():
    """A run triggered through REST with "logical_date": null has no ``ds``: every task takes its day from
    ``dag_run.run_after`` instead (and from the logical date when there is one)."""
    import datetime

    from airflow.dag_processing.dagbag import DagBag

    def dag():
        return DagBag(dag_folder=str(DAGS / "horovod_retraining.py")).dags[DAG_ID]

    # One template decides the day, for every task that takes it (promote's other arguments are XComs).
    (template,) = dag().get_task("prepare_data").op_args
    assert list(dag().get_task("champion_checkpoint").op_args) == [template]
    assert list(dag().get_task("promote").op_args)[-1] == template
    after = datetime.datetime(2026, 11, 12, 6, 30, tzinfo=datetime.timezone.utc)
    for logical_date, day in (
        (None, "2026-11-12"),
        (datetime.datetime(2026, 11, 3, tzinfo=datetime.timezone.utc), "2026-11-03"),
    ):
        task = dag().get_task("prepare_data")
        task.render_template_fields({"dag_run": types.SimpleNamespace(logical_date=logical_date, run_after=after)})
        assert list(task.op_args) == [day]


def run_id_of(dag_id: str, day: str) -> str | None:
    """The run of the day in Airflow's database, read directly: a CLI call per poll would cost a
    few seconds of CPU each, taken from the training the test waits for."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = session.query(DagRun.run_id, DagRun.logical_date).filter(DagRun.dag_id == dag_id).all()
    found = [run_id for run_id, logical_date in rows if logical_date and logical_date.isoformat().startswith(day)]
    return found[0] if found else None


def tasks_test(dag_id: str, task_id: str, run_id: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "AIRFLOW__CORE__DAGS_FOLDER": str(QUICK_DAGS)}
    return subprocess.run(
        [airflow_bin(), "tasks", "test", dag_id, task_id, run_id], capture_output=True, text=True, timeout=600, env=env
    )


def jobs_for(hook, dag_id: str, run_id: str) -> list[str]:
    base = TaskRun(dag_id, "train", run_id).base_id
    return sorted(j["submission_id"] for j in hook.list_jobs() if (j.get("submission_id") or "").startswith(base))


def test_rerun_after_a_crash_reattaches_and_clearing_trains_again(airflow_db, ray_cluster, ray_hook):
    """The Airflow process dies hard mid-training; the rerun re-attaches to the job (one job for
    the task run, the complete XCom); running the succeeded task again (a clear) trains anew."""
    dag_id = "ahp_quick_retraining"
    env = {**os.environ, "AIRFLOW__CORE__DAGS_FOLDER": str(QUICK_DAGS)}
    proc = subprocess.Popen(
        [airflow_bin(), "dags", "test", dag_id, "2026-11-05"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + HUNG_S
        run_id = None
        while time.monotonic() < deadline and not (run_id and jobs_for(ray_hook, dag_id, run_id)):
            time.sleep(1)
            run_id = run_id_of(dag_id, "2026-11-05")
        assert run_id, "the training job was never submitted"
        assert jobs_for(ray_hook, dag_id, run_id), "the training job was never submitted"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)

    rerun = tasks_test(dag_id, "train", run_id)
    assert rerun.returncode == 0, rerun.stdout[-4000:] + rerun.stderr[-4000:]
    (job,) = jobs_for(ray_hook, dag_id, run_id)  # re-attached: still one job for this task run
    output = rerun.stdout + rerun.stderr
    assert job.endswith("-a1")
    assert "Re-attaching to Ray job" in output
    # The XCom is what an uninterrupted run pushes: the job's verified result, complete.
    pushed = xcom_values(dag_id, "train", run_id)
    result = pushed["return_value"]
    assert {"checkpoint_uri", "metrics", "submission_id", "dashboard_url", "storage_uri", "world_size"} <= set(result)
    assert result["submission_id"] == job
    assert result["world_size"] == 2
    assert result["attempt"] == 1
    assert result["metrics"]["run"] == run_id
    assert pushed["checkpoint_uri"] == result["checkpoint_uri"]
    assert "/attempt-1/" in result["checkpoint_uri"]
    assert pushed["submission_id"] == job

    again = tasks_test(dag_id, "train", run_id)
    assert again.returncode == 0, again.stdout[-4000:] + again.stderr[-4000:]
    assert jobs_for(ray_hook, dag_id, run_id) == [job, job[:-1] + "2"]


def test_taskflow_sweep_returns_its_values_picks_the_best_and_scores_it(
    airflow_db, ray_cluster, ray_hook, tmp_path, capfd
):
    """Two learning rates of the sweep (the DAG's param; three by default) show the mapping."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    rates = [0.02, 0.3]
    run = dag_test(
        "horovod_taskflow", DAGS / "horovod_taskflow.py", conf={"storage_path": str(tmp_path), "learning_rates": rates}
    )
    captured = capfd.readouterr()
    assert run.state == "success", (captured.out + captured.err)[-6000:]
    with create_session() as session:
        run_id = (
            session.query(XComModel.run_id)
            .filter(XComModel.dag_id == "horovod_taskflow")
            .order_by(XComModel.timestamp.desc())
            .first()[0]
        )
        rows = (
            session.query(XComModel.task_id, XComModel.map_index, XComModel.value)
            .filter(XComModel.dag_id == "horovod_taskflow", XComModel.run_id == run_id, XComModel.key == "return_value")
            .all()
        )
    results = {index: value for task_id, index, value in rows if task_id == "train"}
    # One Ray job per mapped training, each once, each in a folder of its own, each returning its value.
    assert sorted(results) == [0, 1]
    assert [results[i]["return_value"]["learning_rate"] for i in range(2)] == rates
    assert len({r["storage_uri"] for r in results.values()}) == 2
    assert all(r["storage_uri"].endswith(f"/map-{i}") and r["attempt"] == 1 for i, r in results.items())
    jobs = [
        j
        for j in ray_hook.list_jobs()
        if j.get("metadata", {}).get("airflow_dag_id") == "horovod_taskflow"
        and j["metadata"].get("airflow_run_id") == run_id
    ]
    assert sorted(j["metadata"]["airflow_map_index"] for j in jobs if j["metadata"]["airflow_task_id"] == "train") == [
        "0",
        "1",
    ]
    # The best by the returned loss, scored on the cluster from its checkpoint.
    best = min(results.values(), key=lambda r: r["return_value"]["loss"])
    picked = next(value for task_id, _, value in rows if task_id == "pick_best")
    scored = next(value for task_id, _, value in rows if task_id == "evaluate")
    assert picked["submission_id"] == best["submission_id"]
    assert scored["checkpoint_uri"] == best["checkpoint_uri"]
    assert scored["error"] < 0.05
    # Horovod's timeline of rank 0, stored beside each training's checkpoints, and not left on the node (this
    # cluster's node is this machine).
    for result in results.values():
        assert result["timeline_uri"].startswith(result["storage_uri"])
        assert any(event.get("ph") for event in timeline_events(Path(result["timeline_uri"])))
        assert not Path(f"/tmp/ahp-horovod-timeline-{result['submission_id']}.json").exists()


def timeline_events(path: Path) -> list[dict]:
    """Horovod's timeline: Chrome-tracing JSON, an array Horovod may leave open at its end."""
    text = path.read_text().rstrip().rstrip(",")
    return json.loads(text if text.endswith("]") else text + "]")


def test_sensor_example_end_to_end(airflow_db, ray_cluster, ray_hook, moto_server, capfd):
    """Its training checkpoints to S3 (moto), and its evaluation job loads the model from there."""
    bucket = moto_server.make_bucket(f"ahp-sensor-{uuid.uuid4().hex[:8]}")
    before = {j["submission_id"] for j in ray_hook.list_jobs()}
    run = dag_test(
        "horovod_sensor_example", DAGS / "horovod_sensor_example.py", conf={"storage_path": f"s3://{bucket}/runs"}
    )
    captured = capfd.readouterr()
    output = captured.out + captured.err
    assert run.state == "success", output[-6000:]
    # The job's own log (streamed by the trigger) and the evaluation job both name the checkpoint.
    checkpoints = set(re.findall(r"checkpoint: (\S+)", output))
    assert len(checkpoints) == 1, checkpoints
    (checkpoint,) = checkpoints
    assert checkpoint.startswith(f"s3://{bucket}/runs/")
    assert "/attempt-1/" in checkpoint
    keys = [o["Key"] for o in moto_server.client().list_objects_v2(Bucket=bucket)["Contents"]]
    assert checkpoint.split(f"s3://{bucket}/", 1)[1] + "/model.pt" in keys
    assert any(k.endswith("result.json") for k in keys), keys
    assert float(output.split("holdout MSE: ", 1)[1].split()[0]) < 0.05
    # One training job; the sensor waited on it, deferred, rather than submitting anything.
    new = [j for j in ray_hook.list_jobs() if j["submission_id"] not in before]
    trainings = [j for j in new if j["metadata"]["airflow_task_id"] == "train"]
    assert [j["status"] for j in trainings] == ["SUCCEEDED"]
    assert trainings[0]["metadata"]["airflow_dag_id"] == "horovod_sensor_example"
    assert {j["metadata"]["airflow_task_id"] for j in new} == {"train", "evaluate"}
