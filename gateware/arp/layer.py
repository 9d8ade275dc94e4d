from amaranth import *
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out, connect, flipped

from ..config import NetworkConfig
from ..counters import counters_layout, event_counter
from ..eth.rx import BROADCAST, ETH_RX_META
from ..eth.tx import ETH_TX_META
from ..headers import ARP, ETHERTYPE_ARP, ETHERTYPE_IPV4
from ..ip.tx import NEXT_HOP_META
from ..packet.arbiter import PacketArbiter
from ..packet.extract import HeaderExtractor
from ..packet.insert import HeaderInserter
from ..packet.register import PacketRegister
from ..stream import BEAT_BYTES, meta_with, packet_signature
from .cache import ArpCache
from .resolver import ArpResolver
from .transmit import ArpTransmitter

__all__ = ["ArpLayer", "ARP_COUNTERS"]

ARP_COUNTERS = counters_layout("malformed", "ignored", "busy", "truncated", "learnt", "requests",
                               "replies", "unresolved", "unreachable")

OPER_REQUEST = 1
OPER_REPLY = 2


class ArpLayer(wiring.Component):
    """ARP between the IPv4 and Ethernet layers.

    Receive (``i_rx``): answers requests for our address, and learns the
    sender's binding from requests and replies addressed to us. Transmit
    (``i_ip``, :class:`ArpTransmitter`): gives each outgoing IPv4 packet the
    MAC of its next hop from the cache, and never holds a packet for a next
    hop that is not resolved: a miss is dropped (an echo reply) or waits in a
    parking FIFO beside the stream (``patient_ports``: RoCEv2, the connection
    manager) while :class:`ArpResolver` sends a request every
    ``retry_interval`` cycles, up to ``retries``. Bindings in use are asked
    for again before they expire (:class:`ArpCache`'s refresh offers), so a
    peer in steady use never misses. ARP frames, parked packets and the
    stream share ``o`` in turn, a packet at a time.

    Latency: 3 cycles from ``i_ip`` to ``o``, one beat per cycle also between
    packets to different next hops. A received ARP packet is answered and
    learnt 1 cycle after its first beat (plus the cache's 2 cycles until
    lookups see it).

    Counters: ``malformed`` (not Ethernet/IPv4 ARP), ``ignored`` (not for our
    address), ``busy`` (a request arrived while a reply was still waiting to
    go out), ``truncated``, ``learnt`` (requests and replies for our address,
    whose sender's binding the cache took), ``requests`` and ``replies`` sent, ``unresolved``
    (IPv4 packets dropped for a next hop that is not resolved),
    ``unreachable`` (off our subnet with no gateway set).
    """

    def __init__(self, *, entries=8, lifetime, retry_interval, retries=3, patient_ports=(),
                 park_beats=256, width=BEAT_BYTES):
        # Built here so that bad timers or ports fail at construction.
        self._resolver = ArpResolver(retry_interval=retry_interval, retries=retries)
        self._transmitter = ArpTransmitter(patient_ports=patient_ports, park_beats=park_beats,
                                           width=width)
        self._entries = entries
        self._lifetime = lifetime
        self._width = width
        super().__init__({
            "i_rx": In(packet_signature(ETH_RX_META, width=width)),
            "i_ip": In(packet_signature(NEXT_HOP_META, width=width)),
            "i_config": In(NetworkConfig),
            "o": Out(packet_signature(ETH_TX_META, width=width)),
            "o_counters": Out(ARP_COUNTERS),
        })

    def elaborate(self, platform):
        m = Module()
        width = self._width
        config = self.i_config
        counters = self.o_counters

        m.submodules.cache = cache = ArpCache(entries=self._entries, lifetime=self._lifetime)
        m.submodules.header = header = HeaderExtractor("arp", ARP, ETH_RX_META, width=width)
        m.submodules.frame = frame = HeaderInserter(
            "arp", ARP, meta_with(ETH_TX_META, arp=ARP), width=width)
        m.submodules.arbiter = arbiter = PacketArbiter(ETH_TX_META, inputs=3, width=width)
        connect(m, flipped(self.i_rx), header.i)
        connect(m, frame.o, arbiter.i[0])
        connect(m, arbiter.o, flipped(self.o))

        # Receive: one decision per packet, from its first beat, classified in a register
        # stage (1 cycle) so the checks and the address compare end there; the padding is
        # discarded.
        rx = header.o
        rx_first = Signal(init=1)
        m.d.comb += rx.ready.eq(1)
        with m.If(rx.valid):
            m.d.sync += rx_first.eq(rx.p.last)
        arp = rx.p.meta.arp
        seen = Signal()
        well_formed = Signal()
        for_us = Signal()
        request = Signal()
        sender = Signal(data.StructLayout({"mac": 48, "ip": 32}))
        m.d.sync += [
            seen.eq(rx.valid & rx_first),
            well_formed.eq((arp.htype == 1) & (arp.ptype == ETHERTYPE_IPV4) & (arp.hlen == 6) &
                           (arp.plen == 4) &
                           ((arp.oper == OPER_REQUEST) | (arp.oper == OPER_REPLY))),
            for_us.eq(arp.tpa == config.ip),
            request.eq(arp.oper == OPER_REQUEST),
            sender.mac.eq(arp.sha),
            sender.ip.eq(arp.spa),
        ]
        accepted = seen & well_formed & for_us

        reply_pending = Signal()
        reply_to = Signal(data.StructLayout({"mac": 48, "ip": 32}))
        take_reply = accepted & request
        with m.If(take_reply & ~reply_pending):
            m.d.sync += [
                reply_pending.eq(1),
                reply_to.eq(sender),
            ]
        m.d.comb += [
            cache.i_update.valid.eq(accepted),
            cache.i_update.p.ip.eq(sender.ip),
            cache.i_update.p.mac.eq(sender.mac),
        ]

        # Transmit: the next hop's MAC from the cache, or a wait beside the stream.
        m.submodules.resolver = resolver = self._resolver
        m.submodules.tx = tx = self._transmitter
        connect(m, flipped(self.i_ip), tx.i)
        m.d.comb += [
            tx.i_config.eq(config),
            cache.i_lookup_ip.eq(tx.o_lookup_ip),
            cache.i_lookup_used.eq(tx.o_lookup_used),
            tx.i_hit.eq(cache.o_hit),
            tx.i_mac.eq(cache.o_mac),
            resolver.i_learnt.valid.eq(cache.i_update.valid),
            resolver.i_learnt.p.eq(cache.i_update.p),
        ]
        connect(m, tx.o_resolve, resolver.i_start)
        connect(m, resolver.o_done, tx.i_resolved)
        connect(m, cache.o_refresh, resolver.i_refresh)
        # A register slice on the direct path: the transmitter's stage-2 handshake ends in
        # its ``ready`` instead of going on through the arbiter's grant and what follows.
        m.submodules.direct = direct = PacketRegister(ETH_TX_META, width=width)
        connect(m, tx.o_direct, direct.i)
        connect(m, direct.o, arbiter.i[2])
        # And on the parked path, so that the read of the parking FIFO ends there too (a
        # cycle more for packets that waited for their hop anyway).
        m.submodules.parked = parked = PacketRegister(ETH_TX_META, width=width)
        connect(m, tx.o_parked, parked.i)
        connect(m, parked.o, arbiter.i[1])

        # ARP frames: a reply when one is waiting, else a request.
        out = frame.i.p.meta
        m.d.comb += [
            frame.i.valid.eq(reply_pending | resolver.o_request.valid),
            frame.i.p.keep.eq(0),
            frame.i.p.last.eq(1),
            out.ethertype.eq(ETHERTYPE_ARP),
            out.arp.htype.eq(1),
            out.arp.ptype.eq(ETHERTYPE_IPV4),
            out.arp.hlen.eq(6),
            out.arp.plen.eq(4),
            out.arp.sha.eq(config.mac),
            out.arp.spa.eq(config.ip),
        ]
        with m.If(reply_pending):
            m.d.comb += [
                out.dst_mac.eq(reply_to.mac),
                out.arp.oper.eq(OPER_REPLY),
                out.arp.tha.eq(reply_to.mac),
                out.arp.tpa.eq(reply_to.ip),
            ]
            with m.If(frame.i.valid & frame.i.ready):
                m.d.sync += reply_pending.eq(0)
        with m.Else():
            m.d.comb += [
                out.dst_mac.eq(BROADCAST),
                out.arp.oper.eq(OPER_REQUEST),
                out.arp.tpa.eq(resolver.o_request.p),
                resolver.o_request.ready.eq(frame.i.ready),
            ]

        sent = frame.i.valid & frame.i.ready
        m.d.comb += [
            counters.malformed.eq(event_counter(m, seen & ~well_formed, "malformed")),
            counters.ignored.eq(event_counter(m, seen & well_formed & ~for_us, "ignored")),
            counters.busy.eq(event_counter(m, take_reply & reply_pending, "busy")),
            counters.learnt.eq(event_counter(m, accepted, "learnt")),
            counters.truncated.eq(event_counter(m, header.o_truncated, "truncated")),
            counters.replies.eq(event_counter(m, sent & reply_pending, "replies")),
            counters.requests.eq(event_counter(m, sent & ~reply_pending, "requests")),
            counters.unresolved.eq(event_counter(m, tx.o_unresolved, "unresolved")),
            counters.unreachable.eq(event_counter(m, tx.o_unreachable, "unreachable")),
        ]
        return m
