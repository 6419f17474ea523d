"""Horovod across hosts, through the operator: network namespaces made by the test
(``harness/hosts.py``), each with its own address, host name, Debian's /etc/hosts (its own name on
127.0.1.1) and its own interface names (eth0 on host 1, ens5 on host 2, and eth1 on a second network),
a Ray node on each (head with token auth on host 1, 10.77.0.1), and an S3 server (moto) on the root
namespace's address of the hosts' network. The operator runs in this process, as Airflow's worker
would, against the head's dashboard.

The tests share one cluster and run in order: the elastic test that loses host 2 leaves it down, the
next one brings it back; the last gives host 2 a Ray node with GPUs.
"""

from __future__ import annotations

import os
import time
import uuid

import pytest

from airflow_provider_horovod.contract import attempt_uri, worker_groups_uri
from harness import hosts as testhosts
from harness.tasks import HUNG_S, FakeTI, JobWatch, checkpoints_registered, run_in_thread, storage, wait_until

pytestmark = pytest.mark.integration

CONN_ID = "ray_multihost"
BUCKET = "multihost"
STORAGE = f"s3://{BUCKET}/runs"


# -- what the ranks run (pickled by value with the operator) -----------------------------------------


def allreduce_probe(config):
    """``inits`` times hvd.init() (hvd.shutdown() between, as test suites and phased trainings do), an
    allreduce checked after each; what every rank saw, Horovod's ranks and Ray's."""
    import os
    import socket
    import sys

    ready = "horovod.torch" in sys.modules  # imported before the function started: by the backend (Train V2)

    import horovod.torch as hvd
    import ray
    import ray.train
    import torch

    for i in range(config["inits"]):
        if i:
            hvd.shutdown()
        hvd.init()
        summed = hvd.allreduce(torch.tensor([hvd.rank() + 1.0, 10.0 * (hvd.rank() + 1)]), op=hvd.Sum, name=f"s{i}")
        n = hvd.size()
        assert summed.tolist() == [n * (n + 1) / 2, 10.0 * n * (n + 1) / 2], summed
    seen = hvd.allgather_object(
        {
            "rank": hvd.rank(),
            "host": socket.gethostname(),
            "sum": summed.tolist(),
            "size": hvd.size(),
            "gloo_iface": os.environ.get("HOROVOD_GLOO_IFACE"),
            "ranks": (hvd.rank(), ray.train.get_context().get_world_rank(), hvd.local_rank(), hvd.cross_rank()),
            "sizes": (hvd.size(), hvd.local_size(), hvd.cross_size()),
            "node_id": ray.get_runtime_context().get_node_id(),
            "horovod_ready": ready,
        }
    )
    report_checkpoint(hvd.rank(), {"inits": config["inits"]})
    return seen


def report_checkpoint(rank, state):
    """Rank 0's checkpoint of ``state``, reported by every rank (the operator wants a checkpoint)."""
    import json
    import os
    import tempfile

    import ray.train
    from ray.train import Checkpoint

    with tempfile.TemporaryDirectory() as folder:
        checkpoint = None
        if rank == 0:
            with open(os.path.join(folder, "state.json"), "w") as f:
                json.dump(state, f)
            checkpoint = Checkpoint.from_directory(folder)
        ray.train.report(state, checkpoint=checkpoint)


def elastic_train(config):
    """Steps of an allreduce checked against the world size of the moment, each reported with a
    checkpoint (rank 0's) of the step and the running total. A worker group that did not resume from a
    checkpoint steps until it is replaced (the test takes a host away or brings one back); one that
    resumed runs ``steps`` more and returns. The total gains exactly 1 a step whatever the size, so a
    correct run ends with total == its steps, however fast the machine."""
    import json
    import os
    import time

    import horovod.torch as hvd
    import ray.train
    import torch

    hvd.init()
    size, step, total = hvd.size(), 0, 0.0
    if checkpoint := ray.train.get_checkpoint():
        with checkpoint.as_directory() as folder, open(os.path.join(folder, "state.json")) as f:
            state = json.load(f)
        step, total = state["step"], state["total"]
    resumed_at = step
    while not checkpoint or step < resumed_at + config["steps"]:
        summed = hvd.allreduce(torch.tensor([hvd.rank() + 1.0]), op=hvd.Sum, name=f"step{step}").item()
        if summed != size * (size + 1) / 2:
            raise AssertionError(f"allreduce at size {size} gave {summed}")
        total += summed / (size * (size + 1) / 2)
        step += 1
        time.sleep(config["step_s"])
        report_checkpoint(hvd.rank(), {"step": step, "size": size, "total": total})
    return {"total": total, "steps": step, "size": size, "resumed_at": resumed_at}


