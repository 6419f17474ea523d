"""Horovod on Ray Train V2: a Backend for V2's DataParallelTrainer.

Ray 2.60 refuses its own HorovodTrainer under Train V2, and the V1 HorovodConfig cannot be reused
(its backend reads a worker group attribute V2 lacks). V2 accepts any BackendConfig, so this module
does what Horovod's own launcher does, with Horovod's pure-Python parts: plan the ranks over the
nodes, start the Gloo rendezvous server in the controller, and give each worker its ``HOROVOD_*``
variables before the training function calls ``hvd.init()``.

Ray Train keeps one Backend object per run and calls ``on_start`` again each time it restarts the
worker group (after a failure, or at a new size in an elastic run), so every start makes a fresh
rendezvous and stops the old one, and tells the workers why this group started (a segment of the run:
start, grow, shrink, node lost, failure), which rank 0 records.

The network. Gloo binds every rank to one address and hands it to the others through the
rendezvous. Left to itself it takes the address of the host name, which Debian and Ubuntu put on
127.0.1.1, where no other host can reach it. So each node's ranks are given an interface: the one
holding the address Ray uses for that node (Ray's nodes already reach each other there), or the
first of ``horovod_nics`` the host has. Then, before any ``hvd.init()``, every node checks that it
reaches every other node on those addresses, and the rendezvous server: a firewall or a wrong
interface fails the run here with a message naming hosts, addresses and ports, rather than as
Gloo's abort of the worker process.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import glob
import ipaddress
import os
import socket
from collections.abc import Callable, Mapping, Sequence

from ray.train.backend import Backend, BackendConfig
from ray.train.v2._internal.execution.callback import ControllerCallback, WorkerGroupCallback
from ray.train.v2._internal.execution.scaling_policy.elastic import ElasticScalingPolicy
from ray.train.v2._internal.util import time_monotonic

from airflow_provider_horovod.contract import (
    SEGMENT_FAILURE,
    SEGMENT_GROW,
    SEGMENT_NODE_LOST,
    SEGMENT_SHRINK,
    SEGMENT_START,
    WORKER_GROUP_REASON_ENV,
)

# A connection to a listening socket takes milliseconds on a working network: the check gives each
# one this long at most (and never longer than the Horovod timeout).
PROBE_TIMEOUT_S = 10.0
# Ray's own calls to the workers around the check (they are on the nodes already).
RAY_CALL_TIMEOUT_S = 60.0
# The controller's wait for the cluster's view from Ray's AutoscalingCoordinator (Ray's own is 5 s).
RESERVED_RESOURCES_TIMEOUT_S = 5.0
# Text the provider's Horovod build (build_horovod) adds to the binary with its fix that makes process
# sets use HOROVOD_GLOO_IFACE too; Horovod 0.28.1 as released lacks both.
PROCESS_SET_IFACE_MARKER = b"Gloo process set device on interface"
# A user's NCCL choice, set in the job's environment, wins over ours (NCCL is only the GPUs' data path).
USER_SET_WINS = ("NCCL_SOCKET_IFNAME",)


class HorovodNetworkError(RuntimeError):
    """Horovod's ranks cannot reach each other, or a host has no interface to use."""


@dataclasses.dataclass
class HorovodV2Config(BackendConfig):
    """How the workers meet.

    :param timeout_s: Gloo rendezvous and collective timeout, in seconds.
    :param nics: candidate network interfaces for Horovod: each host uses the first of them it has
        (for Gloo, and with the others it has for NCCL), so names may differ between hosts. None:
        each host uses the interface of the address Ray uses for its node.

    Tuning variables (``HOROVOD_FUSION_THRESHOLD``, ...) reach the workers through the job's runtime_env.
    """

    timeout_s: int = 300
    nics: Sequence[str] | None = None

    @property
    def backend_cls(self):
        return HorovodV2Backend


