"""The connection manager's datagram and its STATUS reply, as wire layouts
(CM_PROTOCOL.md; ``host/protocol.py`` is the same format in plain Python)."""

from amaranth.lib import enum

from ..headers import NetworkLayout
from ..roce.requests import CompletionStatus

__all__ = [
    "CM_PORT", "CM_DATAGRAM", "CM_QP_INFO", "CM_FLAGS", "CM_TXMETA", "CM_RUN_TXMETA",
    "CREDIT_TXMETA", "CM_STATUS",
    "CM_STATUS_DATAGRAM", "Request", "Ack",
]

#: The UDP port the connection manager listens on.
CM_PORT = 17185


class Request(enum.Enum, shape=3):
    NULL = 0
    OPEN_QP = 1
    SEND_QP_INFO = 2
    MODIFY_QP_RTS = 3
    CLOSE_QP = 4
    STATUS = 5                  # extension
    CONNECT = 6                 # extension: the endpoint opens an rdma_cm connection
    ERROR = 7


class Ack(enum.Enum, shape=3):
    NULL = 0
    ACK = 1
    NO_QP = 2
    NAK = 3
    ERROR = 7


#: Byte 0.
CM_FLAGS = NetworkLayout({
    "ack": Ack,
    "ack_valid": 1,
    "request": Request,
    "info_valid": 1,
})

#: One side of a QP pair: ``loc`` (the sender's) or ``rem`` (the addressee's).
CM_QP_INFO = NetworkLayout({
    "qpn": 32,                  # low 24 bits used
    "psn": 32,                  # low 24 bits used
    "rkey": 32,
    "base_addr": 64,
    "ip": 32,
})

#: Byte 51: a generator start; in OPEN_QP (extension) the path MTU.
CM_TXMETA = NetworkLayout({
    "path_mtu": 4,              # InfiniBand enum; 0: the endpoint's default
    "write": 1,                 # 1 RDMA WRITE, 0 SEND
    "immediate": 1,
    "start": 1,
    "valid": 1,
})

#: Byte 51 of a start or a CREDIT (extension), the same byte as :data:`CM_TXMETA`
#: read for a run: bit 4 asks for a credited run.
CM_RUN_TXMETA = NetworkLayout({
    "reserved": 3,
    "credited": 1,
    "write": 1,
    "immediate": 1,
    "start": 1,
    "valid": 1,
})

#: Byte 51 of a CREDIT datagram: valid and credited, nothing else.
CREDIT_TXMETA = 0x11

CM_DATAGRAM = NetworkLayout({
    "flags": CM_FLAGS,
    "loc": CM_QP_INFO,
    "rem": CM_QP_INFO,
    "reply_port": 16,           # 0: the datagram's source port
    "txmeta": CM_TXMETA,
    "length": 32,               # bytes per message of a run
    "count": 32,                # messages of a run
    "divider": 32,              # cycles between message starts
})

#: Bytes 5-63 of a STATUS reply (extension): a QP's state and counters (those
#: of the reliability engine, since the QP was opened).
CM_STATUS = NetworkLayout({
    "error_status": CompletionStatus,
    "reserved_flag": 1,
    "error": 1,                 # the QP is in ERROR
    "running": 1,               # a generator run is in progress
    "open": 1,
    "outstanding": 24,          # packets sent and not yet acknowledged
    "messages": 32,             # requests the generator issued in the QP's (last) run
    "packets": 32,
    "bytes": 48,
    "retransmitted": 32,
    "acks": 32,
    "naks_sequence": 32,
    "naks_rnr": 32,
    "rnr_waits": 32,
    "timeouts": 16,             # low 16 bits
    "cnps": 16,                 # low 16 bits
    "acks_dropped": 32,
    "icrc_errors": 32,
    "naks_invalid": 16,         # low 16 bits
    "naks_access": 16,
    "naks_operational": 16,
    "runs": 24,                 # generator runs started on the QP since it was opened
})

#: A STATUS reply: the flags, the QP's number, and its status.
CM_STATUS_DATAGRAM = NetworkLayout({
    "flags": CM_FLAGS,
    "qpn": 32,
    "status": CM_STATUS,
})

assert CM_DATAGRAM.length == CM_STATUS_DATAGRAM.length == 64