def resumed_right(value: dict, steps: int) -> None:
    """``elastic_train``'s return: resumed from a checkpoint, then ``steps`` more, the total exact."""
    assert value["resumed_at"] > 0, value  # from a checkpoint, not from scratch
    assert value["steps"] == value["resumed_at"] + steps, value
    assert value["total"] == value["steps"], value


# -- the cluster ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(monkeypatch_module):
    """Two Debian-style hosts, interfaces named eth0 and ens5 (and eth1 on a second network), moto
    on the root namespace's address, a Ray node of 2 CPUs on each, the operator's connection set."""
    testhosts.skip_unless_available()
    if not os.path.exists(testhosts.cluster_python()):
        pytest.skip(f"no cluster environment at {testhosts.cluster_python()}")
    from harness.cluster import connection
    from harness.s3 import MotoServer

    hosts = testhosts.Hosts(2, ifaces=("eth0", "ens5"), data_ifaces=("eth1", "eth1"), etc_hosts=testhosts.DEBIAN)
    moto = None
    try:
        hosts.up()
        moto = MotoServer(hosts.root_address).start()
        s3 = moto.env()
        hosts.extra_env.update(s3)  # the Ray nodes' own environment, as a cluster's instance role would give
        for key, value in s3.items():
            monkeypatch_module.setenv(key, value)
        moto.make_bucket(BUCKET)
        hosts.start_cluster(num_cpus=2)
        head = {"dashboard_url": hosts.dashboard_url, "token": hosts.token}
        monkeypatch_module.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", connection(head, shared_storage=False))
        yield hosts
    finally:
        hosts.down()
        if moto is not None:
            moto.stop()


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def ensure_nodes(hosts: testhosts.Hosts, count: int) -> None:
    """Host 2's Ray node up (count 2) or stopped (count 1): one node of 2 CPUs per host, as the tests'
    placements assume (two nodes on host 2 would take both 2-CPU workers there). A host whose machine was
    lost has no process left, though Ray lists its node alive until it has missed its heartbeats."""
    alive = wait_until(hosts.alive_nodes, HUNG_S, "the head's dashboard to list its nodes")  # [] when it did not answer
    if count == 2 and (hosts[1].address not in alive or not hosts.pids(hosts[1])):
        hosts.join(hosts[1], num_cpus=2)
    elif count == 1 and hosts[1].address in alive:
        hosts.stop_ray(hosts[1])
    expected = sorted(h.address for h in hosts.hosts[:count])
    wait_until(lambda: hosts.alive_nodes() == expected, HUNG_S, f"exactly the nodes {expected}")


def operator(hosts: testhosts.Hosts, train_fn, **kwargs):
    from airflow_provider_horovod.operators.horovod import HorovodTrainOperator

    # RAY_ADDRESS: Train V2's placement-group cleaner must find this cluster, not another on the machine.
    kwargs.setdefault("runtime_env", {"env_vars": {"RAY_ADDRESS": hosts.gcs_address}})
    return HorovodTrainOperator(
        task_id="train",
        train_fn=train_fn,
        ray_conn_id=CONN_ID,
        deferrable=False,
        poll_interval_seconds=0.5,
        storage_path=STORAGE,
        **kwargs,
    )


def groups_started(ti: FakeTI) -> list[dict]:
    """Rank 0's notes of the worker groups of the task run's first attempt, as they are written."""
    return storage().read_json(worker_groups_uri(attempt_uri(ti.task_run.storage_uri(STORAGE), 1))) or []


def registered(ti: FakeTI) -> list[dict]:
    """The checkpoints of the task run's first attempt that Ray Train's controller holds."""
    return checkpoints_registered(ti.task_run.storage_uri(STORAGE))


# -- the tests ---------------------------------------------------------------------------------------


