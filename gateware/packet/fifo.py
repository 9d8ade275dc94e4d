from amaranth import *
from amaranth.lib import data, fifo, memory, wiring
from amaranth.lib.wiring import In, Out

from ..stream import BEAT_BYTES, keep_count, keep_mask, meta_with, packet_signature

__all__ = ["PacketFIFO"]


class PacketFIFO(wiring.Component):
    """Store-and-forward FIFO of whole packets that drops bad ones.

    Never stalls its input (``i`` is always ready). A packet is written as it
    arrives and released to ``o`` only once its last beat is in; it is
    dropped instead when ``i_error`` is high with its last beat (the CMAC's
    ``tuser``), when it does not fit in the free space, or when ``max_packets``
    packets are already waiting. Each drop pulses ``o_error_drop`` or
    ``o_overflow_drop`` for a cycle.

    The output meta is the input meta of the packet's first beat plus
    ``length`` (or ``length_field``), the packet's byte count, known with the first output beat
    (counted as the stream's rule has it: the beats before the last whole, the last one's
    ``keep`` its bytes).
    ``keep`` on the output is rebuilt from that length, so it is always
    contiguous. Latency: two cycles from the last input beat to the first
    output beat.

    Parameters
    ----------
    depth : int
        Capacity in beats (a power of two); the longest packet it passes is
        ``depth`` beats.
    """

    def __init__(self, meta, *, depth, max_packets=32, width=BEAT_BYTES, length_bits=16,
                 length_field="length"):
        if not isinstance(depth, int) or depth < 2 or depth & (depth - 1):
            raise ValueError(f"Depth must be a power of two of at least 2, not {depth!r}")
        if not isinstance(max_packets, int) or max_packets < 1:
            raise ValueError(f"max_packets must be a positive integer, not {max_packets!r}")
        self._depth = depth
        self._max_packets = max_packets
        self._width = width
        self._meta = meta
        self._length_bits = length_bits
        super().__init__({
            "i": In(packet_signature(meta, width=width, always_ready=True)),
            "i_error": In(1),
            "o": Out(packet_signature(meta_with(meta, **{length_field: length_bits}), width=width)),
            "o_error_drop": Out(1),
            "o_overflow_drop": Out(1),
        })

    @property
    def depth(self):
        return self._depth

    def elaborate(self, platform):
        m = Module()
        width, depth = self._width, self._depth
        i, o = self.i, self.o

        m.submodules.beats = beats = memory.Memory(shape=8 * width, depth=depth, init=[])
        write = beats.write_port()
        read = beats.read_port(transparent_for=(write,))

        # ``next`` keeps the reader aligned even when a packet's beats and length disagree.
        descriptor = data.StructLayout({
            "meta": self._meta, "length": self._length_bits, "next": range(2 * depth)})
        # One spare entry: SyncFIFOBuffered's ``w_rdy`` can be low for a cycle with fewer
        # than ``depth`` entries in it, so admission goes by ``level`` instead.
        m.submodules.descriptors = descriptors = fifo.SyncFIFOBuffered(
            width=descriptor.size, depth=self._max_packets + 1)

        # Pointers count beats modulo 2 × depth, so full and empty differ.
        wr_ptr = Signal(range(2 * depth))       # next beat to write
        start = Signal(range(2 * depth))        # first beat of the packet being written
        rd_ptr = Signal(range(2 * depth))       # beat on the output
        first = Signal(init=1)
        overflow = Signal()
        length = Signal(self._length_bits)
        first_meta = Signal(self._meta)

        used = (wr_ptr - rd_ptr)[:len(wr_ptr)]
        room = used < depth
        meta = Mux(first, Value.cast(i.p.meta), first_meta)
        # The packet's length with this beat. Every beat before the last is whole, so
        # ``length`` is whole beats: a whole beat makes it the length a beat on, kept in a
        # register (``length_on``), and a last beat that is not puts its byte count in the
        # low bits. So no add follows the count of ``keep``'s lanes.
        beat_bits = (width - 1).bit_length()
        length_on = Signal(self._length_bits + 1, init=width)
        base = Mux(first, 0, length)
        base_on = Mux(first, width, length_on)
        whole = i.p.keep[-1]
        beat_count = keep_count(i.p.keep)[:beat_bits]
        total_wide = Mux(whole, base_on, Cat(beat_count, base[beat_bits:]))
        total = total_wide[:self._length_bits]
        if depth * width < 1 << self._length_bits:
            # A packet reaches 2^length_bits bytes only past ``depth`` beats, where it
            # no longer has room: no need to look at the count's carry.
            too_long = C(0)
        else:
            too_long = total_wide[self._length_bits:].any()
        # Packets waiting (the descriptor FIFO's level), and whether that is
        # ``max_packets``, in registers: the admission does not wait on the FIFO's count.
        waiting = Signal(range(self._max_packets + 2))
        packets_full = Signal()
        waiting_next = waiting + descriptors.w_en - descriptors.r_en
        # (``waiting_next >= max_packets``, as a choice between compares of ``waiting``,
        # so that the count's sum does not chain with the read of a descriptor)
        full_from = {change: waiting >= self._max_packets - change for change in (-1, 0, 1)}
        m.d.sync += [
            waiting.eq(waiting_next),
            packets_full.eq(Mux(descriptors.w_en,
                                Mux(descriptors.r_en, full_from[0], full_from[1]),
                                Mux(descriptors.r_en, full_from[-1], full_from[0]))),
        ]

        m.d.comb += [
            write.addr.eq(wr_ptr),
            write.data.eq(i.p.data),
        ]
        with m.If(i.valid):
            m.d.sync += [
                first.eq(i.p.last),
                length.eq(total),
                length_on.eq(Mux(whole, base_on + width, Cat(beat_count, base_on[beat_bits:]))),
            ]
            with m.If(first):
                m.d.sync += first_meta.eq(i.p.meta)
            full = ~room | overflow | too_long
            with m.If(~full):
                m.d.comb += write.en.eq(1)
                m.d.sync += wr_ptr.eq(wr_ptr + 1)
            with m.If(i.p.last):
                m.d.sync += overflow.eq(0)
                with m.If(self.i_error):
                    m.d.comb += self.o_error_drop.eq(1)
                    m.d.sync += wr_ptr.eq(start)
                with m.Elif(full | packets_full):
                    m.d.comb += self.o_overflow_drop.eq(1)
                    m.d.sync += wr_ptr.eq(start)
                with m.Else():
                    m.d.comb += [
                        descriptors.w_en.eq(1),
                        descriptors.w_data.eq(Cat(meta, total, (wr_ptr + 1)[:len(wr_ptr)])),
                    ]
                    m.d.sync += start.eq(wr_ptr + 1)
            with m.Else():
                m.d.sync += overflow.eq(full)

        # Output: the read port always fetches the beat to show next cycle.
        sent = Signal(self._length_bits)
        head = data.View(descriptor, descriptors.r_data)
        remaining = Signal.like(head.length)
        m.d.comb += remaining.eq(head.length - sent)
        # Whether the beat on the output is its packet's last (``remaining <= width``): on
        # a first beat a compare of the head's length with a constant; after it, a register
        # set from the count's next value (same cycles), so the subtraction does not chain
        # with the descriptor FIFO's read and the count of waiting packets.
        out_first = Signal(init=1)
        later_last = Signal()
        last = Mux(out_first, head.length <= width, later_last)
        advance = o.valid & o.ready
        m.d.comb += [
            read.addr.eq(Mux(advance, Mux(last, head.next, rd_ptr + 1), rd_ptr)),
            o.valid.eq(descriptors.r_rdy),
            o.p.data.eq(read.data),
            o.p.keep.eq(keep_mask(remaining, width)),
            o.p.last.eq(last),
            o.p.meta.eq(Cat(Value.cast(head.meta), head.length)),
        ]
        with m.If(advance):
            m.d.sync += [
                rd_ptr.eq(Mux(last, head.next, rd_ptr + 1)),
                sent.eq(Mux(last, 0, sent + width)),
                out_first.eq(last),
                later_last.eq(remaining <= 2 * width),
            ]
            m.d.comb += descriptors.r_en.eq(last)

        return m
