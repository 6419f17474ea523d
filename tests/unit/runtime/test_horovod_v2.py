"""The Horovod backend for Ray Train V2: the rank plan, each rank's environment, the network each host
uses and the message when hosts cannot reach each other, the rendezvous server's bookkeeping, and why a
worker group started (the run's segments). Pure, or a real rendezvous server on 127.0.0.1."""

import dataclasses
import urllib.request

import pytest

from airflow_provider_horovod import build_horovod
from airflow_provider_horovod.runtime.horovod_v2 import (
    _CHANGE,
    PROCESS_SET_IFACE_MARKER,
    ControllerChanges,
    HorovodNetworkError,
    HorovodV2Config,
    HostNetwork,
    Unreachable,
    _rendezvous_handler,
    choose_interfaces,
    host_plan,
    network_env,
    network_plan,
    rank_env,
    segment_reason,
    unreachable_message,
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
    assert envs[0]["HOROVOD_GLOO_RENDEZVOUS_ADDR"] == "10.0.0.1" and envs[0]["HOROVOD_GLOO_RENDEZVOUS_PORT"] == "4242"
    assert envs[0]["HOROVOD_GLOO_TIMEOUT_SECONDS"] == "45"
    # The network is per host (network_env), not per rank.
    assert not any(key in envs[0] for key in ("HOROVOD_GLOO_IFACE", "NCCL_SOCKET_IFNAME"))


# --- the network each host uses --------------------------------------------------------------------


def host(name, ip, interfaces, hostname_address=None, fixed=True, down=()):
    return HostNetwork(name, ip, interfaces, hostname_address or ip, fixed, tuple(down))


A = host("a", "10.0.0.1", {"lo": ["127.0.0.1"], "eth0": ["10.0.0.1", "fe80::1"], "docker0": ["172.17.0.1"]})
B = host("b", "10.0.0.2", {"lo": ["127.0.0.1"], "ens5": ["10.0.0.2"], "eth1": ["10.1.0.2"]})


def test_by_default_each_host_uses_the_interface_of_rays_address_whatever_its_name():
    assert network_plan([A, B], None) == [["eth0"], ["ens5"]]


def test_horovod_nics_are_candidates_in_order_each_host_using_those_it_has():
    assert network_plan([A, B], ["wlan0", "ens5", "eth0", "eth1"]) == [["eth0"], ["ens5", "eth1"]]
    # Gloo takes the first; NCCL all of them, by exact name (a bare name would match eth10 too).
    assert network_env("ens5", ["ens5", "eth1"]) == {"HOROVOD_GLOO_IFACE": "ens5", "NCCL_SOCKET_IFNAME": "=ens5,eth1"}


def test_a_host_without_any_of_horovod_nics_is_named_with_its_interfaces():
    down = host("c", "10.0.0.3", {"eth0": ["10.0.0.3"]}, down=["eth1"])
    with pytest.raises(HorovodNetworkError) as err:
        network_plan([A, down], ["eth1"])
    text = str(err.value)
    assert "a (10.0.0.1) has none of horovod_nics ['eth1']" in text and "docker0 172.17.0.1" in text
    assert "c (10.0.0.3)" in text and "eth1 (down)" in text


def test_a_ray_address_on_no_interface_asks_for_horovod_nics():
    natted = host("d", "203.0.113.9", {"eth0": ["10.0.0.4"]})
    with pytest.raises(HorovodNetworkError, match="no interface holds 203.0.113.9.*horovod_nics"):
        network_plan([A, natted], None)
    assert choose_interfaces(natted, ["eth0"]) == ["eth0"]


def test_host_names_on_loopback_fail_across_hosts_only_with_horovods_unfixed_process_sets():
    debian = [
        host("a", "10.0.0.1", A.interfaces, "127.0.1.1", fixed=False),
        host("b", "10.0.0.2", B.interfaces, "127.0.1.1", fixed=False),
    ]
    with pytest.raises(HorovodNetworkError, match=r"a -> 127\.0\.1\.1; b -> 127\.0\.1\.1.*build_horovod"):
        network_plan(debian, None)
    fixed = [dataclasses.replace(h, process_sets_use_iface=True) for h in debian]
    assert network_plan(fixed, None) == [["eth0"], ["ens5"]]
    one_machine = [host(n, "127.0.0.1", {"lo": ["127.0.0.1"]}, "127.0.1.1", fixed=False) for n in "ab"]
    assert network_plan(one_machine, None) == [["lo"], ["lo"]]


def test_the_fix_is_recognised_by_the_text_the_build_puts_in_horovod():
    # Decided in build_horovod (it makes the edit), read here (the runtime imports no Airflow-side module).
    assert PROCESS_SET_IFACE_MARKER == build_horovod.PROCESS_SET_IFACE_MARKER.encode()
    assert any(build_horovod.PROCESS_SET_IFACE_MARKER in new for _, _, new in build_horovod.REPLACEMENTS)


def test_the_unreachable_message_names_hosts_addresses_ports_and_the_parameters():
    text = unreachable_message(
        [Unreachable("b (10.0.0.2)", "a (10.0.0.1) on eth1", "10.1.0.1", 40123, "no answer within 8 s")],
        probe_timeout_s=8,
        timeout_s=8,
        nics=["eth1"],
    )
    for needed in (
        "b (10.0.0.2) -> a (10.0.0.1) on eth1 at 10.1.0.1:40123: no answer within 8 s",
        "horovod_nics=['eth1']",
        "horovod_timeout_s (now 8)",
    ):
        assert needed in text


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


def test_the_controller_callback_notes_only_what_replaces_a_worker_group():
    from ray.train.v2._internal.execution.controller.state import ResizingState, RunningState, SchedulingState

    _CHANGE.clear()
    changes = ControllerChanges()
    changes.after_controller_state_update(RunningState(), ResizingState(scaling_decision=None))
    changes.after_controller_state_update(ResizingState(scaling_decision=None), SchedulingState(scaling_decision=None))
    assert _CHANGE == {"last": "resize"}
    _CHANGE.clear()


@pytest.mark.parametrize("datasets", [None, {"train": [1, 2, 3]}])
def test_the_trainer_starts_no_placement_group_cleaner_nor_a_dataset_manager_without_datasets(tmp_path, datasets):
    from ray.train import RunConfig, ScalingConfig
    from ray.train.v2._internal.callbacks.placement_group_callback import PlacementGroupCleanerCallback

    from airflow_provider_horovod.runtime.horovod_v2 import NoDatasets, NoDatasetsCallback, build_v2_trainer

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
    callbacks = trainer._create_default_callbacks()
    kinds = {type(c).__name__ for c in callbacks}
    assert PlacementGroupCleanerCallback.__name__ not in kinds
    assert {"BackendSetupCallback", "ControllerChanges"} <= kinds
    if datasets:
        assert "DatasetsCallback" in kinds and "NoDatasetsCallback" not in kinds
        return
    assert "DatasetsCallback" not in kinds
    (stand_in,) = [c for c in callbacks if isinstance(c, NoDatasetsCallback)]
    providers = stand_in.before_init_train_context(["w0", "w1"])["dataset_shard_provider"]
    assert len(providers) == 2 and all(isinstance(p, NoDatasets) for p in providers)
    with pytest.raises(KeyError, match="given no datasets"):
        providers[0].get_dataset_shard(dataclasses.make_dataclass("Info", ["dataset_name"])("train"))
