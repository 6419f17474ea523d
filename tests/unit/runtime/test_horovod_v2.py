"""The Horovod backend for Ray Train V2: the rank plan and each rank's environment."""

import pytest

from airflow_provider_horovod.runtime.horovod_v2 import HorovodV2Config, host_plan, rank_env


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
    picked = [(e["HOROVOD_HOSTNAME"], e["HOROVOD_RANK"], e["HOROVOD_LOCAL_RANK"], e["HOROVOD_LOCAL_SIZE"],
               e["HOROVOD_CROSS_RANK"], e["HOROVOD_CROSS_SIZE"]) for e in envs]
    assert picked == [("n1", "0", "0", "2", "0", "2"), ("n1", "1", "1", "2", "0", "1"),
                      ("n2", "2", "0", "1", "1", "2")]
    assert {e["HOROVOD_SIZE"] for e in envs} == {"3"}
    assert envs[0]["HOROVOD_GLOO_RENDEZVOUS_ADDR"] == "10.0.0.1" and envs[0]["HOROVOD_GLOO_RENDEZVOUS_PORT"] == "4242"
    assert envs[0]["HOROVOD_GLOO_TIMEOUT_SECONDS"] == "45"
    assert (envs[0]["HOROVOD_GLOO_IFACE"], envs[0]["NCCL_SOCKET_IFNAME"]) == ("eth1", "eth1,eth2")
    assert "HOROVOD_GLOO_IFACE" not in rank_env(slots[0], rendezvous_addr="a", rendezvous_port=1,
                                                config=HorovodV2Config())
