"""The Horovod backend for Ray Train V2: the rank plan, each rank's environment, the rendezvous server's
bookkeeping, and why a worker group started (the run's segments). Pure, or a real rendezvous server on
127.0.0.1."""

import dataclasses
import urllib.request

import pytest

from airflow_provider_horovod.runtime.horovod_backend import (
    _CHANGE,
    ControllerChanges,
    HorovodV2Config,
    _rendezvous_handler,
    any_node_gone,
    host_plan,
    rank_env,
    segment_reason,
)


def test_host_plan_counts_contiguous_ranks_per_node():
    assert host_plan(["a", "a", "b", "b", "b"]) == "a:2,b:3"
    assert host_plan(["a"]) == "a:1"


def test_host_plan_refuses_ranks_of_a_node_split_apart():
    with pytest.raises(RuntimeError, match="non-contiguous ranks"):
        host_plan(["a", "b", "a"])


def test_each_rank_gets_horovods_variables():
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts

    slots = get_host_assignments(parse_hosts(host_plan(["n1", "n1", "n2"])), 3)
    config = HorovodV2Config(timeout_s=45, nics=["eth1", "eth2"])
    envs = [rank_env(s, rendezvous_addr="10.0.0.1", rendezvous_port=4242, config=config) for s in slots]
    picked = [
        (
            e["HOROVOD_HOSTNAME"],
            e["HOROVOD_RANK"],
            e["HOROVOD_LOCAL_RANK"],
            e["HOROVOD_LOCAL_SIZE"],
            e["HOROVOD_CROSS_RANK"],
            e["HOROVOD_CROSS_SIZE"],
        )
        for e in envs
    ]
    assert picked == [("n1", "0", "0", "2", "0", "2"), ("n1", "1", "1", "2", "0", "1"), ("n2", "2", "0", "1", "1", "2")]
    assert {e["HOROVOD_SIZE"] for e in envs} == {"3"}
    assert envs[0]["HOROVOD_GLOO_RENDEZVOUS_ADDR"] == "10.0.0.1"
    assert envs[0]["HOROVOD_GLOO_RENDEZVOUS_PORT"] == "4242"
    assert envs[0]["HOROVOD_GLOO_TIMEOUT_SECONDS"] == "45"
    # The network is per host (network_env), not per rank.
    assert not any(key in envs[0] for key in ("HOROVOD_GLOO_IFACE", "NCCL_SOCKET_IFNAME"))


# --- the rendezvous server ---------------------------------------------------------------------------


def test_the_rendezvous_forgets_a_scope_once_all_its_ranks_finished_even_out_of_step_with_others():
    """Rank 0 finishes 'global' and then its own one-rank 'local' scope before rank 1 finishes
    'global': Horovod's own handler then forgets rank 0's 'global' finish and keeps its keys, and the
    next hvd.init() reads a stale address."""
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
    from horovod.runner.http.http_server import RendezvousServer

    server = RendezvousServer(verbose=0)
    port = server.start(_rendezvous_handler())
    server.init(get_host_assignments(parse_hosts("n1:1,n2:1"), 2))
    try:

        def call(method, path, body=b""):
            request = urllib.request.Request(f"http://127.0.0.1:{port}/{path}", data=body or None, method=method)
            if body:
                request.add_header("Content-Length", str(len(body)))
            urllib.request.urlopen(request, timeout=5).close()

        for rank in "01":
            call("PUT", f"global/{rank}", b"address")
        call("DELETE", "global/0")
        call("DELETE", "local_n1/0")
        call("DELETE", "global/1")
        assert "global" not in server._httpd.cache
    finally:
        server.stop()
        server._httpd.server_close()


# --- why a worker group started ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "previous, size, change, node_lost, reason",
    [
        (None, 4, None, False, "start"),
        (2, 4, "resize", False, "grow"),
        (4, 2, "resize", False, "shrink"),
        (4, 2, "restart", True, "node lost"),
        (4, 4, "preempt", False, "node lost"),
        (4, 4, "restart", False, "failure"),
    ],
    ids=["start", "grow", "shrink", "node-gone", "preempted", "failure"],
)
def test_segment_reason(previous, size, change, node_lost, reason):
    assert segment_reason(previous, size, change, node_lost) == reason


def test_a_node_ray_still_lists_alive_whose_raylet_refuses_counts_as_gone(monkeypatch):
    """Right after a machine is lost Ray still lists its node alive: the restart is a "node lost" when the
    node's raylet refuses, as when Ray has marked it dead."""
    import socket

    import ray

    with socket.socket() as listening, socket.socket() as probe:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        probe.bind(("127.0.0.1", 0))  # bound, never listening: refuses
        up, refusing = listening.getsockname()[1], probe.getsockname()[1]

        def nodes(host2_port, host2_alive=True):
            return [
                {"NodeID": "host1", "Alive": True, "NodeManagerAddress": "127.0.0.1", "NodeManagerPort": up},
                {
                    "NodeID": "host2",
                    "Alive": host2_alive,
                    "NodeManagerAddress": "127.0.0.1",
                    "NodeManagerPort": host2_port,
                },
            ]

        for listed, gone in [(nodes(up), False), (nodes(refusing), True), (nodes(up, host2_alive=False), True)]:
            monkeypatch.setattr(ray, "nodes", lambda listed=listed: listed)
            assert any_node_gone(["host1", "host2"]) is gone, listed


