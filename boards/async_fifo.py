"""An asynchronous FIFO whose decisions start from registers, for the CMAC's 322 MHz.

Amaranth's :class:`~amaranth.lib.fifo.AsyncFIFO` works out in one cycle whether it is
empty (a compare of two Gray-code positions), whether it reads, the next position (an
add) and that position's Gray code: four LUTs and a carry chain between registers, 3.4
ns in Yosys's 7-series timing model against the CMAC clock's 3.1 ns. This one keeps, beside
each side's position and its Gray code, the position after it and its Gray code, and
works out whether it will be full (or empty) after this cycle both for a write (read) and
for none, so that a cycle's write or read only picks among registers.
"""

from amaranth import *
from amaranth.lib import memory, wiring
from amaranth.lib.cdc import AsyncFFSynchronizer, FFSynchronizer
from amaranth.lib.wiring import In, Out

__all__ = ["RegisteredAsyncFIFO"]


def _gray(value, bits):
    """The Gray code of ``value``'s low ``bits`` bits."""
    value = value[:bits]
    return value ^ value[1:]


def _step(position, after, gray, gray_after):
    """The statements that move a position (and its Gray code) on to the one after it."""
    bits = len(position)
    return [position.eq(after), after.eq(after + 1),
            gray.eq(gray_after), gray_after.eq(_gray(after + 1, bits))]


def _binary(gray):
    """The position a Gray code stands for."""
    bits = [gray[-1]]
    for index in reversed(range(len(gray) - 1)):
        bits.insert(0, bits[0] ^ gray[index])
    return Cat(*bits)


class RegisteredAsyncFIFO(wiring.Component):
    """``depth`` entries of ``width`` bits from ``w_domain`` to ``r_domain``.

    The interface is :class:`~amaranth.lib.fifo.AsyncFIFOBuffered`'s: a write is a cycle
    with ``w_en`` and ``w_rdy``, a read one with ``r_en`` and ``r_rdy`` (``r_data`` is the
    oldest entry while ``r_rdy``; it is a register, the read port's data registered
    again, as there); ``w_rdy`` and ``r_rdy`` are registers. An entry written shows at
    ``r_rdy`` 4 cycles of ``r_domain`` or so later (the Gray code's two synchronizer
    stages, the empty flag, the output register); room given back shows at ``w_rdy``
    3 cycles of ``w_domain`` later. Each side's view of the other's position is up to
    those cycles old, so it may say full (or empty) too long, never too short. It holds
    ``depth`` entries and one more in the output register.

    Resets as Amaranth's: the write domain's reset empties the FIFO, the read side's
    position following the write side's (entries written while that is under way can be
    lost); a reset of the read domain alone keeps the entries. The Gray codes that cross
    are registers of their own domain, the synchronizers' inputs
    (``produce_cdc``, ``consume_cdc``), for the bus skew constraint of the build.
    """

    def __init__(self, *, width, depth, r_domain, w_domain):
        if not isinstance(depth, int) or depth < 4 or depth & (depth - 1):
            raise ValueError(f"Depth must be a power of 2 of at least 4, not {depth!r}")
        self._width, self._depth = width, depth
        self._r_domain, self._w_domain = r_domain, w_domain
        super().__init__({
            "w_data": In(width),
            "w_en": In(1),
            "w_rdy": Out(1),
            "r_data": Out(width),
            "r_en": In(1),
            "r_rdy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        w, r = self._w_domain, self._r_domain
        address_bits = (self._depth - 1).bit_length()
        bits = address_bits + 1           # a position: an address and a wrap bit

        m.submodules.storage = storage = memory.Memory(shape=self._width, depth=self._depth,
                                                       init=[])
        write = storage.write_port(domain=w)
        read = storage.read_port(domain=r)

        # Each side's position, the one after it, and their Gray codes; the first Gray code
        # crosses to the other side (two synchronizer stages).
        produce = Signal(bits)
        produce_next = Signal(bits, init=1)
        produce_gray = Signal(bits)
        produce_gray_next = Signal(bits, init=1)
        consume = Signal(bits, reset_less=True)
        consume_next = Signal(bits, init=1, reset_less=True)
        consume_gray = Signal(bits, reset_less=True)
        consume_gray_next = Signal(bits, init=1, reset_less=True)
        produce_at_r = Signal(bits)
        consume_at_w = Signal(bits)
        m.submodules.produce_cdc = FFSynchronizer(produce_gray, produce_at_r, o_domain=r)
        m.submodules.consume_cdc = FFSynchronizer(consume_gray, consume_at_w, o_domain=w)

        # The write side: whether it is full is a register, worked out for the cycle after
        # with a write and without, against the reader's position as synchronized (an older
        # one only makes it full longer): full when the position written next is the
        # reader's a lap on.
        full = Signal()

        def full_at(gray):
            return Cat(consume_at_w[:-2], ~consume_at_w[-2:]) == gray

        writing = self.w_en & ~full
        m.d.comb += [
            self.w_rdy.eq(~full),
            write.addr.eq(produce[:address_bits]),
            write.data.eq(self.w_data),
            write.en.eq(writing),
        ]
        m.d[w] += full.eq(Mux(writing, full_at(produce_gray_next), full_at(produce_gray)))
        with m.If(writing):
            m.d[w] += _step(produce, produce_next, produce_gray, produce_gray_next)

        # The read side, alike: whether it is empty is a register worked out with a read
        # and without. The read port is addressed with the position the cycle leaves, so its
        # data is the oldest entry; the output register takes it when it is free or read.
        empty = Signal(init=1)
        taking = self.r_en | ~self.r_rdy
        reading = taking & ~empty
        m.d.comb += read.addr.eq(Mux(reading, consume_next, consume)[:address_bits])
        m.d[r] += empty.eq(Mux(reading, consume_gray_next == produce_at_r,
                               consume_gray == produce_at_r))
        with m.If(taking):
            m.d[r] += [self.r_data.eq(read.data), self.r_rdy.eq(~empty)]

        # The write domain's reset reaches the reader asynchronously (``following``); while it
        # lasts, the reader's position is the writer's (empty), and for a cycle after it the
        # position after that is worked out from the reader's own register.
        following = Signal()
        m.submodules.reset_cdc = AsyncFFSynchronizer(
            ResetSignal(w, allow_reset_less=True), following, o_domain=r)
        settling = Signal()
        m.d[r] += settling.eq(following)
        with m.If(following):
            m.d[r] += [
                consume.eq(_binary(produce_at_r)),
                consume_gray.eq(produce_at_r),
            ]
        with m.If(following | settling):
            m.d[r] += [
                consume_next.eq(consume + 1),
                consume_gray_next.eq(_gray(consume + 1, bits)),
                empty.eq(1),
            ]
        with m.Elif(reading):
            m.d[r] += _step(consume, consume_next, consume_gray, consume_gray_next)
        return m
