"""What the planner tells the segmenter about each packet it is to send."""

from amaranth import *
from amaranth.lib import data

from ..headers import BTH, IMMDT, RETH, NetworkLayout
from ..stream import meta_with
from ..udp.tx import UDP_TX_META
from .requests import COMPLETION

__all__ = ["TRANSPORT", "TRANSPORT_LENGTHS", "ROCE_TX_META", "PACKET_DESCRIPTOR",
           "MAX_PACKET_PAYLOAD"]

#: The transport headers of a packet: the BTH, then its extensions packed
#: behind it (RETH, then ImmDt, each only when present), up to 32 bytes.
TRANSPORT = NetworkLayout({
    "bth": BTH,
    "extensions": 8 * (RETH.length + IMMDT.length),
})

#: The lengths a packet's transport headers can have: BTH alone, with ImmDt,
#: with RETH, with both.
TRANSPORT_LENGTHS = tuple(sorted({BTH.length + reth + imm
                                  for reth in (0, RETH.length) for imm in (0, IMMDT.length)}))

#: Payload bytes of the largest packet (path MTU 4096).
MAX_PACKET_PAYLOAD = 4096

#: Meta of the packets leaving the segmenter: where they go (UDP), and the
#: transport headers the header inserter puts in front.
ROCE_TX_META = meta_with(UDP_TX_META, transport=TRANSPORT,
                         transport_length=range(TRANSPORT.length + 1))

PACKET_DESCRIPTOR = data.StructLayout({
    "meta": ROCE_TX_META,
    "payload_length": range(MAX_PACKET_PAYLOAD + 1),
    "message_end": 1,           # the last packet of its message: complete it after
    "drop": 1,                  # a bad work request: send nothing, drain its payload
    "completion": COMPLETION,
})