@dataclasses.dataclass(frozen=True)
class HostNetwork:
    """What one node's worker sees of its host's network."""

    host: str  # the host name
    node_ip: str  # the address Ray uses for the node
    interfaces: dict[str, list[str]]  # interfaces that are up -> IP addresses, in the order Gloo reads them
    hostname_address: str | None  # where Gloo binds when given no interface (its host-name lookup)
    process_sets_use_iface: bool  # this Horovod build's process sets honour HOROVOD_GLOO_IFACE
    down: tuple[str, ...] = ()  # interfaces that are not up (no carrier, or switched off)

    @property
    def label(self) -> str:
        return f"{self.host} ({self.node_ip})"


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


def network_env(iface: str, nccl_ifaces: Sequence[str]) -> dict[str, str]:
    """Gloo's interface, and NCCL's (``=``: exact names; NCCL otherwise matches prefixes, eth0 -> eth01)."""
    return {"HOROVOD_GLOO_IFACE": iface, "NCCL_SOCKET_IFNAME": "=" + ",".join(nccl_ifaces)}


def choose_interfaces(host: HostNetwork, nics: Sequence[str] | None) -> list[str]:
    """The interfaces a host's ranks use, the one for Gloo first: those of ``nics`` it has, in the
    order given, else the one holding Ray's address for the node. Empty: none fits."""
    if nics:
        return [name for name in nics if host.interfaces.get(name)]
    return [name for name, addresses in host.interfaces.items() if host.node_ip in addresses][:1]


def gloo_address(host: HostNetwork, iface: str) -> str:
    """Where Gloo binds on ``iface``: its first address (gloo/transport/tcp/device.cc, lookupAddrForIface)."""
    return host.interfaces[iface][0]


def is_loopback(address: str | None) -> bool:
    return address is not None and ipaddress.ip_address(address).is_loopback


def _no_interface(host: HostNetwork, nics: Sequence[str] | None) -> str:
    have = (
        "; ".join(
            [f"{name} {', '.join(addresses)}" for name, addresses in host.interfaces.items()]
            + [f"{name} (down)" for name in host.down]
        )
        or "none"
    )
    if nics:
        return f"{host.label} has none of horovod_nics {list(nics)}; its interfaces: {have}"
    return (
        f"{host.label}: no interface holds {host.node_ip}, the address Ray uses for the node; its interfaces: "
        f"{have}. Name the interfaces to use with horovod_nics"
    )


def _names_on_loopback(hosts: Sequence[HostNetwork]) -> str:
    names = "; ".join(f"{h.host} -> {h.hostname_address or 'nothing'}" for h in hosts)
    return (
        f"The host names of these hosts resolve to a loopback address or to nothing ({names}), as Debian and "
        "Ubuntu write /etc/hosts. Horovod 0.28.1 as released connects its process sets on the address of the "
        "host name, whatever interface it is given (horovod/common/gloo/gloo_context.cc:282, "
        "InitializeForProcessSet), so ranks on other hosts cannot reach these. Install the Horovod that "
        "`python -m airflow_provider_horovod.build_horovod` builds (it fixes this) on every node, or map each "
        "host's name to its network address in its /etc/hosts."
    )


def network_plan(hosts: Sequence[HostNetwork], nics: Sequence[str] | None) -> list[list[str]]:
    """Each node's interfaces (``choose_interfaces``), or HorovodNetworkError naming every host that
    has none, or that Horovod cannot be reached on."""
    plan = [choose_interfaces(host, nics) for host in hosts]
    if missing := [_no_interface(host, nics) for host, ifaces in zip(hosts, plan) if not ifaces]:
        raise HorovodNetworkError("Horovod cannot choose a network interface on every host:\n  " + "\n  ".join(missing))
    addresses = {gloo_address(host, ifaces[0]) for host, ifaces in zip(hosts, plan)}
    stuck = [
        h
        for h in hosts
        if not h.process_sets_use_iface and (h.hostname_address is None or is_loopback(h.hostname_address))
    ]
    if len(addresses) > 1 and stuck:
        raise HorovodNetworkError(_names_on_loopback(stuck))
    return plan


@dataclasses.dataclass(frozen=True)
class Unreachable:
    source: str  # the host that tried, as HostNetwork.label
    target: str  # what it tried to reach
    address: str
    port: int
    error: str


