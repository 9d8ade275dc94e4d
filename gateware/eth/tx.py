from amaranth import *
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out, connect, flipped

from ..config import NetworkConfig
from ..headers import ETHERNET
from ..packet.insert import HeaderInserter
from ..packet.pad import PacketPad
from ..stream import BEAT_BYTES, NO_META, forward, packet_signature
from .rx import MIN_FRAME

__all__ = ["EthernetTransmitter", "ETH_TX_META"]

#: Meta of the packets this layer frames.
ETH_TX_META = data.StructLayout({"dst_mac": 48, "ethertype": 16})


class EthernetTransmitter(wiring.Component):
    """Frames packets for the MAC: puts the Ethernet header in front (source:
    our MAC) and pads frames to the 60-byte minimum with zeros. The MAC adds
    the FCS. Latency 0; one beat per cycle with no idle cycle between frames.
    """

    def __init__(self, *, width=BEAT_BYTES):
        self._width = width
        super().__init__({
            "i": In(packet_signature(ETH_TX_META, width=width)),
            "i_config": In(NetworkConfig),
            "o": Out(packet_signature(NO_META, width=width)),
        })

    def elaborate(self, platform):
        m = Module()
        width = self._width

        m.submodules.header = header = HeaderInserter(
            "eth", ETHERNET, data.StructLayout({"eth": ETHERNET}), width=width)
        m.submodules.pad = pad = PacketPad(NO_META, minimum=MIN_FRAME, width=width)

        m.d.comb += forward(self.i, header.i)
        m.d.comb += [
            header.i.p.meta.eth.dst.eq(self.i.p.meta.dst_mac),
            header.i.p.meta.eth.src.eq(self.i_config.mac),
            header.i.p.meta.eth.ethertype.eq(self.i.p.meta.ethertype),
        ]
        connect(m, header.o, pad.i)
        connect(m, pad.o, flipped(self.o))
        return m
