"""The example DAGs users copy, run as users run them: `airflow dags test` and `airflow tasks test`."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from airflow_provider_horovod.training import submission_base_id

from .airflow_cli import airflow_bin, dags_test, tagged_json

pytestmark = pytest.mark.integration

DAGS = Path(__file__).resolve().parents[2] / "dags"
DAG_ID = "horovod_retraining"


def test_every_dag_file_imports_without_the_training_stack():
    code = (
        "import sys\n"
        "from airflow.dag_processing.dagbag import DagBag\n"
        f"bag = DagBag(dag_folder={str(DAGS)!r})\n"
        "heavy = [m for m in ('torch', 'horovod', 'ray.train', 'ray.data') if m in sys.modules]\n"
        "print('RESULT', sorted(bag.dag_ids), dict(bag.import_errors), heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT")]
    assert line, out.stderr[-3000:]
    assert "horovod_retraining" in line[0] and "{} []" in line[0], line[0]


@pytest.fixture
def retraining_env(tmp_path, monkeypatch, airflow_db, ray_cluster):
    monkeypatch.setenv("HOROVOD_RETRAINING_STORAGE", str(tmp_path))
    return tmp_path


def run_retraining(date: str, conf: dict | None = None) -> tuple[dict, str]:
    run = dags_test(DAG_ID, logical_date=date, dags_folder=DAGS, conf=conf)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    (summary,) = tagged_json(run.stdout, "AHP_RETRAINING")
    return summary, run.stdout


def champion(storage: Path) -> dict:
    return json.loads((storage / DAG_ID / "champion.json").read_text())


def champion_events(storage: Path) -> list[dict]:
    """The extras of the champion Asset events the retraining runs under ``storage`` emitted."""
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = (session.query(AssetEvent.extra).join(AssetModel, AssetModel.id == AssetEvent.asset_id)
                .filter(AssetModel.name == "horovod_retraining_champion").order_by(AssetEvent.id).all())
    return [extra for (extra,) in rows if str(extra.get("checkpoint_uri", "")).startswith(str(storage))]


def test_backfill_of_three_days(retraining_env, ray_hook):
    summaries = []
    for day in ("2026-11-01", "2026-11-02", "2026-11-03"):
        # The last day evaluates on the cluster, as a Ray job, instead of in the Airflow task.
        on_ray = day == "2026-11-03"
        summary, output = run_retraining(day, {"evaluate_on_ray": True} if on_ray else None)
        summaries.append(summary)
        eval_job = f"{summary['submission_id']}-eval-t1"
        assert ("Evaluating on Ray: " in output) == on_ray
        assert any(j["submission_id"] == eval_job and j["status"] == "SUCCEEDED"
                   for j in ray_hook.list_jobs()) == on_ray
        best = min(s["holdout_mse"] for s in summaries)
        # The champion always holds the best model seen so far, and moved only on improvement.
        assert champion(retraining_env)["holdout_mse"] == best
    uris = [s["checkpoint_uri"] for s in summaries]
    assert len(set(uris)) == 3
    assert len({u.split("/attempt-")[0] for u in uris}) == 3  # distinct storage paths per run
    assert all(u.startswith(str(retraining_env)) for u in uris)
    assert summaries[0]["promoted"]  # the first model becomes champion
    for before, after in zip(summaries, summaries[1:]):
        assert after["promoted"] == (after["holdout_mse"] < min(
            s["holdout_mse"] for s in summaries[: summaries.index(after)]))
    # Trained models beat the untrained baseline clearly.
    assert all(s["holdout_mse"] < 0.2 * s["baseline_mse"] for s in summaries)
    # Downstream DAGs hear of each new champion, and of nothing else.
    assert [e["checkpoint_uri"] for e in champion_events(retraining_env)] == [
        s["checkpoint_uri"] for s in summaries if s["promoted"]]


def list_runs() -> list[dict]:
    out = subprocess.run([airflow_bin(), "dags", "list-runs", DAG_ID, "-o", "json"], capture_output=True,
                         text=True, timeout=120, check=True)
    # Airflow may log a warning before the JSON.
    return json.loads(next(line for line in out.stdout.splitlines() if line.startswith("[")))


def tasks_test(task_id: str, run_id: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS)}
    return subprocess.run([airflow_bin(), "tasks", "test", DAG_ID, task_id, run_id], capture_output=True,
                          text=True, timeout=600, env=env)


def jobs_for(hook, run_id: str) -> list[str]:
    base = submission_base_id(DAG_ID, "train", run_id)
    return sorted(j["submission_id"] for j in hook.list_jobs() if (j.get("submission_id") or "").startswith(base))


def xcoms(task_id: str, run_id: str) -> dict:
    """The XComs a task of the retraining DAG left in Airflow's database for a run."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = session.query(XComModel.key, XComModel.value).filter(
            XComModel.dag_id == DAG_ID, XComModel.task_id == task_id, XComModel.run_id == run_id).all()
    return dict(rows)


