"""OpenLineage (the [openlineage] extra): URIs as OpenLineage datasets by the naming spec, the
operators' facets on start, complete and failure (after a deferral, from the resumed instance), the
parent run the job gets, and nothing of OpenLineage imported without the extra. The provider's
listener itself runs in tests/integration/test_lineage.py."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("airflow.providers.openlineage")

from airflow.sdk import Asset  # noqa: E402
from openlineage.client.serde import Serde  # noqa: E402

from airflow_provider_horovod import lineage  # noqa: E402
from airflow_provider_horovod.contract import VERSION  # noqa: E402
from airflow_provider_horovod.jobs.events import JobEvent  # noqa: E402
from airflow_provider_horovod.operators.base import with_parent_run  # noqa: E402
from airflow_provider_horovod.operators.horovod import HorovodTrainOperator  # noqa: E402
from airflow_provider_horovod.operators.ray import RayTaskOperator  # noqa: E402
from unit.fakes import FakeRay, context  # noqa: E402
from unit.operators.training_cluster import TASK_RUN, runs_until_told, train_op, write_result  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
SCHEMA = REPO / "docs" / "openlineage" / "HorovodRunFacet.json"


@pytest.mark.parametrize(
    "uri, namespace, name",
    [
        ("s3://bucket/data/train.parquet", "s3://bucket", "data/train.parquet"),
        ("s3://bucket/data/train/", "s3://bucket", "data/train"),  # a folder is one dataset, slash or not
        ("gs://bucket/a/b.csv", "gs://bucket", "a/b.csv"),
        ("file:///data/train.parquet", "file", "/data/train.parquet"),
        ("/data/../data/train.parquet", "file", "/data/train.parquet"),
        ("hdfs://namenode:8020/data/x", "hdfs://namenode:8020", "/data/x"),
    ],
)
def test_uris_become_datasets_by_the_naming_spec(uri, namespace, name):
    made = lineage.dataset(uri)
    assert (made.namespace, made.name) == (namespace, name)


@pytest.mark.parametrize("value", ["relative/path", "", None, "pkg.module:make_dataset", lambda: None, "s3:///key"])
def test_what_is_no_uri_is_no_dataset(value):
    assert lineage.dataset(value) is None


def test_datasets_are_listed_once_in_order():
    found = lineage.datasets(["s3://b/x/", "s3://b/x", "/tmp/y", None])
    assert [(d.namespace, d.name) for d in found] == [("s3://b", "x"), ("file", "/tmp/y")]


CHAMPION = Asset(name="champion", uri="s3://models/champion.json")


def training(**kwargs) -> HorovodTrainOperator:
    kwargs = {
        "train_fn": "pkg.train:fit",
        "datasets": {"train": "s3://data/train/", "holdout": "/d/holdout.parquet", "built": "pkg.data:build"},
        "train_loop_config": {"lr": 0.1},
        "num_workers": 3,
        "outlets": [CHAMPION, Asset(name="named_only")],
        **kwargs,
    }
    return HorovodTrainOperator(task_id="train", **kwargs)


def pairs(found) -> list[tuple[str, str]]:
    return [(d.namespace, d.name) for d in found]


def test_on_start_a_training_names_what_it_reads_and_how_it_trains():
    start = training().get_openlineage_facets_on_start()
    assert pairs(start.inputs) == [("s3://data", "train"), ("file", "/d/holdout.parquet")]
    assert pairs(start.outputs) == [("s3://models", "champion.json")]  # the declared outlet; no checkpoint yet
    facet = start.run_facets["horovod"]
    # The job chooses the trainer API on the cluster (the default "auto"); the completed run's facet names it.
    assert (facet.jobKind, facet.worldSize, facet.trainer, facet.trainFunction) == ("train", 3, "auto", "pkg.train:fit")
    assert facet.hyperparameters == {"lr": 0.1}
    assert facet.metrics is None


def test_inlets_are_inputs_too():
    start = training(
        datasets=None, inlets=[Asset(name="base", uri="s3://models/base/")]
    ).get_openlineage_facets_on_start()
    assert pairs(start.inputs) == [("s3://models", "base")]


def test_after_a_deferral_the_resumed_instance_reports_the_checkpoint_and_the_run(serve, tmp_path):
    from airflow.providers.common.compat.sdk import TaskDeferred

    ray = FakeRay(on_submit=runs_until_told())
    serve(ray)
    first = train_op(
        tmp_path, deferrable=True, datasets={"train": "s3://data/train.parquet"}, train_loop_config={"lr": 0.5}
    )
    first.sync_wait_before_defer_s = 0
    ctx = context()
    with pytest.raises(TaskDeferred):
        first.execute(ctx)
    sid = TASK_RUN.submission_id(1)
    write_result(ray.submitted[0])
    event = JobEvent.from_info(sid, {"status": "SUCCEEDED", "metadata": ray.submitted[0]["metadata"]})
    # Airflow resumes a new instance; nothing set on the first one before it deferred reaches it.
    resumed = train_op(
        tmp_path, deferrable=True, datasets={"train": "s3://data/train.parquet"}, train_loop_config={"lr": 0.5}
    )
    result = resumed.execute_complete(ctx, json.loads(json.dumps(event.to_dict())))
    complete = resumed.get_openlineage_facets_on_complete(None)
    assert pairs(complete.inputs) == [("s3://data", "train.parquet")]
    assert pairs(complete.outputs) == [("file", result["checkpoint_uri"])]
    facet = complete.run_facets["horovod"]
    assert (facet.submissionId, facet.attempts, facet.failedAttempts, facet.worldSize) == (sid, 1, [], 2)
    assert facet.metrics == {"loss": 0.1}
    assert facet.hyperparameters == {"lr": 0.5}
    assert facet.dashboardUrl == result["dashboard_url"]


def test_the_facet_carries_the_cost_and_matches_its_schema():
    import jsonschema

    op = training()
    op.job_result = {
        "checkpoint_uri": "s3://ckpt/run/checkpoint_000002",
        "best_checkpoint_uri": "s3://ckpt/run/c1",
        "metrics": {"loss": 0.2},
        "attempt": 2,
        "world_size": 3,
        "trainer_api": "legacy",
        "attempts": [{"attempt": 1, "failure_class": "infrastructure", "summary": "node lost"}],
        "submission_id": "sid-a2",
        "cost": {"total": {"worker_s": 12.5}},
    }
    complete = op.get_openlineage_facets_on_complete(None)
    assert pairs(complete.outputs) == [
        ("s3://ckpt", "run/checkpoint_000002"),
        ("s3://ckpt", "run/c1"),
        ("s3://models", "champion.json"),
    ]
    document = json.loads(Serde.to_json(complete.run_facets["horovod"]))
    assert document["_schemaURL"] == lineage.SCHEMA_URL
    assert document["_producer"] == f"airflow-provider-horovod/{VERSION}"
    assert document["cost"] == {"total": {"worker_s": 12.5}}
    assert document["trainer"] == "legacy"
    assert document["attempts"] == 2
    assert document["failedAttempts"][0]["failure_class"] == "infrastructure"
    schema = json.loads(SCHEMA.read_text())
    jsonschema.validate(document, schema["$defs"]["HorovodRunFacet"]["allOf"][1])
    assert lineage.SCHEMA_URL.endswith(SCHEMA.relative_to(REPO).as_posix())


def test_a_smoke_runs_facet_says_so_and_matches_the_schema():
    import jsonschema

    op = training()
    op.job_result = {"checkpoint_uri": "s3://ckpt/run/checkpoint_000000", "submission_id": "sid-a1", "smoke_run": True}
    document = json.loads(Serde.to_json(op.get_openlineage_facets_on_complete(None).run_facets["horovod"]))
    assert document["smokeRun"] is True
    jsonschema.validate(document, json.loads(SCHEMA.read_text())["$defs"]["HorovodRunFacet"]["allOf"][1])


def test_on_failure_the_training_names_its_job_and_no_checkpoint():
    op = training()
    op.submission_id = "sid-a1"
    failed = op.get_openlineage_facets_on_failure(None)
    assert pairs(failed.outputs) == [("s3://models", "champion.json")]
    assert failed.run_facets["horovod"].submissionId == "sid-a1"


def test_a_taskflow_training_reports_its_keyword_arguments_as_hyperparameters():
    from airflow.sdk import dag, task
    from pendulum import datetime

    @dag(start_date=datetime(2026, 1, 1), schedule=None)
    def flow():
        @task.horovod(storage_path="/tmp/x")
        def fit(lr: float, epochs: int) -> None: ...

        @task.horovod(storage_path="/tmp/x")
        def fit_config(config: dict) -> None: ...

        fit(lr=0.1, epochs=2)
        fit_config({"lr": 0.2})

    built = flow()
    for task_id, config in (("fit", {"lr": 0.1, "epochs": 2}), ("fit_config", {"lr": 0.2})):
        assert built.get_task(task_id).get_openlineage_facets_on_start().run_facets["horovod"].hyperparameters == config


def test_a_ray_task_reports_its_inlets_outlets_and_run():
    op = RayTaskOperator(
        task_id="promote",
        python_callable="pkg.jobs:promote",
        outlets=[CHAMPION],
        inlets=[Asset(name="d", uri="file:///data/holdout.parquet")],
    )
    op.job_result = {"return_value": 1, "submission_id": "sid-t", "attempt": 1, "dashboard_url": "http://ray/#/jobs/x"}
    complete = op.get_openlineage_facets_on_complete(None)
    assert pairs(complete.inputs) == [("file", "/data/holdout.parquet")]
    assert pairs(complete.outputs) == [("s3://models", "champion.json")]
    facet = complete.run_facets["horovod"]
    assert (facet.jobKind, facet.submissionId, facet.attempts, facet.trainFunction, facet.worldSize) == (
        "task",
        "sid-t",
        1,
        "pkg.jobs:promote",
        None,
    )


def test_the_job_gets_the_tasks_openlineage_run_when_openlineage_is_on(monkeypatch):
    from airflow.providers.openlineage import conf

    from airflow_provider_horovod.operators.ray import RayTaskOperator

    op = RayTaskOperator(task_id="t", python_callable="json:dumps", op_args=[1], storage_path="/tmp/x")
    plan = op.checked_plan(TASK_RUN, op.wait_policy())
    assert conf.is_disabled()  # no transport in the tests' environment
    assert with_parent_run(plan, context()) is plan
    monkeypatch.setattr(conf, "is_disabled", lambda: False)
    monkeypatch.setattr(lineage, "parent_run_env", lambda ti: {lineage.PARENT_ID_ENV: "ns/dag.task/run-id"})
    env = with_parent_run(plan, context()).request(1).runtime_env["env_vars"]
    assert env[lineage.PARENT_ID_ENV] == "ns/dag.task/run-id"

    def broken(ti):
        raise RuntimeError("no dag run")

    monkeypatch.setattr(lineage, "parent_run_env", broken)
    assert with_parent_run(plan, context()) is plan  # lineage never fails a training


# The environment without the extra: the oldest supported Airflow's, as `make setup-test` builds it.
WITHOUT_EXTRA = REPO / ".venv-airflow-oldest" / "bin" / "python"
CHECK_IMPORTS = """
import sys
import pendulum
from airflow.sdk import dag, task
from airflow_provider_horovod.operators.horovod import HorovodTrainOperator
from airflow_provider_horovod.operators.base import with_parent_run
from airflow_provider_horovod.operators.ray import RayTaskOperator
from airflow_provider_horovod.contract import TaskRun
import airflow_provider_horovod.decorators.ray, airflow_provider_horovod.decorators.horovod

