"""InfiniBand CM MADs and the RoCEv2 GSI packets that carry them: the golden model of
the endpoint's QP1 and CM.

Written from the IBTA tables (vol. 1, chapter 12.6, tables 106 to 113 for the CM
messages, as Linux transcribes them in ``include/rdma/ibta_vol1_c12.h``; chapter 13.4
for the MAD header; 9.3.2 for the DETH), independently of the gateware's layouts: each
CM field is placed by its byte offset in the message, the bit where it starts in that
byte (the tables' ``Byte[Bit]`` notation, bit 0 the most significant) and its width;
the MAD header and the DETH are ``struct`` formats. The GSI frame is
Ether/IPv4/UDP/BTH/DETH/MAD/ICRC with Scapy's BTH, which computes the ICRC.

Everything is big-endian on the wire. Private data and the REJ's ARI are given and returned as
bytes, zero-padded to their room; every other field is an integer.
"""

import ipaddress
import struct
from dataclasses import dataclass
from typing import NamedTuple

from scapy.contrib.roce import BTH
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw

__all__ = [
    "CmField", "CM_MESSAGES", "BYTES_FIELDS", "ATTRIBUTE_IDS", "MAD_BYTES", "CM_BYTES",
    "MAD_HEADER_FORMAT", "DETH_FORMAT", "GSI_QKEY", "UD_SEND_ONLY", "ROCEV2_PORT", "RDMA_PS_TCP",
    "cm_message", "parse_cm_message", "mad", "parse_mad", "MadHeader", "deth",
    "gsi_frame", "GsiPacket", "parse_gsi_frame", "service_id", "cma_header",
    "connect_private", "accept_private", "parse_accept_private", "connect_request",
    "ca_guid",
]

MAD_BYTES = 256
CM_BYTES = 232
ROCEV2_PORT = 4791
GSI_QKEY = 0x8001_0000
UD_SEND_ONLY = 0x64
RDMA_PS_TCP = 0x0106

#: MAD common header: base version, management class, class version, R bit and method,
#: status, class specific, transaction ID, attribute ID, reserved, attribute modifier.
MAD_HEADER_FORMAT = struct.Struct(">BBBBHHQHHI")
#: DETH: Q_Key, then a reserved byte and the 24-bit source QP (one 32-bit word).
DETH_FORMAT = struct.Struct(">II")


class CmField(NamedTuple):
    """Where a field lies in a CM message: ``byte`` offset, ``bit`` (0 = the byte's
    most significant) where it starts, ``width`` in bits."""
    byte: int
    bit: int
    width: int


def _path(prefix, at):
    """A REQ's path fields (table 106), starting at byte ``at``."""
    return {
        f"{prefix}_local_lid": CmField(at, 0, 16),
        f"{prefix}_remote_lid": CmField(at + 2, 0, 16),
        f"{prefix}_local_gid": CmField(at + 4, 0, 128),
        f"{prefix}_remote_gid": CmField(at + 20, 0, 128),
        f"{prefix}_flow_label": CmField(at + 36, 0, 20),
        f"{prefix}_packet_rate": CmField(at + 39, 2, 6),
        f"{prefix}_traffic_class": CmField(at + 40, 0, 8),
        f"{prefix}_hop_limit": CmField(at + 41, 0, 8),
        f"{prefix}_sl": CmField(at + 42, 0, 4),
        f"{prefix}_subnet_local": CmField(at + 42, 4, 1),
        f"{prefix}_local_ack_timeout": CmField(at + 43, 0, 5),
    }


