"""``qp-server``'s verbs backend played by responder models in the simulation:
each host QP is a :class:`sim.responder.Responder` attached to the bench, so the
host program's run loop (pairing, receives, completions, the data checker) runs
against the simulated endpoint with no RDMA device."""

from __future__ import annotations

import queue
import time

from host.backend import Completion, CompletionKind, PortInfo
from host.protocol import PathMtu, QpInfo

from .responder import Responder

__all__ = ["ResponderBackend"]

#: RC opcodes of the last packet of an RDMA WRITE with immediate (IBTA table 38).
_WRITE_WITH_IMMEDIATE = {0x09, 0x0B}


class ResponderBackend:
    """A :class:`host.backend.Backend` whose QPs are responder models.

    Parameters
    ----------
    bridge : the :class:`sim.cm_bridge.CmBridge` whose bench the models attach to
        (changes to them happen in the simulation's thread, through the bridge).
    mac, ip : the host's addresses; ``peer_mac``, ``peer_ip``: the endpoint's.
    """

    def __init__(self, bridge, *, mac: str, ip: str, peer_mac: str, peer_ip: str,
                 first_qpn: int = 0x300, mtu: PathMtu = PathMtu.MTU_1024) -> None:
        self.bridge = bridge
        self.mac, self.ip, self.peer_mac, self.peer_ip = mac, ip, peer_mac, peer_ip
        self.first_qpn = first_qpn
        self.mtu = mtu
        self.responders: list[Responder | None] = []
        self._buffer_bytes = 0
        self._posted: list[queue.SimpleQueue[tuple[int, int]]] = []
        self._consumed: list[int] = []
        self._fill: list[int] = []
        self.closed = 0

    def __call__(self, options) -> ResponderBackend:
        """The backend factory ``qp-server``'s ``main(backend=...)`` takes."""
        return self

    def open(self, qps: int, buffer_bytes: int, receives: int) -> PortInfo:
        self._buffer_bytes = buffer_bytes
        self.responders = [None] * qps
        self._posted = [queue.SimpleQueue() for _ in range(qps)]
        self._consumed = [0] * qps
        self._fill = [0] * qps
        return PortInfo(device="sim-rxe0", port=1, gid_index=1, gid=f"::ffff:{self.ip}",
                        ip=self.ip, active_mtu=self.mtu)

    def qp_info(self, qp: int) -> QpInfo:
        return QpInfo(qpn=self.first_qpn + qp, psn=0x10000 * (qp + 1) + 0x55,
                      rkey=0x5000 + qp, base_addr=self._base(qp), ip=self.ip)

    @staticmethod
    def _base(qp: int) -> int:
        return 0x7F00_0000_0000 + (qp << 32)

    def connect(self, qp: int, endpoint: QpInfo, mtu: PathMtu) -> None:
        info = self.qp_info(qp)
        responder = Responder(mac=self.mac, ip=self.ip, peer_mac=self.peer_mac,
                              peer_ip=self.peer_ip, qpn=info.qpn, peer_qpn=endpoint.qpn,
                              expected_psn=endpoint.psn, rkey=info.rkey,
                              memory_base=info.base_addr, memory_size=self._buffer_bytes,
                              path_mtu=mtu.bytes)
        responder.memory[:] = bytes((self._fill[qp],)) * self._buffer_bytes
        self.responders[qp] = responder
        self.bridge.call(lambda: self.bridge.bench.attach(responder))

    def post_receive(self, qp: int, wr_id: int, offset: int, length: int) -> None:
        self._posted[qp].put((wr_id, offset))
        responder = self.responders[qp]
        if responder is not None:
            self.bridge.call(responder.post_receive)

    def poll(self, timeout: float) -> list[Completion]:
        deadline = time.monotonic() + timeout
        while True:
            found = self._completions()
            if found or time.monotonic() >= deadline:
                return found
            time.sleep(min(0.005, timeout))

    def _completions(self) -> list[Completion]:
        found = []
        for qp, responder in enumerate(self.responders):
            if responder is None:
                continue
            landed = responder.receive_queue
            while self._consumed[qp] < len(landed):
                message = landed[self._consumed[qp]]
                self._consumed[qp] += 1
                wr_id, offset = self._posted[qp].get_nowait()
                if message.opcode in _WRITE_WITH_IMMEDIATE:
                    kind = CompletionKind.RECV_IMM
                else:
                    kind = CompletionKind.RECV
                    responder.memory[offset:offset + len(message.data)] = message.data
                found.append(Completion(qp=qp, wr_id=wr_id, kind=kind,
                                        byte_len=len(message.data), imm=message.immediate))
        return found

    def read(self, qp: int, offset: int, length: int) -> bytes:
        return bytes(self.responders[qp].memory[offset:offset + length])

    def fill(self, qp: int, value: int) -> None:
        self._fill[qp] = value
        responder = self.responders[qp]
        if responder is not None:
            responder.memory[:] = bytes((value,)) * self._buffer_bytes

    def close(self) -> None:
        self.closed += 1
