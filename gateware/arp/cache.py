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

    ``i_lookup_ip`` is answered in the same cycle on ``o_hit`` / ``o_mac``;
    ``i_lookup_used`` high with it marks the entry found as in use. A binding
    on ``i_update`` refreshes the entry for its address, or takes a free
    entry, or else one not in use, or else replaces entries in turn; it is
    written in two steps (find the entry, then write it), so lookups see it 2
    cycles after it was offered, and bindings may come every cycle. An entry
    expires ``lifetime`` cycles after its last update (counted in steps of
    ``lifetime / 8``, so an entry lives between 7/8 and all of it). An entry
    in use that is past 5/8 of its lifetime is offered on ``o_refresh`` (from
    a register) so that it can be asked for again before it expires; taking
    the offer clears its use until it is used again.
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
            "i_lookup_used": In(1),
            "o_hit": Out(1),
            "o_mac": Out(48),
            "i_update": In(stream.Signature(ARP_ENTRY, always_ready=True)),
            "o_refresh": Out(stream.Signature(32)),
        })

    def elaborate(self, platform):
        m = Module()
        count = self._entries
        steps = 8

        table = Array(Signal(ARP_ENTRY, name=f"entry{index}") for index in range(count))
        valid = Signal(count)
        used = Signal(count)
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
        mark = Mux(self.i_lookup_used, found, 0)

        # Refresh offers: the first entry in use that is old, registered.
        old = Cat(valid[index] & used[index] & (age[index] >= steps - 3) for index in range(count))
        offer = Signal(range(count))
        refresh = self.o_refresh
        taken = refresh.valid & refresh.ready
        with m.If(taken):
            m.d.sync += refresh.valid.eq(0)
        with m.Else():
            m.d.sync += refresh.valid.eq(old.any())
            for index in reversed(range(count)):
                with m.If(old[index]):
                    m.d.sync += [offer.eq(index), refresh.p.eq(table[index].ip)]
        taken_hot = Mux(taken, Cat(offer == index for index in range(count)), 0)

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
        # first one not in use, else the victim; the last three depend on registers only.
        first_free = Cat(~valid[index] & valid[:index].all() for index in range(count))
        first_unused = Cat(~used[index] & used[:index].all() for index in range(count))
        victim_hot = Cat(victim == index for index in range(count))
        m.d.comb += [
            spare.eq(Mux(~valid.all(), first_free, Mux(~used.all(), first_unused, victim_hot))),
            write.eq(Mux(pending_valid, Mux(pending_matches.any(), pending_matches, spare), 0)),
        ]
        # Use: marked by lookups, cleared by a refresh offer taken and by a new binding in
        # the entry (one that only refreshes the entry keeps it).
        m.d.sync += used.eq((used | mark) & ~taken_hot & ~Mux(pending_matches.any(), 0, write))
        for index in range(count):
            with m.If(write[index]):
                m.d.sync += [
                    table[index].eq(pending),
                    valid[index].eq(1),
                    age[index].eq(0),
                ]
        with m.If(pending_valid & ~pending_matches.any() & valid.all() & used.all()):
            m.d.sync += victim.eq(Mux(victim == count - 1, 0, victim + 1))
        return m
