"""Extra link from a task to its job in the Ray dashboard."""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow.sdk import BaseOperatorLink

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator
    from airflow.sdk.types import TaskInstanceKey


class RayJobLink(BaseOperatorLink):
    """"Ray job": opens the task's Ray job in the dashboard. The URL is pushed to XCom by the task."""

    name = "Ray job"

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        from airflow.sdk.bases.xcom import BaseXCom

        return BaseXCom.get_value(ti_key=ti_key, key=self.xcom_key) or ""


def push_job_link(context, url: str) -> None:
    """Push the dashboard URL of the task's job where ``RayJobLink`` finds it."""
    context["ti"].xcom_push(key=RayJobLink().xcom_key, value=url)
