"""Wire headers, each described once, in the order of its specification.

A :class:`NetworkLayout` lists its fields as the standard draws them, first
field first on the wire, each field big-endian (network order). Internally
the header is the big-endian integer of its wire bytes: the first field sits
at the most significant end, so sub-byte fields (IPv4 version and IHL, the
BTH flag bits) land where the standard puts them. :meth:`NetworkLayout.to_wire`
and :meth:`NetworkLayout.from_wire` map between that integer and byte lanes
(lane 0 = first byte on the wire), the order of the packet streams.
"""

import enum

from amaranth import *
from amaranth.lib import data

__all__ = [
    "NetworkLayout", "byte_swap",
    "ETHERNET", "ARP", "IPV4", "UDP", "ICMP_ECHO", "BTH", "RETH", "IMMDT", "AETH", "DETH",
    "MAD_HEADER", "MAD", "CM_REQ", "CM_MRA", "CM_REJ", "CM_REP", "CM_RTU", "CM_DREQ", "CM_DREP",
    "CMA_HEADER", "CmAttribute", "MAC_CONTROL",
    "MAD_BYTES", "GSI_QPN", "GSI_QKEY", "OPCODE_UD_SEND_ONLY", "MAD_BASE_VERSION",
    "MGMT_CLASS_CM", "CM_CLASS_VERSION", "METHOD_SEND",
    "ETHERTYPE_IPV4", "ETHERTYPE_ARP", "IP_PROTO_ICMP", "IP_PROTO_UDP", "UDP_PORT_ROCEV2",
    "ETHERTYPE_MAC_CONTROL", "MAC_CONTROL_ADDRESS", "OPCODE_PAUSE", "OPCODE_PFC",
]


