"""Who may use the connection manager: an IPv4 subnet (CM_PROTOCOL.md, "Who may
steer a QP")."""

from amaranth import *
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["AccessList"]


class AccessList(wiring.Component):
    """``o_allowed``: ``i_source`` lies in the subnet ``i_address``/``i_prefix``
    (prefix 0: every address; 32: ``i_address`` alone).

    The subnet mask is decoded from ``i_prefix`` into a register, so a new
    subnet applies one cycle after it is set; ``o_allowed`` follows
    ``i_source`` combinationally (an XOR, an AND and a 32-input NOR).
    """

    i_address: In(32)
    i_prefix: In(range(33))
    i_source: In(32)
    o_allowed: Out(1)

    def elaborate(self, platform):
        m = Module()
        mask = Signal(32)
        m.d.sync += mask.eq(Cat(self.i_prefix > 31 - bit for bit in range(32)))
        m.d.comb += self.o_allowed.eq(((self.i_source ^ self.i_address) & mask) == 0)
        return m
