"""Horovod on both trainer APIs (the provider's own V2 backend and Ray's legacy HorovodTrainer): resuming
after a worker is killed. Both across hosts, and GPU workers' devices: ``test_multihost.py``."""

from __future__ import annotations

import json
import os
import signal
import time
import uuid

import pytest

from harness.tasks import HUNG_S, FakeTI, checkpoints_registered, run_in_thread, wait_until

from .test_operator import make_operator

pytestmark = pytest.mark.integration

TRAINER_APIS = ["v2", "legacy"]


def train_until_killed(config):
    """Six epochs with a checkpoint each. In a run that did not resume, rank 1 stalls after epoch 2's
    report (so the test can kill it there); it writes its pid and progress for the test to see."""
    import hashlib
    import json
    import os
    import random
    import tempfile
    import time

    import horovod.torch as hvd
    import ray.train
    import torch
    from ray.train import Checkpoint

    hvd.init()
    restored, intact = None, None
    checkpoint = ray.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as folder, open(os.path.join(folder, "state.json")) as f:
            state = json.load(f)
            restored = state["epoch"]
            with open(os.path.join(folder, "weights.bin"), "rb") as w:
                intact = hashlib.sha256(w.read()).hexdigest() == state["weights_sha256"]
    start = 0 if restored is None else restored + 1
    for epoch in range(start, 6):
        total = hvd.allreduce(torch.tensor(float(epoch)), op=hvd.Sum, name=f"epoch{epoch}").item()
        metrics = {
            "epoch": epoch,
            "start_epoch": start,
            "restored_epoch": restored,
            "total": total,
            "restored_intact": intact,
        }
        if hvd.rank() == 0:
            with tempfile.TemporaryDirectory() as folder:
                # 24 MiB of weights: on S3 it goes up (and comes back) in parallel parts.
                weights = random.Random(epoch).randbytes(24 * 1024 * 1024)
                with open(os.path.join(folder, "weights.bin"), "wb") as w:
                    w.write(weights)
                with open(os.path.join(folder, "state.json"), "w") as f:
                    json.dump({"epoch": epoch, "weights_sha256": hashlib.sha256(weights).hexdigest()}, f)
                ray.train.report(metrics, checkpoint=Checkpoint.from_directory(folder))
        else:
            ray.train.report(metrics)
            progress = os.path.join(config["progress_dir"], "rank1.json")
            with open(progress + ".tmp", "w") as f:
                json.dump({"pid": os.getpid(), "epoch": epoch, "restored": restored, "at": time.time()}, f)
            os.replace(progress + ".tmp", progress)
            if restored is None and epoch == 2:
                time.sleep(120)  # killed here


def kill_rank1_at_epoch_2(progress_file, outcome, storage_uri: str | None = None, trainer_api: str = "auto") -> dict:
    """SIGKILL rank 1 once epoch 2's checkpoint is one a restart would resume from; its progress then, and
    when it was killed (``killed_at``, on the clock of its ``at``). On Train V2 (given ``storage_uri``):
    once Ray Train's controller holds it; otherwise ("auto" across Ray minors too) after a wait."""
    reached: dict[int, float] = {}  # when rank 1 reported each epoch

    def at_epoch_2():
        progress = json.loads(progress_file.read_text()) if progress_file.exists() else None
        if progress:
            reached[progress["epoch"]] = progress["at"]
        return progress if progress and progress["epoch"] == 2 else None

    # Until the task fails or rank 1 is at epoch 2: how long that takes is the machine's, not the code's.
    progress = wait_until(at_epoch_2, HUNG_S, "rank 1 at epoch 2", outcome)
    if trainer_api == "v2" and storage_uri:
        # Until Ray Train's controller holds epoch 2's checkpoint (rank 1 waits 120 s there).
        def held():
            return any(metrics.get("epoch") == 2 for metrics in checkpoints_registered(storage_uri))

        wait_until(held, HUNG_S, "epoch 2's checkpoint registered", outcome)
    else:
        # The legacy API writes no snapshot of what it holds (nor need every Ray minor's V2): it registers
        # a report when it polls the ranks; 5 s or, on a machine slow enough that an epoch takes longer, an
        # epoch's time.
        epoch_s = progress["at"] - reached.get(1, progress["at"])
        time.sleep(max(0.0, progress["at"] + max(5.0, epoch_s) - time.time()))
    os.kill(progress["pid"], signal.SIGKILL)
    return {**progress, "killed_at": time.time()}


@pytest.mark.parametrize("trainer_api", TRAINER_APIS)
def test_killed_worker_resumes_from_its_last_checkpoint(ray_cluster, tmp_path, trainer_api):
    progress_dir = tmp_path / "progress"
    progress_dir.mkdir()
    op = make_operator(
        tmp_path / "storage",
        train_fn=train_until_killed,
        trainer_api=trainer_api,
        max_failures=1,
        train_loop_config={"progress_dir": str(progress_dir)},
    )
    ti = FakeTI(f"kill-{trainer_api}-{uuid.uuid4().hex[:6]}")
    thread, outcome = run_in_thread(op, {"ti": ti})
    progress_file = progress_dir / "rank1.json"
    progress = kill_rank1_at_epoch_2(progress_file, outcome, ti.task_run.storage_uri(op.storage_path), trainer_api)

    thread.join(HUNG_S)
    assert not thread.is_alive(), "the task did not finish"
    assert "error" not in outcome, outcome.get("error")
    metrics = outcome["result"]["metrics"]
    # Resumed from epoch 2's checkpoint, not from scratch, and finished.
    assert (metrics["restored_epoch"], metrics["start_epoch"], metrics["epoch"]) == (2, 3, 5)
    assert metrics["total"] == 10.0  # both ranks' epoch 5, allreduced
    after = json.loads(progress_file.read_text())
    assert after["pid"] != progress["pid"]
    assert after["restored"] == 2


