from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..arith import sum_above
from ..headers import BTH, IMMDT, RETH, UDP_PORT_ROCEV2
from ..stream import BEAT_BYTES
from .descriptor import (
    BUFFER_READ,
    MAX_PACKET_PAYLOAD,
    MESSAGE,
    MESSAGE_LOADED,
    PACKET_DESCRIPTOR,
    PACKET_SENT,
    POINTER_BITS,
    QP_VIEW,
    REPLAY,
    SLOT_BITS,
)
from .icrc import ICRC_BYTES
from .opcodes import Opcode
from .page_pool import (
    MIN_QP_PAGES,
    check_ring_beats,
    page_offset_bits,
    page_take,
    vpage_bits_of,
)
from .qp_context import qp_bits_of
from .qp_table import QP_PATH
from .requests import (
    MAX_MESSAGE_BYTES,
    QP_INDEX_BITS,
    WORK_REQUEST,
    CompletionStatus,
    PathMtu,
    Verb,
)

__all__ = ["PacketPlanner", "TRANSMIT_CONFIG", "PKEY_DEFAULT"]

#: Settings of the transmit engine that hold for every QP.
TRANSMIT_CONFIG = data.StructLayout({
    "tos": 8,               # IPv4 DSCP/ECN byte of every RoCEv2 packet
    "tick": 16,             # clock cycles of the 4.096 us tick of the IB timers
    # retransmit pages a QP may hold: 2 up to its ring's (0: its ring's), so that one QP
    # cannot take the whole pool
    "qp_pages": 16,
})

#: The default partition key (full membership), the only one RoCE uses.
PKEY_DEFAULT = 0xFFFF


#: RoCEv2 source ports lie in 0xC000–0xFFFF (IBTA annex A17): these bits are always set.
ROCEV2_SOURCE_PORTS = 0xC000

#: Bytes of the BTH with every extension (RETH and ImmDt) a packet may carry.
_MAX_TRANSPORT = BTH.length + RETH.length + IMMDT.length

#: A context's next packet, worked out ahead: whether it is the last of its message, its
#: payload bytes, the beats they take, what the segmenter needs of it (see
#: ``PACKET_DESCRIPTOR``), and the UDP payload bytes it makes (BTH to ICRC).
_NEXT_PACKET = data.StructLayout({
    "last": 1,
    "length": range(MAX_PACKET_PAYLOAD + 1),
    "beats": range(MAX_PACKET_PAYLOAD + 1),
    "frame_length": range(MAX_PACKET_PAYLOAD + 8),
    "single_beat": 1,
    "first": 1,                 # the first packet of its message
    "datagram": range(_MAX_TRANSPORT + MAX_PACKET_PAYLOAD + 8),
})


#: Where the planner is in one message: the message, its QP's path, and the next packet.
_CONTEXT = data.StructLayout({
    "qp": QP_INDEX_BITS,
    "slot": SLOT_BITS,
    "message": MESSAGE,
    "path": QP_PATH,
    "psn": 24,                  # of the next packet
    "index": 24,                # of the next packet in the message
    "offset": POINTER_BITS,     # ring position of the next packet's payload
    "after": 24,                # packets of the message after the next one
    "following_last": 1,        # the packet after the next one is the message's last
    "tail": _NEXT_PACKET,       # the message's last packet (when it is not its first)
})


def _opcode(verb, first, last):
    """The RC opcode of a packet: the verb's family, and where the packet sits."""
    write = verb in (Verb.RDMA_WRITE, Verb.RDMA_WRITE_WITH_IMMEDIATE)
    immediate = verb in (Verb.RDMA_WRITE_WITH_IMMEDIATE, Verb.SEND_WITH_IMMEDIATE)
    family = "RDMA_WRITE" if write else "SEND"
    position = {(1, 1): "ONLY", (1, 0): "FIRST", (0, 0): "MIDDLE", (0, 1): "LAST"}[first, last]
    suffix = "_WITH_IMMEDIATE" if immediate and last else ""
    return Opcode[f"{family}_{position}{suffix}"]


def _extensions(verb):
    """Whether a packet of ``verb`` carries a RETH as its message's first, and an ImmDt
    as its last."""
    write = (verb == Verb.RDMA_WRITE) | (verb == Verb.RDMA_WRITE_WITH_IMMEDIATE)
    immediate = (verb == Verb.RDMA_WRITE_WITH_IMMEDIATE) | (verb == Verb.SEND_WITH_IMMEDIATE)
    return write, immediate


