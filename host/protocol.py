"""The connection manager's datagram (CM v2, big-endian; ../shared/CM_PROTOCOL.md),
the STATUS reply's layout, and the generator's payload rule, in plain Python.

This module is the golden model of the gateware's connection manager: the
tests build requests and predict replies with it, and ``qp-server`` speaks
the protocol with it. It needs nothing but the standard library.

A datagram is 64 bytes of UDP payload on port 17185::

    0       flags: bit 0 info_valid, bits 3:1 request, bit 4 ack_valid, bits 7:5 ack
    1-20    loc: qpn, psn, rkey (u32 each), base_addr (u64)
    21-24   loc ip
    25-48   rem: the same five fields
    49-50   reply_port
    51      txmeta: bit 0 valid, 1 start, 2 immediate, 3 type (1 WRITE), bits 7:4 path MTU
    52-63   length, count, divider (u32 each)

A STATUS reply keeps bytes 0-4 (flags, loc_qpn) and carries :class:`Status`
in bytes 5-63.
"""

from __future__ import annotations

import dataclasses
import enum
import ipaddress
import struct

__all__ = [
    "CM_PORT", "DATAGRAM_BYTES", "FIRST_QPN", "ProtocolError", "Request", "Ack", "PathMtu",
    "QpInfo", "TxMeta", "Datagram", "Status", "open_qp", "close_qp", "close_all", "status",
    "connect",
    "start_run", "credit", "CLOSE_ALL_QPN",
    "reply", "generator_payload", "generator_immediate", "ErrorStatus",
]

#: UDP port of the connection manager.
CM_PORT = 17185

#: UDP payload bytes of every CM datagram.
DATAGRAM_BYTES = 64

#: The endpoint's first QPN; its QPs are FIRST_QPN, FIRST_QPN + 1, ...
FIRST_QPN = 256

#: rem_qpn of a CLOSE_QP that closes every QP of the datagram's source (extension).
CLOSE_ALL_QPN = 0xFFFFFF

_QP_INFO = struct.Struct(">IIIQI")      # qpn, psn, rkey, base_addr, ip
_DATAGRAM = struct.Struct(">B24s24sHBIII")
assert _DATAGRAM.size == DATAGRAM_BYTES and _QP_INFO.size == 24


class ProtocolError(ValueError):
    """Bytes that are not a CM datagram."""


class Request(enum.IntEnum):
    NULL = 0
    OPEN_QP = 1
    SEND_QP_INFO = 2
    MODIFY_QP_RTS = 3
    CLOSE_QP = 4
    STATUS = 5          # extension
    CONNECT = 6         # extension: the endpoint connects to the host's rdma_cm
    ERROR = 7


class Ack(enum.IntEnum):
    NULL = 0
    ACK = 1
    NO_QP = 2
    NAK = 3
    ERROR = 7


class PathMtu(enum.IntEnum):
    """Path MTU as the InfiniBand enum; DEFAULT asks for the endpoint's default."""
    DEFAULT = 0
    MTU_256 = 1
    MTU_512 = 2
    MTU_1024 = 3
    MTU_2048 = 4
    MTU_4096 = 5

    @classmethod
    def from_size(cls, size: int) -> PathMtu:
        for mtu in cls:
            if mtu and mtu.bytes == size:
                return mtu
        raise ValueError(f"path MTU must be 256, 512, 1024, 2048 or 4096, not {size}")

    @property
    def bytes(self) -> int:
        return 128 << self.value if self else 0


def _ip_int(ip: str | int) -> int:
    return int(ipaddress.IPv4Address(ip))


def _ip_str(ip: int) -> str:
    return str(ipaddress.IPv4Address(ip))


@dataclasses.dataclass(frozen=True)
class QpInfo:
    """One side of a QP pair, as a datagram carries it."""
    qpn: int = 0
    psn: int = 0
    rkey: int = 0
    base_addr: int = 0
    ip: str = "0.0.0.0"

    def encode(self) -> bytes:
        return _QP_INFO.pack(self.qpn, self.psn, self.rkey, self.base_addr, _ip_int(self.ip))

    @classmethod
    def decode(cls, raw: bytes) -> QpInfo:
        if len(raw) != _QP_INFO.size:
            raise ProtocolError(f"a QP description has {_QP_INFO.size} bytes, not {len(raw)}")
        qpn, psn, rkey, base_addr, ip = _QP_INFO.unpack(raw)
        return cls(qpn, psn, rkey, base_addr, _ip_str(ip))


