"""Horovod on both trainer APIs (the provider's own V2 backend and Ray's legacy HorovodTrainer):
across two Ray nodes with Horovod's cross ranks really used, and resuming after a worker is killed."""

from __future__ import annotations

import json
import os
import signal
import time
import uuid

import pytest

from harness import cluster
from harness.tasks import FakeTI, run_in_thread

from .test_operator import make_operator

pytestmark = pytest.mark.integration

TRAINER_APIS = ["v2", "legacy"]
TWO_NODE_CONN = "ray_two_nodes"


@pytest.fixture(scope="module")
def two_nodes(ray_cluster, tmp_path_factory):
    """A cluster of its own: a head and a second node joined with `ray start --address` under a host
    name of its own (as on a second machine), each with one `ahp_slot`, so two workers asking for a
    slot each land on different nodes. The second node also declares two GPUs (Ray schedules them
    and sets CUDA_VISIBLE_DEVICES though the machine has none)."""
    from airflow_provider_horovod.hooks.ray import RayHook

    state = str(tmp_path_factory.mktemp("two-nodes"))
    slot = ("--resources", json.dumps({"ahp_slot": 1}))
    head = cluster.start_head(state, num_cpus=2, extra_args=slot, joinable=True)
    try:
        cluster.join_node(state, head, num_cpus=2, num_gpus=2, extra_args=slot, hostname="ahp-second-node")
        # With two clusters on one machine, Ray's state API (used by Train V2's placement-group
        # cleaner) needs to be told which one is its own; the connection's default runtime_env does.
        os.environ[f"AIRFLOW_CONN_{TWO_NODE_CONN.upper()}"] = cluster.connection(
            head, extra={"runtime_env": {"env_vars": {"RAY_ADDRESS": head["gcs_address"]}}}
        )
        hook = RayHook(ray_conn_id=TWO_NODE_CONN)
        deadline = time.monotonic() + 60
        while hook.get_cluster_resources().get("ahp_slot", 0) < 2:
            assert time.monotonic() < deadline, "the second node never joined"
            time.sleep(1)
        yield hook
    finally:
        os.environ.pop(f"AIRFLOW_CONN_{TWO_NODE_CONN.upper()}", None)
        cluster.down(state)


