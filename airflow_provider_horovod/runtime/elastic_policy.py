"""An elastic run's view of the cluster (Train V2): Ray Train's elastic scaling policy, counting only
the nodes that exist now. Its Ray internals are named in ``ray_compat``, which probes for them."""

from __future__ import annotations

import functools
import importlib
from typing import Any

from airflow_provider_horovod.runtime.ray_compat import V2_ELASTIC, V2_UTIL, has

# The controller's wait for the cluster's view from Ray's AutoscalingCoordinator (Ray's own is 5 s).
RESERVED_RESOURCES_TIMEOUT_S = 5.0
# A node's raylet that does not take a TCP connection within this long is counted as gone.
RAYLET_ANSWER_TIMEOUT_S = 1.0


def answering_nodes(nodes: list[dict], timeout_s: float = RAYLET_ANSWER_TIMEOUT_S) -> set[str]:
    """The ids of the nodes (as ``ray.nodes()`` lists them) that Ray counts alive and whose raylet takes a
    TCP connection now. A node whose machine went away (power, kernel panic: nothing said goodbye) stays
    alive in Ray's view until the head has missed its heartbeats for a while; its raylet's
    port refuses at once (a host still up) or never answers (a host gone)."""
    import concurrent.futures
    import socket

    alive = [n for n in nodes if n.get("Alive") and n.get("NodeManagerAddress") and n.get("NodeManagerPort")]

    def answers(node: dict) -> bool:
        try:
            socket.create_connection((node["NodeManagerAddress"], int(node["NodeManagerPort"])), timeout_s).close()
            return True
        except OSError:
            return False

    if not alive:
        return set()
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(32, len(alive))) as pool:
        return {node["NodeID"] for node, ok in zip(alive, pool.map(answers, alive)) if ok}


@functools.cache
def _fresh_elastic_policy_class() -> type:
    elastic = importlib.import_module(V2_ELASTIC)
    time_monotonic = importlib.import_module(V2_UTIL).time_monotonic

    base: type = elastic.ElasticScalingPolicy

    class FreshElasticScalingPolicy(base):
        """Ray Train's elastic scaling policy, counting the workers that fit on a fresh view of the cluster.

        Ray's own asks Ray Data's AutoscalingCoordinator, which refreshes its view of the nodes every 20 s:
        right after a node is lost it still counts that node, so the run restarts at the old size, whose
        workers cannot be placed, and waits for them until the worker-group start timeout; and a node that
        comes back is seen up to 20 s late. Asking with ``recompute`` reads the nodes now (one
        ``ray.nodes()`` in the coordinator, at most once a second).

        And a node that Ray still counts alive but whose raylet does not answer is left out
        (``answering_nodes``): a machine lost without a goodbye stays alive in Ray's view until its missed
        heartbeats, and a restart at the old size in that window would wait for the dead node's resources
        (its placement group pending, for as long as the worker-group start timeout)."""

        # Set by Ray's class; declared for mypy, which sees that class as Any.
        _latest_reserved_resources_query_time: float
        _latest_reserved_resources: Any

        def _get_reserved_resources(self):
            import ray

            now = time_monotonic()
            if now - self._latest_reserved_resources_query_time < self.GET_RESERVED_RESOURCES_INTERVAL_S:
                return self._latest_reserved_resources
            reserved = None
            try:
                reserved = ray.get(
                    self._autoscaling_coordinator.get_reserved_resources.remote(self._requester_id, recompute=True),
                    timeout=RESERVED_RESOURCES_TIMEOUT_S,
                )
                if reserved:
                    answering = answering_nodes(ray.nodes())
                    reserved = {node: resources for node, resources in reserved.items() if node in answering}
            except Exception:  # noqa: BLE001 - as Ray's own: no resize this time, the next look retries
                pass
            self._latest_reserved_resources_query_time = time_monotonic()
            self._latest_reserved_resources = reserved
            return reserved

    return FreshElasticScalingPolicy


def elastic_scaling_policy(scaling_config: Any) -> Any | None:
    """The elastic scaling policy the controller should use instead of Ray's own, or None to keep Ray's
    (a Ray whose autoscaling coordinator cannot give a fresh view)."""
    if not has("fresh_elastic_view"):
        return None
    return _fresh_elastic_policy_class()(scaling_config)
