"""The connection manager: pairs host QPs with the endpoint's, starts the
generator, closes QPs and reports their status (CM_PROTOCOL.md)."""

import ipaddress

from amaranth import *
from amaranth.lib import data, fifo, memory, stream, wiring
from amaranth.lib.wiring import In, Out, connect, flipped

from ..counters import counters_layout, event_counter
from ..headers import UDP
from ..packet.extract import HeaderExtractor
from ..packet.fifo import PacketFIFO
from ..packet.insert import HeaderInserter
from ..roce.flag_memory import block_ram_attrs
from ..roce.generator import GENERATOR_RUN
from ..roce.generator_pool import RUN_CREDIT, RUN_STATUS
from ..roce.requests import (
    CONNECTION_EVENT,
    FIRST_QPN,
    QP_COUNTERS,
    QP_INDEX_BITS,
    QP_STATE,
    QP_STATUS,
    QP_WRITE,
    ConnectionEvent,
    PathMtu,
    Verb,
    check_qp_count,
    psn_sequence,
)
from ..stream import BEAT_BYTES, beats_for, meta_with, packet_signature
from ..udp.rx import UDP_RX_META
from ..udp.tx import UDP_TX_META
from .access import AccessList
from .datagram import (
    CM_DATAGRAM,
    CM_PORT,
    CM_QP_INFO,
    CM_RUN_TXMETA,
    CM_STATUS,
    CM_STATUS_DATAGRAM,
    CREDIT_TXMETA,
    Ack,
    Request,
)
from .ib_cm import CM_CONNECT, CM_CONNECTED, CM_OPEN, CM_OPENED, OpenRefusal, RejectReason
from .lease import LEASE_SWEEPS, LeaseTicker

__all__ = ["ConnectionManager", "CM_CONFIG", "CM_ENTRY", "CLOSE_ALL_QPN", "CONNECT_REQUEST",
           "access_list"]

#: How the connection manager sets up the QPs it opens, whom it serves, and how
#: long a QP lives without word from its host.
CM_CONFIG = data.StructLayout({
    "path_mtu": PathMtu,        # when OPEN_QP asks for the default (0)
    "timeout": QP_STATE.members["timeout"],
    "retry_count": QP_STATE.members["retry_count"],
    "rnr_retry": QP_STATE.members["rnr_retry"],
    "access_ip": 32,            # the access list: the subnet access_ip/access_prefix
    "access_prefix": range(33),
    "lease_tick": 32,           # cycles between lease sweeps: lease / LEASE_SWEEPS; 0: none
})

def access_list(ip, netmask):
    """The CM_CONFIG fields of an access list that admits the subnet of ``ip``
    (a string) with ``netmask`` (a string, e.g. "255.255.255.0")."""
    network = ipaddress.IPv4Network(f"{ip}/{netmask}", strict=False)
    return {"access_ip": int(network.network_address), "access_prefix": network.prefixlen}


#: rem_qpn of a CLOSE_QP that closes every QP of its source (extension).
CLOSE_ALL_QPN = 0xFFFFFF

#: What the connection manager keeps of each QP.
CM_ENTRY = data.StructLayout({
    "open": 1,
    "host_ip": 32,              # the requester (host_ip, host_qpn) that opened it
    "host_qpn": 24,
    "psn": 24,                  # our first PSN, announced in the OPEN_QP reply
    "path_mtu": PathMtu,
    "base": 64,                 # the host buffer's address: where generator runs write
    "runs": 24,                 # generator runs started on it
    "age": range(LEASE_SWEEPS + 1),     # lease sweeps since its host's last request
    "connect": 1,               # taken by CONNECT: the endpoint opens the connection
    "connecting": 1,            # CONNECT: the IB CM's REQ not yet answered
    "rdma_port": 16,            # CONNECT: the host's rdma_cm port
})

#: Where the answer to a CONNECT goes once the IB CM has opened the connection or not:
#: the requester's UDP port and the loc_* its reply echoes.
CONNECT_REPLY = data.StructLayout({
    "port": 16,
    "loc": CM_QP_INFO.size,
    "user": 1,                  # asked by user logic: the answer is the event alone
})

#: A connection user logic asks the endpoint to open (``i_connect``): the host, its
#: rdma_cm port and the path MTU, as a CONNECT datagram from that host gives them.
CONNECT_REQUEST = data.StructLayout({
    "remote_ip": 32,
    "port": 16,
    "path_mtu": PathMtu,
})

#: Bits of the pieces :func:`_equal_later` compares a cycle ahead: two LUT levels each.
_PIECE_BITS = 9


