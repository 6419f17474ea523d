"""The "MLflow run" extra link: the operator that ran says (its result's run URL, or nothing, without
reading an XCom that was never pushed); the UI reads what Airflow pushed under the link's key."""

from types import SimpleNamespace

import pytest
from airflow.sdk.bases.xcom import BaseXCom

from airflow_provider_horovod.decorators.horovod import _HorovodDecoratedOperator
from airflow_provider_horovod.links.mlflow import MlflowRunLink
from airflow_provider_horovod.links.ray import RayJobLink
from airflow_provider_horovod.operators.horovod import HorovodTrainOperator
from unit.fakes import FakeTI

URL = "http://mlflow:5000/#/experiments/3/runs/0123abcd"


def operator(**kwargs) -> HorovodTrainOperator:
    return HorovodTrainOperator(task_id="train", train_fn="json:dumps", **kwargs)


@pytest.fixture
def no_xcom(monkeypatch):
    def get_value(**kwargs):
        raise AssertionError("the link read an XCom that was never pushed")

    monkeypatch.setattr(BaseXCom, "get_value", staticmethod(get_value))


def test_training_operators_and_the_decorator_carry_it_beside_the_ray_job_link():
    for cls in (HorovodTrainOperator, _HorovodDecoratedOperator):
        assert [type(link) for link in cls.operator_extra_links] == [RayJobLink, MlflowRunLink]
    assert MlflowRunLink.name == "MLflow run"


def test_a_task_without_tracking_or_before_its_result_has_an_empty_link(no_xcom):
    assert MlflowRunLink().get_link(operator(), ti_key=None) == ""
    assert MlflowRunLink().get_link(operator(mlflow_tracking_uri="http://mlflow:5000"), ti_key=None) == ""


def test_the_operator_that_ran_gives_its_runs_url(no_xcom):
    op = operator(mlflow_tracking_uri="http://mlflow:5000")
    ti = FakeTI()
    result = {
        "checkpoint_uri": "/c",
        "metrics": {},
        "cost": None,
        "mlflow": {"run_id": "0123abcd", "experiment_id": "3", "run_url": URL},
    }
    op.task_result({"ti": ti}, result)
    assert MlflowRunLink().get_link(op, ti_key=None) == URL


def test_the_ui_reads_what_was_pushed_under_the_links_key(monkeypatch):
    asked = []
    ti_key = SimpleNamespace(dag_id="dag", task_id="train", run_id="r", map_index=-1, try_number=1)

    def get_value(*, ti_key, key):
        asked.append(key)
        return URL if key == MlflowRunLink().xcom_key else None

    monkeypatch.setattr(BaseXCom, "get_value", staticmethod(get_value))
    serialized = SimpleNamespace()  # the api-server's operator: no attributes of a run
    assert MlflowRunLink().get_link(serialized, ti_key=ti_key) == URL
    assert asked == [MlflowRunLink().xcom_key]
    monkeypatch.setattr(BaseXCom, "get_value", staticmethod(lambda *, ti_key, key: None))
    assert MlflowRunLink().get_link(serialized, ti_key=ti_key) == ""
