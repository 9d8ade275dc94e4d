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
from ..stream import BEAT_BYTES, meta_with, packet_signature
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

    Latency: 2 cycles from ``i_ip`` to ``o`` (the next hop, then the cache's
    answer, are registered with the beat), one beat per cycle also between
    packets to different next hops; after a miss is resolved or its packet
    dropped, one idle cycle. A binding is decided when a packet's first beat
    reaches the output stage and holds while that beat waits for ``o.ready``.
    A received ARP packet is answered and learnt 1 cycle after its first beat
    (plus the cache's 2 cycles until lookups see it).

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

        # Transmit, in two register stages of one beat each, so that no path runs from the
        # configuration through the next hop and the cache to the output: stage 1 holds a
        # beat with the next hop of its packet (``hop``, the cache's lookup address), stage 2
        # with the cache's answer for it. While the packet in stage 2 waits for resolution,
        # ``hop`` is its next hop instead, recomputed every cycle (the configuration may
        # change); afterwards it is recomputed for stage 1 before that moves on.
        ip = self.i_ip
        resolved = arbiter.i[1]

        def next_hop(dst_ip):
            on_link = ((dst_ip ^ config.ip) & config.netmask) == 0
            return Mux(on_link | (config.gateway == 0), dst_ip, config.gateway)

        beat = ip.p.shape()
        in_first = Signal(init=1)
        s1 = Signal(beat)
        s1_valid = Signal()
        s1_first = Signal()
        s2 = Signal(beat)
        s2_valid = Signal()
        s2_first = Signal()
        hop = Signal(32)
        resolving = Signal()        # hop follows stage 2
        borrowed = Signal()         # hop was stage 2's on the previous cycle
        hit = Signal()
        dst_mac = Signal(48)
        m.d.sync += borrowed.eq(resolving)

        take2 = Signal()
        load2 = s1_valid & ~borrowed & (~s2_valid | take2)
        m.d.comb += ip.ready.eq(~s1_valid | load2)
        with m.If(ip.valid & ip.ready):
            m.d.sync += [
                s1.eq(ip.p),
                s1_first.eq(in_first),
                in_first.eq(ip.p.last),
            ]
        with m.If(ip.ready):
            m.d.sync += s1_valid.eq(ip.valid)
        with m.If(load2):
            m.d.sync += [
                s2.eq(s1),
                s2_first.eq(s1_first),
            ]
        with m.If(~s2_valid | take2):
            m.d.sync += s2_valid.eq(load2)

        restore = borrowed & s1_valid
        with m.If((ip.valid & ip.ready) | resolving | restore):
            m.d.sync += hop.eq(next_hop(
                Mux(resolving, s2.meta.dst_ip, Mux(restore, s1.meta.dst_ip, ip.p.meta.dst_ip))))
        m.d.comb += cache.i_lookup_ip.eq(hop)
        with m.If((load2 & s1_first) | (resolving & borrowed)):
            m.d.sync += [
                hit.eq(cache.o_hit),
                dst_mac.eq(cache.o_mac),
            ]

        request_pending = Signal()
        request_ip = Signal(32)
        timer = Signal(range(self._retry_interval + 1))
        attempts = Signal(range(self._retries + 1))
        unresolved = Signal()

        m.d.comb += [
            resolved.p.data.eq(s2.data),
            resolved.p.keep.eq(s2.keep),
            resolved.p.last.eq(s2.last),
            resolved.p.meta.ethertype.eq(ETHERTYPE_IPV4),
            resolved.p.meta.dst_mac.eq(dst_mac),
        ]

        with m.FSM():
            with m.State("Forward"):
                m.d.comb += [
                    resolved.valid.eq(s2_valid & (~s2_first | hit)),
                    take2.eq(resolved.valid & resolved.ready),
                ]
                with m.If(s2_valid & s2_first & ~hit):
                    m.d.sync += [timer.eq(0), attempts.eq(0), resolving.eq(1)]
                    m.next = "Resolve"
            with m.State("Resolve"):
                with m.If(hit):
                    m.d.sync += resolving.eq(0)
                    m.next = "Forward"
                with m.Elif(~borrowed):
                    pass                # hop is not yet this packet's
                with m.Elif(timer == 0):
                    with m.If(attempts == self._retries):
                        m.d.comb += unresolved.eq(1)
                        m.d.sync += resolving.eq(0)
                        m.next = "Discard"
                    with m.Elif(~request_pending):
                        m.d.sync += [
                            request_pending.eq(1),
                            request_ip.eq(hop),
                            attempts.eq(attempts + 1),
                            timer.eq(self._retry_interval),
                        ]
                with m.Else():
                    m.d.sync += timer.eq(timer - 1)
            with m.State("Discard"):
                m.d.comb += take2.eq(s2_valid)
                with m.If(s2_valid & s2.last):
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
            counters.malformed.eq(event_counter(m, seen & ~well_formed, "malformed")),
            counters.ignored.eq(event_counter(m, seen & well_formed & ~for_us, "ignored")),
            counters.busy.eq(event_counter(m, take_reply & reply_pending, "busy")),
            counters.truncated.eq(event_counter(m, header.o_truncated, "truncated")),
            counters.replies.eq(event_counter(m, sent & reply_pending, "replies")),
            counters.requests.eq(event_counter(m, sent & ~reply_pending, "requests")),
            counters.unresolved.eq(event_counter(m, unresolved, "unresolved")),
        ]
        return m
