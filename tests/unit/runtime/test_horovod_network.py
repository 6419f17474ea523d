"""Horovod's network on the hosts of a run: the interfaces each host uses and the message when hosts cannot
reach each other, and the text that tells the provider's Horovod build apart. Pure."""

import dataclasses

import pytest

from airflow_provider_horovod import horovod_source_edits
from airflow_provider_horovod.runtime.horovod_network import (
    PROCESS_SET_IFACE_MARKER,
    HorovodNetworkError,
    HostNetwork,
    Unreachable,
    choose_interfaces,
    network_env,
    network_plan,
    unreachable_message,
)

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
    assert "a (10.0.0.1) has none of horovod_nics ['eth1']" in text
    assert "docker0 172.17.0.1" in text
    assert "c (10.0.0.3)" in text
    assert "eth1 (down)" in text


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
    # Decided by the build's edits (they make it), read here (the runtime imports no Airflow-side module).
    assert PROCESS_SET_IFACE_MARKER == horovod_source_edits.PROCESS_SET_IFACE_MARKER.encode()
    assert any(horovod_source_edits.PROCESS_SET_IFACE_MARKER in new for _, _, new in horovod_source_edits.REPLACEMENTS)


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
