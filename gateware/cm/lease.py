"""The coarse clock of the connection manager's QP leases (CM_PROTOCOL.md, "Lease")."""

from amaranth import *
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["LEASE_SWEEPS", "LeaseTicker", "lease_tick"]

#: Sweeps of the QPs per lease: a QP unheard for this many sweeps has outlived its
#: lease. It is freed at the next sweep, so between ``LEASE_SWEEPS`` and
#: ``LEASE_SWEEPS + 1`` sweep periods after its host's last request.
LEASE_SWEEPS = 16


def lease_tick(lease):
    """Cycles between two sweeps for a lease of ``lease`` cycles (0: no lease)."""
    if not isinstance(lease, int) or lease < 0:
        raise ValueError(f"lease must be a number of cycles >= 0, not {lease!r}")
    tick = -(-lease // LEASE_SWEEPS)
    if tick >= 1 << 32:
        raise ValueError(f"lease of {lease} cycles is longer than {LEASE_SWEEPS} × 2^32 cycles")
    return tick


class LeaseTicker(wiring.Component):
    """Asks for a sweep of the QPs every ``i_period`` cycles (0: never).

    ``o_due`` rises when the period has passed and stays high until ``i_done``
    (the sweep began); the next period counts from the rise, so a late sweep
    does not shift the ones after it. A smaller ``i_period`` written at run
    time applies at once.
    """

    i_period: In(32)
    i_done: In(1)
    o_due: Out(1)

    def elaborate(self, platform):
        m = Module()
        elapsed = Signal(32)
        with m.If(self.i_done):
            m.d.sync += self.o_due.eq(0)
        with m.If(self.i_period == 0):
            m.d.sync += elapsed.eq(0)
        with m.Elif(elapsed >= self.i_period - 1):
            m.d.sync += [elapsed.eq(0), self.o_due.eq(1)]
        with m.Else():
            m.d.sync += elapsed.eq(elapsed + 1)
        return m