@dag(schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"))
def d():
    HorovodTrainOperator(task_id="train", train_fn="a.b:c", datasets={"train": "s3://b/k"})
    task.ray(task_id="work")(lambda: 1)()
d()
op = RayTaskOperator(task_id="t", python_callable="json:dumps", storage_path="/tmp/x")
plan = op.checked_plan(TaskRun("d", "t", "r"), op.wait_policy())
assert with_parent_run(plan, {"ti": None}) is plan
print(sorted(m for m in sys.modules if m.startswith("openlineage") or m.startswith("airflow.providers.openlineage")))
"""


@pytest.mark.parametrize("extra", ["absent", "installed"])
def test_a_dag_of_the_providers_operators_imports_nothing_of_openlineage(extra):
    python = sys.executable
    if extra == "absent":
        python = str(WITHOUT_EXTRA)
        probe = [python, "-c", "import importlib.util as u; print(u.find_spec('airflow.providers.openlineage'))"]
        if not WITHOUT_EXTRA.exists() or subprocess.run(probe, capture_output=True, text=True).stdout.strip() != "None":
            pytest.skip(f"{WITHOUT_EXTRA} (an Airflow environment without the extra) is not there")
    # The checkout's package, whatever version of it the environment has installed.
    run = subprocess.run(
        [python, "-c", CHECK_IMPORTS],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    imported = ast.literal_eval(run.stdout.strip().splitlines()[-1])
    # Installed but off: the check for OpenLineage being on reads its configuration module (and
    # Airflow may read every provider's info), nothing more.
    allowed = (
        set()
        if extra == "absent"
        else {f"airflow.providers.openlineage{m}" for m in ("", ".conf", ".get_provider_info")}
    )
    assert set(imported) <= allowed, imported
