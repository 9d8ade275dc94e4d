"""The built-in traffic generator: work requests and payloads of a run, as the
connection manager's start datagram describes it (CM_PROTOCOL, "Start a run"
and "Generator payload")."""

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..arith import sum_is_zero
from ..stream import BEAT_BYTES, NO_META, keep_mask, packet_signature
from .requests import QP_INDEX_BITS, WORK_REQUEST, Verb

__all__ = ["GENERATOR_RUN", "TrafficGenerator"]

#: One run of the generator.
GENERATOR_RUN = data.StructLayout({
    "qp": QP_INDEX_BITS,
    "verb": Verb,
    "length": 32,               # bytes per message, 0 allowed
    "count": 32,                # messages in the run
    "divider": 32,              # cycles between message starts; 0: as fast as possible
    "base": 64,                 # remote address of message 0
    "ring": 64,                 # ring size in bytes; 0: no ring
    "credited": 1,              # message k waits for the host to have consumed k - slots
})


class TrafficGenerator(wiring.Component):
    """Issues the messages of a run: for each, one work request and one payload packet.

    A run is taken from ``i_start`` only while idle (``i_start.ready`` is
    ``~o_running``). Message ``k`` (0 … ``count`` − 1) is a work request with
    the run's verb and QP, ``tag`` = ``k`` mod 2^16, ``immediate`` = ``k``, the
    run's length, and ``remote_address`` = ``base`` + ``k`` × ``length``; with a
    ring, ``base`` + (``k`` mod ``slots``) × ``length`` where ``slots`` =
    ``ring`` // ``length`` (a running offset that returns to 0 when the next
    message would cross the ring's end, so no multiplier or divider; a ring
    shorter than one message, or a length of 0, keeps every message at
    ``base``).

    The payload of message ``k`` is ``length`` bytes of little-endian 64-bit
    words, word ``j`` = ``(k << 32) | j``, the last word cut to the length;
    lane 0 is the first byte. A length of 0 is one beat with ``keep`` zero.

    Timing. The first request is offered the cycle after the start is taken.
    A message starts the cycle its request is first offered; starts are at
    least ``divider`` cycles apart (and at most one per cycle). A message's
    payload is never offered before its request (at the soonest in the same
    cycle); the two streams are independent handshakes in message order, and
    a consumer takes the request and then the payload. Payload beats leave
    one per cycle while the sink is ready, with no idle cycle between
    messages once the next request has been offered (always, with
    ``divider`` 0 and a ready request sink).
    A credited run (CM_PROTOCOL, "Credit for WRITE rings") sends message ``k``
    only once the host has reported message ``k`` − ``slots`` consumed:
    ``i_credit`` carries the host's count of messages consumed since the start
    (mod 2^32); a count at or below the one already taken changes nothing. The
    generator learns ``slots`` where the ring first wraps (the first pass fills
    free slots), and from then on keeps the free slots in a counter that a
    request taken lowers and a credit raises; a credit acts two cycles after it
    is offered. With no free slot no request is offered, so a valid request is
    never withdrawn.

    ``i_stop`` ends the run early: no request is offered after the one offered
    in that cycle (if any), whose payload is still sent.
    ``o_running`` is low again, and a new start can be taken, from the
    second cycle after the last payload beat is taken (with ``count`` 0,
    after the start); ``o_messages`` counts the requests taken in the current
    or last run.

    ``width`` must be a multiple of 8 bytes (whole 64-bit words per beat).
    """

    def __init__(self, *, width=BEAT_BYTES):
        if not isinstance(width, int) or width < 8 or width % 8:
            raise ValueError(f"Beat width must be a positive multiple of 8 bytes, not {width!r}")
        self._width = width
        super().__init__({
            "i_start": In(stream.Signature(GENERATOR_RUN)),
            "o_request": Out(stream.Signature(WORK_REQUEST)),
            "o_payload": Out(packet_signature(NO_META, width=width)),
            "i_credit": In(stream.Signature(32, always_ready=True)),
            "i_stop": In(1),
            "o_running": Out(1),
            "o_messages": Out(32),
        })

    @property
    def width(self):
        return self._width

    def elaborate(self, platform):
        m = Module()
        width = self._width
        words = width // 8

        run = Signal(GENERATOR_RUN)
        running = self.o_running
        issued = self.o_messages            # requests taken: the next request is message `issued`

        # What the counts and the gap become this cycle. The comparisons the handshakes
        # depend on are kept in registers (``more``, ``gap_zero``, ``behind``, ``level``),
        # worked out from the registers alone (with ``issued + 1`` and ``sent + 1`` kept
        # too), so that the valids come from flip-flops and no sum feeds a comparison.
        issued_next = Signal(32)
        count_next = Signal(32)
        gap_next = Signal(32)
        sent_next = Signal(32)

        # Request side.
        gap = Signal(32)                    # cycles before the next message may start
        offered = Signal()                  # the request was offered and not taken last cycle
        address = Signal(64)                # base + offset of message `issued`
        limit = Signal(66)                  # offset + 2 × length: the end of the next slot
        more = Signal()                     # issued != run.count
        gap_zero = Signal(init=1)           # gap == 0
        request = self.o_request
        blocked = Signal()                  # a credited run has no free slot for the next

        m.d.comb += [
            issued_next.eq(issued),
            count_next.eq(run.count),
            gap_next.eq(gap),
            request.valid.eq(running & more & (gap_zero | offered) & ~blocked),
            request.p.verb.eq(run.verb),
            request.p.qp.eq(run.qp),
            request.p.tag.eq(issued[:16]),
            request.p.remote_address.eq(address),
            request.p.length.eq(run.length),
            request.p.immediate.eq(issued),
        ]
        taken = request.valid & request.ready
        m.d.sync += offered.eq(request.valid & ~request.ready)
        with m.If(request.valid & ~offered):
            m.d.comb += gap_next.eq(Mux(run.divider == 0, 0, run.divider - 1))
        with m.Elif(~gap_zero):
            m.d.comb += gap_next.eq(gap - 1)

        past_end = Signal()                 # the next slot would cross the ring's end
        m.d.comb += past_end.eq((run.ring != 0) & (limit > run.ring))
        with m.If(taken):
            m.d.comb += issued_next.eq(issued + 1)
            with m.If(~past_end):
                m.d.sync += [
                    address.eq(address + run.length),
                    limit.eq(limit + run.length),
                ]
            with m.Else():
                m.d.sync += [
                    address.eq(run.base),
                    limit.eq(run.length << 1),
                ]

        # Payload side: message `sent`, from the 64-bit word `word` with `remaining` bytes left.
        sent = Signal(32)
        word = Signal(32)
        remaining = Signal(32)
        behind = Signal()                   # sent < issued
        level = Signal(init=1)              # sent == issued
        payload = self.o_payload
        last = Signal(init=1)               # remaining <= width
        m.d.comb += [
            sent_next.eq(sent),
            payload.valid.eq(running & (behind | (level & request.valid))),
            payload.p.data.eq(Cat(Cat((word + index)[:32], sent) for index in range(words))),
            payload.p.keep.eq(Mux(last, keep_mask(remaining[:width.bit_length()], width),
                                  (1 << width) - 1)),
            payload.p.last.eq(last),
        ]
        with m.If(payload.valid & payload.ready):
            with m.If(last):
                m.d.comb += sent_next.eq(sent + 1)
                m.d.sync += [
                    word.eq(0),
                    remaining.eq(run.length),
                    last.eq(run.length <= width),
                ]
            with m.Else():
                m.d.sync += [
                    word.eq(word + words),
                    remaining.eq(remaining - width),
                    last.eq(remaining <= 2 * width),
                ]

        with m.If(self.i_stop & running & more):
            m.d.comb += count_next.eq(issued + request.valid)

        # Credit: the count offered → (its advance over ``consumed``, in registers) → the
        # free slots and ``blocked``. The free slots after this cycle, with and without a
        # request taken, and whether each is zero, come from registers alone; the handshake
        # only picks among them, so that it does not feed the add and the compare.
        consumed = Signal(32)               # messages the host reported consumed
        advance = Signal(32)                # what the last credit added, not yet in ``free``
        advance_less = Signal(32)           # ``advance`` − 1
        credited = Signal()                 # ``advance`` is to be added this cycle
        wrapped = Signal()                  # the first pass through the ring has ended
        free = Signal(32)                   # free slots (consumed + slots − issued) once wrapped
        free_next = Signal(32)
        offered_credit = self.i_credit
        ahead = Signal(32)
        m.d.comb += ahead.eq(offered_credit.p - consumed)
        m.d.sync += credited.eq(0)
        with m.If(offered_credit.valid & running & (ahead != 0) & ~ahead[31]):
            m.d.sync += [consumed.eq(offered_credit.p), advance.eq(ahead),
                         # p − consumed − 1 = p + ~consumed: one carry chain.
                         advance_less.eq(offered_credit.p + ~consumed), credited.eq(1)]
        kept = Signal(32)                   # free slots if no request is taken
        spent = Signal(32)                  # free slots if one is
        first_wrap = past_end & ~wrapped    # a request taken now ends the first pass
        # Each an add of its own (not ``kept`` − 1), so that no path into ``blocked`` runs
        # through two carry chains before its compare.
        m.d.comb += [
            kept.eq(free + Mux(credited, advance, 0)),
            spent.eq(free + Mux(credited, advance_less, C(-1, 32))),
        ]
        # Whether each is zero, beside its add rather than after it (``sum_is_zero``).
        kept_zero = Mux(credited, sum_is_zero(free, advance), free == 0)
        spent_zero = Mux(credited, sum_is_zero(free, advance_less), free == 1)
        # (with a request taken at the end of the first pass: consumed + slots − issued,
        # with issued = slots after this request)
        free_taken = Mux(first_wrap, consumed, spent)
        blocked_taken = (run.credited & (wrapped | past_end)
                         & Mux(first_wrap, consumed == 0, spent_zero))
        blocked_kept = run.credited & wrapped & kept_zero
        m.d.comb += free_next.eq(Mux(taken, free_taken, kept))
        m.d.sync += [
            free.eq(free_next),
            wrapped.eq(wrapped | (taken & past_end)),
            blocked.eq(Mux(taken, blocked_taken, blocked_kept)),
        ]

        # Run control.
        m.d.comb += self.i_start.ready.eq(~running)
        with m.If(self.i_start.valid & self.i_start.ready):
            m.d.comb += [
                issued_next.eq(0),
                count_next.eq(self.i_start.p.count),
                gap_next.eq(0),
                sent_next.eq(0),
            ]
            m.d.sync += [
                run.eq(self.i_start.p),
                running.eq(1),
                consumed.eq(0),
                wrapped.eq(0),
                blocked.eq(0),
                address.eq(self.i_start.p.base),
                limit.eq(self.i_start.p.length << 1),
                word.eq(0),
                remaining.eq(self.i_start.p.length),
                last.eq(self.i_start.p.length <= width),
            ]
        with m.Elif(running & ~more & (sent == run.count)):
            m.d.sync += running.eq(0)
        issued_plus_one = Signal(32, init=1)
        sent_plus_one = Signal(32, init=1)
        done = payload.valid & payload.ready & last
        m.d.sync += [
            issued.eq(issued_next),
            run.count.eq(count_next),
            gap.eq(gap_next),
            sent.eq(sent_next),
        ]
        # (``issued + 1`` and ``sent + 1`` count on their own, not from the next counts:
        # the handshakes that pick those do not feed a carry chain)
        with m.If(self.i_start.valid & self.i_start.ready):
            m.d.sync += [
                more.eq(self.i_start.p.count != 0),
                gap_zero.eq(1),
                behind.eq(0),
                level.eq(1),
                issued_plus_one.eq(1),
                sent_plus_one.eq(1),
            ]
        with m.Else():
            with m.If(taken):
                m.d.sync += issued_plus_one.eq(issued_plus_one + 1)
            with m.If(done):
                m.d.sync += sent_plus_one.eq(sent_plus_one + 1)
            with m.If(self.i_stop & running & more):
                m.d.sync += more.eq(request.valid & ~request.ready)
            with m.Elif(taken):
                m.d.sync += more.eq(issued_plus_one != run.count)
            with m.If(request.valid & ~offered):
                m.d.sync += gap_zero.eq(run.divider <= 1)
            with m.Elif(~gap_zero):
                m.d.sync += gap_zero.eq(gap == 1)
            with m.If(taken & ~done):
                m.d.sync += [
                    behind.eq(sent < issued_plus_one),
                    level.eq(sent == issued_plus_one),
                ]
            with m.Elif(done & ~taken):
                m.d.sync += [
                    behind.eq(sent_plus_one < issued),
                    level.eq(sent_plus_one == issued),
                ]

        return m