def test_the_controller_callback_notes_only_what_replaces_a_worker_group():
    from ray.train.v2._internal.execution.controller.state import ResizingState, RunningState, SchedulingState

    _CHANGE.clear()
    changes = ControllerChanges()
    changes.after_controller_state_update(RunningState(), ResizingState(scaling_decision=None))
    changes.after_controller_state_update(ResizingState(scaling_decision=None), SchedulingState(scaling_decision=None))
    assert _CHANGE == {"last": "resize"}
    _CHANGE.clear()


@pytest.mark.parametrize("datasets", [None, {"train": [1, 2, 3]}])
def test_the_controller_starts_no_placement_group_cleaner_nor_a_dataset_manager_without_datasets(tmp_path, datasets):
    from ray.train import RunConfig, ScalingConfig

    from airflow_provider_horovod.runtime import ray_compat
    from airflow_provider_horovod.runtime.horovod_backend import _controller_args, build_v2_trainer

    trainer = build_v2_trainer(
        lambda: None,
        train_loop_config=None,
        datasets=datasets,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(storage_path=str(tmp_path), name="run"),
        resume_from=None,
        timeout_s=30,
        nics=None,
    )
    # What the wrapped controller start adds to Ray's arguments, given Ray's own callbacks.
    seen = _controller_args(
        trainer.scaling_config, {"callbacks": trainer._create_default_callbacks()}, has_datasets=bool(datasets)
    )
    kinds = {type(c).__name__ for c in seen["callbacks"]}
    assert "PlacementGroupCleanerCallback" not in kinds
    assert {"BackendSetupCallback", "ControllerChanges"} <= kinds
    if datasets:
        assert "DatasetsCallback" in kinds
        assert "NoDatasetsCallback" not in kinds
        return
    assert "DatasetsCallback" not in kinds
    (stand_in,) = [c for c in seen["callbacks"] if type(c).__name__ == "NoDatasetsCallback"]
    providers = stand_in.before_init_train_context(["w0", "w1"])["dataset_shard_provider"]
    assert len(providers) == 2
    assert all(isinstance(p, ray_compat.NoDatasets) for p in providers)
    with pytest.raises(KeyError, match="given no datasets"):
        providers[0].get_dataset_shard(dataclasses.make_dataclass("Info", ["dataset_name"])("train"))


def test_a_rank_shuts_horovod_down_once_its_function_returned():
    """Before Ray Train ends the workers' processes: a background loop left running there reads from a
    peer already gone (Gloo's "Connection closed by peer", an error line in a good run's log)."""
    import subprocess
    import sys

    code = """
import horovod.torch as hvd
from airflow_provider_horovod.documents import TrainingSpec
from airflow_provider_horovod.runtime.trainers import worker_finished
hvd.init()
spec = TrainingSpec(submission_id="s", train_fn={"import": "m:f"}, storage_uri="/x", python_version="3")
worker_finished(spec, None)
print("initialized after the function:", hvd.is_initialized())
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "initialized after the function: False" in done.stdout, done.stdout


def test_a_scripts_workers_start_their_ranks_as_they_start_and_a_functions_import_horovod(tmp_path, monkeypatch):
    """A script's rank imports torch and Horovod while the worker group is set up (Ray's worker process setup
    hook); a function's worker imports Horovod itself, and starts no rank."""
    from ray._private import ray_constants
    from ray.train import RunConfig, ScalingConfig

    from airflow_provider_horovod.runtime.horovod_backend import build_v2_trainer

    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("import horovod.torch as hvd\n")

    def build(script):
        config = RunConfig(storage_path=str(tmp_path), name="run")
        trainer = build_v2_trainer(
            lambda: None,
            train_loop_config=None,
            datasets=None,
            scaling_config=ScalingConfig(num_workers=2),
            run_config=config,
            resume_from=None,
            timeout_s=30,
            nics=None,
            script=script,
        )
        return trainer, (config.worker_runtime_env or {}).get("env_vars", {})

    trainer, env = build(None)
    assert trainer.backend_config.import_horovod and ray_constants.WORKER_PROCESS_SETUP_HOOK_ENV_VAR not in env
    trainer, env = build({"path": "train.py"})
    assert not trainer.backend_config.import_horovod
    assert (
        env[ray_constants.WORKER_PROCESS_SETUP_HOOK_ENV_VAR]
        == "airflow_provider_horovod.runtime.rank_process.start_in_worker"
    )
    assert env["AHP_SCRIPT_EARLY_IMPORTS"] == "horovod.torch"
    assert env["RAY_worker_niceness"] == "0"