#: Every CM message the endpoint sends or parses: its fields (reserved bits are the
#: gaps between them).
CM_MESSAGES = {
    "REQ": {                                            # table 106
        "local_comm_id": CmField(0, 0, 32),
        "vendor_id": CmField(5, 0, 24),
        "service_id": CmField(8, 0, 64),
        "local_ca_guid": CmField(16, 0, 64),
        "local_qkey": CmField(28, 0, 32),
        "local_qpn": CmField(32, 0, 24),
        "responder_resources": CmField(35, 0, 8),
        "local_eecn": CmField(36, 0, 24),
        "initiator_depth": CmField(39, 0, 8),
        "remote_eecn": CmField(40, 0, 24),
        "remote_cm_response_timeout": CmField(43, 0, 5),
        "transport_service_type": CmField(43, 5, 2),
        "end_to_end_flow_control": CmField(43, 7, 1),
        "starting_psn": CmField(44, 0, 24),
        "local_cm_response_timeout": CmField(47, 0, 5),
        "retry_count": CmField(47, 5, 3),
        "partition_key": CmField(48, 0, 16),
        "path_mtu": CmField(50, 0, 4),
        "rdc_exists": CmField(50, 4, 1),
        "rnr_retry_count": CmField(50, 5, 3),
        "max_cm_retries": CmField(51, 0, 4),
        "srq": CmField(51, 4, 1),
        "extended_transport_type": CmField(51, 5, 3),
        **_path("primary", 52),
        **_path("alternate", 96),
        "sap_supported": CmField(139, 5, 1),
        "private_data": CmField(140, 0, 8 * 92),
    },
    "MRA": {                                            # table 107
        "local_comm_id": CmField(0, 0, 32),
        "remote_comm_id": CmField(4, 0, 32),
        "message_mraed": CmField(8, 0, 2),
        "service_timeout": CmField(9, 0, 5),
        "private_data": CmField(10, 0, 8 * 222),
    },
    "REJ": {                                            # table 108
        "local_comm_id": CmField(0, 0, 32),
        "remote_comm_id": CmField(4, 0, 32),
        "message_rejected": CmField(8, 0, 2),
        "reject_info_length": CmField(9, 0, 7),
        "reason": CmField(10, 0, 16),
        "additional_reject_info": CmField(12, 0, 8 * 72),
        "private_data": CmField(84, 0, 8 * 148),
    },
    "REP": {                                            # table 110
        "local_comm_id": CmField(0, 0, 32),
        "remote_comm_id": CmField(4, 0, 32),
        "local_qkey": CmField(8, 0, 32),
        "local_qpn": CmField(12, 0, 24),
        "vendor_id_high": CmField(15, 0, 8),
        "local_eecn": CmField(16, 0, 24),
        "vendor_id_mid": CmField(19, 0, 8),
        "starting_psn": CmField(20, 0, 24),
        "vendor_id_low": CmField(23, 0, 8),
        "responder_resources": CmField(24, 0, 8),
        "initiator_depth": CmField(25, 0, 8),
        "target_ack_delay": CmField(26, 0, 5),
        "failover_accepted": CmField(26, 5, 2),
        "end_to_end_flow_control": CmField(26, 7, 1),
        "rnr_retry_count": CmField(27, 0, 3),
        "srq": CmField(27, 3, 1),
        "local_ca_guid": CmField(28, 0, 64),
        "private_data": CmField(36, 0, 8 * 196),
    },
    "RTU": {                                            # table 111
        "local_comm_id": CmField(0, 0, 32),
        "remote_comm_id": CmField(4, 0, 32),
        "private_data": CmField(8, 0, 8 * 224),
    },
    "DREQ": {                                           # table 112
        "local_comm_id": CmField(0, 0, 32),
        "remote_comm_id": CmField(4, 0, 32),
        "remote_qpn": CmField(8, 0, 24),
        "private_data": CmField(12, 0, 8 * 220),
    },
    "DREP": {                                           # table 113
        "local_comm_id": CmField(0, 0, 32),
        "remote_comm_id": CmField(4, 0, 32),
        "private_data": CmField(8, 0, 8 * 224),
    },
}

#: Fields given and returned as bytes; the others are integers.
BYTES_FIELDS = frozenset({"private_data", "additional_reject_info"})

#: MAD attribute ID of each CM message.
ATTRIBUTE_IDS = {"REQ": 0x0010, "MRA": 0x0011, "REJ": 0x0012, "REP": 0x0013, "RTU": 0x0014,
                 "DREQ": 0x0015, "DREP": 0x0016}


def _shift(field):
    return 8 * CM_BYTES - 8 * field.byte - field.bit - field.width


