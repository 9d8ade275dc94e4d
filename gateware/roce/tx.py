from amaranth import *
from amaranth.lib import fifo, stream, wiring
from amaranth.lib.wiring import In, Out, connect, flipped

from ..counters import counters_layout, event_counter
from ..packet.insert import HeaderInserter
from ..packet.register import PacketRegister, StreamRegister
from ..stream import BEAT_BYTES, NO_META, packet_signature
from ..udp.tx import UDP_TX_META
from .ack import ACK_EVENT
from .dcqcn import DCQCN_CONFIG, DcqcnReactionPoint
from .descriptor import (
    BUFFER_READ,
    MAX_PACKET_PAYLOAD,
    MESSAGE_END,
    PACKET_DESCRIPTOR,
    ROCE_TX_META,
    TRANSPORT,
    TRANSPORT_LENGTHS,
    buffer_beat,
)
from .pacer import PACED_LOOKUP, WIRE_OVERHEAD, Pacer
from .page_pool import PagePool, check_retransmit_pages
from .planner import TRANSMIT_CONFIG, PacketPlanner
from .qp_table import QpTable
from .reliability import STATUS_PORTS, ReliabilityEngine
from .requests import COMPLETION, QP_INDEX_BITS, QP_STATUS, QP_WRITE, WORK_REQUEST
from .retransmit import RetransmitBuffer
from .segmenter import PayloadSegmenter

__all__ = ["RequesterTransmitter"]


#: Beats of its planned packets the segmenter has yet to send when the planner may plan
#: the next: enough for the next descriptor to reach the segmenter in time (7 cycles).
LOOKAHEAD_BEATS = 16


def frame_beats(descriptor, width):
    """The beats the segmenter sends for a packet descriptor (payload, pad and ICRC)."""
    return (descriptor.frame_length + width - 1) >> (width - 1).bit_length()