def _transport_length(verb, first, last, plus=0):
    """Bytes of a packet's BTH and extensions (and ``plus``, an int): constants chosen by
    the verb and the packet's place in its message."""
    write, immediate = _extensions(verb)
    has_reth, has_immdt = write & first, immediate & last
    bth = BTH.length + plus
    return Mux(has_reth, Mux(has_immdt, bth + RETH.length + IMMDT.length, bth + RETH.length),
               Mux(has_immdt, bth + IMMDT.length, bth))


def _next_packet(m, remaining, mtu_bytes, width, name, verb, first=0, last=None):
    """The next packet of a context of ``verb`` with ``remaining`` payload bytes, cut at
    ``mtu_bytes`` (``last``: whether ``remaining <= mtu_bytes``, if worked out
    otherwise)."""
    packet = Signal(_NEXT_PACKET, name=name)
    if last is None:
        last = remaining <= mtu_bytes
    m.d.comb += [
        packet.first.eq(first),
        packet.last.eq(last),
        packet.length.eq(Mux(last, remaining, mtu_bytes)),
        packet.beats.eq((packet.length + width - 1) >> (width - 1).bit_length()),
        packet.frame_length.eq(packet.length + (-packet.length)[:2] + ICRC_BYTES),
        packet.datagram.eq(_transport_length(verb, first, last) + packet.frame_length),
    ]
    if width % 4 == 0:      # padded to a multiple of 4 bytes: compare the payload alone
        m.d.comb += packet.single_beat.eq(packet.length <= width - ICRC_BYTES)
    else:
        m.d.comb += packet.single_beat.eq(packet.frame_length <= width)
    return packet


def _mtu_bytes(m, path_mtu):
    """The payload bytes of a full packet at a path MTU (0 for a value that is none)."""
    result = Signal(range(MAX_PACKET_PAYLOAD + 1))
    with m.Switch(path_mtu):
        for mtu in PathMtu:
            with m.Case(mtu):
                m.d.comb += result.eq(mtu.bytes)
    return result


