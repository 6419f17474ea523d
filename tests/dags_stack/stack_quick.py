"""A training task (deferred by default) whose job is the quick stand-in (``tests/support/quick.py``), running
until stopped: for the kill through the REST API. Its own file: the stand-in is swapped in only
where this file is parsed."""

from __future__ import annotations

import sys
from pathlib import Path

import pendulum
from airflow.sdk import dag

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from support.quick import use_quick_jobs  # noqa: E402

from airflow_provider_horovod.operators.horovod import HorovodTrainOperator  # noqa: E402

use_quick_jobs()


@dag(schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False)
def ahp_stack_quick():
    HorovodTrainOperator(
        task_id="train",
        train_fn="airflow_provider_horovod.examples.quickstart:train_func",
        num_workers=2,
        poll_interval_seconds=1,
        train_loop_config={"quick_lines": 600, "quick_line_s": 1},
    )


ahp_stack_quick()