def unreachable_message(
    failures: Sequence[Unreachable], *, probe_timeout_s: float, timeout_s: int, nics: Sequence[str] | None
) -> str:
    tried = "\n".join(f"  {f.source} -> {f.target} at {f.address}:{f.port}: {f.error}" for f in failures)
    chosen = (
        f"horovod_nics={list(nics)}"
        if nics
        else "horovod_nics unset: each host uses the interface of the address Ray uses for its node"
    )
    return (
        f"Horovod's workers cannot reach each other over TCP (checked before hvd.init(), {probe_timeout_s:g} s "
        f"per connection):\n{tried}\n"
        "Gloo connects every worker to every other on these addresses, on ports from each host's ephemeral "
        "range (net.ipv4.ip_local_port_range), and to Horovod's rendezvous server in the Ray Train controller. "
        f"Allow TCP between the hosts on those ports, or choose the network with horovod_nics ({chosen}); "
        f"horovod_timeout_s (now {timeout_s}) bounds Horovod's own waits."
    )


# Run in the workers.


def _set_env(env: dict[str, str]) -> None:
    """Runs in each worker, before its training function calls ``hvd.init()``."""
    os.environ.update({k: v for k, v in env.items() if not (k in USER_SET_WINS and k in os.environ)})


def _host_network() -> HostNetwork:
    import psutil
    import ray

    up = {name for name, stats in psutil.net_if_stats().items() if stats.isup}  # isup: flag up and carrier
    interfaces = {
        name: [a.address.split("%")[0] for a in addresses if a.family in (socket.AF_INET, socket.AF_INET6)]
        for name, addresses in psutil.net_if_addrs().items()
    }
    return HostNetwork(
        socket.gethostname(),
        ray.util.get_node_ip_address(),
        {name: addresses for name, addresses in interfaces.items() if addresses and name in up},
        _gloo_hostname_address(),
        _process_sets_use_iface(),
        tuple(name for name, addresses in interfaces.items() if addresses and name not in up),
    )


def _gloo_hostname_address() -> str | None:
    """Gloo's choice with no interface: the first address of the host name that binds
    (gloo/transport/tcp/device.cc, lookupAddrForHostname)."""
    try:
        candidates = socket.getaddrinfo(socket.gethostname(), None, 0, socket.SOCK_STREAM)
    except OSError:
        return None
    for family, kind, proto, _, sockaddr in candidates:
        try:
            with socket.socket(family, kind, proto) as s:
                s.bind(sockaddr)
                return str(sockaddr[0])
        except OSError:
            continue
    return None


@functools.cache
def _process_sets_use_iface() -> bool:
    import importlib.util
    import mmap

    spec = importlib.util.find_spec("horovod")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        for path in glob.glob(os.path.join(folder, "torch", "mpi_lib_v2*.so")):
            with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as image:
                return image.find(PROCESS_SET_IFACE_MARKER) != -1
    return False


_PROBE: dict[str, socket.socket] = {}  # this worker's listening socket during the check


def _probe_listen(address: str) -> int:
    sock = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET)
    sock.bind((address, 0))  # an ephemeral port, as Gloo's
    sock.listen(128)  # the kernel completes the peers' connections; nothing needs to accept them
    _PROBE["listener"] = sock
    return sock.getsockname()[1]


def _probe_close() -> None:
    if sock := _PROBE.pop("listener", None):
        sock.close()


def _probe_connect(targets: Sequence[tuple[str, int]], timeout_s: float) -> list[str | None]:
    """An error for each (address, port) this worker cannot connect to, None for those it can."""

    def attempt(target: tuple[str, int]) -> str | None:
        try:
            socket.create_connection(target, timeout=timeout_s).close()
            return None
        except TimeoutError:
            return f"no answer within {timeout_s:g} s"
        except OSError as err:
            return err.strerror or str(err)

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(32, len(targets)))) as pool:
        return list(pool.map(attempt, targets))


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
_CHANGE_OF_STATE = {"ResizingState": "resize", "RestartingState": "restart", "PreemptingState": "preempt"}


