"""The IB CM model (sim.models.ib_cm) against bytes checked by hand from the IBTA tables
(as IB_CM.md lists them, by MAD offset), an ICRC computed here from its definition, and
Wireshark's dissectors."""

import random
import zlib

import pytest

from sim import tshark
from sim.models.ib_cm import (
    BYTES_FIELDS,
    CM_BYTES,
    CM_MESSAGES,
    MAD_BYTES,
    cm_message,
    cma_header,
    gsi_frame,
    mad,
    parse_cm_message,
    parse_gsi_frame,
    parse_mad,
    service_id,
)

HOST, ENDPOINT = "10.77.0.1", "10.77.0.2"


def mad_bytes(kind, **fields):
    return mad(kind, cm_message(kind, **fields), transaction_id=0x0102030405060708)


def test_req_bytes_by_mad_offset():
    private = cma_header(src_ip=HOST, dst_ip=ENDPOINT, port=0xBEEF) + b"\x01" + bytes(3)
    datagram = mad_bytes(
        "REQ", local_comm_id=0xA1B2C3D4, vendor_id=0x123456, service_id=service_id(17185),
        local_ca_guid=0x1122334455667788, local_qpn=0x000111, responder_resources=4,
        initiator_depth=5, remote_cm_response_timeout=20, transport_service_type=0,
        end_to_end_flow_control=1, starting_psn=0xABCDEF, local_cm_response_timeout=20,
        retry_count=7, partition_key=0xFFFF, path_mtu=3, rnr_retry_count=7, max_cm_retries=15,
        primary_local_lid=0xFFFF, primary_remote_lid=0xFFFF,
        primary_local_gid=0xFFFF_0A4D0001, primary_remote_gid=0xFFFF_0A4D0002,
        primary_flow_label=0xABCDE, primary_packet_rate=0x2A, primary_traffic_class=0x68,
        primary_hop_limit=64, primary_sl=3, primary_subnet_local=1,
        primary_local_ack_timeout=17, private_data=private)
    assert len(datagram) == MAD_BYTES
    assert datagram[:4] == bytes([1, 0x07, 2, 0x03])            # base, class, version, Send
    assert datagram[4:8] == bytes(4)                             # status, class specific
    assert datagram[8:16] == bytes.fromhex("0102030405060708")   # TID
    assert datagram[16:18] == b"\x00\x10"                        # REQ
    assert datagram[18:24] == bytes(6)
    assert datagram[24:28] == bytes.fromhex("a1b2c3d4")
    assert datagram[28:32] == bytes.fromhex("00123456")          # reserved, VendorID
    assert datagram[32:40] == bytes.fromhex("0000000001064321")  # RDMA_PS_TCP, port 17185
    assert datagram[40:48] == bytes.fromhex("1122334455667788")
    assert datagram[48:56] == bytes(8)                           # reserved, local Q_Key
    assert datagram[56:60] == bytes.fromhex("00011104")          # QPN, responder resources
    assert datagram[60:64] == bytes.fromhex("00000005")          # EECN, initiator depth
    assert datagram[67] == 20 << 3 | 0 << 1 | 1
    assert datagram[68:71] == bytes.fromhex("abcdef")
    assert datagram[71] == 20 << 3 | 7
    assert datagram[72:74] == b"\xff\xff"
    assert datagram[74] == 3 << 4 | 7                            # MTU 1024, RNR retry 7
    assert datagram[75] == 15 << 4
    assert datagram[76:80] == b"\xff" * 4
    assert datagram[80:96] == bytes(10) + bytes.fromhex("ffff0a4d0001")
    assert datagram[96:112] == bytes(10) + bytes.fromhex("ffff0a4d0002")
    assert datagram[112:116] == bytes.fromhex("abcde02a")        # flow label, rate
    assert datagram[116:120] == bytes([0x68, 64, 3 << 4 | 1 << 3, 17 << 3])
    assert datagram[120:164] == bytes(44)                        # no alternate path
    assert datagram[164:168] == bytes.fromhex("0040beef")
    assert datagram[168:184] == bytes(12) + bytes.fromhex("0a4d0001")
    assert datagram[184:200] == bytes(12) + bytes.fromhex("0a4d0002")
    assert datagram[200:204] == bytes.fromhex("01000000")
    assert datagram[204:] == bytes(52)