def test_rerun_after_a_crash_reattaches_and_clearing_trains_again(retraining_env, ray_hook):
    env = {**os.environ, "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS)}
    proc = subprocess.Popen([airflow_bin(), "dags", "test", DAG_ID, "2026-11-05"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        run_id = None
        while time.monotonic() < deadline and not (run_id and jobs_for(ray_hook, run_id)):
            time.sleep(1)
            runs = [r for r in list_runs() if r["logical_date"].startswith("2026-11-05")]
            run_id = runs[0]["run_id"] if runs else None
        assert run_id and jobs_for(ray_hook, run_id), "the training job was never submitted"
    finally:
        # The Airflow process dies hard mid-training; the Ray job goes on.
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)

    rerun = tasks_test("train", run_id)
    assert rerun.returncode == 0, rerun.stdout[-4000:] + rerun.stderr[-4000:]
    (job,) = jobs_for(ray_hook, run_id)  # re-attached: still one job for this task run
    output = rerun.stdout + rerun.stderr
    assert job.endswith("-a1") and "Re-attaching to Ray job" in output
    assert "/attempt-1/" in output.split("Checkpoint: ", 1)[1].splitlines()[0]  # the job's own result
    # The XCom is what an uninterrupted run pushes: the job's verified result, complete.
    pushed = xcoms("train", run_id)
    result = pushed["return_value"]
    assert {"checkpoint_uri", "metrics", "submission_id", "dashboard_url", "storage_uri", "world_size"} <= set(result)
    assert result["submission_id"] == job and result["world_size"] == 2 and result["attempt"] == 1
    assert pushed["checkpoint_uri"] == result["checkpoint_uri"] and "/attempt-1/" in result["checkpoint_uri"]
    assert pushed["submission_id"] == job

    # Now the task has succeeded; running it again is a user clearing it: a new attempt trains.
    again = tasks_test("train", run_id)
    assert again.returncode == 0, again.stdout[-4000:] + again.stderr[-4000:]
    assert jobs_for(ray_hook, run_id) == [job, job[:-1] + "2"]


def test_sensor_example_end_to_end(airflow_db, ray_cluster, ray_hook, tmp_path):
    before = {j["submission_id"] for j in ray_hook.list_jobs()}
    run = dags_test("horovod_sensor_example", dags_folder=DAGS, conf={"storage_path": str(tmp_path)})
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-6000:]
    # The job's own log (streamed by the trigger) and the evaluate task both name the checkpoint.
    checkpoints = set(re.findall(r"checkpoint: (\S+)", output))
    assert len(checkpoints) == 1, checkpoints
    (checkpoint,) = checkpoints
    assert checkpoint.startswith(str(tmp_path)) and "/attempt-1/" in checkpoint
    assert (Path(checkpoint) / "model.pt").is_file()
    assert float(output.split("holdout MSE: ", 1)[1].split()[0]) < 0.05
    # One training job; the sensor waited on it, deferred, rather than submitting anything.
    new = [j for j in ray_hook.list_jobs() if j["submission_id"] not in before]
    assert [j["status"] for j in new] == ["SUCCEEDED"]
    assert new[0]["metadata"]["airflow_dag_id"] == "horovod_sensor_example"
    assert new[0]["metadata"]["airflow_task_id"] == "train"
