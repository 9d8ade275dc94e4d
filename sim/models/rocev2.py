"""RoCEv2 packets as Scapy builds them: the golden model of the transmit engine.

Scapy (``scapy.contrib.roce``) has the BTH and computes the ICRC but has no
RETH or ImmDt layer; they are defined here from the InfiniBand specification
(RETH: virtual address u64, rkey u32, DMA length u32; ImmDt: u32, all
big-endian). :func:`message_packets` cuts a message into packets the way the
specification says a requester must, independently of the gateware, and sets
AckReq by the core's rule (:class:`RetransmitPages`).
"""

from dataclasses import dataclass

from scapy.contrib.roce import BTH
from scapy.fields import IntField, XIntField, XLongField
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Packet, Raw

from host.protocol import generator_payload

__all__ = ["RETH", "ImmDt", "Message", "PacketFields", "RetransmitPages", "message_packets",
           "roce_frame", "generator_payload", "ROCEV2_PORT", "PKEY", "RING_BEAT_BYTES"]

ROCEV2_PORT = 4791
PKEY = 0xFFFF

#: Bytes of one beat of a retransmit ring: the core's 512-bit bus.
RING_BEAT_BYTES = 64

#: Beats of a page of the retransmit pool (4 KiB).
PAGE_BEATS = 4096 // RING_BEAT_BYTES


class RETH(Packet):
    name = "RETH"
    fields_desc = [XLongField("va", 0), XIntField("rkey", 0), IntField("dlen", 0)]


class ImmDt(Packet):
    name = "ImmDt"
    fields_desc = [XIntField("imm", 0)]


@dataclass(frozen=True)
class Message:
    verb: str                   # "RDMA_WRITE", "RDMA_WRITE_WITH_IMMEDIATE", "SEND", ...
    payload: bytes
    remote_address: int = 0
    immediate: int = 0

    @property
    def write(self) -> bool:
        return self.verb.startswith("RDMA_WRITE")

    @property
    def with_immediate(self) -> bool:
        return self.verb.endswith("WITH_IMMEDIATE")


@dataclass(frozen=True)
class PacketFields:
    opcode: int
    psn: int
    ack_request: bool
    payload: bytes
    reth: tuple[int, int, int] | None       # (virtual address, rkey, DMA length)
    immediate: int | None


_OPCODES = {    # IBTA vol. 1 table 38, Reliable Connection
    ("SEND", "FIRST"): 0x00, ("SEND", "MIDDLE"): 0x01, ("SEND", "LAST"): 0x02,
    ("SEND", "LAST_IMM"): 0x03, ("SEND", "ONLY"): 0x04, ("SEND", "ONLY_IMM"): 0x05,
    ("WRITE", "FIRST"): 0x06, ("WRITE", "MIDDLE"): 0x07, ("WRITE", "LAST"): 0x08,
    ("WRITE", "LAST_IMM"): 0x09, ("WRITE", "ONLY"): 0x0A, ("WRITE", "ONLY_IMM"): 0x0B,
}


@dataclass
class RetransmitPages:
    """Where a QP's packets land in its retransmit ring, for the AckReq rule: the core
    asks for an ACK whenever a packet's payload starts a page (4 KiB) of the ring or
    crosses into one, as each such packet takes a page of the retransmit pool, so a QP
    never holds all the pages it may without an ACK on its way. ``tail`` counts the
    beats written since the QP was first set (a QP set again carries on); a packet
    takes ceil(payload / 64) beats."""
    tail: int = 0

    def ack_request(self, payload_bytes: int) -> bool:
        """Whether a packet of ``payload_bytes`` starts a page or crosses into one; it is
        then written (``tail`` advances)."""
        beats = -(-payload_bytes // RING_BEAT_BYTES)
        offset = self.tail % PAGE_BEATS
        enters = beats > 0 and (offset == 0 or offset + beats > PAGE_BEATS)
        self.tail += beats
        return enters


def message_packets(message: Message, *, psn: int, path_mtu: int, rkey: int,
                    ring: RetransmitPages | None = None,
                    ack_interval: int = 0) -> list[PacketFields]:
    """The packets of one message: full path-MTU packets, then the rest.

    AckReq is set on the last packet, on those that enter a page of the QP's
    ``ring`` (which every packet advances), and on every ``ack_interval``-th
    packet of the message (for tests of a responder on its own).
    """
    data = message.payload
    chunks = [data[offset:offset + path_mtu] for offset in range(0, len(data), path_mtu)]
    chunks = chunks or [b""]
    family = "WRITE" if message.write else "SEND"
    packets = []
    for index, chunk in enumerate(chunks):
        first, last = index == 0, index == len(chunks) - 1
        position = ("ONLY" if first else "LAST") if last else ("FIRST" if first else "MIDDLE")
        if last and message.with_immediate:
            position += "_IMM"
        ack = ring is not None and ring.ack_request(len(chunk))
        ack = ack or last or (ack_interval > 0 and (index + 1) % ack_interval == 0)
        packets.append(PacketFields(
            opcode=_OPCODES[family, position],
            psn=(psn + index) % (1 << 24),
            ack_request=ack,
            payload=chunk,
            reth=(message.remote_address, rkey, len(data)) if message.write and first else None,
            immediate=message.immediate if message.with_immediate and last else None,
        ))
    return packets


def roce_frame(fields: PacketFields, *, src_mac: str, dst_mac: str, src_ip: str, dst_ip: str,
               dest_qp: int, src_port: int, tos: int, ip_id: int) -> bytes:
    """The whole Ethernet frame (no FCS) of one packet, ICRC computed by Scapy."""
    pad = -len(fields.payload) % 4
    transport = BTH(opcode=fields.opcode, padcount=pad, pkey=PKEY, dqpn=dest_qp,
                    ackreq=int(fields.ack_request), psn=fields.psn)
    if fields.reth is not None:
        va, rkey, dlen = fields.reth
        transport /= RETH(va=va, rkey=rkey, dlen=dlen)
    if fields.immediate is not None:
        transport /= ImmDt(imm=fields.immediate)
    transport /= Raw(fields.payload + bytes(pad))
    frame = (Ether(src=src_mac, dst=dst_mac)
             / IP(src=src_ip, dst=dst_ip, tos=tos, id=ip_id, flags="DF", ttl=64)
             / UDP(sport=src_port, dport=ROCEV2_PORT, chksum=0)
             / transport)
    return bytes(frame)
