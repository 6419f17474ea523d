"""What the provider pushes to XCom by key, besides the return value."""

from airflow_provider_horovod.contract import XCOM_CHECKPOINT_URI, XCOM_COST
from airflow_provider_horovod.xcoms import push_result
from unit.fakes import FakeTI

COST = {"wall_s": 5.0}


def test_a_trainings_checkpoint_uri_and_cost_have_their_own_keys():
    ti = FakeTI()
    push_result(ti, {"checkpoint_uri": "s3://b/c", "metrics": {}, "cost": COST})
    assert ti.xcoms == {XCOM_CHECKPOINT_URI: "s3://b/c", XCOM_COST: COST}


def test_a_tasks_cost_has_its_own_key():
    ti = FakeTI()
    push_result(ti, {"return_value": 3, "cost": COST})
    assert ti.xcoms == {XCOM_COST: COST}


def test_a_result_without_either_pushes_nothing():
    ti = FakeTI()
    push_result(ti, {"submission_id": "x", "status": "SUCCEEDED", "checkpoint_uri": None})
    assert ti.xcoms == {}
