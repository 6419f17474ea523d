"""`@task.ray` and `@task.horovod` against the real stack, from Airflow's environment: the task
job's return value, a kill, a retry that re-attaches, and bad arguments refused before submission.
(The TaskFlow example DAG, a real sweep, is run by test_dags.py.)"""

from __future__ import annotations

import json
import time
import uuid

import pendulum
import pytest

from airflow_provider_horovod.exceptions import InvalidParameterError, RayJobError
from airflow_provider_horovod.failures import stopped_by_request
from airflow_provider_horovod.operators.ray import RayTaskOperator
from harness.tasks import (
    HUNG_S,
    FakeTI,
    assert_stopped,
    jobs_of,
    run_in_thread,
    running_after,
    wait_for_status,
    wait_until,
)

pytestmark = pytest.mark.integration


def ray_task(tmp_path, function, *args, **kwargs):
    kwargs = {"deferrable": False, "poll_interval_seconds": 0.5, **kwargs}
    return RayTaskOperator(
        task_id="train", python_callable=function, op_args=list(args), storage_path=str(tmp_path), **kwargs
    )


def test_a_ray_task_returns_its_value_to_xcom(ray_hook, tmp_path):
    ti = FakeTI(f"task-{uuid.uuid4().hex[:6]}")
    value = ray_task(tmp_path, "json:loads", '{"a": [1, 2]}').execute({"ti": ti})
    assert value == {"a": [1, 2]}
    (job,) = jobs_of(ray_hook, ti.run_id)
    assert job["metadata"]["ahp_kind"] == "task"
    assert ti.xcoms["submission_id"] == job["submission_id"]
    assert job["driver_info"] is not None or job["status"] == "SUCCEEDED"


def wait_in_ray(seconds: float) -> None:
    """A driver waiting on Ray, as a training's does in fit(): SIGTERM finds it in ray.get, after ray.init."""
    import ray

    @ray.remote(num_cpus=0)
    def sleep(seconds: float) -> None:
        time.sleep(seconds)

    waiting = sleep.remote(seconds)
    print("waiting in ray.get", flush=True)
    ray.get(waiting)


def test_killing_a_ray_task_stops_its_job_and_its_driver_keeps_the_attempts_record(ray_hook, tmp_path):
    ti = FakeTI(f"taskkill-{uuid.uuid4().hex[:6]}")
    op = ray_task(tmp_path, wait_in_ray, 300)
    begun = time.monotonic()
    thread, outcome = run_in_thread(op, {"ti": ti})
    sid = ti.task_run.submission_id(1)
    start_s = running_after(ray_hook, sid, begun)
    wait_until(lambda: "waiting in ray.get" in ray_hook.get_job_logs(sid), HUNG_S, "the driver's wait", outcome)
    asked = time.monotonic()
    op.on_kill()
    assert_stopped(ray_hook, sid, asked, start_s)
    thread.join(HUNG_S)
    assert isinstance(outcome.get("error"), RayJobError)
    # The killed task's wait ends without a finish step: the record is the driver's own, kept on Ray's SIGTERM
    # before Ray marked the job STOPPED, in place of the one on_kill kept at the stop.
    record_uri = ray_hook.get_job_info(sid)["metadata"]["ahp_result_uri"]
    record = json.loads(open(record_uri).read())
    assert record["submission_id"] == sid, record
    assert record["failure"]["failure_class"] == "infrastructure", record
    assert stopped_by_request(record["failure"])
    assert "SIGTERM" in record["failure"]["summary"]


def test_a_retry_of_a_ray_task_reattaches_to_its_job(ray_hook, tmp_path):
    ti = FakeTI(f"taskretry-{uuid.uuid4().hex[:6]}")
    first = ray_task(tmp_path, "time:sleep", 6)
    thread, _ = run_in_thread(first, {"ti": ti})
    sid = ti.task_run.submission_id(1)
    wait_for_status(ray_hook, sid, {"RUNNING"})
    first._killed.set()  # the first try's worker goes away; the job goes on
    thread.join(HUNG_S)
    ti.try_number = 2
    assert ray_task(tmp_path, "time:sleep", 6).execute({"ti": ti}) is None  # time.sleep's value
    assert [j["submission_id"] for j in jobs_of(ray_hook, ti.run_id)] == [sid]


@pytest.mark.parametrize(
    "decorator, kwargs, parameter",
    [
        ("ray", {"num_gpus": -1}, "num_gpus"),
        ("ray", {"memory": 1.5}, "memory"),
        ("ray", {"runtime_env": {"env_vars": {"API_TOKEN": "x"}}}, "runtime_env"),
        ("horovod", {"num_workers": 0}, "num_workers"),
        ("horovod", {"storage_path": "relative/path"}, "storage_path"),
    ],
)
def test_bad_decorator_arguments_fail_before_submission(ray_hook, tmp_path, decorator, kwargs, parameter):
    from airflow.sdk import dag, task

    before = len(ray_hook.list_jobs())

    @dag(dag_id=f"ahp_bad_{decorator}", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"))
    def build():
        @getattr(task, decorator)(task_id="work", **{"storage_path": str(tmp_path), **kwargs})
        def work(x: int) -> int:
            return x

        work(1)

    op = build().get_task("work")
    with pytest.raises(InvalidParameterError) as err:
        op.execute({"ti": FakeTI("bad-decorator", task_id="work")})
    assert err.value.parameter == parameter
    assert len(ray_hook.list_jobs()) == before


def test_arguments_that_are_not_json_fail_before_submission(ray_hook, tmp_path):
    before = len(ray_hook.list_jobs())
    with pytest.raises(InvalidParameterError) as err:
        ray_task(tmp_path, "json:dumps", object()).execute({"ti": FakeTI("not-json")})
    assert err.value.parameter == "op_args"
    assert "JSON-serialisable" in str(err.value)
    assert len(ray_hook.list_jobs()) == before
