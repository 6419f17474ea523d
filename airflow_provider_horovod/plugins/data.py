"""What the UI plugin reads of the provider's own data: the names it shares with the operators and the
runtime (XCom keys, file names, the storage layout), and the reads of one attempt's folder.

Every import of the provider's own modules by the plugin is at the top of this module, so a move of
those names is one edit here.
"""

from __future__ import annotations

import json

from airflow_provider_horovod.contract import HISTORY_FILE, XCOM_JOB, attempt_uri, result_uri
from airflow_provider_horovod.failures import stopped_by_request
from airflow_provider_horovod.storage import Storage

RETURN_KEY = "return_value"
JOB_KEY = XCOM_JOB  # {"submission_id", "storage_uri", "attempt", "dashboard_url", "kind", "trainer_api"}
KIND_TRAIN = "train"
# How a training task shows in the task_instance table (``operator``, ``custom_operator_name``) before
# it has pushed anything: the operator's class name, or the decorator's name.
TRAINING_OPERATORS = frozenset({"HorovodTrainOperator", "_HorovodDecoratedOperator", "@task.horovod"})

__all__ = [
    "HISTORY_FILE",
    "JOB_KEY",
    "KIND_TRAIN",
    "RETURN_KEY",
    "TRAINING_OPERATORS",
    "AttemptFiles",
    "attempt_uri",
    "result_uri",
    "stopped_by_request",
]


class AttemptFiles:
    """The files of one training attempt, ``<storage_uri>/attempt-<n>/``, read as the api-server can."""

    def __init__(
        self, storage_uri: str, attempt: int, *, aws_conn_id: str | None = None, storage: Storage | None = None
    ):
        self.folder = attempt_uri(storage_uri, attempt)
        self.record_uri = result_uri(storage_uri, attempt)
        self.storage = storage or Storage(aws_conn_id=aws_conn_id)

    def record(self) -> dict | None:
        """The attempt's result record, once the job has finished (None before)."""
        return self.storage.read_json(self.record_uri)

    def history(self) -> list[dict] | None:
        """Rank 0's reports as the runtime rewrites them after every report (None: none yet)."""
        text = self.storage.read_text(f"{self.folder}/{HISTORY_FILE}")
        return None if text is None else json.loads(text)

    def checkpoint_uri(self, name: str) -> str:
        return f"{self.folder}/{name}"

    def folders_with_files(self) -> set[str]:
        """The checkpoints Ray has kept: the attempt's folders that still hold files."""
        return self.storage.folders_with_files(self.folder)