def test_retry_after_a_dead_worker_resumes_in_a_new_attempt(
    ray_cluster, moto_server, ray_hook, tmp_path, trainer_api="v2"
):
    """With max_failures=0 a dead worker fails the task, saying so; the retry (a new attempt) resumes
    from the failed attempt's last checkpoint (the same steps on both APIs: the attempt's folder is
    found by the operator, its checkpoint by the runtime). On S3: the checkpoint went up in parallel
    parts and comes back bit-identical. The cost counts both attempts, the failed one marked; the
    job_tags are the Ray jobs' metadata and come back in XCom."""
    import structlog.testing
    from airflow.providers.common.compat.sdk import AirflowFailException

    from airflow_provider_horovod.contract import result_uri
    from airflow_provider_horovod.exceptions import InfrastructureError
    from airflow_provider_horovod.storage import Storage

    progress_dir = tmp_path / "progress"
    progress_dir.mkdir()
    bucket = moto_server.make_bucket(f"ahp-resume-{uuid.uuid4().hex[:8]}")
    tags = {"team": "ranking", "model": "ctr", "cost_centre": "cc-4711"}
    op = make_operator(
        f"s3://{bucket}/runs",
        train_fn=train_until_killed,
        trainer_api=trainer_api,
        max_failures=0,
        train_loop_config={"progress_dir": str(progress_dir)},
        job_tags=tags,
        prices={"cpu_hour": 0.05, "currency": "USD"},
    )
    ti = FakeTI(f"retry-{trainer_api}-{uuid.uuid4().hex[:6]}")
    thread, outcome = run_in_thread(op, {"ti": ti})
    storage_uri = ti.task_run.storage_uri(op.storage_path)
    killed = kill_rank1_at_epoch_2(progress_dir / "rank1.json", outcome, storage_uri, trainer_api)
    thread.join(HUNG_S)
    error = outcome.get("error")
    assert isinstance(error, InfrastructureError), outcome
    assert not isinstance(error, AirflowFailException), outcome
    assert "infrastructure:" in str(error)
    assert error.failure["failure_class"] == "infrastructure"

    ti.try_number = 2
    with structlog.testing.capture_logs() as logged:  # the task log, as the operator writes it
        result = op.execute({"ti": ti})
    assert result["attempt"] == 2
    assert result["submission_id"].endswith("-a2")
    (first,) = result["attempts"]  # the failed attempt before it, with its class
    assert (first["attempt"], first["failure_class"]) == (1, "infrastructure")
    assert first["submission_id"].endswith("-a1")
    metrics = result["metrics"]
    assert (metrics["restored_epoch"], metrics["start_epoch"], metrics["epoch"]) == (2, 3, 5)
    assert metrics["restored_intact"] is True
    assert result["checkpoint_uri"].startswith(f"s3://{bucket}/runs/")
    assert "/attempt-2/" in result["checkpoint_uri"]
    key = result["checkpoint_uri"].split(f"s3://{bucket}/", 1)[1] + "/weights.bin"
    weights = moto_server.client().head_object(Bucket=bucket, Key=key)
    assert weights["ETag"].strip('"').endswith("-2")  # 24 MiB in 16 MiB parts

    # Tags: the Ray jobs' own metadata (what the dashboard and the Jobs API filter on), and back in XCom.
    jobs = [ray_hook.get_job_info(ti.task_run.submission_id(n)) for n in (1, 2)]
    assert all({k: job["metadata"][k] for k in tags} == tags for job in jobs)
    assert result["job_tags"] == tags
    assert ti.xcoms["ray_job"]["job_tags"] == tags
    # Cost: both attempts, from Ray's own times and the workers' starts; the failed one marked.
    cost = result["cost"]
    first_cost, second_cost = cost["attempts"]
    assert (first_cost["failed"], second_cost["failed"]) == (True, False)
    for job, spent in zip(jobs, cost["attempts"]):
        assert spent["wall_s"] == pytest.approx((job["end_time"] - job["start_time"]) / 1000, abs=0.01)
        assert 0 <= spent["queued_s"] < spent["wall_s"]
        assert spent["world_size"] == 2
        assert spent["worker_s"] == pytest.approx(2 * spent["held_s"], abs=0.01) == spent["cpu_s"]  # 1 CPU each
    # Attempt 1 held its 2 workers from before rank 1's epoch 2 to the kill, at least.
    assert first_cost["worker_s"] >= 2 * (killed["killed_at"] - killed["at"])
    # Attempt 2's workers were held for about the whole fit(): worker-seconds ~ world size x its wall time.
    fit_s = result["timings"]["fit_s"]
    assert 0.6 * 2 * fit_s <= second_cost["worker_s"] <= 2 * fit_s + 1, (second_cost, fit_s)
    total = cost["total"]
    assert total["worker_s"] == pytest.approx(first_cost["worker_s"] + second_cost["worker_s"], abs=0.01)
    assert total["failed_worker_s"] == first_cost["worker_s"]
    assert total["failed_attempts"] == 1
    assert total["amount"] == pytest.approx(total["cpu_s"] / 3600 * 0.05, abs=1e-5)
    # The same in the attempts' records, and as the task log's last line.
    assert Storage().read_json(result_uri(result["storage_uri"], 2))["cost"] == cost
    assert Storage().read_json(result_uri(result["storage_uri"], 1))["cost"]["attempts"] == [first_cost]
    events = [str(e.get("event")) for e in logged]
    (line,) = [e for e in events[-2:] if e.startswith("Cost: 2 attempt(s), wall ")]
    assert "1 failed attempt(s)" in line
    assert "USD" in line
