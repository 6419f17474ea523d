"""Extra link from a training task to its MLflow run."""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow.sdk import BaseOperatorLink

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator
    from airflow.sdk.types import TaskInstanceKey


class MlflowRunLink(BaseOperatorLink):
    """ "MLflow run": opens the run the training logged to (``mlflow_tracking_uri`` or ``mlflow_conn_id``).

    The run's page is known once the training ended (its URL is in the result); Airflow asks the link
    when the task ends, and the operator that ran says, so a task without a run, or without tracking,
    gets an empty link and reads no XCom that is not there. The UI reads what was pushed then. No
    MLflow client is needed on the Airflow side.
    """

    name = "MLflow run"

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        if hasattr(operator, "mlflow_run_url"):
            return operator.mlflow_run_url or ""
        from airflow.sdk.bases.xcom import BaseXCom

        # Airflow's own TaskInstanceKey does not satisfy its TIKeyProtocol's settable attributes.
        return BaseXCom.get_value(ti_key=ti_key, key=self.xcom_key) or ""  # type: ignore[arg-type]
