"""The InfiniBand CM, both sides of it: a host opens a connection to the endpoint with
``rdma_connect`` (REQ), the endpoint answers REP, the host completes it with RTU; or
the endpoint opens one to a host that listens (its REQ, the host's REP, its RTU);
either side ends it with DREQ, answered with DREP (IBTA vol. 1, chapter 12, as Linux's
``ib_cm`` and ``rdma_cm`` apply it; CM_PROTOCOL.md, "Standard RDMA CM").

:class:`IbCm` sits between QP1's receiver and transmitter (``gateware.cm.qp1``)
and asks the QP table's owner for a QP through its allocation port:

``o_open`` (:data:`CM_OPEN`)
    One request per new connection, everything the QP table needs from the REQ: the
    host's IPv4 address (the REQ's IPv4 source), its QPN (REQ Local QPN), the PSN the
    endpoint starts sending with (the REQ's Starting PSN: each side's Starting PSN is
    the PSN it expects to receive), the path MTU, retry and RNR retry counts and the
    ACK timeout (REQ Primary Local ACK Timeout), and the host buffer (rkey, base,
    length) of the private data. The table owner takes a free QP, sets it as it would
    for OPEN_QP (its own UDP source port, the fields above) and answers.
``i_opened`` (:data:`CM_OPENED`)
    The answer to the one ``o_open`` request outstanding: ``accepted`` and the QP
    index, or ``accepted`` = 0 and why (:class:`OpenRefusal`). Exactly one answer
    per request, any number of cycles after it was taken; :class:`IbCm` takes
    no other MAD meanwhile and keeps ``i_opened.ready`` high only while it waits.
``o_close`` (QP index)
    The QP of a connection the host never completed (no RTU after the REP's retries,
    or its REJ) or ended (its DREQ): the table owner frees it as for CLOSE_QP. No
    answer. Not offered for a QP the owner freed meanwhile.
``i_closed`` (QP index, always ready)
    Every QP the table owner frees on its own (CLOSE_QP, close-all, lease; those of
    ``o_close`` may come back here too): its connection is no longer served, so no
    REP, duplicate answer or ``o_close`` ever names a QP that may since belong to
    someone else; an established one is disconnected (DREQ, below). The QP's next
    ``i_opened`` makes its entry live again.
``i_connect`` (:data:`CM_CONNECT`)
    A connection the endpoint opens (the table owner's CONNECT): the QP the owner
    holds for it, the host's IPv4 address and rdma_cm port, the path MTU. Queued
    (``qps`` of them: one per QP, so never refused); the REQ goes out when the block is
    idle next.
``o_connected`` (:data:`CM_CONNECTED`)
    Once for each ``i_connect`` whose QP the owner did not free meanwhile: established
    (the RTU sent), with what the owner sets the QP from (the host's QPN, the REP's
    Starting PSN as the endpoint's first, the RNR retry count and the host buffer of
    the REP's private data), or not, with the REJ reason (4 when no REP came).

Each MAD is served whole before the next is taken (``i.ready`` is high only while
idle); the receiver before it holds one more.

- REQ (attribute 0x0010): checked in this order, the first failure answered with REJ
  (Message Rejected = REQ, Remote Comm ID = the REQ's Local Comm ID, Local Comm ID 0,
  the REQ's TID) with the reason: service ID other than RDMA_PS_TCP and ``port`` → 8
  (invalid service ID); transport not RC → 9 (invalid transport type); a ``cma_hdr``
  other than version 0, IPv4 and the endpoint's own address as destination → 28 (as
  Linux's rdma_cm, which destroys such an ID with "consumer defined"); user private
  data version other than 1 → 28; path MTU not 256..4096 or above ``i_config.max_mtu``
  → 26 (invalid MTU). A REQ whose Remote Comm ID (the host's Local Comm ID) and source
  address match a connection in the table is a duplicate: it gets that connection's
  REP again, byte for byte, and no QP. Otherwise one ``o_open`` request; refused →
  REJ 3 (no resources, :attr:`OpenRefusal.NO_QP`) or 28
  (:attr:`OpenRefusal.DENIED`); accepted → the connection enters the table, pending,
  and the REP goes out.
- REP: the TID of the REQ; Local Comm ID from a counter that starts at ``i_seed``
  (sampled on the first cycle after reset; 0 skipped); Remote Comm ID the REQ's
  Local Comm ID; Local QPN :data:`~gateware.roce.requests.FIRST_QPN` + QP index;
  Starting PSN from a free-running 24-bit LFSR (the PSN the endpoint would receive); responder
  resources and initiator depth 0 (no RDMA READ); Target ACK Delay
  :data:`TARGET_ACK_DELAY`; RNR retry 7; Local CA GUID the EUI-64 of ``i_config.mac``;
  private data :data:`REP_PRIVATE` (version 1, the QPN). It goes to the REQ's IPv4
  source and QP; the UDP flow is the low 14 bits of the host's comm ID.
- The REP of a pending connection is sent again when ``2^max(T - 8, 0)`` ms ticks
  (``i_config.ms_cycles`` cycles each, T the REQ's Local CM Response Timeout) have
  passed without RTU, at most Max CM Retries times; after the last such wait the QP
  goes to ``o_close`` and the connection leaves the table.
- RTU (0x0014) and REJ (0x0012) are looked up by both comm IDs and the source address.
  RTU establishes a pending connection (repeated: no change); REJ of a pending
  connection (the host gave up) closes its QP at once. Unknown: dropped and counted.
- DREQ (0x0015, the host's ``rdma_disconnect``) is looked up by both comm IDs; it
  ends a connection only if it also comes from the connection's host (IPv4 source)
  and names the endpoint's QPN as Remote QPN: the QP goes to ``o_close`` (unless the
  owner freed it already), the entry leaves, then a DREP goes out (the DREQ's TID,
  the comm IDs swapped, to its source). With the IDs of a connection but another
  source or QPN: ignored and counted (spoofed). Of no connection (e.g. the host's
  repeat after a lost DREP): answered with DREP all the same (as IBTA asks and Linux's
  ``cm_issue_drep`` does) and counted.
- When the owner frees an established connection's QP (``i_closed``), the endpoint
  sends the host a DREQ: Local and Remote Comm ID the connection's, Remote QPN the
  host's QPN (the REQ's Local QPN), TID ``0x15 << 32`` | its Local Comm ID. It is
  sent again on the REP's timer (the REQ's Local CM Response Timeout: Linux's
  passive side times its own DREQ with that cm_id timeout), at most Max CM Retries
  times, until a DREP (looked up as an RTU) or the host's own DREQ (answered with
  DREP); after the last wait the entry leaves. A connection still pending when its
  QP is freed gets no DREQ (but a REJ, below). The entry stays until then, keyed by
  its comm IDs, but its QP is free: when the owner hands the QP out again before the
  DREP, the new connection's entry replaces it (no DREQ of the old one goes out after
  that, and its late DREP finds nothing). A DREP of no disconnect: dropped and counted.
- The endpoint's REQ (``i_connect``): TID ``0x10 << 32`` | its Local Comm ID (from the
  counter above), the service ID of the host's port, the CA GUID, the QP's QPN, a
  Starting PSN from the LFSR (the PSN the endpoint would receive), RC, Remote and Local
  CM Response Timeout ``i_config.req_timeout``, retry and RNR retry counts 7, P_Key
  0xFFFF, the path MTU, Max CM Retries :data:`REQ_RETRIES`, the path as rdma_cm fills it
  over RoCE (permissive LIDs, the IPv4-mapped addresses as GIDs, hop limit 64, Local ACK
  Timeout :data:`LOCAL_ACK_TIMEOUT`), and as private data the ``cma_hdr`` (version 0,
  IPv4, the QP's UDP source port, the endpoint's and the host's addresses) then
  :data:`REP_PRIVATE`'s 8 bytes (version 1, the QPN). It is sent again every
  ``2^max(req_timeout - 8, 0)`` ms without answer, at most :data:`REQ_RETRIES` times;
  after the last wait the entry leaves and ``o_connected`` reports reason 4.
- The host's REP, MRA and REJ of the endpoint's REQ are looked up by the REQ's comm ID
  (their Remote Comm ID) and the source address. REP: the host's comm ID and QPN enter
  the entry, established; the RTU goes out (the REQ's TID), then ``o_connected``
  (accepted). A REP whose private data (:data:`ACCEPT_PRIVATE`: the 24 bytes of a
  REQ's user part) has another version is answered with REJ 28 (Message Rejected REP)
  and reported so. A REP again for an established connection (the RTU was lost) gets
  the RTU again. MRA of the REQ: its next retransmission waits the MRA's service
  timeout and the REQ's own more (as Linux's ``cm_mra_handler``). REJ of the REQ
  (Message Rejected REQ): the entry leaves, ``o_connected`` reports its reason.
  Established, the connection is served as a passive one: DREQ both ways.
- A pending connection (REP sent) whose QP the owner frees gets REJ 28 (Message
  Rejected REP, the comm IDs, the REQ's TID), as Linux's ``cm_destroy_id`` sends in
  that state; an unanswered REQ of the endpoint's is dropped, unreported.
- Any other attribute is dropped and counted.

The table has one entry per QP (``qps``), indexed by QP index: a connection's entry
lives from its ``i_opened`` until its QP is closed (``o_close`` or ``i_closed``), its
disconnect ends, or its QP is handed out again; an established connection's stays
while its QP is open, to answer a repeated REQ. Lookups and the sweep read one entry
every three cycles from a memory with a registered read port; each ms tick (which
counts the timers down) and each ``i_closed`` (which starts disconnects) starts a
sweep of the whole table when the block is idle next. Nothing runs a compare across
the table.

``o_counters`` (:meth:`IbCm.counters_layout`) counts REPs sent first, repeated
for a duplicate REQ and retransmitted; connections established and expired; REJs
sent by reason; DREQs of the host served, spoofed and unknown; the endpoint's DREQs
sent, retransmitted and unanswered; DREPs taken and unknown; the endpoint's REQs sent,
retransmitted, unanswered and rejected, MRAs taken, connections it opened, RTUs sent
again; MADs dropped by reason (``attribute``, ``unknown``).
"""

