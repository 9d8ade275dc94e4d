"""The RoCEv2 invariant CRC (ICRC, IBTA vol. 1 annex A17.3.3), written into the
packets leaving the IPv4 transmitter."""

from amaranth import *
from amaranth.lib import crc, data, wiring
from amaranth.lib.wiring import In, Out

from ..crc import ParallelCrc
from ..headers import BTH, IP_PROTO_UDP, IPV4, UDP, UDP_PORT_ROCEV2
from ..ip.tx import NEXT_HOP_META
from ..stream import BEAT_BYTES, beat_layout, keep_count, packet_signature

__all__ = ["IcrcInserter", "ICRC", "ICRC_BYTES", "PSEUDO_LRH", "VARIANT_FIELDS", "MIN_LENGTH",
           "variant_mask"]

#: The ICRC is CRC-32 with Ethernet's parameters.
ICRC = ParallelCrc(crc.catalog.CRC32_ETHERNET)

#: Bytes of the ICRC at the end of a RoCEv2 packet.
ICRC_BYTES = 4

#: What the ICRC covers first in place of the InfiniBand Local Route Header.
PSEUDO_LRH = b"\xff" * 8

#: Where the UDP header and the BTH start in a RoCEv2 packet (IPv4 without options).
UDP_OFFSET = IPV4.length
BTH_OFFSET = UDP_OFFSET + UDP.length

#: Fields the network may change, covered by the ICRC as all ones:
#: ``(offset of the header in the IP packet, header layout, field)``.
VARIANT_FIELDS = (
    (0, IPV4, "dscp"),
    (0, IPV4, "ecn"),
    (0, IPV4, "ttl"),
    (0, IPV4, "checksum"),
    (UDP_OFFSET, UDP, "checksum"),
    (BTH_OFFSET, BTH, "resv8a"),
)

#: The shortest packet that gets an ICRC: IPv4, UDP and BTH headers, and the ICRC.
MIN_LENGTH = BTH_OFFSET + BTH.length + ICRC_BYTES


def variant_mask(width):
    """The bits of a first beat of ``width`` lanes that :data:`VARIANT_FIELDS` cover."""
    mask = 0
    for offset, layout, name in VARIANT_FIELDS:
        first, end = layout.bit_span(name)
        for wire_bit in range(8 * offset + first, 8 * offset + end):
            lane, bit_from_msb = divmod(wire_bit, 8)
            if lane >= width:
                raise ValueError(f"Field {name!r} lies beyond a first beat of {width} lanes")
            mask |= 1 << (8 * lane + 7 - bit_from_msb)
    return mask


