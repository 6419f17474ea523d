"""Extra link from a task to its job in the Ray dashboard."""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow.sdk import BaseOperatorLink

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator
    from airflow.sdk.types import TaskInstanceKey


class RayJobLink(BaseOperatorLink):
    """ "Ray job": opens the task's Ray job in the dashboard. The task pushes the URL to XCom as soon as
    its job is known; when the task ends Airflow asks the link again, and the operator that ran says
    (so a task that failed before it had a job reads no XCom that is not there)."""

    name = "Ray job"

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        if hasattr(operator, "dashboard_url"):
            return operator.dashboard_url or ""
        from airflow.sdk.bases.xcom import BaseXCom

        # Airflow's own TaskInstanceKey does not satisfy its TIKeyProtocol's settable attributes.
        return BaseXCom.get_value(ti_key=ti_key, key=self.xcom_key) or ""  # type: ignore[arg-type]