from amaranth import *
from amaranth.lib import data, enum, fifo, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from ..counters import counters_layout, event_counter
from ..headers import (
    CM_CLASS_VERSION,
    CM_DREP,
    CM_DREQ,
    CM_MRA,
    CM_REJ,
    CM_REP,
    CM_REQ,
    CM_RTU,
    CMA_HEADER,
    MAD_BASE_VERSION,
    METHOD_SEND,
    MGMT_CLASS_CM,
    CmAttribute,
    NetworkLayout,
)
from ..roce.flag_memory import FlagMemory, block_ram_attrs, write_flags
from ..roce.requests import (
    FIRST_QPN,
    QP_INDEX_BITS,
    QP_STATE,
    PathMtu,
    check_qp_count,
    psn_sequence,
)
from .datagram import CM_PORT
from .qp1 import QP1_RECEIVED, QP1_SEND

__all__ = ["IbCm", "CM_OPEN", "CM_OPENED", "CM_CONNECT", "CM_CONNECTED", "OpenRefusal",
           "IB_CM_CONFIG", "REQ_PRIVATE", "REP_PRIVATE", "CONNECT_REQ_PRIVATE", "ACCEPT_PRIVATE",
           "RejectReason", "RDMA_PS_TCP", "TARGET_ACK_DELAY", "REQ_RETRIES", "LOCAL_ACK_TIMEOUT"]

#: rdma_cm's TCP port space: service ID = RDMA_PS_TCP << 16 | port.
RDMA_PS_TCP = 0x0106
#: The REP's Target ACK Delay: the host's QP timeout and TimeWait grow with it.
TARGET_ACK_DELAY = 15
#: The version of the private data after the cma_hdr (REQ) and of the REP's.
PRIVATE_VERSION = 1
#: The high 32 bits of the TID of the endpoint's DREQ (the low 32: its Local Comm ID).
DREQ_TID_HIGH = Const(0x0000_0015, 32)
#: The high 32 bits of the TID of the endpoint's REQ and of the RTU that completes it.
REQ_TID_HIGH = Const(0x0000_0010, 32)
#: The endpoint's REQ: retransmissions after the first (with a 1 s response timeout, five
#: REQs in about 5 s).
REQ_RETRIES = 4
#: The endpoint's REQ: the Local ACK Timeout it asks of the host (its QP's timeout and
#: TimeWait: 2^(17 - 8) ms).
LOCAL_ACK_TIMEOUT = 17
#: IPv4-mapped IPv6 (the RoCEv2 GIDs of a REQ's path): ::ffff:a.b.c.d.
IPV4_MAPPED = Const(0xFFFF, 16)


class OpenRefusal(enum.Enum, shape=1):
    """Why the QP table owner refused an ``o_open`` request."""
    NO_QP = 0                   # no QP free: REJ 3
    DENIED = 1                  # the host may not open a QP (access list): REJ 28


class RejectReason(enum.IntEnum):
    """The REJ reasons the endpoint sends or reports (IBTA table 109, Linux ib_cm.h)."""
    NO_RESOURCES = 3
    TIMEOUT = 4                 # reported for a REQ that no REP answered
    INVALID_SERVICE_ID = 8
    INVALID_TRANSPORT = 9
    INVALID_MTU = 26
    CONSUMER_DEFINED = 28


