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
    free entry, or else replaces entries in turn. An entry expires
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

        for index in range(count):
            with m.If(valid[index] & (table[index].ip == self.i_lookup_ip)):
                m.d.comb += [
                    self.o_hit.eq(1),
                    self.o_mac.eq(table[index].mac),
                ]

        update = self.i_update.p
        matches = Cat(valid[index] & (table[index].ip == update.ip) for index in range(count))
        slot = Signal(range(count))
        with m.If(matches.any()):
            for index in reversed(range(count)):
                with m.If(matches[index]):
                    m.d.comb += slot.eq(index)
        with m.Elif(~valid.all()):
            for index in reversed(range(count)):
                with m.If(~valid[index]):
                    m.d.comb += slot.eq(index)
        with m.Else():
            m.d.comb += slot.eq(victim)
        with m.If(self.i_update.valid):
            m.d.sync += [
                table[slot].eq(update),
                valid.bit_select(slot, 1).eq(1),
                age[slot].eq(0),
            ]
            with m.If(~matches.any() & valid.all()):
                m.d.sync += victim.eq(Mux(victim == count - 1, 0, victim + 1))
        return m
