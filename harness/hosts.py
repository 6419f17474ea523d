"""Test hosts on one machine: network namespaces on one bridge, each with its own address, host name,
interface name and ``/etc/hosts``, as separate machines on one L2 segment would have.

    with Hosts(2, ifaces=("eth0", "ens5"), etc_hosts=DEBIAN) as hosts:
        hosts.start_cluster()                       # a Ray head on host 1, a worker node on host 2
        hosts.run(hosts[0], ["python", "train.py"], env=hosts.env(RAY_ADDRESS=hosts.gcs_address))

Host i (from 1) is 10.77.0.i; the root namespace (the tests, Airflow, an S3 server) is 10.77.0.254 on
the bridge, so it reaches every host (the Ray dashboard on host 1 included) and every host reaches
it. ``data_ifaces`` adds a second network (10.177.0.i) between the hosts only, as clusters with a
separate network for training traffic have. ``ip netns exec`` bind-mounts ``/etc/netns/<ns>/hosts``
over ``/etc/hosts`` for what it runs; ``unshare --uts`` gives the host its own name. Nothing here
touches the machine's own interfaces, ``/etc/hosts`` or host name; where bridge netfilter is on (as
``dockerd`` leaves it, with a FORWARD policy of DROP) one ACCEPT rule per bridge lets the hosts reach
each other, and goes with the bridge.

Needs root and ``ip netns`` (``unavailable_reason()`` says why not). One set of hosts per subnet at a
time (a lock file). Cleaning up: ``down()`` (the context manager calls it); a watcher process does it
if the process that made the hosts dies first; and what a killed run left under the same names goes
before new hosts are made. ``python -m harness.hosts clean`` removes every set.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import glob
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

# Debian and Ubuntu: the machine's own name on 127.0.1.1, the other machines not listed.
DEBIAN = "debian"
# The same with the other hosts listed on their addresses (a hand-edited Debian file).
DEBIAN_WITH_PEERS = "debian-with-peers"
# Every host name on its own address.
WELL_CONFIGURED = "well-configured"
ETC_HOSTS_STYLES = (DEBIAN, DEBIAN_WITH_PEERS, WELL_CONFIGURED)

RAY_PORT = 6379
DASHBOARD_PORT = 8265
ROOT_HOST_BYTE = 254
PREFIX = "ahp"  # of every namespace, link and folder made here
LOCK_WAIT_S = 300.0


@dataclasses.dataclass(frozen=True)
class Host:
    index: int  # from 1
    name: str  # its host name
    netns: str
    iface: str  # its interface on the bridge, as the host sees it
    address: str
    data_iface: str | None = None  # its interface on the second network, if the hosts have one
    data_address: str | None = None

    def root_end(self, data: bool = False) -> str:
        """The veth end left in the root namespace, on a bridge (taking it down cuts the host off)."""
        return f"{self.netns}-{'d' if data else 'v'}"


def _sh(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, check=check, timeout=30)


def _exists(link: str) -> bool:
    return os.path.exists(f"/sys/class/net/{link}")


def unavailable_reason() -> str | None:
    """Why hosts cannot be made here, or None."""
    if os.geteuid() != 0:
        return "making test hosts (network namespaces) needs root"
    for tool in ("ip", "unshare"):
        if not shutil.which(tool):
            return f"making test hosts needs `{tool}`, which is not installed"
    probe = f"{PREFIX}-probe-{os.getpid()}"
    made = _sh("ip", "netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` does not work here: {made.stderr.strip()}"
    _sh("ip", "netns", "del", probe, check=False)
    return None


def skip_unless_available() -> None:
    """Skip the calling test (or module, at import) when hosts cannot be made, saying why."""
    import pytest

    if reason := unavailable_reason():
        pytest.skip(f"no test hosts: {reason}", allow_module_level=True)


def etc_hosts(style: str, me: Host, hosts: Sequence[Host]) -> str:
    """The ``/etc/hosts`` of host ``me`` in one of ``ETC_HOSTS_STYLES``."""
    lines = ["127.0.0.1 localhost"]
    if style == WELL_CONFIGURED:
        lines += [f"{h.address} {h.name}" for h in hosts]
    elif style in (DEBIAN, DEBIAN_WITH_PEERS):
        lines.append(f"127.0.1.1 {me.name}")
        if style == DEBIAN_WITH_PEERS:
            lines += [f"{h.address} {h.name}" for h in hosts if h is not me]
    else:
        raise ValueError(f"etc_hosts style {style!r}: one of {ETC_HOSTS_STYLES}")
    return "\n".join(lines) + "\n"


def cluster_python() -> str:
    # Imported here: the watcher runs this file as a script, where the harness package is not importable.
    from harness.cluster import cluster_python

    return cluster_python()


class Hosts:
    """``count`` hosts on one bridge; a context manager that removes them (and their processes).

    :param ifaces: each host's interface name (default ``eth0`` everywhere).
    :param etc_hosts: one of ``ETC_HOSTS_STYLES``.
    :param subnet: the first three bytes of the addresses (``10.<b>.<c>``); the second network's
        are ``10.<b + 100>.<c>``.
    :param names: the host names (default ``ahp-node1``, ...).
    :param env: more environment for everything run on the hosts (Ray's nodes pass it to their workers).
    :param data_ifaces: each host's interface name on the second network; None: no second network.
    """

    def __init__(
        self,
        count: int = 2,
        *,
        ifaces: Sequence[str] | None = None,
        etc_hosts: str = DEBIAN,
        subnet: str = "10.77.0",
        names: Sequence[str] | None = None,
        env: dict[str, str] | None = None,
        data_ifaces: Sequence[str] | None = None,
    ) -> None:
        ifaces = list(ifaces or ["eth0"] * count)
        names = list(names or [f"{PREFIX}-node{i}" for i in range(1, count + 1)])
        data = list(data_ifaces or [None] * count)
        assert len(ifaces) == len(names) == len(data) == count and etc_hosts in ETC_HOSTS_STYLES
        a, b, c = subnet.split(".")
        tag = f"{PREFIX}{int(b):02x}{int(c):02x}"  # unique per subnet, short: link names take 15 bytes
        self.subnet = subnet
        self.hosts = [
            Host(
                i,
                names[i - 1],
                f"{tag}-{i}",
                ifaces[i - 1],
                f"{subnet}.{i}",
                data[i - 1],
                f"{a}.{int(b) + 100}.{c}.{i}" if data[i - 1] else None,
            )
            for i in range(1, count + 1)
        ]
        self.bridge = f"{tag}-br"
        self.data_bridge = f"{tag}-dbr"
        self.root_address = f"{subnet}.{ROOT_HOST_BYTE}"
        self.workdir = f"/tmp/{tag}"  # short: Ray's socket paths must fit in 107 bytes
        self.style = etc_hosts
        self.extra_env = dict(env or {})
        self._lock = None
        self._watcher = None

    def __getitem__(self, i: int) -> Host:
        return self.hosts[i]

    def __enter__(self) -> Hosts:
        try:
            self.up()
        except BaseException:
            self.down()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.down()

    # -- making and removing ---------------------------------------------------------------------

    def up(self) -> None:
        self._take_lock()
        self._remove()  # a killed run's leftovers under the same names
        self._watcher = subprocess.Popen(  # removes the hosts if this process dies without doing so
            [
                sys.executable,
                os.path.abspath(__file__),
                "watch",
                str(os.getpid()),
                self._lock_path,
                json.dumps(self._spec()),
            ],
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.makedirs(self.workdir)
        with open(self.token_path, "w") as f:
            f.write(secrets.token_hex(32))
        for bridge in (self.bridge, self.data_bridge):
            _sh("ip", "link", "add", bridge, "type", "bridge")
            _sh("ip", "link", "set", bridge, "up")
        _sh("ip", "addr", "add", f"{self.root_address}/24", "dev", self.bridge)
        for bridge in (self.bridge, self.data_bridge):
            allow_bridged(bridge)
        for host in self.hosts:
            _sh("ip", "netns", "add", host.netns)
            _sh("ip", "-n", host.netns, "link", "set", "lo", "up")
            self._plug(host, host.iface, host.address, data=False)
            if host.data_iface:
                self._plug(host, host.data_iface, host.data_address, data=True)
            self.write_etc_hosts(host, self.style)
        self._pin_neighbours()

    @property
    def _lock_path(self) -> str:
        return f"/run/{PREFIX}-hosts-{self.subnet}.lock"

    def _take_lock(self) -> None:
        self._lock = open(self._lock_path, "w")  # the kernel releases it if this process dies
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    self._lock.close()
                    self._lock = None
                    raise RuntimeError(
                        f"other test hosts on {self.subnet} have been up for {LOCK_WAIT_S:g} s; "
                        "give these another subnet"
                    ) from None
                time.sleep(0.5)

    def _plug(self, host: Host, iface: str, address: str, *, data: bool) -> None:
        """A veth pair from the host to a bridge: ``iface`` with ``address`` inside, ``root_end`` outside."""
        tmp = host.root_end(data) + "t"  # made in the root namespace, renamed inside the host
        _sh("ip", "link", "add", tmp, "type", "veth", "peer", "name", host.root_end(data))
        _sh("ip", "link", "set", tmp, "netns", host.netns)
        _sh("ip", "-n", host.netns, "link", "set", tmp, "name", iface)
        _sh("ip", "-n", host.netns, "addr", "add", f"{address}/24", "dev", iface)
        _sh("ip", "-n", host.netns, "link", "set", iface, "up")
        _sh("ip", "link", "set", host.root_end(data), "master", self.data_bridge if data else self.bridge)
        _sh("ip", "link", "set", host.root_end(data), "up")

    def _pin_neighbours(self) -> None:
        """Every host knows the others' hardware addresses for good, so that with a host isolated its
        packets are sent and lost (a connection times out, as behind a firewall that drops them)
        rather than refused at once for want of an ARP answer."""

        def mac(host: Host, iface: str) -> str:
            return json.loads(_sh("ip", "-n", host.netns, "-j", "link", "show", "dev", iface).stdout)[0]["address"]

        for data in (False, True):
            plugged = [(h, h.data_iface, h.data_address) if data else (h, h.iface, h.address) for h in self.hosts]
            plugged = [p for p in plugged if p[1]]
            for host, iface, _ in plugged:
                for peer, peer_iface, peer_address in plugged:
                    if peer is not host:
                        _sh(
                            "ip",
                            "-n",
                            host.netns,
                            "neigh",
                            "replace",
                            peer_address,
                            "lladdr",
                            mac(peer, peer_iface),
                            "dev",
                            iface,
                            "nud",
                            "permanent",
                        )

    def write_etc_hosts(self, host: Host, style: str) -> None:
        """Rewritten in place: the processes already on the host see the new file too."""
        os.makedirs(f"/etc/netns/{host.netns}", exist_ok=True)
        with open(f"/etc/netns/{host.netns}/hosts", "w") as f:
            f.write(etc_hosts(style, host, self.hosts))

    def down(self) -> None:
        """Every process on the hosts, the hosts, the bridges and the work folder. Safe to call twice."""
        self._remove()
        if self._watcher:
            self._watcher.kill()
            self._watcher.wait()
            self._watcher = None
        if self._lock:
            self._lock.close()
            self._lock = None

    def _spec(self) -> dict:
        return {
            "netns": [h.netns for h in self.hosts],
            "bridges": [self.bridge, self.data_bridge],
            "workdir": self.workdir,
        }

    def _remove(self) -> None:
        remove(**self._spec())

    def pids(self, host: Host) -> list[int]:
        """The processes living in the host's network namespace."""
        return _pids(host.netns)

    # -- running things on a host ----------------------------------------------------------------

    def command(self, host: Host, cmd: Sequence[str]) -> list[str]:
        """``cmd`` as run on ``host``: in its network namespace (and its /etc/hosts), under its name."""
        return [
            "ip",
            "netns",
            "exec",
            host.netns,
            "unshare",
            "--uts",
            "sh",
            "-c",
            'hostname "$0" && exec "$@"',
            host.name,
            *cmd,
        ]

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of what runs on the hosts: the cluster's Python first on PATH, Ray's token."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        env.update(
            {
                "PATH": os.path.dirname(cluster_python()) + os.pathsep + os.environ.get("PATH", ""),
                "RAY_AUTH_MODE": "token",
                "RAY_AUTH_TOKEN_PATH": self.token_path,
                "RAY_USAGE_STATS_ENABLED": "0",
                # Cluster mode: Ray's nodes on their hosts' addresses (see local._ray_env).
                "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1",
            }
        )
        env.update(self.extra_env)
        env.update(extra)
        return env

    def run(
        self,
        host: Host,
        cmd: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        timeout: float = 120,
        check: bool = True,
    ) -> subprocess.CompletedProcess:
        done = subprocess.run(
            self.command(host, cmd), env=env or self.env(), capture_output=True, text=True, timeout=timeout
        )
        if check and done.returncode != 0:
            raise RuntimeError(
                f"{' '.join(cmd)} on {host.name} exited {done.returncode}:\n"
                f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
            )
        return done

    def popen(self, host: Host, cmd: Sequence[str], *, env: dict[str, str] | None = None, **kwargs) -> subprocess.Popen:
        return subprocess.Popen(self.command(host, cmd), env=env or self.env(), **kwargs)

    # -- Ray -------------------------------------------------------------------------------------

    @property
    def token_path(self) -> str:
        return os.path.join(self.workdir, "auth_token")

    @property
    def token(self) -> str:
        with open(self.token_path) as f:
            return f.read().strip()

    @property
    def gcs_address(self) -> str:
        return f"{self.hosts[0].address}:{RAY_PORT}"

    @property
    def dashboard_url(self) -> str:
        """Reachable from the root namespace (the tests, Airflow) as from the hosts."""
        return f"http://{self.hosts[0].address}:{DASHBOARD_PORT}"

    def _ray(
        self, host: Host, *args: str, num_cpus: int, resources: dict | None, timeout: float, num_gpus: int = 0
    ) -> None:
        # Each node also holds one `host<i>` resource, so a test can pin a worker to a host.
        self.run(
            host,
            [
                os.path.join(os.path.dirname(cluster_python()), "ray"),
                "start",
                *args,
                f"--node-ip-address={host.address}",
                f"--num-cpus={num_cpus}",
                # GPUs the machine does not have: Ray schedules them and sets CUDA_VISIBLE_DEVICES all the same.
                f"--num-gpus={num_gpus}",
                f"--resources={json.dumps({f'host{host.index}': 1, **(resources or {})})}",
                "--disable-usage-stats",
            ],
            timeout=timeout,
        )

    def start_head(self, *, num_cpus: int = 2, resources: dict | None = None, timeout: float = 120) -> None:
        """The Ray head on host 1, on its address, with the dashboard there too (token auth)."""
        host = self.hosts[0]
        self._ray(
            host,
            "--head",
            f"--port={RAY_PORT}",
            "--include-dashboard=true",
            f"--dashboard-host={host.address}",
            f"--dashboard-port={DASHBOARD_PORT}",
            f"--temp-dir={self.workdir}/ray",
            num_cpus=num_cpus,
            resources=resources,
            timeout=timeout,
        )

    def join(
        self, host: Host, *, num_cpus: int = 2, num_gpus: int = 0, resources: dict | None = None, timeout: float = 120
    ) -> None:
        """A Ray worker node on ``host``, joined to the head on host 1 (which must be up)."""
        self._ray(
            host,
            f"--address={self.gcs_address}",
            # A folder of its own, as another machine has: in the head's, the nodes would share one session
            # folder on this one disk, where a script's legacy job across hosts lost its working_dir (likely one
            # node's runtime env agent removing it) and failed at start (Ray before 2.60 ignores the option).
            f"--temp-dir={self.workdir}/ray-{host.index}",
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            resources=resources,
            timeout=timeout,
        )

    def start_cluster(self, *, num_cpus: int = 2, timeout: float = 120) -> None:
        """A head on host 1 and a worker node on every other host; returns once all are alive."""
        self.start_head(num_cpus=num_cpus, timeout=timeout)
        for host in self.hosts[1:]:
            self.join(host, num_cpus=num_cpus, timeout=timeout)
        self.wait_for_nodes(len(self.hosts), timeout=timeout)

    def alive_nodes(self) -> list[str]:
        """Addresses of the Ray nodes alive, one per node (a host's twice if it runs two), as the head's
        State API tells the root namespace; [] when it does not answer. (The dashboard's node summary
        shows one node per address, the dead one where a host's node died and another joined.)"""
        import urllib.request

        request = urllib.request.Request(
            f"{self.dashboard_url}/api/v0/nodes?limit=1000", headers={"Authorization": f"Bearer {self.token}"}
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                nodes = json.load(response)["data"]["result"]["result"]
        except (OSError, ValueError, KeyError):
            return []
        return sorted(n["node_ip"] for n in nodes if n.get("state") == "ALIVE")

    def wait_for_nodes(self, count: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while len(self.alive_nodes()) != count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"expected {count} Ray nodes alive, the head sees {self.alive_nodes()}")
            time.sleep(0.5)

    def stop_ray(self, host: Host) -> None:
        """As if the machine lost its power: every process on ``host`` (its Ray node and anything the
        test started there) gets SIGKILL at once, nothing graceful (no raylet says goodbye, so the head
        learns of the loss only from missed heartbeats); the host stays, so ``join`` can bring it back."""
        _kill([host.netns], signals=(signal.SIGKILL,))

    # -- the network -----------------------------------------------------------------------------

    def link(self, host: Host, up: bool, *, data: bool = False) -> None:
        """Take ``host``'s link to a network (``data``: the second one) down, as a switch port going
        down (the host sees no carrier), or up again."""
        _sh("ip", "link", "set", host.root_end(data), "up" if up else "down")

    def isolate(self, host: Host, isolated: bool = True, *, data: bool = False) -> None:
        """Unplug ``host``'s cable from the switch but leave the link up: nothing gets through, as
        behind a firewall that drops; or plug it back."""
        master = ["nomaster"] if isolated else ["master", self.data_bridge if data else self.bridge]
        _sh("ip", "link", "set", host.root_end(data), *master)


def _bridged_rule(bridge: str) -> list[str]:
    return ["FORWARD", "-i", bridge, "-o", bridge, "-j", "ACCEPT"]


def allow_bridged(bridge: str) -> None:
    """Let the hosts' frames cross ``bridge`` whatever the root namespace's FORWARD chain says: where
    bridge netfilter is on (dockerd turns it on, and sets FORWARD's policy to DROP, also while hosts are
    up), bridged frames go through that chain. One rule of this bridge's own, first in the chain (inert
    while bridge netfilter is off); ``remove`` deletes it."""
    if shutil.which("iptables"):
        _sh("iptables", "-w", "-I", *_bridged_rule(bridge))


def _disallow_bridged(bridge: str) -> None:
    if shutil.which("iptables"):
        # Every copy of the rule (a killed run's, then this one's), until none is left.
        while _sh("iptables", "-w", "-D", *_bridged_rule(bridge), check=False).returncode == 0:
            pass


def _pids(netns: str) -> list[int]:
    listed = _sh("ip", "netns", "pids", netns, check=False)
    return [int(p) for p in listed.stdout.split()] if listed.returncode == 0 else []


def _kill(
    netns: Sequence[str], grace_s: float = 3.0, signals: Sequence[signal.Signals] = (signal.SIGTERM, signal.SIGKILL)
) -> None:
    """Every process in the namespaces: each of ``signals`` in turn (by default SIGTERM, then what is
    left after ``grace_s`` SIGKILL); after the last, until none is left (5 s at most)."""
    for i, sig in enumerate(signals):
        # Listed, then signalled at once: a process forked meanwhile gets the next round.
        for pid in [pid for ns in netns for pid in _pids(ns)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + (grace_s if i < len(signals) - 1 else 5.0)
        while any(_pids(ns) for ns in netns) and time.monotonic() < deadline:
            if sig == signal.SIGKILL:  # what was forked between the listing and the kill
                for pid in [pid for ns in netns for pid in _pids(ns)]:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, sig)
            time.sleep(0.1)


def remove(netns: Sequence[str], bridges: Sequence[str], workdir: str) -> None:
    """The namespaces with their processes, whatever links of theirs are left in the root namespace,
    the bridges and the work folder; what does not exist is skipped."""
    _kill([ns for ns in netns if os.path.exists(f"/run/netns/{ns}")])
    for ns in netns:
        if os.path.exists(f"/run/netns/{ns}"):
            _sh("ip", "netns", "del", ns, check=False)
        # The veth pairs go with the namespace; a half-made one may be left in the root.
        for link in (f"{ns}-v", f"{ns}-vt", f"{ns}-d", f"{ns}-dt"):
            if _exists(link):
                _sh("ip", "link", "del", link, check=False)
        shutil.rmtree(f"/etc/netns/{ns}", ignore_errors=True)
    for bridge in bridges:
        if _exists(bridge):
            _sh("ip", "link", "del", bridge, check=False)
        _disallow_bridged(bridge)
    shutil.rmtree(workdir, ignore_errors=True)


def _watch(parent: int, lock_path: str, spec: dict) -> None:
    """Wait for ``parent`` to end, then remove its hosts (unless ``down`` killed this watcher first),
    holding their lock: never while another set of hosts on the subnet is up."""
    while os.path.exists(f"/proc/{parent}"):
        time.sleep(1)
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        remove(**spec)


def clean_all() -> None:
    """Every set of hosts made here, whoever made them."""
    names = _sh("ip", "netns", "list", check=False).stdout.split()
    remove(
        [n for n in names if n.startswith(PREFIX) and "-" in n],
        [os.path.basename(p) for p in glob.glob(f"/sys/class/net/{PREFIX}*-*br")],
        "/nonexistent",
    )
    for folder in glob.glob(f"/tmp/{PREFIX}[0-9a-f][0-9a-f][0-9a-f][0-9a-f]"):
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["watch"]:
        _watch(int(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4]))
    elif sys.argv[1:] == ["clean"]:
        clean_all()
    else:
        sys.exit("usage: python -m harness.hosts clean")