class RequesterTransmitter(wiring.Component):
    """The RoCEv2 requester: work requests and their payload in, UDP datagrams to
    port 4791 out (BTH, RETH, ImmDt, payload, pad, and a 4-byte ICRC placeholder
    that the IP-level ICRC inserter fills), acknowledgements in, completions out.

    ``i_request`` takes one work request per message and ``i_payload`` its
    payload as one packet; ``o_completion`` reports each message once the
    responder has acknowledged it (or its QP failed). ``i_ack`` takes the ACK
    receiver's acknowledgements (``i_cnp`` its CNPs, counted, and acted on by the
    DCQCN reaction point with the settings ``i_dcqcn``: ``paced[n]``, for
    ``paced_readers`` gates, tells whether a QP must wait before its next message, see
    :class:`Pacer`). ``i_qp_write``
    sets a QP (once no message of it is being planned, in a cycle the
    reliability engine is free: new messages pause while it waits);
    ``i_qp_close`` flushes it (see :class:`ReliabilityEngine`); ``status_qp[n]`` →
    ``status[n]`` reads a QP's state and counters a cycle later. Each QP keeps the
    payload of its unacknowledged packets in pages of the pool of ``pages`` pages
    of 4 KiB all QPs share (:class:`PagePool`), up to a ring of ``ring_beats``
    beats (``i_config.qp_pages`` caps it lower at run time), and up to ``messages``
    unacknowledged messages in the pool of ``message_slots`` all QPs share; when
    it holds all the pages it may or the pool has none left, has ``messages``
    outstanding or the pool has no slot left, the QP waits (and the request and
    payload streams with it; ``counters.page_waits`` counts the cycles a packet
    waited for a page). ``i_paused``
    (the link pauses RoCEv2 frames) stops the ACK timers and RNR waits.

    Register → planner → descriptor FIFO → register → segmenter (payload: new from
    ``i_payload`` through a register, and into the retransmit buffer, or
    resent from it) → register → transport header inserter → register: 3
    cycles of latency on the data path, one beat per cycle, no idle cycle
    between the packets of a message. The planner plans a packet once the
    segmenter has fewer than ``LOOKAHEAD_BEATS`` beats left to send (short
    packets: several ahead), so a go-back-N resend starts after the packet
    being segmented when its NAK comes. ``i_request``, ``i_payload``,
    ``i_qp_write`` and ``i_qp_close`` end in register slices, and the
    planner's descriptors, the segmenter's message ends, the engine's
    completions and the retransmit buffer's reads and writes pass through
    registers, so that no path runs from one of these blocks through another.
    """

    def __init__(self, *, qps=16, ring_beats=2048, pages=512, messages=128,
                 message_slots=4096, width=BEAT_BYTES, descriptors=4, paced_readers=1):
        check_retransmit_pages(pages, ring_beats, width)
        self._qps = qps
        self._ring_beats = ring_beats
        self._pages = pages
        self._messages = messages
        self._message_slots = message_slots
        self._width = width
        self._descriptors = descriptors
        self._paced_readers = paced_readers
        super().__init__({
            "i_request": In(stream.Signature(WORK_REQUEST)),
            "i_payload": In(packet_signature(NO_META, width=width)),
            "i_qp_write": In(stream.Signature(QP_WRITE)),
            "i_qp_close": In(stream.Signature(QP_INDEX_BITS)),
            "i_config": In(TRANSMIT_CONFIG),
            "i_paused": In(1),
            "i_ack": In(stream.Signature(ACK_EVENT, always_ready=True)),
            "i_icrc_error": In(stream.Signature(QP_INDEX_BITS, always_ready=True)),
            "i_cnp": In(stream.Signature(QP_INDEX_BITS, always_ready=True)),
            "i_dcqcn": In(DCQCN_CONFIG),
            "paced": In(PACED_LOOKUP).array(paced_readers),
            "o": Out(packet_signature(UDP_TX_META, width=width)),
            "o_completion": Out(stream.Signature(COMPLETION)),
            "status_qp": In(QP_INDEX_BITS).array(STATUS_PORTS),
            "status": Out(QP_STATUS).array(STATUS_PORTS),
            "counters": Out(self.counters_layout()),
        })

    @property
    def qps(self):
        return self._qps

    @staticmethod
    def counters_layout():
        return counters_layout("page_waits")

    def elaborate(self, platform):
        m = Module()
        width = self._width

        # Register slices on the request and payload inputs: the paths of the sources
        # (arbiters, generators) end there.
        m.submodules.request_in = request_in = StreamRegister(stream.Signature(WORK_REQUEST))
        m.submodules.payload_in = payload_in = PacketRegister(NO_META, width=width)
        m.submodules.qp_write_in = qp_write_in = StreamRegister(stream.Signature(QP_WRITE))
        m.submodules.qp_close_in = qp_close_in = StreamRegister(
            stream.Signature(QP_INDEX_BITS))
        m.submodules.table = table = QpTable(self._qps)
        m.submodules.planner = planner = PacketPlanner(
            qps=self._qps, ring_beats=self._ring_beats, width=width)
        m.submodules.reliability = reliability = ReliabilityEngine(
            qps=self._qps, messages=self._messages, message_slots=self._message_slots,
            width=width)
        m.submodules.descriptors = descriptors = fifo.SyncFIFOBuffered(
            width=PACKET_DESCRIPTOR.size, depth=self._descriptors)
        # A register slice between the descriptor queue and the segmenter: the segmenter's
        # decision to take a descriptor ends there, not in the queue's level.
        m.submodules.queued = queued = StreamRegister(stream.Signature(PACKET_DESCRIPTOR))
        m.submodules.reads = reads = fifo.SyncFIFOBuffered(
            width=BUFFER_READ.size, depth=self._descriptors)
        m.submodules.pages = pages = PagePool(
            qps=self._qps, pages=self._pages, ring_beats=self._ring_beats, width=width)
        m.submodules.buffer = buffer = RetransmitBuffer(
            qps=self._qps, pages=self._pages, ring_beats=self._ring_beats, width=width)
        m.submodules.segmenter = segmenter = PayloadSegmenter(
            ring_beats=self._ring_beats, width=width)
        m.submodules.segmented = segmented = PacketRegister(ROCE_TX_META, width=width)
        m.submodules.transport = transport = HeaderInserter(
            "transport", TRANSPORT, ROCE_TX_META, width=width, lengths=TRANSPORT_LENGTHS)
        m.submodules.framed = framed = PacketRegister(UDP_TX_META, width=width)
        m.submodules.reaction = reaction = DcqcnReactionPoint(qps=self._qps)
        m.submodules.pacer = pacer = Pacer(qps=self._qps, readers=self._paced_readers)

        # Setting a QP (between its messages): its path into the table, its PSN and
        # timers into the engine. New requests wait for it, so that one that comes after
        # it sees the QP set.
        # The planner's ``holds`` answers for the QP of the cycle before: a write waits a
        # cycle in its register (``settled``) before it may go, so the answer is its own.
        connect(m, flipped(self.i_qp_write), qp_write_in.i)
        qp_write = qp_write_in.o
        settled = Signal()
        m.d.sync += settled.eq(qp_write.valid & ~qp_write.ready)
        setting = qp_write.valid & settled & ~planner.holds
        m.d.comb += [
            planner.holds_qp.eq(qp_write.p.qp),
            planner.i_setting.eq(qp_write.valid),
            reliability.i_reset.valid.eq(setting),
            reliability.i_pages_clear.eq(pages.o_reset_clear),
            pages.reset_qp.valid.eq(setting),
            pages.reset_qp.p.eq(qp_write.p.qp),
            pages.i_rebase.valid.eq(reliability.i_reset.valid & reliability.i_reset.ready),
            pages.i_rebase.p.eq(qp_write.p.qp),
            reliability.i_reset.p.eq(qp_write.p),
            qp_write.ready.eq(reliability.i_reset.ready & settled & ~planner.holds),
            table.i_write.valid.eq(qp_write.valid & qp_write.ready),
            table.i_write.p.eq(qp_write.p),
            table.read_qp.eq(planner.read_qp),
            planner.read_path.eq(table.read_path),
            planner.i_config.eq(self.i_config),
            reliability.i_config.eq(self.i_config),
            reliability.i_paused.eq(self.i_paused),
            reliability.new_qp.eq(planner.new_qp),
            planner.new_view.eq(reliability.new_view),
            reliability.replay_qp.eq(planner.replay_qp),
            planner.replay_view.eq(reliability.replay_view),
        ]
        # The engine checks each acknowledgement's source against the table's path.
        connect(m, reliability.r_remote_ip, table.r_remote_ip)

        # The retransmit pages: taken by the planner's new packets, looked up by the
        # buffer, given back behind the engine's positions.
        m.d.comb += [
            pages.view_qp.eq(planner.new_qp),
            planner.pages_released.eq(pages.view_released),
            planner.pages_available.eq(pages.o_available),
            reliability.pages_qp.eq(pages.state_qp),
            pages.state.eq(reliability.pages_state),
            self.counters.page_waits.eq(event_counter(m, planner.o_page_wait, "page_waits")),
        ]
        connect(m, planner.o_take, pages.i_take)
        for active, port in zip(planner.o_active, pages.i_active[:2], strict=True):
            connect(m, active, port)
        m.d.comb += [
            pages.i_active[2].valid.eq(reliability.o_replay.valid),
            pages.i_active[2].p.eq(reliability.o_replay.p.qp),
        ]
        connect(m, reliability.o_head_moved, pages.i_hint)
        for lookup, translate in zip(buffer.translate, pages.translate, strict=True):
            connect(m, lookup, translate)
        for index in range(STATUS_PORTS):
            m.d.comb += [
                reliability.status_qp[index].eq(self.status_qp[index]),
                self.status[index].eq(reliability.status[index]),
            ]
        connect(m, flipped(self.i_request), request_in.i)
        connect(m, request_in.o, planner.i_request)
        connect(m, flipped(self.i_qp_close), qp_close_in.i)
        connect(m, qp_close_in.o, reliability.i_close)
        connect(m, flipped(self.i_ack), reliability.i_ack)
        connect(m, flipped(self.i_icrc_error), reliability.i_icrc_error)
        connect(m, planner.o_loaded, reliability.i_loaded)

        # Congestion control: CNPs and packets sent to the reaction point, whose rates
        # pace each QP's messages (``paced`` holds back their work requests); a QP set
        # again returns to the line rate.
        sent = planner.o_sent
        m.d.comb += [
            reliability.i_cnp.valid.eq(self.i_cnp.valid),
            reliability.i_cnp.p.eq(self.i_cnp.p),
            reaction.i_cnp.valid.eq(self.i_cnp.valid),
            reaction.i_cnp.p.eq(self.i_cnp.p),
            reliability.i_sent.valid.eq(sent.valid),
            reliability.i_sent.p.eq(sent.p),
            reaction.i_bytes.valid.eq(sent.valid),
            reaction.i_bytes.p.qp.eq(sent.p.qp),
            reaction.i_bytes.p.bytes.eq(sent.p.datagram + WIRE_OVERHEAD),
            pacer.i_sent.valid.eq(sent.valid),
            pacer.i_sent.p.qp.eq(sent.p.qp),
            pacer.i_sent.p.bytes.eq(sent.p.datagram + WIRE_OVERHEAD),
            reaction.i_reset.valid.eq(table.i_write.valid),
            reaction.i_reset.p.eq(table.i_write.p.qp),
            reaction.i_config.eq(self.i_dcqcn),
            pacer.i_cycles_per_us.eq(self.i_dcqcn.cycles_per_us),
        ]
        for port, reader in zip(self.paced, pacer.paced, strict=True):
            connect(m, flipped(port), reader)
        connect(m, reaction.o_rate, pacer.i_rate)
        connect(m, reliability.o_replay, planner.i_replay)

        # Register slices after the planner's descriptors and before the engine's and the
        # segmenter's ends of messages, so the planner's decisions, the segmenter's and
        # the engine's completions each end in flip-flops.
        m.submodules.planned = planned = StreamRegister(stream.Signature(PACKET_DESCRIPTOR))
        m.submodules.message_ends = message_ends = StreamRegister(
            stream.Signature(MESSAGE_END))
        m.submodules.completions = completions = StreamRegister(stream.Signature(COMPLETION))
        # The planner plans a packet once the segmenter has fewer than LOOKAHEAD_BEATS
        # beats left to send of those planned, not as long as the queue between them has
        # room (its register slices and FIFO hold 8 descriptors): a go-back-N resend goes
        # out behind every packet planned before it, and each 4 KiB packet queued is 108
        # cycles of a 100 Gb/s line more resent in vain. (A descriptor sends its frame's
        # beats, a ``drop`` one none.)
        ahead = Signal(range(LOOKAHEAD_BEATS + MAX_PACKET_PAYLOAD // width + 2))
        entered = Signal.like(ahead)                        # beats planned last cycle
        sent_beat = Signal()                                # a beat segmented last cycle
        open_ = Signal()                                    # the planner may plan a packet
        packet_taken = planner.o_packet.valid & planner.o_packet.ready
        m.d.comb += [
            planned.i.valid.eq(planner.o_packet.valid & open_),
            planned.i.p.eq(planner.o_packet.p),
            planner.o_packet.ready.eq(planned.i.ready & open_),
        ]
        m.d.sync += [
            entered.eq(Mux(packet_taken & ~planner.o_packet.p.drop,
                           frame_beats(planner.o_packet.p, width), 0)),
            sent_beat.eq(segmenter.o.valid & segmenter.o.ready),
            ahead.eq(ahead + entered - sent_beat),
            # Closed for the cycle after a packet is planned, until ``ahead`` counts it.
            open_.eq(~packet_taken & (ahead + entered < LOOKAHEAD_BEATS)),
        ]
        connect(m, segmenter.o_message_end, message_ends.i)
        connect(m, reliability.o_completion, completions.i)
        m.d.comb += [
            descriptors.w_en.eq(planned.o.valid),
            descriptors.w_data.eq(planned.o.p),
            planned.o.ready.eq(descriptors.w_rdy),
            queued.i.valid.eq(descriptors.r_rdy),
            queued.i.p.eq(descriptors.r_data),
            descriptors.r_en.eq(queued.i.ready),
            reads.w_en.eq(planner.o_read.valid),
            reads.w_data.eq(planner.o_read.p),
            planner.o_read.ready.eq(reads.w_rdy),
            buffer.i_read.p.eq(reads.r_data),
        ]
        # A resend's payload is read when its descriptor reaches the segmenter, not
        # before: its original may still be on its way into the buffer.
        connect(m, queued.o, segmenter.i_packet)
        head = queued.o
        read_issued = Signal()
        may_read = head.valid & head.p.replay & head.p.has_payload & ~read_issued
        m.d.comb += [
            buffer.i_read.valid.eq(reads.r_rdy & may_read),
            reads.r_en.eq(buffer.i_read.ready & may_read),
        ]
        with m.If(buffer.i_read.valid & buffer.i_read.ready):
            m.d.sync += read_issued.eq(1)
        with m.If(head.valid & head.ready):
            m.d.sync += read_issued.eq(0)
        connect(m, flipped(self.i_payload), payload_in.i)
        connect(m, payload_in.o, segmenter.i_payload)
        # The payload written to the buffer a cycle later, and read through a register
        # slice, so that neither the buffer's write nor its read is decided in the
        # segmenter's cycle. (A resend's read starts no sooner than the cycle after its
        # original's last beat left the segmenter, so the delayed write still comes first.)
        m.submodules.replayed = replayed = StreamRegister(stream.Signature(buffer_beat(width)))
        m.d.sync += [
            buffer.i_write.valid.eq(segmenter.o_write.valid),
            buffer.i_write.p.eq(segmenter.o_write.p),
        ]
        connect(m, buffer.o_read, replayed.i)
        connect(m, replayed.o, segmenter.i_replay)
        connect(m, segmenter.o, segmented.i)
        connect(m, segmented.o, transport.i)
        connect(m, transport.o, framed.i)
        connect(m, framed.o, flipped(self.o))

        # Message ends: a tracked one's status waits in its slot for the ACK; a request
        # completed at once (refused, or flushed) joins the engine's completions.
        ended = message_ends.o
        m.d.comb += [
            reliability.i_message_end.valid.eq(ended.valid & ended.p.tracked),
            reliability.i_message_end.p.eq(ended.p),
        ]
        immediate = ended.valid & ~ended.p.tracked
        completion = self.o_completion
        tracked = completions.o
        held = Signal()                 # an immediate completion offered and not yet taken
        prefer_immediate = held | ~tracked.valid
        m.d.comb += [
            completion.valid.eq(Mux(prefer_immediate, immediate, tracked.valid)),
            completion.p.eq(Mux(prefer_immediate, ended.p.completion, tracked.p)),
            tracked.ready.eq(~prefer_immediate & completion.ready),
            ended.ready.eq(ended.p.tracked | (prefer_immediate & completion.ready)),
        ]
        m.d.sync += held.eq(prefer_immediate & immediate & ~completion.ready)
        return m
