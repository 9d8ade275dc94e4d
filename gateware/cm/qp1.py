"""QP1, the General Service Interface over RoCEv2: CM MADs in and out of Unreliable
Datagram SEND ONLY packets (IBTA vol. 1, 13.5; annex A17 for RoCEv2).

A GSI packet's UDP payload is BTH (opcode 0x64), DETH (Q_Key 0x80010000), a 256-byte
MAD and the ICRC: 280 bytes, a UDP length of 288.

The CM state machine that will use QP1 plugs in between the two components: it takes
:data:`QP1_RECEIVED` records from :class:`Qp1Receiver`'s ``o`` and gives
:data:`QP1_SEND` records to :class:`Qp1Transmitter`'s ``i``. Both are plain
``lib.stream`` records holding a whole MAD as a ``gateware.headers.MAD`` value, so
the consumer reads and writes fields by name: ``data.View(CM_REQ, record.mad.data)``
for a REQ, ``record.mad.header.transaction_id`` for the TID to echo. A reply goes back
to ``record.src_ip`` and QP ``record.src_qp``. Nothing else is needed to answer a MAD;
the receiver has already checked everything below the MAD's own fields (attribute ID,
communication IDs, service ID are the consumer's).
"""

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out, connect, flipped

from ..counters import counters_layout, event_counter
from ..headers import (
    BTH,
    CM_CLASS_VERSION,
    DETH,
    GSI_QKEY,
    GSI_QPN,
    IPV4,
    MAD,
    MAD_BASE_VERSION,
    METHOD_SEND,
    MGMT_CLASS_CM,
    OPCODE_UD_SEND_ONLY,
    UDP,
    UDP_PORT_ROCEV2,
)
from ..packet.fifo import PacketFIFO
from ..packet.router import PacketRouter
from ..roce.icrc import ICRC, ICRC_BYTES, PSEUDO_LRH, variant_mask
from ..stream import BEAT_BYTES, beats_for, packet_signature
from ..udp.rx import UDP_RX_META
from ..udp.tx import UDP_TX_META

__all__ = ["Qp1Split", "Qp1Receiver", "Qp1Transmitter", "QP1_RECEIVED", "QP1_SEND", "QP1_COUNTERS",
           "GSI_PAYLOAD_BYTES", "DEFAULT_PARTITION", "SOURCE_PORT_BASE"]

#: The UDP payload of a GSI packet: BTH, DETH, MAD, ICRC.
GSI_PAYLOAD_BYTES = BTH.length + DETH.length + MAD.length + ICRC_BYTES

#: The P_Key's partition (its low 15 bits) QP1 accepts: the default partition, from a
#: full (0xFFFF) or a limited (0x7FFF) member, since this endpoint is a full member.
DEFAULT_PARTITION = 0x7FFF

#: The UDP source ports of the MADs sent: 0xC000 + a 14-bit flow (the dynamic ports of
#: RFC 6335, as Linux's RoCEv2 source ports).
SOURCE_PORT_BASE = 0xC000

#: A MAD received on QP1: who sent it (IPv4 address, UDP source port, QP) and the MAD.
QP1_RECEIVED = data.StructLayout({
    "src_ip": 32,
    "src_port": 16,
    "src_qp": 24,
    "mad": MAD,
})

#: A MAD to send from QP1: to which IPv4 address and QP (normally 1), the 14 bits of the
#: UDP source port above :data:`SOURCE_PORT_BASE`, and the MAD.
QP1_SEND = data.StructLayout({
    "dst_ip": 32,
    "dest_qp": 24,
    "flow": 14,
    "mad": MAD,
})

#: What the receiver counts: MADs delivered, and packets dropped by reason (see
#: :class:`Qp1Receiver`).
_DROP_REASONS = ("length", "icrc", "opcode", "version", "qp", "pkey", "qkey", "mad", "busy")
QP1_COUNTERS = counters_layout("received", *_DROP_REASONS)

#: What the ICRC covers of the headers in ``meta``: the IPv4 and UDP headers.
_HEADERS = IPV4.length + UDP.length
#: The bytes of the payload the ICRC covers.
_COVERED = GSI_PAYLOAD_BYTES - ICRC_BYTES


