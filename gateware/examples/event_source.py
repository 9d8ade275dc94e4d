"""A detector-like data source on the core's user ports: fixed-size event fragments,
each an RDMA WRITE with immediate into a ring of slots in the host's memory."""

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..roce.requests import COMPLETION, QP_INDEX_BITS, WORK_REQUEST, CompletionStatus, Verb
from ..stream import BEAT_BYTES, NO_META, keep_mask, packet_signature

__all__ = ["FRAGMENT_MAGIC", "HEADER_BYTES", "EVENT_CONFIG", "EVENT_STATUS", "EventSource"]

#: The first 32 bits of a fragment: the bytes ``EVT1``.
FRAGMENT_MAGIC = int.from_bytes(b"EVT1", "little")

#: The header: magic (32 bits), size (32), event number (64), timestamp (64).
HEADER_BYTES = 24

#: How the source runs; see :class:`EventSource`. (The QP and the ring's address come
#: with the QP: ``i_qp``, ``i_base``.)
EVENT_CONFIG = data.StructLayout({
    "slot_bytes": 32,           # distance between slots, at least the fragment's size
    "slots": 16,                # slots in the ring, at least 1
    "period": 32,               # cycles between event starts at least (0, 1: back to back)
    "count": 32,                # events in a run; 0: without end
})

#: What the source reports.
EVENT_STATUS = data.StructLayout({
    "running": 1,               # enabled, and events of the run still to make
    "events": 32,               # fragments whose work request was taken in this run
    "completed": 32,            # completions with SUCCESS, since reset
    "failed": 32,               # completions with any other status, since reset
    "in_flight": 16,            # fragments started and not yet completed
    "error": CompletionStatus,  # the status of the first failed completion (SUCCESS: none)
})


