from amaranth import *
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out, connect, flipped

from ..config import NetworkConfig
from ..counters import counters_layout, event_counter
from ..headers import (
    ETHERNET,
    ETHERTYPE_ARP,
    ETHERTYPE_IPV4,
    ETHERTYPE_MAC_CONTROL,
    MAC_CONTROL_ADDRESS,
)
from ..packet.extract import HeaderExtractor
from ..packet.fifo import PacketFIFO
from ..packet.router import PacketRouter
from ..stream import BEAT_BYTES, NO_META, meta_with, packet_signature

__all__ = ["EthernetReceiver", "ETH_RX_META"]

#: Meta of the frames this layer hands up: the frame's length and its Ethernet header.
ETH_RX_META = meta_with(NO_META, length=16, eth=ETHERNET)

#: Shortest frame without its FCS.
MIN_FRAME = 60

BROADCAST = (1 << 48) - 1


class EthernetReceiver(wiring.Component):
    """Takes frames from the MAC (no backpressure), drops the bad ones, and
    hands ARP and IPv4 frames up without their Ethernet header, and MAC control
    frames (PAUSE, PFC) to :class:`~.mac_control.MacControl` on ``o_mac_control``.

    A store-and-forward FIFO of ``depth`` beats comes first: it drops frames
    that the MAC flags on ``i_error`` (``tuser`` with the last beat) and frames
    that do not fit, and it tells the length of every frame with its first
    beat, so that every later check happens at header time. It holds as many
    frames as it has beats (a minimum frame is one beat), so only its beats
    limit it: it drains a beat per cycle, at least as fast as any mix of
    frames arrives at line rate (a frame of ``n`` beats takes more than ``n``
    cycles on the wire with its preamble and gap), so it overflows only on a
    frame longer than ``depth`` beats or when the layers above stall. Then frames that
    are shorter than 60 bytes (``runt``), not for our MAC nor broadcast
    (``address``; MAC control frames: not for our MAC nor 01-80-C2-00-00-01), or
    neither IPv4, ARP nor MAC control (``ethertype``) are dropped.

    Counters (32 bits, wrapping): ``mac_error``, ``overflow``, ``runt``,
    ``address``, ``ethertype``, ``truncated``. The router ends in a register
    slice: no path runs from the checks or the consumers' ready through this
    layer.
    """

    DROP_REASONS = ("runt", "address", "ethertype")

    def __init__(self, *, depth=512, width=BEAT_BYTES):
        self._depth = depth
        self._width = width
        super().__init__({
            "i": In(packet_signature(NO_META, width=width, always_ready=True)),
            "i_error": In(1),
            "i_config": In(NetworkConfig),
            "o_arp": Out(packet_signature(ETH_RX_META, width=width)),
            "o_ipv4": Out(packet_signature(ETH_RX_META, width=width)),
            "o_mac_control": Out(packet_signature(ETH_RX_META, width=width)),
            "o_counters": Out(self.counters_layout()),
        })

    @classmethod
    def counters_layout(cls):
        return counters_layout("mac_error", "overflow", *cls.DROP_REASONS, "truncated")

    def elaborate(self, platform):
        m = Module()
        width = self._width

        m.submodules.fifo = fifo = PacketFIFO(NO_META, depth=self._depth,
                                              max_packets=self._depth, width=width)
        m.submodules.header = header = HeaderExtractor("eth", ETHERNET, fifo.o.p.meta.shape(),
                                                       width=width)
        m.submodules.router = router = PacketRouter(ETH_RX_META, outputs=3,
                                                    drop_reasons=self.DROP_REASONS, width=width,
                                                    registered=True)
        connect(m, flipped(self.i), fifo.i)
        m.d.comb += fifo.i_error.eq(self.i_error)
        connect(m, fifo.o, header.i)
        connect(m, header.o, router.i)
        connect(m, router.o[0], flipped(self.o_arp))
        connect(m, router.o[1], flipped(self.o_ipv4))
        connect(m, router.o[2], flipped(self.o_mac_control))

        meta = router.i.p.meta
        eth = meta.eth
        with m.If(meta.length < MIN_FRAME):
            m.d.comb += router.i_drop.eq(router.drop_code("runt"))
        with m.Elif(eth.ethertype == ETHERTYPE_MAC_CONTROL):
            with m.If((eth.dst == self.i_config.mac) | (eth.dst == MAC_CONTROL_ADDRESS)):
                m.d.comb += router.i_route.eq(2)
            with m.Else():
                m.d.comb += router.i_drop.eq(router.drop_code("address"))
        with m.Elif((eth.dst != self.i_config.mac) & (eth.dst != BROADCAST)):
            m.d.comb += router.i_drop.eq(router.drop_code("address"))
        with m.Elif(eth.ethertype == ETHERTYPE_ARP):
            m.d.comb += router.i_route.eq(0)
        with m.Elif(eth.ethertype == ETHERTYPE_IPV4):
            m.d.comb += router.i_route.eq(1)
        with m.Else():
            m.d.comb += router.i_drop.eq(router.drop_code("ethertype"))

        counters = self.o_counters
        for reason in self.DROP_REASONS:
            m.d.comb += counters[reason].eq(router.o_drops[reason])
        for name, strobe in (("mac_error", fifo.o_error_drop),
                             ("overflow", fifo.o_overflow_drop),
                             ("truncated", header.o_truncated)):
            m.d.comb += counters[name].eq(event_counter(m, strobe, name))

        return m
