"""An elastic run after a machine is lost: only the nodes whose raylet answers are counted, so Ray Train's
elastic policy restarts at the size the answering nodes fit."""

import socket

import pytest

from airflow_provider_horovod.runtime import elastic_policy, ray_compat


def _node(node_id, port, alive=True, address="127.0.0.1"):
    return {"NodeID": node_id, "Alive": alive, "NodeManagerAddress": address, "NodeManagerPort": port}


@pytest.fixture
def raylet_ports():
    """A port that takes connections (a raylet that answers) and one that refuses (a killed raylet)."""

    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        refusing = probe.getsockname()[1]
    yield listening.getsockname()[1], refusing
    listening.close()


def test_only_nodes_whose_raylet_answers_are_counted(raylet_ports):
    up, refusing = raylet_ports
    nodes = [
        _node("up", up),
        _node("killed", refusing),
        _node("unreachable", 9, address="192.0.2.1"),  # TEST-NET-1: nothing answers there
        _node("dead", up, alive=False),
    ]
    assert elastic_policy.answering_nodes(nodes, timeout_s=0.5) == {"up"}


@pytest.mark.skipif(not ray_compat.has("fresh_elastic_view"), reason="Ray's own elastic policy on this minor")
def test_the_elastic_policy_restarts_on_the_nodes_that_answer_while_ray_still_counts_a_lost_one(
    raylet_ports, monkeypatch
):
    """Right after host 2's machine is lost Ray still lists its node alive with its CPUs: the policy leaves
    it out, so the restart is at the size the answering nodes fit (2 of 1 CPU), not the old 4."""
    import ray
    from ray.train import ScalingConfig

    up, refusing = raylet_ports
    reserved = {"host1": {"CPU": 2.0}, "host2": {"CPU": 2.0}}
    monkeypatch.setattr(ray, "nodes", lambda: [_node("host1", up), _node("host2", refusing)])
    monkeypatch.setattr(ray, "get", lambda value, timeout=None: value)

    class Coordinator:
        class get_reserved_resources:  # noqa: N801 - an actor method's shape: .remote(...)
            @staticmethod
            def remote(requester_id, recompute=False):
                assert recompute
                return reserved

    base = elastic_policy._fresh_elastic_policy_class()
    policy_class = type("Policy", (base,), {"_autoscaling_coordinator": Coordinator()})
    policy = policy_class(ScalingConfig(num_workers=(2, 4), resources_per_worker={"CPU": 1}))
    assert policy._count_possible_workers(policy._get_reserved_resources()) == 2
    monkeypatch.setattr(ray, "nodes", lambda: [_node("host1", up), _node("host2", up)])  # host 2 back
    policy._latest_reserved_resources_query_time = float("-inf")
    assert policy._count_possible_workers(policy._get_reserved_resources()) == 4
