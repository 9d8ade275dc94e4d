"""What ``qp-server`` needs from a verbs stack, and the device-free rules it follows.

:class:`Backend` is the interface the run loop drives: :class:`host.verbs.PyverbsBackend`
implements it with pyverbs on a real RDMA device, and the tests substitute a fake with
the same methods (``qp-server``'s ``main(argv, backend=factory)``). Everything here is
plain Python: the GID text of an IPv4 address, the choice of a port's RoCEv2 GID, and
the names of work-completion statuses.
"""

from __future__ import annotations

import dataclasses
import enum
import ipaddress
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from .errors import HostError
from .protocol import PathMtu, QpInfo

if TYPE_CHECKING:
    from .cm import CmClient

__all__ = [
    "POLL_MODES", "CompletionKind", "Completion", "PortInfo", "VerbsOptions", "Backend",
    "BackendFactory", "GidEntry", "ipv4_gid", "gid_ipv4", "choose_gid", "wc_status_name",
]

#: How a backend waits for completions: spin on the CQ, sleep on the completion
#: channel, or spin briefly and then sleep.
POLL_MODES = ("busy", "event", "hybrid")


class CompletionKind(enum.Enum):
    """What a receive-side work completion reports."""
    RECV = "recv"                   # a SEND landed in a posted receive buffer
    RECV_IMM = "recv_imm"           # an RDMA WRITE with immediate consumed a receive
    OTHER = "other"


@dataclasses.dataclass(frozen=True)
class Completion:
    """One work completion of a host QP.

    ``qp`` is the host QP's index (0 .. qps - 1), ``status`` the ibv_wc_status
    number (0 success), ``imm`` the immediate data in host order (None without one).
    """
    qp: int
    wr_id: int
    status: int = 0
    kind: CompletionKind = CompletionKind.RECV
    byte_len: int = 0
    imm: int | None = None

    @property
    def ok(self) -> bool:
        return self.status == 0

    @property
    def status_name(self) -> str:
        return wc_status_name(self.status)


@dataclasses.dataclass(frozen=True)
class PortInfo:
    """The local port a backend opened: its device, GID and active path MTU."""
    device: str
    port: int
    gid_index: int
    gid: str
    ip: str
    active_mtu: PathMtu
    numa_node: int | None = None


@dataclasses.dataclass(frozen=True)
class VerbsOptions:
    """How to open the verbs side: ``--device``, ``--ib-port``, ``--gid-index``, ``--poll``."""
    device: str | None = None
    ib_port: int = 1
    gid_index: int | None = None
    poll: str = "busy"


class Backend(Protocol):
    """A verbs stack with ``qps`` RC QPs, each with its own registered buffer.

    Call order: :meth:`open`, then per QP :meth:`qp_info` and :meth:`connect` (or
    :meth:`rdma_connect` or :meth:`rdma_listen`, ended by :meth:`rdma_disconnect`), then
    :meth:`post_receive` / :meth:`poll` / :meth:`read` while data lands, :meth:`close`
    at the end (also after a failure; it must be safe to call twice). :meth:`reset`
    between runs over the same QPs, followed by :meth:`qp_info` and :meth:`connect`.
    """

    def open(self, qps: int, buffer_bytes: int, receives: int) -> PortInfo:
        """Open the device and create ``qps`` QPs in INIT, each with a zeroed buffer of
        ``buffer_bytes`` registered for local and remote write and room for
        ``receives`` posted receives."""
        ...

    def qp_info(self, qp: int) -> QpInfo:
        """QPN, first PSN, rkey, buffer address and IPv4 address of host QP ``qp``."""
        ...

    def connect(self, qp: int, endpoint: QpInfo, mtu: PathMtu) -> None:
        """Move host QP ``qp`` to RTR and RTS towards ``endpoint`` with path MTU ``mtu``."""
        ...

    def rdma_connect(self, qp: int, endpoint: str, port: int,
                     timeout: float) -> tuple[QpInfo, PathMtu]:
        """Connect host QP ``qp`` (in INIT) through rdma_cm to ``endpoint``'s rdma_cm
        ``port`` instead of :meth:`connect`: the REQ's private data names its buffer,
        the QP ends in RTS. The endpoint's QPN (from the REP) and the PSN it sends
        first, and the path MTU; :meth:`qp_info` gives the host's PSN after it. Raises
        :class:`~host.errors.HostError` (:class:`host.rdma_connect.Rejected` for a
        REJ) with the fix; ``timeout``: seconds for each rdma_cm event."""
        ...

    def rdma_listen(self, qp: int, cm: CmClient, port: int, mtu: PathMtu,
                    timeout: float) -> tuple[QpInfo, PathMtu]:
        """Have the endpoint behind ``cm`` connect host QP ``qp`` (in INIT) through
        rdma_cm instead of :meth:`connect`: listen on the host's address, rdma_cm port
        ``port``, send CONNECT with path MTU ``mtu``, accept the endpoint's REQ with
        private data naming the QP's buffer; the QP ends in RTS. Returns the endpoint's
        QP (from CONNECT/ACK) and the path MTU. Raises
        :class:`~host.errors.HostError` (:class:`host.rdma_listen.ConnectRejected` for a
        CONNECT/NAK) with the fix; ``timeout``: seconds for the whole connect."""
        ...

    def rdma_disconnect(self, qp: int, timeout: float) -> dict:
        """``rdma_disconnect`` of a QP connected by :meth:`rdma_connect` or
        :meth:`rdma_listen`, then wait up to
        ``timeout`` seconds for DISCONNECTED: ``event`` (its name or None),
        ``seconds``, ``error``."""
        ...

    def reset(self, qp: int) -> None:
        """Move host QP ``qp`` to RESET and back to INIT with a new first PSN (see
        :meth:`qp_info`), ready for another :meth:`connect`; its posted receives are
        gone."""
        ...

    def post_receive(self, qp: int, wr_id: int, offset: int, length: int) -> None:
        """Post a receive of ``length`` bytes at ``offset`` of the QP's buffer."""
        ...

    def poll(self, timeout: float) -> list[Completion]:
        """The completions available now, or within ``timeout`` seconds (maybe none)."""
        ...

    def read(self, qp: int, offset: int, length: int) -> bytes:
        """``length`` bytes at ``offset`` of host QP ``qp``'s buffer."""
        ...

    def buffer(self, qp: int) -> memoryview:
        """Host QP ``qp``'s whole registered buffer as a writable byte memoryview, no
        copy (valid until :meth:`close`)."""
        ...

    def fill(self, qp: int, value: int) -> None:
        """Set every byte of host QP ``qp``'s buffer to ``value``."""
        ...

    def close(self) -> None:
        """Destroy QPs, buffers, CQ and device context."""
        ...