@dataclasses.dataclass(frozen=True)
class TxMeta:
    """Byte 51: a generator start, and the path MTU extension of OPEN_QP. In a
    start or a CREDIT (extension) bit 4 is ``credited``, in OPEN_QP bits 7:4 the
    path MTU: a datagram carries one or the other (decoding sets both from bit 4)."""
    valid: bool = False
    start: bool = False
    immediate: bool = False
    write: bool = False
    mtu: PathMtu = PathMtu.DEFAULT
    credited: bool = False

    def __post_init__(self) -> None:
        if self.credited and int(self.mtu):
            raise ProtocolError("txmeta carries a path MTU or the credit bit, not both")

    def encode(self) -> int:
        return (self.valid | self.start << 1 | self.immediate << 2 | self.write << 3
                | int(self.mtu) << 4 | self.credited << 4)

    @classmethod
    def decode(cls, value: int) -> TxMeta:
        mtu = value >> 4
        if value & 0x10 and mtu == PathMtu.MTU_256 and value & 0x03:
            # valid or start with bit 4 alone: a credited start or a CREDIT
            return cls(bool(value & 1), bool(value & 2), bool(value & 4), bool(value & 8),
                       credited=True)
        return cls(bool(value & 1), bool(value & 2), bool(value & 4), bool(value & 8),
                   PathMtu(mtu) if mtu in PathMtu._value2member_map_ else mtu)


@dataclasses.dataclass(frozen=True)
class Datagram:
    """A CM datagram. ``ack`` None means ack_valid clear."""
    request: Request = Request.NULL
    ack: Ack | None = None
    loc: QpInfo = QpInfo()
    rem: QpInfo = QpInfo()
    reply_port: int = 0
    txmeta: TxMeta = TxMeta()
    length: int = 0
    count: int = 0
    divider: int = 0
    info_valid: bool = True

    def encode(self) -> bytes:
        flags = self.info_valid | self.request << 1
        if self.ack is not None:
            flags |= 1 << 4 | self.ack << 5
        return _DATAGRAM.pack(flags, self.loc.encode(), self.rem.encode(), self.reply_port,
                              self.txmeta.encode(), self.length, self.count, self.divider)

    @classmethod
    def decode(cls, raw: bytes) -> Datagram:
        if len(raw) != DATAGRAM_BYTES:
            raise ProtocolError(f"a CM datagram has {DATAGRAM_BYTES} bytes, not {len(raw)}")
        flags, loc, rem, reply_port, txmeta, length, count, divider = _DATAGRAM.unpack(raw)
        request = flags >> 1 & 7
        ack = flags >> 5
        return cls(
            request=Request(request) if request in Request._value2member_map_ else request,
            ack=(Ack(ack) if ack in Ack._value2member_map_ else ack) if flags & 0x10 else None,
            loc=QpInfo.decode(loc), rem=QpInfo.decode(rem), reply_port=reply_port,
            txmeta=TxMeta.decode(txmeta), length=length, count=count, divider=divider,
            info_valid=bool(flags & 1))


