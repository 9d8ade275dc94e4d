"""The retransmit buffer's pages: one pool that every QP takes pages from as it sends and
gives them back to as acknowledgements free them, and each QP's page table."""

from amaranth import *
from amaranth.lib import data, fifo, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from ..arith import sum_is_zero
from ..stream import BEAT_BYTES
from .descriptor import MAX_PACKET_PAYLOAD, POINTER_BITS
from .qp_context import qp_bits_of
from .requests import QP_INDEX_BITS

__all__ = ["PagePool", "PAGE_BYTES", "PAGE_STATE", "MIN_QP_PAGES", "ACTIVE_CYCLES",
           "page_beats", "page_offset_bits", "vpage_bits_of", "check_ring_beats",
           "check_retransmit_pages", "page_take", "translation"]

#: Bytes of a page: a packet's payload at the largest path MTU, so that a packet takes at
#: most one page more than its QP holds.
PAGE_BYTES = MAX_PACKET_PAYLOAD

#: The fewest pages a QP may hold: the page its next packet starts in and the next one.
MIN_QP_PAGES = 2

#: Cycles a QP stays out of reach of the giving back of the page it sends into after a
#: context of the planner worked on it: its last packet's writes reach the engine's
#: state in fewer.
ACTIVE_CYCLES = 8

#: The ``i_active`` ports of a resend: the planner's replay context, and a resend the
#: engine offers it.
RESENDS = (1, 2)

#: What the pool needs to know of a QP from the reliability engine to give its pages
#: back: the ring positions of its oldest unacknowledged payload and of its next one,
#: and whether it has no message outstanding.
PAGE_STATE = data.StructLayout({"head": POINTER_BITS, "tail": POINTER_BITS, "idle": 1})


def page_beats(width=BEAT_BYTES):
    """Beats of ``width`` bytes in a page."""
    return PAGE_BYTES // width


def page_offset_bits(width=BEAT_BYTES):
    """Bits of a beat's offset in its page: the low bits of a ring position."""
    return (page_beats(width) - 1).bit_length()


def vpage_bits_of(width=BEAT_BYTES):
    """Bits of a page of a QP's ring positions: the high bits of a ring position."""
    return POINTER_BITS - page_offset_bits(width)


def check_ring_beats(ring_beats, width=BEAT_BYTES):
    """``ring_beats`` when it is a retransmit ring (beats of ``width`` bytes per QP: the
    most of the retransmit pool a QP may hold) the transmitter can be built for, else
    ``ValueError``: a power of 2 that the ring pointers address, of
    :data:`MIN_QP_PAGES` pages or more."""
    low, high = MIN_QP_PAGES * page_beats(width), 1 << POINTER_BITS - 2
    if (not isinstance(ring_beats, int) or not low <= ring_beats <= high
            or ring_beats & (ring_beats - 1)):
        raise ValueError(f"Ring beats must be a power of 2, {low}..{high} (a ring of "
                         f"{width}-byte beats holds {MIN_QP_PAGES} pages of {PAGE_BYTES} "
                         f"bytes), not {ring_beats!r}")
    return ring_beats


def check_retransmit_pages(pages, ring_beats=None, width=BEAT_BYTES):
    """``pages`` when it is a pool size (pages of :data:`PAGE_BYTES`) the transmitter can be
    built with, else ``ValueError``: a power of 2, enough for one QP of ``ring_beats``
    beats to fill its ring."""
    if not isinstance(pages, int) or not 2 <= pages <= 1 << 16 or pages & (pages - 1):
        raise ValueError(f"Retransmit pages must be a power of 2, 2..{1 << 16}, "
                         f"not {pages!r}")
    if ring_beats is not None and pages < ring_beats // page_beats(width):
        raise ValueError(f"{pages} retransmit pages are too few for rings of "
                         f"{ring_beats * width // 1024} KiB: one QP must be able to fill "
                         f"its ring; give at least {ring_beats // page_beats(width)}")
    return pages