class ControllerChanges(ControllerCallback):
    """Notes, in the controller, why the worker group is about to be replaced."""

    def after_controller_state_update(self, previous_state, current_state) -> None:
        if change := _CHANGE_OF_STATE.get(type(current_state).__name__):
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


def _any_node_gone(node_ids: Sequence[str]) -> bool:
    import ray

    alive = {node["NodeID"] for node in ray.nodes() if node.get("Alive")}
    return any(node not in alive for node in node_ids)


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
            bool(self._nodes) and _any_node_gone(self._nodes),
        )
        self._nodes = node_ids
        slots = get_host_assignments(parse_hosts(host_plan(node_ids)), len(node_ids))
        firsts = {node: node_ids.index(node) for node in dict.fromkeys(node_ids)}  # a rank on each node
        hosts = _call(worker_group, {rank: (_host_network,) for rank in firsts.values()}, "read its network")
        plan = dict(zip(firsts, network_plan(hosts, backend_config.nics)))
        port = self._start_server(slots)
        addr = ray.util.get_node_ip_address()
        try:
            self._check_reachable(worker_group, firsts, hosts, plan, (addr, port), backend_config)
        except BaseException:
            self._stop_server()
            raise
        ray.get(
            [
                worker_group.execute_single_async(
                    rank,
                    _set_env,
                    {
                        **rank_env(slot, rendezvous_addr=addr, rendezvous_port=port, config=backend_config),
                        **network_env(plan[node][0], plan[node]),
                        WORKER_GROUP_REASON_ENV: reason,
                    },
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

    def _check_reachable(
        self,
        worker_group,
        firsts: dict,
        hosts: Sequence[HostNetwork],
        plan: dict,
        rendezvous: tuple[str, int],
        config: HorovodV2Config,
    ) -> None:
        """Every node connects to every other node's Gloo address, and to the rendezvous server."""
        ranks = list(firsts.values())
        addresses = [gloo_address(host, plan[node][0]) for host, node in zip(hosts, firsts)]
        timeout_s = min(float(config.timeout_s), PROBE_TIMEOUT_S)
        ports = _call(worker_group, {r: (_probe_listen, a) for r, a in zip(ranks, addresses)}, "open a test port")
        nodes = [(f"{h.label} on {plan[node][0]}", a, p) for h, node, a, p in zip(hosts, firsts, addresses, ports)]
        server = (f"the rendezvous server (Ray Train controller, {rendezvous[0]})", *rendezvous)
        targets = [[t for j, t in enumerate(nodes) if j != i] + [server] for i in range(len(ranks))]
        try:
            errors = _call(
                worker_group,
                {rank: (_probe_connect, [(a, p) for _, a, p in targets[i]], timeout_s) for i, rank in enumerate(ranks)},
                "test its connections",
                timeout_s + RAY_CALL_TIMEOUT_S,
            )
        finally:
            _call(worker_group, {rank: (_probe_close,) for rank in ranks}, "close its test port")
        failures = [
            Unreachable(hosts[i].label, name, a, p, error)
            for i in range(len(ranks))
            for (name, a, p), error in zip(targets[i], errors[i])
            if error
        ]
        if failures:
            raise HorovodNetworkError(
                unreachable_message(failures, probe_timeout_s=timeout_s, timeout_s=config.timeout_s, nics=config.nics)
            )

    def on_shutdown(self, worker_group, backend_config: HorovodV2Config) -> None:
        self._stop_server()

    def _stop_server(self) -> None:
        if self._server is None:
            return
        server, self._server = self._server, None
        server.stop()
        # stop() ends the serving loop but leaves the port bound.
        server._httpd.server_close()


def _call(worker_group, calls: Mapping[int, tuple], what: str, timeout_s: float = RAY_CALL_TIMEOUT_S) -> list:
    """``fn(*args)`` on the given ranks, results in that order. A worker that does not answer in time
    fails the start, naming its node."""
    import ray

    refs = [worker_group.execute_single_async(rank, *call) for rank, call in calls.items()]
    ready, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    if pending:
        workers = worker_group.get_workers()
        late = [
            f"{workers[rank].metadata.hostname} ({workers[rank].metadata.node_ip})"
            for rank, ref in zip(calls, refs)
            if ref in pending
        ]
        raise HorovodNetworkError(
            f"The training workers on {', '.join(late)} did not {what} within {timeout_s:g} s "
            "of being asked through Ray."
        )
    return ray.get(refs)


class FreshElasticScalingPolicy(ElasticScalingPolicy):
    """Ray Train's elastic scaling policy, counting the workers that fit on a fresh view of the cluster.

    Ray's own asks Ray Data's AutoscalingCoordinator, which refreshes its view of the nodes every 20 s:
    right after a node is lost it still counts that node, so the run restarts at the old size, whose
    workers cannot be placed, and waits for them until the worker-group start timeout; and a node that
    comes back is seen up to 20 s late. Asking with ``recompute`` reads the nodes now (one ``ray.nodes()``
    in the coordinator, at most once a second)."""

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
        except Exception:  # noqa: BLE001 - as Ray's own: no resize this time, the next look retries
            pass
        self._latest_reserved_resources_query_time = time_monotonic()
        self._latest_reserved_resources = reserved
        return reserved


def _with_fresh_elastic_policy(trainer):
    """The trainer, its controller given ``FreshElasticScalingPolicy`` when the run is elastic."""
    start = trainer._initialize_and_run_controller

    def started(**kwargs):
        if trainer.scaling_config.elasticity_enabled:
            kwargs["scaling_policy"] = FreshElasticScalingPolicy(trainer.scaling_config)
        return start(**kwargs)

    trainer._initialize_and_run_controller = started
    return trainer


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


class NoDatasets:
    """Stands for Ray Train's dataset shard provider in the workers of a run given no datasets: asking
    for a shard fails as with Ray's own provider, saying why."""

    def get_dataset_shard(self, dataset_info):
        raise KeyError(
            f"Dataset shard for {dataset_info.dataset_name!r} not found: the training was given no datasets. "
            "Pass them with the operator's `datasets`."
        )


class NoDatasetsCallback(WorkerGroupCallback):
    """Ray Train's datasets callback for a run without datasets: it would start a DatasetManager actor
    (one more process, seconds of CPU for its imports, beside the workers' own start) for nothing."""

    def before_init_train_context(self, workers) -> dict:
        return {"dataset_shard_provider": [NoDatasets()] * len(workers)}


def _without_idle_actors(trainer, has_datasets: bool):
    """The trainer without the actors a provider job does not use. Ray Train's placement-group cleaner,
    a detached actor per run, removes the workers' placement group should the controller die while
    the driver lives on (a notebook); a provider job's driver ends when ``fit()`` does, and Ray removes
    a job's placement groups when the job ends. Its DatasetManager serves datasets the run may not
    have. Each is one more process to start, and the controller waits for the cleaner after the
    workers start and again at the end."""
    try:
        from ray.train.v2._internal.callbacks.datasets import DatasetsCallback
        from ray.train.v2._internal.callbacks.placement_group_callback import PlacementGroupCleanerCallback
    except ImportError:  # a Ray without them
        return trainer
    made = trainer._create_default_callbacks

    def callbacks():
        kept = []
        for callback in made():
            if isinstance(callback, PlacementGroupCleanerCallback):
                continue
            if isinstance(callback, DatasetsCallback) and not has_datasets:
                callback = NoDatasetsCallback()
            kept.append(callback)
        return kept

    trainer._create_default_callbacks = callbacks
    return trainer


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
):
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    run_config.callbacks.append(ControllerChanges())
    trainer = _with_fresh_elastic_policy(
        DataParallelTrainer(
            with_initial_checkpoint(train_fn, resume_from, run_config.storage_filesystem),
            train_loop_config=train_loop_config,
            backend_config=HorovodV2Config(timeout_s=timeout_s, nics=nics),
            scaling_config=scaling_config,
            run_config=run_config,
            datasets=datasets,
        )
    )
    return _without_idle_actors(trainer, has_datasets=bool(datasets))
