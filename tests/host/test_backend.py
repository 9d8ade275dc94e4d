"""The device-free rules behind the verbs backend: GIDs, completion names, NUMA CPUs."""

import os

import pytest

from host.backend import GidEntry, choose_gid, gid_ipv4, ipv4_gid, wc_status_name
from host.errors import HostError
from host.numa import node_cpus, parse_cpulist, pin_to_node


def test_ipv4_gid_has_eight_groups():
    assert ipv4_gid("10.77.0.2") == "0000:0000:0000:0000:0000:ffff:0a4d:0002"
    assert ipv4_gid("255.255.255.255") == "0000:0000:0000:0000:0000:ffff:ffff:ffff"
    with pytest.raises(ValueError):
        ipv4_gid("10.77.0")


def test_gid_ipv4():
    assert gid_ipv4("0000:0000:0000:0000:0000:ffff:0a4d:0001") == "10.77.0.1"
    assert gid_ipv4("::ffff:192.168.0.9") == "192.168.0.9"
    assert gid_ipv4("fe80:0000:0000:0000:5054:00ff:fe12:3456") is None
    assert gid_ipv4("0000:0000:0000:0000:0000:0000:0000:0000") is None
    assert gid_ipv4("0000:0000:0000:0000:0000:ffff:0000:0000") is None
    assert gid_ipv4("not a gid") is None


def test_choose_gid_prefers_ipv4_roce_v2():
    link_local = GidEntry(0, "fe80:0000:0000:0000:5054:00ff:fe12:3456", True)
    v1 = GidEntry(1, ipv4_gid("10.77.0.1"), False)
    v2 = GidEntry(2, ipv4_gid("10.77.0.1"), True)
    unknown = GidEntry(3, ipv4_gid("10.77.0.9"), None)
    assert choose_gid([link_local, v1, v2, unknown]) == v2
    assert choose_gid([link_local, v1, unknown]) == unknown
    assert choose_gid([link_local, unknown, v2]).ip == "10.77.0.1"
    with pytest.raises(HostError, match=r"no IPv4 RoCEv2 GID.*ip addr add.*--gid-index"):
        choose_gid([link_local, v1], where="port 1 of rxe0")


def test_wc_status_names():
    assert wc_status_name(0) == "IBV_WC_SUCCESS"
    assert wc_status_name(5) == "IBV_WC_WR_FLUSH_ERR"
    assert wc_status_name(13) == "IBV_WC_RNR_RETRY_EXC_ERR"
    assert wc_status_name(99) == "IBV_WC status 99"


def test_parse_cpulist():
    assert parse_cpulist("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert parse_cpulist("0-7:2") == {0, 2, 4, 6}
    assert parse_cpulist("\n") == set()
    for bad in ("a-b", "3-1", "1-4:0"):
        with pytest.raises(ValueError, match="not a CPU list"):
            parse_cpulist(bad)


def test_node_cpus(tmp_path):
    (tmp_path / "node0").mkdir()
    (tmp_path / "node0" / "cpulist").write_text("0-1\n")
    (tmp_path / "node1").mkdir()
    (tmp_path / "node1" / "cpulist").write_text("\n")
    assert node_cpus(0, tmp_path) == {0, 1}
    with pytest.raises(HostError, match="NUMA node 3 does not exist.*node0, node1.*lscpu"):
        node_cpus(3, tmp_path)
    with pytest.raises(HostError, match="no CPUs"):
        node_cpus(1, tmp_path)


def test_pin_to_node_sets_the_affinity(tmp_path):
    before = os.sched_getaffinity(0)
    cpu = min(before)
    (tmp_path / "node0").mkdir()
    (tmp_path / "node0" / "cpulist").write_text(f"{cpu}\n")
    try:
        assert pin_to_node(0, tmp_path) == {cpu}
        assert os.sched_getaffinity(0) == {cpu}
    finally:
        os.sched_setaffinity(0, before)