class IcrcInserter(wiring.Component):
    """Writes the ICRC into the last 4 bytes of each RoCEv2 packet.

    The stream carries IPv4 packets from lane 0 of the first beat. A packet
    whose IP header has version 4, IHL 5 and protocol UDP, whose UDP
    destination port is 4791, and which holds at least :data:`MIN_LENGTH`
    bytes is RoCEv2: its
    last 4 bytes are a placeholder, replaced by the CRC-32 of
    :data:`PSEUDO_LRH` followed by the packet up to the placeholder with the
    :data:`VARIANT_FIELDS` set to ones, least significant byte first on the
    wire (like the Ethernet FCS). Every other packet, and the meta of all,
    pass unchanged.

    The ICRC of a RoCEv2 packet whose length is not a multiple of 4 is wrong
    (the placeholder then straddles lanes the datapath assumes aligned), but
    framing is unaffected and only its last 4 bytes change.

    One beat per cycle, no idle cycle between packets, latency
    :attr:`latency` cycles (6 at 64 lanes): a beat accepted on one clock edge
    is offered on ``o`` that many edges later when ``o`` is not stalled.
    Every register advances together when ``o`` can take a beat, so
    ``i.ready`` is ``o.ready`` or an empty output.

    The datapath: stage 1 masks the beat (variant fields set to ones on the
    first beat, lanes past the CRC'd bytes of the last beat zeroed); stage 2
    multiplies it by ``B`` of a full beat; stage 3 accumulates the register.
    The last beat's zero padding of ``p`` bytes (the placeholder's 4 and
    those past the packet) is then taken back out with
    ``A_p⁻¹ = A_4⁻¹ · A_4^−(p/4 − 1)``, two bits of ``p/4 − 1`` per stage, and
    the output stage writes the finalized CRC over the placeholder. Each
    stage is one flat XOR per bit, at most a few LUT6 levels.

    Parameters
    ----------
    width : int
        Byte lanes of a beat: a multiple of 4, at least :data:`MIN_LENGTH`
        (the first beat holds the headers the ICRC masks).
    """

    def __init__(self, *, width=BEAT_BYTES):
        if not isinstance(width, int) or width % ICRC_BYTES or width < MIN_LENGTH:
            raise ValueError(f"Beat width must be a multiple of {ICRC_BYTES} bytes of at least "
                             f"{MIN_LENGTH}, not {width!r}")
        self._width = width
        super().__init__({
            "i": In(packet_signature(NEXT_HOP_META, width=width)),
            "o": Out(packet_signature(NEXT_HOP_META, width=width)),
        })

    @property
    def width(self):
        return self._width

    @property
    def _pad_words_bits(self):
        return (self._width // ICRC_BYTES - 1).bit_length()

    @property
    def latency(self):
        """Cycles from a beat accepted on ``i`` to the same beat offered on ``o``."""
        return 4 + -(-self._pad_words_bits // 2)

    def elaborate(self, platform):
        m = Module()
        width = self._width
        words = width // ICRC_BYTES

        stage_layout = data.StructLayout({
            "valid": 1,
            "first": 1,
            "rocev2": 1,
            "pad_words": self._pad_words_bits,   # last beat: see pad_thermometer
            "beat": beat_layout(NEXT_HOP_META, width=width),
        })

        advance = Signal()
        m.d.comb += [
            advance.eq(~self.o.valid | self.o.ready),
            self.i.ready.eq(advance),
        ]

        def delay(value, name):
            stage = Signal(stage_layout, name=name)
            with m.If(advance):
                m.d.sync += stage.eq(value)
            return stage

        # Input: packet boundaries, and the RoCEv2 check on first beats.
        beat = self.i.p
        first = Signal(init=1)
        packet_rocev2 = Signal()
        ip = IPV4.from_wire(beat.data[:8 * UDP_OFFSET])
        udp = UDP.from_wire(beat.data[8 * UDP_OFFSET:8 * BTH_OFFSET])
        is_rocev2 = ((ip.version == 4) & (ip.ihl == IPV4.length // 4) &
                     (ip.protocol == IP_PROTO_UDP) & (udp.dst_port == UDP_PORT_ROCEV2) &
                     beat.keep[MIN_LENGTH - 1])
        rocev2 = Mux(first, is_rocev2, packet_rocev2)
        with m.If(self.i.valid & advance):
            m.d.sync += [
                first.eq(beat.last),
                packet_rocev2.eq(rocev2),
            ]

        def kept(keep, lane):
            if lane < 0:
                return C(1, 1)
            return keep[lane] if lane < width else C(0, 1)

        # The lanes of the beat the CRC covers: on the last beat, those before the placeholder.
        crc_lanes = Signal(width)
        # The last beat gets ``width − n`` bytes of zero padding after the ``n`` bytes the CRC
        # covers: the placeholder's 4 and ``pad_words`` more 4-byte words, counted here.
        pad_thermometer = Signal(words - 1)
        m.d.comb += [
            crc_lanes.eq(Cat(~beat.last | kept(beat.keep, lane + ICRC_BYTES)
                             for lane in range(width))),
            pad_thermometer.eq(Cat(~kept(beat.keep, width - ICRC_BYTES * word - 1)
                                   for word in range(words - 1))),
        ]

        # Stage 1: the bytes the CRC covers, zero-padded to a full beat.
        line = [Signal(stage_layout, name="stage_1")]
        masked = Signal(8 * width)
        with m.If(advance):
            m.d.sync += [
                line[0].valid.eq(self.i.valid),
                line[0].first.eq(first),
                line[0].rocev2.eq(rocev2),
                line[0].pad_words.eq(keep_count(pad_thermometer)),
                line[0].beat.eq(beat),
            ]
            m.d.sync += masked.eq((beat.data | Mux(first, variant_mask(width), 0)) &
                                  Cat(lane.replicate(8) for lane in crc_lanes))

        # Stage 2: the beat's term of the register update, over a whole beat
        # register' = register_matrix · register ⊕ data_matrix · data.
        register_matrix, data_matrix = ICRC.matrices(width)
        line.append(delay(line[-1], "stage_2"))
        chunk_term = Signal(ICRC.width)
        with m.If(advance):
            m.d.sync += chunk_term.eq(data_matrix.apply(masked))

        # Stage 3: the register after the beat; it holds between the beats of a packet.
        line.append(delay(line[-1], "stage_3"))
        register = Signal(ICRC.width)
        after_pseudo_lrh = ICRC.process(ICRC.initial, PSEUDO_LRH)
        with m.If(advance & line[-2].valid):
            m.d.sync += register.eq(Mux(line[-2].first, register_matrix @ after_pseudo_lrh,
                                        register_matrix.apply(register)) ^ chunk_term)

        # Stages 4…: the last beat's padding taken back out, two bits of pad_words per stage
        # (the first also takes out the placeholder's word).
        word_back = ICRC.advance(ICRC_BYTES) ** -1
        for low in range(0, self._pad_words_bits, 2):
            pad_words = line[-1].pad_words[low:low + 2]
            unpadded = Signal(ICRC.width, name=f"unpadded_{low // 2 + 1}")
            with m.If(advance), m.Switch(pad_words):
                for choice in range(1 << len(pad_words)):
                    words_back = (choice << low) + (1 if low == 0 else 0)
                    with m.Case(choice):
                        m.d.sync += unpadded.eq((word_back ** words_back).apply(register))
            register = unpadded
            line.append(delay(line[-1], f"stage_{len(line) + 1}"))

        # Output stage: the ICRC over the placeholder of a RoCEv2 packet's last beat.
        icrc = Signal(ICRC.width)
        m.d.comb += icrc.eq(ICRC.finalize_value(register))
        last = line[-1]
        beat = last.beat
        insert = last.rocev2 & beat.last
        lanes = []
        for lane in range(width):
            byte = beat.data.word_select(lane, 8)
            for index in range(ICRC_BYTES):
                at_lane = (kept(beat.keep, lane + ICRC_BYTES - 1 - index) &
                           ~kept(beat.keep, lane + ICRC_BYTES - index))
                byte = Mux(insert & at_lane, icrc.word_select(index, 8), byte)
            lanes.append(byte)
        with m.If(advance):
            m.d.sync += [
                self.o.valid.eq(last.valid),
                self.o.p.eq(beat),
                self.o.p.data.eq(Cat(lanes)),
            ]
        assert len(line) + 1 == self.latency
        return m