def allreduce_probe(config):
    """Every rank contributes rank + 1; the ranks report what Horovod and Ray saw."""
    import json
    import os
    import socket
    import tempfile

    import horovod.torch as hvd
    import ray
    import ray.train
    import torch
    from ray.train import Checkpoint

    hvd.init()
    summed = hvd.allreduce(torch.tensor([hvd.rank() + 1.0, 10.0 * (hvd.rank() + 1)]), op=hvd.Sum, name="probe")
    averaged = hvd.allreduce(torch.tensor(float(hvd.rank())), op=hvd.Average, name="avg")
    seen = hvd.allgather_object(
        {
            "rank": hvd.rank(),
            "local_rank": hvd.local_rank(),
            "cross_rank": hvd.cross_rank(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "host": socket.gethostname(),
            "world_rank": ray.train.get_context().get_world_rank(),
        }
    )
    metrics = {
        "sum": summed.tolist(),
        "average": averaged.item(),
        "size": hvd.size(),
        "local_size": hvd.local_size(),
        "cross_size": hvd.cross_size(),
        "ranks": json.dumps(seen),
    }
    if hvd.rank() == 0:
        with tempfile.TemporaryDirectory() as folder:
            with open(os.path.join(folder, "probe.json"), "w") as f:
                json.dump(metrics, f)
            ray.train.report(metrics, checkpoint=Checkpoint.from_directory(folder))
    else:
        ray.train.report(metrics)


@pytest.mark.parametrize("trainer_api", TRAINER_APIS)
def test_horovod_across_two_nodes(two_nodes, tmp_path, trainer_api):
    op = make_operator(
        tmp_path,
        train_fn=allreduce_probe,
        trainer_api=trainer_api,
        ray_conn_id=TWO_NODE_CONN,
        resources_per_worker={"CPU": 1, "ahp_slot": 1},
    )
    ti = FakeTI(f"nodes-{trainer_api}-{uuid.uuid4().hex[:6]}")
    result = op.execute({"ti": ti})
    metrics = result["metrics"]
    assert metrics["sum"] == [3.0, 30.0] and metrics["average"] == 0.5
    assert (metrics["size"], metrics["local_size"], metrics["cross_size"]) == (2, 1, 2)
    ranks = sorted(json.loads(metrics["ranks"]), key=lambda r: r["rank"])
    assert len({r["node_id"] for r in ranks}) == 2  # one worker on each node
    assert "ahp-second-node" in {r["host"] for r in ranks}
    assert [(r["rank"], r["world_rank"], r["local_rank"], r["cross_rank"]) for r in ranks] == [
        (0, 0, 0, 0),
        (1, 1, 0, 1),
    ]
    assert result["world_size"] == 2 and result["trainer_api"] == trainer_api
    assert os.path.isfile(os.path.join(result["checkpoint_uri"], "probe.json"))


def gpu_visibility_probe(config):
    """What each rank would hand to torch.cuda.set_device(hvd.local_rank()): the devices it sees."""
    import json
    import os
    import tempfile

    import horovod.torch as hvd
    import ray
    import ray.train
    from ray.train import Checkpoint

    hvd.init()
    seen = hvd.allgather_object(
        {
            "rank": hvd.rank(),
            "local_rank": hvd.local_rank(),
            "visible": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
            "assigned": ray.get_runtime_context().get_accelerator_ids()["GPU"],
            "node_id": ray.get_runtime_context().get_node_id(),
        }
    )
    metrics = {"ranks": json.dumps(seen)}
    if hvd.rank() == 0:
        with tempfile.TemporaryDirectory() as folder:
            with open(os.path.join(folder, "seen.json"), "w") as f:
                json.dump(seen, f)
            ray.train.report(metrics, checkpoint=Checkpoint.from_directory(folder))
    else:
        ray.train.report(metrics)


def test_gpu_workers_of_a_node_each_see_all_its_gpus(two_nodes, tmp_path, trainer_api="v2"):
    """Horovod pins one GPU per local rank, so every GPU worker of a node must see the node's GPUs
    (not only the one Ray gave it), as Ray's own HorovodTrainer arranges (the provider's V2 backend
    does it too; the legacy trainer is Ray's own code)."""
    op = make_operator(
        tmp_path,
        train_fn=gpu_visibility_probe,
        trainer_api=trainer_api,
        ray_conn_id=TWO_NODE_CONN,
        use_gpu=True,
        resources_per_worker={"CPU": 1, "GPU": 1},
    )
    result = op.execute({"ti": FakeTI(f"gpus-{trainer_api}-{uuid.uuid4().hex[:6]}")})
    ranks = sorted(json.loads(result["metrics"]["ranks"]), key=lambda r: r["rank"])
    assert len({r["node_id"] for r in ranks}) == 1  # the node with the GPUs holds both workers
    assert sorted(g for r in ranks for g in r["assigned"]) == ["0", "1"]  # one GPU each
    for rank in ranks:
        visible = rank["visible"].split(",")
        assert sorted(visible) == ["0", "1"], ranks
        assert rank["local_rank"] < len(visible)  # set_device(local_rank) has a device to pin


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


def kill_rank1_at_epoch_2(progress_file, outcome) -> dict:
    deadline = time.monotonic() + 240
    progress = None
    while time.monotonic() < deadline and not (progress and progress["epoch"] == 2):
        time.sleep(0.5)
        if progress_file.exists():
            progress = json.loads(progress_file.read_text())
    assert progress and progress["epoch"] == 2, f"training never reached epoch 2: {progress} {outcome}"
    # Ray Train V2 registers a report only when it polls all ranks (every 2 s): let it see epoch 2's.
    time.sleep(max(0.0, progress["at"] + 5 - time.time()))
    os.kill(progress["pid"], signal.SIGKILL)
    return progress


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
    thread, outcome = run_in_thread(op, {"ti": FakeTI(f"kill-{trainer_api}-{uuid.uuid4().hex[:6]}")})
    progress_file = progress_dir / "rank1.json"
    progress = kill_rank1_at_epoch_2(progress_file, outcome)

    thread.join(300)
    assert not thread.is_alive(), "the task did not finish"
    assert "error" not in outcome, outcome.get("error")
    metrics = outcome["result"]["metrics"]
    # Resumed from epoch 2's checkpoint, not from scratch, and finished.
    assert (metrics["restored_epoch"], metrics["start_epoch"], metrics["epoch"]) == (2, 3, 5)
    assert metrics["total"] == 10.0  # both ranks' epoch 5, allreduced
    after = json.loads(progress_file.read_text())
    assert after["pid"] != progress["pid"] and after["restored"] == 2


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
    kill_rank1_at_epoch_2(progress_dir / "rank1.json", outcome)
    thread.join(300)
    error = outcome.get("error")
    assert isinstance(error, InfrastructureError) and not isinstance(error, AirflowFailException), outcome
    assert "infrastructure:" in str(error) and error.failure["failure_class"] == "infrastructure"

    ti.try_number = 2
    with structlog.testing.capture_logs() as logged:  # the task log, as the operator writes it
        result = op.execute({"ti": ti})
    assert result["attempt"] == 2 and result["submission_id"].endswith("-a2")
    (first,) = result["attempts"]  # the failed attempt before it, with its class
    assert (first["attempt"], first["failure_class"]) == (1, "infrastructure")
    assert first["submission_id"].endswith("-a1")
    metrics = result["metrics"]
    assert (metrics["restored_epoch"], metrics["start_epoch"], metrics["epoch"]) == (2, 3, 5)
    assert metrics["restored_intact"] is True
    assert result["checkpoint_uri"].startswith(f"s3://{bucket}/runs/") and "/attempt-2/" in result["checkpoint_uri"]
    key = result["checkpoint_uri"].split(f"s3://{bucket}/", 1)[1] + "/weights.bin"
    weights = moto_server.client().head_object(Bucket=bucket, Key=key)
    assert weights["ETag"].strip('"').endswith("-2")  # 24 MiB in 16 MiB parts

    # Tags: the Ray jobs' own metadata (what the dashboard and the Jobs API filter on), and back in XCom.
    jobs = [ray_hook.get_job_info(ti.task_run.submission_id(n)) for n in (1, 2)]
    assert all({k: job["metadata"][k] for k in tags} == tags for job in jobs)
    assert result["job_tags"] == tags and ti.xcoms["ray_job"]["job_tags"] == tags
    # Cost: both attempts, from Ray's own times and the workers' starts; the failed one marked.
    cost = result["cost"]
    first_cost, second_cost = cost["attempts"]
    assert (first_cost["failed"], second_cost["failed"]) == (True, False)
    for job, spent in zip(jobs, cost["attempts"]):
        assert spent["wall_s"] == pytest.approx((job["end_time"] - job["start_time"]) / 1000, abs=0.01)
        assert 0 <= spent["queued_s"] < spent["wall_s"] and spent["world_size"] == 2
        assert spent["worker_s"] == pytest.approx(2 * spent["held_s"], abs=0.01) == spent["cpu_s"]  # 1 CPU each
    # Attempt 1 held its 2 workers through epochs 0-2 and the 5 s before the kill, at least.
    assert first_cost["worker_s"] >= 2 * 5
    # Attempt 2's workers were held for about the whole fit(): worker-seconds ~ world size x its wall time.
    fit_s = result["timings"]["fit_s"]
    assert 0.6 * 2 * fit_s <= second_cost["worker_s"] <= 2 * fit_s + 1, (second_cost, fit_s)
    total = cost["total"]
    assert total["worker_s"] == pytest.approx(first_cost["worker_s"] + second_cost["worker_s"], abs=0.01)
    assert total["failed_worker_s"] == first_cost["worker_s"] and total["failed_attempts"] == 1
    assert total["amount"] == pytest.approx(total["cpu_s"] / 3600 * 0.05, abs=1e-5)
    # The same in the attempts' records, and as the task log's last line.
    assert Storage().read_json(result_uri(result["storage_uri"], 2))["cost"] == cost
    assert Storage().read_json(result_uri(result["storage_uri"], 1))["cost"]["attempts"] == [first_cost]
    events = [str(e.get("event")) for e in logged]
    (line,) = [e for e in events[-2:] if e.startswith("Cost: 2 attempt(s), wall ")]
    assert "1 failed attempt(s)" in line and "USD" in line
