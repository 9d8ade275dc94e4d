from amaranth import *
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out, connect, flipped

from ..config import NetworkConfig
from ..counters import counters_layout, event_counter
from ..eth.rx import ETH_RX_META
from ..headers import ETHERNET, IP_PROTO_ICMP, IP_PROTO_UDP, IPV4
from ..packet.extract import HeaderExtractor
from ..packet.router import PacketRouter
from ..packet.trim import PacketTrim
from ..stream import BEAT_BYTES, meta_with, packet_signature
from .checksum import folds_to_ones, word_sum

__all__ = ["IPv4Receiver", "IP_RX_META"]

#: Meta of the packets this layer hands up: the frame's length, its Ethernet and IPv4 headers.
IP_RX_META = meta_with(ETH_RX_META, ip=IPV4)


class IPv4Receiver(wiring.Component):
    """Checks IPv4 packets addressed to us and hands ICMP and UDP up without
    the IPv4 header, cut to the IPv4 total length (Ethernet padding removed).

    Dropped and counted: ``version`` (not 4), ``options`` (IHL other than 5:
    options are not supported), ``checksum``, ``fragment`` (MF set or an
    offset: fragments are not reassembled), ``address`` (not our IP),
    ``source`` (a source that RFC 1122 §3.2.1.3 says to discard: 0.0.0.0,
    loopback 127/8, multicast 224/4, class E 240/4 with 255.255.255.255, our
    subnet's directed broadcast or its host number zero (10.77.0.0 in
    10.77.0.0/24: the 4.2BSD broadcast form RFC 1122 §3.3.6 still recognises),
    or our own address), ``length`` (total
    length below 20 or beyond the frame), ``protocol`` (neither ICMP nor
    UDP), ``truncated``. The checks that need the header alone (all but the
    length's, and the checksum's but for its last add) are made as the header
    is completed and kept in registers beside it; the rest with the first
    payload beat.
    Latency: one beat and a cycle (the router's register slice: no path runs
    through this layer).
    """

    DROP_REASONS = ("version", "options", "checksum", "fragment", "address", "source",
                    "length", "protocol")

    def __init__(self, *, width=BEAT_BYTES):
        self._width = width
        super().__init__({
            "i": In(packet_signature(ETH_RX_META, width=width)),
            "i_config": In(NetworkConfig),
            "o_icmp": Out(packet_signature(IP_RX_META, width=width)),
            "o_udp": Out(packet_signature(IP_RX_META, width=width)),
            "o_counters": Out(self.counters_layout()),
        })

    @classmethod
    def counters_layout(cls):
        return counters_layout(*cls.DROP_REASONS, "truncated")

    def elaborate(self, platform):
        m = Module()
        width = self._width

        m.submodules.header = header = HeaderExtractor("ip", IPV4, ETH_RX_META, width=width)
        m.submodules.trim = trim = PacketTrim(IP_RX_META, width=width)
        m.submodules.router = router = PacketRouter(IP_RX_META, outputs=2,
                                                    drop_reasons=self.DROP_REASONS, width=width,
                                                    registered=True)
        connect(m, flipped(self.i), header.i)
        connect(m, header.o, trim.i)
        connect(m, trim.o, router.i)
        connect(m, router.o[0], flipped(self.o_icmp))
        connect(m, router.o[1], flipped(self.o_udp))

        ip = trim.i.p.meta.ip
        m.d.comb += trim.i_length.eq(ip.total_length - IPV4.length)

        # Checks on the header alone, in registers loaded with the extractor's meta.
        # The header's sum in two halves of five words (two carry chains each); the check
        # adds them (one more) and compares.
        half = IPV4.length // 4
        early = Signal(data.StructLayout({
            "version": 1, "options": 1, "fragment": 1, "address": 1, "source": 1,
            "sums": data.ArrayLayout(range(half * 0xFFFF + 1), 2),
        }))
        ip = header.o_header.p
        config = self.i_config
        src = ip.src
        on_subnet = ((src ^ config.ip) & config.netmask) == 0
        host_number = src & ~config.netmask
        source_bad = ((src == 0) |
                      (src[24:] == 127) |                       # loopback
                      (src[29:] == 0b111) |                     # multicast, class E, broadcast
                      (src == config.ip) |
                      (on_subnet & (host_number == ~config.netmask)) |  # our directed broadcast
                      (on_subnet & (host_number == 0)))         # our subnet's host number zero
        with m.If(header.o_header.valid):
            m.d.sync += [
                early.version.eq(ip.version != 4),
                early.options.eq(ip.ihl != 5),
                early.fragment.eq(ip.mf | (ip.fragment_offset != 0)),
                early.address.eq(ip.dst != config.ip),
                early.source.eq(source_bad),
                early.sums[0].eq(word_sum(Value.cast(ip)[:16 * half])),
                early.sums[1].eq(word_sum(Value.cast(ip)[16 * half:])),
            ]

        meta = router.i.p.meta
        ip = meta.ip
        room = meta.length - ETHERNET.length
        checks = [
            ("version", early.version),
            ("options", early.options),
            ("checksum", ~folds_to_ones(early.sums[0] + early.sums[1])),
            ("fragment", early.fragment),
            ("address", early.address),
            ("source", early.source),
            ("length", (ip.total_length < IPV4.length) | (ip.total_length > room)),
        ]
        with m.If(checks[0][1]):
            m.d.comb += router.i_drop.eq(router.drop_code(checks[0][0]))
        for reason, failed in checks[1:]:
            with m.Elif(failed):
                m.d.comb += router.i_drop.eq(router.drop_code(reason))
        with m.Elif(ip.protocol == IP_PROTO_ICMP):
            m.d.comb += router.i_route.eq(0)
        with m.Elif(ip.protocol == IP_PROTO_UDP):
            m.d.comb += router.i_route.eq(1)
        with m.Else():
            m.d.comb += router.i_drop.eq(router.drop_code("protocol"))

        for reason in self.DROP_REASONS:
            m.d.comb += self.o_counters[reason].eq(router.o_drops[reason])
        m.d.comb += self.o_counters.truncated.eq(event_counter(m, header.o_truncated, "truncated"))
        return m
