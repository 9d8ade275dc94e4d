"""What user logic (or the traffic generator) asks of the requester, and what
it answers: work requests, completions, and the per-QP transmit state.

A work request describes one message; its payload arrives separately as one
packet on a payload stream (``length`` bytes; a zero-length message is one
beat with ``keep`` all zero). The completion of a work request comes back once
its last packet has left the transmit engine.
"""

from amaranth import *
from amaranth.lib import data, enum

__all__ = [
    "QP_INDEX_BITS", "FIRST_QPN", "MAX_MESSAGE_BYTES", "Verb", "PathMtu", "WORK_REQUEST",
    "CompletionStatus", "COMPLETION", "QP_STATE", "QP_WRITE",
]

#: Bits of a QP index: up to 256 QPs.
QP_INDEX_BITS = 8

#: QPN of QP index 0 (CM_PROTOCOL: "QPNs start at 256"); index i is QPN 256 + i.
FIRST_QPN = 256

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


WORK_REQUEST = data.StructLayout({
    "verb": Verb,
    "qp": QP_INDEX_BITS,
    "tag": 16,                  # returned in the completion, for the user's bookkeeping
    "remote_address": 64,       # RDMA WRITE: virtual address in the peer's memory region
    "length": 32,               # bytes, 0 … 2^31
    "immediate": 32,            # immediate data, big-endian on the wire
})


class CompletionStatus(enum.Enum, shape=2):
    SUCCESS = 0
    BAD_REQUEST = 1             # QP index out of range or length above 2^31; nothing sent
    PAYLOAD_SHORT = 2           # payload ended early; the rest was sent as zeros
    PAYLOAD_LONG = 3            # payload went past the length; the excess was dropped


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
})

#: A write into the QP table.
QP_WRITE = data.StructLayout({
    "qp": QP_INDEX_BITS,
    "state": QP_STATE,
})