#: The endpoint's two private data layouts (CM_PROTOCOL.md, "Standard RDMA CM"): a host's
#: buffer (its REQ to the endpoint, its REP to the endpoint's REQ) and the endpoint's QPN
#: (its REP, its REQ).
_BUFFER_FIELDS = {"version": 8, "reserved_1": 24, "rkey": 32, "base": 64, "length": 64}
_QPN_FIELDS = {"version": 8, "reserved_1": 24, "qpn": 32}


def _private_data(fields, *, req):
    """``fields`` as a CM message's private data, zero after them: a REQ's 92 bytes, after
    the cma_hdr rdma_cm puts first (``req``), or a REP's 196."""
    head = {"cma": CMA_HEADER} if req else {}
    used = sum(Shape.cast(shape).width for shape in {**head, **fields}.values())
    return NetworkLayout({**head, **fields, "rest": 8 * (92 if req else 196) - used})


#: A REQ's 92 bytes of private data from a host: the cma_hdr, then its buffer.
REQ_PRIVATE = _private_data(_BUFFER_FIELDS, req=True)
#: The endpoint's REP's 196 bytes of private data: its QPN.
REP_PRIVATE = _private_data(_QPN_FIELDS, req=False)
#: The endpoint's REQ's 92 bytes of private data: the cma_hdr, then its QPN.
CONNECT_REQ_PRIVATE = _private_data(_QPN_FIELDS, req=True)
#: The host's REP private data (its ``rdma_accept``): its buffer, as in its REQ.
ACCEPT_PRIVATE = _private_data(_BUFFER_FIELDS, req=False)

#: An allocation request: what the QP table needs of a REQ.
CM_OPEN = data.StructLayout({
    "remote_ip": 32,
    "remote_qpn": 24,
    "next_psn": 24,             # the REQ's Starting PSN: the endpoint's first PSN
    "path_mtu": PathMtu,
    "timeout": QP_STATE.members["timeout"],
    "retry_count": QP_STATE.members["retry_count"],
    "rnr_retry": QP_STATE.members["rnr_retry"],
    "rkey": 32,
    "base": 64,
    "length": 64,               # 0: unbounded, as OPEN_QP
})

#: The answer to an allocation request.
CM_OPENED = data.StructLayout({
    "accepted": 1,
    "qp": QP_INDEX_BITS,        # accepted: the QP taken
    "refusal": OpenRefusal,     # not accepted: why
})

#: A connection the endpoint opens (its REQ): the QP the table owner took for it, and
#: the host's address, rdma_cm port and the path MTU.
CM_CONNECT = data.StructLayout({
    "qp": QP_INDEX_BITS,
    "remote_ip": 32,
    "port": 16,
    "path_mtu": PathMtu,
})

#: How a connection the endpoint opened ended: established (the RTU sent) with the
#: host's QPN, the PSN the endpoint starts sending with (the REP's Starting PSN), the
#: RNR retry count the host asks for and the host's buffer of its private data; or not,
#: with the REJ reason (:attr:`RejectReason.TIMEOUT` when no REP came).
CM_CONNECTED = data.StructLayout({
    "qp": QP_INDEX_BITS,
    "accepted": 1,
    "reason": 8,
    "remote_qpn": 24,
    "next_psn": 24,
    "rnr_retry": 3,
    "rkey": 32,
    "base": 64,
    "length": 64,
})

#: What the IB CM is told at run time.
IB_CM_CONFIG = data.StructLayout({
    "mac": 48,                  # the endpoint's MAC: its CA GUID is the EUI-64 of it
    "ip": 32,                   # the endpoint's IPv4 address: the cma_hdr's destination
    "max_mtu": PathMtu,         # the largest path MTU a REQ may ask for
    "ms_cycles": 24,            # cycles per millisecond tick of the CM timers (0: no ticks)
    "req_timeout": 5,           # the REQ's CM Response Timeouts: 2^(t - 8) ms between REQs
})


class _State(enum.Enum, shape=3):
    FREE = 0
    PENDING = 1                 # REP sent, waiting for RTU
    ESTABLISHED = 2
    DISCONNECTING = 3           # its QP freed by the table owner; DREQ sent, waiting for DREP
    REQ_SENT = 4                # the endpoint's REQ sent, waiting for REP


class _Send(enum.Enum, shape=3):
    """What goes out: built from the entry (REP, DREQ, REQ, RTU, and a REJ of the
    entry's connection) or from the MAD served (REJ, DREP)."""
    REP = 0
    DREQ = 1
    REQ = 2
    RTU = 3
    REJ_ENTRY = 4
    REJ = 5
    DREP = 6


#: One connection in the table (entry i holds QP index i's).
_ENTRY = data.StructLayout({
    "state": _State,
    "tid": 64,
    "local_comm_id": 32,
    "remote_comm_id": 32,
    "peer_ip": 32,
    "peer_qp": 24,
    "host_qpn": 24,             # the REQ's Local QPN: a DREQ's Remote QPN
    "psn": 24,                  # the Starting PSN of the endpoint's REP or REQ
    "port": 16,                 # the endpoint's REQ: the host's rdma_cm port
    "path_mtu": PathMtu,        # the endpoint's REQ: its path MTU
    "response_timeout": 5,      # the REQ's Local CM Response Timeout
    "max_retries": 4,           # the REQ's Max CM Retries
    "retries": 4,               # retransmissions left
    "ticks": 24,                # ms ticks left before the next retransmission
})

def _interval(response_timeout):
    """Ticks of 1 ms in 2^max(T - 8, 0) ms, as Linux's ``cm_convert_to_ms``."""
    return Mux(response_timeout > 8, Const(1, 24) << (response_timeout - 8)[:5], 1)[:24]


