"""The reliability engine's counts of what arrives for each QP apart from its ACK
handler: acknowledgements by their verdict, acknowledgements dropped for their ICRC,
and CNPs."""

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from .ack import AETH_NAK, AETH_RNR_NAK
from .ack_intake import ACK_VERDICT
from .flag_memory import FlagMemory, write_flags
from .qp_context import INTAKE_COUNTERS, ContextMemory, qp_bits_of
from .requests import QP_COUNTERS, QP_INDEX_BITS, check_qp_count

__all__ = ["AckCounters", "ACK_COUNTS", "COUNT_FLAGS"]

#: The counts that a reset clears by a flag per QP each (of ``icrc_errors``, ``cnps``, and
#: the intake's verdicts).
COUNT_FLAGS = ("icrc", "cnp", "intake")

#: NAK codes (AETH syndrome bits 4:0) and the counter of each; the codes IBTA reserves
#: count as ``naks_operational``.
_NAK_COUNTERS = {0: "naks_sequence", 1: "naks_invalid", 2: "naks_access",
                 3: "naks_operational", 4: "naks_invalid"}

#: The counters kept here, as ``QP_COUNTERS`` names them.
ACK_COUNTS = data.StructLayout({
    name: QP_COUNTERS.members[name]
    for name in ("icrc_errors", "cnps", *INTAKE_COUNTERS.members)})


class AckCounters(wiring.Component):
    """Counts, per QP, ``i_icrc_error`` (acknowledgements dropped for their ICRC),
    ``i_cnp`` (CNPs), and the intake's verdicts ``i_verdict`` (``acks`` taken,
    ``acks_dropped``, and the NAKs taken by their kind), each a cycle after it comes:
    the event is registered and its QP's count read as it comes (a registered read that
    shows the write of that cycle), so the count's add starts from registers.

    A QP set again (``i_reset``) has its counts read as 0 until they are next written:
    each count has a flag per QP, set by the reset and cleared by the count's write
    (:class:`FlagMemory`), so a reset clears the counts without a write of theirs. An
    event in the cycle of its QP's reset is not counted.

    ``status_qp[n]`` → ``o_status[n]``: that QP's counts, 1 cycle later, with the
    events up to 2 cycles before the request.
    """

    def __init__(self, *, qps, ports):
        self._qps = check_qp_count(qps)
        self._ports = ports
        super().__init__({
            "i_icrc_error": In(stream.Signature(QP_INDEX_BITS, always_ready=True)),
            "i_cnp": In(stream.Signature(QP_INDEX_BITS, always_ready=True)),
            "i_verdict": In(stream.Signature(ACK_VERDICT, always_ready=True)),
            "i_reset": In(stream.Signature(QP_INDEX_BITS, always_ready=True)),
            "status_qp": In(QP_INDEX_BITS).array(ports),
            "o_status": Out(ACK_COUNTS).array(ports),
        })

    def elaborate(self, platform):
        m = Module()
        entries = 1 << qp_bits_of(self._qps)
        icrc_error, cnp, verdict, reset = (self.i_icrc_error, self.i_cnp, self.i_verdict,
                                           self.i_reset)
        # Whether each count of a QP reads as 0: read by the count's writer, then by the
        # status ports; set by a reset, cleared by the count's write.
        m.submodules.cleared = cleared = FlagMemory(
            flags=COUNT_FLAGS, depth=entries, addr_bits=QP_INDEX_BITS,
            writers=(*((name, (name,)) for name in COUNT_FLAGS), ("reset", COUNT_FLAGS)),
            reads=("transparent",) * (len(COUNT_FLAGS) + self._ports))
        m.d.comb += write_flags(cleared.w_reset, reset.p, reset.valid, 1)

        # Each count: its memory, read by its writer as the event comes and by each status
        # port (registered reads that show the writes of their cycle).
        stores = {}
        for name, shape in (("icrc", 32), ("cnp", 32), ("intake", INTAKE_COUNTERS)):
            m.submodules[name] = stores[name] = ContextMemory(
                shape=shape, depth=entries, reads=("transparent",) * (1 + self._ports),
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
        strobes = Signal(data.StructLayout({name: 1 for name in verdict_counts}))
        m.d.sync += strobes.eq(Cat(verdict_counts.values()))
        for index, (name, event, qp) in enumerate((("icrc", icrc_error.valid, icrc_error.p),
                                                   ("cnp", cnp.valid, cnp.p),
                                                   ("intake", verdict.valid, verdict.p.qp))):
            before, write = stores[name].r[0], stores[name].w
            was_cleared = cleared.r[index]
            counted = Signal(name=f"{name}_counted")
            counted_qp = Signal(QP_INDEX_BITS, name=f"{name}_qp")
            m.d.sync += [
                counted.eq(event & ~(reset.valid & (reset.p == qp))),
                counted_qp.eq(qp),
            ]
            # The add from the count read, the count cleared chosen after it (so that the
            # flag's read does not go on into the add's carry chain).
            zero = was_cleared.data[name]
            m.d.comb += [
                before.addr.eq(qp),
                was_cleared.addr.eq(qp),
                write.addr.eq(counted_qp),
                write.en.eq(counted),
                *write_flags(getattr(cleared, f"w_{name}"), counted_qp, counted, 0),
            ]
            if name == "intake":
                for counter in verdict_counts:
                    strobe = strobes[counter]
                    m.d.comb += write.data[counter].eq(
                        Mux(zero, strobe, before.data[counter] + strobe))
            else:
                m.d.comb += write.data.eq(Mux(zero, 1, before.data + 1))

        # The counts for the status ports, 0 while the QP was set again since their last
        # write.
        for port, (select, status) in enumerate(zip(self.status_qp, self.o_status,
                                                    strict=True)):
            zero = cleared.r[len(COUNT_FLAGS) + port]
            m.d.comb += zero.addr.eq(select)
            for name, names in (("icrc", ["icrc_errors"]), ("cnp", ["cnps"]),
                                ("intake", list(INTAKE_COUNTERS.members))):
                reader = stores[name].r[1 + port]
                m.d.comb += reader.addr.eq(select)
                for counter in names:
                    value = reader.data[counter] if len(names) > 1 else reader.data
                    m.d.comb += status[counter].eq(Mux(zero.data[name], 0, value))
        return m

