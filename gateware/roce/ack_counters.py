"""The reliability engine's counts of what arrives for each QP apart from its ACK
handler: acknowledgements by their verdict, acknowledgements dropped for their ICRC,
and CNPs."""

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .ack import AETH_NAK, AETH_RNR_NAK
from .ack_intake import ACK_VERDICT
from .qp_context import INTAKE_COUNTERS, ContextMemory, qp_bits_of
from .requests import QP_COUNTERS, QP_INDEX_BITS, check_qp_count

__all__ = ["AckCounters", "ACK_COUNTS", "cleared_flags"]

#: NAK codes (AETH syndrome bits 4:0) and the counter of each; the codes IBTA reserves
#: count as ``naks_operational``.
_NAK_COUNTERS = {0: "naks_sequence", 1: "naks_invalid", 2: "naks_access",
                 3: "naks_operational", 4: "naks_invalid"}

#: The counters kept here, as ``QP_COUNTERS`` names them.
ACK_COUNTS = data.StructLayout({
    name: QP_COUNTERS.members[name]
    for name in ("icrc_errors", "cnps", *INTAKE_COUNTERS.members)})


def cleared_flags(entries):
    """The flags (one bit per QP) of the QPs whose counts read as 0."""
    return data.StructLayout({"icrc": entries, "cnp": entries, "intake": entries})


class AckCounters(wiring.Component):
    """Counts, per QP, ``i_icrc_error`` (acknowledgements dropped for their ICRC),
    ``i_cnp`` (CNPs), and the intake's verdicts ``i_verdict`` (``acks`` taken,
    ``acks_dropped``, and the NAKs taken by their kind), each in the cycle it comes.

    A QP's counts read as 0 while its flag of ``i_cleared`` is set (the QP was set
    again since the count was last written; :class:`QpFlags` keeps the flags): so a
    reset of a QP clears its counts without a write here.

    ``status_qp[n]`` → ``o_status[n]``: that QP's counts, 1 cycle later.
    """

    def __init__(self, *, qps, ports):
        self._qps = check_qp_count(qps)
        self._ports = ports
        entries = 1 << qp_bits_of(qps)
        super().__init__({
            "i_icrc_error": In(stream.Signature(QP_INDEX_BITS, always_ready=True)),
            "i_cnp": In(stream.Signature(QP_INDEX_BITS, always_ready=True)),
            "i_verdict": In(stream.Signature(ACK_VERDICT, always_ready=True)),
            "i_cleared": In(cleared_flags(entries)),
            "status_qp": In(QP_INDEX_BITS).array(ports),
            "o_status": Out(ACK_COUNTS).array(ports),
        })

    def elaborate(self, platform):
        m = Module()
        qp_bits = qp_bits_of(self._qps)
        entries = 1 << qp_bits
        icrc_error, cnp, verdict = self.i_icrc_error, self.i_cnp, self.i_verdict

        def flag_of(flag, qp):
            return flag.bit_select(qp[:qp_bits], 1)

        # Each count: its memory, read combinationally by its writer and registered by
        # each status port.
        stores = {}
        for name, shape in (("icrc", 32), ("cnp", 32), ("intake", INTAKE_COUNTERS)):
            m.submodules[name] = stores[name] = ContextMemory(
                shape=shape, depth=entries, reads=("comb", *["sync"] * self._ports),
                addr_bits=QP_INDEX_BITS)

        # What each verdict adds to: taken or dropped, and a NAK taken by its kind.
        nak_kind, nak_code = verdict.p.syndrome[5:7], verdict.p.syndrome[:5]
        verdict_counts = {name: Signal(name=f"verdict_{name}")
                          for name in INTAKE_COUNTERS.members}
        nak_codes = {name: [code for code, counter in _NAK_COUNTERS.items() if counter == name]
                     for name in set(_NAK_COUNTERS.values())}
        m.d.comb += [
            verdict_counts["acks"].eq(verdict.p.taken),
            verdict_counts["acks_dropped"].eq(~verdict.p.taken),
            verdict_counts["naks_rnr"].eq(verdict.p.taken & (nak_kind == AETH_RNR_NAK)),
        ]
        for name, codes in nak_codes.items():
            matches = [nak_code == code for code in codes]
            if name == "naks_operational":      # and the codes IBTA reserves
                matches.append(nak_code > max(_NAK_COUNTERS))
            m.d.comb += verdict_counts[name].eq(
                verdict.p.taken & (nak_kind == AETH_NAK) & Cat(matches).any())
        for name, counted, qp in (("icrc", icrc_error.valid, icrc_error.p),
                                  ("cnp", cnp.valid, cnp.p),
                                  ("intake", verdict.valid, verdict.p.qp)):
            store = stores[name]
            before, write = store.r[0], store.w
            counts_before = Mux(flag_of(self.i_cleared[name], qp), 0, before.data)
            m.d.comb += [
                before.addr.eq(qp),
                write.addr.eq(qp),
                write.en.eq(counted),
            ]
            if name == "intake":
                counts_before = data.View(INTAKE_COUNTERS, counts_before)
                for counter, strobe in verdict_counts.items():
                    m.d.comb += write.data[counter].eq(counts_before[counter] + strobe)
            else:
                m.d.comb += write.data.eq(counts_before + 1)

        # The counts for the status ports, 0 while the QP was set again since their last
        # write.
        for port, (select, status) in enumerate(zip(self.status_qp, self.o_status,
                                                    strict=True)):
            for name, names in (("icrc", ["icrc_errors"]), ("cnp", ["cnps"]),
                                ("intake", list(INTAKE_COUNTERS.members))):
                reader = stores[name].r[1 + port]
                zero = Signal()
                m.d.comb += reader.addr.eq(select)
                m.d.sync += zero.eq(flag_of(self.i_cleared[name], select))
                for counter in names:
                    value = reader.data[counter] if len(names) > 1 else reader.data
                    m.d.comb += status[counter].eq(Mux(zero, 0, value))
        return m

