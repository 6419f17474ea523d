"""Smoke runs on the Airflow side: the switch decided once (the task's ``smoke_run``, else ``[horovod]
smoke_run``), a plan turned into its smoke form, and scaled to what the cluster has at submission, said
in the task log; everything else of the plan as it was."""

import dataclasses
import json

import pytest

from airflow_provider_horovod import smoke_plan
from airflow_provider_horovod.contract import META_SMOKE_RUN, SMOKE_ROWS, SMOKE_RUN_ENV, SPEC_FILE, TaskRun
from airflow_provider_horovod.documents import TaskSpec, TrainingSpec
from airflow_provider_horovod.exceptions import InvalidParameterError, RayJobPendingTimeoutError
from airflow_provider_horovod.jobs.submit import start
from airflow_provider_horovod.jobs.wait import WaitPolicy
from airflow_provider_horovod.operators.horovod import HorovodTrainOperator
from airflow_provider_horovod.operators.ray import RayTaskOperator
from airflow_provider_horovod.plan import task_plan
from airflow_provider_horovod.smoke_plan import for_cluster
from airflow_provider_horovod.storage import Storage
from unit.fakes import FakeRay
from unit.jobs.test_submit import make_plan

RUN = TaskRun("dag", "train", "manual__1")
# A production training: 8 GPU workers of 8 CPUs each.
PRODUCTION = {"num_workers": 8, "use_gpu": True, "resources_per_worker": {"CPU": 8, "GPU": 1}}
EMBEDDED = {"CPU": 2.0, "memory": 4e9, "object_store_memory": 1e9}


def training(tmp_path, **kwargs):
    return make_plan(tmp_path, **{**PRODUCTION, **kwargs})


def spec_sent(call) -> TrainingSpec:
    return TrainingSpec.from_json(call["payload"][SPEC_FILE].decode())


# --- the switch ----------------------------------------------------------------------------------


def test_off_unless_asked(monkeypatch):
    monkeypatch.delenv("AIRFLOW__HOROVOD__SMOKE_RUN", raising=False)
    assert smoke_plan.enabled(None) is False


def test_the_configuration_turns_it_on_and_the_task_overrides_it(monkeypatch):
    monkeypatch.setenv("AIRFLOW__HOROVOD__SMOKE_RUN", "True")
    assert smoke_plan.enabled(None) is True
    assert smoke_plan.enabled(False) is False
    monkeypatch.setenv("AIRFLOW__HOROVOD__SMOKE_RUN", "False")
    assert smoke_plan.enabled(True) is True


def test_a_smoke_run_that_is_not_a_bool_is_refused():
    with pytest.raises(InvalidParameterError) as err:
        smoke_plan.enabled("yes")
    assert "smoke_run" in str(err.value)
    assert "'yes'" in str(err.value)
    assert "True or False" in str(err.value)


def test_rows_from_the_task_else_the_configuration_else_the_default(monkeypatch):
    monkeypatch.delenv("AIRFLOW__HOROVOD__SMOKE_ROWS", raising=False)
    assert smoke_plan.rows(None) == SMOKE_ROWS
    monkeypatch.setenv("AIRFLOW__HOROVOD__SMOKE_ROWS", "16")
    assert smoke_plan.rows(None) == 16
    assert smoke_plan.rows(5) == 5
    with pytest.raises(InvalidParameterError, match="smoke_rows"):
        smoke_plan.rows(0)


# --- the plan in its smoke form ------------------------------------------------------------------


def test_a_training_is_marked_its_datasets_cut_and_read_first(tmp_path):
    plan = training(tmp_path, materialize_datasets=False)
    marked = smoke_plan.as_smoke(plan, 10)
    assert marked.spec.smoke_run is True
    assert marked.spec.smoke_rows == 10
    assert marked.spec.materialize_datasets is True
    assert marked.env_vars == {**plan.env_vars, SMOKE_RUN_ENV: "1"}
    # Nothing else changes before the cluster is known: it is scaled at submission.
    assert dataclasses.replace(marked.spec, smoke_run=False, smoke_rows=None, materialize_datasets=False) == plan.spec
    request = marked.request(1)
    assert request.metadata[META_SMOKE_RUN] == "true"
    assert request.runtime_env["env_vars"][SMOKE_RUN_ENV] == "1"
    assert TrainingSpec.from_json(request.files[SPEC_FILE].decode()).smoke_run is True
    assert META_SMOKE_RUN not in plan.request(1).metadata


def test_a_training_is_scaled_to_the_cluster_and_says_how(tmp_path):
    plan = smoke_plan.as_smoke(training(tmp_path), 64)
    fitted, said = smoke_plan.fit_to_cluster(plan, EMBEDDED)
    spec = fitted.spec
    assert (spec.num_workers, spec.use_gpu, spec.resources_per_worker) == (2, False, {"CPU": 1.0})
    assert fitted.resources == {"CPU": 2.0}
    assert fitted.worker_resources == {"CPU": 1.0}
    assert '8 GPU worker(s) of {"CPU": 8.0, "GPU": 1.0} -> 2 CPU worker(s) of {"CPU": 1.0}' in said
    assert 'the cluster has {"CPU": 2.0}' in said
    assert "first 64 rows" in said
    assert SMOKE_RUN_ENV in said
    # The rest of the training is the production one.
    assert spec.train_fn == plan.spec.train_fn
    assert spec.horovod_env == plan.spec.horovod_env
    assert spec.storage_uri == plan.spec.storage_uri
    assert fitted.env_vars == plan.env_vars


