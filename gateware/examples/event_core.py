"""The core with the example event source on its user ports, as a board top builds it."""

from amaranth import *
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out, connect, flipped

from ..core import NetworkCore
from ..counters import COUNTER_BITS
from ..stream import BEAT_BYTES
from .event_source import EVENT_CONFIG, EVENT_STATUS, EventSource

__all__ = ["EventCore"]


class EventCore(wiring.Component):
    """:class:`~gateware.core.NetworkCore` whose user request ports are driven by an
    :class:`~gateware.examples.event_source.EventSource`.

    The ports are the core's (``rx``, ``tx``, ``config``, ``counters``, ``qp_write``,
    the ``*_config`` streams, ``qp_status_select`` → ``qp_status``) but for
    ``work_request``, ``payload`` and ``completion``, which the source holds, plus
    the source's ``source_config`` (its ``i_config``) and ``source_status``.

    The source is enabled while the connection manager holds an open QP (its
    ``opened`` counter ahead of ``closed`` + ``expired``; a register, one cycle
    behind the counters): a host's OPEN_QP starts a run from event 0, and its
    CLOSE_QP (or the lease) ends it. ``source_config.qp`` names the QP the
    fragments go on, which is QP 0 for the first host that opens one.

    Parameters
    ----------
    fragment_bytes, window : int
        The source's (see :class:`~gateware.examples.event_source.EventSource`).
    source_config : dict
        The source's configuration after reset (fields of
        :data:`~gateware.examples.event_source.EVENT_CONFIG`).
    **core :
        Build parameters of :class:`~gateware.core.NetworkCore`.
    """

    #: The core's ports that the wrapper has too.
    FORWARDED = ("rx", "tx", "config", "counters", "qp_write", "cm_config", "roce_config",
                 "pause_config", "dcqcn_config", "qp_status_select", "qp_status")

    def __init__(self, *, fragment_bytes=4096, window=16, source_config=None, **core):
        self.core = NetworkCore(**core)
        self.source = EventSource(fragment_bytes=fragment_bytes, window=window,
                                  config=source_config, width=core.get("width", BEAT_BYTES))
        members = self.core.signature.members
        super().__init__({
            **{name: members[name] for name in self.FORWARDED},
            "source_config": In(stream.Signature(EVENT_CONFIG)),
            "source_status": Out(EVENT_STATUS),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.core = core = self.core
        m.submodules.source = source = self.source

        for name in self.FORWARDED:
            outer, inner = getattr(self, name), getattr(core, name)
            member = self.signature.members[name]
            if member.is_signature:
                connect(m, flipped(outer), inner)
            elif member.flow == In:
                m.d.comb += inner.eq(outer)
            else:
                m.d.comb += outer.eq(inner)

        connect(m, flipped(self.source_config), source.i_config)
        connect(m, source.o_request, core.work_request)
        connect(m, core.completion, source.i_completion)
        m.d.comb += [
            core.payload.tvalid.eq(source.o_payload.valid),
            core.payload.tdata.eq(source.o_payload.p.data),
            core.payload.tkeep.eq(source.o_payload.p.keep),
            core.payload.tlast.eq(source.o_payload.p.last),
            source.o_payload.ready.eq(core.payload.tready),
            self.source_status.eq(source.o_status),
        ]

        cm = core.counters.cm
        enable = Signal()
        m.d.sync += enable.eq((cm.opened - cm.closed - cm.expired)[:COUNTER_BITS] != 0)
        m.d.comb += source.i_enable.eq(enable)
        return m