class IbCm(wiring.Component):
    """The endpoint's side of connections hosts open with ``rdma_connect`` (see the
    module's description for the protocol and the allocation port).

    Latency (cycles from the clock edge that takes the MAD or answer to the one after
    which the result is offered): a REQ's REJ 3; a duplicate REQ's REP 3 + 3 × (i + 1),
    found in entry i; ``o_open`` for a new REQ after the whole table, 3 + 3 × ``qps``;
    a new REP 2 after ``i_opened``. A retransmitted REP or DREQ (or an ``o_close``) of
    entry i is offered 3 × i + 5 cycles after the ms tick that ends its wait when the
    block is idle then (ticks every ``ms_cycles`` cycles from reset); a DREQ 3 × i + 6
    cycles after the ``i_closed`` that starts it, likewise. A host's DREQ found in
    entry i: its ``o_close`` 2 + 3 × (i + 1) after it is taken, the DREP the cycle after
    the close is taken; of no connection: the DREP 2 + 3 × ``qps`` after it is taken.

    Parameters
    ----------
    qps : int
        QPs in the table owner's table (1..4096): one connection entry each.
    port : int
        The rdma_cm port (RDMA_PS_TCP) the endpoint listens on.
    """

    @staticmethod
    def counters_layout():
        """``o_counters``: REPs sent for a new connection (``rep_sent``), again for a
        duplicate REQ (``rep_repeated``) and on timeout (``rep_retransmitted``);
        connections established by RTU, ``expired`` after the retries, closed by the
        host's REJ (``rejected_by_host``); REJs sent by cause (``rej_service`` 8,
        ``rej_transport`` 9, ``rej_address`` and ``rej_version`` 28, ``rej_mtu`` 26,
        ``rej_no_qp`` 3, ``rej_denied`` 28); the host's DREQs: of a connection, its QP
        freed and DREP sent (``dreq_received``), with a connection's comm IDs from
        another source or naming another QPN, ignored (``dreq_spoofed``), of no
        connection, DREP sent (``dreq_unknown``); the endpoint's DREQs: first
        (``dreq_sent``), again on timeout (``dreq_retransmitted``), given up after the
        retries (``dreq_expired``); DREPs that end a disconnect (``drep_received``) and
        DREPs of none, dropped (``drep_unknown``); a pending connection whose QP the
        owner freed, REJ 28 sent (``rej_freed``); the endpoint's REQs: first
        (``req_sent``), again on timeout (``req_retransmitted``), unanswered after the
        retries (``req_expired``), rejected by the host (``req_rejected``); MRAs of them
        (``mra_received``); connections the endpoint opened (``connected``); RTUs sent
        again for a repeated REP (``rtu_repeated``); REPs whose private data has another
        version, REJ 28 sent (``rej_accept_version``); MADs dropped: another attribute
        than REQ, MRA, REJ, REP, RTU, DREQ, DREP (``attribute``), an RTU, REJ, REP or MRA
        of no connection in a state to take it (``unknown``)."""
        return counters_layout(
            "rep_sent", "rep_repeated", "rep_retransmitted", "established", "expired",
            "rejected_by_host", "rej_service", "rej_transport", "rej_address", "rej_version",
            "rej_mtu", "rej_no_qp", "rej_denied", "attribute", "unknown",
            "dreq_received", "dreq_spoofed", "dreq_unknown", "dreq_sent", "dreq_retransmitted",
            "dreq_expired", "drep_received", "drep_unknown", "rej_freed",
            "req_sent", "req_retransmitted", "req_expired", "req_rejected", "mra_received",
            "connected", "rtu_repeated", "rej_accept_version")

    def __init__(self, *, qps, port=CM_PORT):
        self._qps = check_qp_count(qps)
        if not isinstance(port, int) or not 0 <= port < 1 << 16:
            raise ValueError(f"Port must be an integer 0..65535, not {port!r}")
        self._port = port
        super().__init__({
            "i": In(stream.Signature(QP1_RECEIVED)),
            "o": Out(stream.Signature(QP1_SEND)),
            "o_open": Out(stream.Signature(CM_OPEN)),
            "i_opened": In(stream.Signature(CM_OPENED)),
            "o_close": Out(stream.Signature(QP_INDEX_BITS)),
            "i_closed": In(stream.Signature(QP_INDEX_BITS, always_ready=True)),
            "i_connect": In(stream.Signature(CM_CONNECT)),
            "o_connected": Out(stream.Signature(CM_CONNECTED)),
            "i_config": In(IB_CM_CONFIG),
            "i_seed": In(32),
            "o_counters": Out(self.counters_layout()),
        })

    @property
    def qps(self):
        return self._qps

    @property
    def port(self):
        return self._port

    @property
    def service_id(self):
        return RDMA_PS_TCP << 16 | self._port

    def elaborate(self, platform):
        m = Module()
        config = self.i_config
        last_qp = self._qps - 1

        # The table in block RAM from BLOCK_DEPTH entries on (its one read port is
        # registered): Yosys would take distributed RAM, some 20,000 LUTs at 4,096 QPs.
        m.submodules.table = table = memory.Memory(
            shape=_ENTRY, depth=self._qps, init=[], attrs=block_ram_attrs(self._qps))
        read = table.read_port()
        write = table.write_port()
        # Connections to open: at most one per QP, so the queue never refuses one.
        m.submodules.connects = connects = fifo.SyncFIFOBuffered(width=CM_CONNECT.size,
                                                                 depth=self._qps)
        connecting = Signal(CM_CONNECT)
        m.d.comb += [
            connects.w_data.eq(self.i_connect.payload),
            connects.w_en.eq(self.i_connect.valid),
            self.i_connect.ready.eq(connects.w_rdy),
            connecting.eq(connects.r_data),
        ]

        # Free-running: the ms tick, the PSN LFSR, the comm ID counter.
        tick_count = Signal(24)
        tick = Signal()
        m.d.comb += tick.eq((tick_count == 0) & (config.ms_cycles != 0))
        m.d.sync += tick_count.eq(Mux(tick_count == 0, config.ms_cycles - 1, tick_count - 1))
        sweep_due = Signal()                # a tick: the sweep counts the timers down
        close_due = Signal()                # a QP freed: the sweep starts its disconnect
        counting = Signal()                 # the sweep running counts the timers down
        with m.If(tick):
            m.d.sync += sweep_due.eq(1)

        psn = psn_sequence(m, init=1)      # the REP's Starting PSN

        comm_id = Signal(32)
        seeded = Signal()
        next_comm_id = Signal(32)
        m.d.comb += next_comm_id.eq(comm_id + 1)
        with m.If(~seeded):
            m.d.sync += [comm_id.eq(Mux(self.i_seed == 0, 1, self.i_seed)), seeded.eq(1)]

        # The MAD being served.
        rx = Signal(QP1_RECEIVED)
        req = data.View(CM_REQ, rx.mad.data)
        rtu = data.View(CM_RTU, rx.mad.data)    # RTU, REP, MRA, REJ, DREQ, DREP: IDs alike
        dreq = data.View(CM_DREQ, rx.mad.data)
        private = data.View(REQ_PRIVATE, req.private_data)
        rep_in = data.View(CM_REP, rx.mad.data)     # a host's REP, MRA, REJ (active side)
        accepted = data.View(ACCEPT_PRIVATE, rep_in.private_data)
        mra = data.View(CM_MRA, rx.mad.data)
        rej_in = data.View(CM_REJ, rx.mad.data)

        # Checks of a REQ, registered.
        mtu = req.path_mtu
        checks = {          # the counter: (the REJ reason, the failure), first one first
            "rej_service": (RejectReason.INVALID_SERVICE_ID, req.service_id != self.service_id),
            "rej_transport": (RejectReason.INVALID_TRANSPORT,
                              (req.transport_service_type != 0)
                              | (req.extended_transport_type != 0)),
            "rej_address": (RejectReason.CONSUMER_DEFINED,
                            (private.cma.cma_version != 0) | (private.cma.ip_version != 4)
                            | (private.cma.dst_addr[:32] != config.ip)),
            "rej_version": (RejectReason.CONSUMER_DEFINED, private.version != PRIVATE_VERSION),
            "rej_mtu": (RejectReason.INVALID_MTU,
                        (mtu == 0) | (mtu > PathMtu.MTU_4096.value)
                        | (mtu > config.max_mtu.as_value())),
        }
        failed = {name: Signal(name=f"failed_{name}") for name in checks}
        m.d.sync += [failed[name].eq(failure) for name, (_, failure) in checks.items()]
        any_failed = Cat(*failed.values()).any()

        reason = Signal(16)
        entry = Signal(_ENTRY)                      # the connection whose REP goes out
        index = Signal(QP_INDEX_BITS)               # table entry read / written
        hit = Signal()
        is_req = Signal()                           # the attribute, decoded as it is taken
        is_rtu = Signal()
        is_rej = Signal()
        is_dreq = Signal()
        is_drep = Signal()
        is_rep = Signal()
        is_mra = Signal()
        result = Signal(CM_CONNECTED)               # what ``o_connected`` offers
        then_report = Signal()                      # SEND goes on to REPORT
        sweeping = Signal()
        send = Signal(_Send)                        # what ``o`` offers
        then_send = Signal()                        # CLOSE goes on to SEND (a DREQ's DREP)

        # The REP of ``entry``, the REJ of the REQ in ``rx``.
        rep = Signal(CM_REP)
        rep_private = data.View(REP_PRIVATE, rep.private_data)
        qpn = Signal(24)
        m.d.comb += [
            qpn.eq(FIRST_QPN + index),
            rep.local_comm_id.eq(entry.local_comm_id),
            rep.remote_comm_id.eq(entry.remote_comm_id),
            rep.local_qpn.eq(qpn),
            rep.starting_psn.eq(entry.psn),
            rep.target_ack_delay.eq(TARGET_ACK_DELAY),
            rep.rnr_retry_count.eq(7),
            rep.local_ca_guid.eq(Cat(config.mac[:24], Const(0xFFFE, 16),
                                     config.mac[24:] ^ 0x020000)),
            rep_private.version.eq(PRIVATE_VERSION),
            rep_private.qpn.eq(qpn),
        ]
        rej = Signal(CM_REJ)
        m.d.comb += [
            rej.remote_comm_id.eq(req.local_comm_id),
            rej.message_rejected.eq(0),
            rej.reason.eq(reason),
        ]
        # The endpoint's REQ of ``entry`` (the path's fields as rdma_cm sets them over
        # RoCE: permissive LIDs, the IPv4-mapped addresses as GIDs, hop limit 64), the RTU
        # that completes it, and the REJ of the entry's connection (of the host's REP).
        req_out = Signal(CM_REQ)
        req_private = data.View(CONNECT_REQ_PRIVATE, req_out.private_data)
        m.d.comb += [
            req_out.local_comm_id.eq(entry.local_comm_id),
            req_out.service_id.eq(Cat(entry.port, Const(RDMA_PS_TCP, 48))),
            req_out.local_ca_guid.eq(rep.local_ca_guid),
            req_out.local_qpn.eq(qpn),
            req_out.remote_cm_response_timeout.eq(entry.response_timeout),
            req_out.starting_psn.eq(entry.psn),
            req_out.local_cm_response_timeout.eq(entry.response_timeout),
            req_out.retry_count.eq(7),
            req_out.partition_key.eq(0xFFFF),
            req_out.path_mtu.eq(entry.path_mtu),
            req_out.rnr_retry_count.eq(7),
            req_out.max_cm_retries.eq(entry.max_retries),
            req_out.primary_local_lid.eq(0xFFFF),
            req_out.primary_remote_lid.eq(0xFFFF),
            req_out.primary_local_gid.eq(Cat(config.ip, IPV4_MAPPED)),
            req_out.primary_remote_gid.eq(Cat(entry.peer_ip, IPV4_MAPPED)),
            req_out.primary_hop_limit.eq(64),
            req_out.primary_local_ack_timeout.eq(LOCAL_ACK_TIMEOUT),
            req_private.cma.ip_version.eq(4),
            req_private.cma.port.eq(0xC000 | index),       # the QP's UDP source port
            req_private.cma.src_addr.eq(config.ip),
            req_private.cma.dst_addr.eq(entry.peer_ip),
            req_private.version.eq(PRIVATE_VERSION),
            req_private.qpn.eq(qpn),
        ]
        rtu_out = Signal(CM_RTU)
        m.d.comb += [
            rtu_out.local_comm_id.eq(entry.local_comm_id),
            rtu_out.remote_comm_id.eq(entry.remote_comm_id),
        ]
        rej_entry = Signal(CM_REJ)
        m.d.comb += [
            rej_entry.local_comm_id.eq(entry.local_comm_id),
            rej_entry.remote_comm_id.eq(entry.remote_comm_id),
            rej_entry.message_rejected.eq(1),               # the host's REP
            rej_entry.reason.eq(reason),
        ]
        # The DREQ of ``entry``, the DREP of the DREQ in ``rx``.
        disconnect = Signal(CM_DREQ)
        m.d.comb += [
            disconnect.local_comm_id.eq(entry.local_comm_id),
            disconnect.remote_comm_id.eq(entry.remote_comm_id),
            disconnect.remote_qpn.eq(entry.host_qpn),
        ]
        drep = Signal(CM_DREP)
        m.d.comb += [
            drep.local_comm_id.eq(dreq.remote_comm_id),
            drep.remote_comm_id.eq(dreq.local_comm_id),
        ]
        header = self.o.payload.mad.header
        m.d.comb += [
            header.base_version.eq(MAD_BASE_VERSION),
            header.mgmt_class.eq(MGMT_CLASS_CM),
            header.class_version.eq(CM_CLASS_VERSION),
            header.method.eq(METHOD_SEND),
        ]
        outgoing = {        # each message: its attribute, its body, to the MAD's source
            _Send.REP: (CmAttribute.REP, rep, False),
            _Send.DREQ: (CmAttribute.DREQ, disconnect, False),
            _Send.REQ: (CmAttribute.REQ, req_out, False),
            _Send.RTU: (CmAttribute.RTU, rtu_out, False),
            _Send.REJ_ENTRY: (CmAttribute.REJ, rej_entry, False),
            _Send.REJ: (CmAttribute.REJ, rej, True),
            _Send.DREP: (CmAttribute.DREP, drep, True),
        }
        with m.Switch(send):
            for kind, (attribute, body, answer) in outgoing.items():
                with m.Case(kind):
                    m.d.comb += [header.attribute_id.eq(attribute),
                                 self.o.payload.mad.data.eq(body)]
                    if answer:
                        m.d.comb += [
                            header.transaction_id.eq(rx.mad.header.transaction_id),
                            self.o.payload.dst_ip.eq(rx.src_ip),
                            self.o.payload.dest_qp.eq(rx.src_qp),
                            self.o.payload.flow.eq(req.local_comm_id[:14]),
                        ]
                    else:
                        m.d.comb += [
                            header.transaction_id.eq(
                                Cat(entry.local_comm_id, DREQ_TID_HIGH)
                                if kind == _Send.DREQ else entry.tid),
                            self.o.payload.dst_ip.eq(entry.peer_ip),
                            self.o.payload.dest_qp.eq(entry.peer_qp),
                            self.o.payload.flow.eq(Mux(kind == _Send.REQ,
                                                       entry.local_comm_id,
                                                       entry.remote_comm_id)[:14]),
                        ]

        m.d.comb += [
            self.o_open.payload.remote_ip.eq(rx.src_ip),
            self.o_open.payload.remote_qpn.eq(req.local_qpn),
            self.o_open.payload.next_psn.eq(req.starting_psn),
            self.o_open.payload.path_mtu.eq(mtu[:3]),
            self.o_open.payload.timeout.eq(req.primary_local_ack_timeout),
            self.o_open.payload.retry_count.eq(req.retry_count),
            self.o_open.payload.rnr_retry.eq(req.rnr_retry_count),
            self.o_open.payload.rkey.eq(private.rkey),
            self.o_open.payload.base.eq(private.base),
            self.o_open.payload.length.eq(private.length),
            self.o_close.payload.eq(index),
            self.o_connected.payload.eq(result),
            read.addr.eq(index),
            write.addr.eq(index),
        ]

        # Lookup compare: the entry read against the MAD's comm IDs and source, each
        # field's equality registered, then their AND.
        stored = read.data
        same = Signal(5)
        ids_hit = Signal()                          # a DREQ's comm IDs match (source aside)
        m.d.comb += [hit.eq(same.all()), ids_hit.eq(same[0] & same[1] & same[3])]
        # QPs freed by the table owner: their entries are dead until handed out again
        # (a bit per QP in a FlagMemory: stored entries clear it, a QP freed sets it, and
        # wins). i_closed is registered first: the write does not follow the port's driver.
        m.submodules.stale = stale = FlagMemory(
            flags=("stale",), depth=self._qps, addr_bits=QP_INDEX_BITS,
            writers=(("stored", ("stale",)), ("closed", ("stale",))), reads=("sync",))
        stale_entry = stale.r[0].data.stale             # with the entry's read
        closed = Signal(QP_INDEX_BITS)
        closed_valid = Signal()
        m.d.comb += [
            stale.r[0].addr.eq(index),
            stale.w_stored.addr.eq(index),
            stale.w_stored.stale.value.eq(0),
            *write_flags(stale.w_closed, closed, closed_valid, 1),
        ]
        m.d.sync += [closed.eq(self.i_closed.payload), closed_valid.eq(self.i_closed.valid)]

        expired = Signal()
        out_of_retries = Signal()
        timed = Signal()                            # the entry swept has a timer running
        begin = Signal()                            # the entry swept starts its disconnect
        abandon = Signal()                          # the entry swept is unanswered, its QP freed

        events = {name: Signal(name=f"event_{name}") for name in self.counters_layout().members}

        def reject(reason_code, counter):
            m.d.sync += [send.eq(_Send.REJ), reason.eq(reason_code)]
            m.d.comb += events[counter].eq(1)

        def new_connection(state, *, response_timeout, max_retries, **fields):
            """A new connection's entry (``fields`` of :data:`_ENTRY`), in ``state``: the
            next comm ID its Local Comm ID, the LFSR's PSN, its retries and timer set."""
            m.d.sync += [
                entry.eq(0),
                entry.state.eq(state),
                entry.local_comm_id.eq(comm_id),
                entry.psn.eq(psn),
                entry.response_timeout.eq(response_timeout),
                entry.max_retries.eq(max_retries),
                entry.retries.eq(max_retries),
                entry.ticks.eq(_interval(response_timeout)),
                *(entry[name].eq(value) for name, value in fields.items()),
                comm_id.eq(Mux(next_comm_id == 0, 1, next_comm_id)),
            ]

        def offer(state, port, then):
            """A state that offers ``port``'s payload until taken, then goes to ``then``."""
            with m.State(state):
                m.d.comb += port.valid.eq(1)
                with m.If(port.ready):
                    m.next = then

        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.i.ready.eq(seeded & ~sweep_due & ~close_due)
                m.d.sync += [then_send.eq(0), then_report.eq(0)]
                with m.If((sweep_due | close_due) & seeded):
                    m.d.sync += [sweep_due.eq(0), close_due.eq(0), counting.eq(sweep_due),
                                 sweeping.eq(1), index.eq(0)]
                    m.next = "SWEEP_READ"
                with m.Elif(self.i.valid & seeded):
                    taken = self.i.payload.mad.header.attribute_id
                    m.d.sync += [rx.eq(self.i.payload), sweeping.eq(0), send.eq(_Send.REP),
                                 is_req.eq(taken == CmAttribute.REQ),
                                 is_rtu.eq(taken == CmAttribute.RTU),
                                 is_rej.eq(taken == CmAttribute.REJ),
                                 is_dreq.eq(taken == CmAttribute.DREQ),
                                 is_drep.eq(taken == CmAttribute.DREP),
                                 is_rep.eq(taken == CmAttribute.REP),
                                 is_mra.eq(taken == CmAttribute.MRA)]
                    m.next = "DISPATCH"
                with m.Elif(connects.r_rdy & seeded):
                    # A connection to open: its entry, then the REQ.
                    m.d.comb += [connects.r_en.eq(1), events["req_sent"].eq(1)]
                    m.d.sync += [sweeping.eq(0), index.eq(connecting.qp), send.eq(_Send.REQ)]
                    new_connection(_State.REQ_SENT, tid=Cat(comm_id, REQ_TID_HIGH),
                                   peer_ip=connecting.remote_ip, peer_qp=1,
                                   response_timeout=config.req_timeout,
                                   max_retries=REQ_RETRIES, port=connecting.port,
                                   path_mtu=connecting.path_mtu)
                    m.next = "STORE"

            with m.State("DISPATCH"):               # the REQ checks register meanwhile
                m.d.sync += index.eq(0)
                with m.If(is_req):
                    m.next = "CHECK"
                with m.Elif(is_rtu | is_rej | is_dreq | is_drep | is_rep | is_mra):
                    m.next = "LOOKUP_READ"
                with m.Else():
                    m.d.comb += events["attribute"].eq(1)
                    m.next = "IDLE"

            with m.State("CHECK"):
                for position, (name, (reason_code, _)) in enumerate(checks.items()):
                    with (m.Elif if position else m.If)(failed[name]):
                        reject(reason_code, name)
                with m.If(any_failed):
                    m.next = "SEND"
                with m.Else():
                    m.next = "LOOKUP_READ"

            # One entry every three cycles: address, compare, act.
            with m.State("LOOKUP_READ"):
                m.next = "LOOKUP_COMPARE"
            with m.State("LOOKUP_COMPARE"):
                # REQ, RTU, REJ, REP, MRA: a connection whose QP is open; DREQ, DREP: any.
                # The endpoint's REQ not yet answered: the host's comm ID is not known.
                live = (stored.state != _State.FREE) & (~stale_entry | is_dreq | is_drep)
                unanswered = (stored.state == _State.REQ_SENT) & (is_rep | is_mra | is_rej)
                m.d.sync += [
                    same.eq(Cat(live,
                                (stored.remote_comm_id == rtu.local_comm_id) | unanswered,
                                stored.peer_ip == rx.src_ip,
                                is_req | (stored.local_comm_id == rtu.remote_comm_id),
                                ~is_dreq | (dreq.remote_qpn == qpn))),
                    entry.eq(stored),
                ]
                m.next = "LOOKUP_ACT"
            with m.State("LOOKUP_ACT"):
                requested = entry.state == _State.REQ_SENT
                with m.If(hit):
                    with m.If(is_req):
                        m.d.comb += events["rep_repeated"].eq(1)
                        m.next = "SEND"
                    with m.Elif(is_rtu):
                        with m.If(entry.state == _State.PENDING):
                            m.d.comb += [write.en.eq(1), events["established"].eq(1)]
                            m.d.comb += write.data.eq(entry)
                            m.d.comb += write.data.state.eq(_State.ESTABLISHED)
                        m.next = "IDLE"
                    with m.Elif(is_rep & requested):
                        # The host accepted: established, RTU, then the result. A REP
                        # with another private data version: REJ 28, the result failed.
                        m.d.sync += [
                            entry.state.eq(_State.ESTABLISHED),
                            entry.remote_comm_id.eq(rep_in.local_comm_id),
                            entry.host_qpn.eq(rep_in.local_qpn),
                            result.eq(0),
                            result.qp.eq(index),
                            result.remote_qpn.eq(rep_in.local_qpn),
                            result.next_psn.eq(rep_in.starting_psn),
                            result.rnr_retry.eq(rep_in.rnr_retry_count),
                            result.rkey.eq(accepted.rkey),
                            result.base.eq(accepted.base),
                            result.length.eq(accepted.length),
                            then_report.eq(1),
                        ]
                        with m.If(accepted.version == PRIVATE_VERSION):
                            m.d.comb += events["connected"].eq(1)
                            m.d.sync += [send.eq(_Send.RTU), result.accepted.eq(1)]
                        with m.Else():
                            m.d.comb += events["rej_accept_version"].eq(1)
                            m.d.sync += [entry.state.eq(_State.FREE),
                                         send.eq(_Send.REJ_ENTRY),
                                         reason.eq(RejectReason.CONSUMER_DEFINED),
                                         result.reason.eq(RejectReason.CONSUMER_DEFINED)]
                        m.next = "STORE"
                    with m.Elif(is_rep & (entry.state == _State.ESTABLISHED)):
                        # A repeated REP: the host did not get the RTU.
                        m.d.comb += events["rtu_repeated"].eq(1)
                        m.d.sync += send.eq(_Send.RTU)
                        m.next = "SEND"
                    with m.Elif(is_mra & requested & (mra.message_mraed == 0)):
                        # The host needs longer: the REQ waits its service timeout more.
                        m.d.comb += [write.en.eq(1), write.data.eq(entry),
                                     write.data.ticks.eq(_interval(mra.service_timeout)
                                                         + _interval(entry.response_timeout)),
                                     events["mra_received"].eq(1)]
                        m.next = "IDLE"
                    with m.Elif(is_rej & requested & (rej_in.message_rejected == 0)):
                        m.d.comb += [write.en.eq(1), write.data.state.eq(_State.FREE),
                                     events["req_rejected"].eq(1)]
                        m.d.sync += [result.eq(0), result.qp.eq(index),
                                     result.reason.eq(rej_in.reason)]
                        m.next = "REPORT"
                    with m.Elif(is_rej & (entry.state == _State.PENDING)):
                        m.d.comb += [write.en.eq(1), write.data.state.eq(_State.FREE),
                                     events["rejected_by_host"].eq(1)]
                        m.next = "CLOSE"
                    with m.Elif(is_dreq):
                        # DREP; the QP freed first, unless the owner freed it already
                        # (a disconnecting entry's QP always is: CLOSE skips it)
                        m.d.comb += [write.en.eq(1), write.data.state.eq(_State.FREE),
                                     events["dreq_received"].eq(1)]
                        m.d.sync += [send.eq(_Send.DREP), then_send.eq(1)]
                        m.next = "CLOSE"
                    with m.Elif(is_drep & (entry.state == _State.DISCONNECTING)):
                        m.d.comb += [write.en.eq(1), write.data.state.eq(_State.FREE),
                                     events["drep_received"].eq(1)]
                        m.next = "IDLE"
                    with m.Elif(is_drep):
                        m.d.comb += events["drep_unknown"].eq(1)
                        m.next = "IDLE"
                    with m.Else():                  # REJ, REP, MRA not for this state
                        m.d.comb += events["unknown"].eq(1)
                        m.next = "IDLE"
                with m.Elif(is_dreq & ids_hit):     # another source, or another QPN
                    m.d.comb += events["dreq_spoofed"].eq(1)
                    m.next = "IDLE"
                with m.Elif(index == last_qp):
                    with m.If(is_req):
                        m.next = "OPEN"
                    with m.Elif(is_dreq):           # answered all the same (IBTA)
                        m.d.comb += events["dreq_unknown"].eq(1)
                        m.d.sync += send.eq(_Send.DREP)
                        m.next = "SEND"
                    with m.Elif(is_drep):
                        m.d.comb += events["drep_unknown"].eq(1)
                        m.next = "IDLE"
                    with m.Else():
                        m.d.comb += events["unknown"].eq(1)
                        m.next = "IDLE"
                with m.Else():
                    m.d.sync += index.eq(index + 1)
                    m.next = "LOOKUP_READ"

            offer("OPEN", self.o_open, "OPENED")

            with m.State("OPENED"):
                m.d.comb += self.i_opened.ready.eq(1)
                with m.If(self.i_opened.valid):
                    result_open = self.i_opened.payload
                    with m.If(result_open.accepted):
                        m.d.comb += events["rep_sent"].eq(1)
                        m.d.sync += index.eq(result_open.qp)
                        new_connection(_State.PENDING, tid=rx.mad.header.transaction_id,
                                       peer_ip=rx.src_ip, peer_qp=rx.src_qp,
                                       response_timeout=req.local_cm_response_timeout,
                                       max_retries=req.max_cm_retries,
                                       remote_comm_id=req.local_comm_id,
                                       host_qpn=req.local_qpn)
                        m.next = "STORE"
                    with m.Elif(result_open.refusal == OpenRefusal.NO_QP):
                        reject(RejectReason.NO_RESOURCES, "rej_no_qp")
                        m.next = "SEND"
                    with m.Else():
                        reject(RejectReason.CONSUMER_DEFINED, "rej_denied")
                        m.next = "SEND"

            with m.State("STORE"):
                m.d.comb += [write.en.eq(1), write.data.eq(entry), stale.w_stored.stale.en.eq(1)]
                m.next = "SEND"

            offer("SEND", self.o, "AFTER_SEND")

            with m.State("AFTER_SEND"):
                with m.If(then_report):
                    m.next = "REPORT"
                with m.Elif(sweeping):
                    m.next = "SWEEP_NEXT"
                with m.Else():
                    m.next = "IDLE"

            # The end of a connection the endpoint opened, for the table owner.
            with m.State("REPORT"):
                m.d.comb += self.o_connected.valid.eq(1)
                with m.If(self.o_connected.ready):
                    m.d.sync += then_report.eq(0)
                    with m.If(sweeping):
                        m.next = "SWEEP_NEXT"
                    with m.Else():
                        m.next = "IDLE"

            # The QP of ``index`` freed, unless the owner freed it meanwhile.
            with m.State("CLOSE"):
                m.d.comb += self.o_close.valid.eq(~stale_entry)
                with m.If(self.o_close.ready | stale_entry):
                    with m.If(then_send):
                        m.next = "SEND"
                    with m.Else():
                        m.next = "AFTER_SEND"

            # The sweep: an established connection whose QP the owner freed starts its
            # disconnect, a pending one is rejected (REJ 28, as Linux's cm_destroy_id
            # does in that state) and the endpoint's own unanswered REQ dropped; on a
            # tick, every pending, requesting or disconnecting entry counts one down.
            with m.State("SWEEP_READ"):
                m.next = "SWEEP_COMPARE"
            with m.State("SWEEP_COMPARE"):
                waiting = (stored.state == _State.PENDING) | (stored.state == _State.REQ_SENT)
                m.d.sync += [
                    entry.eq(stored),
                    begin.eq((stored.state == _State.ESTABLISHED) & stale_entry),
                    abandon.eq(waiting & stale_entry),
                    timed.eq(counting & ((waiting & ~stale_entry)
                                         | (stored.state == _State.DISCONNECTING))),
                    expired.eq(stored.ticks <= 1),
                    out_of_retries.eq(stored.retries == 0),
                ]
                m.next = "SWEEP_ACT"
            def sweep_next():
                with m.If(index == last_qp):
                    m.d.sync += sweeping.eq(0)
                    m.next = "IDLE"
                with m.Else():
                    m.d.sync += index.eq(index + 1)
                    m.next = "SWEEP_READ"

            with m.State("SWEEP_ACT"):
                pending = entry.state == _State.PENDING
                requesting = entry.state == _State.REQ_SENT
                m.d.comb += write.data.eq(entry)
                m.d.sync += send.eq(Mux(pending, _Send.REP,
                                        Mux(requesting, _Send.REQ, _Send.DREQ)))
                with m.If(begin):
                    m.d.comb += [write.en.eq(1), write.data.state.eq(_State.DISCONNECTING),
                                 write.data.retries.eq(entry.max_retries),
                                 write.data.ticks.eq(_interval(entry.response_timeout)),
                                 events["dreq_sent"].eq(1)]
                    m.next = "SEND"
                with m.Elif(abandon):
                    m.d.comb += [write.en.eq(1), write.data.state.eq(_State.FREE),
                                 events["rej_freed"].eq(pending)]
                    m.d.sync += [send.eq(_Send.REJ_ENTRY),
                                 reason.eq(RejectReason.CONSUMER_DEFINED)]
                    with m.If(pending):
                        m.next = "SEND"
                    with m.Else():
                        sweep_next()
                with m.Elif(~timed):
                    sweep_next()
                with m.Elif(~expired):
                    m.d.comb += [write.en.eq(1), write.data.ticks.eq(entry.ticks - 1)]
                    sweep_next()
                with m.Elif(out_of_retries):
                    m.d.comb += [write.en.eq(1), write.data.state.eq(_State.FREE),
                                 events["expired"].eq(pending),
                                 events["req_expired"].eq(requesting),
                                 events["dreq_expired"].eq(~pending & ~requesting)]
                    m.d.sync += [result.eq(0), result.qp.eq(index),
                                 result.reason.eq(RejectReason.TIMEOUT)]
                    with m.If(pending):
                        m.next = "CLOSE"
                    with m.Elif(requesting):
                        m.next = "REPORT"
                    with m.Else():
                        sweep_next()
                with m.Else():
                    m.d.comb += [write.en.eq(1), write.data.retries.eq(entry.retries - 1),
                                 write.data.ticks.eq(_interval(entry.response_timeout)),
                                 events["rep_retransmitted"].eq(pending),
                                 events["req_retransmitted"].eq(requesting),
                                 events["dreq_retransmitted"].eq(~pending & ~requesting)]
                    m.next = "SEND"
            with m.State("SWEEP_NEXT"):         # after a REP or a close
                sweep_next()

        with m.If(closed_valid):
            m.d.sync += close_due.eq(1)

        for name, strobe in events.items():
            m.d.comb += getattr(self.o_counters, name).eq(event_counter(m, strobe, name))
        return m