def page_take(vpage_bits):
    """A page taken for a QP: the page of its ring (``vpage``, counted from the ring's
    start, modulo 2^``vpage_bits``) that the pool's next free page maps; ``again``: the
    page its next packet starts in, which the pool took back while the QP was idle."""
    return data.StructLayout({"qp": QP_INDEX_BITS, "vpage": vpage_bits, "again": 1})


def translation(addr_bits, page_bits):
    """A read port of the page tables as its reader sees it: ``data`` is the page at
    ``addr`` (QP index above the ring's page) of a cycle with ``en``, a cycle later."""
    return wiring.Signature({"addr": Out(addr_bits), "en": Out(1), "data": In(page_bits)})


class PagePool(wiring.Component):
    """Hands out the ``pages`` pages of the retransmit buffer, one a cycle, and takes
    them back behind each QP's acknowledgements.

    Each QP writes its payload to a ring of ``ring_beats`` beats (its positions run on
    past the ring, which wraps); the pool maps the ring's pages it writes to pages of the
    buffer. ``i_take`` maps the page of a QP's ring that its next packet enters to the
    next free page (``o_available``: one is free); the planner takes a page for each
    packet that starts a page or crosses into one, so a QP holds the pages from its
    ``released`` one (``view_released`` of ``view_qp``, a cycle later: a registered read
    that shows the writes and the take of the cycle of ``view_qp``) up to the one its
    next packet starts in. A take goes in a cycle after it, from a register: the page
    tables have it for a read addressed two cycles after the take (the buffer's
    writes of a packet come later still), and ``o_available`` counts the page it
    gets. ``translate[n]`` reads a page table (registered, with an enable: the
    buffer's read and write sides).

    The pool gives a QP's pages back behind the older of its two positions, read from
    the engine through ``state_qp`` → ``state`` (a cycle later): every page before the
    one the position is in. It looks at the QPs of ``i_hint`` (the engine moved their
    oldest position; a hint that finds the queue full is dropped) and, in turn with
    them, at every QP in order, so that a dropped hint only makes a page come back
    later. It also takes back the page a QP sends into once the QP has no message
    outstanding and neither context of the planner has worked on it for
    :data:`ACTIVE_CYCLES` cycles (``i_active``: the new and the replay context's QP,
    and the QP of a resend the engine offers the planner), so that idle QPs hold no
    page; the planner takes that page again (``again``) before the QP's next packet.
    No page of a QP is given back while it is resent (and for :data:`ACTIVE_CYCLES`
    cycles after), so that a resend's packets that an acknowledgement overtakes still
    read the QP's own payload. A page taken in a cycle is written by packets planned
    after it, and a page given back was last written or read by packets planned
    before: the packets pass the buffer in the order they were planned, so a page is
    never written by two QPs out of order. Pages come back in about 2 cycles each.

    ``reset_qp`` names a QP that waits to be set again; ``o_reset_clear`` says it holds
    no page (the pool looks at it first, from the cycle after it is named on), and
    ``i_rebase`` (its setting taken) moves its ring to position 0.
    """

    def __init__(self, *, qps, pages, ring_beats, width=BEAT_BYTES, hints=4):
        self._qps = qps
        self._pages = pages
        self._width = width
        self._page_beats = page_beats(width)
        check_ring_beats(ring_beats, width)
        check_retransmit_pages(pages, ring_beats, width)
        self._ring_pages = ring_beats // self._page_beats
        self._hints = hints
        page_bits = self.page_bits
        super().__init__({
            "i_take": In(stream.Signature(page_take(self.vpage_bits), always_ready=True)),
            "o_available": Out(1),
            "view_qp": In(QP_INDEX_BITS),
            "view_released": Out(self.vpage_bits),
            "translate": In(translation(self.table_bits, page_bits)).array(2),
            "i_hint": In(stream.Signature(QP_INDEX_BITS, always_ready=True)),
            "i_active": In(stream.Signature(QP_INDEX_BITS, always_ready=True)).array(3),
            "state_qp": Out(QP_INDEX_BITS),
            "state": In(PAGE_STATE),
            "reset_qp": In(stream.Signature(QP_INDEX_BITS, always_ready=True)),
            "o_reset_clear": Out(1),
            "i_rebase": In(stream.Signature(QP_INDEX_BITS, always_ready=True)),
        })

    @property
    def page_bits(self):
        """Bits of a page's number in the buffer."""
        return max((self._pages - 1).bit_length(), 1)

    @property
    def vpage_bits(self):
        """Bits of a page of a QP's ring positions."""
        return vpage_bits_of(self._width)

    @property
    def table_bits(self):
        """Bits of a page table address: QP index above the ring's page."""
        return qp_bits_of(self._qps) + (self._ring_pages - 1).bit_length()

    def elaborate(self, platform):
        m = Module()
        qp_bits = qp_bits_of(self._qps)
        ring_page_bits = (self._ring_pages - 1).bit_length()
        offset_bits = page_offset_bits(self._width)
        vpage_bits = self.vpage_bits

        def table_address(qp, vpage):
            return Cat(vpage[:ring_page_bits], qp[:qp_bits])

        # A take goes in a cycle after it, from a register (``take``), so that nothing
        # the planner decides reaches the pool's memories and queue in the same cycle.
        take = Signal(data.StructLayout({"valid": 1, "p": page_take(vpage_bits)}))
        m.d.sync += [take.valid.eq(self.i_take.valid), take.p.eq(self.i_take.p)]

        # The free pages: those never taken yet (from ``fresh`` on), then those given back.
        # One is available for a take when one is left besides the one the take waiting
        # in the register gets: that one comes from the queue if it has one, else a fresh
        # one. What the queue holds is counted a cycle ahead, from its level (an add)
        # into registers, and low by the one page it may give in that cycle: with at most
        # one page left in the queue and none fresh, a take waits a cycle more.
        m.submodules.returned = returned = fifo.SyncFIFOBuffered(
            width=self.page_bits, depth=self._pages)
        fresh = Signal(range(self._pages + 1))
        page = Mux(returned.r_rdy, returned.r_data, fresh)
        some_fresh = fresh != self._pages
        queued_one = Signal()                   # the queue holds a page or more
        queued_two = Signal()                   # two or more, the first at its output
        m.d.sync += [queued_one.eq(returned.r_level >= 2),
                     queued_two.eq(returned.r_level >= 3)]
        one_left = returned.r_rdy | some_fresh
        two_left = (fresh < self._pages - 1) | (some_fresh & queued_one) | queued_two
        m.d.comb += [
            self.o_available.eq(Mux(take.valid, two_left, one_left)),
            returned.r_en.eq(take.valid),
        ]
        with m.If(take.valid & ~returned.r_rdy):
            m.d.sync += fresh.eq(fresh + 1)

        m.submodules.table = table = memory.Memory(
            shape=self.page_bits, depth=1 << self.table_bits, init=[])
        table_write = table.write_port()
        m.d.comb += [
            table_write.addr.eq(table_address(take.p.qp, take.p.vpage)),
            table_write.data.eq(page),
            table_write.en.eq(take.valid),
        ]
        for port in self.translate:
            read = table.read_port()
            m.d.comb += [read.addr.eq(port.addr), read.en.eq(port.en), port.data.eq(read.data)]

        # Each QP's first page still held (the planner reads it to count the QP's pages):
        # written by a QP's setting (its ring back to 0), a page taken again (the QP holds
        # it first), else by the giving back.
        m.submodules.released = released = memory.Memory(
            shape=vpage_bits, depth=1 << qp_bits, init=[])
        released_write = released.write_port()
        view = released.read_port(transparent_for=(released_write,))
        own = released.read_port(transparent_for=(released_write,))
        # The view shows a page taken again in the cycle of its address, which the
        # memory takes a cycle later: compared then, passed on from registers.
        view_again = Signal()
        m.d.sync += view_again.eq(self.i_take.valid & self.i_take.p.again
                                  & (self.i_take.p.qp[:qp_bits] == self.view_qp[:qp_bits]))
        m.d.comb += [view.addr.eq(self.view_qp),
                     self.view_released.eq(Mux(view_again, take.p.vpage, view.data))]
        rebase = self.i_rebase.valid & (self.i_rebase.p < self._qps)
        again = take.valid & take.p.again
        released_busy = rebase | again

        # The QPs the planner's contexts worked on lately (this cycle's too).
        recent = []
        for index, port in enumerate(self.i_active):
            valid, qp = port.valid, port.p[:qp_bits]
            recent.append((valid, qp))
            for age in range(1, ACTIVE_CYCLES + 1):
                valid_then = Signal(name=f"active_{index}_valid_{age}")
                qp_then = Signal(qp_bits, name=f"active_{index}_qp_{age}")
                m.d.sync += [valid_then.eq(valid), qp_then.eq(qp)]
                valid, qp = valid_then, qp_then
                recent.append((valid, qp))

        per_port = ACTIVE_CYCLES + 1

        def active(qp, ports=None, *, now=True, before=True):
            """Whether a context (of ``ports``: all) worked on ``qp`` lately (``now``: this
            cycle too; ``before=False``: this cycle only)."""
            ports = range(len(self.i_active)) if ports is None else ports
            first = 0 if now else 1
            last = per_port if before else 1
            return Cat(valid & (other == qp)
                       for index in ports
                       for valid, other in recent[index * per_port + first:
                                                  index * per_port + last]).any()

        # QPs to look at: a QP waiting to be set first, hinted ones (not one already at the
        # end of the queue), and in turn with them every QP in order.
        m.submodules.hinted = hinted = fifo.SyncFIFOBuffered(width=qp_bits, depth=self._hints)
        last_hint = Signal(qp_bits)
        repeated = (self.i_hint.p[:qp_bits] == last_hint) & hinted.r_rdy
        m.d.comb += [
            hinted.w_en.eq(self.i_hint.valid & ~repeated),
            hinted.w_data.eq(self.i_hint.p),
        ]
        with m.If(hinted.w_en & hinted.w_rdy):
            m.d.sync += last_hint.eq(self.i_hint.p)
        sweep = Signal(qp_bits)
        sweep_turn = Signal()

        # Whether the QP waiting to be set holds no page, as the pool last saw it.
        clear = Signal()
        clear_qp = Signal(qp_bits)
        reset = self.reset_qp
        m.d.comb += self.o_reset_clear.eq(
            reset.valid & ((reset.p >= self._qps) | (clear & (clear_qp == reset.p[:qp_bits]))))

        qp = Signal(qp_bits)
        picked = Signal(qp_bits)
        table_read = table.read_port()
        state = self.state
        # Whether a page lies behind the older of the two positions, not given back: the
        # difference from each and the comparison of the two side by side, so that no
        # subtraction waits for another.
        behind_head = Signal(vpage_bits)
        behind_tail = Signal(vpage_bits)
        held_behind = Signal()
        tail_page = state.tail[offset_bits:]
        mid_page = state.tail[:offset_bits] != 0
        tail_only = Signal()                    # the QP holds only the page it sends into
        holds_none = Signal()
        idle_release = Signal()                 # that page comes back
        m.d.comb += [
            behind_head.eq(state.head[offset_bits:] - own.data),
            behind_tail.eq(state.tail[offset_bits:] - own.data),
            held_behind.eq(Mux((state.head - state.tail)[-1],
                               (behind_head != 0) & ~behind_head[-1],
                               (behind_tail != 0) & ~behind_tail[-1])),
            tail_only.eq(mid_page & (own.data == tail_page)),
            # (own == tail + 1 exactly when own + ~tail wraps to zero: no carry chain)
            holds_none.eq(Mux(mid_page, sum_is_zero(own.data, ~tail_page),
                              own.data == tail_page)),
            # (GIVE_BACK looks again with this cycle's contexts, in the next: so CHECK
            # does not, and neither the planner's choice of QP nor the engine's offer of a
            # resend reaches its decision)
            idle_release.eq(state.idle & tail_only & ~active(qp, now=False)),
            own.addr.eq(qp),
            self.state_qp.eq(qp),
            table_read.addr.eq(table_address(qp, own.data)),
            table_read.en.eq(0),
        ]
        with m.If(rebase):
            m.d.comb += [released_write.addr.eq(self.i_rebase.p), released_write.data.eq(0),
                         released_write.en.eq(1)]
            m.d.sync += clear.eq(0)
        with m.Elif(again):
            m.d.comb += [released_write.addr.eq(take.p.qp), released_write.data.eq(take.p.vpage),
                         released_write.en.eq(1)]
        with m.Else():
            m.d.comb += [released_write.addr.eq(qp), released_write.data.eq(own.data + 1)]

        idle_kind = Signal()                    # the page to give back is the one sent into
        giving = Signal()                       # a page is given back
        # Whether a context worked on ``qp`` up to the cycle before, of the resends and of
        # all: registers, so that GIVE_BACK (whose ``qp`` is CHECK's) compares only this
        # cycle's QPs and its decision waits on no wide OR. They look a cycle further back
        # than ``active`` does, which only keeps a page a cycle longer.
        resent_before = Signal()
        active_before = Signal()
        m.d.sync += [resent_before.eq(active(qp, RESENDS)), active_before.eq(active(qp))]
        # Whether the QP waiting to be set was worth a look in the cycle before (in range,
        # not yet seen clear): a register, so that the compares of its index do not reach
        # the choice of QP and the reads it addresses. (A QP seen clear in the cycle before
        # may be looked at once more.)
        reset_wanted = Signal()
        m.d.sync += reset_wanted.eq(reset.valid & (reset.p < self._qps) & ~self.o_reset_clear)
        with m.FSM():
            with m.State("PICK"):
                use_reset = reset.valid & reset_wanted
                use_hint = ~use_reset & hinted.r_rdy & ~sweep_turn
                m.d.comb += [
                    picked.eq(Mux(use_reset, reset.p, Mux(use_hint, hinted.r_data, sweep))),
                    hinted.r_en.eq(use_hint),
                    own.addr.eq(picked),
                    self.state_qp.eq(picked),
                ]
                m.d.sync += qp.eq(picked)
                with m.If(~use_reset):
                    m.d.sync += sweep_turn.eq(~sweep_turn)
                with m.If(~use_reset & ~use_hint):
                    m.d.sync += sweep.eq(Mux(sweep == (1 << qp_bits) - 1, 0, sweep + 1))
                m.next = "CHECK"
            with m.State("CHECK"):
                with m.If(holds_none & reset.valid & (reset.p[:qp_bits] == qp)):
                    m.d.sync += [clear.eq(1), clear_qp.eq(qp)]
                # The oldest page held is behind the older position (by less than half the
                # positions' range, as they run on), or it is the one an idle QP sends into:
                # its page table entry is read.
                normal = held_behind & ~active(qp, RESENDS, now=False)
                with m.If((normal | idle_release) & ~rebase):
                    m.d.comb += table_read.en.eq(1)
                    m.d.sync += idle_kind.eq(~normal)
                    m.next = "GIVE_BACK"
                with m.Else():
                    m.next = "PICK"
            with m.State("GIVE_BACK"):
                # The page stays if a resend came to the QP meanwhile (or in the cycle
                # before, which CHECK did not look at), and the page the QP sends into
                # if any context did.
                resent = resent_before | active(qp, RESENDS, before=False)
                worked = active_before | active(qp, before=False)
                with m.If(rebase | resent | (idle_kind & worked)):
                    m.next = "PICK"
                with m.Elif(~released_busy):
                    m.d.comb += [giving.eq(1), released_write.en.eq(1)]
                    m.next = "CHECK"
        # A page given back goes into ``returned`` a cycle later, from a register, so that
        # the planner's contexts (``active``) do not reach the queue's count in the same
        # cycle.
        given = Signal()
        given_page = Signal(self.page_bits)
        m.d.sync += [given.eq(giving), given_page.eq(table_read.data)]
        m.d.comb += [returned.w_en.eq(given), returned.w_data.eq(given_page)]
        return m
