"""The names the plugin shares with the operators and Airflow, each decided where it belongs."""

from __future__ import annotations

from airflow.sdk.bases.xcom import BaseXCom

from airflow_provider_horovod.attempts import read_attempt
from airflow_provider_horovod.contract import XCOM_JOB
from airflow_provider_horovod.decorators.horovod import _HorovodDecoratedOperator
from airflow_provider_horovod.operators.horovod import HorovodTrainOperator
from airflow_provider_horovod.plugins import data


def test_the_keys_and_kinds_are_airflows_and_the_contracts():
    assert data.RETURN_KEY == BaseXCom.XCOM_RETURN_KEY == "return_value"
    assert (data.JOB_KEY, data.KIND_TRAIN) == (XCOM_JOB, "train")
    assert data.read_attempt is read_attempt


def test_a_training_task_is_known_by_its_operator_before_it_pushed_anything():
    names = {
        HorovodTrainOperator.__name__,
        _HorovodDecoratedOperator.__name__,
        _HorovodDecoratedOperator.custom_operator_name,
    }
    assert data.TRAINING_OPERATORS == names
