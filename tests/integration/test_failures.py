"""Why did the 2 a.m. retraining fail: each failed attempt gets its class, a user's bug fails once (by
Airflow and by Ray Train), a lost driver is retried unless the task's Airflow 3.3 retry_policy says
otherwise, and the reason outlives the cluster. Real Ray heads, real Horovod over Gloo, Airflow's
own retries through ``dag.test()`` (what ``airflow dags test`` runs, here in the test's process)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from support.airflow_cli import dag_test

from airflow_provider_horovod.contract import TaskRun, result_uri
from airflow_provider_horovod.documents import ResultRecord
from harness import cluster
from harness.tasks import FakeTI

pytestmark = pytest.mark.integration

DAG_FILE = Path(__file__).resolve().parents[1] / "dags" / "failure_dags.py"


def task_instances(dag_id: str) -> list[tuple[str, str, int]]:
    """(task id, state, try number) of the DAG's task instances in Airflow's database."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = (
            session.query(TaskInstance.task_id, TaskInstance.state, TaskInstance.try_number)
            .filter(TaskInstance.dag_id == dag_id)
            .all()
        )
    return [(task, str(state), tries) for task, state, tries in rows]


def jobs_of_dag(hook, dag_id: str) -> list[dict]:
    return [j for j in hook.list_jobs() if (j.get("metadata") or {}).get("airflow_dag_id") == dag_id]


def test_a_users_bug_on_one_rank_runs_one_job_one_worker_group_and_fails_after_one_try(
    airflow_db, ray_cluster, ray_hook, tmp_path, capfd
):
    """Rank 1 divides by zero right after its third report: one try, one worker group, the answer in
    the task log; the failed attempt's record and the live history the Training view reads hold all
    three of rank 0's reports (not only the first)."""
    from airflow_provider_horovod.plugins.data import Storage, read_attempt

    dag_id = "ahp_bug_on_one_rank"
    run = dag_test(dag_id, DAG_FILE, conf={"storage_path": str(tmp_path)})
    captured = capfd.readouterr()
    output = captured.out + captured.err
    assert run.state == "failed", output[-3000:]
    assert task_instances(dag_id) == [("train", "failed", 1)]  # retries=3, max_failures=2: one try
    (job,) = jobs_of_dag(ray_hook, dag_id)
    log = ray_hook.get_job_logs(job["submission_id"])
    assert log.count("Started training worker group") == 1, log[-3000:]  # Ray Train restarted nothing
    # The task log ends with the answer: the class, the rank, the user's exception and own line.
    answer = output[output.rindex("user code, rank 1: ZeroDivisionError") :]
    assert f'File "{DAG_FILE}"' in answer
    assert "in bug_on_rank_1" in answer
    assert 'return config["steps"] / (ranks - 2)' in answer
    assert "What to do: fix the function" in answer
    assert "UserCodeFailed" in output  # an AirflowFailException: Airflow does not retry it
    storage_uri = job["metadata"]["ahp_storage_uri"]
    record = json.loads(open(result_uri(storage_uri, 1)).read())
    assert record["failure"]["failure_class"] == "user_code"
    assert record["failure"]["rank"] == 1
    assert [p["metrics"]["step"] for p in record["history"]] == [1.0, 2.0, 3.0], record["history"]
    assert all(p["checkpoint"] for p in record["history"]), record["history"]
    live = read_attempt(Storage(), storage_uri, 1, history=True).history  # as the Training view reads it
    assert [p["metrics"]["step"] for p in live] == [1.0, 2.0, 3.0], live


