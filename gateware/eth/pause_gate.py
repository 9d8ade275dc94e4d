from amaranth import *
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out, connect, flipped

from ..headers import ETHERNET, ETHERTYPE_IPV4, IP_PROTO_UDP, IPV4, UDP, UDP_PORT_ROCEV2
from ..packet.gate import PacketGate
from ..stream import BEAT_BYTES, NO_META, packet_signature

__all__ = ["PauseGate"]

_IP_OFFSET = ETHERNET.length
_UDP_OFFSET = _IP_OFFSET + IPV4.length
_HEADERS_END = _UDP_OFFSET + UDP.length


class PauseGate(wiring.Component):
    """The last stop of transmitted frames before the MAC: no frame starts while
    ``i_pause_all`` (an 802.3x PAUSE), and no RoCEv2 frame (IPv4, UDP port 4791,
    told from its first beat) starts while ``i_pause_roce`` (a PFC for its priority).
    A frame that has started finishes; a held frame holds the frames behind it.
    Latency 0 (see :class:`~gateware.packet.gate.PacketGate`).
    """

    def __init__(self, *, width=BEAT_BYTES):
        if width < _HEADERS_END:
            raise ValueError(f"The first beat must hold the Ethernet, IPv4 and UDP headers "
                             f"({_HEADERS_END} bytes), not {width!r}")
        self._width = width
        super().__init__({
            "i": In(packet_signature(NO_META, width=width)),
            "i_pause_all": In(1),
            "i_pause_roce": In(1),
            "o": Out(packet_signature(NO_META, width=width)),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.gate = gate = PacketGate(NO_META, width=self._width)
        connect(m, flipped(self.i), gate.i)
        connect(m, gate.o, flipped(self.o))

        beat = self.i.p.data
        eth = ETHERNET.from_wire(beat[:8 * _IP_OFFSET])
        ip = IPV4.from_wire(beat[8 * _IP_OFFSET:8 * _UDP_OFFSET])
        udp = UDP.from_wire(beat[8 * _UDP_OFFSET:8 * _HEADERS_END])
        rocev2 = ((eth.ethertype == ETHERTYPE_IPV4) & (ip.ihl == IPV4.length // 4) &
                  (ip.protocol == IP_PROTO_UDP) & (udp.dst_port == UDP_PORT_ROCEV2))
        m.d.comb += gate.i_hold.eq(self.i_pause_all | (self.i_pause_roce & rocev2))
        return m
