"""A real training for the Training view's browser tests: rank 0 reports every 1.5 s, so the view
shows reports while the job runs; ``val_loss`` comes (with a checkpoint) every third report only,
and ranks the checkpoints, of which Ray keeps 2. No torch: Ray Train and the provider's Horovod
backend are what runs."""

from __future__ import annotations

import pendulum
from airflow.sdk import dag, task


def report_slowly(reports: int = 12, pause_s: float = 1.5) -> dict:
    import os
    import tempfile
    import time

    import ray.train
    from ray.train import Checkpoint

    rank = ray.train.get_context().get_world_rank()
    for step in range(reports):
        time.sleep(pause_s)
        metrics = {"epoch": step, "loss": 1.0 / (step + 1)}
        if step % 3 != 2:
            ray.train.report(metrics)
            continue
        metrics["val_loss"] = 1.25 / (step + 1)
        with tempfile.TemporaryDirectory() as folder:
            if rank == 0:
                with open(os.path.join(folder, "model.txt"), "w") as f:
                    f.write(str(step))
            ray.train.report(metrics, checkpoint=Checkpoint.from_directory(folder) if rank == 0 else None)
    return {"reports": reports}


@dag(schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False)
def ahp_stack_view_training():
    task.horovod(
        task_id="train",
        num_workers=2,
        poll_interval_seconds=1,
        checkpoint_num_to_keep=2,
        checkpoint_score_attribute="val_loss",
        checkpoint_score_order="min",
    )(report_slowly)()


ahp_stack_view_training()
