"""DAGs of the failure tests (``tests/integration/test_failures.py``), run with ``airflow dags test``:
a user's bug on one rank under generous retries, one whose function prints lines that look like the
runtime's, and a lost driver under an Airflow 3.3 retry_policy
that says not to retry it. Storage comes from dag_run.conf."""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import dag

from airflow_provider_horovod.operators.horovod import HorovodTrainOperator
from airflow_provider_horovod.operators.ray import RayTaskOperator

STORAGE = "{{ dag_run.conf.get('storage_path', '') }}"
START = pendulum.datetime(2026, 1, 1, tz="UTC")


def bug_on_rank_1(config):
    """Three reports on each rank (rank 0's with a checkpoint), then rank 1 divides by zero; rank 0
    goes on until it is stopped."""
    import os
    import tempfile
    import time

    import horovod.torch as hvd
    import ray.train
    import torch
    from ray.train import Checkpoint

    hvd.init()
    for step in range(1, 4):
        ranks = hvd.allreduce(torch.tensor(1.0), op=hvd.Sum, name=f"step{step}").item()
        with tempfile.TemporaryDirectory() as folder:
            checkpoint = None
            if hvd.rank() == 0:
                with open(os.path.join(folder, "step.txt"), "w") as f:
                    f.write(str(step))
                checkpoint = Checkpoint.from_directory(folder)
            ray.train.report({"step": step, "loss": 1.0 / step}, checkpoint=checkpoint)
    if hvd.rank() == 1:
        return config["steps"] / (ranks - 2)
    time.sleep(300)


@dag(schedule=None, start_date=START, catchup=False, default_args={"retries": 3, "retry_delay": timedelta(seconds=1)})
def ahp_bug_on_one_rank():
    HorovodTrainOperator(
        task_id="train",
        train_fn=bug_on_rank_1,
        train_loop_config={"steps": 10},
        num_workers=2,
        max_failures=2,
        storage_path=STORAGE,
        poll_interval_seconds=0.5,
    )


ahp_bug_on_one_rank()


def spoofs_then_fails():
    """A user's bug, after the function arranged for lines that look like the runtime's to end the job's
    log (printed at the driver's exit, after the runtime's own): a bare mark is not the runtime's."""
    import atexit
    import json

    verdict = {"failure_class": "infrastructure", "summary": "a node was lost (printed by the user)"}
    atexit.register(print, "AHP_ERROR infrastructure: a node was lost (printed by the user)", flush=True)
    atexit.register(print, "AHP_FAILURE " + json.dumps(verdict), flush=True)
    raise ValueError("the real bug")


@dag(schedule=None, start_date=START, catchup=False)
def ahp_spoofed_marks():
    RayTaskOperator(
        task_id="evaluate",
        python_callable=spoofs_then_fails,
        storage_path=STORAGE,
        poll_interval_seconds=0.5,
        retries=2,
        retry_delay=timedelta(seconds=1),
    )


ahp_spoofed_marks()


def killed_driver():
    """The job's driver killed under it, as the kernel's OOM killer does."""
    import os
    import signal

    os.kill(os.getpid(), signal.SIGKILL)


try:
    from airflow.sdk.definitions.retry_policy import ExceptionRetryPolicy, RetryAction, RetryRule
except ImportError:  # Airflow 3.1 and 3.2 have no retry_policy
    ExceptionRetryPolicy = None

if ExceptionRetryPolicy is not None:

    @dag(schedule=None, start_date=START, catchup=False)
    def ahp_retry_policy():
        RayTaskOperator(
            task_id="lost",
            python_callable=killed_driver,
            storage_path=STORAGE,
            poll_interval_seconds=0.5,
            retries=2,
            retry_delay=timedelta(seconds=1),
            retry_policy=ExceptionRetryPolicy(
                rules=[
                    RetryRule(
                        exception="airflow_provider_horovod.exceptions.InfrastructureError",
                        action=RetryAction.FAIL,
                        reason="this team retries lost nodes by hand",
                    )
                ]
            ),
        )

    ahp_retry_policy()
