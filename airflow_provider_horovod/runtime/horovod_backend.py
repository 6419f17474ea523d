"""Horovod on Ray Train V2: a Backend for V2's DataParallelTrainer.

Ray refuses its own HorovodTrainer under Train V2, and the V1 HorovodConfig cannot be reused (its
backend reads a worker group attribute V2 lacks). V2 accepts any BackendConfig, so this module does
what Horovod's own launcher does, with Horovod's pure-Python parts: plan the ranks over the nodes,
start the Gloo rendezvous server in the controller, and give each worker its ``HOROVOD_*`` variables
before the training function calls ``hvd.init()``. Which network each host uses, and the check that
the hosts reach each other, are ``runtime.horovod_network``'s.

Ray Train keeps one Backend object per run and calls ``on_start`` again each time it restarts the
worker group (after a failure, or at a new size in an elastic run), so every start makes a fresh
rendezvous and stops the old one, and tells the workers why this group started (a segment of the run:
start, grow, shrink, node lost, failure), which rank 0 records. Ray Train's internals (the controller
callback, the train context, the policies) are reached through ``runtime.ray_compat``.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
from collections.abc import Callable, Sequence

from ray.train.backend import Backend, BackendConfig

from airflow_provider_horovod.contract import (
    HOROVOD_TIMEOUT_S,
    RANKS_AT_NICENESS_0,
    SEGMENT_FAILURE,
    SEGMENT_GROW,
    SEGMENT_NODE_LOST,
    SEGMENT_SHRINK,
    SEGMENT_START,
    WORKER_GROUP_REASON_ENV,
)
from airflow_provider_horovod.runtime import elastic_policy, ray_compat
from airflow_provider_horovod.runtime.horovod_network import (
    call_ranks,
    check_reachable,
    network_env,
    network_plan,
    read_host_network,
)

# A user's NCCL choice, set in the job's environment, wins over ours (NCCL is only the GPUs' data path).
USER_SET_WINS = ("NCCL_SOCKET_IFNAME",)


@dataclasses.dataclass
class HorovodV2Config(BackendConfig):
    """How the workers meet.

    :param timeout_s: Gloo rendezvous and collective timeout, in seconds.
    :param nics: candidate network interfaces for Horovod: each host uses the first of them it has
        (for Gloo, and with the others it has for NCCL), so names may differ between hosts. None:
        each host uses the interface of the address Ray uses for its node.
    :param import_horovod: import Horovod's torch module in each worker before its function starts (False for
        a script, whose rank imports it in a process of its own, ``runtime.script_rank``).

    Tuning variables (``HOROVOD_FUSION_THRESHOLD``, ...) reach the workers through the job's runtime_env.
    """

    timeout_s: int = HOROVOD_TIMEOUT_S
    nics: Sequence[str] | None = None
    import_horovod: bool = True

    @property
    def backend_cls(self):
        return HorovodV2Backend


def host_plan(node_ids: Sequence[str]) -> str:
    """Horovod's hosts string (``node:slots,...``) for workers listed in rank order.

    Horovod numbers ranks host by host, so the workers of one node must hold contiguous ranks;
    Ray Train V2 orders them so, and this checks it rather than trusting it.
    """
    hosts: list[tuple[str, int]] = []
    for node_id in node_ids:
        if hosts and hosts[-1][0] == node_id:
            hosts[-1] = (node_id, hosts[-1][1] + 1)
        elif any(name == node_id for name, _ in hosts):
            raise RuntimeError(
                f"Ray Train gave node {node_id} non-contiguous ranks {list(node_ids)}; "
                "Horovod needs the ranks of a node together."
            )
        else:
            hosts.append((node_id, 1))
    return ",".join(f"{name}:{slots}" for name, slots in hosts)


def rank_env(slot, *, rendezvous_addr: str, rendezvous_port: int, config: HorovodV2Config) -> dict[str, str]:
    """Everything ``hvd.init()`` reads, for the rank of one Horovod ``SlotInfo``, but the network (``network_env``)."""
    return {
        # Must equal the plan's host name, or the local sizes do not match.
        "HOROVOD_HOSTNAME": slot.hostname,
        "HOROVOD_RANK": str(slot.rank),
        "HOROVOD_SIZE": str(slot.size),
        "HOROVOD_LOCAL_RANK": str(slot.local_rank),
        "HOROVOD_LOCAL_SIZE": str(slot.local_size),
        "HOROVOD_CROSS_RANK": str(slot.cross_rank),
        "HOROVOD_CROSS_SIZE": str(slot.cross_size),
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": rendezvous_addr,
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(rendezvous_port),
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
        "HOROVOD_GLOO_TIMEOUT_SECONDS": str(int(config.timeout_s)),
    }


# Run in the workers.


def _prepare_worker(env: dict[str, str], import_horovod: bool = True) -> None:
    """Runs in each worker, before its training function calls ``hvd.init()``: sets the rank's variables and
    imports Horovod's torch module. Ray Train starts the functions only once every worker is prepared, so the
    ranks reach ``hvd.init()`` together: a rank still importing torch while its peers wait in the rendezvous
    would, on a loaded node, outlast the Gloo timeout and abort them."""
    os.environ.update({k: v for k, v in env.items() if not (k in USER_SET_WINS and k in os.environ)})
    if import_horovod:
        import horovod.torch  # noqa: F401


@functools.cache
def _rendezvous_handler():
    """Horovod's rendezvous handler, with each scope's finished ranks counted apart.

    Horovod clears a scope's keys once all its ranks have finished with it, but when one scope
    completes it forgets the finished ranks of every scope (``finished_list.clear()``,
    horovod/runner/http/http_server.py:132). A scope whose ranks finish out of step with another's
    then keeps its keys, and the next ``hvd.init()`` after ``hvd.shutdown()`` in the same workers
    reads a peer's address from the previous one, a closed port: Gloo aborts the worker.
    """
    from horovod.runner.http.http_server import OK, RendezvousHandler

    class Handler(RendezvousHandler):
        def do_DELETE(self):
            parts = self.path.split("/")
            if len(parts) != 3 or parts[1] not in self.server.scope_size:
                return super().do_DELETE()
            _, scope, rank = parts
            with self.server.finished_list_lock:
                finished = self.server.finished_list[scope]
                if rank not in finished:  # a retried request counts once
                    finished.append(rank)
                if len(finished) == self.server.scope_size[scope]:
                    with self.server.cache_lock:
                        self.server.cache.pop(scope, None)
                    finished.clear()
            self.send_status_code(OK)

    return Handler


# Why the controller last left a running worker group ("resize", "restart", "preempt"): set by
# ``ControllerChanges`` and read by the backend's next ``on_start``, both in the controller's process.
_CHANGE: dict[str, str] = {}


class ControllerChanges(ray_compat.controller_callback_base()):  # type: ignore[misc]
    """Notes, in the controller, why the worker group is about to be replaced."""

    def after_controller_state_update(self, previous_state, current_state) -> None:
        if change := ray_compat.controller_change(current_state):
            _CHANGE["last"] = change


def segment_reason(previous_size: int | None, size: int, change: str | None, node_lost: bool) -> str:
    """Why a worker group of ``size`` started: the run's start, a resize by Ray Train's elastic policy,
    or a restart after a failure (a node of the previous group gone, or preempted: "node lost")."""
    if previous_size is None:
        return SEGMENT_START
    if change == "resize":
        return SEGMENT_GROW if size > previous_size else SEGMENT_SHRINK
    if node_lost or change == "preempt":
        return SEGMENT_NODE_LOST
    return SEGMENT_FAILURE


def any_node_gone(node_ids: Sequence[str]) -> bool:
    """Whether a node of ``node_ids`` is dead or its raylet does not answer: a restart after a machine was
    lost without a goodbye comes before Ray marks its node dead (``elastic_policy.answering_nodes``)."""
    import ray

    answering = elastic_policy.answering_nodes(ray.nodes())
    return any(node not in answering for node in node_ids)


def shut_down_horovod() -> None:
    """Once a rank's training ends, Horovod shuts down there, together with the other ranks (Horovod agrees
    on it): ranks still waiting in a collective fail at once instead of waiting for ever, and no rank's
    background loop is left reading from a peer whose process Ray Train has ended (Gloo's "Connection
    closed by peer", logged as an error, after a good run)."""
    hvd = sys.modules.get("horovod.torch")
    if hvd is not None and hvd.is_initialized():
        hvd.shutdown()


class HorovodV2Backend(Backend):
    """Starts a rendezvous per worker-group start, after checking the network; stops it on shutdown."""

    # Each GPU worker sees all the GPUs its node gives the run, as under Ray's own HorovodTrainer:
    # Horovod's `torch.cuda.set_device(hvd.local_rank())` needs that on a node with several.
    share_cuda_visible_devices: bool = True

    def __init__(self) -> None:
        self._server = None
        self._nodes: list[str] = []  # the node of each rank of the last worker group

    def on_start(self, worker_group, backend_config: HorovodV2Config) -> None:
        import ray
        from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts

        self._stop_server()  # a restart after a failure: the old rendezvous is stale
        node_ids = [w.metadata.node_id for w in worker_group.get_workers()]
        reason = segment_reason(
            len(self._nodes) if self._nodes else None,
            len(node_ids),
            _CHANGE.pop("last", None),
            bool(self._nodes) and any_node_gone(self._nodes),
        )
        self._nodes = node_ids
        slots = get_host_assignments(parse_hosts(host_plan(node_ids)), len(node_ids))
        firsts = {node: node_ids.index(node) for node in dict.fromkeys(node_ids)}  # a rank on each node
        hosts = call_ranks(worker_group, {rank: (read_host_network,) for rank in firsts.values()}, "read its network")
        plan = dict(zip(firsts, network_plan(hosts, backend_config.nics)))
        port = self._start_server(slots)
        addr = ray.util.get_node_ip_address()
        try:
            check_reachable(
                worker_group,
                firsts,
                hosts,
                plan,
                (addr, port),
                timeout_s=backend_config.timeout_s,
                nics=backend_config.nics,
            )
        except BaseException:
            self._stop_server()
            raise
        ray.get(
            [
                worker_group.execute_single_async(
                    rank,
                    _prepare_worker,
                    {
                        **rank_env(slot, rendezvous_addr=addr, rendezvous_port=port, config=backend_config),
                        **network_env(plan[node][0], plan[node]),
                        WORKER_GROUP_REASON_ENV: reason,
                    },
                    backend_config.import_horovod,
                )
                for rank, (slot, node) in enumerate(zip(slots, node_ids))
            ]
        )

    def _start_server(self, slots) -> int:
        from horovod.runner.http.http_server import RendezvousServer

        server = RendezvousServer(verbose=0)
        port = server.start(_rendezvous_handler())
        server.init(slots)
        self._server = server
        return port

    def on_shutdown(self, worker_group, backend_config: HorovodV2Config) -> None:
        self._stop_server()

    def _stop_server(self) -> None:
        if self._server is None:
            return
        server, self._server = self._server, None
        server.stop()
        # stop() ends the serving loop but leaves the port bound.
        server._httpd.server_close()


def with_initial_checkpoint(train_fn: Callable, checkpoint_uri: str | None, filesystem=None) -> Callable:
    """``train_fn`` seeing ``checkpoint_uri`` through ``ray.train.get_checkpoint()`` until the run
    has a checkpoint of its own: V2 has no ``resume_from_checkpoint``, and a function written for
    HorovodTrainer resumes by asking ``get_checkpoint()``. ``filesystem``: the storage's, when the
    checkpoint must be read with it (forwarded credentials); the URI then loses its scheme."""
    if not checkpoint_uri:
        return train_fn
    if filesystem is not None:
        checkpoint_uri = checkpoint_uri.split("://", 1)[-1]

    @functools.wraps(train_fn)
    def wrapped(*args, **kwargs):
        from ray.train import Checkpoint

        ray_compat.set_initial_checkpoint(Checkpoint(path=checkpoint_uri, filesystem=filesystem))
        return train_fn(*args, **kwargs)

    return wrapped


class KeepHistoryAtShutdown(ray_compat.worker_callback_base()):  # type: ignore[misc]
    """In each worker, when Ray Train stops the worker group (a rank failed, a resize, the end): rank 0's
    reports not written yet go to the attempt's history first (``runtime.history.History``)."""

    def before_worker_shutdown(self) -> None:
        from airflow_provider_horovod.runtime.history import HISTORY

        HISTORY.write()


def build_v2_trainer(
    train_fn: Callable,
    *,
    train_loop_config,
    datasets,
    scaling_config,
    run_config,
    resume_from: str | None,
    timeout_s: int,
    nics,
    script: dict | None = None,
):
    """``script``: a script's run (``runtime.script``): its ranks, processes of their own, run at niceness 0 as
    horovodrun's (the whole job's workers start at 0, ``script.connect_at_niceness_0``; the ranks' own runtime
    env says so too) and start as their workers start."""
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    run_config.callbacks += [ControllerChanges(), KeepHistoryAtShutdown()]
    if script:
        from airflow_provider_horovod.runtime import rank_process

        run_config.worker_runtime_env = {"env_vars": {**RANKS_AT_NICENESS_0, **rank_process.early_start_env(script)}}
    trainer = DataParallelTrainer(
        with_initial_checkpoint(train_fn, resume_from, run_config.storage_filesystem),
        train_loop_config=train_loop_config,
        backend_config=HorovodV2Config(timeout_s=timeout_s, nics=nics, import_horovod=not script),
        scaling_config=scaling_config,
        run_config=run_config,
        datasets=datasets,
    )
    return ray_compat.with_controller_args(
        trainer, functools.partial(_controller_args, trainer.scaling_config, has_datasets=bool(datasets))
    )


def _controller_args(scaling_config, controller_args: dict, *, has_datasets: bool) -> dict:
    """What the controller gets besides Ray's own arguments: its callbacks without the actors the run
    does not use (``ray_compat.lean_callbacks``), and an elastic run's scaling policy."""
    extra = _elastic_policy(scaling_config, controller_args)
    if "callbacks" in controller_args:
        extra["callbacks"] = ray_compat.lean_callbacks(controller_args["callbacks"], has_datasets=has_datasets)
    return extra


def _elastic_policy(scaling_config, controller_args: dict) -> dict:
    """An elastic run's scaling policy counts the workers that fit on a fresh view of the nodes, where Ray
    can give one (``elastic_policy.elastic_scaling_policy``); else Ray's own."""
    if not getattr(scaling_config, "elasticity_enabled", False):
        return {}
    policy = elastic_policy.elastic_scaling_policy(scaling_config)
    return {} if policy is None else {"scaling_policy": policy}