@pytest.mark.parametrize(
    "num_workers, cpus, expected",
    [(8, 1.0, 1), (8, 16.0, smoke_plan.SMOKE_MAX_WORKERS), (1, 2.0, 1), ([2, 8], 2.0, 2), (4, 0.0, 1)],
)
def test_the_worker_count_fits_the_cluster(tmp_path, num_workers, cpus, expected):
    plan = smoke_plan.as_smoke(training(tmp_path, num_workers=num_workers, trainer_api="v2"))
    assert smoke_plan.fit_to_cluster(plan, {"CPU": cpus})[0].spec.num_workers == expected


def test_a_task_runs_as_it_is_on_cpu(tmp_path):
    plan = task_plan(
        RUN,
        {
            "python_callable": "json:dumps",
            "op_args": [1],
            "op_kwargs": {},
            "num_cpus": 4,
            "num_gpus": 1,
            "memory": None,
            "resources": {"GPU": 1, "special": 1},
            "runtime_env": {"py_modules": ["gcs://_ray_pkg_user.zip"]},
            "storage_path": str(tmp_path),
            "ray_conn_id": "ray_remote",
            "job_tags": None,
            "prices": None,
        },
    )
    marked = smoke_plan.as_smoke(plan)
    assert isinstance(marked.spec, TaskSpec)
    assert marked.spec.smoke_run is True
    assert marked.spec.args == [1]
    assert marked.env_vars[SMOKE_RUN_ENV] == "1"
    fitted, said = smoke_plan.fit_to_cluster(marked, EMBEDDED)
    assert fitted.driver_resources["num_gpus"] is None
    assert fitted.driver_resources["num_cpus"] == 2.0
    assert fitted.driver_resources["resources"] == {"special": 1.0}
    assert fitted.worker_resources == {"CPU": 2.0}
    assert '"num_gpus": 1' in said
    assert "->" in said


# --- before submission: scaled to what the cluster has, the same checks after -------------------


def test_a_production_training_is_submitted_scaled_and_said(tmp_path):
    ray = FakeRay(cluster=EMBEDDED)
    with pytest.raises(RayJobPendingTimeoutError, match="none of \\['GPU'\\]"):
        start(ray, training(tmp_path), Storage())  # the real run: no GPU here
    plan, said = for_cluster(smoke_plan.as_smoke(training(tmp_path), 32), prices=None, cluster=EMBEDDED)
    start(ray, plan, Storage())
    (call,) = ray.submitted
    spec = spec_sent(call)
    assert (spec.num_workers, spec.use_gpu, spec.smoke_rows) == (2, False, 32)
    assert json.loads(call["metadata"]["ahp_resources"]) == {"CPU": 2.0}
    assert call["runtime_env"]["env_vars"][SMOKE_RUN_ENV] == "1"
    (line,) = said
    assert line.startswith("Smoke run: 8 GPU worker(s)")


def test_the_connections_prices_complete_a_plan_that_has_none(tmp_path):
    mine = {"cpu_hour": 1.0, "currency": "EUR"}
    plan, said = for_cluster(training(tmp_path), prices={"cpu_hour": 0.5, "currency": "USD"}, cluster=None)
    assert plan.prices == {"cpu_hour": 0.5, "currency": "USD"}
    assert said == []
    given = dataclasses.replace(training(tmp_path), prices=mine)
    assert for_cluster(given, prices={"cpu_hour": 0.5}, cluster=None)[0].prices == mine


# --- the operators decide it once ----------------------------------------------------------------


def plan_of(op):
    return op.checked_plan(RUN, WaitPolicy(1.0, None, None))


def test_the_operators_follow_the_configuration_unless_told(tmp_path, monkeypatch):
    monkeypatch.setenv("AIRFLOW__HOROVOD__SMOKE_RUN", "True")
    train = {"task_id": "train", "train_fn": "json:dumps", "storage_path": str(tmp_path), **PRODUCTION}
    assert plan_of(HorovodTrainOperator(**train, smoke_rows=7)).spec.smoke_rows == 7
    assert plan_of(HorovodTrainOperator(**train, smoke_run=False)).spec.smoke_run is False
    task = RayTaskOperator(task_id="t", python_callable="json:dumps", num_gpus=1, storage_path=str(tmp_path))
    assert plan_of(task).spec.smoke_run is True
    monkeypatch.setenv("AIRFLOW__HOROVOD__SMOKE_RUN", "False")
    assert plan_of(HorovodTrainOperator(**train)).spec.smoke_run is False
    assert plan_of(HorovodTrainOperator(**train, smoke_run=True)).spec.smoke_run is True
