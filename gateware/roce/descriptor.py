"""What the planner tells the segmenter about each packet it is to send, and what it
and the reliability engine tell each other about messages and packets."""

from amaranth import *
from amaranth.lib import data

from ..headers import BTH, IMMDT, RETH, NetworkLayout
from ..stream import meta_with
from ..udp.tx import UDP_TX_META
from .requests import COMPLETION, QP_INDEX_BITS, WORK_REQUEST, PathMtu

__all__ = ["TRANSPORT", "TRANSPORT_LENGTHS", "ROCE_TX_META", "PACKET_DESCRIPTOR",
           "MAX_PACKET_PAYLOAD", "SLOT_BITS", "POINTER_BITS", "ADDRESS_BITS", "MESSAGE",
           "MESSAGE_LOADED", "PACKET_SENT", "REPLAY", "MESSAGE_END", "QP_VIEW", "BUFFER_READ",
           "buffer_write", "buffer_beat"]

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

#: Bits of a message slot, in the pool of outstanding messages all QPs share (up to
#: 65,536 slots).
SLOT_BITS = 16

#: Bits of a position in a QP's retransmit ring, counted in beats, with one bit more
#: than the ring needs so that a full ring and an empty one differ (up to 2^21 beats).
POINTER_BITS = 22

#: Bits of a beat address in the retransmit buffer (QP index, then ring offset).
ADDRESS_BITS = QP_INDEX_BITS + POINTER_BITS - 1

#: An outstanding message, as the reliability engine keeps it until it is acknowledged:
#: the work request, its PSNs, where its payload starts in the QP's ring, and the path
#: MTU it was cut by (a resend cuts it the same way).
MESSAGE = data.StructLayout({
    "request": WORK_REQUEST,
    "first_psn": 24,
    "packets": 24,
    "start": POINTER_BITS,
    "path_mtu": PathMtu,
})

#: The planner took a new message for a QP (into the QP's empty message slot).
MESSAGE_LOADED = data.StructLayout({"qp": QP_INDEX_BITS, "message": MESSAGE})

#: The planner sent a packet: the QP's next PSN and ring position after it.
PACKET_SENT = data.StructLayout({
    "qp": QP_INDEX_BITS,
    "replay": 1,
    "bytes": range(MAX_PACKET_PAYLOAD + 1),
    "datagram": 16,             # UDP payload bytes (transport headers to ICRC), for pacing
    "next_psn": 24,
    "next_tail": POINTER_BITS,
})

#: Resend a message from one of its packets (go-back-N), up to the QP's next PSN.
REPLAY = data.StructLayout({
    "qp": QP_INDEX_BITS,
    "slot": SLOT_BITS,
    "packet": 24,
    "message": MESSAGE,
})

#: What the planner needs to know of a QP from the reliability engine.
QP_VIEW = data.StructLayout({
    "next_psn": 24,             # the PSN of the QP's next new packet
    "tail": POINTER_BITS,       # the ring position of its next new payload
    "slot": SLOT_BITS,          # the message slot a new message takes
    "slot_free": 1,
    "error": 1,                 # the QP is in ERROR
    "blocked": 1,               # a resend or an RNR wait is due: no new packets
    "rnr_wait": 1,              # an RNR wait: no packets at all, resent ones included
})

#: Read a packet's payload from the retransmit buffer.
BUFFER_READ = data.StructLayout({
    "address": ADDRESS_BITS,
    "beats": range(MAX_PACKET_PAYLOAD + 1),
})

def buffer_write(width):
    """A payload beat into the retransmit buffer, at a beat address."""
    return data.StructLayout({"address": ADDRESS_BITS, "data": 8 * width})


def buffer_beat(width):
    """A payload beat out of the retransmit buffer; ``last`` ends a read."""
    return data.StructLayout({"data": 8 * width, "last": 1})


PACKET_DESCRIPTOR = data.StructLayout({
    "meta": ROCE_TX_META,
    "payload_length": range(MAX_PACKET_PAYLOAD + 1),
    # worked out ahead for the segmenter: payload, pad and ICRC bytes, whether they fit
    # in one beat, whether there is any payload
    "frame_length": range(MAX_PACKET_PAYLOAD + 8),
    "single_beat": 1,
    "has_payload": 1,
    "message_end": 1,           # the last packet of its message: report its status after
    "drop": 1,                  # send nothing, drain the (rest of the) message's payload
    "replay": 1,                # a resend: the payload comes from the retransmit buffer
    "address": ADDRESS_BITS,    # where the payload's first beat goes (or comes from)
    "tracked": 1,               # the message is in a slot: it completes on its ACK
    "slot": SLOT_BITS,
    "completion": COMPLETION,
})

#: The segmenter is done with a message's payload: its status, for the slot (tracked)
#: or as the completion itself (a request refused or flushed before any packet).
MESSAGE_END = data.StructLayout({
    "tracked": 1,
    "slot": SLOT_BITS,
    "completion": COMPLETION,
})
