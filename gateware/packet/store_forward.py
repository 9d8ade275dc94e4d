from amaranth import *
from amaranth.lib import fifo, wiring
from amaranth.lib.wiring import In, Out

from ..stream import BEAT_BYTES, NO_META, beat_layout, packet_signature

__all__ = ["PacketStoreForward"]


class PacketStoreForward(wiring.Component):
    """Store-and-forward buffer that starts a packet only once all of it is in, so that
    its output never pauses inside a packet.

    A MAC such as the CMAC takes a gap in ``valid`` inside a frame for an
    underrun and aborts the frame; this block sits in front of it. Unlike
    :class:`~.fifo.PacketFIFO` it drops nothing: its input waits (``ready``
    low) while the buffer is full. A packet longer than the buffer is passed
    on from the cycle after the buffer is full, as it comes, and may then pause.

    Latency: a packet is offered in the cycle after its last beat went in.
    Throughput: one beat per cycle in and out.

    Parameters
    ----------
    depth : int
        Capacity in beats; make it at least the longest packet (512 beats take
        a 9000-byte jumbo frame and another frame behind it).
    """

    def __init__(self, meta=NO_META, *, depth=512, width=BEAT_BYTES):
        if not isinstance(depth, int) or depth < 2:
            raise ValueError(f"Depth must be an integer of at least 2, not {depth!r}")
        self._depth = depth
        self._meta = meta
        self._width = width
        super().__init__({
            "i": In(packet_signature(meta, width=width)),
            "o": Out(packet_signature(meta, width=width)),
        })

    @property
    def depth(self):
        return self._depth

    def elaborate(self, platform):
        m = Module()
        layout = beat_layout(self._meta, width=self._width)
        m.submodules.beats = beats = fifo.SyncFIFOBuffered(width=layout.size, depth=self._depth)
        head = layout(beats.r_data)

        # Whole packets in the buffer (the one at the head included). Packets leave in
        # order, so while this is not zero the head packet is whole. Whether it is not
        # zero is a register of its own, set from the count's next value (the same
        # cycles), so the count's compare does not chain with the output: a last beat
        # leaves only once it is in, so while ``left`` the count is at least 1.
        whole = Signal(range(self._depth + 1))
        any_whole = Signal()
        arrived = self.i.valid & self.i.ready & self.i.p.last
        left = self.o.valid & self.o.ready & head.last
        m.d.sync += [
            whole.eq(whole + arrived - left),
            any_whole.eq(arrived | (whole > 1) | (any_whole & ~left)),
        ]

        # Once a packet starts, its beats go out whatever the count says.
        sending = Signal()
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += sending.eq(~head.last)
        # A packet longer than the buffer goes once the buffer is full (seen a cycle
        # later, from a register: the count's compare does not chain with the output).
        full = Signal()
        m.d.sync += full.eq(beats.level == self._depth)
        release = any_whole | sending | full

        m.d.comb += [
            beats.w_data.eq(self.i.p),
            beats.w_en.eq(self.i.valid),
            self.i.ready.eq(beats.w_rdy),
            self.o.p.eq(head),
            self.o.valid.eq(beats.r_rdy & release),
            beats.r_en.eq(self.o.ready & release),
        ]
        return m
