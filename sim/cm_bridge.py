"""A UDP socket on loopback that carries connection-manager datagrams to the
simulated core and its replies back, so host programs (``qp-server ctrl``, the
run mode with a simulated verbs backend) talk to the gateware as to a board."""

from __future__ import annotations

import queue
import socket
from collections.abc import Callable

from scapy.layers.inet import UDP
from scapy.layers.l2 import Ether

__all__ = ["CmBridge"]


class CmBridge:
    """Carries CM datagrams between ``127.0.0.1:port`` and a :class:`sim.bench.NetworkBench`.

    A datagram from ``127.0.0.1:p`` enters the core as a frame from ``host_ip``,
    UDP source port ``p``; a reply of the core to port ``p`` goes back to
    ``127.0.0.1:p``. :meth:`call` hands a function to the simulation's thread
    (a host program runs in another thread); :meth:`run` is the cocotb
    coroutine that does both, every ``interval`` cycles.
    """

    def __init__(self, bench, *, host_ip: str, bind: tuple[str, int] = ("127.0.0.1", 0),
                 interval: int = 20) -> None:
        self.bench = bench
        self.host_ip = host_ip
        self.interval = interval
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.socket.bind(bind)
        self.socket.setblocking(False)
        self.port = self.socket.getsockname()[1]
        self.datagrams = {"to_core": 0, "to_host": 0}
        self._calls: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()

    def call(self, function: Callable[[], None]) -> None:
        """Run ``function`` in the simulation's thread, before the next datagram."""
        self._calls.put(function)

    async def run(self) -> None:
        bench = self.bench
        while True:
            while not self._calls.empty():
                self._calls.get()()
            while True:
                try:
                    payload, (_, port) = self.socket.recvfrom(65536)
                except BlockingIOError:
                    break
                self.datagrams["to_core"] += 1
                await bench.send(bench.cm_frame(payload, host_ip=self.host_ip, sport=port))
            while bench.cm_replies:
                packet = Ether(bench.cm_replies.popleft())
                self.datagrams["to_host"] += 1
                self.socket.sendto(bytes(packet[UDP].payload), ("127.0.0.1", packet[UDP].dport))
            await bench.idle(self.interval)

    def close(self) -> None:
        self.socket.close()
