"""Horovod's network on the hosts of a Ray Train run: which interface each host's ranks use, and a check,
before any ``hvd.init()``, that every host reaches every other one there and the rendezvous server.

Gloo binds every rank to one address and hands it to the others through the rendezvous. Left to itself it
takes the address of the host name, which Debian and Ubuntu put on 127.0.1.1, where no other host can
reach it. So each node's ranks are given an interface: the one holding the address Ray uses for that node
(Ray's nodes already reach each other there), or the first of ``horovod_nics`` the host has. A firewall or
a wrong interface then fails the run with a message naming hosts, addresses and ports, rather than as
Gloo's abort of the worker process.

The plan is pure (``network_plan``, ``unreachable_message``); the functions prefixed ``_`` run in the
workers; ``check_reachable`` and ``call_ranks`` drive them from the controller (runtime.horovod_backend).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import glob
import ipaddress
import os
import socket
from collections.abc import Mapping, Sequence

from airflow_provider_horovod.exceptions import HorovodNetworkError

# A connection to a listening socket takes milliseconds on a working network: the check gives each
# one this long at most (and never longer than the Horovod timeout).
PROBE_TIMEOUT_S = 10.0
REACH_CHECK = "Checking that Horovod's workers reach each other"  # the log's line as the check starts
# Ray's own calls to the workers around the check (they are on the nodes already).
RAY_CALL_TIMEOUT_S = 60.0
# Text the provider's Horovod build (build_horovod) adds to the binary with its fix that makes process
# sets use HOROVOD_GLOO_IFACE too; Horovod 0.28.1 as released lacks both.
PROCESS_SET_IFACE_MARKER = b"Gloo process set device on interface"


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


def read_host_network() -> HostNetwork:
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


# Run from the controller.


def check_reachable(
    worker_group,
    firsts: Mapping[str, int],
    hosts: Sequence[HostNetwork],
    plan: Mapping[str, list[str]],
    rendezvous: tuple[str, int],
    *,
    timeout_s: int,
    nics: Sequence[str] | None,
) -> None:
    """Every node (``firsts``: node -> a rank on it) connects to every other node's Gloo address, and to the
    rendezvous server; HorovodNetworkError naming what failed."""
    ranks = list(firsts.values())
    addresses = [gloo_address(host, plan[node][0]) for host, node in zip(hosts, firsts)]
    probe_s = min(float(timeout_s), PROBE_TIMEOUT_S)
    # Said before the wait, so that a log that stops here points at the network between the hosts.
    print(f"{REACH_CHECK} and the rendezvous ({len(ranks)} host(s), {probe_s:g} s per connection).", flush=True)
    ports = call_ranks(worker_group, {r: (_probe_listen, a) for r, a in zip(ranks, addresses)}, "open a test port")
    nodes = [(f"{h.label} on {plan[node][0]}", a, p) for h, node, a, p in zip(hosts, firsts, addresses, ports)]
    server = (f"the rendezvous server (Ray Train controller, {rendezvous[0]})", *rendezvous)
    targets = [[t for j, t in enumerate(nodes) if j != i] + [server] for i in range(len(ranks))]
    try:
        errors = call_ranks(
            worker_group,
            {rank: (_probe_connect, [(a, p) for _, a, p in targets[i]], probe_s) for i, rank in enumerate(ranks)},
            "test its connections",
            probe_s + RAY_CALL_TIMEOUT_S,
        )
    finally:
        call_ranks(worker_group, {rank: (_probe_close,) for rank in ranks}, "close its test port")
    failures = [
        Unreachable(hosts[i].label, name, a, p, error)
        for i in range(len(ranks))
        for (name, a, p), error in zip(targets[i], errors[i])
        if error
    ]
    if failures:
        message = unreachable_message(failures, probe_timeout_s=probe_s, timeout_s=timeout_s, nics=nics)
        raise HorovodNetworkError(message)


def call_ranks(worker_group, calls: Mapping[int, tuple], what: str, timeout_s: float = RAY_CALL_TIMEOUT_S) -> list:
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
