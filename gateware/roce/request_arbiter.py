"""Merges the message sources of the requester (user logic, the traffic
generator) into the one work-request and payload pair the transmit engine takes."""

from amaranth import *
from amaranth.lib import fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from ..stream import BEAT_BYTES, NO_META, packet_signature
from .requests import WORK_REQUEST

__all__ = ["RequestArbiter"]


class RequestArbiter(wiring.Component):
    """Merges several (work request, payload) sources, a whole message at a time.

    Each source ``n`` offers a work request on ``i_request[n]`` and then that
    message's payload packet on ``i_payload[n]``. Requests are granted in
    round-robin order, starting after the source served last; a request
    offered stays granted until it is taken, so ``o_request`` never changes
    while valid and not ready. Each request taken leaves its source in an
    order queue of ``depth`` entries, and ``o_payload`` carries the payload
    of the source at the head of the queue until its beat marked ``last``. So
    every payload follows its own request, in the same order, and requests
    may run up to ``depth`` messages ahead of their payloads: the consumer
    plans the next message while the current one's payload still flows, and
    a stream of one-beat messages from one source costs a beat each.

    A payload is offered from the cycle after its request is taken (its
    first beat when the consumer is ready and the queue was empty); beats
    leave one per cycle, with no idle cycle between messages while requests
    keep ahead. Payload beats of a source not at the head are held. Latency
    0 on requests. With ``registered_head`` the head of the order queue comes
    from a register, so that the choice of payload starts from a flip-flop (for
    many sources): a payload is offered a cycle later, at the same rate.
    """

    def __init__(self, *, inputs, width=BEAT_BYTES, depth=4, registered_head=False):
        if not isinstance(inputs, int) or inputs < 1:
            raise ValueError(f"An arbiter needs at least one input, not {inputs!r}")
        if not isinstance(width, int) or width < 1:
            raise ValueError(f"Beat width must be a positive number of bytes, not {width!r}")
        if not isinstance(depth, int) or depth < 1:
            raise ValueError(f"The order queue needs at least one entry, not {depth!r}")
        self._inputs = inputs
        self._width = width
        self._depth = depth
        self._registered_head = registered_head
        super().__init__({
            "i_request": In(stream.Signature(WORK_REQUEST)).array(inputs),
            "i_payload": In(packet_signature(NO_META, width=width)).array(inputs),
            "o_request": Out(stream.Signature(WORK_REQUEST)),
            "o_payload": Out(packet_signature(NO_META, width=width)),
        })

    @property
    def inputs(self):
        return self._inputs

    @property
    def width(self):
        return self._width

    def elaborate(self, platform):
        m = Module()
        count = self._inputs

        # The sources of the requests taken, whose payloads are still to pass.
        queue = fifo.SyncFIFOBuffered if self._registered_head else fifo.SyncFIFO
        m.submodules.order = order = queue(width=max(1, (count - 1).bit_length()),
                                           depth=self._depth)

        # Requests: round-robin after the source served last; held while offered.
        locked = Signal()                   # a request is offered and not yet taken
        grant = Signal(range(count))
        served = Signal(range(count))
        valids = Array(port.valid for port in self.i_request)
        choice = Signal(range(count))
        for offset in reversed(range(count)):
            index = Signal(range(count), name=f"candidate{offset}")
            m.d.comb += index.eq(Mux(served + 1 + offset >= count,
                                     served + 1 + offset - count, served + 1 + offset))
            with m.If(valids[index]):
                m.d.comb += choice.eq(index)
        current = Mux(locked, grant, choice)
        for index, request in enumerate(self.i_request):
            with m.If(current == index):
                m.d.comb += [
                    self.o_request.valid.eq(request.valid & order.w_rdy),
                    self.o_request.p.eq(request.p),
                    request.ready.eq(self.o_request.ready & order.w_rdy),
                ]
        taken = self.o_request.valid & self.o_request.ready
        m.d.comb += [
            order.w_data.eq(current),
            order.w_en.eq(taken),
        ]
        with m.If(taken):
            m.d.sync += [locked.eq(0), served.eq(current)]
        with m.Elif(self.o_request.valid):
            m.d.sync += [locked.eq(1), grant.eq(current)]

        # Payloads: from the source at the head of the order queue.
        for index, payload in enumerate(self.i_payload):
            with m.If(order.r_data == index):
                m.d.comb += [
                    self.o_payload.valid.eq(payload.valid & order.r_rdy),
                    self.o_payload.p.eq(payload.p),
                    payload.ready.eq(self.o_payload.ready & order.r_rdy),
                ]
        m.d.comb += order.r_en.eq(self.o_payload.valid & self.o_payload.ready
                                  & self.o_payload.p.last)

        return m
