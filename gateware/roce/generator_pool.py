"""Several generator runs at once, on different QPs, merged message by message."""

from amaranth import *
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out, connect, flipped

from ..counters import counters_layout, event_counter
from ..packet.register import PacketRegister, StreamRegister
from ..stream import BEAT_BYTES, NO_META, packet_signature
from .generator import GENERATOR_RUN, TrafficGenerator
from .pacer import PACED_LOOKUP, PacedGate
from .request_arbiter import RequestArbiter
from .requests import QP_INDEX_BITS, WORK_REQUEST, check_qp_count

__all__ = ["GeneratorPool", "RUN_STATUS", "RUN_CREDIT"]

#: What the pool tells of a QP's run.
RUN_STATUS = data.StructLayout({
    "running": 1,               # a run of the QP is in progress
    "messages": 32,             # requests issued in its current run, or its last one
})

#: A host's report on a QP's credited run: messages consumed since its start (mod 2^32).
RUN_CREDIT = data.StructLayout({
    "qp": QP_INDEX_BITS,
    "count": 32,
})


class GeneratorPool(wiring.Component):
    """Runs up to ``runs`` generator runs at once, each on its own QP.

    ``i_start`` is always ready: a run for a QP that already has one in
    progress is refused (counted ``refused_running``), as is one that finds
    every generator busy (``refused_full``); otherwise the lowest idle
    generator takes it (counted ``started``; ``start_taken`` is high with the
    handshake). ``i_stop`` ends a QP's run
    after the message being offered (see :class:`TrafficGenerator`) and
    forgets its message count. ``i_credit`` goes, a cycle later, to the generator
    running the QP's run (none: it is dropped). The runs' messages are merged whole, in
    round-robin order (:class:`RequestArbiter`), so every run gets an equal
    share of messages and one run alone fills the output; a run whose QP is
    paced (each run's gate looks it up on its port ``r_paced[n]``) is passed over until
    it is not. Between each
    run's pacing gate and the arbiter a register slice cuts the path from the pacer
    through the arbiter's choice back to the generators (its two requests, passed
    before the QP was paced, still go: the pacer charges them as they are sent).
    ``o_request`` and ``o_payload`` come from register slices (1 cycle of latency).

    ``query_qp`` → ``query``: that QP's run, a cycle later: whether one is in
    progress, and the requests issued in it, or in the QP's last run (kept in a
    memory of ``qps`` words when a run ends; 0 after a stop).
    """

    def __init__(self, *, qps, runs=4, width=BEAT_BYTES):
        if not isinstance(runs, int) or runs < 1:
            raise ValueError(f"A pool needs at least one generator, not {runs!r}")
        self._qps = check_qp_count(qps)
        self._runs = runs
        self._width = width
        super().__init__({
            "i_start": In(stream.Signature(GENERATOR_RUN)),
            "start_taken": Out(1),
            "i_stop": In(stream.Signature(QP_INDEX_BITS, always_ready=True)),
            "i_credit": In(stream.Signature(RUN_CREDIT, always_ready=True)),
            "query_qp": In(QP_INDEX_BITS),
            "query": Out(RUN_STATUS),
            "r_paced": Out(PACED_LOOKUP).array(runs),
            "o_request": Out(stream.Signature(WORK_REQUEST)),
            "o_payload": Out(packet_signature(NO_META, width=width)),
            "o_counters": Out(self.counters_layout()),
        })

    @staticmethod
    def counters_layout():
        return counters_layout("started", "refused_running", "refused_full")

    @property
    def runs(self):
        return self._runs

    def elaborate(self, platform):
        m = Module()
        runs = self._runs

        m.submodules.arbiter = arbiter = RequestArbiter(inputs=runs, width=self._width,
                                                        registered_head=True)
        m.submodules.request_out = request_out = StreamRegister(stream.Signature(WORK_REQUEST))
        m.submodules.payload_out = payload_out = PacketRegister(NO_META, width=self._width)
        connect(m, arbiter.o_request, request_out.i)
        connect(m, request_out.o, flipped(self.o_request))
        connect(m, arbiter.o_payload, payload_out.i)
        connect(m, payload_out.o, flipped(self.o_payload))

        generators = []
        owners = []                         # the QP of each generator's current or last run
        counted = []                        # its message count still belongs to that QP
        pending = []                        # its ended run's count is still to be kept
        ended = []                          # its run ended last cycle
        for index in range(runs):
            generator = TrafficGenerator(width=self._width)
            m.submodules[f"generator{index}"] = generator
            m.submodules[f"gate{index}"] = gate = PacedGate()
            m.submodules[f"request_slice{index}"] = request_slice = StreamRegister(
                stream.Signature(WORK_REQUEST))
            connect(m, generator.o_request, gate.i)
            connect(m, gate.o, request_slice.i)
            connect(m, request_slice.o, arbiter.i_request[index])
            connect(m, gate.r_paced, flipped(self.r_paced[index]))
            connect(m, generator.o_payload, arbiter.i_payload[index])
            generators.append(generator)
            owners.append(Signal(QP_INDEX_BITS, name=f"owner{index}"))
            counted.append(Signal(name=f"counted{index}"))
            pending.append(Signal(name=f"pending{index}"))
            ended.append(Signal(name=f"ended{index}"))

        start = self.i_start
        busy = Cat((g.o_running & (owner == start.p.qp))
                   for g, owner in zip(generators, owners, strict=True))
        idle = Cat(~g.o_running for g in generators)
        chosen = Signal(range(runs))
        for index in reversed(range(runs)):
            with m.If(idle[index]):
                m.d.comb += chosen.eq(index)
        take = start.valid & ~busy.any() & idle.any()
        m.d.comb += [start.ready.eq(1), self.start_taken.eq(take)]

        # The message count of each QP's last run, kept when the run ends (one write a
        # cycle: a stop first, then ended runs in generator order); a stop clears it.
        m.submodules.last = last = memory.Memory(shape=32, depth=self._qps, init=[])
        keep = last.write_port()
        shown = last.read_port()
        stop = self.i_stop
        writing = Signal(range(runs))
        for index in reversed(range(runs)):
            with m.If(pending[index]):
                m.d.comb += writing.eq(index)
        with m.If(stop.valid):
            m.d.comb += [keep.addr.eq(stop.p), keep.data.eq(0), keep.en.eq(1)]
        with m.Elif(Cat(pending).any()):
            m.d.comb += [
                keep.addr.eq(Array(owners)[writing]),
                keep.data.eq(Array(g.o_messages for g in generators)[writing]),
                keep.en.eq(1),
            ]

        # A credit in a register, then to the generator whose run is the QP's.
        credit = Signal(RUN_CREDIT)
        credit_valid = Signal()
        m.d.sync += [credit.eq(self.i_credit.p), credit_valid.eq(self.i_credit.valid)]

        for index, (generator, owner) in enumerate(zip(generators, owners, strict=True)):
            m.d.comb += [
                generator.i_credit.p.eq(credit.count),
                generator.i_credit.valid.eq(credit_valid & (owner == credit.qp)),
            ]
            stopping = stop.valid & (owner == stop.p)
            running = Signal(name=f"was_running{index}")
            m.d.sync += running.eq(generator.o_running)
            m.d.comb += [
                generator.i_start.p.eq(start.p),
                generator.i_start.valid.eq(take & (chosen == index)),
                generator.i_stop.eq(stopping),
            ]
            with m.If(generator.i_start.valid):
                m.d.sync += [owner.eq(start.p.qp), counted[index].eq(1)]
            with m.Elif(stopping):
                m.d.sync += counted[index].eq(0)
            superseded = take & (owner == start.p.qp)
            m.d.comb += ended[index].eq(running & ~generator.o_running & counted[index])
            with m.If(ended[index] & ~stopping & ~superseded):
                m.d.sync += pending[index].eq(1)
            with m.Elif(stopping | superseded
                        | (~stop.valid & keep.en & (writing == index))):
                m.d.sync += pending[index].eq(0)

        # The query: a generator running the QP (or whose ended run is not kept yet),
        # else the count kept. From registers (the generator's values and the memory's
        # read): the CM's decisions on it do not chain with the pool's on its starts and
        # stops, nor with the memory's read.
        found = Signal(RUN_STATUS)              # the generator's values, if one has the QP
        finds = Signal()
        for index in reversed(range(runs)):
            generator = generators[index]
            with m.If((generator.o_running | pending[index] | ended[index])
                      & (owners[index] == self.query_qp)):
                m.d.comb += [
                    finds.eq(1),
                    found.running.eq(generator.o_running),
                    found.messages.eq(Mux(counted[index], generator.o_messages, 0)),
                ]
        found_then = Signal(RUN_STATUS)
        found_any = Signal()
        kept = Signal(RUN_STATUS)
        m.d.sync += [found_then.eq(found), found_any.eq(finds)]
        m.d.comb += [
            shown.addr.eq(self.query_qp),
            kept.messages.eq(shown.data),
            self.query.eq(Mux(found_any, found_then, kept)),
        ]

        m.d.comb += [
            self.o_counters.started.eq(event_counter(m, take, "started")),
            self.o_counters.refused_running.eq(
                event_counter(m, start.valid & busy.any(), "refused_running")),
            self.o_counters.refused_full.eq(
                event_counter(m, start.valid & ~busy.any() & ~idle.any(), "refused_full")),
        ]
        return m
