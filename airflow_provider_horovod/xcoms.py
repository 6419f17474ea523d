"""What the provider pushes to XCom besides the return value: the job once it is submitted (for the
"Ray job" link, templates and the Training view), and the parts of a finished job's result that
templates read by key. Only the operators and the sensor push, each through these two functions."""

from __future__ import annotations

from typing import Any

from airflow_provider_horovod.contract import XCOM_CHECKPOINT_URI, XCOM_COST, XCOM_JOB, XCOM_SUBMISSION_ID
from airflow_provider_horovod.documents import SubmittedJob
from airflow_provider_horovod.links.ray import RayJobLink


def push_job(ti: Any, job: SubmittedJob) -> None:
    """The task's job: its dashboard URL (the extra link), its submission id, and the whole record."""
    ti.xcom_push(key=RayJobLink().xcom_key, value=job["dashboard_url"])
    ti.xcom_push(key=XCOM_SUBMISSION_ID, value=job["submission_id"])
    ti.xcom_push(key=XCOM_JOB, value=dict(job))


def push_result(ti: Any, result: dict[str, Any]) -> None:
    """A training's ``checkpoint_uri``, and the job's ``cost`` (a training's return value holds it too)."""
    if result.get("checkpoint_uri"):
        ti.xcom_push(key=XCOM_CHECKPOINT_URI, value=result["checkpoint_uri"])
    if result.get("cost"):
        ti.xcom_push(key=XCOM_COST, value=result["cost"])