def test_debian_hosts_with_differently_named_interfaces_train_without_horovod_nics(cluster):
    """Host names on 127.0.1.1, eth0 on one host and ens5 on the other, no horovod_nics: each rank's Gloo
    takes the interface of Ray's address for its node; Horovod re-initialised 20 times across the hosts."""
    ensure_nodes(cluster, 2)
    ti = FakeTI(f"debian-{uuid.uuid4().hex[:6]}")
    result = operator(
        cluster, allreduce_probe, num_workers=2, resources_per_worker={"CPU": 2}, train_loop_config={"inits": 20}
    ).execute({"ti": ti})
    ranks = one_rank_per_host(result)
    assert (ranks["ahp-node1"]["gloo_iface"], ranks["ahp-node2"]["gloo_iface"]) == ("eth0", "ens5")
    assert [s["reason"] for s in result["segments"]] == ["start"]
    # Every rank had Horovod imported before its function started, so no rank's hvd.init() waited on a peer
    # still importing torch (on a loaded host, that wait outlasted Gloo's timeout and aborted the workers).
    assert [r["horovod_ready"] for r in ranks.values()] == [True, True], ranks


def one_rank_per_host(result: dict) -> dict:
    """The probe's ranks by host, checked: one rank on each host, the sums right, Horovod's cross ranks
    used (local size 1, cross size 2) and its ranks Ray Train's world ranks; a checkpoint in S3."""
    ranks = {r["host"]: r for r in result["return_value"]}
    assert sorted(ranks) == ["ahp-node1", "ahp-node2"], result["return_value"]
    assert len({r["node_id"] for r in ranks.values()}) == 2, ranks
    assert all(r["sum"] == [3.0, 30.0] and r["sizes"] == [2, 1, 2] for r in ranks.values()), ranks
    # (Horovod's rank, Ray Train's world rank, local rank, cross rank)
    assert sorted(r["ranks"] for r in ranks.values()) == [[0, 0, 0, 0], [1, 1, 0, 1]], ranks
    assert result["world_size"] == 2
    assert result["checkpoint_uri"].startswith(f"s3://{BUCKET}/runs/")
    return ranks


def test_rays_legacy_horovod_trainer_trains_across_the_hosts(cluster):
    """trainer_api="legacy" (Ray's own HorovodTrainer, which picks Gloo's interface by itself): one rank
    on each host, Horovod's cross ranks used, the checkpoint in S3."""
    ensure_nodes(cluster, 2)
    ti = FakeTI(f"legacy-{uuid.uuid4().hex[:6]}")
    result = operator(
        cluster,
        allreduce_probe,
        trainer_api="legacy",
        num_workers=2,
        resources_per_worker={"CPU": 2},
        train_loop_config={"inits": 1},
    ).execute({"ti": ti})
    one_rank_per_host(result)
    assert result["trainer_api"] == "legacy"


def test_elastic_training_loses_a_host_and_finishes_smaller_from_its_checkpoint(cluster):
    """(2, 4) workers of 1 CPU: 4 ranks on the two hosts; host 2's machine goes away mid-run (SIGKILL to
    every process, nothing graceful, so Ray marks its node dead only after missed heartbeats); Horovod
    restarts at 2 on host 1 within a monitor interval and a group's start of that, from the last checkpoint,
    and finishes with the right total. (Train V2 once restarted at 4 before the node was marked dead and
    waited for it.)"""
    ensure_nodes(cluster, 2)
    ti = FakeTI(f"shrink-{uuid.uuid4().hex[:6]}")
    steps, monitor_s = 8, 30
    op = operator(
        cluster,
        elastic_train,
        num_workers=(2, 4),
        max_failures=2,
        elastic_resize_monitor_interval_s=monitor_s,
        train_loop_config={"steps": steps, "step_s": 0.5},
    )
    begun = time.time()
    thread, outcome = run_in_thread(op, {"ti": ti})
    wait_until(lambda: [g for g in groups_started(ti) if g["world_size"] == 4], HUNG_S, "a group of 4", outcome)
    first_start_s = groups_started(ti)[0]["started_at"] - begun  # the job's start and its first group's, this run
    wait_until(lambda: registered(ti), HUNG_S, "a checkpoint at 4", outcome)
    cluster.stop_ray(cluster[1])
    dead_at = wait_until(
        lambda: cluster[1].address not in (alive := cluster.alive_nodes()) and alive and time.time(),
        HUNG_S,
        "Ray marking host 2's node dead",
    )
    thread.join(HUNG_S)
    assert not thread.is_alive(), "the training did not finish"
    if "error" in outcome:
        raise outcome["error"]
    smaller = [g for g in groups_started(ti) if g["world_size"] == 2]
    assert smaller, (dead_at, groups_started(ti))
    print(
        f"restarted smaller {smaller[0]['started_at'] - dead_at:.1f} s after the node was marked dead; "
        f"bound {monitor_s} + {first_start_s:.1f} s"
    )
    # The elastic policy's next look, then a group's start: at most the first one's, which held the job's too.
    assert smaller[0]["started_at"] - dead_at < monitor_s + first_start_s, (dead_at, first_start_s, groups_started(ti))
    result = outcome["result"]
    segments = result["segments"]
    assert [(s["world_size"], s["reason"]) for s in segments] == [(4, "start"), (2, "node lost")], segments
    assert result["world_size"] == 2
    value = result["return_value"]
    assert value["size"] == 2, value
    resumed_right(value, steps)


