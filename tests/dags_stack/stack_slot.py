"""Two runs' trainings under a task-level limit (``max_active_tis_per_dag=1``), whose quick jobs would
defer at once: the one whose job ended must finish then, not after the other run's training (a
resume needs the slot again, and the waiting task instance of an earlier logical date comes first)."""

from __future__ import annotations

import sys
from pathlib import Path

import pendulum
from airflow.sdk import dag

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from support.quick import use_quick_jobs  # noqa: E402

from airflow_provider_horovod.operators.horovod import HorovodTrainOperator  # noqa: E402

use_quick_jobs()


class DefersAtOnce(HorovodTrainOperator):
    """Defers as soon as its job is submitted, as a long training does after its first seconds."""

    sync_wait_before_defer_s = 0.0


@dag(schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False, max_active_runs=2)
def ahp_stack_slot():
    DefersAtOnce(
        task_id="train",
        train_fn="airflow_provider_horovod.examples.quickstart:train_func",
        num_workers=2,
        poll_interval_seconds=1,
        max_active_tis_per_dag=1,
        train_loop_config={"quick_lines": 12, "quick_line_s": 1},
    )


ahp_stack_slot()
