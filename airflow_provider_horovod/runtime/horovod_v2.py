"""Horovod on Ray Train V2: a Backend for V2's DataParallelTrainer.

Ray 2.60 refuses its own HorovodTrainer under Train V2, and the V1 HorovodConfig cannot be reused
(its backend reads a worker group attribute V2 lacks). V2 accepts any BackendConfig, so this module
does what Horovod's own launcher does, with Horovod's pure-Python parts: plan the ranks over the
nodes, start the Gloo rendezvous server in the controller, and give each worker its ``HOROVOD_*``
variables before the training function calls ``hvd.init()``.

Ray Train keeps one Backend object per run and calls ``on_start`` again each time it restarts the
worker group after a failure, so every start makes a fresh rendezvous and stops the old one.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Sequence

from ray.train.backend import Backend, BackendConfig


@dataclasses.dataclass
class HorovodV2Config(BackendConfig):
    """How the workers meet.

    :param timeout_s: Gloo rendezvous and collective timeout, in seconds.
    :param nics: network interfaces for Horovod (the first for Gloo, all for NCCL); None: Gloo
        finds the address of the node's host name.

    Tuning variables (``HOROVOD_FUSION_THRESHOLD``, ...) reach the workers through the job's runtime_env.
    """

    timeout_s: int = 300
    nics: Sequence[str] | None = None

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
            raise RuntimeError(f"Ray Train gave node {node_id} non-contiguous ranks {list(node_ids)}; "
                               "Horovod needs the ranks of a node together.")
        else:
            hosts.append((node_id, 1))
    return ",".join(f"{name}:{slots}" for name, slots in hosts)


def rank_env(slot, *, rendezvous_addr: str, rendezvous_port: int, config: HorovodV2Config) -> dict[str, str]:
    """Everything ``hvd.init()`` reads, for the rank of one Horovod ``SlotInfo``."""
    env = {
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
    if config.nics:
        nics = list(config.nics)
        env.update({"HOROVOD_GLOO_IFACE": nics[0], "NCCL_SOCKET_IFNAME": ",".join(nics)})
    return env


def _set_env(env: dict[str, str]) -> None:
    """Runs in each worker, before its training function calls ``hvd.init()``."""
    os.environ.update(env)


class HorovodV2Backend(Backend):
    """Starts a rendezvous per worker-group start; stops it on shutdown."""

    # Each GPU worker sees all the GPUs its node gives the run, as under Ray's own HorovodTrainer:
    # Horovod's `torch.cuda.set_device(hvd.local_rank())` needs that on a node with several.
    share_cuda_visible_devices: bool = True

    def __init__(self) -> None:
        self._server = None

    def on_start(self, worker_group, backend_config: HorovodV2Config) -> None:
        import ray
        from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
        from horovod.runner.http.http_server import RendezvousServer

        self._stop_server()  # a restart after a failure: the old rendezvous is stale
        workers = worker_group.get_workers()
        slots = get_host_assignments(parse_hosts(host_plan([w.metadata.node_id for w in workers])), len(workers))
        server = RendezvousServer(verbose=0)
        port = server.start()
        server.init(slots)
        self._server = server
        addr = ray.util.get_node_ip_address()
        ray.get([
            worker_group.execute_single_async(
                rank, _set_env, rank_env(slot, rendezvous_addr=addr, rendezvous_port=port, config=backend_config))
            for rank, slot in enumerate(slots)
        ])

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
        from ray.train.v2._internal.execution.context import get_train_context

        context = get_train_context()
        if context.checkpoint is None:
            context.checkpoint = Checkpoint(path=checkpoint_uri, filesystem=filesystem)
        return train_fn(*args, **kwargs)

    return wrapped


def build_v2_trainer(train_fn: Callable, *, train_loop_config, datasets, scaling_config, run_config,
                     resume_from: str | None, timeout_s: int, nics):
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    return DataParallelTrainer(
        with_initial_checkpoint(train_fn, resume_from, run_config.storage_filesystem),
        train_loop_config=train_loop_config,
        backend_config=HorovodV2Config(timeout_s=timeout_s, nics=nics),
        scaling_config=scaling_config,
        run_config=run_config,
        datasets=datasets,
    )
