"""The network faults of the spread deployment, as iptables rules inside a host's network namespace
(this kernel has no ``netem``): a partition drops every packet to and from a peer (or one of its
ports), a lossy link drops a random share of the host's packets (iptables' ``statistic`` match).
Nothing here touches the root namespace: each host has its own tables, and they go with it.

A rule is the list of arguments after iptables' verb (``-A``/``-D``), so that the same list adds and
removes it.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence


def drop_peer(peer: str, port: int | None = None) -> list[list[str]]:
    """The rules that cut a host off from ``peer`` (an address), both ways; with ``port``, only its
    TCP connections to that port of the peer (a server there), the rest of the link left as it is."""
    to_peer = ["-d", peer, *(["-p", "tcp", "--dport", str(port)] if port else [])]
    from_peer = ["-s", peer, *(["-p", "tcp", "--sport", str(port)] if port else [])]
    return [["OUTPUT", *to_peer, "-j", "DROP"], ["INPUT", *from_peer, "-j", "DROP"]]


def drop_share(iface: str, share: float) -> list[list[str]]:
    """The rules that drop ``share`` (0-1) of the packets a host sends and receives on ``iface``, each
    packet drawn on its own (loopback untouched)."""
    if not 0.0 < share < 1.0:
        raise ValueError(f"a share of packets between 0 and 1, not {share}")
    draw = ["-m", "statistic", "--mode", "random", "--probability", f"{share:.3f}", "-j", "DROP"]
    return [["INPUT", "-i", iface, *draw], ["OUTPUT", "-o", iface, *draw]]


def command(netns: str, verb: str, rule: Sequence[str]) -> list[str]:
    """The command that adds (``-A``) or deletes (``-D``) ``rule`` in ``netns``'s own tables; ``-w``:
    waits for the tables' lock rather than failing when another rule is being changed."""
    if verb not in ("-A", "-D"):
        raise ValueError(f"verb -A or -D, not {verb}")
    return ["ip", "netns", "exec", netns, "iptables", "-w", verb, *rule]


def apply(netns: str, rules: list[list[str]]) -> None:
    for rule in rules:
        subprocess.run(command(netns, "-A", rule), check=True, capture_output=True, text=True, timeout=30)


def remove(netns: str, rules: list[list[str]]) -> None:
    """Each rule deleted (one that is not there is skipped: removing is safe to repeat)."""
    for rule in rules:
        subprocess.run(command(netns, "-D", rule), check=False, capture_output=True, text=True, timeout=30)


def flush(netns: str) -> None:
    """Every rule of the namespace's filter table (a run's end mends what a fault may have left)."""
    subprocess.run(["ip", "netns", "exec", netns, "iptables", "-w", "-F"], check=False, capture_output=True, timeout=30)
