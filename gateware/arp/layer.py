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
from ..stream import BEAT_BYTES, forward, meta_with, packet_signature
from .cache import ArpCache

__all__ = ["ArpLayer", "ARP_COUNTERS"]

ARP_COUNTERS = counters_layout("malformed", "ignored", "busy", "truncated", "requests", "replies",
                               "unresolved")

OPER_REQUEST = 1
OPER_REPLY = 2


class ArpLayer(wiring.Component):
    """ARP between the IPv4 and Ethernet layers.

    Receive (``i_rx``): answers requests for our address, and learns the
    sender's binding from requests and replies addressed to us. Transmit
    (``i_ip``): gives each outgoing IPv4 packet the MAC of its next hop (the
    destination on our subnet, else the gateway) from the cache. On a miss the
    packet waits while a request goes out every ``retry_interval`` cycles; a
    packet whose next hop has not answered ``retries`` requests is dropped
    and counted as ``unresolved``, never sent to a wrong address. ARP frames go
    out on ``o`` ahead of IPv4 packets, between packets.

    Counters: ``malformed`` (not Ethernet/IPv4 ARP), ``ignored`` (not for our
    address), ``busy`` (a request arrived while a reply was still waiting to
    go out), ``truncated``, ``requests`` and ``replies`` sent, ``unresolved``.
    """

    def __init__(self, *, entries=8, lifetime, retry_interval, retries=3, width=BEAT_BYTES):
        if not isinstance(retry_interval, int) or retry_interval < 1:
            raise ValueError(f"Retry interval must be a positive number of cycles, "
                             f"not {retry_interval!r}")
        if not isinstance(retries, int) or retries < 1:
            raise ValueError(f"Retries must be a positive integer, not {retries!r}")
        self._entries = entries
        self._lifetime = lifetime
        self._retry_interval = retry_interval
        self._retries = retries
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
        m.submodules.arbiter = arbiter = PacketArbiter(ETH_TX_META, inputs=2, priority=True,
                                                       width=width)
        connect(m, flipped(self.i_rx), header.i)
        connect(m, frame.o, arbiter.i[0])
        connect(m, arbiter.o, flipped(self.o))

        # Receive: one decision per packet, at its first beat; the padding is discarded.
        rx = header.o
        rx_first = Signal(init=1)
        m.d.comb += rx.ready.eq(1)
        with m.If(rx.valid):
            m.d.sync += rx_first.eq(rx.p.last)
        arp = rx.p.meta.arp
        well_formed = ((arp.htype == 1) & (arp.ptype == ETHERTYPE_IPV4) & (arp.hlen == 6) &
                       (arp.plen == 4) & ((arp.oper == OPER_REQUEST) | (arp.oper == OPER_REPLY)))
        for_us = arp.tpa == config.ip
        accepted = rx.valid & rx_first & well_formed & for_us

        reply_pending = Signal()
        reply_to = Signal(data.StructLayout({"mac": 48, "ip": 32}))
        take_reply = accepted & (arp.oper == OPER_REQUEST)
        with m.If(take_reply & ~reply_pending):
            m.d.sync += [
                reply_pending.eq(1),
                reply_to.mac.eq(arp.sha),
                reply_to.ip.eq(arp.spa),
            ]
        m.d.comb += [
            cache.i_update.valid.eq(accepted),
            cache.i_update.p.ip.eq(arp.spa),
            cache.i_update.p.mac.eq(arp.sha),
        ]

        # Transmit: the next hop of the packet at the head of i_ip.
        ip = self.i_ip
        on_link = ((ip.p.meta.dst_ip ^ config.ip) & config.netmask) == 0
        next_hop = Mux(on_link | (config.gateway == 0), ip.p.meta.dst_ip, config.gateway)
        m.d.comb += cache.i_lookup_ip.eq(next_hop)

        request_pending = Signal()
        request_ip = Signal(32)
        ip_first = Signal(init=1)
        dst_mac = Signal(48)
        timer = Signal(range(self._retry_interval + 1))
        attempts = Signal(range(self._retries + 1))
        unresolved = Signal()

        resolved = arbiter.i[1]
        m.d.comb += forward(ip, resolved)
        m.d.comb += [
            resolved.p.meta.ethertype.eq(ETHERTYPE_IPV4),
            resolved.p.meta.dst_mac.eq(Mux(ip_first, cache.o_mac, dst_mac)),
        ]
        with m.If(ip.valid & ip.ready):
            m.d.sync += ip_first.eq(ip.p.last)

        with m.FSM():
            with m.State("Forward"):
                with m.If(ip.valid & ip_first & ~cache.o_hit):
                    m.d.comb += [resolved.valid.eq(0), ip.ready.eq(0)]
                    m.d.sync += [timer.eq(0), attempts.eq(0)]
                    m.next = "Resolve"
                with m.If(ip.valid & ip.ready & ip_first):
                    m.d.sync += dst_mac.eq(cache.o_mac)
            with m.State("Resolve"):
                m.d.comb += [resolved.valid.eq(0), ip.ready.eq(0)]
                with m.If(cache.o_hit):
                    m.next = "Forward"
                with m.Elif(timer == 0):
                    with m.If(attempts == self._retries):
                        m.d.comb += unresolved.eq(1)
                        m.next = "Discard"
                    with m.Elif(~request_pending):
                        m.d.sync += [
                            request_pending.eq(1),
                            request_ip.eq(next_hop),
                            attempts.eq(attempts + 1),
                            timer.eq(self._retry_interval),
                        ]
                with m.Else():
                    m.d.sync += timer.eq(timer - 1)
            with m.State("Discard"):
                m.d.comb += [resolved.valid.eq(0), ip.ready.eq(1)]
                with m.If(ip.valid & ip.p.last):
                    m.next = "Forward"

        # ARP frames: a reply when one is waiting, else a request.
        out = frame.i.p.meta
        m.d.comb += [
            frame.i.valid.eq(reply_pending | request_pending),
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
                out.arp.tpa.eq(request_ip),
            ]
            with m.If(frame.i.valid & frame.i.ready):
                m.d.sync += request_pending.eq(0)

        sent = frame.i.valid & frame.i.ready
        m.d.comb += [
            counters.malformed.eq(event_counter(m, rx.valid & rx_first & ~well_formed,
                                                "malformed")),
            counters.ignored.eq(event_counter(m, rx.valid & rx_first & well_formed & ~for_us,
                                              "ignored")),
            counters.busy.eq(event_counter(m, take_reply & reply_pending, "busy")),
            counters.truncated.eq(event_counter(m, header.o_truncated, "truncated")),
            counters.replies.eq(event_counter(m, sent & reply_pending, "replies")),
            counters.requests.eq(event_counter(m, sent & ~reply_pending, "requests")),
            counters.unresolved.eq(event_counter(m, unresolved, "unresolved")),
        ]
        return m
