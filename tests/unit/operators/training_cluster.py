"""A training task run as the operators play it against a stand-in Ray cluster: the training
operator of a test, and a cluster that trains (leaves the checkpoint and the result record the
runtime would) or runs until the test moves it on. Shared by the operator tests of this folder and
tests/unit/test_lineage.py."""

from __future__ import annotations

import os

from airflow_provider_horovod.contract import SPEC_FILE, TaskRun
from airflow_provider_horovod.documents import ResultRecord, TrainingSpec
from airflow_provider_horovod.operators.horovod import HorovodTrainOperator
from airflow_provider_horovod.storage import Storage
from unit.fakes import RUN_ID, FakeRay, as_runtime_prints

GOOD_FN = "airflow_provider_horovod.examples.quickstart:train_func"


def operator(**kwargs) -> HorovodTrainOperator:
    kwargs.setdefault("train_fn", GOOD_FN)
    kwargs.setdefault("storage_path", "/tmp/ahp-unit")
    return HorovodTrainOperator(task_id="train", **kwargs)


TASK_RUN = TaskRun("dag", "train", RUN_ID)


def cluster_that_trains(*, ends="SUCCEEDED", log=("epoch 0", "epoch 1", "done"), exit_code=1):
    """Plays the Ray job of a submission: two polls RUNNING, then ``ends``; on success it leaves a
    checkpoint and the result record where the runtime would."""

    def on_submit(ray: FakeRay, call: dict):
        spec = TrainingSpec.from_json(call["payload"][SPEC_FILE].decode())
        if ends == "SUCCEEDED":
            write_result(call)
        meta = call["metadata"]
        ray.set_job(
            spec.submission_id,
            {"status": "RUNNING", "metadata": meta},
            {"status": "RUNNING", "metadata": meta},
            {
                "status": ends,
                "metadata": meta,
                "message": f"job {ends.lower()}",
                "error_type": None if ends == "SUCCEEDED" else "JOB_ENTRYPOINT_COMMAND_ERROR",
                "driver_exit_code": 0 if ends == "SUCCEEDED" else exit_code,
            },
        )
        text = as_runtime_prints("".join(f"{line}\n" for line in log), spec.mark_token)
        ray.logs[spec.submission_id] = [text[: len(text) // 2], text]

    return on_submit


def write_result(call: dict) -> None:
    """The checkpoint and the result record the runtime would leave for a submitted training."""
    spec = TrainingSpec.from_json(call["payload"][SPEC_FILE].decode())
    checkpoint = f"{spec.run_uri}/checkpoint_000001"
    os.makedirs(checkpoint)
    with open(f"{checkpoint}/model.pt", "wb") as f:
        f.write(b"weights")
    record = ResultRecord(
        submission_id=spec.submission_id,
        attempt=spec.attempt,
        storage_uri=spec.storage_uri,
        run_uri=spec.run_uri,
        checkpoint_uri=checkpoint,
        best_checkpoint_uri=None,
        metrics={"loss": 0.1},
        world_size=spec.num_workers,
        trainer_api=spec.trainer_api,
        resumed_from=spec.resume_from[0] if spec.resume_from else None,
    )
    Storage().write_bytes(spec.result_uri, record.to_json().encode())


def train_op(tmp_path, **kwargs):
    kwargs.setdefault("deferrable", False)
    return operator(storage_path=str(tmp_path), poll_interval_seconds=0.001, **kwargs)


def runs_until_told(log=("epoch 0", "epoch 1")):
    """A job that prints ``log`` and goes on RUNNING until the test moves it on."""

    def on_submit(ray: FakeRay, call: dict):
        ray.set_job(call["submission_id"], {"status": "RUNNING", "metadata": call["metadata"]})
        ray.logs[call["submission_id"]] = ["".join(f"{line}\n" for line in log)]

    return on_submit
