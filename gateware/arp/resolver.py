from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .cache import ARP_ENTRY

__all__ = ["ArpResolver", "RESOLVE", "RESOLVED"]

#: A resolution to start: the address, and ``force`` (take it even if another one is
#: under way, which is then abandoned).
RESOLVE = data.StructLayout({"ip": 32, "force": 1})

#: The outcome of a resolution: whether the address answered (with its MAC), and whether
#: it was started with ``force``.
RESOLVED = data.StructLayout({"ok": 1, "mac": 48, "forced": 1})


class ArpResolver(wiring.Component):
    """Asks for one IPv4 address at a time: sends an ARP request for it on
    ``o_request`` every ``retry_interval`` cycles until a binding for it is
    learnt (``i_learnt``, the cache's updates) or ``retries`` requests went
    unanswered, then reports the outcome on ``o_done`` (valid for one cycle).

    ``i_start`` (no backpressure) is taken when idle, or always with
    ``force``, and ignored otherwise; ``i_refresh`` (a binding in use that is
    about to expire) only when idle and no start is offered. Every decision
    is made from registers: the learnt address is compared in a register
    stage, so an outcome comes 2 cycles after the binding.
    """

    def __init__(self, *, retry_interval, retries):
        if not isinstance(retry_interval, int) or retry_interval < 1:
            raise ValueError(f"Retry interval must be a positive number of cycles, "
                             f"not {retry_interval!r}")
        if not isinstance(retries, int) or retries < 1:
            raise ValueError(f"Retries must be a positive integer, not {retries!r}")
        self._retry_interval = retry_interval
        self._retries = retries
        super().__init__({
            "i_start": In(stream.Signature(RESOLVE, always_ready=True)),
            "i_refresh": In(stream.Signature(32)),
            "i_learnt": In(stream.Signature(ARP_ENTRY, always_ready=True)),
            "o_request": Out(stream.Signature(32)),
            "o_done": Out(stream.Signature(RESOLVED, always_ready=True)),
        })

    def elaborate(self, platform):
        m = Module()
        busy = Signal()
        target = Signal(32)
        forced = Signal()
        timer = Signal(range(self._retry_interval + 1))
        # ``timer != 0`` in a register set from the timer's next value (same cycles), so
        # that the wide compare does not chain with the decisions.
        timing = Signal()
        attempts = Signal(range(self._retries + 1))

        start, refresh = self.i_start, self.i_refresh
        m.d.comb += [
            refresh.ready.eq(~busy & ~start.valid),
            self.o_request.p.eq(target),
        ]
        learnt = Signal()
        learnt_mac = Signal(48)
        m.d.sync += [
            learnt.eq(self.i_learnt.valid & (self.i_learnt.p.ip == target)),
            learnt_mac.eq(self.i_learnt.p.mac),
        ]
        with m.If(self.o_request.valid & self.o_request.ready):
            m.d.sync += self.o_request.valid.eq(0)

        with m.If(start.valid & (~busy | start.p.force)):
            m.d.sync += [
                busy.eq(1), target.eq(start.p.ip), forced.eq(start.p.force), learnt.eq(0),
                self.o_request.valid.eq(1), attempts.eq(1), timer.eq(self._retry_interval),
                timing.eq(1),
            ]
        with m.Elif(refresh.valid & refresh.ready):
            m.d.sync += [
                busy.eq(1), target.eq(refresh.p), forced.eq(0), learnt.eq(0),
                self.o_request.valid.eq(1), attempts.eq(1), timer.eq(self._retry_interval),
                timing.eq(1),
            ]
        with m.Elif(busy & learnt):
            m.d.comb += [
                self.o_done.valid.eq(1),
                self.o_done.p.ok.eq(1),
                self.o_done.p.mac.eq(learnt_mac),
                self.o_done.p.forced.eq(forced),
            ]
            m.d.sync += [busy.eq(0), self.o_request.valid.eq(0)]
        with m.Elif(busy & timing):
            m.d.sync += [timer.eq(timer - 1), timing.eq(timer != 1)]
        with m.Elif(busy & (attempts == self._retries)):
            m.d.comb += [
                self.o_done.valid.eq(1),
                self.o_done.p.forced.eq(forced),
            ]
            m.d.sync += [busy.eq(0), self.o_request.valid.eq(0)]
        with m.Elif(busy):
            m.d.sync += [
                self.o_request.valid.eq(1), attempts.eq(attempts + 1),
                timer.eq(self._retry_interval), timing.eq(1),
            ]
        return m
