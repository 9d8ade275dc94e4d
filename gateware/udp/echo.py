from amaranth import *
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out, connect, flipped

from ..counters import event_counter
from ..headers import UDP
from ..packet.fifo import PacketFIFO
from ..stream import BEAT_BYTES, forward, packet_signature
from .rx import UDP_RX_META
from .tx import UDP_TX_META

__all__ = ["UdpEcho"]


class UdpEcho(wiring.Component):
    """The echo service (RFC 862): sends every datagram back to where it came
    from. Datagrams wait whole in a FIFO of ``depth`` beats, so a busy
    transmitter never stalls the receive path: when the FIFO is full the
    datagram is dropped and counted in ``o_dropped``.
    """

    def __init__(self, *, depth=256, width=BEAT_BYTES):
        self._depth = depth
        self._width = width
        super().__init__({
            "i": In(packet_signature(UDP_RX_META, width=width)),
            "o": Out(packet_signature(UDP_TX_META, width=width)),
            "o_dropped": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.fifo = fifo = PacketFIFO(UDP_RX_META, depth=self._depth,
                                              length_field="echo_length", width=self._width)
        connect(m, flipped(self.i), fifo.i)
        m.d.comb += self.o_dropped.eq(event_counter(m, fifo.o_overflow_drop, "dropped"))

        request = fifo.o.p.meta
        reply = self.o.p.meta
        m.d.comb += forward(fifo.o, self.o)
        m.d.comb += [
            reply.dst_ip.eq(request.ip.src),
            reply.src_port.eq(request.udp.dst_port),
            reply.dst_port.eq(request.udp.src_port),
            reply.length.eq(request.udp.length - UDP.length),
            reply.tos.eq(Cat(request.ip.ecn, request.ip.dscp)),
        ]
        return m
