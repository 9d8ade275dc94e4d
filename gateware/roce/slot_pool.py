"""The pool of message slots every QP's outstanding messages share: each QP keeps its
messages as a list through the slots, and a slot goes back to the pool when its message
completes."""

from amaranth import *
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from .descriptor import MESSAGE, SLOT_BITS
from .qp_context import qp_bits_of

__all__ = ["SlotPool", "SLOT_MARGIN", "slot_entry", "check_message_slots",
           "check_message_count"]

#: Slots the pool keeps back: it says it has none left while it has this many or fewer,
#: as up to that many messages are loaded before a load shows in its count.
SLOT_MARGIN = 4


def slot_entry(slot_bits):
    """A message slot: the message, and the slot of the QP's next message (the one after
    it in the QP's list; the list's last slot is the QP's empty one, which its next
    message fills)."""
    return data.StructLayout({"message": MESSAGE, "next": slot_bits})


def check_message_count(messages):
    """``messages`` when it is a count of outstanding messages a QP may have (its cap
    on the pool) the engine can be built for, else ``ValueError``."""
    if (not isinstance(messages, int) or not 2 <= messages <= 1 << SLOT_BITS - 1
            or messages & (messages - 1)):
        raise ValueError(f"Messages per QP must be a power of 2, 2..{1 << SLOT_BITS - 1}, "
                         f"not {messages!r}")
    return messages


def check_message_slots(slots, qps=None):
    """``slots`` when it is a pool size the engine can be built with (for ``qps`` QPs,
    each of which holds one slot empty for its next message), else ``ValueError``."""
    if (not isinstance(slots, int) or not 16 <= slots <= 1 << SLOT_BITS
            or slots & (slots - 1)):
        raise ValueError(f"Message slots must be a power of 2, 16..{1 << SLOT_BITS}, "
                         f"not {slots!r}")
    if qps is not None and slots < (1 << qp_bits_of(qps)) + 2 * SLOT_MARGIN:
        raise ValueError(f"{slots} message slots are too few for {qps} QPs: each QP holds "
                         f"one, and the pool keeps {SLOT_MARGIN} back; give at least "
                         f"{(1 << qp_bits_of(qps)) * 2}")
    return slots


class SlotPool(wiring.Component):
    """Hands out message slots, one a cycle, and takes them back.

    The first ``reserved`` slots are never handed out (each QP's first empty slot);
    the others go out in order first, then those given back (``i_free``, through a
    register: a slot given back counts from the cycle after next), oldest first.
    ``o_slot`` is the slot the next take gets; a cycle with ``i_take`` takes it, and
    ``o_slot`` shows the next one from the next cycle. ``o_available``, a register,
    says there are more than :data:`SLOT_MARGIN` slots left (counting the takes of
    the cycle before): a user that takes only while it is set, and at most
    :data:`SLOT_MARGIN` times before its takes show there, never takes from an empty
    pool. ``o_free`` counts the slots left.
    """

    def __init__(self, *, slots, reserved):
        check_message_slots(slots)
        if not 0 <= reserved <= slots - 2 * SLOT_MARGIN:
            raise ValueError(f"Reserved slots must be 0..{slots - 2 * SLOT_MARGIN}, "
                             f"not {reserved!r}")
        self._slots = slots
        self._reserved = reserved
        bits = (slots - 1).bit_length()
        super().__init__({
            "i_take": In(1),
            "o_slot": Out(bits),
            "i_free": In(stream.Signature(bits, always_ready=True)),
            "o_available": Out(1, init=1),
            "o_free": Out(range(slots + 1)),
        })

    def elaborate(self, platform):
        m = Module()
        slots, bits = self._slots, (self._slots - 1).bit_length()

        # Slots never handed out yet, in order; then a FIFO of the slots given back.
        fresh = Signal(range(slots + 1), init=self._reserved)
        m.submodules.given_back = given_back = memory.Memory(shape=bits, depth=slots,
                                                             init=[])
        write = given_back.write_port()
        read = given_back.read_port(transparent_for=(write,))
        # A slot given back passes a register first: the path of the user's decision to
        # give one back (a completion) ends there.
        freed = Signal(bits)
        freed_valid = Signal()
        m.d.sync += [freed.eq(self.i_free.p), freed_valid.eq(self.i_free.valid)]
        put = Signal(bits + 1)
        got = Signal(bits + 1)
        # Whether the fresh slots are all out, and the queue's next read position, are
        # registers beside ``fresh`` and ``got``, so that a take only picks: the read's
        # address (which its transparency compares with the write's) follows no add.
        fresh_out = Signal()                # (``reserved`` is below ``slots``)
        got_next = Signal(bits + 1, init=1)
        from_fresh = ~fresh_out
        taken_back = self.i_take & fresh_out
        taken_fresh = self.i_take & from_fresh
        m.d.comb += [
            write.addr.eq(put[:bits]),
            write.data.eq(freed),
            write.en.eq(freed_valid),
            read.addr.eq(Mux(taken_back, got_next, got)[:bits]),
            self.o_slot.eq(Mux(from_fresh, fresh, read.data)),
        ]
        m.d.sync += put.eq(put + freed_valid)
        with m.If(taken_back):
            m.d.sync += [got.eq(got_next), got_next.eq(got_next + 1)]
        with m.If(taken_fresh):
            m.d.sync += [fresh.eq(fresh + 1), fresh_out.eq(fresh == slots - 1)]

        free = self.o_free
        m.d.comb += free.eq(slots - fresh + (put - got)[:bits + 1])
        free_after = Signal(range(slots + 1))
        m.d.comb += free_after.eq(free + freed_valid - self.i_take)
        m.d.sync += self.o_available.eq(free_after > SLOT_MARGIN)
        return m
