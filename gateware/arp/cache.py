import operator
from functools import reduce

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["ArpCache", "ARP_ENTRY"]

#: One binding: an IPv4 address and the MAC address that answers for it.
ARP_ENTRY = data.StructLayout({"ip": 32, "mac": 48})


class ArpCache(wiring.Component):
    """A small fully associative table of IPv4 → MAC bindings that expire.

    ``i_lookup_ip`` is answered in the same cycle on ``o_hit`` / ``o_mac``.
    A binding on ``i_update`` refreshes the entry for its address, or takes a
    free entry, or else replaces entries in turn; it is written in two steps
    (find the entry, then write it), so lookups see it 2 cycles after it was
    offered, and bindings may come every cycle. An entry expires
    ``lifetime`` cycles after its last update (counted in steps of
    ``lifetime / 8``, so an entry lives between 7/8 and all of it).
    """

    def __init__(self, *, entries=8, lifetime):
        if not isinstance(entries, int) or entries < 1:
            raise ValueError(f"Entries must be a positive integer, not {entries!r}")
        if not isinstance(lifetime, int) or lifetime < 8:
            raise ValueError(f"Lifetime must be at least 8 cycles, not {lifetime!r}")
        self._entries = entries
        self._lifetime = lifetime
        super().__init__({
            "i_lookup_ip": In(32),
            "o_hit": Out(1),
            "o_mac": Out(48),
            "i_update": In(stream.Signature(ARP_ENTRY, always_ready=True)),
        })

    def elaborate(self, platform):
        m = Module()
        count = self._entries
        steps = 8

        table = Array(Signal(ARP_ENTRY, name=f"entry{index}") for index in range(count))
        valid = Signal(count)
        age = Array(Signal(range(steps), name=f"age{index}") for index in range(count))
        victim = Signal(range(count))

        # Ageing: every lifetime/8 cycles each entry grows older; the eighth step expires it.
        prescaler = Signal(range(self._lifetime // steps))
        tick = prescaler == self._lifetime // steps - 1
        m.d.sync += prescaler.eq(Mux(tick, 0, prescaler + 1))
        with m.If(tick):
            for index in range(count):
                with m.If(age[index] == steps - 1):
                    m.d.sync += valid[index].eq(0)
                with m.Else():
                    m.d.sync += age[index].eq(age[index] + 1)

        # Lookup: the bindings are unique, so the answer is the OR of the matching entries.
        found = Cat(valid[index] & (table[index].ip == self.i_lookup_ip) for index in range(count))
        m.d.comb += [
            self.o_hit.eq(found.any()),
            self.o_mac.eq(reduce(operator.or_, (Mux(found[index], table[index].mac, 0)
                                                for index in range(count)))),
        ]

        # Update, in two steps. First: which entry holds the address, as a one-hot
        # vector, allowing for the write of the binding before it, which is not in the
        # table yet.
        update = self.i_update.p
        pending = Signal(ARP_ENTRY)
        pending_valid = Signal()
        pending_matches = Signal(count)
        spare = Signal(count)
        write = Signal(count)
        matches = Cat(valid[index] & (table[index].ip == update.ip) for index in range(count))
        m.d.sync += [
            pending.eq(update),
            pending_valid.eq(self.i_update.valid),
            pending_matches.eq(Mux(pending_valid & (pending.ip == update.ip),
                                   write, matches & ~write)),
        ]

        # Then the write: the entry holding the address, else the first free one, else the
        # victim; the last two depend on registers only.
        first_free = Cat(~valid[index] & valid[:index].all() for index in range(count))
        victim_hot = Cat(victim == index for index in range(count))
        m.d.comb += [
            spare.eq(Mux(valid.all(), victim_hot, first_free)),
            write.eq(Mux(pending_valid, Mux(pending_matches.any(), pending_matches, spare), 0)),
        ]
        for index in range(count):
            with m.If(write[index]):
                m.d.sync += [
                    table[index].eq(pending),
                    valid[index].eq(1),
                    age[index].eq(0),
                ]
        with m.If(pending_valid & ~pending_matches.any() & valid.all()):
            m.d.sync += victim.eq(Mux(victim == count - 1, 0, victim + 1))
        return m
