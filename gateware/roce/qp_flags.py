"""The reliability engine's 1-bit flags of every QP, in memories, the writes of each
part to them, and the QPs an engine write leaves due for a resend."""

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .flag_memory import FlagMemory, write_flags
from .qp_context import FLAGS, QP_FLAGS, lookup, qp_bits_of
from .requests import QP_INDEX_BITS, check_qp_count

__all__ = ["QpFlags", "ENGINE_FLAGS", "ENGINE_FLAG_WRITES", "due_for_resend"]

#: The flags the ACK handler writes, all of one QP.
ENGINE_FLAGS = ("error", "resend", "rnr_wait", "retrying")

#: What the ACK handler writes to the flags of its QP in a cycle: each flag with ``en``
#: set takes ``value``.
ENGINE_FLAG_WRITES = data.StructLayout({
    "qp": QP_INDEX_BITS,
    **{name: data.StructLayout({"en": 1, "value": 1}) for name in ENGINE_FLAGS},
})


def due_for_resend(flags):
    """Whether a QP's flags (a :data:`QP_FLAGS` value) say a go-back-N resend of it is
    due now: ``resend`` set, and neither in an RNR wait nor in ERROR."""
    return flags.resend & ~flags.rnr_wait & ~flags.error


class QpFlags(wiring.Component):
    """One bit per QP for each of :data:`FLAGS`, in memories (:class:`FlagMemory`), read
    by each part through a port of its own (``r[n]``, of the kind ``reads[n]`` names).

    ``error``: the QP is in ERROR. ``resend``: a go-back-N resend is due.
    ``rnr_wait``: the QP's timer is an RNR wait, not the ACK timeout. ``retrying``: a
    resend from the oldest unacknowledged packet started (after a NAK, an RNR NAK or a
    timeout) and nothing was acknowledged since. (Whether a QP's timer started is the
    timer sweep's own flag.)

    Writers, each setting or clearing one QP's bit; of two in one cycle for one bit,
    the later in this list wins: ``i_resend_taken`` clears ``resend``; ``i_engine``
    writes the flags of :data:`ENGINE_FLAGS` of its QP; ``i_reset`` clears every flag
    of its QP.

    ``o_due`` names, a cycle after it, the QP of an engine write that leaves it due for
    a resend (:func:`due_for_resend`, all of the cycle's writes counted; a registered
    read of its flags): only the engine's writes make a QP due.
    """

    def __init__(self, *, qps, reads):
        self._qps = check_qp_count(qps)
        self._reads = tuple(reads)
        super().__init__({
            "i_engine": In(ENGINE_FLAG_WRITES),
            "i_resend_taken": In(stream.Signature(QP_INDEX_BITS, always_ready=True)),
            "i_reset": In(stream.Signature(QP_INDEX_BITS, always_ready=True)),
            "r": In(lookup(QP_FLAGS, QP_INDEX_BITS)).array(len(self._reads)),
            "o_due": Out(stream.Signature(QP_INDEX_BITS, always_ready=True)),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.memory = store = FlagMemory(
            flags=FLAGS, depth=1 << qp_bits_of(self._qps), addr_bits=QP_INDEX_BITS,
            writers=(("resend_taken", ("resend",)), ("engine", ENGINE_FLAGS),
                     ("reset", FLAGS)),
            reads=(*self._reads, "transparent"))
        engine, reset = self.i_engine, self.i_reset
        m.d.comb += [
            *write_flags(store.w_resend_taken, self.i_resend_taken.p,
                         self.i_resend_taken.valid, 0),
            *write_flags(store.w_reset, reset.p, reset.valid, 0),
            store.w_engine.addr.eq(engine.qp),
        ]
        for name in ENGINE_FLAGS:
            m.d.comb += getattr(store.w_engine, name).eq(engine[name])
        for index, port in enumerate(self.r):
            reader = store.r[index]
            m.d.comb += [reader.addr.eq(port.addr), port.data.eq(reader.data)]

        # Whether the engine's write leaves its QP due: its flags as the cycle's writes
        # leave them, a cycle later.
        after = store.r[len(self._reads)]
        wrote = Signal()
        m.d.comb += after.addr.eq(engine.qp)
        m.d.sync += [
            wrote.eq(Cat(engine[name].en for name in ENGINE_FLAGS).any()),
            self.o_due.p.eq(engine.qp),
        ]
        m.d.comb += self.o_due.valid.eq(wrote & due_for_resend(after.data))
        return m
