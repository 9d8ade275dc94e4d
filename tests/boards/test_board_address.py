# amaranth: UnusedElaboratable=no
"""BoardAddress: one write of the core's addresses after reset, the DIP switches added to
the last octet of the IPv4 and MAC address; all off = the build-time addresses."""

import ipaddress

import pytest

from boards.board_address import SETTLE_CYCLES, BoardAddress
from tests.gateware.streams import run_testbenches

BASE = {"mac": "02:00:00:00:00:02", "ip": "10.77.0.2", "netmask": "255.255.0.0",
        "gateway": "10.77.0.1"}


def expected(switches):
    """The addresses a board with ``switches`` set should have, from the strings."""
    mac = bytes.fromhex(BASE["mac"].replace(":", ""))
    return {"mac": int.from_bytes(mac[:5] + bytes([mac[5] + switches])),
            "ip": int(ipaddress.IPv4Address(BASE["ip"]) + switches),
            "netmask": int(ipaddress.IPv4Address(BASE["netmask"])),
            "gateway": int(ipaddress.IPv4Address(BASE["gateway"]))}


@pytest.mark.parametrize("switches", [0, 1, 0b1010, 0b1111])
def test_one_write_after_reset(switches):
    """The switches as read at reset decide; changing them later writes nothing."""
    dut = BoardAddress(**BASE)
    writes = []

    async def testbench(ctx):
        ctx.set(dut.i_switches, switches)
        ctx.set(dut.o_config.ready, 1)
        await ctx.tick().repeat(SETTLE_CYCLES + 3)
        ctx.set(dut.i_switches, switches ^ 0b0110)
        await ctx.tick().repeat(20)

    async def sink(ctx):
        async for _, _, valid, config in ctx.tick().sample(dut.o_config.valid, dut.o_config.p):
            if valid:
                writes.append({name: int(getattr(config, name))
                               for name in ("mac", "ip", "netmask", "gateway")})

    run_testbenches(dut, testbench, sink)
    assert writes == [expected(switches)]


def test_waits_for_the_core():
    """The write is held until the core takes it."""
    dut = BoardAddress(**BASE)

    async def testbench(ctx):
        ctx.set(dut.i_switches, 3)
        await ctx.tick().repeat(SETTLE_CYCLES + 5)
        assert ctx.get(dut.o_config.valid)
        ctx.set(dut.o_config.ready, 1)
        await ctx.tick()
        ctx.set(dut.o_config.ready, 0)
        assert not ctx.get(dut.o_config.valid)
        assert ctx.get(dut.o_config.p.ip) == expected(3)["ip"]

    run_testbenches(dut, testbench)


@pytest.mark.parametrize("address", [{"ip": "10.77.0.240"}, {"mac": "02:00:00:00:00:f1"}])
def test_base_without_room_for_the_switches(address):
    with pytest.raises(ValueError, match="leaves no room"):
        BoardAddress(**{**BASE, **address})
