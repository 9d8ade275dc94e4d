"""Writes the frames that cross the MAC boundary to a pcap file for Wireshark."""

import struct
from pathlib import Path
from typing import BinaryIO

__all__ = ["PcapWriter"]

# Nanosecond-resolution pcap (magic a1b23c4d), link type 1: Ethernet without FCS.
_MAGIC_NS = 0xA1B23C4D
_LINKTYPE_ETHERNET = 1


class PcapWriter:
    """A pcap file of Ethernet frames stamped with simulated time in nanoseconds."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: BinaryIO = open(self.path, "wb")  # noqa: SIM115 - closed by close()
        self._file.write(struct.pack("<IHHiIII", _MAGIC_NS, 2, 4, 0, 0, 65535,
                                     _LINKTYPE_ETHERNET))
        self.frames = 0

    def write(self, frame: bytes, time_ns: int) -> None:
        seconds, nanoseconds = divmod(int(time_ns), 1_000_000_000)
        self._file.write(struct.pack("<IIII", seconds, nanoseconds, len(frame), len(frame)))
        self._file.write(frame)
        self._file.flush()
        self.frames += 1

    def close(self) -> None:
        self._file.close()
