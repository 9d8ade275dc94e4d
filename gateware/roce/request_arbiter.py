"""Merges the message sources of the requester (user logic, the traffic
generator) into the one work-request and payload pair the transmit engine takes."""

from amaranth import *
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ..stream import BEAT_BYTES, NO_META, packet_signature
from .requests import WORK_REQUEST

__all__ = ["RequestArbiter"]


class RequestArbiter(wiring.Component):
    """Merges several (work request, payload) sources, a whole message at a time.

    Each source ``n`` offers a work request on ``i_request[n]`` and then that
    message's payload packet on ``i_payload[n]``. While no message is in
    flight the arbiter grants the first source offering a request, in
    round-robin order starting after the source served last. The grant holds
    until both the request and the payload beat marked ``last`` have passed;
    the next request is offered the cycle after. So every payload on
    ``o_payload`` follows its own request on ``o_request``, in the same order.

    The granted source's payload is routed from the cycle its request is
    offered, so a consumer may take the request and the first payload beat in
    the same cycle; a message then costs exactly its payload beats, with no
    idle cycle between messages. Once anything is offered the grant is fixed,
    so neither output changes while valid and not ready. Payload beats from a
    source whose request is not offered are held. Latency 0, one beat per
    cycle.
    """

    def __init__(self, *, inputs, width=BEAT_BYTES):
        if not isinstance(inputs, int) or inputs < 1:
            raise ValueError(f"An arbiter needs at least one input, not {inputs!r}")
        if not isinstance(width, int) or width < 1:
            raise ValueError(f"Beat width must be a positive number of bytes, not {width!r}")
        self._inputs = inputs
        self._width = width
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

        locked = Signal()                   # a message is in flight from `grant`
        grant = Signal(range(count))
        served = Signal(range(count))       # source of the last message, for round-robin
        request_done = Signal()             # the locked message's request has passed
        payload_done = Signal()             # the locked message's last payload beat has passed

        # Candidates in order of preference: served+1, served+2, ..., served.
        valids = Array(port.valid for port in self.i_request)
        choice = Signal(range(count))
        for offset in reversed(range(count)):
            index = Signal(range(count), name=f"candidate{offset}")
            m.d.comb += index.eq(Mux(served + 1 + offset >= count,
                                     served + 1 + offset - count, served + 1 + offset))
            with m.If(valids[index]):
                m.d.comb += choice.eq(index)

        current = Mux(locked, grant, choice)
        for index in range(count):
            request, payload = self.i_request[index], self.i_payload[index]
            with m.If(current == index):
                m.d.comb += [
                    self.o_request.valid.eq(request.valid & ~request_done),
                    self.o_request.p.eq(request.p),
                    request.ready.eq(self.o_request.ready & ~request_done),
                    self.o_payload.valid.eq(payload.valid & ~payload_done &
                                            (request.valid | request_done)),
                    self.o_payload.p.eq(payload.p),
                    payload.ready.eq(self.o_payload.ready & ~payload_done &
                                     (request.valid | request_done)),
                ]

        request_passed = request_done | (self.o_request.valid & self.o_request.ready)
        payload_passed = payload_done | (self.o_payload.valid & self.o_payload.ready &
                                         self.o_payload.p.last)
        with m.If(request_passed & payload_passed):
            m.d.sync += [
                locked.eq(0),
                request_done.eq(0),
                payload_done.eq(0),
                served.eq(current),
            ]
        with m.Elif(locked | self.o_request.valid):
            m.d.sync += [
                locked.eq(1),
                grant.eq(current),
                request_done.eq(request_passed),
                payload_done.eq(payload_passed),
            ]

        return m