@dataclasses.dataclass(frozen=True)
class Status:
    """A QP's state and counters: bytes 5-63 of a STATUS reply (extension).

    Counters count since the QP was opened; ``messages`` counts the work
    requests the generator has issued in the QP's current run (or its last,
    until the QP is closed); ``runs`` counts the starts the generator took
    for the QP (low 24 bits), so a host can tell whether its start was taken.
    Error-NAK, timeout and CNP counters carry their low 16 bits.
    """
    open: bool = False
    running: bool = False           # a generator run is in progress
    error: bool = False             # the QP is in ERROR
    error_status: int = 0           # why: the failed work request's completion status
    outstanding: int = 0            # packets sent and not yet acknowledged
    messages: int = 0
    packets: int = 0                # packets sent the first time
    bytes: int = 0                  # their payload bytes
    retransmitted: int = 0          # packets sent again
    acks: int = 0                   # acknowledgements taken
    naks_sequence: int = 0
    naks_rnr: int = 0
    rnr_waits: int = 0
    timeouts: int = 0
    cnps: int = 0                   # RoCEv2 congestion notifications for the QP
    acks_dropped: int = 0           # duplicate, ghost, no news, wrong source
    icrc_errors: int = 0            # acknowledgements dropped for a bad ICRC
    naks_invalid: int = 0
    naks_access: int = 0
    naks_operational: int = 0
    runs: int = 0                   # generator runs started on the QP since it was opened

    #: Byte layout after the flags byte and loc_qpn: (field, struct code), big-endian.
    LAYOUT = (("flags", "B"), ("outstanding", "3s"), ("messages", "I"), ("packets", "I"),
              ("bytes", "6s"), ("retransmitted", "I"), ("acks", "I"), ("naks_sequence", "I"),
              ("naks_rnr", "I"), ("rnr_waits", "I"), ("timeouts", "H"), ("cnps", "H"),
              ("acks_dropped", "I"),
              ("icrc_errors", "I"), ("naks_invalid", "H"), ("naks_access", "H"),
              ("naks_operational", "H"), ("runs", "3s"))

    def encode(self) -> bytes:
        """Bytes 5-63 of the reply."""
        flags = self.open | self.running << 1 | self.error << 2 | self.error_status << 4
        values = []
        for name, code in self.LAYOUT:
            if name == "flags":
                values.append(flags)
            elif code.endswith("s"):
                values.append(getattr(self, name).to_bytes(int(code[:-1]), "big"))
            else:
                values.append(getattr(self, name))
        return _STATUS.pack(*values)

    @classmethod
    def decode(cls, raw: bytes) -> Status:
        """From bytes 5-63 of a reply."""
        fields = {}
        if len(raw) != _STATUS.size:
            raise ProtocolError(f"a status has {_STATUS.size} bytes, not {len(raw)}")
        for (name, code), value in zip(cls.LAYOUT, _STATUS.unpack(raw), strict=True):
            if name == "flags":
                fields.update(open=bool(value & 1), running=bool(value & 2),
                              error=bool(value & 4), error_status=value >> 4)
            else:
                fields[name] = int.from_bytes(value, "big") if code.endswith("s") else value
        return cls(**fields)

    @classmethod
    def from_reply(cls, raw: bytes) -> Status:
        """From a whole STATUS reply datagram."""
        if len(raw) != DATAGRAM_BYTES:
            raise ProtocolError(f"a CM datagram has {DATAGRAM_BYTES} bytes, not {len(raw)}")
        return cls.decode(raw[5:])

    def reply(self, qpn: int) -> bytes:
        """The whole STATUS/ACK reply for endpoint QP ``qpn`` with this status."""
        head = Datagram(Request.STATUS, Ack.ACK, loc=QpInfo(qpn=qpn)).encode()[:5]
        return head + self.encode()


_STATUS = struct.Struct(">" + "".join(code for _, code in Status.LAYOUT))
assert _STATUS.size == DATAGRAM_BYTES - 5


class ErrorStatus(enum.IntEnum):
    """``Status.error_status``: why the endpoint QP went to ERROR (the failed work
    request's completion status)."""
    SUCCESS = 0
    BAD_REQUEST = 1
    PAYLOAD_SHORT = 2
    PAYLOAD_LONG = 3
    RETRY_EXCEEDED = 4
    RNR_RETRY_EXCEEDED = 5
    REMOTE_INVALID_REQUEST = 6
    REMOTE_ACCESS_ERROR = 7
    REMOTE_OPERATIONAL_ERROR = 8
    FLUSHED = 9


# Requests a host sends.

def open_qp(host: QpInfo, *, mtu: PathMtu = PathMtu.DEFAULT, reply_port: int = 0) -> Datagram:
    """OPEN_QP: pair the host QP ``host`` with a free endpoint QP."""
    return Datagram(Request.OPEN_QP, loc=host, reply_port=reply_port, txmeta=TxMeta(mtu=mtu))


