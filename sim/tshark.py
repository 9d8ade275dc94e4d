"""Wireshark's view of frames, through ``tshark -T pdml``: the tests' check that what
the models and the core put on the wire dissects as the protocol it claims to be."""

import shutil
import subprocess
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from sim.pcap import PcapWriter

__all__ = ["PI_ERROR", "Dissection", "available", "dissect"]

#: Wireshark's severity of an expert item that marks an error (epan/proto.h).
PI_ERROR = 0x0080_0000


@dataclass(frozen=True)
class Dissection:
    """One packet as tshark dissected it: each field's ``show`` by its name (the last
    one of a name), every ``showname`` shown, and what tshark found wrong (a
    ``_ws.malformed`` item, expert items of error severity)."""
    shown: dict[str, str]
    shownames: frozenset[str]
    errors: tuple[str, ...]


def available() -> bool:
    return shutil.which("tshark") is not None


def _dissection(packet: ElementTree.Element) -> Dissection:
    fields = list(packet.iter("field"))
    names = {field.get("name") for field in fields} | {proto.get("name")
                                                       for proto in packet.iter("proto")}
    errors = ["_ws.malformed"] if "_ws.malformed" in names else []
    errors += [f"expert error: {field.get('showname')}" for field in fields
               if field.get("name") == "_ws.expert.severity"
               and int(field.get("show")) >= PI_ERROR]
    return Dissection({field.get("name"): field.get("show") for field in fields},
                      frozenset(field.get("showname") for field in fields), tuple(errors))


def dissect(frames: Iterable[bytes], capture: Path) -> list[Dissection]:
    """Write ``frames`` (Ethernet, no FCS) to the pcap ``capture`` and dissect them."""
    writer = PcapWriter(capture)
    for number, frame in enumerate(frames):
        writer.write(frame, number * 1000)
    writer.close()
    pdml = subprocess.run(["tshark", "-r", str(capture), "-T", "pdml"], check=True,
                          capture_output=True, text=True, timeout=120).stdout
    return [_dissection(packet) for packet in ElementTree.fromstring(pdml).findall("packet")]