def _wire_bits(offset, length):
    """The bit slice of bytes ``offset`` to ``offset + length`` of lanes in wire order."""
    return slice(8 * offset, 8 * (offset + length))


class Qp1Split(wiring.Component):
    """Splits the datagrams of UDP port 4791 by their BTH's destination QP: QP1's to
    ``o_qp1``, every other one to ``o_other`` (the first beat must hold the BTH; a
    shorter datagram goes where its first bytes say, and its receiver drops it).

    Latency 1 cycle: the beats pass a register slice (no path runs through the split);
    one beat per cycle, no idle cycle between datagrams; ``i`` stalls only when the
    output its datagram goes to does.
    """

    def __init__(self, *, width=BEAT_BYTES):
        if not isinstance(width, int) or width < BTH.length:
            raise ValueError(f"Beat width must be an integer of at least {BTH.length} bytes, "
                             f"not {width!r}")
        self._width = width
        super().__init__({
            "i": In(packet_signature(UDP_RX_META, width=width)),
            "o_qp1": Out(packet_signature(UDP_RX_META, width=width)),
            "o_other": Out(packet_signature(UDP_RX_META, width=width)),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.router = router = PacketRouter(UDP_RX_META, outputs=2, drop_reasons=(),
                                                    width=self._width, registered=True)
        connect(m, flipped(self.i), router.i)
        connect(m, router.o[0], flipped(self.o_other))
        connect(m, router.o[1], flipped(self.o_qp1))
        bth = BTH.from_wire(self.i.p.data[:8 * BTH.length])
        m.d.comb += router.i_route.eq(bth.dest_qp == GSI_QPN)
        return m


class Qp1Receiver(wiring.Component):
    """Takes the datagrams of UDP port 4791 meant for QP1 and hands each valid CM MAD on
    as one :data:`QP1_RECEIVED` record.

    A datagram is delivered when its UDP length is 288 (BTH, DETH, a 256-byte MAD and
    the ICRC); its ICRC is right (over the IPv4 and UDP headers of ``meta`` and the
    payload, the variant fields as ones, as ``gateware.roce.icrc`` defines them);
    its BTH has opcode UD SEND ONLY (0x64), version 0, destination QP 1 and a P_Key of
    the default partition (:data:`DEFAULT_PARTITION`, either membership); its DETH the
    GSI Q_Key 0x80010000; and its MAD base version 1, class CM (0x07), class version 2
    and method Send (0x03, R clear). Anything else is dropped and counted in
    ``o_counters`` by the first reason that applies, in that order: ``length``,
    ``icrc``, ``opcode``, ``version``, ``qp``, ``pkey``, ``qkey``, ``mad``. ``received``
    counts those delivered.

    ``i`` is always ready (the receive path never stalls here). A datagram whose UDP
    length is not 288 is dropped as it arrives; the others wait in a queue of ``queue``
    datagrams (store and forward, in block RAM at the default size), so that a host
    that sends its REQs and RTUs back to back loses none while the consumer works on
    one MAD at a time. A datagram that finds the queue full is dropped as ``busy``.
    The queue passes a datagram on two cycles after its last beat is in; the receiver
    then takes its beats but the last into registers, and with the last the whole MAD
    and the sender go to the record: ``o.valid`` is high after the fourth clock edge
    after the one that takes the last beat from the queue (the ICRC at one beat per
    cycle: the beat masked, its term of the register update, the register, the last
    beat's padding taken back out; then the verdict). ``o`` holds the record until
    taken, and the queue holds the next datagram meanwhile.

    Parameters
    ----------
    width : int
        Byte lanes of a beat, at least 5 (the BTH's variant byte lies in the first beat).
    queue : int
        Datagrams the queue holds.
    """

    def __init__(self, *, width=BEAT_BYTES, queue=32):
        if not isinstance(width, int) or width < BTH.byte_span("resv8a")[1]:
            raise ValueError(f"Beat width must be an integer of at least "
                             f"{BTH.byte_span('resv8a')[1]} bytes, not {width!r}")
        if not isinstance(queue, int) or queue < 1:
            raise ValueError(f"The queue must hold a positive number of datagrams, not {queue!r}")
        self._width = width
        self._queue = queue
        super().__init__({
            "i": In(packet_signature(UDP_RX_META, width=width)),
            "o": Out(stream.Signature(QP1_RECEIVED)),
            "o_counters": Out(QP1_COUNTERS),
        })

    @property
    def width(self):
        return self._width

    @staticmethod
    def drop_reasons():
        return _DROP_REASONS

    def elaborate(self, platform):
        m = Module()
        width = self._width
        beats = beats_for(GSI_PAYLOAD_BYTES, width)

        # The queue, fed only datagrams of the GSI length (known from the first beat's
        # meta, so a flood of other sizes never takes the room of MADs).
        m.submodules.queue = queue = PacketFIFO(
            UDP_RX_META, depth=1 << (self._queue * beats - 1).bit_length(),
            max_packets=self._queue, width=width, length_field="bytes")
        first_beat = Signal(init=1)
        skipping = Signal()
        wrong_length = self.i.p.meta.udp.length != UDP.length + GSI_PAYLOAD_BYTES
        skip = Mux(first_beat, wrong_length, skipping)
        with m.If(self.i.valid):
            m.d.sync += first_beat.eq(self.i.p.last)
            with m.If(first_beat):
                m.d.sync += skipping.eq(wrong_length)
        m.d.comb += [
            self.i.ready.eq(1),
            queue.i.valid.eq(self.i.valid & ~skip),
            queue.i.p.eq(self.i.p),
        ]
        skipped = self.i.valid & self.i.p.last & skip

        # One datagram at a time from the queue, while no record is held or pending.
        pending = Signal()
        datagram = queue.o
        meta = datagram.p.meta
        m.d.comb += datagram.ready.eq(~self.o.valid & ~pending)
        accepted = datagram.valid & datagram.ready

        # The beat's index in its datagram (saturating past the beats a GSI packet has),
        # and every beat but the last of one kept in registers.
        index = Signal(range(beats + 1))
        stored = Signal(8 * width * (beats - 1))
        with m.If(accepted):
            m.d.sync += index.eq(Mux(datagram.p.last, 0, Mux(index == beats, beats, index + 1)))
            if beats > 1:
                with m.If(index < beats - 1):
                    m.d.sync += stored.word_select(index, 8 * width).eq(datagram.p.data)

        # With the last beat: the whole payload, and the checks on its headers.
        payload = Cat(stored, datagram.p.data)
        bth = BTH.from_wire(payload[_wire_bits(0, BTH.length)])
        deth = DETH.from_wire(payload[_wire_bits(BTH.length, DETH.length)])
        mad_lanes = payload[_wire_bits(BTH.length + DETH.length, MAD.length)]
        mad = MAD.from_wire(mad_lanes)
        header = mad.header
        verdict_layout = data.StructLayout({
            "done": 1,                  # the last beat of a datagram
            "icrc": ICRC_BYTES * 8,     # as received
            **{reason: 1 for reason in _DROP_REASONS if reason not in ("icrc", "busy")},
        })
        verdict = Signal(verdict_layout)
        m.d.comb += [
            verdict.done.eq(accepted & datagram.p.last),
            verdict.icrc.eq(payload[_wire_bits(_COVERED, ICRC_BYTES)]),
            # (the UDP length was checked as the datagram came in: here its beats)
            verdict.length.eq(index != beats - 1),
            verdict.opcode.eq(bth.opcode != OPCODE_UD_SEND_ONLY),
            verdict.version.eq(bth.version != 0),
            verdict.qp.eq(bth.dest_qp != GSI_QPN),
            verdict.pkey.eq(bth.pkey[:15] != DEFAULT_PARTITION),
            verdict.qkey.eq(deth.qkey != GSI_QKEY),
            verdict.mad.eq((header.base_version != MAD_BASE_VERSION) |
                           (header.mgmt_class != MGMT_CLASS_CM) |
                           (header.class_version != CM_CLASS_VERSION) |
                           header.response | (header.method != METHOD_SEND)),
        ]
        with m.If(verdict.done):
            m.d.sync += [
                pending.eq(1),
                self.o.p.src_ip.eq(meta.ip.src),
                self.o.p.src_port.eq(meta.udp.src_port),
                self.o.p.src_qp.eq(deth.src_qp),
                self.o.p.mad.eq(Value.cast(mad)),
            ]

        # The ICRC, one beat per cycle. Stage 1: the beat with the BTH's variant byte as
        # ones and the lanes past the covered bytes (the ICRC's and any after) as zeros;
        # with the first beat, the IPv4 and UDP headers with their variant fields as ones.
        mask = variant_mask(_HEADERS + width)
        header_mask = mask & ((1 << 8 * _HEADERS) - 1)
        first_beat_mask = mask >> 8 * _HEADERS
        covered = Signal(8 * width)
        with m.Switch(index):
            for beat in range(beats + 1):
                lanes = min(max(_COVERED - beat * width, 0), width)
                with m.Case(beat):
                    m.d.comb += covered.eq(Cat(C((1 << 8 * lanes) - 1, 8 * lanes),
                                               C(0, 8 * (width - lanes))))
        stage_1 = Signal(data.StructLayout({
            "valid": 1, "first": 1, "beat": 8 * width, "headers": 8 * _HEADERS,
            "verdict": verdict_layout}))
        m.d.sync += [
            stage_1.valid.eq(accepted),
            stage_1.first.eq(index == 0),
            stage_1.beat.eq((datagram.p.data | Mux(index == 0, first_beat_mask, 0)) & covered),
            stage_1.headers.eq(Cat(IPV4.to_wire(meta.ip), UDP.to_wire(meta.udp)) |
                               header_mask),
            stage_1.verdict.eq(verdict),
        ]

        # Stage 2: the beat's term of register' = A·register ⊕ B·beat, and for a first
        # beat the register it starts from (the pseudo-LRH and the headers) times A.
        beat_matrix, data_matrix = ICRC.matrices(width)
        headers_matrix, headers_data = ICRC.matrices(_HEADERS)
        after_lrh = ICRC.process(ICRC.initial, PSEUDO_LRH)
        start_data = beat_matrix @ headers_data
        start_constant = beat_matrix @ (headers_matrix @ after_lrh)
        stage_2 = Signal(data.StructLayout({
            "valid": 1, "first": 1, "term": ICRC.width, "start": ICRC.width,
            "verdict": verdict_layout}))
        m.d.sync += [
            stage_2.valid.eq(stage_1.valid),
            stage_2.first.eq(stage_1.first),
            stage_2.term.eq(data_matrix.apply(stage_1.beat)),
            stage_2.start.eq(start_data.apply(stage_1.headers) ^ start_constant),
            stage_2.verdict.eq(stage_1.verdict),
        ]

        # Stage 3: the register after the beat.
        register = Signal(ICRC.width)
        with m.If(stage_2.valid):
            m.d.sync += register.eq(Mux(stage_2.first, stage_2.start,
                                        beat_matrix.apply(register)) ^ stage_2.term)
        verdict_3 = Signal(verdict_layout)
        m.d.sync += verdict_3.eq(stage_2.verdict)

        # Stage 4: the zero bytes the beats added past the covered ones taken back out.
        padding = beats * width - _COVERED
        unpadded = Signal(ICRC.width)
        verdict_4 = Signal(verdict_layout)
        m.d.sync += [
            unpadded.eq((ICRC.advance(padding) ** -1).apply(register)),
            verdict_4.eq(verdict_3),
        ]

        # The verdict: deliver, or drop and count.
        icrc_wrong = Signal()
        m.d.comb += icrc_wrong.eq(ICRC.finalize_value(unpadded) != verdict_4.icrc)
        failed = {reason: (icrc_wrong if reason == "icrc" else verdict_4[reason])
                  for reason in _DROP_REASONS if reason != "busy"}
        strobes = {}
        earlier = C(0, 1)
        for reason, fails in failed.items():
            strobes[reason] = verdict_4.done & fails & ~earlier
            earlier = earlier | fails
        delivered = verdict_4.done & ~earlier
        strobes["busy"] = queue.o_overflow_drop
        with m.If(verdict_4.done):
            m.d.sync += pending.eq(0)
        with m.If(delivered):
            m.d.sync += self.o.valid.eq(1)
        with m.Elif(self.o.ready):
            m.d.sync += self.o.valid.eq(0)

        m.d.comb += self.o_counters.received.eq(event_counter(m, delivered, "received"))
        # A datagram of another length counts as it is skipped, or (its beats and its
        # UDP length disagree) at the verdict; both can come in one cycle.
        length = Signal.like(self.o_counters.length)
        m.d.sync += length.eq(length + skipped + strobes.pop("length"))
        m.d.comb += self.o_counters.length.eq(length)
        for reason, strobe in strobes.items():
            m.d.comb += self.o_counters[reason].eq(event_counter(m, strobe, reason))
        return m


class Qp1Transmitter(wiring.Component):
    """Sends each :data:`QP1_SEND` record as a RoCEv2 UD SEND ONLY datagram from QP1.

    The datagram goes to ``dst_ip``, UDP port 4791, from port ``SOURCE_PORT_BASE +
    flow``, traffic class ``i_tos``: BTH (opcode 0x64, P_Key 0xFFFF, version 0,
    destination ``dest_qp``, a PSN counting the MADs sent), DETH (Q_Key 0x80010000,
    source QP 1), the MAD, and 4 zero bytes where the ICRC goes: the core's
    ``IcrcInserter`` (``gateware.roce.icrc``) writes it after the IPv4 transmitter.

    Latency 0: the beats are cut from the record as ``o`` takes them, and the record
    is taken with the last one (``i.ready`` is ``o.ready`` on the last beat). One beat
    per cycle, no idle cycle between datagrams.
    """

    def __init__(self, *, width=BEAT_BYTES):
        if not isinstance(width, int) or width < 1:
            raise ValueError(f"Beat width must be a positive integer, not {width!r}")
        self._width = width
        super().__init__({
            "i": In(stream.Signature(QP1_SEND)),
            "i_tos": In(8),
            "o": Out(packet_signature(UDP_TX_META, width=width)),
        })

    @property
    def width(self):
        return self._width

    def elaborate(self, platform):
        m = Module()
        width = self._width
        beats = beats_for(GSI_PAYLOAD_BYTES, width)
        record = self.i.p

        psn = Signal(24)
        bth = Signal(BTH)
        deth = Signal(DETH)
        m.d.comb += [
            bth.opcode.eq(OPCODE_UD_SEND_ONLY),
            bth.pkey.eq(0xFFFF),
            bth.dest_qp.eq(record.dest_qp),
            bth.psn.eq(psn),
            deth.qkey.eq(GSI_QKEY),
            deth.src_qp.eq(GSI_QPN),
        ]
        payload = Cat(BTH.to_wire(bth), DETH.to_wire(deth), MAD.to_wire(record.mad),
                      C(0, 8 * (beats * width - GSI_PAYLOAD_BYTES + ICRC_BYTES)))

        index = Signal(range(beats))
        last = index == beats - 1
        m.d.comb += [
            self.o.valid.eq(self.i.valid),
            self.o.p.data.eq(payload.word_select(index, 8 * width)),
            self.o.p.keep.eq(Mux(last, (1 << GSI_PAYLOAD_BYTES - (beats - 1) * width) - 1,
                                 (1 << width) - 1)),
            self.o.p.last.eq(last),
            self.o.p.meta.dst_ip.eq(record.dst_ip),
            self.o.p.meta.src_port.eq(SOURCE_PORT_BASE | record.flow),
            self.o.p.meta.dst_port.eq(UDP_PORT_ROCEV2),
            self.o.p.meta.length.eq(GSI_PAYLOAD_BYTES),
            self.o.p.meta.tos.eq(self.i_tos),
            self.i.ready.eq(self.o.ready & last),
        ]
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += index.eq(Mux(last, 0, index + 1))
            with m.If(last):
                m.d.sync += psn.eq(psn + 1)
        return m
