"""The requester's acknowledgement intake: every acknowledgement checked at once,
and per QP only the newest ACK and the newest NAK kept for the reliability engine."""

from amaranth import *
from amaranth.lib import data, fifo, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from ..stream import registered
from .ack import ACK_EVENT, AETH_ACK, AETH_NAK, AETH_RESERVED, AETH_RNR_NAK, NAK_SEQUENCE
from .flag_memory import FlagMemory, write_flags
from .qp_context import qp_bits_of
from .requests import QP_INDEX_BITS, check_qp_count

__all__ = ["AckIntake", "ACK_WINDOW", "ACK_TAKEN", "ACK_VERDICT"]

#: What the intake checks an acknowledgement against: its QP's oldest unacknowledged
#: and next PSN, peer address and whether it is in ERROR (the engine's, read through
#: registered ports at ``window_qp``: a cycle later, with the writes of that cycle).
ACK_WINDOW = data.StructLayout({"una": 24, "nxt": 24, "remote_ip": 32, "error": 1})

#: An acknowledgement for the engine to act on: its QP, PSN and AETH syndrome.
ACK_TAKEN = data.StructLayout({"qp": QP_INDEX_BITS, "psn": 24, "syndrome": 8})

#: What became of each acknowledgement: taken (it acknowledges packets not acknowledged
#: before, or is a NAK for the oldest unacknowledged packet) or dropped (a duplicate, a
#: ghost, from a stranger, for a QP in ERROR); and its AETH syndrome.
ACK_VERDICT = data.StructLayout({"qp": QP_INDEX_BITS, "taken": 1, "syndrome": 8})

#: A QP's NAK slot: the PSN and the AETH syndrome (its ACK slot is a PSN).
_NAK_SLOT = data.StructLayout({"psn": 24, "syndrome": 8})


def _nak_rank(syndrome):
    """How much a NAK says, for two NAKs of one PSN: a sequence error 0, an RNR NAK 1
    (the packet arrived, the responder had no receive for it), an error NAK 2."""
    kind = syndrome[5:7]
    return Mux(kind == AETH_RNR_NAK, 1, Mux(syndrome[:5] == NAK_SEQUENCE, 0, 2))


