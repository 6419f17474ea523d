"""HorovodTrainOperator, RayJobTrigger and RayJobSensor against the real stack: a local Ray head
with token auth, 2 Horovod workers over Gloo, checkpoints on local disk and on S3 (moto)."""

from __future__ import annotations

import threading
import time
import uuid
from types import SimpleNamespace

import pytest
import structlog.testing

from airflow_provider_horovod.exceptions import RayJobError
from airflow_provider_horovod.operators.horovod import HorovodTrainOperator
from airflow_provider_horovod.training import submission_base_id

from .airflow_cli import dags_test, tagged_json

pytestmark = pytest.mark.integration

RESULT_KEYS = {"checkpoint_uri", "metrics", "submission_id", "dashboard_url", "storage_uri", "world_size"}


def check_trained(output: str, storage_prefix: str) -> dict:
    (evaluation,) = tagged_json(output, "AHP_EVAL")
    result = evaluation["result"]
    assert RESULT_KEYS <= set(result)
    assert result["checkpoint_uri"].startswith(storage_prefix)
    assert result["world_size"] == 2
    assert result["dashboard_url"].endswith("/#/jobs/" + result["submission_id"])
    # The quickstart learns: the holdout error of the trained model is small.
    assert evaluation["mse"] < 0.05, evaluation
    return result


def test_sync_operator_trains_to_local_disk(ray_cluster, tmp_path, airflow_db):
    run = dags_test("ahp_train_sync", conf={"storage_path": str(tmp_path)})
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    result = check_trained(run.stdout, str(tmp_path))
    assert (tmp_path / result["checkpoint_uri"][len(str(tmp_path)) + 1:]).is_dir()
    assert "[ray] " in run.stdout  # the job's log streamed into the task log
    # ... with its progress kept in Airflow's task_state_store, for a try that re-attaches.
    assert "log offset" not in run.stdout + run.stderr


def test_deferred_operator_trains_to_s3(ray_cluster, moto_server, airflow_db):
    bucket = f"ahp-{uuid.uuid4().hex[:8]}"
    moto_server.make_bucket(bucket)
    run = dags_test("ahp_train_deferred", conf={"storage_path": f"s3://{bucket}/runs"})
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    # The trigger streamed the job's log, keeping its offset in the task's XCom as it went.
    assert "[ray] " in run.stdout and "log offset" not in run.stdout + run.stderr
    result = check_trained(run.stdout, f"s3://{bucket}/runs/")
    import boto3

    keys = [o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket=bucket)["Contents"]]
    assert any(k.endswith("result.json") for k in keys) and any("/checkpoint_" in k for k in keys)
    assert result["checkpoint_uri"].split(f"s3://{bucket}/", 1)[1] in {k.rsplit("/", 1)[0] for k in keys}


def test_sensor_waits_for_a_submitted_job(ray_cluster, tmp_path, airflow_db):
    run = dags_test("ahp_sensor", conf={"storage_path": str(tmp_path)})
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    check_trained(run.stdout, str(tmp_path))


def test_failed_job_fails_the_task_with_the_error_and_log(ray_cluster, tmp_path, airflow_db):
    run = dags_test("ahp_failing", conf={"storage_path": str(tmp_path)})
    output = run.stdout + run.stderr
    assert run.returncode != 0, output[-4000:]
    # Ray's error type, the job's own error line and the end of its log.
    assert "ended FAILED (JOB_ENTRYPOINT_COMMAND_ERROR)" in output, output[-4000:]
    assert "AHP_ERROR" in output and "boom-in-training" in output
    assert "Last lines of the job's log" in output


# --- in-process: a task's operator driven directly, with the real cluster -----------------------


class FakeTI(SimpleNamespace):
    """Enough of a task instance for execute(): ids and an XCom store."""

    def __init__(self, run_id):
        super().__init__(dag_id="ahp_inproc", task_id="train", run_id=run_id, map_index=-1, try_number=1, xcoms={})

    def xcom_push(self, key, value):
        self.xcoms[key] = value


def slow_train(config):
    import time

    import horovod.torch as hvd

    hvd.init()
    print("slow_train started", flush=True)
    time.sleep(300)


def small_dataset():
    from airflow_provider_horovod.examples.quickstart import make_dataset

    return make_dataset(n=128)


def make_operator(tmp_path, train_fn=slow_train, **kwargs):
    kwargs = {"deferrable": False, "poll_interval_seconds": 0.5, **kwargs}
    return HorovodTrainOperator(task_id="train", train_fn=train_fn, num_workers=2, storage_path=str(tmp_path),
                                **kwargs)


def run_in_thread(op, context, run=None):
    """Run the task (``op.execute``, or ``run(op, context)``) in a thread; its result or error lands in the dict."""
    outcome = {}

    def target():
        try:
            outcome["result"] = run(op, context) if run else op.execute(context)
        except BaseException as err:  # noqa: BLE001 - the test inspects it
            outcome["error"] = err

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, outcome


