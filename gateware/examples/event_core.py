"""The core with the example event source on its user ports, as a board top builds it."""

from amaranth import *
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out, connect, flipped

from ..core import NetworkCore
from ..roce.requests import QP_INDEX_BITS, ConnectionEvent
from ..stream import BEAT_BYTES
from .event_source import EVENT_CONFIG, EVENT_STATUS, EventSource

__all__ = ["EventCore"]


class EventCore(wiring.Component):
    """:class:`~gateware.core.NetworkCore` whose user request ports are driven by an
    :class:`~gateware.examples.event_source.EventSource`.

    The ports are the core's (``rx``, ``tx``, ``config``, ``counters``, ``qp_write``,
    the ``*_config`` streams, ``qp_status_select`` → ``qp_status``) but for
    ``work_request``, ``payload``, ``completion`` and ``connection``, which the
    source and its enable hold, plus the source's ``source_config`` (its
    ``i_config``) and ``source_status``.

    The source takes its ring from the host: the core's ``connection`` events
    (always taken) enable it on an OPENED event while it is disabled, with that
    event's QP and host buffer address (``base``) as the source's QP and ring
    address, and disable it on a CLOSED or EXPIRED event of that QP (registers:
    the source sees the event a cycle after the core gives it). So a host's
    OPEN_QP starts a run from event 0 into its registered buffer, and its
    CLOSE_QP (or the lease) ends it; QPs other hosts open meanwhile carry none of
    it. The ring's slots and their size stay the source's configuration.

    Parameters
    ----------
    fragment_bytes, window : int
        The source's (see :class:`~gateware.examples.event_source.EventSource`).
    source_config : dict
        The source's configuration after reset (fields of
        :data:`~gateware.examples.event_source.EVENT_CONFIG`).
    user_ports : bool
        Also the core's user ports (``work_request``, ``payload``, ``completion``,
        ``connection``, ``connect``) and ``use_source``, which chooses who holds them:
        the source (1, as without them) or the ports (0: the source never starts, and the
        design is the core with the source idle beside it). The simulation benches build
        it so, so that one build serves the core's benches and the source's.
    **core :
        Build parameters of :class:`~gateware.core.NetworkCore`.
    """

    #: The core's ports that the wrapper has too (the others are the source's).
    FORWARDED = ("rx", "tx", "config", "counters", "qp_write", "cm_config", "roce_config",
                 "pause_config", "dcqcn_config", "qp_status_select", "qp_status")
    #: The core's ports that the source holds, the wrapper's too with ``user_ports``.
    USER_PORTS = ("work_request", "payload", "completion", "connection", "connect")

    def __init__(self, *, fragment_bytes=4096, window=16, source_config=None,
                 user_ports=False, **core):
        self.core = NetworkCore(**core)
        self.source = EventSource(fragment_bytes=fragment_bytes, window=window,
                                  config=source_config, width=core.get("width", BEAT_BYTES))
        self._user_ports = user_ports
        members = self.core.signature.members
        ports = {name: members[name] for name in self.FORWARDED}
        if user_ports:
            ports.update({name: members[name] for name in self.USER_PORTS},
                         use_source=In(1))
        super().__init__({
            **ports,
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
        m.d.comb += self.source_status.eq(source.o_status)
        event = self._choose(m)

        # The host's ring: the QP and buffer address of an OPENED event, until that QP
        # closes or expires.
        enable = Signal()
        qp = Signal(QP_INDEX_BITS)
        base = Signal(64)
        opened = event.p.event == ConnectionEvent.OPENED
        m.d.comb += event.ready.eq(1)
        with m.If(event.valid & opened & ~enable):
            m.d.sync += [enable.eq(1), qp.eq(event.p.qp), base.eq(event.p.base)]
        with m.If(event.valid & ~opened & (event.p.qp == qp)):
            m.d.sync += enable.eq(0)
        m.d.comb += [source.i_enable.eq(enable), source.i_qp.eq(qp), source.i_base.eq(base)]
        return m

    def _choose(self, m):
        """The core's user ports to the source while ``use_source``, else to the
        wrapper's; returns the connection events as the source's side sees them (none
        while the ports hold them). Without ``user_ports`` the source always holds them
        (the choice is a constant, and the ports it passes over are ones nothing drives)."""
        core, source = self.core, self.source
        if self._user_ports:
            outer, use = self, self.use_source
        else:
            members = core.signature.members
            outer = wiring.Signature({name: members[name] for name in self.USER_PORTS}).create()
            use = C(1)
        connect(m, flipped(outer.connect), core.connect)
        request, outer_request = source.o_request, outer.work_request
        payload, outer_payload = core.payload, outer.payload
        m.d.comb += [
            core.work_request.valid.eq(Mux(use, request.valid, outer_request.valid)),
            core.work_request.p.eq(Mux(use, request.p, outer_request.p)),
            request.ready.eq(use & core.work_request.ready),
            outer_request.ready.eq(~use & core.work_request.ready),
            payload.tvalid.eq(Mux(use, source.o_payload.valid, outer_payload.tvalid)),
            payload.tdata.eq(Mux(use, source.o_payload.p.data, outer_payload.tdata)),
            payload.tkeep.eq(Mux(use, source.o_payload.p.keep, outer_payload.tkeep)),
            payload.tlast.eq(Mux(use, source.o_payload.p.last, outer_payload.tlast)),
            source.o_payload.ready.eq(use & payload.tready),
            outer_payload.tready.eq(~use & payload.tready),
        ]
        event = stream.Signature(core.connection.p.shape()).flip().create()
        for inner, ours, theirs in ((core.completion, source.i_completion, outer.completion),
                                    (core.connection, event, outer.connection)):
            m.d.comb += [
                ours.valid.eq(use & inner.valid),
                ours.p.eq(inner.p),
                theirs.valid.eq(~use & inner.valid),
                theirs.p.eq(inner.p),
                inner.ready.eq(Mux(use, ours.ready, theirs.ready)),
            ]
        return event