def test_elastic_training_grows_when_a_host_returns(cluster):
    """(2, 4) with host 2 gone: starts at 2 on host 1; host 2 comes back; at the next look (every 3 s
    here) Horovod restarts at 4 from the last checkpoint and finishes with the right total."""
    ensure_nodes(cluster, 1)
    ti = FakeTI(f"grow-{uuid.uuid4().hex[:6]}")
    steps = 8
    op = operator(
        cluster,
        elastic_train,
        num_workers=[2, 4],
        elastic_resize_monitor_interval_s=3,
        train_loop_config={"steps": steps, "step_s": 0.5},
    )
    thread, outcome = run_in_thread(op, {"ti": ti})
    wait_until(lambda: groups_started(ti), HUNG_S, "the first group", outcome)
    wait_until(lambda: registered(ti), HUNG_S, "a checkpoint at 2", outcome)
    cluster.join(cluster[1], num_cpus=2)
    thread.join(HUNG_S)
    assert not thread.is_alive(), "the training did not finish"
    if "error" in outcome:
        raise outcome["error"]
    result = outcome["result"]
    assert [(s["world_size"], s["reason"]) for s in result["segments"]] == [(2, "start"), (4, "grow")], result
    value = result["return_value"]
    assert result["world_size"] == 4, value
    assert value["size"] == 4, value
    resumed_right(value, steps)


def test_a_fixed_size_training_that_loses_a_host_fails_as_infrastructure_and_its_retry_resumes(cluster):
    """Two ranks of 2 CPUs, one per host, max_failures=0: host 2's machine goes away (SIGKILL, nothing
    graceful); the attempt fails at once as infrastructure, not after a timeout; with host 2 back, the
    task's retry runs attempt 2 from the last checkpoint and finishes with the right total."""
    from airflow_provider_horovod.exceptions import InfrastructureError

    ensure_nodes(cluster, 2)
    ti = FakeTI(f"fixed-{uuid.uuid4().hex[:6]}")
    steps = 8
    timeout_s = 600  # Horovod's own waits: a loss that only they noticed would fail the attempt this late

    def make():
        return operator(
            cluster,
            elastic_train,
            num_workers=2,
            resources_per_worker={"CPU": 2},
            max_failures=0,
            horovod_timeout_s=timeout_s,
            train_loop_config={"steps": steps, "step_s": 0.5},
        )

    thread, outcome = run_in_thread(make(), {"ti": ti})
    wait_until(lambda: groups_started(ti), HUNG_S, "the worker group", outcome)
    wait_until(lambda: registered(ti), HUNG_S, "a checkpoint", outcome)
    lost_at = time.monotonic()
    cluster.stop_ray(cluster[1])
    thread.join(HUNG_S)
    assert not thread.is_alive(), "the attempt did not fail"
    assert isinstance(outcome.get("error"), InfrastructureError), outcome
    assert time.monotonic() - lost_at < timeout_s, "the loss was noticed only by Horovod's timeout"
    ensure_nodes(cluster, 2)
    retry = FakeTI(ti.run_id, try_number=2)
    result = make().execute({"ti": retry})
    assert result["attempt"] == 2
    assert [a["failure_class"] for a in result["attempts"]] == ["infrastructure"]
    value = result["return_value"]
    resumed_right(value, steps)


