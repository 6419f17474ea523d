"""What differs between the Airflow 3 versions the provider supports (3.1 and later), in one place.

Airflow 3.3 gives a task a ``task_state_store`` that outlives a try, calls a trigger's ``on_kill``
when the user kills a deferred task, has async XCom calls for triggers, and a task ``retry_policy``
that matches exception types. On older versions the provider falls back: no store (a retry that
re-attaches streams the job's log from where Ray's log begins), the kill noticed from the task's
state when the trigger is cancelled, XCom calls run in a thread; and on every version a failure
that must not be retried is also an ``AirflowFailException``, which all of them know.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Iterator
from typing import Any

from airflow.providers.common.compat.sdk import AirflowFailException

from airflow_provider_horovod.exceptions import ConfigurationError, JobFailure, UserCodeError

log = logging.getLogger(__name__)


@functools.cache
def trigger_on_kill_supported() -> bool:
    """True when the triggerer calls ``BaseTrigger.on_kill`` on a user's kill (Airflow 3.3+)."""
    from airflow.triggers.base import BaseTrigger

    return callable(getattr(BaseTrigger, "on_kill", None))


def in_dag_test() -> bool:
    """True when the task runs under ``airflow dags test`` (``dag.test()``), which runs every task, and its
    deferral, in its own process whatever the executor. The Task SDK does not say so; its in-process
    supervisor is what tells, and any doubt answers False."""
    try:
        from airflow.sdk.execution_time import task_runner
        from airflow.sdk.execution_time.supervisor import InProcessSupervisorComms
    except ImportError:
        return False
    return isinstance(getattr(task_runner, "SUPERVISOR_COMMS", None), InProcessSupervisorComms)


def state_get(context: Any, key: str) -> Any:
    """A value from the task's ``task_state_store`` (None without one, or when it cannot be read)."""
    store = context.get("task_state_store") if hasattr(context, "get") else None
    if store is None:
        return None
    try:
        return store.get(key)
    except Exception:  # what is stored there only spares repeated work: never fail the task for it
        log.warning("Could not read %r from the task's state store.", key)
        return None


def state_set(context: Any, key: str, value: Any) -> None:
    store = context.get("task_state_store") if hasattr(context, "get") else None
    if store is None:
        return
    try:
        store.set(key, value)
    except Exception:
        log.warning("Could not save %r in the task's state store.", key)


def _xcom():
    from airflow.sdk.execution_time.xcom import XCom

    return XCom


async def trigger_xcom_get(key: str, *, dag_id: str, task_id: str, run_id: str, map_index: int) -> Any:
    """An XCom of the trigger's task instance, read from the triggerer."""
    xcom = _xcom()
    ids = {"key": key, "dag_id": dag_id, "task_id": task_id, "run_id": run_id, "map_index": map_index}
    if hasattr(xcom, "aget_one"):
        return await xcom.aget_one(**ids)
    return await asyncio.to_thread(xcom.get_one, **ids)


async def trigger_xcom_set(key: str, value: Any, *, dag_id: str, task_id: str, run_id: str, map_index: int) -> None:
    xcom = _xcom()
    ids = {"key": key, "value": value, "dag_id": dag_id, "task_id": task_id, "run_id": run_id, "map_index": map_index}
    if hasattr(xcom, "aset"):
        await xcom.aset(**ids)
    else:
        await asyncio.to_thread(xcom.set, **ids)


async def task_was_killed(*, dag_id: str, task_id: str, run_id: str, map_index: int) -> bool:
    """Before Airflow 3.3: a cancelled trigger whose task is no longer deferred was killed by the
    user (a triggerer restart leaves the task deferred)."""
    from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

    states = await asyncio.to_thread(
        RuntimeTaskInstance.get_task_states, dag_id=dag_id, map_index=map_index, task_ids=[task_id], run_ids=[run_id]
    )
    key = task_id if map_index < 0 else f"{task_id}_{map_index}"
    state = (states.get(run_id) or {}).get(key)
    return state is not None and str(state) != "deferred"


class UserCodeFailed(UserCodeError, AirflowFailException):
    """A user's error, failing the task without retries."""


class ConfigurationFailed(ConfigurationError, AirflowFailException):
    """A wrong configuration, failing the task without retries."""


def without_retry(error: JobFailure) -> JobFailure:
    """The same failure, failing the task without further retries on every supported Airflow (also an
    ``AirflowFailException``, which Airflow 3.1 and 3.2 know, and which 3.3's retry_policy does not
    overrule): a user's error or a wrong configuration fails the same way again."""
    final = UserCodeFailed if isinstance(error, UserCodeError) else ConfigurationFailed
    return final(
        str(error),
        failure=error.failure,
        submission_id=error.submission_id,
        status=error.status,
        error_type=error.error_type,
    )


@contextlib.contextmanager
def failing_for_good(retry_on_user_error: bool) -> Iterator[None]:
    """A user's error or a wrong configuration fails the task without retries, unless asked otherwise."""
    try:
        yield
    except (UserCodeError, ConfigurationError) as err:
        if retry_on_user_error:
            raise
        raise without_retry(err) from None