def wait_for_status(hook, sid, states, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = hook.get_job_info(sid)
        if info and info["status"] in states:
            return info["status"]
        time.sleep(0.5)
    raise AssertionError(f"job {sid} did not reach {states}: {info and info['status']}")


def jobs_of(hook, run_id):
    base = submission_base_id("ahp_inproc", "train", run_id)
    return [j for j in hook.list_jobs() if (j.get("submission_id") or "").startswith(base)]


def test_on_kill_stops_the_job(ray_cluster, ray_hook, tmp_path):
    run_id = f"kill-{uuid.uuid4().hex[:6]}"
    ti = FakeTI(run_id)
    op = make_operator(tmp_path)
    thread, outcome = run_in_thread(op, {"ti": ti})
    sid = f"{submission_base_id('ahp_inproc', 'train', run_id)}-a1"
    wait_for_status(ray_hook, sid, {"RUNNING"})
    started = time.monotonic()
    op.on_kill()
    assert wait_for_status(ray_hook, sid, {"STOPPED"}, timeout=15) == "STOPPED"
    assert time.monotonic() - started < 15
    thread.join(30)
    assert isinstance(outcome.get("error"), RayJobError)


def test_stopped_job_fails_the_task(ray_cluster, ray_hook, tmp_path):
    run_id = f"stop-{uuid.uuid4().hex[:6]}"
    op = make_operator(tmp_path)
    thread, outcome = run_in_thread(op, {"ti": FakeTI(run_id)})
    sid = f"{submission_base_id('ahp_inproc', 'train', run_id)}-a1"
    wait_for_status(ray_hook, sid, {"RUNNING"})
    ray_hook.stop_job(sid)
    thread.join(60)
    err = outcome.get("error")
    assert isinstance(err, RayJobError) and "ended STOPPED" in str(err), outcome


class StateStore(dict):
    """A task instance's task_state_store: unlike XCom it outlives a try (there is no API server here)."""

    def set(self, key, value, **_):
        self[key] = value


def streamed_lines(events: list[dict]) -> list[str]:
    """The job's log lines the operator wrote to the task log since the last call (and forget them)."""
    lines = [e["event"][len("[ray] "):] for e in events if str(e.get("event", "")).startswith("[ray] ")]
    events.clear()
    return lines


def test_retry_reattaches_to_the_running_job(ray_cluster, ray_hook, tmp_path):
    with structlog.testing.capture_logs() as events:  # the task log, as the operator writes it
        retry_reattaches(ray_hook, tmp_path, events)


def retry_reattaches(ray_hook, tmp_path, events):
    run_id = f"retry-{uuid.uuid4().hex[:6]}"
    store = StateStore()  # the task instance's, shared by its tries
    first = make_operator(tmp_path, train_fn="airflow_provider_horovod.examples.quickstart:train_func",
                          train_loop_config={"num_epochs": 6, "lr": 0.1, "batch_size": 16},
                          datasets={"train": small_dataset})
    # A worker that dies mid-wait, once it has streamed some of the job's log: the job goes on.
    thread, _ = run_in_thread(first, {"ti": FakeTI(run_id), "task_state_store": store})
    sid = f"{submission_base_id('ahp_inproc', 'train', run_id)}-a1"
    deadline = time.monotonic() + 120
    while not store.get("ray_log_offset"):
        assert time.monotonic() < deadline, "the first try streamed no log line"
        time.sleep(0.2)
    wait_for_status(ray_hook, sid, {"RUNNING"})
    first._killed.set()
    thread.join(30)
    first_lines = streamed_lines(events)
    assert first_lines and store["ray_log_offset"] == {"submission_id": sid, "offset": len(first_lines)}

    retry_ti = FakeTI(run_id)
    retry_ti.try_number = 2
    second = make_operator(tmp_path, train_fn="airflow_provider_horovod.examples.quickstart:train_func",
                           train_loop_config={"num_epochs": 6, "lr": 0.1, "batch_size": 16},
                           datasets={"train": small_dataset})
    result = second.execute({"ti": retry_ti, "task_state_store": store})
    assert result["submission_id"] == sid
    assert [j["submission_id"] for j in jobs_of(ray_hook, run_id)] == [sid]
    assert retry_ti.xcoms["checkpoint_uri"] == result["checkpoint_uri"]
    # Across the two tries' task logs, every line of the job's log once, in order.
    assert first_lines + streamed_lines(events) == ray_hook.get_job_logs(sid).splitlines()


def test_gpus_the_cluster_lacks_fail_before_submission(ray_cluster, ray_hook, tmp_path):
    from airflow_provider_horovod.exceptions import RayJobPendingTimeoutError

    before = len(ray_hook.list_jobs())
    op = make_operator(tmp_path, use_gpu=True)
    with pytest.raises(RayJobPendingTimeoutError) as err:
        op.execute({"ti": FakeTI(f"gpu-{uuid.uuid4().hex[:6]}")})
    assert '"GPU": 2.0' in str(err.value) and '"CPU": ' in str(err.value) and "use_gpu=False" in str(err.value)
    assert len(ray_hook.list_jobs()) == before  # nothing was submitted


def test_gpus_pending_past_the_timeout_fail_the_job(ray_cluster, ray_hook, tmp_path):
    # An autoscaling cluster might add GPU nodes, so the pre-check can be off; then the workers'
    # wait is bounded by pending_timeout_seconds.
    op = make_operator(tmp_path, use_gpu=True, check_cluster_resources=False, pending_timeout_seconds=5)
    started = time.monotonic()
    with pytest.raises(RayJobError) as err:
        op.execute({"ti": FakeTI(f"gpupend-{uuid.uuid4().hex[:6]}")})
    assert time.monotonic() - started < 90
    assert "ended FAILED" in str(err.value) and "PendingTimeoutError" in str(err.value)
    assert '{"GPU": 1.0}' in str(err.value)


@pytest.mark.parametrize("kwargs, parameter", [({"ray_conn_id": "no_such_ray"}, "no_such_ray"),
                                               ({"aws_conn_id": "no_such_aws"}, "aws_conn_id")])
def test_missing_connections_fail_before_submission(airflow_db, tmp_path, kwargs, parameter):
    from airflow_provider_horovod.exceptions import HorovodProviderError

    op = make_operator(tmp_path, **kwargs)
    with pytest.raises(HorovodProviderError, match=parameter):
        op.execute({"ti": FakeTI("missing-conn")})