def test_hosts_that_cannot_connect_fail_saying_where_within_the_timeout(cluster):
    """Host 2 cut off the second network (its interface up, its packets lost, as behind a firewall that
    drops them) while Ray, on the first, still reaches it; horovod_nics picks the second network."""
    from airflow_provider_horovod.exceptions import JobFailure
    from airflow_provider_horovod.hooks.ray import RayHook
    from airflow_provider_horovod.runtime.horovod_network import REACH_CHECK

    ensure_nodes(cluster, 2)
    timeout_s = 8
    ti = FakeTI(f"cut-{uuid.uuid4().hex[:6]}")
    cluster.isolate(cluster[1], data=True)
    try:
        with JobWatch(RayHook(CONN_ID), ti.task_run.submission_id(1), marks=[REACH_CHECK]) as watch:
            with pytest.raises(JobFailure) as err:
                operator(
                    cluster,
                    allreduce_probe,
                    num_workers=2,
                    resources_per_worker={"CPU": 2},
                    horovod_nics=["eth1"],
                    horovod_timeout_s=timeout_s,
                    train_loop_config={"inits": 1},
                ).execute({"ti": ti})
    finally:
        cluster.isolate(cluster[1], False, data=True)
    took = time.monotonic() - watch.started
    message = str(err.value)
    for needed in (
        "cannot reach each other",
        "ahp-node1",
        "ahp-node2",
        "10.177.0.1:",
        "10.177.0.2:",
        f"no answer within {timeout_s} s",
        "horovod_nics",
        "horovod_timeout_s",
    ):
        assert needed in message, (needed, message)
    assert "Fatal Python error" not in message
    # The check's own wait was its timeout (the message says so: the probe's connect timed out). Before it, the
    # job's and the workers' start, measured here (to the log's line as the check starts); after it, an end
    # that costs at most twice that start: bounds a loaded machine stretches alike.
    start_s = watch.at(REACH_CHECK)
    assert took < start_s + timeout_s + 2 * start_s, (took, watch.seen)


def gpu_visibility_probe(config):
    """What each rank would hand to torch.cuda.set_device(hvd.local_rank()): the devices it sees."""
    import os

    import horovod.torch as hvd
    import ray

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
    report_checkpoint(hvd.rank(), {"ranks": len(seen)})
    return seen


def test_gpu_workers_of_a_host_each_see_all_its_gpus(cluster):
    """Horovod pins one GPU per local rank, so every GPU worker of a host must see the host's GPUs (not
    only the one Ray gave it), as Ray's own HorovodTrainer arranges (the provider's V2 backend does it
    too; the legacy trainer is Ray's own code). Host 2's node is replaced by one that declares two GPUs
    (Ray schedules them and sets CUDA_VISIBLE_DEVICES though the machine has none)."""
    from airflow_provider_horovod.hooks.ray import RayHook

    ensure_nodes(cluster, 2)
    # The old node is killed as a lost machine is; the GPU workers can only land on the new one.
    cluster.stop_ray(cluster[1])
    cluster.join(cluster[1], num_cpus=2, num_gpus=2)
    hook = RayHook(ray_conn_id=CONN_ID)
    wait_until(lambda: hook.get_cluster_resources().get("GPU", 0) >= 2, HUNG_S, "host 2's node with GPUs joining")
    result = operator(
        cluster,
        gpu_visibility_probe,
        num_workers=2,
        use_gpu=True,
        resources_per_worker={"CPU": 1, "GPU": 1},
    ).execute({"ti": FakeTI(f"gpus-{uuid.uuid4().hex[:6]}")})
    ranks = sorted(result["return_value"], key=lambda r: r["rank"])
    assert len({r["node_id"] for r in ranks}) == 1, ranks  # the host with the GPUs holds both workers
    assert sorted(g for r in ranks for g in r["assigned"]) == ["0", "1"], ranks  # one GPU each
    for rank in ranks:
        assert sorted(rank["visible"].split(",")) == ["0", "1"], ranks
        assert rank["local_rank"] < 2  # set_device(local_rank) has a device to pin
