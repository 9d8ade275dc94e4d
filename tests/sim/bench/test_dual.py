# amaranth: UnusedElaboratable=no
"""The arithmetic and the table of ``python -m sim.bench.dual`` (the dual-core simulation
itself runs in ``make bench``), and the design it simulates: each port of the two-cage
top with its core's ports and its addresses."""

import inspect

import pytest

from boards.vcu118_top import PORT2_ADDRESS, VCU118DualTop
from gateware.core import NetworkCore
from sim.bench.connectx import frame_length
from sim.bench.dual import TARGET, DualCores, dual_table, meets_target, peer_ip, total_row

CLOCK_HZ = 322_265_625
#: A 100 Gb/s line's bytes per cycle of the clock; a frame also costs it 4 bytes of FCS,
#: 8 of preamble and SFD and 12 of gap.
LINE_BYTES = 100e9 / 8 / CLOCK_HZ
FRAME = frame_length("RDMA_WRITE", 4096)          # Scapy's frame, no FCS


def measured(port, *, messages=256, fraction=1.0, first_cycle=1000):
    """A port's measurement whose line was busy ``1 / fraction`` of the theory's cycles."""
    cycles = messages * (FRAME + 24) / LINE_BYTES / fraction
    return {"port": port, "ip": f"10.77.{port - 1}.2", "messages": messages, "length": 4096,
            "path_mtu": 4096, "round_trip": 645, "first_cycle": first_cycle,
            "line_cycles": cycles, "retransmitted": 0, "timeouts": 0}


def test_a_port_at_the_line_rate_is_at_its_theory():
    table = dual_table([measured(1), measured(2)])
    one, two, both = table.rows
    theory = 4096 / (FRAME + 24) * 100
    assert one["frame"] == FRAME
    assert one["gbps"] == pytest.approx(theory) == two["gbps"]
    assert one["of_theory"] == pytest.approx(1.0)
    assert both["port"] == "both"
    assert both["gbps"] == pytest.approx(2 * theory) == pytest.approx(195.3, abs=0.1)
    assert both["of_theory"] == pytest.approx(1.0) and both["together"] == pytest.approx(1.0)
    assert meets_target(table)


def test_the_total_counts_the_cycles_of_either_port():
    # Port 2 starts when port 1 is half done: the total is the bytes of both over 1.5
    # times a port's cycles, and the lines were busy together half the time.
    half = measured(1)["line_cycles"] / 2
    rows = dual_table([measured(1), measured(2, first_cycle=1000 + half)]).rows
    assert rows[2]["line_cycles"] == pytest.approx(3 * half)
    assert rows[2]["of_theory"] == pytest.approx(2 / 3)
    assert rows[2]["together"] == pytest.approx(0.5)
    # Ports that never overlap were never busy together.
    apart = total_row([{**rows[0]}, {**rows[1], "first_cycle": 1000 + 4 * half}])
    assert apart["together"] == 0


@pytest.mark.parametrize("fraction, meets", [(TARGET, True), (TARGET - 0.001, False)])
def test_each_port_must_reach_the_target(fraction, meets):
    table = dual_table([measured(1), measured(2, fraction=fraction)])
    assert table.rows[1]["of_theory"] == pytest.approx(fraction)
    assert meets_target(table) is meets
    assert "| both |" in table.markdown()


def test_the_design_is_each_port_of_the_two_cage_top():
    top = VCU118DualTop()
    cores = DualCores(top)
    defaults = inspect.signature(NetworkCore).parameters
    assert cores.addresses == [(defaults["mac"].default, defaults["ip"].default),
                               (PORT2_ADDRESS["mac"], PORT2_ADDRESS["ip"])]
    members = cores.signature.members
    for prefix, port in zip(("p1_", "p2_"), (top.port1, top.port2), strict=True):
        core = port.core.signature.members
        assert {name for name in core if name != "config"} == \
            {name.removeprefix(prefix) for name in members if name.startswith(prefix)}
        assert all(members[prefix + name] == core[name] for name in core if name != "config")
    assert [peer_ip(ip) for _, ip in cores.addresses] == ["10.77.0.1", "10.77.1.1"]