def cm_message(kind, **values):
    """The 232 bytes of a CM message of ``kind`` ("REQ", ...); fields not given are 0."""
    fields = CM_MESSAGES[kind]
    word = 0
    for name, value in values.items():
        field = fields[name]
        if isinstance(value, bytes):
            if len(value) > field.width // 8:
                raise ValueError(f"{kind}.{name}: {len(value)} bytes, room for "
                                 f"{field.width // 8}")
            value = int.from_bytes(value.ljust(field.width // 8, b"\0"), "big")
        if not 0 <= value < 1 << field.width:
            raise ValueError(f"{kind}.{name}: {value:#x} does not fit {field.width} bits")
        word |= value << _shift(field)
    return word.to_bytes(CM_BYTES, "big")


def parse_cm_message(kind, message):
    """The fields of a CM message of ``kind`` (private data and ARI as bytes)."""
    if len(message) != CM_BYTES:
        raise ValueError(f"A CM message is {CM_BYTES} bytes, not {len(message)}")
    word = int.from_bytes(message, "big")
    values = {}
    for name, field in CM_MESSAGES[kind].items():
        value = (word >> _shift(field)) & ((1 << field.width) - 1)
        if name in BYTES_FIELDS:
            value = value.to_bytes(field.width // 8, "big")
        values[name] = value
    return values


class MadHeader(NamedTuple):
    base_version: int
    mgmt_class: int
    class_version: int
    method: int                 # with the R bit (bit 7)
    status: int
    class_specific: int
    transaction_id: int
    attribute_id: int
    reserved: int
    attribute_modifier: int


def mad(kind, message, *, transaction_id, attribute_modifier=0, base_version=1,
        mgmt_class=0x07, class_version=2, method=0x03, status=0, class_specific=0):
    """A 256-byte CM MAD: the common header, then ``message`` (232 bytes) of ``kind``."""
    if len(message) != CM_BYTES:
        raise ValueError(f"A CM message is {CM_BYTES} bytes, not {len(message)}")
    attribute_id = ATTRIBUTE_IDS[kind] if isinstance(kind, str) else kind
    return MAD_HEADER_FORMAT.pack(base_version, mgmt_class, class_version, method, status,
                                  class_specific, transaction_id, attribute_id, 0,
                                  attribute_modifier) + message


def parse_mad(datagram):
    """``(MadHeader, the 232 bytes after it)`` of a 256-byte MAD."""
    if len(datagram) != MAD_BYTES:
        raise ValueError(f"A MAD is {MAD_BYTES} bytes, not {len(datagram)}")
    return (MadHeader(*MAD_HEADER_FORMAT.unpack_from(datagram)),
            datagram[MAD_HEADER_FORMAT.size:])


def deth(*, qkey=GSI_QKEY, src_qp=1):
    return DETH_FORMAT.pack(qkey, src_qp & 0xFF_FFFF)


def gsi_frame(datagram, *, src_ip, dst_ip, sport=0xC000, src_mac="02:00:00:00:00:01",
              dst_mac="02:00:00:00:00:02", psn=0, pkey=0xFFFF, dest_qp=1, src_qp=1,
              qkey=GSI_QKEY, opcode=UD_SEND_ONLY, version=0, ttl=64, tos=0, ip_id=0):
    """An Ethernet frame (no FCS) carrying ``datagram`` to QP ``dest_qp`` as RoCEv2 UD
    SEND ONLY, with DETH and Scapy's ICRC."""
    return bytes(Ether(src=src_mac, dst=dst_mac)
                 / IP(src=src_ip, dst=dst_ip, ttl=ttl, tos=tos, id=ip_id, flags="DF")
                 / UDP(sport=sport, dport=ROCEV2_PORT, chksum=0)
                 / BTH(opcode=opcode, pkey=pkey, dqpn=dest_qp, psn=psn, version=version)
                 / Raw(deth(qkey=qkey, src_qp=src_qp) + datagram))


@dataclass(frozen=True)
class GsiPacket:
    """What a GSI frame carries: addresses, the BTH and DETH fields, the MAD, and whether
    its ICRC is right."""
    src_ip: str
    dst_ip: str
    sport: int
    dport: int
    opcode: int
    version: int
    pkey: int
    dest_qp: int
    psn: int
    qkey: int
    src_qp: int
    datagram: bytes
    icrc_ok: bool


def parse_gsi_frame(frame):
    """The :class:`GsiPacket` in an Ethernet frame (no FCS) of IPv4/UDP/BTH/DETH/payload."""
    packet = Ether(frame)
    bth = packet[BTH]
    body = bytes(bth.payload)               # Scapy keeps the last 4 bytes as the ICRC
    rebuilt = Ether(frame)
    rebuilt[BTH].icrc = None                # Scapy computes it again
    icrc_ok = bytes(rebuilt)[-4:] == frame[-4:]
    qkey, src_qp = DETH_FORMAT.unpack_from(body)
    return GsiPacket(packet[IP].src, packet[IP].dst, packet[UDP].sport, packet[UDP].dport,
                     bth.opcode, bth.version, bth.pkey, bth.dqpn, bth.psn, qkey,
                     src_qp & 0xFF_FFFF, body[DETH_FORMAT.size:], icrc_ok)


def service_id(port, ps=RDMA_PS_TCP):
    """rdma_cm's service ID of a port in a port space (``rdma_get_service_id``)."""
    return (ps << 16) + port


def cma_header(*, src_ip, dst_ip, port):
    """rdma_cm's 36-byte header of a REQ's private data for IPv4 (annex A11): CMA version
    0, IP version 4 in the high nibble, the active side's port, then the source and
    destination addresses, each in the last 4 of 16 bytes."""
    return struct.pack(">BBH12x4s12x4s", 0x00, 0x40, port,
                       ipaddress.IPv4Address(src_ip).packed, ipaddress.IPv4Address(dst_ip).packed)


#: The endpoint's user part of a REQ's private data, after the cma_hdr (CM_PROTOCOL.md,
#: "Standard RDMA CM"): version, 3 reserved bytes, rkey, base address, length.
CONNECT_PRIVATE_FORMAT = struct.Struct(">B3xIQQ")
#: The endpoint's REP private data: version, 3 reserved bytes, its QPN (u32).
ACCEPT_PRIVATE_FORMAT = struct.Struct(">B3xI")


def connect_private(*, rkey, base, length, version=1):
    """The 24 bytes a host gives ``rdma_connect`` to open a connection to the endpoint."""
    return CONNECT_PRIVATE_FORMAT.pack(version, rkey, base, length)


def parse_accept_private(private):
    """``(version, qpn)`` of the endpoint's REP private data (196 bytes, zero-padded)."""
    return ACCEPT_PRIVATE_FORMAT.unpack_from(private)


def accept_private(qpn, *, version=1):
    """The endpoint's REP private data: its QPN (zero-padded by :func:`cm_message`)."""
    return ACCEPT_PRIVATE_FORMAT.pack(version, qpn)


def ca_guid(mac):
    """The CA GUID derived from a MAC address as an EUI-64: FF FE in the middle, the
    universal/local bit inverted (RFC 4291 appendix A)."""
    octets = bytes.fromhex(mac.replace(":", ""))
    return int.from_bytes(bytes([octets[0] ^ 0x02]) + octets[1:3] + b"\xff\xfe" + octets[3:],
                          "big")


def connect_request(*, comm_id, port, src_ip, dst_ip, qpn, psn, rkey, base, length,
                    source_port=0xD431, path_mtu=3, response_timeout=20, version=1, **fields):
    """The REQ that ``rdma_connect`` sends from ``src_ip`` (QP ``qpn``, Starting PSN
    ``psn``) to an rdma_cm ``port`` at ``dst_ip`` over RoCEv2: RC, P_Key 0xFFFF, the
    path's GIDs the IPv4-mapped addresses, the cma_hdr and :func:`connect_private`
    (``version``) as private data. ``fields`` set or override any other REQ field."""
    mapped = 0xFFFF_0000_0000
    values = dict(
        local_comm_id=comm_id, service_id=service_id(port), local_ca_guid=0x5254_00FF_FE12_3456,
        local_qpn=qpn, starting_psn=psn, remote_cm_response_timeout=response_timeout,
        local_cm_response_timeout=response_timeout, retry_count=7, partition_key=0xFFFF,
        path_mtu=path_mtu, rnr_retry_count=7, max_cm_retries=15, primary_local_lid=0xFFFF,
        primary_remote_lid=0xFFFF,
        primary_local_gid=mapped | int(ipaddress.IPv4Address(src_ip)),
        primary_remote_gid=mapped | int(ipaddress.IPv4Address(dst_ip)),
        primary_hop_limit=64, primary_local_ack_timeout=14,
        private_data=cma_header(src_ip=src_ip, dst_ip=dst_ip, port=source_port)
        + connect_private(rkey=rkey, base=base, length=length, version=version))
    return cm_message("REQ", **{**values, **fields})
