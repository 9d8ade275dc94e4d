"""The reliability engine's per-QP context: the layout of each piece of a QP's state,
and the memory that keeps one piece for every QP, with the read ports its parts ask for."""

from amaranth import *
from amaranth.lib import data, memory, wiring
from amaranth.lib.wiring import In, Out

from .descriptor import POINTER_BITS
from .requests import QP_COUNTERS, QP_STATE, CompletionStatus

__all__ = ["ContextMemory", "lookup", "update", "qp_bits_of", "per_qp_layouts", "QP_LAYOUTS",
           "message_list", "FLAGS", "QP_FLAGS", "TIME_BITS", "PEER", "RETRIES",
           "SENT_COUNTERS", "INTAKE_COUNTERS", "EVENT_COUNTERS"]

#: Bits of the tick count the timers run on: an ACK timeout is up to 2^31 ticks.
TIME_BITS = 32

#: The counters each packet sent adds to, each acknowledgement's verdict, and the engine's
#: acting on an acknowledgement or a timeout; ICRC errors and CNPs are counted apart.
SENT_COUNTERS = data.StructLayout({name: QP_COUNTERS.members[name]
                                   for name in ("packets", "bytes", "retransmitted")})
INTAKE_COUNTERS = data.StructLayout({
    name: QP_COUNTERS.members[name]
    for name in ("acks", "acks_dropped", "naks_sequence", "naks_rnr", "naks_invalid",
                 "naks_access", "naks_operational")})
EVENT_COUNTERS = data.StructLayout({
    name: shape for name, shape in QP_COUNTERS.members.items()
    if name not in (*SENT_COUNTERS.members, *INTAKE_COUNTERS.members, "icrc_errors",
                    "cnps")})

#: A QP's settings as the reliability engine keeps them (its peer's address is the QP
#: table's).
PEER = data.StructLayout({name: QP_STATE.members[name]
                          for name in ("timeout", "retry_count", "rnr_retry")})

#: A QP's retries left before ERROR, and why it failed.
RETRIES = data.StructLayout({
    "retries": 3,
    "rnr_retries": 3,
    "error_status": CompletionStatus,
    "error_reported": 1,            # the failed work request has completed
})

#: The 1-bit flags of every QP (in memories: :class:`~gateware.roce.qp_flags.QpFlags`),
#: and a QP's flags as a read gives them.
FLAGS = ("error", "resend", "rnr_wait", "retrying")
QP_FLAGS = data.StructLayout({name: 1 for name in FLAGS})


#: The shape of each per-QP memory of the engine that does not hold message slots, by
#: name.
QP_LAYOUTS = {
    # the planner's side: written by each new packet sent, packet sent
    "nxt": 24,
    "tail": POINTER_BITS,
    # the engine's side: written by the FSM, the settings by a reset
    "una": 24,
    "retry": RETRIES,
    "rnr_code": 5,          # the RNR NAK's timer code of an RNR wait
    "peer": PEER,
    # counters, each memory with one writer
    "sent_counters": SENT_COUNTERS,
    "event_counters": EVENT_COUNTERS,
    "intake_counters": INTAKE_COUNTERS,
    "icrc_errors": 32,
    "cnps": 32,
}


def message_list(slot_bits, count_bits):
    """An end of a QP's list of outstanding messages in the slot pool: its slot, and
    the messages that passed it (modulo 2^``count_bits``), so that the list's length is
    the count at its end less the count at its start."""
    return data.StructLayout({"slot": slot_bits, "count": count_bits})


def per_qp_layouts(slot_bits, count_bits):
    """The shape of each per-QP memory of the engine, by name: :data:`QP_LAYOUTS`, and
    the ends of the QP's list of messages (``end``, written by each message loaded: the
    QP's empty slot; ``positions``, by the FSM: its oldest message, and the ring position
    of its oldest unacknowledged payload)."""
    return {
        **QP_LAYOUTS,
        "end": message_list(slot_bits, count_bits),
        "positions": data.StructLayout({"head": POINTER_BITS,
                                        "first": message_list(slot_bits, count_bits)}),
    }


def qp_bits_of(qps):
    """Bits of a QP index inside the engine's memories (1 or more)."""
    return max((qps - 1).bit_length(), 1)


def lookup(shape, addr_bits):
    """A read port as its reader sees it: the reader drives ``addr`` and gets ``data``."""
    return wiring.Signature({"addr": Out(addr_bits), "data": In(shape)})


def update(shape, addr_bits):
    """A write port as its writer sees it: ``data`` goes to ``addr`` in a cycle with ``en``."""
    return wiring.Signature({"addr": Out(addr_bits), "data": Out(shape), "en": Out(1)})


class ContextMemory(wiring.Component):
    """One memory of ``depth`` entries of ``shape``, with one writer (``w``) and a read
    port for each reader (``r[n]``, of the kind ``reads[n]`` names).

    Read kinds and their latency: ``"comb"`` gives the entry at ``addr`` in the same
    cycle (distributed RAM); ``"transparent"`` gives, a cycle after ``addr``, the entry
    as a combinational read would give it then (a write in the cycle of ``addr`` shows);
    ``"sync"`` gives, a cycle after ``addr``, the entry as it was in the cycle of
    ``addr``. A write takes effect at the end of its cycle. Addresses wider than the
    memory are truncated. ``init``: the entries' values at start (default all zero).
    """

    _READS = ("comb", "transparent", "sync")

    def __init__(self, *, shape, depth, reads, addr_bits, init=()):
        for kind in reads:
            if kind not in self._READS:
                raise ValueError(f"Read kind must be one of {self._READS}, not {kind!r}")
        if depth > 1 << addr_bits:
            raise ValueError(f"Depth {depth!r} does not fit {addr_bits!r} address bits")
        self._shape = shape
        self._depth = depth
        self._reads = tuple(reads)
        self._init = list(init)
        super().__init__({
            "w": In(update(shape, addr_bits)),
            "r": In(lookup(shape, addr_bits)).array(len(self._reads)),
        })

    @property
    def reads(self):
        return self._reads

    def elaborate(self, platform):
        m = Module()
        m.submodules.memory = store = memory.Memory(shape=self._shape, depth=self._depth,
                                                    init=self._init)
        write = store.write_port()
        m.d.comb += [
            write.addr.eq(self.w.addr),
            write.data.eq(self.w.data),
            write.en.eq(self.w.en),
        ]
        for kind, reader in zip(self._reads, self.r, strict=True):
            if kind == "comb":
                port = store.read_port(domain="comb")
            elif kind == "transparent":
                port = store.read_port(transparent_for=(write,))
            else:
                port = store.read_port()
            m.d.comb += [port.addr.eq(reader.addr), reader.data.eq(port.data)]
        return m
