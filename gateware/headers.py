"""Wire headers, each described once, in the order of its specification.

A :class:`NetworkLayout` lists its fields as the standard draws them, first
field first on the wire, each field big-endian (network order). Internally
the header is the big-endian integer of its wire bytes: the first field sits
at the most significant end, so sub-byte fields (IPv4 version and IHL, the
BTH flag bits) land where the standard puts them. :meth:`NetworkLayout.to_wire`
and :meth:`NetworkLayout.from_wire` map between that integer and byte lanes
(lane 0 = first byte on the wire), the order of the packet streams.
"""

from amaranth import *
from amaranth.lib import data

__all__ = [
    "NetworkLayout", "byte_swap",
    "ETHERNET", "ARP", "IPV4", "UDP", "ICMP_ECHO", "BTH", "RETH", "IMMDT", "AETH",
    "MAC_CONTROL",
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
