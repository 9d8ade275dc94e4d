"""The gate the core puts before the MAC for a PAUSE (a PacketGate): a frame that has
started always finishes, the next waits for the pause to end. Frames from Scapy. (A PFC
holds RoCEv2 frames where they leave the requester: tests/sim/pause_bench.py.)"""

from scapy.contrib.roce import BTH
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import ARP, Ether

from gateware.packet.gate import PacketGate

from .streams import held_while_stalled, run_testbenches, to_beats

WIDTH = 64
ETH = Ether(src="02:00:00:00:00:02", dst="52:54:00:12:34:56")
ROCE = bytes(ETH / IP(src="10.77.0.2", dst="10.77.0.1") / UDP(sport=0xC000, dport=4791)
             / BTH(opcode=10, dqpn=0x300) / bytes(200))
ECHO = bytes(ETH / IP(src="10.77.0.2", dst="10.77.0.1") / UDP(sport=7, dport=4000) / bytes(150))
ARP_REQUEST = bytes(Ether(src="02:00:00:00:00:02", dst="ff:ff:ff:ff:ff:ff")
                    / ARP(psrc="10.77.0.2", pdst="10.77.0.1")).ljust(60, b"\0")


def gate_run(frames, control):
    """Send ``frames`` back to back while ``control(ctx, dut, cycle)`` drives the hold input;
    returns ``[(first cycle, last cycle, bytes)]`` of the frames out."""
    dut = PacketGate(width=WIDTH)
    out = []

    async def source(ctx):
        for frame in frames:
            for data, keep, last in to_beats(frame, WIDTH):
                ctx.set(dut.i.valid, 1)
                ctx.set(dut.i.payload, {"data": data, "keep": keep, "last": last})
                await ctx.tick().until(dut.i.ready)
        ctx.set(dut.i.valid, 0)

    async def sink(ctx):
        ctx.set(dut.o.ready, 1)
        frame, first = b"", None
        for cycle in range(400):
            control(ctx, dut, cycle)
            _, _, valid, beat = await ctx.tick().sample(dut.o.valid, dut.o.payload)
            if valid:
                first = cycle if first is None else first
                frame += int(beat.data).to_bytes(WIDTH, "little")[:bin(int(beat.keep)).count("1")]
                if beat.last:
                    out.append((first, cycle, frame))
                    frame, first = b"", None

    run_testbenches(dut, sink, source, held_while_stalled(dut.o))
    return out


def test_pause_holds_every_frame_but_the_one_under_way():
    def control(ctx, dut, cycle):
        ctx.set(dut.i_hold, 1 <= cycle < 60)     # rises on the ROCE frame's 2nd beat

    out = gate_run([ROCE, ARP_REQUEST, ECHO], control)
    assert [frame for *_, frame in out] == [ROCE, ARP_REQUEST, ECHO]
    roce_beats = -(-len(ROCE) // WIDTH)
    assert out[0][:2] == (0, roce_beats - 1), "the frame under way finishes"
    assert out[1][0] == 60, "the next frame waits for the pause to end"
