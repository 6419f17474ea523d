"""What the UI plugin reads of the provider's own data: the names it shares with the operators and the
runtime (XCom keys, job kinds), and the snapshot of one attempt's files (``attempts``), which the
finish step reads too.

Every import of the provider's own modules by the plugin is at the top of this module, so a move of
those names is one edit here.
"""

from __future__ import annotations

from airflow.sdk.bases.xcom import BaseXCom

from airflow_provider_horovod.attempts import AttemptFiles, read_attempt
from airflow_provider_horovod.contract import XCOM_JOB, JobKind
from airflow_provider_horovod.failures import stopped_by_request
from airflow_provider_horovod.storage import Storage

RETURN_KEY = BaseXCom.XCOM_RETURN_KEY
JOB_KEY = XCOM_JOB  # {"submission_id", "storage_uri", "attempt", "dashboard_url", "kind", "trainer_api"}
KIND_TRAIN = JobKind.TRAIN.value
# How a training task shows in the task_instance table (``operator``, ``custom_operator_name``) before
# it has pushed anything: the operator's class name, or the decorator's name.
TRAINING_OPERATORS = frozenset({"HorovodTrainOperator", "_HorovodDecoratedOperator", "@task.horovod"})

__all__ = [
    "JOB_KEY",
    "KIND_TRAIN",
    "RETURN_KEY",
    "TRAINING_OPERATORS",
    "AttemptFiles",
    "Storage",
    "read_attempt",
    "stopped_by_request",
]
