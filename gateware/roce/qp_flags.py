"""The reliability engine's 1-bit flags of every QP, in registers that every part reads
at once, and the writes of each part to them."""

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .qp_context import FLAGS, qp_bits_of
from .requests import QP_INDEX_BITS, check_qp_count

__all__ = ["QpFlags", "ENGINE_FLAGS", "ENGINE_FLAG_WRITES", "VIEW_FLAGS"]

#: The flags the ACK handler writes, all of one QP.
ENGINE_FLAGS = ("error", "resend", "rnr_wait", "retrying", "from_sent")

#: What the ACK handler writes to the flags of its QP in a cycle: each flag with ``en``
#: set takes ``value``.
ENGINE_FLAG_WRITES = data.StructLayout({
    "qp": QP_INDEX_BITS,
    **{name: data.StructLayout({"en": 1, "value": 1}) for name in ENGINE_FLAGS},
})

#: The flags of a QP that decide whether the planner may send from it.
VIEW_FLAGS = data.StructLayout({"error": 1, "rnr_wait": 1, "resend": 1})


class QpFlags(wiring.Component):
    """A register of one bit per QP for each of :data:`FLAGS`, shown whole on
    ``o_flags`` (as of the cycle before: the writes of a cycle show from the next).

    ``error``: the QP is in ERROR. ``resend``: a go-back-N resend is due.
    ``rnr_wait``: the QP's timer is an RNR wait, not the ACK timeout. ``retrying``: a
    resend from the oldest unacknowledged packet started (after a NAK, an RNR NAK or a
    timeout) and nothing was acknowledged since. ``from_sent``: the ACK timer runs from
    the packet sent when none was outstanding. ``icrc_cleared`` (``cnp_cleared``,
    ``intake_cleared``): the QP was set again since its count of ICRC errors (of CNPs,
    of acknowledgements) was last written, so the count reads as 0.

    Writers, each setting or clearing one QP's bit; of two in one cycle for one bit,
    the later in this list wins: ``i_timer_from_sent`` sets ``from_sent``;
    ``i_resend_taken`` clears ``resend``; ``i_engine`` writes the flags of
    :data:`ENGINE_FLAGS` of its QP; ``i_icrc_error``, ``i_cnp`` and ``i_verdict`` clear
    ``icrc_cleared``, ``cnp_cleared`` and ``intake_cleared``; ``i_reset`` clears every
    flag of its QP but those three, which it sets.

    ``view_qp[n]`` → ``o_view[n]``, combinationally: that QP's flags of
    :data:`VIEW_FLAGS` as this cycle's writes leave them (as ``o_flags`` shows them
    in the next cycle).
    """

    def __init__(self, *, qps, views=2):
        self._qps = check_qp_count(qps)
        entries = 1 << qp_bits_of(qps)
        super().__init__({
            "i_engine": In(ENGINE_FLAG_WRITES),
            "i_resend_taken": In(stream.Signature(QP_INDEX_BITS, always_ready=True)),
            "i_timer_from_sent": In(stream.Signature(QP_INDEX_BITS, always_ready=True)),
            "i_icrc_error": In(stream.Signature(QP_INDEX_BITS, always_ready=True)),
            "i_cnp": In(stream.Signature(QP_INDEX_BITS, always_ready=True)),
            "i_verdict": In(stream.Signature(QP_INDEX_BITS, always_ready=True)),
            "i_reset": In(stream.Signature(QP_INDEX_BITS, always_ready=True)),
            "o_flags": Out(data.StructLayout({name: entries for name in FLAGS})),
            "view_qp": In(QP_INDEX_BITS).array(views),
            "o_view": Out(VIEW_FLAGS).array(views),
        })

    def elaborate(self, platform):
        m = Module()
        qp_bits = qp_bits_of(self._qps)
        entries = 1 << qp_bits
        engine, reset = self.i_engine, self.i_reset
        cleared = (reset.valid, 0, reset.p)
        set_again = (reset.valid, 1, reset.p)

        def by_engine(name):
            return (engine[name].en, engine[name].value, engine.qp)

        writes = {
            "error": (by_engine("error"), cleared),
            "resend": ((self.i_resend_taken.valid, 0, self.i_resend_taken.p),
                       by_engine("resend"), cleared),
            "rnr_wait": (by_engine("rnr_wait"), cleared),
            "retrying": (by_engine("retrying"), cleared),
            "from_sent": ((self.i_timer_from_sent.valid, 1, self.i_timer_from_sent.p),
                          by_engine("from_sent"), cleared),
            "icrc_cleared": ((self.i_icrc_error.valid, 0, self.i_icrc_error.p), set_again),
            "cnp_cleared": ((self.i_cnp.valid, 0, self.i_cnp.p), set_again),
            "intake_cleared": ((self.i_verdict.valid, 0, self.i_verdict.p), set_again),
        }
        for name in FLAGS:
            flag = self.o_flags[name]
            value = flag
            for enable, bit, index in writes[name]:
                # One-hot as a decoder (a LUT per bit), not a shifter of a 1.
                mask = Mux(enable, Cat(index[:qp_bits] == entry for entry in range(entries)), 0)
                value = (value & ~mask) | Mux(bit, mask, 0)
            m.d.sync += flag.eq(value)

        for index, view in zip(self.view_qp, self.o_view, strict=True):
            for name in VIEW_FLAGS.members:
                value = self.o_flags[name].bit_select(index[:qp_bits], 1)
                for enable, bit, written in writes[name]:
                    value = Mux(enable & (written[:qp_bits] == index[:qp_bits]), bit, value)
                m.d.comb += view[name].eq(value)
        return m
