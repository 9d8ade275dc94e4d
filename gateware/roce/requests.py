"""What user logic (or the traffic generator) asks of the requester, and what
it answers: work requests, completions, and the per-QP transmit state.

A work request describes one message; its payload arrives separately as one
packet on a payload stream (``length`` bytes; a zero-length message is one
beat with ``keep`` all zero). The completion of a work request comes back once
the responder has acknowledged its last packet (or the QP failed).
"""

from amaranth import *
from amaranth.lib import data, enum

__all__ = [
    "QP_INDEX_BITS", "FIRST_QPN", "MAX_MESSAGE_BYTES", "Verb", "PathMtu", "WORK_REQUEST",
    "CompletionStatus", "COMPLETION", "QP_STATE", "QP_WRITE", "ConnectionEvent",
    "CONNECTION_EVENT", "QP_COUNTERS", "QP_STATUS", "check_qp_count", "psn_sequence",
]

#: Bits of a QP index: up to 4,096 QPs.
QP_INDEX_BITS = 12

#: QPN of QP index 0 (CM_PROTOCOL: "QPNs start at 256"); index i is QPN 256 + i.
FIRST_QPN = 256

def check_qp_count(qps):
    """``qps`` when it is a QP count a block can be built for, else ``ValueError``."""
    if not isinstance(qps, int) or not 1 <= qps <= 1 << QP_INDEX_BITS:
        raise ValueError(f"QP count must be 1..{1 << QP_INDEX_BITS}, not {qps!r}")
    return qps


#: The taps of a 24-bit maximal-length LFSR (24, 23, 22, 17), counted from bit 0.
_PSN_TAPS = (23, 22, 21, 16)


def psn_sequence(m, *, init):
    """A 24-bit Signal that steps through every nonzero PSN, one a cycle, from ``init``
    (a free-running maximal-length LFSR): where the endpoint picks a connection's first
    PSN, as IBTA asks of a new connection's, unlikely to repeat the last one's."""
    psn = Signal(24, init=init)
    m.d.sync += psn.eq(Cat(Cat(psn[tap] for tap in _PSN_TAPS).xor(), psn[:23]))
    return psn


#: Longest message (IBTA: a DMA length is at most 2^31 bytes).
MAX_MESSAGE_BYTES = 1 << 31


class Verb(enum.Enum, shape=2):
    """The operation of a work request."""
    RDMA_WRITE = 0
    RDMA_WRITE_WITH_IMMEDIATE = 1
    SEND = 2
    SEND_WITH_IMMEDIATE = 3


class PathMtu(enum.Enum, shape=3):
    """Path MTU as the InfiniBand enum (the payload bytes of a full packet)."""
    MTU_256 = 1
    MTU_512 = 2
    MTU_1024 = 3
    MTU_2048 = 4
    MTU_4096 = 5

    @classmethod
    def from_bytes(cls, size):
        for mtu in cls:
            if mtu.bytes == size:
                return mtu
        raise ValueError(f"Path MTU must be one of 256, 512, 1024, 2048, 4096, not {size!r}")

    @property
    def bytes(self):
        return 128 << self.value


#: One message to send: what user logic (or the generator) puts on ``work_request``.
WORK_REQUEST = data.StructLayout({
    "verb": Verb,
    "qp": QP_INDEX_BITS,
    "tag": 16,                  # returned in the completion, for the user's bookkeeping
    "remote_address": 64,       # RDMA WRITE: virtual address in the peer's memory region
    "length": 32,               # bytes, 0 … 2^31
    "immediate": 32,            # immediate data, big-endian on the wire
})


class CompletionStatus(enum.Enum, shape=4):
    """How a work request ended (the ``ibv_wc_status`` each error matches is noted)."""
    SUCCESS = 0
    BAD_REQUEST = 1             # QP index out of range or length above 2^31; nothing sent
    PAYLOAD_SHORT = 2           # payload ended early; the rest was sent as zeros
    PAYLOAD_LONG = 3            # payload went past the length; the excess was dropped
    RETRY_EXCEEDED = 4          # no ACK after ``retry_count`` resends (IBV_WC_RETRY_EXC_ERR)
    RNR_RETRY_EXCEEDED = 5      # more RNR NAKs than ``rnr_retry`` (IBV_WC_RNR_RETRY_EXC_ERR)
    REMOTE_INVALID_REQUEST = 6  # NAK invalid request (IBV_WC_REM_INV_REQ_ERR)
    REMOTE_ACCESS_ERROR = 7     # NAK remote access error (IBV_WC_REM_ACCESS_ERR)
    REMOTE_OPERATIONAL_ERROR = 8  # NAK remote operational error (IBV_WC_REM_OP_ERR)
    FLUSHED = 9                 # the QP was in ERROR: not (completely) sent (IBV_WC_WR_FLUSH_ERR)


