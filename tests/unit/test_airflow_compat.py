"""What differs between Airflow versions: the task state store, and the trigger's on_kill."""

import logging

from airflow_provider_horovod import airflow_compat as compat
from unit.fakes import Store


class Broken:
    def get(self, key):
        raise RuntimeError("API server down")

    def set(self, key, value):
        raise RuntimeError("API server down")


def test_state_store_round_trip():
    store = Store()
    context = {"task_state_store": store}
    assert compat.state_get(context, "k") is None
    compat.state_set(context, "k", {"lines": 3})
    assert store == {"k": {"lines": 3}}
    assert compat.state_get(context, "k") == {"lines": 3}


def test_without_a_store():
    for context in ({}, {"task_state_store": None}, None, object()):
        assert compat.state_get(context, "k") is None
        compat.state_set(context, "k", 1)


def test_a_failing_store_never_fails_the_task(caplog):
    context = {"task_state_store": Broken()}
    with caplog.at_level(logging.WARNING, logger=compat.__name__):
        assert compat.state_get(context, "cursor") is None
        compat.state_set(context, "cursor", 1)
    messages = [r.getMessage() for r in caplog.records if r.name == compat.__name__]
    assert messages == [
        "Could not read 'cursor' from the task's state store.",
        "Could not save 'cursor' in the task's state store.",
    ]


def test_this_airflow_calls_the_triggers_on_kill():
    import airflow

    assert airflow.__version__.startswith("3.")
    assert compat.trigger_on_kill_supported() is (tuple(map(int, airflow.__version__.split(".")[:2])) >= (3, 3))
    assert compat.trigger_on_kill_supported() is True  # the Airflow these tests run on (3.3)


def test_a_task_under_dag_test_is_told_from_one_an_executor_runs(monkeypatch):
    """``airflow dags test`` runs tasks in its own process, whatever ``[core] executor`` says: the check
    that refuses the embedded cluster under an executor of many machines sees no executor then."""
    from airflow.sdk.execution_time import task_runner
    from airflow.sdk.execution_time.supervisor import InProcessSupervisorComms

    from airflow_provider_horovod.airflow_compat import in_dag_test
    from airflow_provider_horovod.jobs.submit import configured_executors

    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", "CeleryExecutor")
    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", object(), raising=False)
    assert not in_dag_test()
    assert configured_executors() == ["CeleryExecutor"]
    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", object.__new__(InProcessSupervisorComms))
    assert in_dag_test()
    assert configured_executors() == []