def test_rep_bytes_by_mad_offset():
    datagram = mad_bytes(
        "REP", local_comm_id=0x11111111, remote_comm_id=0xA1B2C3D4, local_qpn=0x000101,
        vendor_id_high=0xAA, vendor_id_mid=0xBB, vendor_id_low=0xCC, starting_psn=0x123456,
        responder_resources=1, initiator_depth=2, target_ack_delay=15, failover_accepted=3,
        end_to_end_flow_control=1, rnr_retry_count=7, srq=1, local_ca_guid=0x0200000000000002,
        private_data=b"\x01\x00\x00\x00\x00\x00\x01\x01")
    assert datagram[16:18] == b"\x00\x13"
    assert datagram[24:32] == bytes.fromhex("11111111a1b2c3d4")
    assert datagram[32:36] == bytes(4)                           # local Q_Key
    assert datagram[36:40] == bytes.fromhex("000101aa")
    assert datagram[40:44] == bytes.fromhex("000000bb")
    assert datagram[44:48] == bytes.fromhex("123456cc")
    assert datagram[48:52] == bytes([1, 2, 15 << 3 | 3 << 1 | 1, 7 << 5 | 1 << 4])
    assert datagram[52:60] == bytes.fromhex("0200000000000002")
    assert datagram[60:68] == bytes.fromhex("0100000000000101")
    assert datagram[68:] == bytes(188)


@pytest.mark.parametrize("kind, fields, expected", [
    ("RTU", {"local_comm_id": 0x01020304, "remote_comm_id": 0x05060708},
     {16: "0014", 24: "0102030405060708"}),
    ("REJ", {"local_comm_id": 0, "remote_comm_id": 0xA1B2C3D4, "message_rejected": 0,
             "reject_info_length": 8, "reason": 28, "additional_reject_info": b"\xee" * 8},
     {16: "0012", 24: "00000000a1b2c3d4", 32: "00" "10" "001c", 36: "ee" * 8 + "00"}),
    ("REJ", {"message_rejected": 2, "reason": 8}, {32: "8000" "0008"}),
    ("MRA", {"local_comm_id": 9, "remote_comm_id": 10, "message_mraed": 1,
             "service_timeout": 24},
     {16: "0011", 24: "000000090000000a", 32: "40" "c0" "00"}),
    ("DREQ", {"local_comm_id": 3, "remote_comm_id": 4, "remote_qpn": 0x000123,
              "private_data": b"\x77"},
     {16: "0015", 24: "0000000300000004", 32: "00012300" "77" "00"}),
    ("DREP", {"local_comm_id": 4, "remote_comm_id": 3, "private_data": b"\x55"},
     {16: "0016", 24: "0000000400000003" "55" "00"}),
])
def test_messages_by_mad_offset(kind, fields, expected):
    datagram = mad_bytes(kind, **fields)
    for offset, text in expected.items():
        wanted = bytes.fromhex(text)
        assert datagram[offset:offset + len(wanted)] == wanted, (kind, offset)


def masked_icrc(ip_packet):
    """The ICRC as IB_CM.md §1 defines it: CRC-32 over 8 bytes of ones (the LRH), the IPv4
    header with TOS, TTL and checksum as ones, the UDP header with its checksum as ones,
    the BTH with its byte 4 as ones, and the rest; least significant byte first."""
    covered = bytearray(ip_packet[:-4])
    covered[1] = 0xFF                                           # TOS
    covered[8] = 0xFF                                           # TTL
    covered[10:12] = b"\xff\xff"                                # header checksum
    covered[26:28] = b"\xff\xff"                                # UDP checksum
    covered[32] = 0xFF                                          # BTH FECN, BECN, reserved
    return zlib.crc32(b"\xff" * 8 + bytes(covered)).to_bytes(4, "little")


def test_gsi_frame_bytes_and_icrc():
    datagram = mad_bytes("RTU", local_comm_id=1, remote_comm_id=2)
    frame = gsi_frame(datagram, src_ip=HOST, dst_ip=ENDPOINT, sport=0xC123, psn=0x345678,
                      tos=0x68, ttl=17)
    assert len(frame) == 14 + 20 + 8 + 12 + 8 + 256 + 4 == 322
    ip = frame[14:]
    assert frame[12:14] == b"\x08\x00"
    assert ip[0] == 0x45 and ip[2:4] == (308).to_bytes(2, "big") and ip[9] == 17
    assert ip[20:28] == bytes.fromhex("c12312b7" "0120" "0000")  # ports, length 288, csum 0
    assert ip[28:40] == bytes.fromhex("64" "00" "ffff" "00" "000001" "00" "345678")
    assert ip[40:48] == bytes.fromhex("80010000" "00000001")    # DETH: GSI Q_Key, QP1
    assert ip[48:-4] == datagram
    assert ip[-4:] == masked_icrc(ip)
    packet = parse_gsi_frame(frame)
    assert packet.icrc_ok and packet.datagram == datagram
    assert (packet.src_ip, packet.sport, packet.dest_qp, packet.src_qp, packet.qkey,
            packet.psn) == (HOST, 0xC123, 1, 1, 0x8001_0000, 0x345678)
    damaged = frame[:100] + bytes([frame[100] ^ 0x10]) + frame[101:]
    assert not parse_gsi_frame(damaged).icrc_ok