#: What ``completion`` gives back once a message's last packet is acknowledged (or
#: its QP failed), in order per QP.
COMPLETION = data.StructLayout({
    "qp": QP_INDEX_BITS,
    "tag": 16,
    "status": CompletionStatus,
    "first_psn": 24,
    "packets": 24,              # packets sent for the message (its PSNs: first_psn + 0 …)
})

#: A QP's transmit state, as the connection manager (or user logic) sets it.
QP_STATE = data.StructLayout({
    "remote_qpn": 24,
    "next_psn": 24,
    "rkey": 32,
    "remote_ip": 32,
    "path_mtu": PathMtu,
    "src_port": 16,             # UDP source port, stable per QP (sent with bits 15:14 set)
    "timeout": 5,               # ACK timeout 4.096 us * 2^timeout (IBTA local ACK timeout; 0: none)
    "retry_count": 3,           # resends after a timeout or NAK sequence error before ERROR
    "rnr_retry": 3,             # resends after RNR NAKs before ERROR (7: without limit)
})

#: A write into the QP table.
QP_WRITE = data.StructLayout({
    "qp": QP_INDEX_BITS,
    "state": QP_STATE,
})


class ConnectionEvent(enum.Enum, shape=2):
    """What happened to a QP that the connection manager holds."""
    OPENED = 0                  # OPEN_QP or rdma_cm took it; the QP table has its state
    CLOSED = 1                  # a CLOSE_QP (or close-all, or the IB CM) freed it
    EXPIRED = 2                 # its lease ran out and freed it
    FAILED = 3                  # a connection the endpoint opened (CONNECT) was refused


#: A QP the connection manager opened or freed, as ``connection`` tells user logic. The
#: host's buffer is where user logic writes: its address is ``base``, its rkey
#: ``state.rkey``, its size ``length`` when the host gave one (rdma_cm's private data;
#: OPEN_QP carries none: how much of it to use is then the user's agreement with the
#: host program). For CLOSED and EXPIRED, ``state`` and ``base`` are 0; for FAILED,
#: ``state.remote_ip``, ``port`` and ``reason`` say which connection failed and why.
CONNECTION_EVENT = data.StructLayout({
    "qp": QP_INDEX_BITS,
    "event": ConnectionEvent,
    "state": QP_STATE,          # OPENED: the QP's transmit state as the CM set it
    "base": 64,                 # OPENED: the address of the host's buffer (OPEN_QP's loc_base_addr)
    "length": 64,               # OPENED by rdma_cm: the size of the host's buffer (0: unbounded)
    "port": 16,                 # OPENED or FAILED by CONNECT: the host's rdma_cm port
    "reason": 8,                # FAILED: the REJ reason (4: no answer)
})

#: What the reliability engine counts per QP, each since the QP was last set.
QP_COUNTERS = data.StructLayout({
    "packets": 32,              # packets sent the first time
    "bytes": 48,                # their payload bytes
    "retransmitted": 32,        # packets sent again (go-back-N after a NAK or timeout)
    "acks": 32,                 # acknowledgements taken (ACKs and NAKs inside the window)
    "naks_sequence": 32,        # NAK PSN sequence error
    "naks_rnr": 32,             # RNR NAK
    "naks_invalid": 32,         # NAK invalid request
    "naks_access": 32,          # NAK remote access error
    "naks_operational": 32,     # NAK remote operational error
    "rnr_waits": 32,            # RNR timer waits started
    "timeouts": 32,             # ACK timeouts
    "icrc_errors": 32,          # acknowledgements for this QP dropped for a bad ICRC
    "acks_dropped": 32,         # dropped: outside the window (duplicate or ghost), no news
                                # (not ahead of the one kept), wrong source, QP in ERROR
    "cnps": 32,                 # RoCEv2 congestion notification packets (BTH opcode 0x81)
})

#: A QP's reliability state and counters, as the core reports them.
QP_STATUS = data.StructLayout({
    "error": 1,                 # the QP is in ERROR: it sends nothing until it is set again
    "error_status": CompletionStatus,   # why (the status of the work request that failed)
    "outstanding": 24,          # packets sent and not yet acknowledged
    "counters": QP_COUNTERS,
})