class AckIntake(wiring.Component):
    """Takes one acknowledgement (``i``) every cycle, at any rate, and keeps per QP what
    the engine needs of them, so that none is ever lost.

    Acknowledgements are cumulative (IBTA 9.7.5.1, coalesced ACKs): an ACK for
    PSN p acknowledges every packet up to p, a NAK or RNR NAK for p every packet
    before p. Per QP the intake keeps ``furthest``, the last PSN the QP's
    acknowledgements so far acknowledge (``una - 1`` once the engine has acted
    on them). An acknowledgement is taken when it is from the QP's peer, its QP
    is not in ERROR, its syndrome is not reserved, and its PSN lies inside the
    window of packets outstanding (the engine's ``window``, read as
    ``window_qp``) and beyond ``furthest`` (a NAK: at ``furthest + 1`` or
    beyond); else it is dropped (a duplicate, a ghost, a stranger's). So the
    verdicts are those the engine would give acting on every acknowledgement
    in turn. The acknowledgement passes a register first; its QP's window is read as it
    comes in (``window_qp`` → ``window``, a cycle later: registered ports that show the
    writes of the cycle of the address), so the check starts from registers and the
    reads. Of those taken, the intake keeps per QP an ACK slot (up to
    ``furthest``) and apart a NAK slot (NAK sequence error, RNR NAK or error
    NAK; the newest, but of two for one PSN the error NAK over the RNR NAK
    over the sequence error, and an error NAK for good: the QP fails on it). An
    acknowledgement taken and not kept repeats what is kept. Every
    acknowledgement gets a verdict (``o_verdict``, with its syndrome, 3 cycles
    after ``i``); there is no queue, so none is lost, whatever the rate. An
    acknowledgement counts against the packets sent up to the cycle before it.

    ``o`` offers the engine one slot of one QP at a time, the NAK before the ACK
    of a QP; an acknowledgement is offered from 7 cycles after ``i`` on. The QPs
    wait their turn in two queues (block RAM): those whose slot filled (in that
    order, a cycle later), and those taken with a slot still filled (the ACK behind a NAK taken,
    or one that came as it was taken: it goes back a cycle after it left), the
    two queues in turn. A QP is in a queue once at most, so neither overflows;
    no choice is made among all QPs.
    The QP offered is a register, loaded from a queue the cycle after the one
    before it left (an offer every second cycle at most). Taking an offer
    (``o.ready``) empties the slot, unless a newer acknowledgement fills it in
    the same cycle. ``i_clear`` empties the slots of a QP being set again, and
    drops its acknowledgements in flight; a QP whose slots it emptied is passed
    over (two cycles) when its turn comes.

    The per-QP state is in memories: ``furthest`` and the NAK slot, and 1-bit
    flags in a :class:`FlagMemory`; every read of them is registered, addressed a
    cycle ahead.
    """

    def __init__(self, *, qps):
        self._qps = check_qp_count(qps)
        super().__init__({
            "i": In(stream.Signature(ACK_EVENT, always_ready=True)),
            "window_qp": Out(QP_INDEX_BITS),
            "window": In(ACK_WINDOW),
            "i_clear": In(stream.Signature(QP_INDEX_BITS, always_ready=True)),
            "o": Out(stream.Signature(ACK_TAKEN)),
            "o_verdict": Out(stream.Signature(ACK_VERDICT, always_ready=True)),
        })

    @staticmethod
    def qp_state_bits():
        """Bits the intake keeps per QP: the slots, and their flags."""
        return {"furthest": 24, "nak": _NAK_SLOT.size, "flags": 4}

    def elaborate(self, platform):
        m = Module()
        qp_bits = qp_bits_of(self._qps)
        entries = 1 << qp_bits
        clear = self.i_clear

        def cleared(qp):
            return clear.valid & (clear.p[:qp_bits] == qp[:qp_bits])

        # Stage 0: the acknowledgement registered, its QP's window read as it comes in.
        incoming = registered(m, self.i, "incoming")
        acknowledgement = incoming.p
        m.d.comb += self.window_qp.eq(self.i.p.qp)

        # Stage 1: the window check's operands, from the QP's state as the engine has it.
        event = Signal(ACK_TAKEN)
        checked = Signal()
        stale = Signal()            # its QP is being set again: checked against the old one
        ahead = Signal(24)
        window = Signal(24)
        usable = Signal()
        state = self.window
        m.d.sync += [
            checked.eq(incoming.valid),
            stale.eq(cleared(acknowledgement.qp)),
            event.qp.eq(acknowledgement.qp),
            event.psn.eq(acknowledgement.psn),
            event.syndrome.eq(acknowledgement.syndrome),
            ahead.eq(acknowledgement.psn - state.una),
            window.eq(state.nxt - state.una),
            usable.eq((acknowledgement.src_ip == state.remote_ip) & ~state.error
                      & (acknowledgement.syndrome[5:7] != AETH_RESERVED)),
        ]

        # The QPs' flags (block or distributed RAM, :class:`FlagMemory`): ``known``,
        # ``furthest`` holds since the QP was set; ``has_ack`` (``has_nak``), an ACK up to
        # ``furthest`` (a NAK) waits for the engine; ``queued``, the QP is in a queue of
        # the offer. Writers, the later winning: stage 2 (``taken``), the offer
        # (``take``), stage 3 (``kept``), ``i_clear``.
        m.submodules.flags = flags = FlagMemory(
            flags=("known", "has_ack", "has_nak", "queued"), depth=entries,
            addr_bits=QP_INDEX_BITS,
            writers=(("taken", ("known",)), ("take", ("has_ack", "has_nak", "queued")),
                     ("kept", ("has_ack", "has_nak", "queued")),
                     ("clear", ("known", "has_ack", "has_nak"))),
            reads=("transparent",) * 3)
        event_flags, kept_flags, head_flags = (port.data for port in flags.r)

        # Stage 2: against what the QP's acknowledgements said so far: ``furthest``, the
        # last PSN they acknowledge (an ACK for p: p; a NAK for p: p - 1), as ``una - 1``
        # will be once the engine has acted on them. An acknowledgement inside the window
        # and beyond it is taken (any NAK for p there, also one repeating the news).
        m.submodules.furthest = furthest = memory.Memory(shape=24, depth=entries, init=[])
        m.submodules.naks = naks = memory.Memory(shape=_NAK_SLOT, depth=entries, init=[])
        furthest_write = furthest.write_port()
        nak_write = naks.write_port()
        # Each stage reads its QP's slots and flags a cycle ahead, as the stage before holds
        # it (registered reads that show the writes of that cycle).
        furthest_read = furthest.read_port(transparent_for=(furthest_write,))
        nak_slot = naks.read_port(transparent_for=(nak_write,))
        m.d.comb += [furthest_read.addr.eq(acknowledgement.qp),
                     flags.r[0].addr.eq(acknowledgement.qp)]

        is_nak = event.syndrome[5:7] != AETH_ACK
        # Beyond ``furthest``: not equal to it, and less than half the PSN space on (the
        # equality straight from the PSNs, beside the subtraction, not after it). Both lie
        # in the window of outstanding PSNs, far less than that wide.
        beyond = ~(event.psn == furthest_read.data) & ~(event.psn - furthest_read.data)[23]
        taken = Signal()
        m.d.comb += taken.eq(checked & usable & ~stale & (ahead < window)
                             & (~event_flags.known | beyond) & ~cleared(event.qp))
        m.d.comb += [
            furthest_write.addr.eq(event.qp),
            furthest_write.data.eq(event.psn - is_nak),
            furthest_write.en.eq(taken),
            *write_flags(flags.w_taken, event.qp, taken, 1),
        ]
        kept = Signal(ACK_TAKEN)        # stage 3: an acknowledgement taken, to keep
        kept_ack = Signal()
        kept_nak = Signal()
        m.d.sync += [
            self.o_verdict.valid.eq(checked),
            self.o_verdict.p.qp.eq(event.qp),
            self.o_verdict.p.taken.eq(taken),
            self.o_verdict.p.syndrome.eq(event.syndrome),
            kept.eq(event),
            kept_ack.eq(taken & ~is_nak),
            kept_nak.eq(taken & is_nak),
        ]

        # Stage 3: into the slots. A NAK taken is kept unless the one kept is for the same
        # PSN and says as much (a NAK taken is never behind the one kept), or is an error
        # NAK. A QP whose slot fills goes into the queue ``arrived`` unless it is queued: a
        # cycle later, from a register (``queued`` set now), so that the compares of the
        # kept acknowledgement and a clear do not reach the queue's count in the same cycle.
        m.d.comb += [nak_slot.addr.eq(event.qp), flags.r[1].addr.eq(event.qp)]
        nak_fatal = ((nak_slot.data.syndrome[5:7] == AETH_NAK)
                     & (nak_slot.data.syndrome[:5] != NAK_SEQUENCE))
        nak_says_more = _nak_rank(kept.syndrome) > _nak_rank(nak_slot.data.syndrome)
        nak_news = ~kept_flags.has_nak | (
            ~nak_fatal & ((kept.psn != nak_slot.data.psn) | nak_says_more))
        sets_nak = kept_nak & nak_news & ~cleared(kept.qp)
        sets_ack = kept_ack & ~cleared(kept.qp)
        m.submodules.arrived = arrived = fifo.SyncFIFOBuffered(width=qp_bits, depth=entries)
        m.submodules.returned = returned = fifo.SyncFIFOBuffered(width=qp_bits, depth=entries)
        m.d.comb += [
            nak_write.addr.eq(kept.qp),
            nak_write.data.psn.eq(kept.psn),
            nak_write.data.syndrome.eq(kept.syndrome),
            nak_write.en.eq(sets_nak),
            flags.w_kept.addr.eq(kept.qp),
            flags.w_kept.has_ack.en.eq(sets_ack),
            flags.w_kept.has_ack.value.eq(1),
            flags.w_kept.has_nak.en.eq(sets_nak),
            flags.w_kept.has_nak.value.eq(1),
            flags.w_kept.queued.en.eq((sets_ack | sets_nak) & ~kept_flags.queued),
            flags.w_kept.queued.value.eq(1),
        ]
        arriving = Signal()
        arriving_qp = Signal(qp_bits)
        m.d.sync += [arriving.eq(flags.w_kept.queued.en), arriving_qp.eq(kept.qp)]
        m.d.comb += [arrived.w_data.eq(arriving_qp), arrived.w_en.eq(arriving)]

        # The offer: a QP from the head of ``arrived`` or of ``returned`` (QPs taken with a
        # slot still filled), the two in turn, into a register (``head``) once the one
        # offered before has left; each QP is queued once at most (so neither queue
        # overflows), and one whose slots a clear emptied is passed over. Its slots and
        # flags are read every cycle, addressed by the QP the register holds next.
        head = Signal(qp_bits)
        head_valid = Signal()
        head_next = Signal(qp_bits)
        from_returned = Signal()
        last_returned = Signal()        # the last QP loaded came from ``returned``
        load = Signal()
        m.d.comb += [
            from_returned.eq(returned.r_rdy & ~(arrived.r_rdy & last_returned)),
            load.eq(~head_valid & (arrived.r_rdy | returned.r_rdy)),
            head_next.eq(Mux(load, Mux(from_returned, returned.r_data, arrived.r_data), head)),
            arrived.r_en.eq(load & ~from_returned),
            returned.r_en.eq(load & from_returned),
            flags.r[2].addr.eq(head_next),
        ]
        m.d.sync += head.eq(head_next)
        with m.If(load):
            m.d.sync += [head_valid.eq(1), last_returned.eq(from_returned)]
        head_nak = head_flags.has_nak
        offered_furthest = furthest.read_port(transparent_for=(furthest_write,))
        offered_nak = naks.read_port(transparent_for=(nak_write,))
        m.d.comb += [
            offered_furthest.addr.eq(head_next),
            offered_nak.addr.eq(head_next),
            self.o.valid.eq(head_valid & (head_flags.has_ack | head_flags.has_nak)),
            self.o.p.qp.eq(head),
            self.o.p.psn.eq(Mux(head_nak, offered_nak.data.psn, offered_furthest.data)),
            self.o.p.syndrome.eq(Mux(head_nak, offered_nak.data.syndrome, 0)),
        ]
        take = self.o.valid & self.o.ready
        passed = head_valid & ~self.o.valid         # its slots emptied by a clear
        leaves = take | passed
        # Still a slot filled after this cycle: the ACK behind a NAK taken, or one kept now.
        again = ((take & head_nak & head_flags.has_ack)
                 | ((sets_ack | sets_nak) & (kept.qp[:qp_bits] == head)))
        # A QP that leaves with a slot still filled goes back into ``returned`` a cycle
        # later, from a register, so that the handler's ``ready`` and the compares of a
        # kept acknowledgement do not reach the queue's count in the same cycle; it stays
        # ``queued`` meanwhile.
        returning = Signal()
        returning_qp = Signal(qp_bits)
        m.d.sync += [returning.eq(leaves & again), returning_qp.eq(head)]
        m.d.comb += [
            returned.w_data.eq(returning_qp),
            returned.w_en.eq(returning),
            flags.w_take.addr.eq(head),
            flags.w_take.has_ack.en.eq(take & ~head_nak),
            flags.w_take.has_ack.value.eq(0),
            flags.w_take.has_nak.en.eq(take & head_nak),
            flags.w_take.has_nak.value.eq(0),
            flags.w_take.queued.en.eq(leaves & ~again),
            flags.w_take.queued.value.eq(0),
            *write_flags(flags.w_clear, clear.p, clear.valid, 0),
        ]
        with m.If(leaves):
            m.d.sync += head_valid.eq(0)
        return m