@pytest.mark.parametrize("kind", list(CM_MESSAGES))
def test_round_trip(kind):
    rng = random.Random(kind)
    fields = {name: (rng.randbytes(field.width // 8) if name in BYTES_FIELDS
                     else rng.getrandbits(field.width))
              for name, field in CM_MESSAGES[kind].items()}
    message = cm_message(kind, **fields)
    assert len(message) == CM_BYTES
    assert parse_cm_message(kind, message) == fields
    header, body = parse_mad(mad(kind, message, transaction_id=5))
    assert body == message and header.transaction_id == 5
    # Reserved bits stay zero: the fields account for every bit that is set.
    assert sum(field.width for field in CM_MESSAGES[kind].values()) <= 8 * CM_BYTES
    ones = cm_message(kind, **{name: (b"\xff" * (field.width // 8) if name in BYTES_FIELDS
                                      else (1 << field.width) - 1)
                               for name, field in CM_MESSAGES[kind].items()})
    assert bin(int.from_bytes(ones, "big")).count("1") == sum(
        field.width for field in CM_MESSAGES[kind].values())


def test_fields_must_fit():
    with pytest.raises(ValueError):
        cm_message("REQ", local_qpn=1 << 24)
    with pytest.raises(ValueError):
        cm_message("RTU", private_data=bytes(225))


#: Each message Wireshark must dissect, with fields it shows (pdml name → ``show``).
DISSECTED = {
    "REQ": ("CM ConnectRequest",
            {"local_comm_id": 0xA1B2C3D4, "service_id": service_id(17185), "local_qpn": 0x111,
             "starting_psn": 0xABCDEF, "partition_key": 0xFFFF, "path_mtu": 3,
             "private_data": cma_header(src_ip=HOST, dst_ip=ENDPOINT, port=0xBEEF)},
            {"infiniband.cm.req.localqpn": "0x000111", "infiniband.cm.req.startpsn": "0xabcdef",
             "infiniband.cm.req.ip_cm.sip4": HOST, "infiniband.cm.req.ip_cm.dip4": ENDPOINT,
             "infiniband.cm.req.ip_cm.sport": "0xbeef"}),
    "REP": ("CM ConnectReply",
            {"local_comm_id": 1, "remote_comm_id": 2, "local_qpn": 0x101,
             "starting_psn": 0x55, "target_ack_delay": 15, "rnr_retry_count": 7},
            {"infiniband.cm.rep.localqpn": "0x000101", "infiniband.cm.rep.startpsn": "0x000055",
             "infiniband.cm.rep.remotecommid": "0x00000002",
             "infiniband.cm.rep.tgtackdelay": "0x0f", "infiniband.cm.rep.rnrretrcount": "0x07"}),
    "RTU": ("CM ReadyToUse", {"local_comm_id": 3, "remote_comm_id": 4},
            {"infiniband.cm.rtu.localcommid": "0x00000003",
             "infiniband.cm.rtu.remotecommid": "0x00000004"}),
    "REJ": ("CM ConnectReject", {"remote_comm_id": 5, "message_rejected": 1, "reason": 28},
            {"infiniband.cm.rej.remotecommid": "0x00000005", "infiniband.cm.rej.msgrej": "0x01",
             "infiniband.cm.rej.reason": "0x001c"}),
    "DREQ": ("CM DisconnectRequest", {"local_comm_id": 6, "remote_comm_id": 7,
                                      "remote_qpn": 0x123},
             {"infiniband.cm.dreq.remotecommid": "0x00000007",
              "infiniband.cm.req.remoteqpneecn": "0x000123"}),
    "DREP": ("CM DisconnectReply", {"local_comm_id": 8, "remote_comm_id": 9},
             {"infiniband.cm.drsp.localcommid": "0x00000008",
              "infiniband.cm.drsp.remotecommid": "0x00000009"}),
}


@pytest.mark.skipif(not tshark.available(),
                    reason="tshark is not installed (apt-get install tshark)")
def test_wireshark_dissects_the_messages(tmp_path):
    kinds = list(DISSECTED)
    frames = [gsi_frame(mad_bytes(kind, **DISSECTED[kind][1]), src_ip=HOST, dst_ip=ENDPOINT)
              for kind in kinds]
    packets = tshark.dissect(frames, tmp_path / "cm.pcap")
    assert len(packets) == len(kinds)
    for kind, packet in zip(kinds, packets, strict=True):
        assert not packet.errors, (kind, packet.errors)
        message, _, wanted = DISSECTED[kind]
        assert message in packet.shownames, kind
        for name, value in wanted.items():
            assert packet.shown.get(name) == value, (kind, name, packet.shown.get(name))
        assert packet.shown.get("infiniband.bth.opcode") == "100", kind
        assert packet.shown.get("infiniband.deth.q_key") == "0x0000000080010000", kind