def test_lines_a_users_function_prints_with_the_runtimes_marks_do_not_decide_the_failure(
    airflow_db, ray_cluster, ray_hook, tmp_path, capfd
):
    """Its function arranges for an infrastructure verdict with the bare marks to end the job's log,
    after the runtime's own: the task still fails once, as the user's ValueError."""
    dag_id = "ahp_spoofed_marks"
    run = dag_test(dag_id, DAG_FILE, conf={"storage_path": str(tmp_path)})
    captured = capfd.readouterr()
    output = captured.out + captured.err
    assert run.state == "failed", output[-3000:]
    (job,) = jobs_of_dag(ray_hook, dag_id)
    log = ray_hook.get_job_logs(job["submission_id"])
    user_lines = log.rstrip().splitlines()[-2:]  # after the runtime's own
    assert [line.split(" ", 1)[0] for line in user_lines] == ["AHP_FAILURE", "AHP_ERROR"], log[-2000:]
    assert task_instances(dag_id) == [("evaluate", "failed", 1)], output[-3000:]  # retries=2: user code
    assert "user code: ValueError: the real bug" in output, output[-3000:]


def test_a_runtime_env_package_that_does_not_exist_is_configuration_and_fails_once(ray_hook, tmp_path):
    from airflow.providers.common.compat.sdk import AirflowFailException

    from airflow_provider_horovod.exceptions import ConfigurationError
    from airflow_provider_horovod.operators.ray import RayTaskOperator

    package = f"ahp-no-such-package-{uuid.uuid4().hex[:8]}"
    op = RayTaskOperator(
        task_id="train",
        python_callable="platform:python_version",
        deferrable=False,
        storage_path=str(tmp_path),
        runtime_env={"pip": [package]},
        poll_interval_seconds=0.5,
    )
    ti = FakeTI(f"noenv-{uuid.uuid4().hex[:6]}")
    with pytest.raises(ConfigurationError) as err:
        op.execute({"ti": ti})
    assert isinstance(err.value, AirflowFailException)  # not retried
    message = str(err.value)
    assert "RUNTIME_ENV_SETUP_FAILURE" in message, message
    assert package in message, message
    assert message.splitlines()[-1].startswith("What to do: fix what the task asks for")


@pytest.fixture
def own_head(tmp_path_factory, moto_server):
    """A Ray head of the test's own, to tear down while the test goes on."""
    state = str(tmp_path_factory.mktemp("own-head"))
    head = cluster.start_head(state, num_cpus=2)
    yield state, head
    cluster.down(state)


def test_a_retry_policy_on_the_infrastructure_class_is_honoured_and_the_reason_outlives_the_cluster(
    airflow_db, own_head, tmp_path, monkeypatch, capfd
):
    pytest.importorskip("airflow.sdk.definitions.retry_policy", reason="Airflow 3.3 has retry_policy")
    state, head = own_head
    dag_id = "ahp_retry_policy"
    monkeypatch.setenv("AIRFLOW_CONN_RAY_DEFAULT", cluster.connection(head))
    run = dag_test(dag_id, DAG_FILE, conf={"storage_path": str(tmp_path)})
    captured = capfd.readouterr()
    output = captured.out + captured.err
    assert run.state == "failed", output[-3000:]
    # Without the policy the killed driver (infrastructure) would be retried twice more.
    assert task_instances(dag_id) == [("lost", "failed", 1)], output[-3000:]
    assert "this team retries lost nodes by hand" in output
    (job,) = [j for j in _jobs(head) if j["metadata"].get("airflow_dag_id") == dag_id]
    storage_uri = job["metadata"]["ahp_storage_uri"]

    cluster.down(state)  # the cluster is torn down; the post-mortem stays beside the checkpoints
    record = ResultRecord.from_json(open(result_uri(storage_uri, 1)).read())
    assert record.failure["failure_class"] == "infrastructure"
    assert "driver was killed" in record.failure["summary"]
    assert record.submission_id == job["submission_id"]
    assert storage_uri == TaskRun(dag_id, "lost", job["metadata"]["airflow_run_id"]).storage_uri(str(tmp_path))


def _jobs(head: dict) -> list[dict]:
    import httpx

    response = httpx.get(f"{head['dashboard_url']}/api/jobs/", headers={"Authorization": f"Bearer {head['token']}"})
    response.raise_for_status()
    return response.json()
