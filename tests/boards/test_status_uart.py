# amaranth: UnusedElaboratable=no
"""StatusUart: the status line decoded from the serial wire (8N1, sampled mid-bit as a UART
receiver does) equals the line Python formats from the same values."""

import pytest
from amaranth.lib import data

from boards.cmac_link import LINK_STATUS
from boards.status_uart import PortStatusUart, StatusUart, status_line
from tests.gateware.streams import run_testbenches

DIVISOR = 3
SMALL = data.StructLayout({"up": 1, "lock": 6, "count": 32})


async def receive_line(ctx, tx, divisor):
    """Characters from the wire up to and including LF, as a UART receiver reads them."""
    line = ""
    while not line.endswith("\n"):
        while ctx.get(tx):                      # idle: wait for the start bit
            await ctx.tick()
        await ctx.tick().repeat(divisor + divisor // 2)   # to the middle of data bit 0
        byte = 0
        for bit in range(8):
            byte |= ctx.get(tx) << bit
            await ctx.tick().repeat(divisor)
        assert ctx.get(tx) == 1, "no stop bit"
        line += chr(byte)
    return line


def run(layout, values, *, interval):
    """Lines received while ``values`` are applied one per line; returns them."""
    dut = StatusUart(layout, divisor=DIVISOR, interval=interval)
    lines = []

    async def testbench(ctx):
        for value in values:
            ctx.set(dut.i, value)
            lines.append(await receive_line(ctx, dut.o_tx, DIVISOR))

    run_testbenches(dut, testbench)
    return lines


def test_lines_of_a_small_layout():
    values = [{"up": 1, "lock": 0b101101, "count": 0xdeadbeef},
              {"up": 0, "lock": 0, "count": 7}]
    lines = run(SMALL, values, interval=2000)
    assert lines == [status_line(SMALL, value) for value in values]
    assert lines[0] == "up=1 lock=2d count=deadbeef\r\n"


def test_link_status_line():
    value = {"up": 1, "rx_aligned": 1, "remote_fault": 0, "rsfec_am_lock": 0b1011,
             "rsfec_aligned": 1, "rsfec_hi_ser": 0, "ups": 3, "downs": 2,
             "rsfec_corrected": 0x12345, "rsfec_uncorrected": 0xffffffff}
    lines = run(LINK_STATUS, [value], interval=10_000)
    assert lines == [status_line(LINK_STATUS, value)]


def test_ports_in_turn():
    """Two ports: a line each in turn, ``port=`` first, each port's record as it was when
    its line started; each port's line every interval."""
    interval = 4000
    dut = PortStatusUart(SMALL, ports=2, divisor=DIVISOR, interval=interval)
    records = [{"up": 1, "lock": 0b101101, "count": 0xdeadbeef}, {"up": 0, "lock": 7, "count": 3}]
    lines, starts = [], []

    async def testbench(ctx):
        for port, record in enumerate(records):
            ctx.set(dut.i[port], record)
        for _ in range(5):
            lines.append(await receive_line(ctx, dut.o_tx, DIVISOR))
            if len(lines) == 2:
                ctx.set(dut.i[0].count, 0x1234)

    async def line_starts(ctx):
        """The cycles of the start bits that follow an idle wire (a line's first)."""
        cycle, idle = 0, 0
        async for _, _, tx in ctx.tick().sample(dut.o_tx):
            if not tx and idle > 12 * DIVISOR:
                starts.append(cycle)
            idle = idle + 1 if tx else 0
            cycle += 1

    run_testbenches(dut, testbench, line_starts)
    line = dut.line_layout
    assert lines == [status_line(line, {"port": 1, **records[0]}),
                     status_line(line, {"port": 2, **records[1]}),
                     status_line(line, {"port": 1, **records[0], "count": 0x1234}),
                     status_line(line, {"port": 2, **records[1]}),
                     status_line(line, {"port": 1, **records[0], "count": 0x1234})]
    assert lines[0] == "port=1 up=1 lock=2d count=deadbeef\r\n"
    assert [b - a for a, b in zip(starts, starts[1:], strict=False)] == [interval // 2] * 4


def test_interval_must_hold_a_line():
    with pytest.raises(ValueError, match="shorter than a line"):
        StatusUart(SMALL, divisor=DIVISOR, interval=100)