#: Makes the backend for the given options (``host.verbs.PyverbsBackend`` by default).
BackendFactory = Callable[[VerbsOptions], Backend]


def ipv4_gid(ip: str) -> str:
    """The IPv4-mapped GID ``::ffff:a.b.c.d`` of ``ip`` with all eight hex groups
    written out, as pyverbs' ``GID()`` wants it."""
    packed = ipaddress.IPv6Address(f"::ffff:{ipaddress.IPv4Address(ip)}").packed
    return ":".join(packed[i:i + 2].hex() for i in range(0, 16, 2))


def gid_ipv4(gid: str) -> str | None:
    """The IPv4 address of an IPv4-mapped GID (any IPv6 spelling), else None."""
    try:
        address = ipaddress.IPv6Address(gid)
    except ValueError:
        return None
    mapped = address.ipv4_mapped
    return None if mapped is None or int(mapped) == 0 else str(mapped)


@dataclasses.dataclass(frozen=True)
class GidEntry:
    """One entry of a port's GID table; ``roce_v2`` None when the type is unknown."""
    index: int
    gid: str
    roce_v2: bool | None = None

    @property
    def ip(self) -> str | None:
        return gid_ipv4(self.gid)


def choose_gid(entries: Sequence[GidEntry], *, where: str = "the port") -> GidEntry:
    """The first IPv4-mapped RoCEv2 GID of a GID table (an entry of unknown type when
    no entry is known to be RoCEv2; never a known RoCE v1 entry)."""
    mapped = [entry for entry in entries if entry.ip is not None]
    for wanted in (True, None):
        for entry in mapped:
            if entry.roce_v2 is wanted:
                return entry
    raise HostError(
        f"{where} has no IPv4 RoCEv2 GID (::ffff:a.b.c.d): give its network interface an "
        "IPv4 address (`ip addr add 10.77.0.1/24 dev eth0`), or pick an entry with "
        "--gid-index (`ibv_devinfo -v` lists the GID table)")


_WC_STATUS = (
    "SUCCESS", "LOC_LEN_ERR", "LOC_QP_OP_ERR", "LOC_EEC_OP_ERR", "LOC_PROT_ERR",
    "WR_FLUSH_ERR", "MW_BIND_ERR", "BAD_RESP_ERR", "LOC_ACCESS_ERR", "REM_INV_REQ_ERR",
    "REM_ACCESS_ERR", "REM_OP_ERR", "RETRY_EXC_ERR", "RNR_RETRY_EXC_ERR", "LOC_RDD_VIOL_ERR",
    "REM_INV_RD_REQ_ERR", "REM_ABORT_ERR", "INV_EECN_ERR", "INV_EEC_STATE_ERR", "FATAL_ERR",
    "RESP_TIMEOUT_ERR", "GENERAL_ERR", "TM_ERR", "TM_RNDV_INCOMPLETE",
)


def wc_status_name(status: int) -> str:
    """The libibverbs name of an ibv_wc_status number, e.g. ``IBV_WC_LOC_LEN_ERR``."""
    if 0 <= status < len(_WC_STATUS):
        return f"IBV_WC_{_WC_STATUS[status]}"
    return f"IBV_WC status {status}"