def _full_packet(m, path_mtu, width, name, verb=None, first=0):
    """A packet of a path MTU's full payload that is not the last of its message (nor the
    first, or the first of a message of ``verb``; all zeros for a value that is none):
    constants chosen by the path MTU (and the verb)."""
    packet = Signal(_NEXT_PACKET, name=name)
    with m.Switch(path_mtu):
        for mtu in PathMtu:
            length = mtu.bytes
            frame_length = length + -length % 4 + ICRC_BYTES
            single_beat = (length <= width - ICRC_BYTES if width % 4 == 0
                           else frame_length <= width)
            with m.Case(mtu):
                m.d.comb += [
                    packet.eq(_NEXT_PACKET.const({
                        "last": 0, "length": length, "beats": -(-length // width),
                        "frame_length": frame_length, "single_beat": single_beat,
                        "first": 0, "datagram": BTH.length + frame_length})),
                ]
                if verb is not None:
                    m.d.comb += [
                        packet.first.eq(first),
                        packet.datagram.eq(_transport_length(verb, first, 0, frame_length)),
                    ]
    return packet


def _message_tail(m, length, path_mtu, verb, width, name):
    """The last packet of a message of ``verb`` and ``length`` bytes at a path MTU (as a
    packet that is not the first)."""
    tail_bytes = Signal(range(MAX_PACKET_PAYLOAD + 1), name=f"{name}_bytes")
    with m.Switch(path_mtu):
        for mtu in PathMtu:
            bits = mtu.bytes.bit_length() - 1
            with m.Case(mtu):
                m.d.comb += tail_bytes.eq(Mux((length[:bits] != 0) | (length[bits:] == 0),
                                              length[:bits], mtu.bytes))
    return _next_packet(m, tail_bytes, tail_bytes, width, name, verb, last=1)


class PacketPlanner(wiring.Component):
    """Cuts messages into packets by their QP's path MTU, sends new messages and
    resends old ones.

    For every packet it hands the segmenter a descriptor: the BTH (opcode by
    position in the message, PSN modulo 2^24, AckReq), the RETH on the first
    packet of an RDMA WRITE, the ImmDt on the last packet of the immediate
    verbs, pad count, the UDP/IPv4 destination (UDP source port: the QP's,
    with its top two bits set, so always in 0xC000–0xFFFF), the payload bytes,
    and where the payload sits in the QP's retransmit ring.

    A QP's ring is mapped to pages of the retransmit pool (:class:`PagePool`) as it
    is written: a new packet that starts a page of the ring or crosses into one takes
    a page (``o_take``), and waits while the pool has none (``pages_available``) or
    the QP would hold more than ``i_config.qp_pages`` (it holds the pages from
    ``pages_released``, of ``new_qp``, to the one it sends into); ``o_page_wait``
    shows each cycle a packet waits so. A message whose first packet starts in a
    page the pool took back from the idle QP takes that page again (``again``),
    with that packet, or alone before it when the packet crosses into the next.
    ``o_active[0]`` and ``[1]`` name the QP the new and the replay context work on
    (loading or sending its message). ``new_qp`` and ``replay_qp`` address the QP
    views of the engine (``new_view``, ``replay_view``) and ``pages_released`` a
    cycle ahead: each is the QP of its context in the next cycle, and what comes back
    is registered.

    Two contexts take turns packet by packet: a *replay* (go-back-N resend of a
    message the reliability engine hands over, from one of its packets up to
    the QP's next new PSN; first) and the *new* message (a work request and its
    QP's path from the table, when the reliability engine has a free message
    slot, the pool a page for each packet that needs one, and the QP is not due
    a resend). A packet requests an ACK when it is the last of its message, when
    its payload starts a page of the ring or crosses into one (so a QP never
    holds all the pages it may without an ACK on its way), and when it ends a
    resend. A resent packet is otherwise the same as its original. A resend stops
    when its QP starts an RNR wait (the engine resends again after it).

    A request for a QP index past ``qps``, longer than 2^31 bytes, or for a QP
    without a valid path MTU yields one ``drop`` descriptor that completes it
    as BAD_REQUEST; one for a QP in ERROR completes as FLUSHED; a message whose
    QP fails while it is sent ends with a ``drop`` descriptor that drains the
    rest of its payload. Two cycles per message load, then a packet per cycle; a packet
    that enters a page of the ring takes a cycle more.
    ``holds`` tells, a cycle later (a register), whether a context loads or is in the
    middle of a message of QP ``holds_qp`` (of the QP index bits the build uses: an
    index past the QPs is taken for the QP it names in those bits); it stays set for a
    cycle after the message's end. While ``i_setting`` (a QP is being set) it takes no
    new request, so that a request that comes after a QP's setting sees it.
    """

    def __init__(self, *, qps, ring_beats, width=BEAT_BYTES):
        if width & (width - 1):
            raise ValueError(f"Beat width must be a power of 2, not {width!r}")
        check_ring_beats(ring_beats, width)
        self._qps = qps
        self._ring_beats = ring_beats
        self._width = width
        vpage_bits = vpage_bits_of(width)
        super().__init__({
            "i_request": In(stream.Signature(WORK_REQUEST)),
            "i_replay": In(stream.Signature(REPLAY)),
            "i_config": In(TRANSMIT_CONFIG),
            "read_qp": Out(QP_INDEX_BITS),
            "read_path": In(QP_PATH),
            "new_qp": Out(QP_INDEX_BITS),
            "new_view": In(QP_VIEW),
            "replay_qp": Out(QP_INDEX_BITS),
            "replay_view": In(QP_VIEW),
            "o_loaded": Out(stream.Signature(MESSAGE_LOADED, always_ready=True)),
            "o_sent": Out(stream.Signature(PACKET_SENT, always_ready=True)),
            "o_packet": Out(stream.Signature(PACKET_DESCRIPTOR)),
            "o_read": Out(stream.Signature(BUFFER_READ)),
            "holds_qp": In(QP_INDEX_BITS),
            "holds": Out(1),
            "i_setting": In(1),
            "pages_released": In(vpage_bits),
            "pages_available": In(1),
            "o_take": Out(stream.Signature(page_take(vpage_bits), always_ready=True)),
            "o_page_wait": Out(1),
            "o_active": Out(stream.Signature(QP_INDEX_BITS, always_ready=True)).array(2),
        })

    def elaborate(self, platform):
        m = Module()
        width = self._width
        ring_bits = (self._ring_beats - 1).bit_length()
        beat_bits = (width - 1).bit_length()
        offset_bits = page_offset_bits(width)
        ring_pages = self._ring_beats >> offset_bits
        vpage_bits = vpage_bits_of(width)

        new = Signal(_CONTEXT)
        new_sending = Signal()                  # the new context has packets to send
        new_refusing = Signal()                 # it completes a request at once
        refusal = Signal(CompletionStatus)
        replay = Signal(_CONTEXT)
        replaying = Signal()
        # Which QP's message each context is in the middle of, while ``new_sending`` and
        # ``replaying`` (for ``holds``): the QP index bits the build uses.
        qp_bits = qp_bits_of(self._qps)
        new_holds = Signal(qp_bits)
        replay_holds = Signal(qp_bits)

        # Each context keeps its next packet worked out ahead (a register, set when the
        # context is loaded or advanced), and the replay whether it has one more packet to
        # send before the QP's next new PSN, so that the choice of this cycle's packet
        # starts from flip-flops. (A QP's next PSN does not change while it is replayed: its
        # new packets wait, and it is not set again.)
        new_view, replay_view = self.new_view, self.replay_view
        new_next = Signal(_NEXT_PACKET)
        replay_next = Signal(_NEXT_PACKET)
        replay_more = Signal()
        replay_psn_next = Signal(24)            # replay.psn + 1
        replay_index_next = Signal(24)          # replay.index + 1
        # During an RNR wait the QP sends nothing (IBTA 9.7.5.2.8): a resend under way
        # ends, the resend after the wait starts again from the RNR NAK's PSN.
        replay_has_packet = replay_more & ~replay_view.error & ~replay_view.rnr_wait
        replay_go = replaying & replay_has_packet
        # Whose turn it is comes from registers alone: the replay's while it has a packet
        # (then the new context waits, also in the cycle the engine's flags stop the
        # replay), so that the flags' read does not choose among the descriptors.
        replay_turn = replaying & replay_more

        # Each context after its next packet. Only a full packet (of the path MTU) has a
        # following one: the message's last when one packet comes after the next, else
        # another full one (both known since the message was loaded).
        def advance(context, packet, name):
            advanced = Signal(_CONTEXT, name=f"{name}_advanced")
            m.d.comb += [
                advanced.eq(context),
                advanced.psn.eq(context.psn + 1),
                advanced.index.eq(context.index + 1),
                advanced.offset.eq(context.offset + packet.beats),
                advanced.after.eq(context.after - 1),
                advanced.following_last.eq(context.after == 2),
            ]
            following = Signal(_NEXT_PACKET, name=f"{name}_following")
            m.d.comb += following.eq(Mux(context.following_last, context.tail,
                                         _full_packet(m, context.message.path_mtu, width,
                                                      f"{name}_full")))
            return advanced, following

        new_advanced, new_following = advance(new, new_next, "new")
        replay_advanced, replay_following = advance(replay, replay_next, "replay")

        # Whether a packet's payload starts a page of the ring or crosses into one (a
        # register per context, set with its next packet): its last beat is in the next
        # page when the offset in the page and the beats add up to more than a page (one
        # carry chain, no add before it).
        def enters_page(offset, beats):
            return ((beats != 0)
                    & ((offset[:offset_bits] == 0)
                       | sum_above(offset[:offset_bits], beats, C(1 << offset_bits))))
        new_enters = Signal()
        replay_enters = Signal()
        resend_end = replay_turn & (replay_psn_next == replay_view.next_psn)

        # The packet of this cycle: the replay's, else the new message's. Each context's
        # descriptor is worked out from its registers alone, and the choice comes last.
        def describe(context, packet, enters, name):
            described = Signal(PACKET_DESCRIPTOR, name=f"{name}_described")
            message = context.message
            request = message.request
            last, first = packet.last, packet.first
            verb = request.verb
            has_reth = _extensions(verb)[0] & first
            opcode = Signal(Opcode, name=f"{name}_opcode")
            with m.Switch(Cat(last, first, verb)):
                for verb_value in Verb:
                    for first_value in (0, 1):
                        for last_value in (0, 1):
                            with m.Case(last_value | first_value << 1 | verb_value.value << 2):
                                m.d.comb += opcode.eq(
                                    _opcode(verb_value, first_value, last_value))
            transport_length = _transport_length(verb, first, last)
            transport = described.meta.transport
            bth = Signal(BTH, name=f"{name}_bth")
            reth = Signal(RETH, name=f"{name}_reth")
            immdt = Signal(IMMDT, name=f"{name}_immdt")
            path = context.path
            m.d.comb += [
                bth.opcode.eq(opcode),
                bth.pad_count.eq((-packet.length)[:2]),
                bth.pkey.eq(PKEY_DEFAULT),
                bth.dest_qp.eq(path.remote_qpn),
                bth.ack_request.eq(last | enters),
                bth.psn.eq(context.psn),
                reth.virtual_address.eq(request.remote_address),
                reth.rkey.eq(path.rkey),
                reth.dma_length.eq(request.length),
                immdt.immediate.eq(request.immediate),
                transport.bth.eq(bth),
                # Extensions packed right behind the BTH (the wire's first byte is the MSB).
                transport.extensions.eq(Mux(has_reth, Cat(immdt, reth),
                                            Cat(C(0, RETH.size), immdt))),
                described.meta.transport_length.eq(transport_length),
                described.meta.dst_ip.eq(path.remote_ip),
                described.meta.src_port.eq(path.src_port | ROCEV2_SOURCE_PORTS),
                described.meta.dst_port.eq(UDP_PORT_ROCEV2),
                described.meta.length.eq(packet.datagram),
                described.meta.tos.eq(self.i_config.tos),
                described.payload_length.eq(packet.length),
                described.frame_length.eq(packet.frame_length),
                described.single_beat.eq(packet.single_beat),
                described.has_payload.eq(packet.length != 0),
                described.message_end.eq(last),
                described.address.eq(Cat(context.offset[:ring_bits], context.qp)),
                described.slot.eq(context.slot),
                described.completion.qp.eq(context.qp),
                described.completion.tag.eq(request.tag),
                described.completion.first_psn.eq(message.first_psn),
                described.completion.packets.eq(message.packets),
            ]
            return described

        # A new packet that enters a page takes one from the pool for the ring's page of
        # its last beat: when the pool has one and the QP holds fewer than it may. (The
        # pages a QP holds are fewer than its ring's, so its ring's pages map one each.)
        qp_pages = Signal(range(ring_pages + 1))
        m.d.sync += qp_pages.eq(Mux((self.i_config.qp_pages == 0)
                                    | (self.i_config.qp_pages > ring_pages), ring_pages,
                                    Mux(self.i_config.qp_pages < MIN_QP_PAGES, MIN_QP_PAGES,
                                        self.i_config.qp_pages)))
        # Whether the new context's next packet enters a page, and the page after the one it
        # enters, are registers set with the packet (``page_ahead``); whether the QP may hold
        # that page too (``held_ok``) is worked out from them a cycle ahead, with
        # ``pages_released`` of that cycle (which only grows while the QP sends a message).
        # In the packet's first cycle that is not known yet (``held_unknown``): a packet
        # that enters a page goes a cycle after the one before it at the soonest.
        new_page_after = Signal(vpage_bits)
        held_ok = Signal()
        held_unknown = Signal()
        m.d.sync += [
            held_ok.eq((new_page_after - self.pages_released)[:vpage_bits] <= qp_pages),
            held_unknown.eq(0),
        ]
        def page_ahead(offset, enters):
            return [
                new_enters.eq(enters),
                new_page_after.eq(offset[offset_bits:] + Mux(offset[:offset_bits] != 0, 2, 1)),
                held_unknown.eq(1),
            ]
        new_again = Signal()                    # the page the message starts in, again first
        page_room = self.pages_available & held_ok & ~held_unknown
        room = Signal()
        # The page taken again goes with a packet that stays in it (not while a QP is set:
        # its setting writes what a page taken again writes), alone before one that does
        # not.
        m.d.comb += room.eq(Mux(new_again, ~new_enters & self.pages_available & ~self.i_setting,
                                ~new_enters | page_room))
        new_turn = ~replay_turn & new_sending
        same_qp = Signal()                      # the contexts' QPs are the same (set with them)
        new_may = new_turn & ~new_view.error & ~new_view.blocked & ~(replaying & same_qp)
        new_go = new_may & room
        new_abort = new_turn & new_view.error
        take_again = new_may & new_again & new_enters & self.pages_available & ~self.i_setting
        m.d.comb += self.o_page_wait.eq(
            new_may & Mux(new_again, ~self.pages_available,
                          new_enters & (~self.pages_available | (~held_unknown & ~held_ok))))
        refuse = ~replay_turn & new_refusing

        descriptor = self.o_packet.p
        m.d.comb += [
            descriptor.eq(Mux(replay_turn, describe(replay, replay_next, replay_enters, "replay"),
                              describe(new, new_next, new_enters, "new"))),
            descriptor.message_end.eq(~replay_turn & new_next.last),
            descriptor.replay.eq(replay_turn),
            descriptor.tracked.eq(~refuse),
            descriptor.completion.status.eq(refusal),
        ]
        with m.If(resend_end):
            m.d.comb += descriptor.meta.transport.bth.ack_request.eq(1)
        with m.If(new_abort | refuse):
            m.d.comb += [
                descriptor.drop.eq(1),
                descriptor.message_end.eq(1),
            ]

        # Hand over the descriptor (and, for a resend with payload, the buffer read).
        needs_read = replay_go & (replay_next.length != 0)
        offered = replay_go | new_go | new_abort | refuse
        m.d.comb += [
            self.o_packet.valid.eq(offered & (self.o_read.ready | ~needs_read)),
            self.o_read.valid.eq(needs_read & self.o_packet.ready),
            self.o_read.p.address.eq(descriptor.address),
            self.o_read.p.beats.eq(replay_next.beats),
        ]
        taken = self.o_packet.valid & self.o_packet.ready
        m.d.comb += [
            self.o_sent.valid.eq(taken & (replay_go | new_go)),
            self.o_sent.p.qp.eq(Mux(replay_turn, replay.qp, new.qp)),
            self.o_sent.p.replay.eq(replay_turn),
            self.o_sent.p.bytes.eq(Mux(replay_turn, replay_next.length, new_next.length)),
            self.o_sent.p.datagram.eq(Mux(replay_turn, replay_next.datagram,
                                          new_next.datagram)),
            self.o_sent.p.next_psn.eq(Mux(replay_turn, replay_advanced.psn, new_advanced.psn)),
            self.o_sent.p.next_tail.eq(Mux(replay_turn, replay_advanced.offset,
                                           new_advanced.offset)),
        ]
        # Each context's step on its own terms (``taken`` and the context's turn, without
        # the other's), so that a replay's step does not wait on the new context's pages.
        replay_taken = replay_go & self.o_packet.ready & (self.o_read.ready | ~needs_read)
        new_taken = ~replay_turn & self.o_packet.ready
        with m.If(replay_taken):
            m.d.sync += [
                replay.eq(replay_advanced),
                replay_next.eq(replay_following),
                replay_enters.eq(enters_page(replay_advanced.offset, replay_following.beats)),
                replay_more.eq((replay_psn_next != replay_view.next_psn)
                               & (replay_index_next < replay.message.packets)),
                replay_psn_next.eq(replay_psn_next + 1),
                replay_index_next.eq(replay_index_next + 1),
            ]
        m.d.comb += [
            self.o_take.valid.eq((new_taken & new_go & (new_enters | new_again)) | take_again),
            self.o_take.p.qp.eq(new.qp),
            self.o_take.p.vpage.eq(Mux(new_again, new.offset[offset_bits:], new_page_after - 1)),
            self.o_take.p.again.eq(new_again),
        ]
        with m.If(take_again | (new_taken & new_go)):
            m.d.sync += new_again.eq(0)
        with m.If(new_taken):
            with m.If(new_go):
                m.d.sync += [new.eq(new_advanced), new_next.eq(new_following),
                             *page_ahead(new_advanced.offset,
                                         enters_page(new_advanced.offset, new_following.beats))]
                with m.If(new_next.last):
                    m.d.sync += new_sending.eq(0)
            with m.If(new_abort):
                m.d.sync += new_sending.eq(0)
            with m.If(refuse):
                m.d.sync += new_refusing.eq(0)
        with m.If(replaying & ~replay_has_packet):
            m.d.sync += replaying.eq(0)

        # Load contexts: a resend when the replay context is free, else a new message.
        # The engine's views of a QP (and the page pool's) come a cycle after their
        # address: each context addresses the QP it works on in the next cycle. While the
        # new context is free, it asks for the next request's QP already (in any state: a
        # resend going first leaves it unused), so its address does not wait on the FSM's
        # choice; the replay context asks for a resend's QP as it takes it.
        m.d.comb += [
            self.replay_qp.eq(replay.qp),
            self.new_qp.eq(Mux(new_sending | new_refusing, new.qp, self.i_request.p.qp)),
        ]
        path_mtu_bytes = _mtu_bytes(m, self.read_path.path_mtu)
        # The first packet of a context as it is loaded (of a refused request: no payload).
        replay_first = Signal(_NEXT_PACKET)
        replay_first_last = Signal()            # the first packet resent is the last
        replay_base = Signal(_NEXT_PACKET)      # as a packet that is not the message's first
        m.d.comb += [
            replay_base.eq(Mux(replay_first_last, replay.tail,
                               _full_packet(m, replay.message.path_mtu, width, "replay_full"))),
            replay_first.eq(replay_base),
            replay_first.first.eq(replay.index == 0),
            replay_first.datagram.eq(Mux(
                replay.index == 0,
                _transport_length(replay.message.request.verb, 1, replay_first_last)
                + replay_base.frame_length,
                replay_base.datagram)),
        ]
        # What loading a new message needs of its request alone is worked out in the cycle
        # before, into registers (the request waits on its stream, unchanged, from IDLE to
        # LOAD_NEW): the request itself (LOAD_NEW takes it from this register, not through
        # the request arbiter's choice), the message as one packet, how many packets it
        # takes at each path MTU and how many come after its first, whether it fits one
        # packet of each (or two), and whether it is out of range.
        request_held = Signal.like(self.i_request.p)
        request_short = Signal(_NEXT_PACKET)
        request_fits = Signal(len(PathMtu))
        request_two = Signal(len(PathMtu))      # ... or two
        request_bad = Signal()
        request_packets = Signal(data.ArrayLayout(24, len(PathMtu)))   # packets at each MTU
        request_after = Signal(data.ArrayLayout(24, len(PathMtu)))     # ... after the first
        length_bits = MAX_PACKET_PAYLOAD.bit_length()
        m.d.sync += [
            request_held.eq(self.i_request.p),
            request_short.eq(_next_packet(m, self.i_request.p.length[:length_bits],
                                          self.i_request.p.length[:length_bits], width,
                                          "request_short", self.i_request.p.verb,
                                          first=1, last=1)),
            request_fits.eq(Cat(self.i_request.p.length <= mtu.bytes for mtu in PathMtu)),
            request_two.eq(Cat((self.i_request.p.length > mtu.bytes)
                               & (self.i_request.p.length <= 2 * mtu.bytes) for mtu in PathMtu)),
            request_bad.eq((self.i_request.p.qp >= self._qps)
                           | (self.i_request.p.length > MAX_MESSAGE_BYTES)),
            *(request_packets[index].eq(
                Mux(self.i_request.p.length == 0, 1,
                    (self.i_request.p.length + mtu.bytes - 1) >> (mtu.bytes.bit_length() - 1)))
              for index, mtu in enumerate(PathMtu)),
            *(request_after[index].eq(
                Mux(self.i_request.p.length == 0, 0,
                    (self.i_request.p.length - 1)[mtu.bytes.bit_length() - 1:]))
              for index, mtu in enumerate(PathMtu)),
        ]
        fits = Signal()                         # the new message fits one packet
        two = Signal()                          # it takes two
        full_first = Signal(_NEXT_PACKET)
        with m.Switch(self.read_path.path_mtu):
            for index, mtu in enumerate(PathMtu):
                with m.Case(mtu):
                    m.d.comb += [fits.eq(request_fits[index]), two.eq(request_two[index])]
        m.d.comb += [
            full_first.eq(_full_packet(m, self.read_path.path_mtu, width, "full_first",
                                       request_held.verb, first=1)),
        ]
        new_first = Mux(fits, request_short, full_first)
        refused = _next_packet(m, 0, 0, width, "refused", new.message.request.verb,
                               first=new.index == 0)
        with m.FSM() as fsm:
            with m.State("IDLE"):
                with m.If(self.i_replay.valid & ~replaying):
                    m.d.comb += [
                        self.read_qp.eq(self.i_replay.p.qp),
                        self.replay_qp.eq(self.i_replay.p.qp),
                        self.i_replay.ready.eq(1),
                    ]
                    command = self.i_replay.p
                    packet_offset = Signal(32)
                    with m.Switch(command.message.path_mtu):
                        for mtu in PathMtu:
                            with m.Case(mtu):
                                m.d.comb += packet_offset.eq(command.packet * mtu.bytes)
                    replay_tail = _message_tail(m, command.message.request.length,
                                                command.message.path_mtu,
                                                command.message.request.verb, width,
                                                "replay_tail")
                    m.d.sync += [
                        replay.qp.eq(command.qp),
                        same_qp.eq(command.qp == new.qp),
                        replay.after.eq(command.message.packets - command.packet - 1),
                        replay.following_last.eq(
                            command.message.packets - command.packet == 2),
                        replay_first_last.eq(command.message.packets - command.packet == 1),
                        replay.tail.eq(replay_tail),
                        replay.slot.eq(command.slot),
                        replay.message.eq(command.message),
                        replay.psn.eq(command.message.first_psn + command.packet),
                        replay.index.eq(command.packet),
                        replay_psn_next.eq(command.message.first_psn + command.packet + 1),
                        replay_index_next.eq(command.packet + 1),
                        replay.offset.eq(command.message.start + (packet_offset >> beat_bits)),
                    ]
                    m.next = "LOAD_REPLAY"
                with m.Elif(self.i_request.valid & ~new_sending & ~new_refusing
                            & ~self.i_setting):
                    m.d.comb += self.read_qp.eq(self.i_request.p.qp)
                    m.next = "LOAD_NEW"

            with m.State("LOAD_REPLAY"):
                m.d.sync += [
                    replay.path.eq(self.read_path),
                    replaying.eq(1),
                    replay_holds.eq(replay.qp[:qp_bits]),
                    replay_next.eq(replay_first),
                    replay_enters.eq(enters_page(replay.offset, replay_first.beats)),
                    replay_more.eq((replay.psn != replay_view.next_psn)
                                   & (replay.index < replay.message.packets)),
                ]
                m.next = "IDLE"

            with m.State("LOAD_NEW"):
                request = request_held
                valid_mtu = path_mtu_bytes != 0
                bad = request_bad | ~valid_mtu
                packets = Signal(24)
                message_after = Signal(24)
                with m.Switch(self.read_path.path_mtu):
                    for index, mtu in enumerate(PathMtu):
                        with m.Case(mtu):
                            m.d.comb += [packets.eq(request_packets[index]),
                                         message_after.eq(request_after[index])]
                loaded = Signal(MESSAGE)
                m.d.comb += [
                    loaded.request.eq(request),
                    loaded.first_psn.eq(new_view.next_psn),
                    loaded.packets.eq(packets),
                    loaded.start.eq(new_view.tail),
                    loaded.path_mtu.eq(self.read_path.path_mtu),
                ]
                # Whether the first packet enters a page: one of the whole message by a
                # sum of its beats and offset, a full one (of the path MTU) by its offset.
                tail_low = new_view.tail[:offset_bits]
                first_enters = Signal()
                with m.Switch(self.read_path.path_mtu):
                    for mtu in PathMtu:
                        full_beats = -(-mtu.bytes // width)
                        with m.Case(mtu):
                            m.d.comb += first_enters.eq(Mux(
                                fits,
                                (request_short.beats != 0)
                                & ((tail_low == 0)
                                   | sum_above(tail_low, request_short.beats,
                                               C(1 << offset_bits))),
                                (tail_low == 0) | (tail_low > (1 << offset_bits) - full_beats)))
                message_tail = _message_tail(m, request.length, self.read_path.path_mtu,
                                             request.verb, width, "message_tail")
                # The new context's registers and the report of the loaded message are set
                # whether the request is loaded or not (they matter only once it is, and the
                # context is free in LOAD_NEW): so the slot count's compare in
                # ``new_view.slot_free`` reaches only the handshakes and ``new_sending``.
                # A refused request sets what it needs over them.
                m.d.comb += [
                    self.o_loaded.p.qp.eq(request.qp),
                    self.o_loaded.p.message.eq(loaded),
                ]
                m.d.sync += [
                    same_qp.eq(request.qp == replay.qp),
                    *page_ahead(new_view.tail, first_enters),
                    new.qp.eq(request.qp),
                    new.slot.eq(new_view.slot),
                    new.message.eq(loaded),
                    new.path.eq(self.read_path),
                    new.psn.eq(new_view.next_psn),
                    new.index.eq(0),
                    new.offset.eq(new_view.tail),
                    new.after.eq(message_after),
                    new.following_last.eq(two),
                    new.tail.eq(message_tail),
                    new_again.eq((new_view.tail[:offset_bits] != 0)
                                 & (self.pages_released
                                    == (new_view.tail[offset_bits:] + 1)[:vpage_bits])),
                    new_next.eq(new_first),
                    new_holds.eq(request.qp[:qp_bits]),
                ]
                with m.If(bad | new_view.error):
                    m.d.comb += self.i_request.ready.eq(1)
                    m.d.sync += [
                        new.message.eq(0),
                        new.message.request.eq(request),
                        new.message.first_psn.eq(Mux(request.qp < self._qps,
                                                     new_view.next_psn, 0)),
                        new_next.eq(refused),
                        new_refusing.eq(1),
                        refusal.eq(Mux(bad, CompletionStatus.BAD_REQUEST,
                                       CompletionStatus.FLUSHED)),
                    ]
                with m.Elif(new_view.slot_free):
                    m.d.comb += [
                        self.i_request.ready.eq(1),
                        self.o_loaded.valid.eq(1),
                    ]
                    m.d.sync += new_sending.eq(1)
                m.next = "IDLE"

        # Which QP each context works on, for the page pool.
        loading_new = fsm.ongoing("LOAD_NEW")
        loading_replay = fsm.ongoing("LOAD_REPLAY")
        m.d.comb += [
            self.o_active[0].valid.eq(loading_new | new_sending | new_refusing),
            self.o_active[0].p.eq(Mux(loading_new, request_held.qp, new.qp)),
            self.o_active[1].valid.eq(loading_replay | replaying),
            self.o_active[1].p.eq(replay.qp),
        ]

        # Whether a context loads or is in the middle of a message of ``holds_qp`` (a QP
        # may be set again only between its messages): a register, so that the setting's
        # decision starts from a flip-flop. It answers for the ``holds_qp`` of the cycle
        # before, and holds a cycle past a message's end.
        asked = self.holds_qp[:qp_bits]
        m.d.sync += self.holds.eq(
            (new_sending & (new_holds == asked)) | (replaying & (replay_holds == asked))
            | (loading_new & (request_held.qp[:qp_bits] == asked))
            | (loading_replay & (replay.qp[:qp_bits] == asked)))
        return m
