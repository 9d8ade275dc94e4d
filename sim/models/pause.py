"""PAUSE and PFC frames for the benches, and a cocotb watch on the MAC boundary of
:class:`gateware.core.NetworkCore` that times them.

PAUSE (IEEE 802.3 annex 31B) is Scapy's ``Ether`` with the opcode and pause_time
packed by ``struct``; PFC (IEEE 802.1Qbb clause 36) too, as Scapy has no PFC layer:
opcode 0x0101, the class-enable vector (bit n: priority n) and eight times, big-endian.
"""

import struct

import cocotb
from cocotb.triggers import RisingEdge
from scapy.layers.l2 import Ether

__all__ = ["MAC_CONTROL_ADDRESS", "pause_frame", "pfc_frame", "MacBoundaryWatch"]

MAC_CONTROL_ADDRESS = "01:80:c2:00:00:01"
ETHERTYPE_MAC_CONTROL = 0x8808
_MIN_FRAME = 60


def _mac_control(payload: bytes, *, dst: str, src: str) -> bytes:
    frame = bytes(Ether(dst=dst, src=src, type=ETHERTYPE_MAC_CONTROL) / payload)
    return frame + bytes(max(0, _MIN_FRAME - len(frame)))


def pause_frame(quanta: int, *, dst: str = MAC_CONTROL_ADDRESS,
                src: str = "52:54:00:12:34:56", opcode: int = 0x0001) -> bytes:
    """A PAUSE frame for ``quanta`` quanta of 512 bit times, padded to 60 bytes."""
    return _mac_control(struct.pack(">HH", opcode, quanta), dst=dst, src=src)


def pfc_frame(enable: int, times: list[int], *, dst: str = MAC_CONTROL_ADDRESS,
              src: str = "52:54:00:12:34:56") -> bytes:
    """A PFC frame: priorities whose bit is set in ``enable`` pause for their time."""
    return _mac_control(struct.pack(">HH8H", 0x0101, enable, *times), dst=dst, src=src)


def _ethertype(beat: bytes) -> int:
    return int.from_bytes(beat[12:14], "big")


class MacBoundaryWatch:
    """Watches the core's two MAC streams every cycle (``bench.cycle`` as the clock):
    ``control_in`` holds the cycle of the last beat of each MAC control frame sent in,
    ``starts`` ``(cycle, rocev2)`` of the first beat of each frame the core sent."""

    def __init__(self, bench):
        self.bench = bench
        self.control_in: list[int] = []
        self.starts: list[tuple[int, bool]] = []
        cocotb.start_soon(self._watch())

    async def _watch(self) -> None:
        dut, width = self.bench.dut, self.bench.width
        rx_first = tx_first = True
        rx_type = 0
        while True:
            await RisingEdge(dut.clk)
            cycle = self.bench.cycle
            if dut.rx__tvalid.value == 1:
                if rx_first:
                    beat = dut.rx__tdata.value.to_unsigned().to_bytes(width, "little")
                    rx_type = _ethertype(beat)
                last = dut.rx__tlast.value == 1
                if last and rx_type == ETHERTYPE_MAC_CONTROL:
                    self.control_in.append(cycle)
                rx_first = last
            if dut.tx__tvalid.value == 1 and dut.tx__tready.value == 1:
                if tx_first:
                    beat = dut.tx__tdata.value.to_unsigned().to_bytes(width, "little")
                    rocev2 = _ethertype(beat) == 0x0800 and beat[23] == 17 and \
                        int.from_bytes(beat[36:38], "big") == 4791
                    self.starts.append((cycle, rocev2))
                tx_first = dut.tx__tlast.value == 1

    async def send_control(self, frame: bytes) -> int:
        """Send a MAC control frame into the core; returns the cycle of its last beat."""
        count = len(self.control_in)
        await self.bench.send(frame)
        while len(self.control_in) == count:
            await self.bench.idle(1)
        return self.control_in[-1]

    def roce_starts(self, after: int, before: int | None = None) -> list[int]:
        """Cycles of the RoCEv2 frames that started after ``after`` (and before ``before``)."""
        return [cycle for cycle, rocev2 in self.starts
                if rocev2 and cycle > after and (before is None or cycle < before)]

    def all_starts(self, after: int, before: int) -> list[int]:
        return [cycle for cycle, _ in self.starts if after < cycle < before]