def close_qp(qpn: int, host_ip: str, *, reply_port: int = 0) -> Datagram:
    """CLOSE_QP of endpoint QP ``qpn``, opened by the host at ``host_ip``."""
    return Datagram(Request.CLOSE_QP, loc=QpInfo(ip=host_ip), rem=QpInfo(qpn=qpn),
                    reply_port=reply_port)


def close_all(host_ip: str, *, reply_port: int = 0) -> Datagram:
    """CLOSE_QP of every endpoint QP whose host is the datagram's source (extension);
    the endpoint's ACK carries the number closed in ``count``. Only the IPv4 source
    counts: ``host_ip`` fills loc_ip as in any CLOSE_QP."""
    return close_qp(CLOSE_ALL_QPN, host_ip, reply_port=reply_port)


def connect(host_ip: str, port: int, mtu: PathMtu, *, reply_port: int = 0) -> Datagram:
    """CONNECT (extension): the endpoint takes a free QP and connects it to the rdma_cm
    of the host at ``host_ip`` (the datagram's IPv4 source), which listens on rdma_cm
    port ``port`` (``length``, low 16 bits), with path MTU ``mtu`` (txmeta bits 7:4).
    The one answer comes once the connection is up (ACK: ``loc`` the endpoint's QP,
    txmeta its path MTU) or has failed (NAK: ``count`` the REJ reason)."""
    if not 0 < port < 1 << 16:
        raise ValueError(f"rdma_cm port must be 1..65535, not {port}")
    return Datagram(Request.CONNECT, loc=QpInfo(ip=host_ip), reply_port=reply_port,
                    txmeta=TxMeta(mtu=mtu), length=port)


def status(qpn: int, *, reply_port: int = 0) -> Datagram:
    """STATUS of endpoint QP ``qpn``."""
    return Datagram(Request.STATUS, rem=QpInfo(qpn=qpn), reply_port=reply_port)


def start_run(qpn: int, *, length: int, count: int, divider: int = 0, write: bool = True,
              immediate: bool = False, ring: int = 0, credited: bool = False) -> Datagram:
    """Start the generator on endpoint QP ``qpn``: ``count`` messages of
    ``length`` bytes; WRITE message k lands at base + (k mod (ring // length)) ×
    length when ``ring`` (bytes) is set, else at base + k × length. ``credited``
    (a WRITE into a ring): message k waits until the host has reported message
    k − slots consumed with :func:`credit`."""
    return Datagram(Request.NULL, rem=QpInfo(qpn=qpn, base_addr=ring),
                    txmeta=TxMeta(valid=True, start=True, immediate=immediate, write=write,
                                  credited=credited),
                    length=length, count=count, divider=divider)


def credit(qpn: int, consumed: int) -> Datagram:
    """CREDIT (extension): the host has consumed ``consumed`` messages (mod 2^32) of
    the credited run on endpoint QP ``qpn``; no reply. A count at or below one
    already sent changes nothing, so a host may repeat it."""
    return Datagram(Request.NULL, rem=QpInfo(qpn=qpn), txmeta=TxMeta(valid=True, credited=True),
                    count=consumed & 0xFFFF_FFFF)


def reply(request: Datagram, ack: Ack, endpoint: QpInfo, *, mtu: PathMtu = PathMtu.DEFAULT,
          count: int = 0) -> Datagram:
    """The endpoint's reply to ``request``: ``endpoint`` describes its QP (for
    NO_QP, only its ip is set), rem echoes the requester's loc; an OPEN_QP or
    CONNECT reply carries the QP's path MTU in txmeta bits 7:4, a close-all's ACK
    the number of QPs closed in ``count``, a CONNECT's NAK the REJ reason there."""
    return Datagram(request.request, ack, loc=endpoint, rem=request.loc,
                    txmeta=TxMeta(mtu=mtu), count=count)


# The generator's payload.

def generator_payload(k: int, length: int) -> bytes:
    """Message ``k`` of a run: little-endian 64-bit words, word j = (k << 32) | j,
    cut to ``length`` bytes."""
    words = -(-length // 8)
    return b"".join(struct.pack("<Q", (k << 32 | j) & (1 << 64) - 1)
                    for j in range(words))[:length]


def generator_immediate(k: int) -> int:
    """The immediate data of message ``k`` (big-endian on the wire)."""
    return k & 0xFFFF_FFFF
