"""``@task.horovod``: the decorated function is the training function, called by every worker with
the arguments of the call in the DAG."""

import dataclasses

import cloudpickle
import pytest
from airflow.sdk import DAG

from airflow_provider_horovod.contract import TaskRun
from airflow_provider_horovod.decorators.horovod import horovod_task
from airflow_provider_horovod.exceptions import InvalidParameterError
from airflow_provider_horovod.operators.horovod import HorovodTrainOperator
from unit.fakes import RUN_ID, FakeRay, context


@horovod_task(num_workers=3, storage_path="/tmp/ahp-unit")
def train(lr, epochs=1, *, layers):
    return {"lr": lr, "epochs": epochs, "layers": layers}


def test_the_call_gives_every_worker_its_arguments():
    with DAG("dag", schedule=None):
        op = train(0.1, layers=[4, 4]).operator
    assert isinstance(op, HorovodTrainOperator)
    assert op.task_id == "train"
    assert op.num_workers == 3
    assert {"op_args", "op_kwargs"} <= set(op.template_fields)
    training = op.checked_plan(TaskRun("dag", "train", RUN_ID), op.wait_policy())
    spec = training.spec
    assert spec.train_args == [0.1]
    assert spec.train_kwargs == {"layers": [4, 4]}
    assert spec.train_fn == {"pickle": "train_fn.pkl", "source": __file__}
    assert cloudpickle.loads(training.files["train_fn.pkl"])(*spec.train_args, **spec.train_kwargs) == {
        "lr": 0.1,
        "epochs": 1,
        "layers": [4, 4],
    }


def test_a_function_of_several_parameters_is_not_refused():
    # The operator's own train_fn takes at most `config`; a decorated one takes what the call gives.
    with DAG("dag", schedule=None):
        op = train(0.1, 2, layers=[1]).operator
    assert op.checked_plan(TaskRun("dag", "train", RUN_ID), op.wait_policy()).spec.train_args == [0.1, 2]


def test_arguments_that_are_not_json_fail_before_any_cluster_call(serve):
    dashboard = serve(FakeRay())
    with DAG("dag", schedule=None):
        op = train(object(), layers=[1]).operator
    with pytest.raises(InvalidParameterError) as err:
        op.execute(context())
    assert err.value.parameter == "op_args"
    assert "JSON-serialisable" in str(err.value)
    assert dashboard.requests == []


def test_a_decorated_training_logs_to_mlflow_with_its_calls_arguments_as_parameters():
    from airflow_provider_horovod.runtime.tracking import params

    @horovod_task(num_workers=2, storage_path="/tmp/ahp-unit", mlflow_tracking_uri="http://mlflow:5000")
    def tracked(lr, *, layers):
        return lr

    with DAG("dag", schedule=None):
        op = tracked(0.1, layers=[4, 4]).operator
    spec = op.checked_plan(TaskRun("dag", "tracked", RUN_ID), op.wait_policy()).spec
    assert spec.tracking["tracking_uri"] == "http://mlflow:5000"
    assert spec.tracking["experiment_name"] == "dag"
    # The job's runtime chooses the trainer API ("auto") before it starts the MLflow run.
    spec = dataclasses.replace(spec, trainer_api="v2")
    assert params(spec) == {
        "layers": "[4, 4]",
        "args": "[0.1]",
        "world_size": "2",
        "trainer": "horovod",
        "trainer_api": "v2",
        "use_gpu": "False",
    }