def _equal_later(m, a, b, name):
    """Whether ``a`` equalled ``b`` in the cycle before: their pieces of
    :data:`_PIECE_BITS` compared then, into a register, and the pieces' results joined
    now (one LUT for the few pieces of an address)."""
    pieces = Signal(-(-len(a) // _PIECE_BITS), name=f"{name}_pieces")
    m.d.sync += pieces.eq(Cat(a[start:start + _PIECE_BITS] == b[start:start + _PIECE_BITS]
                              for start in range(0, len(a), _PIECE_BITS)))
    return pieces.all()


class ConnectionManager(wiring.Component):
    """Serves CM datagrams: ``i`` takes the UDP payloads that arrive on port
    17185, ``o`` sends the replies.

    Datagrams wait whole in a queue of ``queue`` datagrams that never stalls
    the receive path (full: dropped, counted ``overflow``), and are served one
    at a time. The CM trusts a datagram's IPv4 source, never the loc_ip in its
    payload (CM_PROTOCOL.md, "Who may steer a QP"): a source outside the access
    list (``i_config.access_ip``/``access_prefix``) is dropped and counted
    (``access``), and so is a request to steer a QP from a source that may not
    (``spoofed``), without a reply.

    - OPEN_QP, SEND_QP_INFO, MODIFY_QP_RTS, only from the source that loc_ip
      names, look the requester (loc_ip, loc_qpn) up among the open QPs, one
      QP per cycle. A QP it opened is answered again. Otherwise OPEN_QP takes
      the lowest free QP (its host: the source): its first
      PSN comes from a free-running LFSR, its path MTU from txmeta bits 7:4
      (0: ``i_config.path_mtu``; 6–15: ack NAK), and the QP is set on
      ``o_qp_write`` (remote QPN, PSN, rkey and address from loc, timers from
      ``i_config``, UDP source port 0xC000 + index). No QP: NO_QP.
    - CLOSE_QP of an open QP from its host: the QP is freed, its run stopped
      (``o_stop``, the cycle after the QP's entry is checked: the stop comes
      from the FSM's state alone) and then the QP flushed (``o_qp_close``). A QP that is not open:
      NO_QP. rem_qpn 0xFFFFFF (extension): every QP of the source is closed so,
      one QP every four cycles, and the ACK's count says how many.
    - STATUS, from any source: the QP's flags, generator run (``run_qp`` →
      ``run``) and reliability counters (``status_qp`` → ``status``, one
      cycle); NO_QP for a QPN out of range.
    - A start (request NULL, txmeta valid and start) for an open QP, from its
      host, goes to the generator pool (``o_start``) with the QP's buffer
      address as base and rem_base_addr as the ring size; no reply. The QP's
      run count goes up when the pool takes it (``start_taken`` with the
      handshake). A credited start (txmeta bit 4) must be a WRITE into a ring
      (rem_base_addr ≠ 0), else it is dropped and counted (``credit_refused``).
    - A CREDIT (extension: request NULL, txmeta exactly 0x11) for an open QP,
      from its host, goes to the pool (``o_credit``: the QP and ``count``); no
      reply (counted ``credits``).

    Lease (extension): every ``i_config.lease_tick`` cycles the CM sweeps its
    QPs (four cycles each, between datagrams). A QP's age counts the sweeps
    since its host's last OPEN_QP, legacy step, STATUS, start or CREDIT of it; a QP
    whose age reached ``LEASE_SWEEPS`` and that is in ERROR, or has no packet
    outstanding and no run in progress, is freed as a close frees it
    (``expired``). The verdict on a QP is a register (its entry, the engine's
    ``status`` and the pool's ``run`` → verdict → stop), so neither the engine's
    status nor the entry's compares chain with the pool's handling of the stop.

    Dropped and counted: a UDP length other than 72 (``length``); info_valid
    clear or ack_valid set (``malformed``); an unknown request or a NULL
    without a start (``request``); a start or CREDIT for a QPN out of range
    (``qpn``) or for a QP that is not open (``start_closed``). Replies go from port
    17185 to the source address, at reply_port or else the source port.

    ``i_qp_write`` (user logic) is passed to ``o_qp_write`` while no
    datagram is being served; QPs set that way are not known to the CM.

    The IB side (:class:`~gateware.cm.ib_cm.IbCm`, the host's ``rdma_connect``)
    opens and frees QPs of the same table through its allocation port, served between
    datagrams as they are (taken before a waiting datagram, but never two in a row
    while datagrams wait), one cycle after ``i_ib_open`` or ``i_ib_close`` shows a
    request:

    - ``i_ib_open`` (:data:`~gateware.cm.ib_cm.CM_OPEN`) is served as an OPEN_QP
      from the request's host: a host outside the access list is refused
      :attr:`~gateware.cm.ib_cm.OpenRefusal.DENIED` (counted ``access``), no QP
      free :attr:`~gateware.cm.ib_cm.OpenRefusal.NO_QP` (``no_qp``); else a free QP
      is taken (never an open QP of the same host QP, as a repeated OPEN_QP would):
      the first free one after the QP the last IB open took, round the table, and the
      QP freed last only when no other is free, so that a host that closed a
      connection and connects again gets another QP (CM_PROTOCOL.md) while its own
      may still be in TimeWait (OPEN_QP keeps the lowest free QP). The choice is
      made during the scan, one QP per cycle, from a rank registered beside each QP
      read. The QP is set on ``o_qp_write`` with the request's remote QPN, PSN
      (``next_psn``: the endpoint's first), path MTU, rkey, ACK timeout, retry and RNR
      retry counts and the UDP source port OPEN_QP gives it; its entry holds the host
      and the buffer address (``base``; ``length`` is not kept), so STATUS, starts,
      CREDIT, CLOSE_QP, close-all and the lease serve it as an OPEN_QP's. The OPENED
      event goes out as for OPEN_QP and ``o_ib_opened`` answers with the QP.
    - ``i_ib_close`` (a QP index) frees an open QP as its host's CLOSE_QP does (stop,
      flush, CLOSED event), without a datagram; a free QP is left alone.
    - ``o_ib_closed`` names every QP the CM frees (CLOSE_QP, close-all, lease, an IB
      close), in the cycle ``o_qp_close`` takes it.

    CONNECT (extension, request 6: the endpoint opens an rdma_cm connection to a host
    that listens), only from the source that loc_ip names: path MTU txmeta bits 7:4, 1
    to 5 (else NAK, ``count`` 26, counted ``malformed``), the host's rdma_cm port in
    ``length``. The scan looks the (source, port) up among the QPs CONNECT took: one
    connected is answered ACK again, one still connecting not at all (its answer comes
    when it is done). Else a free QP is taken as an IB open takes one (no QP free: NAK,
    ``count`` 3, counted ``no_qp``): its entry holds the host, the port and the MTU,
    ``connecting``, and where the answer goes (the reply port and the request's loc_*,
    in a memory by QP); ``o_ib_connect`` asks the IB CM for the REQ. No reply yet.
    ``i_ib_connected`` (the IB CM's result, served as its requests are) then, if the QP
    is still held for it: established, the QP is set on ``o_qp_write`` (the host's QPN,
    the REP's Starting PSN as first PSN, the rkey, the QP's MTU, the REP's RNR retry
    count, ``i_config``'s timeout and retry count), the OPENED event goes out (with the
    port and the buffer's length) and CONNECT/ACK (loc_* the endpoint's QPN, first PSN
    and address, rem_* the request's loc_*, txmeta the MTU); refused, the QP is freed,
    a FAILED event (the host, port and reason) and CONNECT/NAK with the REJ reason in
    ``count`` (4: no answer); the refusals before a QP is taken (MTU, no QP) make a
    FAILED event too (QP 0). Counted: ``connects`` (QPs taken), ``connected``,
    ``connect_failed`` (every refusal).

    ``i_connect`` (:data:`CONNECT_REQUEST`, user logic) asks for a connection as a
    CONNECT from the host it names does (the access list aside), served as datagrams
    are (never two in a row while datagrams wait); its answer is the event alone
    (OPENED with the QP, or FAILED with the reason), no datagram. One for a host and
    port already connected or connecting makes none.

    Connection events (:data:`~gateware.roce.requests.CONNECTION_EVENT`) tell user
    logic which QPs the CM holds: OPENED when an OPEN_QP, an IB open or a CONNECT's
    answer sets a QP, in
    the cycle ``o_qp_write`` takes its state (a repeated OPEN_QP answered again makes
    none), CLOSED for each QP a CLOSE_QP (close-all included) or an IB close frees,
    EXPIRED for each QP the lease frees, in the cycle ``o_qp_close`` takes the QP, and
    FAILED for each CONNECT the host refused or left unanswered. They wait in a queue of
    ``events`` (a :class:`~amaranth.lib.fifo.SyncFIFOBuffered`) for ``o_connection``;
    an event that finds it full is dropped and counted (``events_lost``), so user
    logic that takes none never stalls the CM.
    """

    def __init__(self, *, qps, queue=8, events=4, width=BEAT_BYTES):
        self._qps = check_qp_count(qps)
        self._queue = queue
        if not isinstance(events, int) or events < 1:
            raise ValueError(f"Connection event queue must hold 1 or more events, not "
                             f"{events!r}")
        self._events = events
        self._width = width
        super().__init__({
            "i": In(packet_signature(UDP_RX_META, width=width, always_ready=True)),
            "i_ip": In(32),
            "i_config": In(CM_CONFIG),
            "i_qp_write": In(stream.Signature(QP_WRITE)),
            "i_connect": In(stream.Signature(CONNECT_REQUEST)),
            "o": Out(packet_signature(UDP_TX_META, width=width)),
            "o_qp_write": Out(stream.Signature(QP_WRITE)),
            "o_qp_close": Out(stream.Signature(QP_INDEX_BITS)),
            "o_start": Out(stream.Signature(GENERATOR_RUN)),
            "o_stop": Out(stream.Signature(QP_INDEX_BITS, always_ready=True)),
            "o_credit": Out(stream.Signature(RUN_CREDIT, always_ready=True)),
            "o_connection": Out(stream.Signature(CONNECTION_EVENT)),
            "i_ib_open": In(stream.Signature(CM_OPEN)),
            "o_ib_opened": Out(stream.Signature(CM_OPENED)),
            "i_ib_close": In(stream.Signature(QP_INDEX_BITS)),
            "o_ib_closed": Out(stream.Signature(QP_INDEX_BITS, always_ready=True)),
            "o_ib_connect": Out(stream.Signature(CM_CONNECT)),
            "i_ib_connected": In(stream.Signature(CM_CONNECTED)),
            "status_qp": Out(QP_INDEX_BITS),
            "status": In(QP_STATUS),
            "run_qp": Out(QP_INDEX_BITS),
            "run": In(RUN_STATUS),
            "start_taken": In(1),
            "o_counters": Out(self.counters_layout()),
        })

    @property
    def qps(self):
        return self._qps

    DROP_REASONS = ("overflow", "length", "malformed", "request", "qpn", "start_closed",
                    "access", "spoofed", "credit_refused")
    EVENTS = ("opened", "closed", "no_qp", "starts", "expired", "credits", "events_lost",
              "connects", "connected", "connect_failed")

    @classmethod
    def counters_layout(cls):
        return counters_layout(*cls.DROP_REASONS, *cls.EVENTS)

    def elaborate(self, platform):
        m = Module()
        width, qps = self._width, self._qps
        counts = {name: Signal(name=f"count_{name}") for name in self.DROP_REASONS + self.EVENTS
                  if name != "length"}

        # Datagrams in: queue (whole datagrams), then the 64 bytes into meta.
        beats = beats_for(CM_DATAGRAM.length + 1, width)
        depth = 1 << (self._queue * beats - 1).bit_length()
        m.submodules.queue = queue = PacketFIFO(UDP_RX_META, depth=depth, max_packets=self._queue,
                                                length_field="cm_length", width=width)
        queued_meta = queue.o.p.meta.shape()
        m.submodules.parse = parse = HeaderExtractor("cm", CM_DATAGRAM, queued_meta, width=width)
        connect(m, flipped(self.i), queue.i)
        connect(m, queue.o, parse.i)
        length_bad = Signal()               # seen by the FSM (a short one by the parser)
        m.d.comb += counts["overflow"].eq(queue.o_overflow_drop)

        # Replies out: the 64 bytes as a header in front of an empty payload.
        reply_meta = meta_with(UDP_TX_META, cm=CM_DATAGRAM)
        m.submodules.emit = emit = HeaderInserter("cm", CM_DATAGRAM, reply_meta, width=width)
        connect(m, emit.o, flipped(self.o))

        # What the CM knows of each QP, in block RAM from BLOCK_DEPTH QPs on: its read is
        # registered (a synchronous port), and ``entry`` is that read in a register a cycle
        # later, with the compares of it that the states decide on begun beside it
        # (:func:`_equal_later`), so that neither the whole compare chains with the read
        # nor with the decisions. A state sees the entry of ``index`` (or ``scan``) two
        # cycles after it is set.
        m.submodules.entries = entries = memory.Memory(
            shape=CM_ENTRY, depth=qps, init=[], attrs=block_ram_attrs(qps))
        entry_write = entries.write_port()
        entry_read = entries.read_port()
        entry = Signal(CM_ENTRY)
        entry_requester = Signal()          # its host is the request's (address and QPN)
        entry_connects = Signal()           # it is CONNECT's to the request's host and port
        # Where each CONNECT's answer goes, by QP.
        m.submodules.replies = replies = memory.Memory(shape=CONNECT_REPLY, depth=qps, init=[])
        replies_write = replies.write_port()
        replies_read = replies.read_port()
        outcome = Signal(CM_CONNECTED)      # the IB CM's answer to a CONNECT being served
        user = Signal()                     # the CONNECT served is user logic's: no reply
        opened_length = Signal(64)          # the buffer size an OPENED event tells
        entry_source = Signal()             # its host's address is the datagram's source

        psn = psn_sequence(m, init=0x5EED01)   # first PSNs

        # The datagram being served.
        request = Signal(CM_DATAGRAM)
        source_ip = Signal(32)
        allowed = Signal()                  # source_ip is in the access list
        m.submodules.access = access = AccessList()
        m.d.comb += [
            access.i_address.eq(self.i_config.access_ip),
            access.i_prefix.eq(self.i_config.access_prefix),
            access.i_source.eq(parse.o.p.meta.ip.src),
        ]
        # The IB side's open requests (``i_ib_open``): their host checked as a datagram's
        # source is, in a register loaded as the request is taken.
        m.submodules.ib_access = ib_access = AccessList()
        m.d.comb += [
            ib_access.i_address.eq(self.i_config.access_ip),
            ib_access.i_prefix.eq(self.i_config.access_prefix),
            ib_access.i_source.eq(self.i_ib_open.p.remote_ip),
        ]
        ib = Signal()                       # the request served came from the IB side
        ib_valid = Signal()                 # an IB request waits (registered: a cycle late)
        m.d.sync += ib_valid.eq(self.i_ib_close.valid | self.i_ib_open.valid
                                | self.i_ib_connected.valid)
        ib_timers = Signal(QP_STATE)        # an IB open's timeout, retry and RNR retry
        ib_answer = Signal(CM_OPENED)
        m.submodules.lease = lease = LeaseTicker()
        m.d.comb += lease.i_period.eq(self.i_config.lease_tick)
        source_port = Signal(16)
        good_length = Signal()
        index = Signal(QP_INDEX_BITS)       # the endpoint QP it names or that was found
        qpn = request.rem.qpn[:24]
        named = qpn - FIRST_QPN
        # The decode's compares, in registers loaded with ``request`` (from the datagram's
        # meta), so that they do not chain with the decode's choice of the next state.
        in_range = Signal()                 # qpn names one of our QPs
        close_all = Signal()                # qpn is CLOSE_ALL_QPN
        loc_is_source = Signal()            # request.loc.ip is the datagram's source
        found = Signal(CM_ENTRY)
        reply = Signal(CM_DATAGRAM)
        status_reply = data.View(CM_STATUS_DATAGRAM, reply.as_value())
        run = Signal(GENERATOR_RUN)
        write = Signal(QP_WRITE)
        scan = Signal(range(qps + 2))       # the QP read this cycle (in SCAN)
        scanning = Signal()                 # the FSM is in SCAN

        # Connection events out, through a queue that drops (and counts) when full.
        m.submodules.events = events = fifo.SyncFIFOBuffered(width=CONNECTION_EVENT.size,
                                                             depth=self._events)
        event = Signal(CONNECTION_EVENT)    # the event of this cycle, when ``events.w_en``
        m.d.comb += [
            events.w_data.eq(event),
            event.qp.eq(index),
            counts["events_lost"].eq(events.w_en & ~events.w_rdy),
            self.o_connection.valid.eq(events.r_rdy),
            self.o_connection.payload.eq(events.r_data),
            events.r_en.eq(self.o_connection.ready),
        ]

        m.d.comb += [
            self.status_qp.eq(index),
            self.run_qp.eq(index),
            # (``scanning``: in SCAN, a register beside the FSM's state, so that the address
            # does not wait on the state's decode before the read and the compares)
            entry_read.addr.eq(Mux(scanning, scan, index)),
            replies_read.addr.eq(index),
            emit.i.p.meta.cm.eq(reply),
            emit.i.p.meta.dst_ip.eq(source_ip),
            emit.i.p.meta.src_port.eq(CM_PORT),
            emit.i.p.meta.dst_port.eq(Mux(request.reply_port != 0, request.reply_port,
                                          source_port)),
            emit.i.p.meta.length.eq(CM_DATAGRAM.length),
            emit.i.p.last.eq(1),
            self.o_start.p.eq(run),
            self.o_qp_write.p.eq(write),
            self.o_qp_close.p.eq(index),
            self.o_stop.p.eq(index),
            self.o_credit.p.qp.eq(index),
            self.o_credit.p.count.eq(request.count),
            self.o_ib_opened.p.eq(ib_answer),
            # Every QP freed (close, close-all, lease, IB close) leaves through o_qp_close.
            self.o_ib_closed.valid.eq(self.o_qp_close.valid & self.o_qp_close.ready),
            self.o_ib_closed.p.eq(index),
        ]

        def answer(ack, described=None):
            """Reply ``ack``; ``described``: the entry of the QP the reply describes."""
            statements = [
                reply.eq(0),
                reply.flags.info_valid.eq(1),
                reply.flags.request.eq(request.flags.request),
                reply.flags.ack_valid.eq(1),
                reply.flags.ack.eq(ack),
                reply.loc.ip.eq(self.i_ip),
                reply.rem.eq(request.loc),
            ]
            if described is not None:
                statements += [
                    reply.loc.qpn.eq(FIRST_QPN + index),
                    reply.loc.psn.eq(described.psn),
                    reply.txmeta.path_mtu.eq(described.path_mtu),
                ]
            m.d.sync += statements
            m.next = "REPLY"

        def ib_reply(qp=None, refusal=None):
            """Answer the IB side's open: ``qp`` taken, or refused for ``refusal``."""
            if qp is not None:
                m.d.sync += [ib_answer.accepted.eq(1), ib_answer.qp.eq(qp)]
            else:
                m.d.sync += [ib_answer.accepted.eq(0), ib_answer.refusal.eq(refusal)]
            m.next = "IB_REPLY"

        def connect_failed(reason, qp=0):
            """A CONNECT refused for ``reason``: CONNECT/NAK with it, a FAILED event."""
            m.d.comb += [
                counts["connect_failed"].eq(1),
                events.w_en.eq(1),
                event.qp.eq(qp),
                event.event.eq(ConnectionEvent.FAILED),
                event.state.remote_ip.eq(request.loc.ip),
                event.port.eq(request.length[:16]),
                event.reason.eq(reason),
            ]
            answer(Ack.NAK)
            m.d.sync += reply.count.eq(reason)

        def reply_or_ib(ack, refusal):
            """Refuse a datagram with ``ack``, the IB side with ``refusal``. (The reply is
            set either way: its register does not wait on ``ib``.)"""
            answer(ack)
            with m.If(ib):
                ib_reply(refusal=refusal)

        fetched = Signal(range(qps + 1))    # the QP whose entry is on ``read``
        probe = Signal(range(qps + 1))      # the QP whose entry is on ``entry``
        matched = Signal()
        free = Signal()                     # a free QP was seen; ``free_index`` is the lowest
        free_index = Signal(QP_INDEX_BITS)
        # An IB open's QP: the first free one from ``rover`` (the QP after the last IB
        # open's) on, else the lowest; the QP freed last only when no other is free.
        # ``probe``'s rank among those, registered beside it; the best one seen so far.
        rover = Signal(range(qps + 1))
        freed_last = Signal(range(qps + 1), init=qps)
        fetched_rank = Signal(2)
        probe_rank = Signal(2)
        best_rank = Signal(2)
        best_index = Signal(QP_INDEX_BITS)
        chosen = Signal(QP_INDEX_BITS)      # the QP an open takes
        is_connect = request.flags.request == Request.CONNECT
        m.d.comb += chosen.eq(Mux(ib | is_connect, best_index, free_index))
        with m.If(self.o_qp_close.valid & self.o_qp_close.ready):
            m.d.sync += freed_last.eq(index)
        first_beat = Signal(init=1)
        read = entry_read.data
        m.d.sync += entry.eq(read)
        requester_host = _equal_later(m, read.host_ip, request.loc.ip, "requester_host")
        m.d.comb += [
            entry_requester.eq(requester_host & ~entry.connect
                               & _equal_later(m, read.host_qpn, request.loc.qpn[:24],
                                              "requester_qpn")),
            entry_connects.eq(requester_host & entry.connect
                              & _equal_later(m, read.rdma_port, request.length[:16],
                                             "connect_port")),
            entry_source.eq(_equal_later(m, read.host_ip, source_ip, "source_host")),
        ]
        from_host = entry.open & (entry_source | ib)     # an IB close: the QP open
        refreshed = Signal(CM_ENTRY)        # the entry read, heard from its host now
        m.d.comb += [refreshed.eq(entry), refreshed.age.eq(0)]
        closing_all = Signal()              # the sweep serves a close-all, not the lease
        closed_count = Signal(range(qps + 1))
        swept_last = Signal()               # the last thing served was a lease sweep
        asked_mtu = request.txmeta.path_mtu
        run_meta = data.View(CM_RUN_TXMETA, request.txmeta.as_value())
        is_credit = request.txmeta.as_value() == CREDIT_TXMETA
        mtu = Mux(asked_mtu == 0, self.i_config.path_mtu.as_value(), asked_mtu[:3])

        with m.FSM():
            with m.State("IDLE"):
                # User logic's QP writes pass while no datagram is served.
                m.d.comb += [
                    self.o_qp_write.valid.eq(self.i_qp_write.valid),
                    self.o_qp_write.p.eq(self.i_qp_write.p),
                    self.i_qp_write.ready.eq(self.o_qp_write.ready),
                ]
                # A due sweep first, but never two in a row while datagrams wait.
                with m.If(~self.i_qp_write.valid & lease.o_due
                          & ~(swept_last & parse.o.valid)):
                    m.d.comb += lease.i_done.eq(1)
                    m.d.sync += [index.eq(0), closing_all.eq(0), swept_last.eq(1)]
                    m.next = "SWEEP_READ"
                # The IB side's requests (a close first), but never two in a row while
                # datagrams wait.
                with m.Elif(~self.i_qp_write.valid & ib_valid & ~(ib & parse.o.valid)):
                    m.d.sync += [ib.eq(1), user.eq(0)]
                    m.next = "IB_TAKE"
                # User logic's connects, but never two in a row while datagrams wait.
                with m.Elif(~self.i_qp_write.valid & self.i_connect.valid
                            & ~(user & parse.o.valid)):
                    asked = self.i_connect.p
                    m.d.comb += self.i_connect.ready.eq(1)
                    m.d.sync += [
                        user.eq(1),
                        ib.eq(0),
                        swept_last.eq(0),
                        request.eq(0),
                        request.flags.info_valid.eq(1),
                        request.flags.request.eq(Request.CONNECT),
                        request.loc.ip.eq(asked.remote_ip),
                        request.length.eq(asked.port),
                        request.txmeta.path_mtu.eq(asked.path_mtu),
                        source_ip.eq(asked.remote_ip),
                        allowed.eq(1),
                        good_length.eq(1),
                        loc_is_source.eq(1),
                        close_all.eq(0),
                    ]
                    m.next = "DECODE"
                with m.Elif(~self.i_qp_write.valid & parse.o.valid):
                    m.d.sync += [swept_last.eq(0), ib.eq(0), user.eq(0), opened_length.eq(0)]
                    m.next = "RECEIVE"

            with m.State("RECEIVE"):
                m.d.comb += parse.o.ready.eq(1)
                with m.If(parse.o.valid):
                    m.d.sync += first_beat.eq(parse.o.p.last)
                    with m.If(first_beat):
                        meta = parse.o.p.meta
                        asked_qpn = meta.cm.rem.qpn[:24]
                        m.d.sync += [
                            request.eq(meta.cm),
                            in_range.eq((asked_qpn >= FIRST_QPN) &
                                        (asked_qpn < FIRST_QPN + qps)),
                            close_all.eq(asked_qpn == CLOSE_ALL_QPN),
                            loc_is_source.eq(meta.cm.loc.ip == meta.ip.src),
                            source_ip.eq(meta.ip.src),
                            allowed.eq(access.o_allowed),
                            source_port.eq(meta.udp.src_port),
                            good_length.eq(meta.udp.length == UDP.length + CM_DATAGRAM.length),
                        ]
                    with m.If(parse.o.p.last):
                        m.next = "DECODE"

            # The IB side's request, taken as a datagram that DECODE serves.
            with m.State("IB_TAKE"):
                m.d.sync += [
                    request.flags.eq(0),
                    request.flags.info_valid.eq(1),
                    request.txmeta.eq(0),
                    good_length.eq(1),
                    loc_is_source.eq(1),
                    close_all.eq(0),
                ]
                m.next = "DECODE"
                with m.If(self.i_ib_close.valid):
                    m.d.comb += self.i_ib_close.ready.eq(1)
                    m.d.sync += [
                        request.flags.request.eq(Request.CLOSE_QP),
                        request.rem.qpn.eq(FIRST_QPN + self.i_ib_close.p),
                        in_range.eq(self.i_ib_close.p < qps),
                        allowed.eq(1),
                    ]
                with m.Elif(self.i_ib_open.valid):
                    opening = self.i_ib_open.p
                    m.d.comb += self.i_ib_open.ready.eq(1)
                    m.d.sync += [
                        request.flags.request.eq(Request.OPEN_QP),
                        request.loc.ip.eq(opening.remote_ip),
                        request.loc.qpn.eq(opening.remote_qpn),
                        request.loc.psn.eq(opening.next_psn),
                        request.loc.rkey.eq(opening.rkey),
                        request.loc.base_addr.eq(opening.base),
                        request.txmeta.path_mtu.eq(opening.path_mtu),
                        source_ip.eq(opening.remote_ip),
                        allowed.eq(ib_access.o_allowed),
                        ib_timers.timeout.eq(opening.timeout),
                        ib_timers.retry_count.eq(opening.retry_count),
                        ib_timers.rnr_retry.eq(opening.rnr_retry),
                        opened_length.eq(opening.length),
                    ]
                with m.Elif(self.i_ib_connected.valid):
                    m.d.comb += self.i_ib_connected.ready.eq(1)
                    answered = self.i_ib_connected.p
                    m.d.sync += [outcome.eq(answered), index.eq(answered.qp), ib.eq(0),
                                 opened_length.eq(answered.length)]
                    m.next = "CONCLUDE_READ"
                with m.Else():
                    m.next = "IDLE"         # (``ib_valid`` lags the handshake by a cycle)

            with m.State("DECODE"):
                kind = request.flags.request
                m.d.sync += [index.eq(named), scan.eq(0), fetched.eq(qps), probe.eq(qps),
                             matched.eq(0), free.eq(0), best_rank.eq(0)]
                m.next = "IDLE"
                with m.If(~allowed):
                    m.d.comb += counts["access"].eq(1)
                    with m.If(ib):
                        ib_reply(refusal=OpenRefusal.DENIED)
                with m.Elif(~good_length):
                    m.d.comb += length_bad.eq(1)
                with m.Elif(~request.flags.info_valid | request.flags.ack_valid):
                    m.d.comb += counts["malformed"].eq(1)
                with m.Elif((kind == Request.OPEN_QP) | (kind == Request.SEND_QP_INFO)
                            | (kind == Request.MODIFY_QP_RTS)):
                    with m.If(loc_is_source):
                        m.d.sync += scanning.eq(1)
                        m.next = "SCAN"
                    with m.Else():
                        m.d.comb += counts["spoofed"].eq(1)
                with m.Elif(kind == Request.CONNECT):
                    with m.If(~loc_is_source):
                        m.d.comb += counts["spoofed"].eq(1)
                    with m.Elif((asked_mtu == 0) | (asked_mtu > PathMtu.MTU_4096.value)):
                        m.d.comb += counts["malformed"].eq(1)
                        connect_failed(RejectReason.INVALID_MTU)
                    with m.Else():
                        m.d.sync += scanning.eq(1)
                        m.next = "SCAN"
                with m.Elif((kind == Request.CLOSE_QP) & close_all):
                    m.d.sync += [index.eq(0), closing_all.eq(1), closed_count.eq(0)]
                    m.next = "SWEEP_READ"
                with m.Elif((kind == Request.CLOSE_QP) | (kind == Request.STATUS)):
                    with m.If(in_range):
                        m.next = "READ"
                    with m.Else():
                        m.d.comb += counts["no_qp"].eq(~ib)
                        answer(Ack.NO_QP)
                        with m.If(ib):
                            m.next = "IDLE"
                with m.Elif((kind == Request.NULL) & run_meta.valid & run_meta.start
                            & run_meta.credited
                            & (~run_meta.write | (request.rem.base_addr == 0))):
                    m.d.comb += counts["credit_refused"].eq(1)
                with m.Elif((kind == Request.NULL)
                            & ((run_meta.valid & run_meta.start) | is_credit)):
                    with m.If(in_range):
                        m.next = "READ"
                    with m.Else():
                        m.d.comb += counts["qpn"].eq(1)
                with m.Else():
                    m.d.comb += counts["request"].eq(1)

            with m.State("SCAN"):
                # One QP per cycle: read ``scan``, check ``probe`` (read two cycles before).
                m.d.sync += [scan.eq(scan + 1), fetched.eq(scan), probe.eq(fetched),
                             fetched_rank.eq(Mux(scan == freed_last, 1,
                                                 Mux(scan >= rover, 3, 2))),
                             probe_rank.eq(fetched_rank)]
                with m.If(probe != qps):
                    with m.If(entry.open & Mux(is_connect, entry_connects, entry_requester)
                              & ~ib):
                        m.d.sync += [matched.eq(1), index.eq(probe), found.eq(entry)]
                    with m.If(~entry.open & ~free):
                        m.d.sync += [free.eq(1), free_index.eq(probe)]
                    with m.If(~entry.open & (probe_rank > best_rank)):
                        m.d.sync += [best_rank.eq(probe_rank), best_index.eq(probe)]
                with m.If(matched | (probe == qps - 1)):
                    m.d.sync += scanning.eq(0)
                    m.next = "SCANNED"

            with m.State("SCANNED"):
                new = Signal(CM_ENTRY)
                m.d.comb += [
                    new.open.eq(1),
                    new.host_ip.eq(request.loc.ip),
                    new.host_qpn.eq(request.loc.qpn[:24]),
                    new.psn.eq(Mux(ib, request.loc.psn[:24], psn)),
                    new.path_mtu.eq(mtu),
                    new.base.eq(request.loc.base_addr),
                ]
                with m.If(matched):
                    m.d.comb += [
                        entry_write.addr.eq(index),
                        entry_write.data.eq(found),
                        entry_write.data.age.eq(0),
                        entry_write.en.eq(1),
                    ]
                    with m.If(found.connecting):    # a CONNECT's retry: answered when done
                        m.next = "IDLE"
                    with m.Else():
                        answer(Ack.ACK, found)
                with m.Elif(is_connect & ~free):
                    m.d.comb += counts["no_qp"].eq(1)
                    connect_failed(RejectReason.NO_RESOURCES)
                with m.Elif(is_connect):
                    # The QP held for the connection; the IB CM sends the REQ.
                    m.d.comb += [
                        entry_write.addr.eq(chosen),
                        entry_write.data.open.eq(1),
                        entry_write.data.host_ip.eq(request.loc.ip),
                        entry_write.data.path_mtu.eq(asked_mtu[:3]),
                        entry_write.data.connect.eq(1),
                        entry_write.data.connecting.eq(1),
                        entry_write.data.rdma_port.eq(request.length[:16]),
                        entry_write.en.eq(1),
                        replies_write.addr.eq(chosen),
                        replies_write.data.port.eq(Mux(request.reply_port != 0,
                                                       request.reply_port, source_port)),
                        replies_write.data.loc.eq(request.loc),
                        replies_write.data.user.eq(user),
                        replies_write.en.eq(1),
                        counts["connects"].eq(1),
                    ]
                    m.d.sync += [
                        rover.eq(chosen + 1),
                        self.o_ib_connect.p.qp.eq(chosen),
                        self.o_ib_connect.p.remote_ip.eq(request.loc.ip),
                        self.o_ib_connect.p.port.eq(request.length[:16]),
                        self.o_ib_connect.p.path_mtu.eq(asked_mtu[:3]),
                    ]
                    m.next = "CONNECT"
                with m.Elif(request.flags.request != Request.OPEN_QP):
                    m.d.comb += counts["no_qp"].eq(1)
                    answer(Ack.NO_QP)
                with m.Elif(asked_mtu > PathMtu.MTU_4096.value):
                    m.d.comb += counts["malformed"].eq(1)
                    answer(Ack.NAK)
                with m.Elif(~free):
                    m.d.comb += counts["no_qp"].eq(1)
                    reply_or_ib(Ack.NO_QP, OpenRefusal.NO_QP)
                with m.Else():
                    m.d.comb += [
                        entry_write.addr.eq(chosen),
                        entry_write.data.eq(new),
                        entry_write.en.eq(1),
                        counts["opened"].eq(1),
                    ]
                    with m.If(ib):
                        m.d.sync += rover.eq(chosen + 1)
                    m.d.sync += [
                        index.eq(chosen),
                        found.eq(new),
                        write.qp.eq(chosen),
                        write.state.remote_qpn.eq(new.host_qpn),
                        write.state.next_psn.eq(new.psn),
                        write.state.rkey.eq(request.loc.rkey),
                        write.state.remote_ip.eq(new.host_ip),
                        write.state.path_mtu.eq(new.path_mtu),
                        write.state.src_port.eq(chosen),
                        write.state.timeout.eq(Mux(ib, ib_timers.timeout,
                                                   self.i_config.timeout)),
                        write.state.retry_count.eq(Mux(ib, ib_timers.retry_count,
                                                       self.i_config.retry_count)),
                        write.state.rnr_retry.eq(Mux(ib, ib_timers.rnr_retry,
                                                     self.i_config.rnr_retry)),
                    ]
                    m.next = "SET_QP"

            with m.State("CONNECT"):
                m.d.comb += self.o_ib_connect.valid.eq(1)
                with m.If(self.o_ib_connect.ready):
                    m.next = "IDLE"

            # The IB CM's answer to a CONNECT: the QP's entry and where the reply goes,
            # then the connection's QP set and CONNECT/ACK, or the QP freed and
            # CONNECT/NAK (the REJ reason in ``count``). A QP freed meanwhile: nothing.
            with m.State("CONCLUDE_READ"):
                m.next = "CONCLUDE_FETCH"
            with m.State("CONCLUDE_FETCH"):
                m.next = "CONCLUDE_LOAD"
            with m.State("CONCLUDE_LOAD"):
                echo = replies_read.data
                m.d.sync += [
                    request.eq(0),
                    request.flags.info_valid.eq(1),
                    request.flags.request.eq(Request.CONNECT),
                    request.loc.eq(echo.loc),
                    request.reply_port.eq(echo.port),
                    request.length.eq(entry.rdma_port),
                    source_ip.eq(entry.host_ip),
                    user.eq(echo.user),
                ]
                m.next = "CONCLUDE"
            with m.State("CONCLUDE"):
                connected = Signal(CM_ENTRY)
                m.d.comb += [
                    connected.eq(entry),
                    connected.connecting.eq(0),
                    connected.host_qpn.eq(outcome.remote_qpn),
                    connected.psn.eq(outcome.next_psn),
                    connected.base.eq(outcome.base),
                    connected.age.eq(0),
                    entry_write.addr.eq(index),
                ]
                with m.If(~(entry.open & entry.connect & entry.connecting)):
                    m.next = "IDLE"
                with m.Elif(outcome.accepted):
                    m.d.comb += [entry_write.data.eq(connected), entry_write.en.eq(1),
                                 counts["connected"].eq(1)]
                    m.d.sync += [
                        found.eq(connected),
                        write.qp.eq(index),
                        write.state.remote_qpn.eq(outcome.remote_qpn),
                        write.state.next_psn.eq(outcome.next_psn),
                        write.state.rkey.eq(outcome.rkey),
                        write.state.remote_ip.eq(entry.host_ip),
                        write.state.path_mtu.eq(entry.path_mtu),
                        write.state.src_port.eq(index),
                        write.state.timeout.eq(self.i_config.timeout),
                        write.state.retry_count.eq(self.i_config.retry_count),
                        write.state.rnr_retry.eq(outcome.rnr_retry),
                    ]
                    m.next = "SET_QP"
                with m.Else():
                    m.d.comb += [entry_write.data.eq(0), entry_write.en.eq(1)]
                    connect_failed(outcome.reason, qp=index)

            with m.State("SET_QP"):
                m.d.comb += self.o_qp_write.valid.eq(1)
                with m.If(self.o_qp_write.ready):
                    m.d.comb += [
                        events.w_en.eq(1),
                        event.event.eq(ConnectionEvent.OPENED),
                        event.state.eq(write.state),
                        event.base.eq(found.base),
                        event.length.eq(opened_length),
                        event.port.eq(found.rdma_port),
                    ]
                    answer(Ack.ACK, found)
                    with m.If(ib):
                        ib_reply(qp=index)

            with m.State("READ"):
                m.next = "FETCH"

            with m.State("FETCH"):
                m.next = "CHECK"

            with m.State("CHECK"):
                kind = request.flags.request
                m.d.sync += found.eq(refreshed)
                with m.If(from_host & (kind != Request.CLOSE_QP)):
                    m.d.comb += [
                        entry_write.addr.eq(index),
                        entry_write.data.eq(refreshed),
                        entry_write.en.eq(1),
                    ]
                with m.If(kind == Request.STATUS):
                    status = self.status
                    m.d.sync += [
                        reply.eq(0),
                        status_reply.flags.info_valid.eq(1),
                        status_reply.flags.request.eq(Request.STATUS),
                        status_reply.flags.ack_valid.eq(1),
                        status_reply.flags.ack.eq(Ack.ACK),
                        status_reply.qpn.eq(FIRST_QPN + index),
                        status_reply.status.open.eq(entry.open),
                        status_reply.status.running.eq(self.run.running),
                        status_reply.status.messages.eq(self.run.messages),
                        status_reply.status.error.eq(status.error),
                        status_reply.status.error_status.eq(status.error_status),
                        status_reply.status.outstanding.eq(status.outstanding),
                        status_reply.status.runs.eq(entry.runs),
                    ]
                    for name, _ in CM_STATUS:
                        if name in QP_COUNTERS.members:
                            m.d.sync += status_reply.status[name].eq(status.counters[name])
                    m.next = "REPLY"
                with m.Elif(kind == Request.CLOSE_QP):
                    with m.If(from_host):
                        m.d.comb += [
                            entry_write.addr.eq(index),
                            entry_write.data.eq(0),
                            entry_write.en.eq(1),
                            counts["closed"].eq(1),
                        ]
                        m.next = "STOP"
                    with m.Elif(entry.open):
                        m.d.comb += counts["spoofed"].eq(1)
                        m.next = "IDLE"
                    with m.Else():
                        m.d.comb += counts["no_qp"].eq(~ib)
                        answer(Ack.NO_QP)
                        with m.If(ib):
                            m.next = "IDLE"         # an IB close of a QP already free
                with m.Else():
                    verb = Mux(request.txmeta.write,
                               Mux(request.txmeta.immediate, Verb.RDMA_WRITE_WITH_IMMEDIATE,
                                   Verb.RDMA_WRITE),
                               Mux(request.txmeta.immediate, Verb.SEND_WITH_IMMEDIATE,
                                   Verb.SEND))
                    m.d.sync += [
                        run.qp.eq(index),
                        run.verb.eq(verb),
                        run.length.eq(request.length),
                        run.count.eq(request.count),
                        run.divider.eq(request.divider),
                        run.base.eq(entry.base),
                        run.ring.eq(request.rem.base_addr),
                        run.credited.eq(run_meta.credited),
                    ]
                    with m.If(from_host & is_credit):
                        m.next = "CREDIT"
                    with m.Elif(from_host):
                        m.next = "START"
                    with m.Elif(entry.open):
                        m.d.comb += counts["spoofed"].eq(1)
                        m.next = "IDLE"
                    with m.Else():
                        m.d.comb += counts["start_closed"].eq(1)
                        m.next = "IDLE"

            # The stop a cycle after the verdict, from the state alone: the entry's
            # compares do not chain with the stop of the pool's generator.
            with m.State("STOP"):
                m.d.comb += self.o_stop.valid.eq(1)
                m.next = "CLOSE"

            with m.State("CLOSE"):
                m.d.comb += self.o_qp_close.valid.eq(1)
                with m.If(self.o_qp_close.ready):
                    m.d.comb += [events.w_en.eq(1), event.event.eq(ConnectionEvent.CLOSED)]
                    answer(Ack.ACK, found)
                    with m.If(ib):
                        m.next = "IDLE"

            # The sweep: one QP every four cycles (``index`` → its entry read → entry,
            # status and run → the verdict, a register: the engine's status and the pool's
            # run do not chain with the stop of the pool's generator → the entry written,
            # the QP stopped).
            def next_qp():
                m.d.sync += index.eq(index + 1)
                m.next = "SWEEP_READ"
                with m.If(index == qps - 1):
                    m.next = "IDLE"
                    with m.If(closing_all):
                        answer(Ack.ACK)
                        m.d.sync += reply.count.eq(closed_count)

            sweep_close = Signal()              # the QP read is to be freed
            with m.State("SWEEP_READ"):
                m.next = "SWEEP_FETCH"

            with m.State("SWEEP_FETCH"):
                m.next = "SWEEP_CHECK"

            with m.State("SWEEP_CHECK"):
                idle = self.status.error | ((self.status.outstanding == 0) & ~self.run.running)
                expired = entry.open & (entry.age == LEASE_SWEEPS) & idle
                m.d.sync += sweep_close.eq(Mux(closing_all, from_host, expired))
                m.next = "SWEEP_ACT"

            with m.State("SWEEP_ACT"):
                aged = Signal(CM_ENTRY)
                m.d.comb += [aged.eq(entry), aged.age.eq(entry.age + (entry.age != LEASE_SWEEPS))]
                with m.If(sweep_close):
                    m.d.comb += [
                        entry_write.addr.eq(index),
                        entry_write.data.eq(0),
                        entry_write.en.eq(1),
                        self.o_stop.valid.eq(1),
                        counts["closed"].eq(closing_all),
                        counts["expired"].eq(~closing_all),
                    ]
                    m.d.sync += closed_count.eq(closed_count + 1)
                    m.next = "SWEEP_CLOSE"
                with m.Else():
                    with m.If(entry.open & ~closing_all):
                        m.d.comb += [
                            entry_write.addr.eq(index),
                            entry_write.data.eq(aged),
                            entry_write.en.eq(1),
                        ]
                    next_qp()

            with m.State("SWEEP_CLOSE"):
                m.d.comb += self.o_qp_close.valid.eq(1)
                with m.If(self.o_qp_close.ready):
                    m.d.comb += [
                        events.w_en.eq(1),
                        event.event.eq(Mux(closing_all, ConnectionEvent.CLOSED,
                                           ConnectionEvent.EXPIRED)),
                    ]
                    next_qp()

            with m.State("START"):
                counted = Signal(CM_ENTRY)
                m.d.comb += [
                    self.o_start.valid.eq(1),
                    counts["starts"].eq(self.o_start.ready),
                    counted.eq(found),
                    counted.runs.eq(found.runs + 1),
                    entry_write.addr.eq(index),
                    entry_write.data.eq(counted),
                    entry_write.en.eq(self.o_start.ready & self.start_taken),
                ]
                with m.If(self.o_start.ready):
                    m.next = "IDLE"

            with m.State("CREDIT"):
                m.d.comb += [self.o_credit.valid.eq(1), counts["credits"].eq(1)]
                m.next = "IDLE"

            with m.State("REPLY"):                # (user logic's CONNECT: its events only)
                m.d.comb += emit.i.valid.eq(~user)
                with m.If(emit.i.ready | user):
                    m.next = "IDLE"

            with m.State("IB_REPLY"):
                m.d.comb += self.o_ib_opened.valid.eq(1)
                with m.If(self.o_ib_opened.ready):
                    m.next = "IDLE"

        for name, strobe in counts.items():
            if name != "length":
                m.d.comb += self.o_counters[name].eq(event_counter(m, strobe, name))
        # (the two length drops of a cycle in a register first: the parser's ``o_truncated``
        # comes from its compare of the datagram's length, which must not chain with the add)
        length_drops = Signal(2)
        m.d.sync += [
            length_drops.eq(parse.o_truncated + length_bad),
            self.o_counters.length.eq(self.o_counters.length + length_drops),
        ]
        return m
