"""The verbs side of ``qp-server`` with pyverbs: device, GID, PD, CQ, RC QPs and buffers.

pyverbs is rdma-core's Python binding and comes with the distribution, not PyPI
(Debian/Ubuntu: ``apt install python3-pyverbs``; or the NIC vendor's OFED). It is
imported inside the methods, so the rest of ``qp-server`` (``ctrl``, the tests)
works without it. Run ``qp-server`` with the system Python, or from a venv made
with ``--system-site-packages``.

:class:`PyverbsBackend` implements :class:`host.backend.Backend`:

* one device context, one PD and one CQ shared by all QPs (with a completion
  channel for ``--poll event`` and ``hybrid``);
* per QP an RC QP (created in INIT by pyverbs, access local + remote write) and its
  own buffer, allocated and zeroed by pyverbs' ``MR`` (``posix_memalign`` +
  ``memset``) and registered for local and remote write; allocated after
  ``--numa-node`` pinning, so first touch puts it on that node;
* ``connect`` moves the QP INIT → RTR → RTS with the endpoint's QPN and first PSN,
  the path MTU the endpoint announced and the remote GID ``::ffff:a.b.c.d``;
* ``reset`` moves it to RESET and back to INIT with a new random first PSN
  (``--repeat``);
* ``rdma_connect`` (``--cm rdma``) connects the QP through rdma_cm instead
  (:class:`host.rdma_connect.CmLink`: ``rdma_connect`` with the QP's number and the
  private data naming its buffer, RTR and RTS with the attributes rdma_cm took from
  the REP, RTU with ``rdma_establish``); the route must go through the device the
  QP is on. ``rdma_disconnect`` ends it, and ``close`` destroys the rdma_cm IDs.
* ``rdma_listen`` (``--cm rdma --listen PORT``) has the endpoint connect the QP
  instead (:class:`host.rdma_listen.Listener`: listen on the host's address, CONNECT
  over UDP, RTR and RTS with the attributes rdma_cm took from the endpoint's REQ,
  ``rdma_accept`` with the QP's number and the private data naming its buffer).
"""

from __future__ import annotations

import ctypes
import random
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

from .backend import (
    Completion,
    CompletionKind,
    GidEntry,
    PortInfo,
    VerbsOptions,
    choose_gid,
    gid_ipv4,
    ipv4_gid,
)
from .cm import CmClient
from .errors import HostError
from .protocol import PathMtu, QpInfo

__all__ = ["PyverbsBackend", "MAX_BUFFER_BYTES"]

#: pyverbs' ``MR.read``/``MR.write`` take the offset as a C int.
MAX_BUFFER_BYTES = (1 << 31) - 1

_SYSFS = Path("/sys/class/infiniband")
_POLL_BATCH = 64
_SPIN_SECONDS = 100e-6          # hybrid: spin this long before sleeping on the channel
# RTR/RTS values (the responder's are the ones that matter: the host only answers).
_MIN_RNR_TIMER = 12             # 0.64 ms announced in RNR NAKs
_MAX_DEST_RD_ATOMIC = 1
_TIMEOUT = 14
_RETRY_CNT = 7
_RNR_RETRY = 7
_HOP_LIMIT = 64

_NO_PYVERBS = ("pyverbs is not installed: `apt install python3-pyverbs` (Debian/Ubuntu) or the "
               "NIC vendor's OFED, and run qp-server with the system python3 or from a venv "
               "made with --system-site-packages (the PyPI package does not work)")


def _import_pyverbs() -> Any:
    try:
        import pyverbs.enums as enums
    except ImportError:
        raise HostError(_NO_PYVERBS) from None
    return enums


