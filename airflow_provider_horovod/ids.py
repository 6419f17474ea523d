"""Names decided once: the Ray submission ids of a task run and its storage folder.

Both are derived from the dag id, task id, run id and map index, so they are known before anything
is submitted, and a retry or a restarted worker finds what an earlier try started. Standard library
only, and pure.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
SUBMISSION_PREFIX = "ahp"


def short_hash(*parts: object, length: int = 10) -> str:
    return hashlib.sha256("\x1f".join(map(str, parts)).encode()).hexdigest()[:length]


def safe_name(text: str, max_len: int = 60) -> str:
    """A readable, path- and URL-safe form of an Airflow id (``:`` and ``+`` of run ids go)."""
    return _UNSAFE.sub("_", text).strip("_")[:max_len] or "x"


@dataclasses.dataclass(frozen=True)
class TaskRun:
    """The Airflow task run a Ray job belongs to."""

    dag_id: str
    task_id: str
    run_id: str
    map_index: int = -1

    @classmethod
    def of(cls, ti) -> TaskRun:
        """From a task instance (or anything with the four attributes)."""
        index = getattr(ti, "map_index", -1)
        return cls(ti.dag_id, ti.task_id, ti.run_id, -1 if index is None else int(index))

    @property
    def base_id(self) -> str:
        """The stem of this run's submission ids: readable parts for people, a hash of all four for
        uniqueness (truncation and sanitising could otherwise make two runs collide)."""
        digest = short_hash(self.dag_id, self.task_id, self.run_id, self.map_index)
        return f"{SUBMISSION_PREFIX}-{safe_name(self.dag_id, 40)}-{safe_name(self.task_id, 40)}-{digest}"

    def submission_id(self, attempt: int) -> str:
        return f"{self.base_id}-a{attempt}"

    def storage_uri(self, storage_path: str) -> str:
        """The task run's own folder under ``storage_path``: backfills and reruns never share one."""
        run_part = f"{safe_name(self.run_id, 80)}-{short_hash(self.run_id, length=6)}"
        parts = [storage_path.rstrip("/"), safe_name(self.dag_id, 120), safe_name(self.task_id, 120), run_part]
        if self.map_index >= 0:
            parts.append(f"map-{self.map_index}")
        return "/".join(parts)

    def metadata(self) -> dict[str, str]:
        """The Ray job metadata naming this task run (plain strings, shown in the dashboard)."""
        return {"airflow_dag_id": self.dag_id, "airflow_task_id": self.task_id, "airflow_run_id": self.run_id,
                "airflow_map_index": str(self.map_index)}


def attempt_of(submission_id: str) -> int | None:
    """The attempt number at the end of a submission id made here (``...-a3`` -> 3)."""
    stem, sep, number = submission_id.rpartition("-a")
    return int(number) if sep and stem and number.isdigit() else None


def default_storage_path() -> str:
    """Where checkpoints go when ``storage_path`` is not given: a folder under ``AIRFLOW_HOME``."""
    home = os.environ.get("AIRFLOW_HOME") or os.path.expanduser("~/airflow")
    return os.path.join(home, "horovod-storage")
