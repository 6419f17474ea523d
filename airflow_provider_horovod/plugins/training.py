"""The plugin: a "Training" tab on a task instance's page in Airflow's UI, drawing the curves of
what every ``ray.train.report`` gave, from what the provider already stores (the task's XCom and the
attempt's result record). Served by Airflow's own api-server (a FastAPI app of the plugin); no other
server. Registered as an ``airflow.plugins`` entry point (pyproject.toml)."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

ROUTE = "/horovod"


def load(dag_id: str, run_id: str, task_id: str, map_index: int) -> tuple[dict | None, dict | None, str]:
    """(the task's result dict, its result record, what went wrong)."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    from airflow_provider_horovod.contract import result_uri
    from airflow_provider_horovod.storage import Storage

    with create_session() as session:
        row = session.query(XComModel.value).filter(
            XComModel.dag_id == dag_id, XComModel.run_id == run_id, XComModel.task_id == task_id,
            XComModel.map_index == map_index, XComModel.key == "return_value").one_or_none()
    result = row[0] if row else None
    if not isinstance(result, dict) or not result.get("storage_uri") or not result.get("attempt"):
        return None, None, "No training result for this task instance (it has not finished, or it is no training task)."
    try:
        record = Storage().read_json(result_uri(result["storage_uri"], result["attempt"]))
    except Exception as err:  # storage down: say so on the page
        return result, None, f"The result record cannot be read: {err}"
    return result, record, "" if record else "The attempt's result record is gone from storage."


def parse_map_index(value: str) -> int:
    """The UI fills ``{MAP_INDEX}`` for mapped tasks only and leaves the placeholder for the rest."""
    try:
        return int(value)
    except ValueError:
        return -1


def make_app():
    from airflow.api_fastapi.core_api.security import requires_access_dag
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
    from fastapi import Depends, FastAPI
    from fastapi.responses import HTMLResponse

    from airflow_provider_horovod.plugins.charts import page

    app = FastAPI(title="Horovod training")

    @app.get("/training", response_class=HTMLResponse,
             dependencies=[Depends(requires_access_dag("GET", DagAccessEntity.TASK_INSTANCE))])
    def training(dag_id: str, run_id: str, task_id: str, map_index: str = "-1") -> str:
        result, record, problem = load(dag_id, run_id, task_id, parse_map_index(map_index))
        return page(result, record, title=f"{dag_id} / {task_id} / {run_id}", problem=problem)

    return app


class HorovodTrainingPlugin(AirflowPlugin):
    name = "horovod_training"
    fastapi_apps = [{"app": make_app(), "url_prefix": ROUTE, "name": "Horovod training"}]
    external_views = [{
        "name": "Training",
        "href": f"{ROUTE}/training?dag_id={{DAG_ID}}&run_id={{RUN_ID}}&task_id={{TASK_ID}}&map_index={{MAP_INDEX}}",
        "destination": "task_instance",
        "url_route": "horovod_training",
    }]