class PyverbsBackend:
    """:class:`host.backend.Backend` on a real RDMA device through pyverbs."""

    def __init__(self, options: VerbsOptions):
        self.options = options
        self._ctx: Any = None
        self._pd: Any = None
        self._channel: Any = None
        self._cq: Any = None
        self._qps: list[Any] = []
        self._mrs: list[Any] = []
        self._psns: list[int] = []
        self._index: dict[int, int] = {}
        self._links: dict[int, Any] = {}
        self._port: PortInfo | None = None
        self._e: Any = None

    # Opening

    def open(self, qps: int, buffer_bytes: int, receives: int) -> PortInfo:
        e = self._e = _import_pyverbs()
        from pyverbs.cq import CQ, CompChannel
        from pyverbs.mr import MR
        from pyverbs.pd import PD
        from pyverbs.pyverbs_error import PyverbsError
        from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr

        if buffer_bytes > MAX_BUFFER_BYTES:
            raise HostError(f"a buffer of {buffer_bytes} bytes is too large for pyverbs "
                            f"(at most {MAX_BUFFER_BYTES}): use a smaller --ring")
        name = self._device_name()
        self._ctx = self._open_context(name)
        port = self._query_port(e, name)
        gid = self._choose_gid(e, name, port)
        self._port = PortInfo(
            device=name, port=self.options.ib_port, gid_index=gid.index, gid=gid.gid,
            ip=gid.ip or "0.0.0.0", active_mtu=PathMtu(port.active_mtu),
            numa_node=_device_numa_node(name))
        try:
            self._pd = PD(self._ctx)
            if self.options.poll != "busy":
                self._channel = CompChannel(self._ctx)
            self._cq = CQ(self._ctx, max(1, qps * (receives + 2)), None, self._channel, 0)
            if self._channel is not None:
                self._cq.req_notify()
            access = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
            for _ in range(qps):
                self._mrs.append(MR(self._pd, max(buffer_bytes, 64), access))
                cap = QPCap(max_send_wr=1, max_recv_wr=max(1, receives), max_send_sge=1,
                            max_recv_sge=1)
                init = QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self._cq, rcq=self._cq, cap=cap,
                                  sq_sig_all=1)
                attr = QPAttr(port_num=self.options.ib_port)
                attr.pkey_index = 0
                attr.qp_access_flags = access
                qp = QP(self._pd, init, attr)
                self._index[qp.qp_num] = len(self._qps)
                self._qps.append(qp)
                self._psns.append(random.getrandbits(24))
        except PyverbsError as error:
            raise HostError(f"cannot create {qps} RC QP(s) with {receives} receives and "
                            f"{buffer_bytes}-byte buffers on {name}: {error}; lower --qps, "
                            "--receives or --ring, or raise `ulimit -l` (locked memory)") from None
        return self._port

    def _device_name(self) -> str:
        import pyverbs.device as d

        names = [device.name.decode() for device in d.get_device_list()]
        if not names:
            raise HostError("no RDMA device: load rdma_rxe (`rdma link add rxe0 type rxe "
                            "netdev eth0`) or install the NIC driver")
        wanted = self.options.device
        if wanted is None:
            return names[0]
        if wanted not in names:
            raise HostError(f"no RDMA device {wanted!r}: this host has {', '.join(names)}; "
                            "pass one of them with --device (`ibv_devices` lists them)")
        return wanted

    def _open_context(self, name: str) -> Any:
        import pyverbs.device as d
        from pyverbs.pyverbs_error import PyverbsError

        try:
            return d.Context(name=name)
        except PyverbsError as error:
            raise HostError(f"cannot open RDMA device {name}: {error}; check permissions on "
                            "/dev/infiniband/uverbs* (run as root or join the rdma group)"
                            ) from None

    def _query_port(self, e: Any, name: str) -> Any:
        from pyverbs.pyverbs_error import PyverbsError

        number = self.options.ib_port
        try:
            port = self._ctx.query_port(number)
        except PyverbsError:
            count = self._ctx.query_device().phys_port_cnt
            raise HostError(f"device {name} has no port {number}: use --ib-port 1..{count}"
                            ) from None
        if port.state != e.IBV_PORT_ACTIVE:
            raise HostError(f"port {number} of {name} is not active (state {port.state}): "
                            "bring its network interface up (`ip link set <netdev> up`) and "
                            "check the link (`rdma link show`)")
        return port

    def _choose_gid(self, e: Any, name: str, port: Any) -> GidEntry:
        from pyverbs.pyverbs_error import PyverbsError

        number = self.options.ib_port
        where = f"port {number} of {name}"
        index = self.options.gid_index
        if index is not None:
            if not 0 <= index < port.gid_tbl_len:
                raise HostError(f"GID index {index} is out of range for {where} (its table has "
                                f"{port.gid_tbl_len} entries): `ibv_devinfo -v` lists them; "
                                "pass the index of ::ffff:a.b.c.d or leave --gid-index out")
            try:
                gid = self._ctx.query_gid(number, index).gid
            except PyverbsError:
                gid = "empty"
            if gid_ipv4(gid) is None:
                raise HostError(f"GID index {index} of {where} is not an IPv4 RoCEv2 GID "
                                f"(it is {gid}): `ibv_devinfo -v` lists the table; pass the "
                                "index of ::ffff:a.b.c.d or leave --gid-index out")
            return GidEntry(index, gid, self._gid_roce_v2(e, name, index))
        entries = []
        for i in range(port.gid_tbl_len):
            try:
                gid = self._ctx.query_gid(number, i).gid
            except PyverbsError:
                continue
            if gid_ipv4(gid) is not None:
                entries.append(GidEntry(i, gid, self._gid_roce_v2(e, name, i)))
        return choose_gid(entries, where=where)

    def _gid_roce_v2(self, e: Any, name: str, index: int) -> bool | None:
        """Whether GID ``index`` is a RoCE v2 entry: the verbs query where pyverbs has
        it, else sysfs; None when neither tells."""
        query = getattr(self._ctx, "query_gid_type", None)
        roce_v2 = getattr(e, "IBV_GID_TYPE_SYSFS_ROCE_V2", None)
        if query is not None and roce_v2 is not None:
            try:
                return query(self.options.ib_port, index) == roce_v2
            except Exception:
                pass
        path = _SYSFS / name / "ports" / str(self.options.ib_port) / "gid_attrs" / "types" / str(
            index)
        try:
            return "v2" in path.read_text()
        except OSError:
            return None

    # Per QP

    def qp_info(self, qp: int) -> QpInfo:
        assert self._port is not None, "open() first"
        mr = self._mrs[qp]
        return QpInfo(qpn=self._qps[qp].qp_num, psn=self._psns[qp], rkey=mr.rkey,
                      base_addr=mr.buf, ip=self._port.ip)

    def connect(self, qp: int, endpoint: QpInfo, mtu: PathMtu) -> None:
        from pyverbs.addr import GID, AHAttr, GlobalRoute
        from pyverbs.pyverbs_error import PyverbsError
        from pyverbs.qp import QPAttr

        assert self._port is not None, "open() first"
        attr = QPAttr(port_num=self.options.ib_port)
        attr.path_mtu = int(mtu)
        attr.dest_qp_num = endpoint.qpn
        attr.rq_psn = endpoint.psn
        attr.sq_psn = self._psns[qp]
        attr.max_dest_rd_atomic = _MAX_DEST_RD_ATOMIC
        attr.max_rd_atomic = 1
        attr.min_rnr_timer = _MIN_RNR_TIMER
        attr.timeout = _TIMEOUT
        attr.retry_cnt = _RETRY_CNT
        attr.rnr_retry = _RNR_RETRY
        route = GlobalRoute(dgid=GID(ipv4_gid(endpoint.ip)), sgid_index=self._port.gid_index,
                            hop_limit=_HOP_LIMIT)
        attr.ah_attr = AHAttr(port_num=self.options.ib_port, is_global=1, gr=route)
        try:
            self._qps[qp].to_rts(attr)
        except PyverbsError as error:
            raise HostError(
                f"cannot move host QP {self._qps[qp].qp_num} to RTR/RTS towards endpoint QP "
                f"{endpoint.qpn} at {endpoint.ip} (path MTU {mtu.bytes}): {error}; check that "
                f"{endpoint.ip} answers ARP on {self._port.device}'s interface (`ip neigh`) and "
                "--gid-index") from None

    def rdma_connect(self, qp: int, endpoint: str, port: int,
                     timeout: float) -> tuple[QpInfo, PathMtu]:
        from pyverbs.pyverbs_error import PyverbsError

        from .rdma_connect import CmLink, connect_private, parse_accept_private

        assert self._port is not None, "open() first"
        e = self._e
        verbs_qp, mr = self._qps[qp], self._mrs[qp]
        where = f"{endpoint} rdma_cm port {port}"
        try:
            link = self._links[qp] = CmLink(endpoint, port, timeout)
            self._check_device(link.cmid, f"route to {endpoint} goes through")
            private = connect_private(rkey=mr.rkey, base=mr.buf, length=mr.length)
            version, qpn = parse_accept_private(
                link.connect(private, verbs_qp, min_rnr_timer=_MIN_RNR_TIMER))
            attr, _ = verbs_qp.query(e.IBV_QP_STATE | e.IBV_QP_PATH_MTU | e.IBV_QP_DEST_QPN
                                     | e.IBV_QP_RQ_PSN | e.IBV_QP_SQ_PSN)
        except PyverbsError as error:
            raise HostError(f"rdma_cm towards {where} failed: {error}; is rdma_ucm loaded "
                            "and the device bound to the interface that routes there "
                            "(`rdma link`)?") from None
        return self._connected(qp, attr, QpInfo(qpn=qpn, psn=attr.rq_psn, ip=endpoint),
                               f"the REP's endpoint QP {qpn} (REP private data version "
                               f"{version})")

    def rdma_listen(self, qp: int, cm: CmClient, port: int, mtu: PathMtu,
                    timeout: float) -> tuple[QpInfo, PathMtu]:
        from pyverbs.pyverbs_error import PyverbsError

        from .rdma_connect import connect_private
        from .rdma_listen import Listener

        assert self._port is not None, "open() first"
        e = self._e
        verbs_qp, mr = self._qps[qp], self._mrs[qp]
        where = f"rdma_cm port {port} of {self._port.ip}"
        try:
            listener = self._links[qp] = Listener(self._port.ip, port, timeout)
            self._check_device(listener.listen_id, f"address {self._port.ip} is on")
            private = connect_private(rkey=mr.rkey, base=mr.buf, length=mr.length)
            ack = listener.connect(cm, private, mtu, qp=verbs_qp, min_rnr_timer=_MIN_RNR_TIMER)
            attr, _ = verbs_qp.query(e.IBV_QP_STATE | e.IBV_QP_PATH_MTU | e.IBV_QP_DEST_QPN
                                     | e.IBV_QP_RQ_PSN | e.IBV_QP_SQ_PSN)
        except PyverbsError as error:
            raise HostError(f"rdma_cm listening on {where} failed: {error}; is rdma_ucm "
                            "loaded, the device bound to that address's interface (`rdma "
                            "link`), and the port free?") from None
        if attr.rq_psn != ack.loc.psn:
            raise HostError(f"endpoint QP {ack.loc.qpn} announced first PSN {ack.loc.psn:#08x} "
                            f"in CONNECT/ACK, its REQ {attr.rq_psn:#08x}: report it with the "
                            "pcap")
        return self._connected(qp, attr, ack.loc, f"the REQ's endpoint QP {ack.loc.qpn}")

    def _check_device(self, cmid: Any, what: str) -> None:
        """The rdma_cm ID ``cmid`` must be on the backend's device (``what``: "route to
        X goes through" or "address X is on")."""
        device = cmid.dev_name
        device = device.decode() if isinstance(device, bytes) else str(device)
        assert self._port is not None
        if device != self._port.device:
            raise HostError(f"the {what} RDMA device {device}, not {self._port.device}: pass "
                            f"--device {device}")

    def _connected(self, qp: int, attr: Any, endpoint: QpInfo,
                   named: str) -> tuple[QpInfo, PathMtu]:
        """The endpoint's QP and the path MTU once rdma_cm connected host QP ``qp``
        (``attr``: its queried attributes), which must be in RTS towards ``named``."""
        verbs_qp = self._qps[qp]
        if attr.dest_qp_num != endpoint.qpn or attr.qp_state != self._e.IBV_QPS_RTS:
            raise HostError(f"host QP {verbs_qp.qp_num} is in state {attr.qp_state} towards QP "
                            f"{attr.dest_qp_num} after rdma_cm, not RTS towards {named}")
        self._psns[qp] = attr.sq_psn
        return endpoint, PathMtu(attr.path_mtu)

    def rdma_disconnect(self, qp: int, timeout: float) -> dict:
        link = self._links.get(qp)
        if link is None or not link.established:
            return {"event": None, "error": "not connected through rdma_cm"}
        return link.disconnect(timeout)

    def reset(self, qp: int) -> None:
        from pyverbs.pyverbs_error import PyverbsError
        from pyverbs.qp import QPAttr

        e = self._e
        verbs_qp = self._qps[qp]
        try:
            attr = QPAttr()
            attr.qp_state = e.IBV_QPS_RESET
            verbs_qp.modify(attr, e.IBV_QP_STATE)
            attr = QPAttr(port_num=self.options.ib_port)
            attr.pkey_index = 0
            attr.qp_access_flags = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
            verbs_qp.to_init(attr)
        except PyverbsError as error:
            raise HostError(f"cannot move host QP {verbs_qp.qp_num} to RESET and back to INIT: "
                            f"{error}") from None
        self._psns[qp] = (self._psns[qp] + 1 + random.getrandbits(23)) & 0xFFFFFF

    def post_receive(self, qp: int, wr_id: int, offset: int, length: int) -> None:
        from pyverbs.pyverbs_error import PyverbsError
        from pyverbs.wr import SGE, RecvWR

        mr = self._mrs[qp]
        sge = SGE(mr.buf + offset, length, mr.lkey)
        try:
            self._qps[qp].post_recv(RecvWR(wr_id=wr_id, num_sge=1, sg=[sge]))
        except PyverbsError as error:
            raise HostError(f"cannot post a receive on host QP {self._qps[qp].qp_num}: {error}; "
                            "lower --receives (the QP may also be in ERROR)") from None

    # Completions

    def poll(self, timeout: float) -> list[Completion]:
        deadline = time.monotonic() + timeout
        mode = self.options.poll
        if mode == "busy" or threading.current_thread() is not threading.main_thread():
            while True:
                found = self._poll_now()
                if found or time.monotonic() >= deadline:
                    return found
                if mode != "busy":
                    time.sleep(100e-6)
        if mode == "hybrid":
            spin_until = min(deadline, time.monotonic() + _SPIN_SECONDS)
            while True:
                found = self._poll_now()
                if found or time.monotonic() >= spin_until:
                    break
            if found:
                return found
        while True:
            self._cq.req_notify()
            found = self._poll_now()
            if found:
                return found
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self._wait_event(remaining):
                return self._poll_now()

    def _poll_now(self) -> list[Completion]:
        e = self._e
        _, wcs = self._cq.poll(_POLL_BATCH)
        completions = []
        for wc in wcs:
            if wc.opcode == e.IBV_WC_RECV:
                kind = CompletionKind.RECV
            elif wc.opcode == e.IBV_WC_RECV_RDMA_WITH_IMM:
                kind = CompletionKind.RECV_IMM
            else:
                kind = CompletionKind.OTHER
            imm = None
            raw_imm = getattr(wc, "imm_data", None)
            if raw_imm is not None and wc.wc_flags & e.IBV_WC_WITH_IMM:
                imm = socket.ntohl(raw_imm)
            completions.append(Completion(
                qp=self._index.get(wc.qp_num, -1), wr_id=wc.wr_id, status=wc.status, kind=kind,
                byte_len=wc.byte_len, imm=imm))
        return completions

    def _wait_event(self, timeout: float) -> bool:
        """Sleep on the completion channel for at most ``timeout`` s; True on an event.

        ``ibv_get_cq_event`` blocks without a timeout: a repeating SIGALRM interrupts
        it (EINTR); past the deadline that counts as no event.
        """
        from pyverbs.pyverbs_error import PyverbsError

        deadline = time.monotonic() + timeout
        previous = signal.signal(signal.SIGALRM, lambda signum, frame: None)
        signal.setitimer(signal.ITIMER_REAL, timeout, max(timeout, 0.01))
        try:
            self._channel.get_cq_event(self._cq)
        except PyverbsError:
            if time.monotonic() >= deadline:
                return False
            raise
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        self._cq.ack_events(1)
        return True

    # Memory

    def read(self, qp: int, offset: int, length: int) -> bytes:
        return self._mrs[qp].read(length, offset)

    def buffer(self, qp: int) -> memoryview:
        mr = self._mrs[qp]
        return memoryview((ctypes.c_char * mr.length).from_address(mr.buf)).cast("B")

    def fill(self, qp: int, value: int) -> None:
        mr = self._mrs[qp]
        chunk = bytes((value,)) * min(mr.length, 1 << 24)
        for offset in range(0, mr.length, len(chunk)):
            length = min(len(chunk), mr.length - offset)
            mr.write(chunk[:length], length, offset)

    def close(self) -> None:
        objects = [*self._links.values(), *self._qps, *self._mrs, self._cq, self._channel,
                   self._pd, self._ctx]
        self._links, self._qps, self._mrs = {}, [], []
        self._cq = self._channel = self._pd = self._ctx = None
        failures = []
        for obj in objects:
            if obj is not None:
                try:
                    obj.close()
                except Exception as error:
                    failures.append(f"{type(obj).__name__}: {error}")
        if failures:
            raise HostError(f"could not release every verbs object ({'; '.join(failures)}); "
                            "the kernel frees them when qp-server exits")


def _device_numa_node(name: str) -> int | None:
    try:
        node = int((_SYSFS / name / "device" / "numa_node").read_text())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None