class EventSource(wiring.Component):
    """Makes event fragments and sends each as an RDMA WRITE with immediate.

    While ``i_enable`` is high the source makes events: event ``k`` (from 0 at
    each rise of ``i_enable``) is a work request on QP ``i_qp`` with verb
    RDMA_WRITE_WITH_IMMEDIATE, ``tag`` = ``k`` mod 2^16, ``immediate`` = ``k``
    mod 2^32, ``length`` = ``fragment_bytes`` and ``remote_address`` = ``i_base``
    (the address of ring slot 0 in the host's memory) + (``k`` mod
    ``config.slots``) × ``config.slot_bytes``, then its payload: the fragment of
    the header (:data:`FRAGMENT_MAGIC`, the size, ``k`` as 64 bits and the
    timestamp), then word ``j`` (from 3) = ``(k << 32) | j``; ``host/fragments.py``
    describes the same format for the host and the tests. The rkey is the QP's, as
    the connection manager set it from the host's OPEN_QP.

    Byte order: 64-bit words, little-endian; byte lane 0 of a beat is the
    fragment's first byte, which lands at the slot's lowest address. The
    immediate is big-endian on the wire (the core's), so the host reads ``k``.

    Flow control: a fragment is in flight from the cycle its event starts
    until the core's completion for it comes back (on ``i_completion`` for
    QP ``i_qp``), that is, until the host's NIC has acknowledged every byte
    of it. At most ``min(window, config.slots)`` fragments are in flight, so
    the source never writes a slot whose previous fragment is not complete.
    A completion with an error status is counted in ``o_status.failed``; its
    event is not sent again. ``i_completion`` is always ready, as the core
    asks of its completion port; completions of other QPs are ignored (the
    QP must carry no other work requests).

    Timing. An event starts when the source is enabled, the run has events
    left (``count``), fewer than the limit are in flight, and at least
    ``period`` cycles have passed since the previous start; its work request
    is offered the next cycle, and its ``timestamp`` is the count of cycles
    since reset in that cycle. Payload beats are offered once the request is
    taken, one a cycle while ``o_payload`` is ready; the next event starts at
    the soonest the cycle after the last beat is taken, so back-to-back
    fragments of ``n`` beats take ``n`` + 2 cycles when the core takes every
    request at once.

    ``i_config`` (always ready) writes the configuration; until written it is
    ``config``. The source reads it, ``i_qp`` and ``i_base`` while it runs:
    change them only while ``i_enable`` is low and nothing is in flight. While
    ``i_enable`` is low nothing starts, and the next run begins at event 0 in
    slot 0.

    Parameters
    ----------
    fragment_bytes : int
        Bytes of a fragment: a multiple of 8, from 24 (the header) to 2^31 - 8.
    window : int
        Fragments in flight at most (1 … 65535), whatever the ring's slots.
    config : dict
        The configuration after reset (fields of :data:`EVENT_CONFIG`).
    width : int
        Byte lanes of a beat, a multiple of 8 from 24 (the header fits the first beat).
    """

    def __init__(self, *, fragment_bytes=4096, window=16, config=None, width=BEAT_BYTES):
        if (not isinstance(fragment_bytes, int) or fragment_bytes % 8
                or not HEADER_BYTES <= fragment_bytes < 1 << 31):
            raise ValueError(f"Fragment size must be a multiple of 8 bytes from {HEADER_BYTES} "
                             f"to 2^31 - 8, not {fragment_bytes!r}")
        if not isinstance(window, int) or not 1 <= window < 1 << 16:
            raise ValueError(f"Window must be 1 … 65535 fragments, not {window!r}")
        if not isinstance(width, int) or width < HEADER_BYTES or width % 8:
            raise ValueError(f"Beat width must be a multiple of 8 bytes from {HEADER_BYTES}, "
                             f"not {width!r}")
        self._fragment_bytes = fragment_bytes
        self._window = window
        self._config = EVENT_CONFIG.const({"slot_bytes": fragment_bytes, "slots": 1,
                                           **(config or {})})
        self._width = width
        super().__init__({
            "i_enable": In(1),
            "i_qp": In(QP_INDEX_BITS),
            "i_base": In(64),
            "i_config": In(stream.Signature(EVENT_CONFIG)),
            "o_request": Out(stream.Signature(WORK_REQUEST)),
            "o_payload": Out(packet_signature(NO_META, width=width)),
            "i_completion": In(stream.Signature(COMPLETION)),
            "o_status": Out(EVENT_STATUS),
        })

    @property
    def fragment_bytes(self):
        return self._fragment_bytes

    @property
    def window(self):
        return self._window

    @property
    def width(self):
        return self._width

    def elaborate(self, platform):
        m = Module()
        width, size = self._width, self._fragment_bytes
        words = width // 8
        status = self.o_status

        config = Signal(EVENT_CONFIG, init=self._config)
        m.d.comb += self.i_config.ready.eq(1)
        with m.If(self.i_config.valid):
            m.d.sync += config.eq(self.i_config.p)

        timestamp = Signal(64)
        m.d.sync += timestamp.eq(timestamp + 1)

        # Completions of our QP end a fragment's flight.
        completion = self.i_completion
        m.d.comb += completion.ready.eq(1)
        done = Signal()
        m.d.comb += done.eq(completion.valid & (completion.p.qp == self.i_qp)
                            & (status.in_flight != 0))
        with m.If(done):
            with m.If(completion.p.status == CompletionStatus.SUCCESS):
                m.d.sync += status.completed.eq(status.completed + 1)
            with m.Else():
                m.d.sync += status.failed.eq(status.failed + 1)
                with m.If(status.error == CompletionStatus.SUCCESS):
                    m.d.sync += status.error.eq(completion.p.status)

        # The event being sent, and where the next one goes.
        event = Signal(32)                  # number of the next event
        fresh = Signal(init=1)              # the next event is a run's first: slot 0
        slot = Signal(16)                   # the next event's slot (unless fresh)
        address = Signal(64)                # and its address
        current_slot = Signal(16)
        gap = Signal(32)                    # cycles left of the period (1: none)
        current = Signal(32)
        started_at = Signal(64)
        current_address = Signal(64)
        word = Signal(range(size // 8 + words))     # index of the beat's first word
        remaining = Signal(range(size + 1))         # bytes of the payload left to offer
        last = Signal()

        running = status.running
        room = (status.in_flight < self._window) & (status.in_flight < config.slots)
        more = (config.count == 0) | (event != config.count)
        start = Signal()
        in_flight_next = status.in_flight + start - done
        m.d.sync += status.in_flight.eq(in_flight_next)
        m.d.comb += running.eq(self.i_enable & more)
        with m.If(gap > 1):
            m.d.sync += gap.eq(gap - 1)

        request = self.o_request
        m.d.comb += [
            request.p.verb.eq(Verb.RDMA_WRITE_WITH_IMMEDIATE),
            request.p.qp.eq(self.i_qp),
            request.p.tag.eq(current[:16]),
            request.p.remote_address.eq(current_address),
            request.p.length.eq(size),
            request.p.immediate.eq(current),
        ]

        payload = self.o_payload
        header = Const(FRAGMENT_MAGIC | size << 32, 64)
        lanes = []
        for lane in range(words):
            index = word + lane
            value = Cat(index, Const(0, 32 - len(index)), current)
            if lane < HEADER_BYTES // 8:
                value = Mux(word == 0, (header, current, started_at)[lane], value)
            lanes.append(value)
        m.d.comb += [
            payload.p.data.eq(Cat(*lanes)),
            payload.p.keep.eq(Mux(last, keep_mask(remaining, width), (1 << width) - 1)),
            payload.p.last.eq(last),
        ]

        with m.FSM():
            with m.State("IDLE"):
                with m.If(~self.i_enable):
                    m.d.sync += [
                        event.eq(0),
                        fresh.eq(1),
                        gap.eq(0),
                    ]
                with m.Elif(more & room & (gap <= 1)):
                    m.d.comb += start.eq(1)
                    m.d.sync += [
                        current.eq(event),
                        current_slot.eq(Mux(fresh, 0, slot)),
                        current_address.eq(Mux(fresh, self.i_base, address)),
                        fresh.eq(0),
                        started_at.eq(timestamp + 1),
                        gap.eq(config.period),
                        word.eq(0),
                        remaining.eq(size),
                        last.eq(size <= width),
                    ]
                    m.next = "REQUEST"
            with m.State("REQUEST"):
                m.d.comb += request.valid.eq(1)
                with m.If(request.ready):
                    m.d.sync += [
                        event.eq(event + 1),
                        status.events.eq(event + 1),
                    ]
                    with m.If(current_slot + 1 >= config.slots):
                        m.d.sync += [slot.eq(0), address.eq(self.i_base)]
                    with m.Else():
                        m.d.sync += [slot.eq(current_slot + 1),
                                     address.eq(current_address + config.slot_bytes)]
                    m.next = "PAYLOAD"
            with m.State("PAYLOAD"):
                m.d.comb += payload.valid.eq(1)
                with m.If(payload.ready):
                    m.d.sync += [
                        word.eq(word + words),
                        remaining.eq(remaining - width),
                        last.eq(remaining <= 2 * width),
                    ]
                    with m.If(last):
                        m.next = "IDLE"

        with m.If(~self.i_enable):
            m.d.sync += status.events.eq(0)
        return m
