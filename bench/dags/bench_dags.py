"""DAGs the benchmarks run through `airflow dags test` and on a deployment, as users and their CI do: the
operator timed (figures 1, 2, 6 and 10), a script (figure 9), Airflow's floor, and a hand-written poller (figure 2)."""

from __future__ import annotations

import json
import os
import random
import time

import pendulum
from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import dag

from airflow_provider_horovod.operators.horovod import HorovodTrainOperator
from bench.workload import fixed_work, train_mlp

# Ray Train's actors find their own cluster through this, not the test suite's (see bench.common).
RAY_ADDRESS = os.environ.get("BENCH_RAY_ADDRESS")
RUNTIME_ENV = {"env_vars": {"RAY_ADDRESS": RAY_ADDRESS}} if RAY_ADDRESS else None
TRAIN_CONFIG = json.loads(os.environ.get("BENCH_TRAIN_CONFIG") or "{}")
START = pendulum.datetime(2026, 1, 1, tz="UTC")
# Where the timed operator notes when it starts and when it has the result (bench.common.operator_times reads it).
TIMINGS_FILE = os.environ.get("BENCH_TIMINGS_FILE")


class TimedHorovodTrainOperator(HorovodTrainOperator):
    """The operator as it is, noting when it starts and when it returns the result, so Airflow's own task start-up
    stays out of the measurement; to a file, as a deferred task's ``execute_complete`` runs on a new instance."""

    def _note(self, context, event: str) -> None:
        note = {"dag_id": self.dag_id, "run_id": context["ti"].run_id, "event": event, "t": time.time()}
        if TIMINGS_FILE:
            with open(TIMINGS_FILE, "a") as f:
                f.write(json.dumps(note) + "\n")

    def execute(self, context):
        self._note(context, "start")
        result = super().execute(context)  # deferred: raises TaskDeferred here
        self._note(context, "done")
        return result

    def execute_complete(self, context, event):
        result = super().execute_complete(context, event)
        self._note(context, "done")
        return result


class DeferredAtOnce(TimedHorovodTrainOperator):
    """Defers as soon as the job is submitted: at the default, a job this short would end within the
    worker's first seconds (``sync_wait_before_defer_s``) and never defer."""

    sync_wait_before_defer_s = 0.0


def _train_dag(deferrable: bool, trainer_api: str):
    dag_id = f"bench_train_{'deferred' if deferrable else 'sync'}_{trainer_api}"

    @dag(dag_id=dag_id, schedule=None, start_date=START, catchup=False, tags=["bench"])
    def build():
        operator = DeferredAtOnce if deferrable else TimedHorovodTrainOperator
        operator(
            task_id="train",
            train_fn=train_mlp,
            train_loop_config=TRAIN_CONFIG,
            num_workers=2,
            trainer_api=trainer_api,
            deferrable=deferrable,
            runtime_env=RUNTIME_ENV,
            checkpoint_num_to_keep=2,
        )

    return build()


for _deferrable, _api in ((False, "legacy"), (True, "legacy"), (True, "v2")):  # the ways of bench/runs.py
    _train_dag(_deferrable, _api)


class FixedCostOperator(TimedHorovodTrainOperator):
    """Figure 10's "following" way sets how long the task follows its job in the worker before deferring."""

    if os.environ.get("BENCH_FIXEDCOST_SYNC_WAIT_S"):
        sync_wait_before_defer_s = float(os.environ["BENCH_FIXEDCOST_SYNC_WAIT_S"])


@dag(dag_id="bench_fixedcost", schedule=None, start_date=START, catchup=False, tags=["bench"])
def bench_fixedcost():
    """Figure 10: the operator as users get it (its defaults), on figure 9's two hosts."""
    FixedCostOperator(
        task_id="train",
        train_fn=fixed_work,
        train_loop_config={**json.loads(os.environ.get("BENCH_FIXEDCOST_WORK") or "{}"), "ray": True},
        num_workers=2,
        resources_per_worker={"CPU": 2},
        ray_conn_id=os.environ.get("BENCH_FIXEDCOST_CONN") or "ray_default",
        storage_path=os.environ.get("BENCH_FIXEDCOST_STORAGE"),
        runtime_env=RUNTIME_ENV,  # the hosts' cluster (bench/fixedcost.py sets BENCH_RAY_ADDRESS)
    )


bench_fixedcost()


@dag(dag_id="bench_fixedcost_floor", schedule=None, start_date=START, catchup=False, tags=["bench"])
def bench_fixedcost_floor():
    """Figure 10's floor: one task of Airflow's own that does nothing, run the same ways as the training."""
    PythonOperator(task_id="nothing", python_callable=lambda: None)


bench_fixedcost_floor()


@dag(dag_id="bench_script", schedule=None, start_date=START, catchup=False, tags=["bench"])
def bench_script():
    """Figure 9: the benchmark script, unchanged, as a deployment's task on figure 9's two hosts."""
    HorovodTrainOperator(
        task_id="train",
        train_script="../scripts/synthetic_benchmark.py",
        script_args=json.loads(os.environ.get("BENCH_SCRIPT_ARGS") or "[]"),
        num_workers=2,
        resources_per_worker={"CPU": 2},
        ray_conn_id=os.environ.get("BENCH_SCRIPT_CONN") or "ray_default",
        storage_path=os.environ.get("BENCH_SCRIPT_STORAGE"),
        runtime_env=RUNTIME_ENV,  # the hosts' cluster (bench/multihost.py sets BENCH_RAY_ADDRESS)
    )


bench_script()


def handwritten_wait(interval_s: float, job_s: float, tag: str, ti=None) -> str:
    """A hand-written wait: submit, then sleep `interval_s` between status checks."""
    from ray.job_submission import JobStatus, JobSubmissionClient

    from airflow_provider_horovod.local import ensure_running

    cluster = ensure_running()
    client = JobSubmissionClient(cluster.dashboard_url, headers={"Authorization": f"Bearer {cluster.token}"})
    submission_id = client.submit_job(
        entrypoint=f"python -c 'import time; time.sleep({job_s})'",
        metadata={"bench": "handwritten", "tag": tag, "run_id": ti.run_id, "map_index": str(ti.map_index)},
    )
    while client.get_job_status(submission_id) not in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
        time.sleep(interval_s)
    return submission_id


def _latency_plan() -> list[dict]:
    """(interval, job length) per mapped task: the job's length gets a random phase against the
    poll interval, as real jobs have; fixed seed, so every run measures the same plan."""
    rng = random.Random(7)
    plan = []
    repeats = int(os.environ.get("BENCH_LATENCY_REPEATS") or 5)
    for interval in [float(x) for x in (os.environ.get("BENCH_LATENCY_INTERVALS") or "1,10").split(",")]:
        for i in range(repeats):
            job_s = round(1 + rng.uniform(0, interval), 2)
            plan.append({"interval_s": interval, "job_s": job_s, "tag": f"every-{interval:g}s-{i}"})
    return plan


@dag(dag_id="bench_handwritten_poll", schedule=None, start_date=START, catchup=False, tags=["bench"])
def bench_handwritten_poll():
    PythonOperator.partial(task_id="wait", python_callable=handwritten_wait).expand(op_kwargs=_latency_plan())


bench_handwritten_poll()
