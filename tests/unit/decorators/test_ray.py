"""``@task.ray``: the decorated function runs as one Ray job; the call's arguments are its own."""

import pytest
from airflow.sdk import DAG

from airflow_provider_horovod.contract import TaskRun
from airflow_provider_horovod.decorators.ray import ray_task
from airflow_provider_horovod.exceptions import InvalidParameterError
from airflow_provider_horovod.operators.ray import RayTaskOperator
from unit.fakes import RUN_ID, FakeRay, context


@ray_task(num_gpus=1, resources={"accel": 1}, storage_path="/tmp/ahp-unit")
def evaluate(uri, threshold=0.5):
    return {"uri": uri, "ok": threshold < 1}


def test_the_call_gives_the_functions_arguments():
    with DAG("dag", schedule=None):
        op = evaluate("s3://b/model", threshold=0.7).operator
    assert isinstance(op, RayTaskOperator)
    assert op.task_id == "evaluate"
    plan = op.checked_plan(TaskRun("dag", "evaluate", RUN_ID), op.wait_policy())
    spec = plan.spec
    assert spec.args == ["s3://b/model"]
    assert spec.kwargs == {"threshold": 0.7}
    assert spec.function == {"pickle": "function.pkl", "source": __file__}
    assert set(plan.files) == {"function.pkl"}
    assert plan.driver_resources == {"num_cpus": 1, "num_gpus": 1, "memory": None, "resources": {"accel": 1.0}}


def test_arguments_that_are_not_json_fail_before_any_cluster_call(serve):
    dashboard = serve(FakeRay())
    with DAG("dag", schedule=None):
        op = evaluate("s3://b/model", threshold=object()).operator
    with pytest.raises(InvalidParameterError) as err:
        op.execute(context(task_id="evaluate"))
    assert err.value.parameter == "op_kwargs"
    assert "JSON-serialisable" in str(err.value)
    assert dashboard.requests == []