def byte_swap(value):
    """``value`` (a whole number of bytes) with its byte order reversed."""
    value = Value.cast(value)
    if len(value) % 8:
        raise ValueError(f"Cannot byte-swap a value of {len(value)} bits")
    return Cat(value.word_select(index, 8) for index in reversed(range(len(value) // 8)))


class NetworkLayout(data.FlexibleLayout):
    """A header layout built from ``{name: shape}`` in wire order.

    Parameters
    ----------
    fields : dict of str to shape-castable
        Fields in the order they cross the wire; their widths must add up to
        whole bytes.
    """

    def __init__(self, fields):
        fields = dict(fields)
        widths = {name: Shape.cast(shape).width for name, shape in fields.items()}
        size = sum(widths.values())
        if size == 0 or size % 8:
            raise ValueError(f"A header must be a whole number of bytes, not {size} bits")
        placed, start = {}, 0
        for name, shape in fields.items():
            start += widths[name]
            placed[name] = data.Field(shape, size - start)
        super().__init__(size, placed)

    @property
    def length(self):
        """Length of the header in bytes."""
        return self.size // 8

    def bit_span(self, name):
        """``(first, end)`` bit positions of a field counted from the first wire bit."""
        field = self[name]
        first = self.size - field.offset - field.width
        return first, first + field.width

    def byte_span(self, name):
        """``(first, end)`` byte offsets on the wire of the bytes a field touches."""
        first, end = self.bit_span(name)
        return first // 8, -(-end // 8)

    def to_wire(self, header):
        """Byte lanes (lane 0 first on the wire) of a header value of this layout."""
        return byte_swap(Value.cast(header))

    def from_wire(self, lanes):
        """A view of this layout over byte lanes taken from the wire."""
        return data.View(self, byte_swap(lanes))


ETHERNET = NetworkLayout({
    "dst": 48,
    "src": 48,
    "ethertype": 16,
})

ARP = NetworkLayout({          # RFC 826, Ethernet hardware and IPv4 protocol addresses
    "htype": 16,
    "ptype": 16,
    "hlen": 8,
    "plen": 8,
    "oper": 16,
    "sha": 48,
    "spa": 32,
    "tha": 48,
    "tpa": 32,
})

IPV4 = NetworkLayout({         # RFC 791, without options
    "version": 4,
    "ihl": 4,
    "dscp": 6,
    "ecn": 2,
    "total_length": 16,
    "identification": 16,
    "reserved": 1,
    "df": 1,
    "mf": 1,
    "fragment_offset": 13,
    "ttl": 8,
    "protocol": 8,
    "checksum": 16,
    "src": 32,
    "dst": 32,
})

UDP = NetworkLayout({          # RFC 768
    "src_port": 16,
    "dst_port": 16,
    "length": 16,
    "checksum": 16,
})

ICMP_ECHO = NetworkLayout({    # RFC 792, echo request and echo reply
    "type": 8,
    "code": 8,
    "checksum": 16,
    "identifier": 16,
    "sequence": 16,
})

BTH = NetworkLayout({          # InfiniBand Base Transport Header (IBTA vol. 1, 9.2)
    "opcode": 8,
    "solicited": 1,
    "migration": 1,
    "pad_count": 2,
    "version": 4,
    "pkey": 16,
    "resv8a": 8,               # RoCEv2 carries FECN and BECN in its top two bits
    "dest_qp": 24,
    "ack_request": 1,
    "resv7": 7,
    "psn": 24,
})

RETH = NetworkLayout({         # RDMA Extended Transport Header (9.3.3)
    "virtual_address": 64,
    "rkey": 32,
    "dma_length": 32,
})

IMMDT = NetworkLayout({        # Immediate Data Extended Transport Header (9.3.5)
    "immediate": 32,
})

AETH = NetworkLayout({         # ACK Extended Transport Header (9.3.7)
    "syndrome": 8,
    "msn": 24,
})

DETH = NetworkLayout({         # Datagram Extended Transport Header (9.3.2)
    "qkey": 32,
    "reserved": 8,
    "src_qp": 24,
})

MAD_HEADER = NetworkLayout({   # MAD common header (IBTA vol. 1, 13.4)
    "base_version": 8,
    "mgmt_class": 8,
    "class_version": 8,
    "response": 1,             # the R bit
    "method": 7,
    "status": 16,
    "class_specific": 16,
    "transaction_id": 64,
    "attribute_id": 16,
    "reserved": 16,
    "attribute_modifier": 32,
})

MAD = NetworkLayout({          # a whole MAD: the common header and the class's data
    "header": MAD_HEADER,
    "data": 8 * 232,           # a CM message: view it as CM_REQ, CM_REP, ...
})


def _cm_path(prefix):
    """A REQ's path fields (table 106: 44 bytes), their names under ``prefix``."""
    return {
        f"{prefix}_local_lid": 16,
        f"{prefix}_remote_lid": 16,
        f"{prefix}_local_gid": 128,
        f"{prefix}_remote_gid": 128,
        f"{prefix}_flow_label": 20,
        f"{prefix}_reserved_a": 6,
        f"{prefix}_packet_rate": 6,
        f"{prefix}_traffic_class": 8,
        f"{prefix}_hop_limit": 8,
        f"{prefix}_sl": 4,
        f"{prefix}_subnet_local": 1,
        f"{prefix}_reserved_b": 3,
        f"{prefix}_local_ack_timeout": 5,
    }


# The CM messages (IBTA vol. 1, 12.6, tables 106 to 113): the 232 bytes of a CM MAD after
# MAD_HEADER. Reserved fields are named by the byte offset in the message where they start.

CM_REQ = NetworkLayout({       # table 106
    "local_comm_id": 32,
    "reserved_4": 8,
    "vendor_id": 24,
    "service_id": 64,
    "local_ca_guid": 64,
    "reserved_24": 32,
    "local_qkey": 32,
    "local_qpn": 24,
    "responder_resources": 8,
    "local_eecn": 24,
    "initiator_depth": 8,
    "remote_eecn": 24,
    "remote_cm_response_timeout": 5,
    "transport_service_type": 2,
    "end_to_end_flow_control": 1,
    "starting_psn": 24,
    "local_cm_response_timeout": 5,
    "retry_count": 3,
    "partition_key": 16,
    "path_mtu": 4,
    "rdc_exists": 1,
    "rnr_retry_count": 3,
    "max_cm_retries": 4,
    "srq": 1,
    "extended_transport_type": 3,
    **_cm_path("primary"),
    "reserved_95": 3,
    **_cm_path("alternate"),
    "sap_supported": 1,
    "reserved_139": 2,
    "private_data": 8 * 92,
})

CM_MRA = NetworkLayout({       # table 107
    "local_comm_id": 32,
    "remote_comm_id": 32,
    "message_mraed": 2,
    "reserved_8": 6,
    "service_timeout": 5,
    "reserved_9": 3,
    "private_data": 8 * 222,
})

CM_REJ = NetworkLayout({       # table 108
    "local_comm_id": 32,
    "remote_comm_id": 32,
    "message_rejected": 2,
    "reserved_8": 6,
    "reject_info_length": 7,
    "reserved_9": 1,
    "reason": 16,
    "additional_reject_info": 8 * 72,
    "private_data": 8 * 148,
})

CM_REP = NetworkLayout({       # table 110
    "local_comm_id": 32,
    "remote_comm_id": 32,
    "local_qkey": 32,
    "local_qpn": 24,
    "vendor_id_high": 8,
    "local_eecn": 24,
    "vendor_id_mid": 8,
    "starting_psn": 24,
    "vendor_id_low": 8,
    "responder_resources": 8,
    "initiator_depth": 8,
    "target_ack_delay": 5,
    "failover_accepted": 2,
    "end_to_end_flow_control": 1,
    "rnr_retry_count": 3,
    "srq": 1,
    "reserved_27": 4,
    "local_ca_guid": 64,
    "private_data": 8 * 196,
})

CM_RTU = NetworkLayout({       # table 111
    "local_comm_id": 32,
    "remote_comm_id": 32,
    "private_data": 8 * 224,
})

CM_DREQ = NetworkLayout({      # table 112
    "local_comm_id": 32,
    "remote_comm_id": 32,
    "remote_qpn": 24,          # remote QPN/EECN
    "reserved_11": 8,
    "private_data": 8 * 220,
})

CM_DREP = NetworkLayout({      # table 113
    "local_comm_id": 32,
    "remote_comm_id": 32,
    "private_data": 8 * 224,
})

CMA_HEADER = NetworkLayout({   # rdma_cm's IP addressing of a REQ's private data (annex A11)
    "cma_version": 8,
    "ip_version": 4,
    "reserved_1": 4,
    "port": 16,                # the active side's source port
    "src_addr": 128,           # IPv4: in the last 4 bytes
    "dst_addr": 128,
})

MAC_CONTROL = NetworkLayout({  # IEEE 802.3 clause 31 MAC control, after the Ethernet header
    "opcode": 16,
    "parameter": 16,           # PAUSE (31B): pause_time; PFC (802.1Qbb 36.1.3): class-enable vector
    **{f"time{priority}": 16 for priority in range(8)},     # PFC: time of each priority
})

ETHERTYPE_IPV4 = 0x0800
ETHERTYPE_ARP = 0x0806
ETHERTYPE_MAC_CONTROL = 0x8808
MAC_CONTROL_ADDRESS = 0x0180C2000001    # 802.3 annex 31B: the PAUSE multicast address
OPCODE_PAUSE = 0x0001
OPCODE_PFC = 0x0101
IP_PROTO_ICMP = 1
IP_PROTO_UDP = 17
UDP_PORT_ROCEV2 = 4791

#: Management datagrams: 256 bytes, the common header then the class's data (IBTA 13.4).
MAD_BYTES = 256
#: The General Service Interface: QP1, its Q_Key, and the BTH opcode of its packets
#: (Unreliable Datagram SEND only).
GSI_QPN = 1
GSI_QKEY = 0x8001_0000
OPCODE_UD_SEND_ONLY = 0x64
#: The CM's MADs (12.6): base version, class, class version, method Send.
MAD_BASE_VERSION = 1
MGMT_CLASS_CM = 0x07
CM_CLASS_VERSION = 2
METHOD_SEND = 0x03



class CmAttribute(enum.IntEnum):
    """The attribute ID of each CM message (IBTA vol. 1, 12.6)."""
    REQ = 0x0010
    MRA = 0x0011
    REJ = 0x0012
    REP = 0x0013
    RTU = 0x0014
    DREQ = 0x0015
    DREP = 0x0016
    SIDR_REQ = 0x0017
    SIDR_REP = 0x0018
    LAP = 0x0019
    APR = 0x001A
