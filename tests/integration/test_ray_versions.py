"""The same checks on whatever Ray minor the test head runs, where ``AHP_RAY_VERSIONS=1`` asks for them:
``make test`` runs the ``ray_oldest`` ones on the oldest tested minor (Ray laid over the cluster's
environment by ``scripts/setup_ray_layer.sh``, ``AHP_CLUSTER_PYTHONPATH``), and ``make compat`` runs them
all on every minor and writes docs/compatibility.md from the results (``scripts/compat_matrix.py``). On the
newest minor make test runs the same paths in the other files.

What each minor must do: train end to end from the operator (the checkpoint URI in XCom, the job's log in
the task log) and resume from its checkpoint after a worker is killed, on each trainer API and on the
one ``trainer_api="auto"`` chooses; fail a user's bug once with its class; run ``@task.ray``; refuse
elastic workers before submitting where Ray Train has no elastic scaling (and run them where it has);
work with a connection that carries no token. A check a minor cannot run is skipped with a reason that
starts "not supported:"."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import structlog.testing

from airflow_provider_horovod.contract import RAY_ELASTIC_SINCE, ray_minor, result_uri
from airflow_provider_horovod.exceptions import InvalidParameterError, UserCodeError
from airflow_provider_horovod.operators.horovod import HorovodTrainOperator
from airflow_provider_horovod.operators.ray import RayTaskOperator
from harness import cluster
from harness.tasks import HUNG_S, FakeTI, jobs_of, run_in_thread

from .test_horovod_v2 import kill_rank1_at_epoch_2, train_until_killed
from .test_operator import make_operator

pytestmark = [pytest.mark.integration, pytest.mark.ray_versions]
# Token authentication comes with Ray 2.52; Train V2 is Ray's default from 2.51.
TOKEN_AUTH_SINCE = (2, 52)
V2_DEFAULT_SINCE = (2, 51)


@pytest.fixture(scope="module")
def minor(ray_cluster) -> tuple[int, int]:
    """The Ray minor of the test head, as its dashboard reports it."""
    from airflow_provider_horovod.hooks.ray import RayHook

    found = ray_minor(RayHook().ray_version())
    assert found is not None
    return found


def task_log(logged) -> str:
    return "\n".join(str(e.get("event")) % tuple(e.get("positional_args") or ()) for e in logged)


def auto_api(minor) -> str:
    return "v2" if minor >= V2_DEFAULT_SINCE else "legacy"


@pytest.mark.parametrize(
    "trainer_api",
    [pytest.param("auto", marks=pytest.mark.ray_oldest), "v2", "legacy"],
)
def test_a_killed_worker_resumes_from_its_checkpoint_and_the_checkpoint_reaches_xcom(
    ray_cluster, minor, tmp_path, trainer_api, record_property
):
    progress_dir = tmp_path / "progress"
    progress_dir.mkdir()
    op = make_operator(
        tmp_path / "storage",
        train_fn=train_until_killed,
        trainer_api=trainer_api,
        max_failures=1,
        train_loop_config={"progress_dir": str(progress_dir)},
    )
    ti = FakeTI(f"resume-{trainer_api}-{uuid.uuid4().hex[:6]}")
    with structlog.testing.capture_logs() as logged:
        thread, outcome = run_in_thread(op, {"ti": ti})
        kill_rank1_at_epoch_2(progress_dir / "rank1.json", outcome)
        thread.join(HUNG_S)
    assert not thread.is_alive(), "the task did not finish"
    assert "error" not in outcome, outcome.get("error")
    result = outcome["result"]
    ran = auto_api(minor) if trainer_api == "auto" else trainer_api
    assert result["trainer_api"] == ran  # the API that ran, in XCom and the record
    if trainer_api == "auto":
        record_property("compat", ran)  # make compat's page names the API auto chose
    metrics = result["metrics"]
    assert (metrics["restored_epoch"], metrics["start_epoch"], metrics["epoch"]) == (2, 3, 5)
    assert result["checkpoint_uri"].startswith(str(tmp_path / "storage"))
    assert ti.xcoms["checkpoint_uri"] == result["checkpoint_uri"]
    assert result["attempt"] == 1
    log = task_log(logged)
    assert f"[ray] Trainer API: {ran} (trainer_api={trainer_api!r}: " in log  # the job's log, in the task log
    assert f"checkpoint: {result['checkpoint_uri']}" in log


def bug_on_rank_1(config):
    import horovod.torch as hvd

    hvd.init()
    return 1 / (hvd.rank() - 1)


@pytest.mark.parametrize(
    "trainer_api",
    [pytest.param("auto", marks=pytest.mark.ray_oldest), "v2", "legacy"],
)
def test_a_users_bug_fails_the_task_once_with_its_class(ray_hook, minor, tmp_path, trainer_api, record_property):
    from airflow.providers.common.compat.sdk import AirflowFailException

    op = make_operator(tmp_path, train_fn=bug_on_rank_1, trainer_api=trainer_api, max_failures=1)
    ti = FakeTI(f"bug-{trainer_api}-{uuid.uuid4().hex[:6]}")
    with pytest.raises(UserCodeError) as failed:
        op.execute({"ti": ti})
    assert isinstance(failed.value, AirflowFailException)  # Airflow does not retry it
    assert failed.value.failure["failure_class"] == "user_code"
    assert failed.value.failure["rank"] == 1
    assert "ZeroDivisionError" in str(failed.value)
    (job,) = jobs_of(ray_hook, ti.run_id)  # one Ray job
    assert job["status"] == "FAILED"
    # The failed attempt's record names the API that ran.
    record = json.loads(Path(result_uri(job["metadata"]["ahp_storage_uri"], 1)).read_text())
    ran = auto_api(minor) if trainer_api == "auto" else trainer_api
    assert record["trainer_api"] == ran
    if trainer_api == "auto":
        record_property("compat", ran)  # make compat's page names the API auto chose


@pytest.mark.ray_oldest
def test_a_ray_task_returns_its_value(ray_hook, tmp_path):
    ti = FakeTI(f"task-{uuid.uuid4().hex[:6]}")
    op = RayTaskOperator(
        task_id="train",
        python_callable="json:loads",
        op_args=['{"a": [1, 2]}'],
        storage_path=str(tmp_path),
        deferrable=False,
        poll_interval_seconds=0.5,
    )
    assert op.execute({"ti": ti}) == {"a": [1, 2]}


def tiny_train(config):
    """One allreduce and one checkpointed report."""
    import os
    import tempfile

    import horovod.torch as hvd
    import ray.train
    import torch
    from ray.train import Checkpoint

    hvd.init()
    size = hvd.allreduce(torch.tensor(1.0), op=hvd.Sum, name="size").item()
    with tempfile.TemporaryDirectory() as folder:
        if hvd.rank() == 0:
            with open(os.path.join(folder, "size.txt"), "w") as f:
                f.write(str(size))
        ray.train.report({"size": size}, checkpoint=Checkpoint.from_directory(folder) if hvd.rank() == 0 else None)


@pytest.mark.ray_oldest
def test_elastic_workers_need_elastic_scaling(ray_hook, minor, tmp_path, record_property):
    op = HorovodTrainOperator(
        task_id="train",
        train_fn=tiny_train,
        num_workers=(1, 2),
        storage_path=str(tmp_path),
        deferrable=False,
        poll_interval_seconds=0.5,
    )
    ti = FakeTI(f"elastic-{uuid.uuid4().hex[:6]}")
    if minor < RAY_ELASTIC_SINCE:
        with pytest.raises(InvalidParameterError) as refused:
            op.execute({"ti": ti})
        message = str(refused.value)
        assert f"the cluster's Ray {ray_hook.ray_version()} lacks" in message
        assert "Ray 2.55" in message
        assert jobs_of(ray_hook, ti.run_id) == []  # refused before anything was submitted
        record_property("compat", "not supported: refused before submission, naming 2.55")
        return
    result = op.execute({"ti": ti})
    assert result["trainer_api"] == "v2"
    assert 1 <= result["world_size"] <= 2
    assert result["metrics"]["size"] == result["world_size"]
    assert result["checkpoint_uri"]
    record_property("compat", f"world size {result['world_size']}")


@pytest.mark.ray_oldest
def test_a_connection_without_a_token_works(ray_cluster, minor, tmp_path, monkeypatch, record_property):
    """No password: a cluster without token authentication (before Ray 2.52), or one whose token a proxy
    adds, which the connection's own headers stand for here."""
    head = {"dashboard_url": ray_cluster.dashboard_url, "token": None}
    headers = {"X-Forwarded-User": "airflow"}
    if minor >= TOKEN_AUTH_SINCE:
        headers["Authorization"] = f"Bearer {ray_cluster.token}"
    monkeypatch.setenv("AIRFLOW_CONN_RAY_NO_TOKEN", cluster.connection(head, extra={"headers": headers}))
    op = RayTaskOperator(
        task_id="train",
        python_callable="json:loads",
        op_args=["[3]"],
        storage_path=str(tmp_path),
        ray_conn_id="ray_no_token",
        deferrable=False,
        poll_interval_seconds=0.5,
    )
    assert op.execute({"ti": FakeTI(f"notoken-{uuid.uuid4().hex[:6]}")}) == [3]
    record_property("compat", "token in the headers" if "Authorization" in headers else "no token")
