"""OpenLineage, as a platform's lineage backend sees it: the Airflow OpenLineage provider's own
listener, a file transport, `airflow dags test` of a DAG with a small real training (deferred) and two
``@task.ray`` jobs (one deferred, one not). The events are read back: inputs, outputs, the provider's
run facet, and the parent run that the Ray jobs saw in their environment."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.airflow_cli import dags_test

pytestmark = pytest.mark.integration

DAGS = Path(__file__).resolve().parents[1] / "dags_lineage"
DAG_ID = "ahp_lineage"
NAMESPACE = "ahp-lineage-test"


@pytest.fixture(scope="module")
def lineage_run(airflow_db, ray_cluster, moto_server, tmp_path_factory):
    """One run of the DAG with the listener writing every event to a file; the events, by task."""
    folder = tmp_path_factory.mktemp("lineage")
    bucket = moto_server.make_bucket("ahp-lineage")
    events_file = folder / "events.jsonl"
    env = {
        "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps(
            {"type": "file", "log_file_path": str(events_file), "append": True}
        ),
        "AIRFLOW__OPENLINEAGE__NAMESPACE": NAMESPACE,
        "AHP_LINEAGE_STORAGE": str(folder / "storage"),
        "AHP_LINEAGE_DATA": f"s3://{bucket}/data",
    }
    run = dags_test(DAG_ID, dags_folder=DAGS, env=env)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-6000:]
    events = [json.loads(line) for line in events_file.read_text().splitlines() if line.strip()]
    by_task: dict[str, list[dict]] = {}
    for event in events:
        by_task.setdefault(event["job"]["name"], []).append(event)
    return {"events": by_task, "output": output, "storage": folder / "storage", "bucket": bucket}


def final(events: list[dict]) -> dict:
    (complete,) = [e for e in events if e["eventType"] == "COMPLETE"]
    return complete


def without_none(value):
    if isinstance(value, dict):
        return {k: without_none(v) for k, v in value.items() if v is not None}
    return [without_none(v) for v in value] if isinstance(value, list) else value


def parent_id(event: dict) -> str:
    return f"{event['job']['namespace']}/{event['job']['name']}/{event['run']['runId']}"


def returned(task_id: str) -> dict:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        (value,) = (
            session.query(XComModel.value)
            .filter(XComModel.dag_id == DAG_ID, XComModel.task_id == task_id, XComModel.key == "return_value")
            .order_by(XComModel.run_id.desc())
            .limit(1)
            .one()
        )
    return value if isinstance(value, dict) else json.loads(value)


def test_a_training_reports_its_data_its_checkpoint_and_its_run_after_a_deferral(lineage_run, ray_hook):
    events = lineage_run["events"][f"{DAG_ID}.train"]
    complete = final(events)
    result = returned("train")
    # The task deferred: a start, the triggerer's wait, a start of the resumed operator, which the
    # listener saw complete.
    assert [e["eventType"] for e in events] == ["START", "START", "COMPLETE"]
    data = [(f"s3://{lineage_run['bucket']}", "data/train.parquet")]  # the naming spec's bucket and key
    assert [(d["namespace"], d["name"]) for d in complete["inputs"]] == data
    assert [(d["namespace"], d["name"]) for d in complete["outputs"]] == [("file", result["checkpoint_uri"])]
    facet = complete["run"]["facets"]["horovod"]
    assert facet["_schemaURL"].endswith("/HorovodRunFacet.json")
    assert facet["jobKind"] == "train"
    assert facet["worldSize"] == 2
    assert facet["trainer"] == "v2"
    assert facet["hyperparameters"] == {"num_epochs": 1, "lr": 0.01, "batch_size": 64}
    assert facet["metrics"] == result["metrics"]
    assert "train_mse" in facet["metrics"]
    assert facet["attempts"] == 1
    assert facet["failedAttempts"] == []
    assert facet["submissionId"] == result["submission_id"]
    # Deferred too, the cost comes from Ray's own times (the trigger's event carries them).
    (spent,) = result["cost"]["attempts"]
    assert not spent["failed"]
    assert 0 < spent["queued_s"] < spent["wall_s"]
    assert spent["worker_s"] > 0
    assert facet["cost"] == without_none(result["cost"])  # the events leave out what is None
    assert result["dashboard_url"].endswith("/#/jobs/" + result["submission_id"])
    # The start event already names the data read, before the job runs.
    start = [e for e in events if e["eventType"] == "START"][0]
    assert [(d["namespace"], d["name"]) for d in start["inputs"]] == data
    # The training job carries the task's run as its parent.
    (job,) = [j for j in ray_hook.list_jobs() if j["submission_id"] == result["submission_id"]]
    env = job["runtime_env"]["env_vars"]
    assert env["OPENLINEAGE_PARENT_ID"] == parent_id(complete)


def test_ray_tasks_report_their_run_and_pass_the_parent_run_into_the_job(lineage_run):
    prepare = final(lineage_run["events"][f"{DAG_ID}.prepare"])
    promote = final(lineage_run["events"][f"{DAG_ID}.promote"])
    # The first ran in the worker; the second deferred (a second start, when it resumed).
    assert [e["eventType"] for e in lineage_run["events"][f"{DAG_ID}.prepare"]] == ["START", "COMPLETE"]
    assert [e["eventType"] for e in lineage_run["events"][f"{DAG_ID}.promote"]] == ["START", "START", "COMPLETE"]
    for event, task_id in ((prepare, "prepare"), (promote, "promote")):
        facet = event["run"]["facets"]["horovod"]
        assert facet["jobKind"] == "task"
        assert facet["attempts"] == 1
        assert facet["submissionId"]
        assert facet["trainFunction"].endswith(f":ahp_lineage.<locals>.{task_id}")
        seen = returned(task_id)["env"]
        # What the job saw is the task's own OpenLineage run, and the DAG run as the root.
        assert seen["OPENLINEAGE_PARENT_ID"] == parent_id(event)
        root = event["run"]["facets"]["parent"]["root"]
        assert (
            seen["OPENLINEAGE_ROOT_PARENT_ID"] == f"{root['job']['namespace']}/{root['job']['name']}/"
            f"{root['run']['runId']}"
        )
    # The promoting task's outlet, the champion, is its output (deferred: the resumed instance's).
    storage = lineage_run["storage"]
    assert [(d["namespace"], d["name"]) for d in promote["outputs"]] == [("file", f"{storage}/champion.json")]
    assert prepare["outputs"] == []
    assert prepare["inputs"] == []
