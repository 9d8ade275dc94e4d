from amaranth import *
from amaranth.lib import memory, stream, wiring
from amaranth.lib.wiring import In, Out

from ..stream import BEAT_BYTES
from .descriptor import BUFFER_READ, buffer_beat, buffer_write
from .page_pool import page_offset_bits, translation
from .qp_context import qp_bits_of

__all__ = ["RetransmitBuffer", "READ_LATENCY"]

#: Cycles from a beat's read to its data on ``o_read``.
READ_LATENCY = 4


class RetransmitBuffer(wiring.Component):
    """The payload of every unacknowledged packet, in ``pages`` pages of 4 KiB in one
    memory (UltraRAM on UltraScale+: a 64-byte beat is 8 URAMs wide, 4096 beats deep),
    which the QPs' rings of ``ring_beats`` beats map to through their page tables
    (:class:`PagePool`, read through ``translate``: ``[0]`` for writes, ``[1]`` for
    reads).

    ``i_write`` stores a beat at an address (QP index above ring offset, as the
    planner makes it), a cycle later, in the page its ring's page maps to. ``i_read``
    asks for ``beats`` (1 or more) beats from an address, which ``o_read`` returns in
    order, ``last`` on the final one; the ring offset wraps within the QP's ring, and
    each beat is looked up in its page table. Read latency :data:`READ_LATENCY`
    cycles, then a beat per cycle: the page table's registered read, the memory's
    registered read and two output registers, which an UltraRAM array of this size
    needs at 250 MHz (Vivado puts them in the URAMs' output registers and cascade
    pipeline; 512 pages are 8 URAMs wide and cascades of 8 deep). While ``o_read`` is
    held the whole pipeline holds.
    """

    def __init__(self, *, qps, pages, ring_beats, width=BEAT_BYTES):
        if ring_beats & (ring_beats - 1):
            raise ValueError(f"Ring beats must be a power of 2, not {ring_beats!r}")
        self._qp_bits = qp_bits_of(qps)
        self._ring_bits = (ring_beats - 1).bit_length()
        self._offset_bits = page_offset_bits(width)
        self._page_bits = max((pages - 1).bit_length(), 1)
        self._pages = pages
        self._width = width
        table_bits = self._qp_bits + self._ring_bits - self._offset_bits
        super().__init__({
            "i_write": In(stream.Signature(buffer_write(width), always_ready=True)),
            "i_read": In(stream.Signature(BUFFER_READ)),
            "o_read": Out(stream.Signature(buffer_beat(width))),
            "translate": Out(translation(table_bits, self._page_bits)).array(2),
        })

    @property
    def depth(self):
        return self._pages << self._offset_bits

    def elaborate(self, platform):
        m = Module()
        ring_bits, qp_bits, offset_bits = self._ring_bits, self._qp_bits, self._offset_bits
        m.submodules.memory = store = memory.Memory(
            shape=8 * self._width, depth=self.depth, init=[], attrs={"ram_style": "ultra"})
        write = store.write_port()
        read = store.read_port(transparent_for=())

        def table_address(qp, offset):
            return Cat(offset[offset_bits:ring_bits], qp[:qp_bits])

        # Writes: the page table's read, then the beat into its page.
        written, reading = self.translate
        address = self.i_write.p.address
        write_offset = Signal(offset_bits)
        m.d.comb += [
            written.addr.eq(table_address(address[ring_bits:], address)),
            written.en.eq(1),
            write.addr.eq(Cat(write_offset, written.data)),
        ]
        m.d.sync += [
            write_offset.eq(address[:offset_bits]),
            write.data.eq(self.i_write.p.data),
            write.en.eq(self.i_write.valid),
        ]

        offset = Signal(ring_bits)
        qp = Signal(max(qp_bits, 1))
        left = Signal.like(self.i_read.p.beats)
        active = left != 0
        free = ~self.o_read.valid | self.o_read.ready
        issue = active & free
        read_offset = Signal(offset_bits)
        m.d.comb += [
            reading.addr.eq(table_address(qp, offset)),
            reading.en.eq(free),
            read.addr.eq(Cat(read_offset, reading.data)),
            read.en.eq(free),
            self.i_read.ready.eq(~active),
        ]
        # The read's valid and last travel with its data through the output registers.
        valid = Signal(READ_LATENCY, name="pipeline_valid")
        last = Signal(READ_LATENCY, name="pipeline_last")
        data = [read.data]
        with m.If(free):
            m.d.sync += [
                read_offset.eq(offset[:offset_bits]),
                valid.eq(Cat(issue, valid)),
                last.eq(Cat(left == 1, last)),
            ]
            for stage in range(READ_LATENCY - 2):
                data.append(Signal.like(read.data, name=f"read_data_{stage + 1}"))
                m.d.sync += data[-1].eq(data[-2])
        m.d.comb += [
            self.o_read.valid.eq(valid[-1]),
            self.o_read.p.last.eq(last[-1]),
            self.o_read.p.data.eq(data[-1]),
        ]
        with m.If(issue):
            m.d.sync += [
                offset.eq(offset + 1),
                left.eq(left - 1),
            ]
        with m.If(self.i_read.valid & self.i_read.ready):
            m.d.sync += [
                offset.eq(self.i_read.p.address[:ring_bits]),
                qp.eq(self.i_read.p.address[ring_bits:]),
                left.eq(self.i_read.p.beats),
            ]
        return m
