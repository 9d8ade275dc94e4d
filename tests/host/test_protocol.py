"""The CM codec against the byte positions of CM_PROTOCOL.md, packed independently with struct."""

import dataclasses
import ipaddress
import struct

import pytest

from host import protocol
from host.protocol import (
    Ack,
    Datagram,
    ErrorStatus,
    PathMtu,
    ProtocolError,
    QpInfo,
    Request,
    Status,
    TxMeta,
)

U24, U32, U64 = (1 << 24) - 1, (1 << 32) - 1, (1 << 64) - 1


def ip_bytes(ip: str) -> bytes:
    return ipaddress.IPv4Address(ip).packed


def test_datagram_byte_positions():
    datagram = Datagram(
        Request.CLOSE_QP, Ack.NO_QP,
        loc=QpInfo(0x010203, 0x040506, 0x0708090A, 0x0B0C0D0E0F101112, "1.2.3.4"),
        rem=QpInfo(0x212223, 0x242526, 0x2728292A, 0x2B2C2D2E2F303132, "5.6.7.8"),
        reply_port=0x3334, txmeta=TxMeta(valid=True, write=True), length=0x35363738,
        count=0x393A3B3C, divider=0x3D3E3F40)
    raw = datagram.encode()
    assert len(raw) == 64
    assert raw[0] == 1 | 4 << 1 | 1 << 4 | 2 << 5
    assert raw[1:5] == struct.pack(">I", 0x010203)
    assert raw[5:9] == struct.pack(">I", 0x040506)
    assert raw[9:13] == struct.pack(">I", 0x0708090A)
    assert raw[13:21] == struct.pack(">Q", 0x0B0C0D0E0F101112)
    assert raw[21:25] == ip_bytes("1.2.3.4")
    assert raw[25:29] == struct.pack(">I", 0x212223)
    assert raw[29:33] == struct.pack(">I", 0x242526)
    assert raw[33:37] == struct.pack(">I", 0x2728292A)
    assert raw[37:45] == struct.pack(">Q", 0x2B2C2D2E2F303132)
    assert raw[45:49] == ip_bytes("5.6.7.8")
    assert raw[49:51] == struct.pack(">H", 0x3334)
    assert raw[51] == 0b1001
    assert raw[52:56] == struct.pack(">I", 0x35363738)
    assert raw[56:60] == struct.pack(">I", 0x393A3B3C)
    assert raw[60:64] == struct.pack(">I", 0x3D3E3F40)
    assert Datagram.decode(raw) == datagram


@pytest.mark.parametrize("request_code", list(Request))
@pytest.mark.parametrize("ack", [None, *Ack])
def test_flags_round_trip(request_code, ack):
    datagram = Datagram(request_code, ack)
    raw = datagram.encode()
    assert raw[0] & 1 == 1
    assert raw[0] >> 1 & 7 == request_code
    assert bool(raw[0] & 0x10) == (ack is not None)
    assert raw[0] >> 5 == (ack or 0)
    assert Datagram.decode(raw) == datagram


def test_datagram_maximum_values_round_trip():
    side = QpInfo(U32, U32, U32, U64, "255.255.255.255")
    datagram = Datagram(Request.ERROR, Ack.ERROR, loc=side, rem=side, reply_port=0xFFFF,
                        txmeta=TxMeta(True, True, True, True, PathMtu.MTU_4096), length=U32,
                        count=U32, divider=U32)
    raw = datagram.encode()
    assert raw == bytes([0xFF]) + bytes(raw[1:51]) + bytes([0x5F]) + b"\xff" * 12
    assert raw[1:51] == b"\xff" * 50
    assert Datagram.decode(raw) == datagram


def test_info_valid_clear_round_trips():
    datagram = Datagram(Request.STATUS, info_valid=False)
    raw = datagram.encode()
    assert raw[0] & 1 == 0
    assert Datagram.decode(raw) == datagram


@pytest.mark.parametrize("field", ["valid", "start", "immediate", "write"])
def test_txmeta_bits(field):
    bit = {"valid": 0, "start": 1, "immediate": 2, "write": 3}[field]
    meta = TxMeta(**{field: True})
    assert meta.encode() == 1 << bit
    assert TxMeta.decode(1 << bit) == meta


@pytest.mark.parametrize("mtu", list(PathMtu))
def test_txmeta_path_mtu(mtu):
    assert TxMeta(mtu=mtu).encode() == mtu << 4
    assert TxMeta.decode(mtu << 4).mtu is mtu
    assert PathMtu.from_size(256 << (mtu - 1)) is mtu if mtu else mtu.bytes == 0


def test_path_mtu_bytes():
    assert [mtu.bytes for mtu in PathMtu] == [0, 256, 512, 1024, 2048, 4096]
    with pytest.raises(ValueError, match="256, 512"):
        PathMtu.from_size(1500)


def test_qp_info_round_trip():
    for info in (QpInfo(), QpInfo(U24, U24, U32, U64, "10.77.0.1"),
                 QpInfo(256, 0xABCDEF, 0x12345678, 0x7F00_0000_1000, "192.168.1.2")):
        raw = info.encode()
        assert raw == struct.pack(">IIIQ", info.qpn, info.psn, info.rkey,
                                  info.base_addr) + ip_bytes(info.ip)
        assert QpInfo.decode(raw) == info


@pytest.mark.parametrize("length", [0, 63, 65, 72, 128])
def test_bad_lengths_raise(length):
    with pytest.raises(ProtocolError, match=f"not {length}"):
        Datagram.decode(bytes(length))
    with pytest.raises(ProtocolError):
        Status.from_reply(bytes(length))


def test_status_byte_positions():
    status = Status(open=True, running=False, error=True, error_status=ErrorStatus.FLUSHED,
                    outstanding=0x010203, messages=0x04050607, packets=0x08090A0B,
                    bytes=0x0C0D0E0F1011, retransmitted=0x12131415, acks=0x16171819,
                    naks_sequence=0x1A1B1C1D, naks_rnr=0x1E1F2021, rnr_waits=0x22232425,
                    timeouts=0x2627, cnps=0x2829, acks_dropped=0x2A2B2C2D, icrc_errors=0x2E2F3031,
                    naks_invalid=0x3233, naks_access=0x3435, naks_operational=0x3637,
                    runs=0x38393A)
    raw = status.reply(0x123456)
    assert len(raw) == 64
    assert raw[0] == 1 | Request.STATUS << 1 | 1 << 4 | Ack.ACK << 5
    assert raw[1:5] == struct.pack(">I", 0x123456)
    assert raw[5] == 1 | 1 << 2 | 9 << 4
    assert raw[6:9] == bytes([1, 2, 3])
    expected = struct.pack(">II", 0x04050607, 0x08090A0B) + bytes.fromhex("0c0d0e0f1011")
    expected += struct.pack(">5I2H2I", 0x12131415, 0x16171819, 0x1A1B1C1D, 0x1E1F2021,
                            0x22232425, 0x2627, 0x2829, 0x2A2B2C2D, 0x2E2F3031)
    expected += struct.pack(">3H", 0x3233, 0x3435, 0x3637) + bytes([0x38, 0x39, 0x3A])
    assert raw[9:] == expected
    assert Status.from_reply(raw) == status
    assert Datagram.decode(raw).loc.qpn == 0x123456


def test_status_every_field_round_trips_at_maximum():
    widths = {"outstanding": 24, "bytes": 48, "timeouts": 16, "cnps": 16, "naks_invalid": 16,
              "naks_access": 16, "naks_operational": 16, "error_status": 4, "runs": 24}
    fields = {}
    for field in dataclasses.fields(Status):
        if field.type in ("bool", bool):
            fields[field.name] = True
        else:
            fields[field.name] = (1 << widths.get(field.name, 32)) - 1
    status = Status(**fields)
    raw = status.encode()
    assert raw[0] == 0xF7, "flags: open, running, error, bit 3 unused, error_status 7:4"
    assert raw[1:] == b"\xff" * 58
    assert Status.decode(raw) == status
    for name in fields:
        single = Status(**{name: fields[name]})
        assert Status.decode(single.encode()) == single, name


def test_requests_a_host_sends():
    host = QpInfo(17, 0x1234, 0x99, 0x7000, "10.77.0.1")
    opened = protocol.open_qp(host, mtu=PathMtu.MTU_1024)
    assert (opened.request, opened.ack, opened.loc, opened.txmeta.mtu) == (
        Request.OPEN_QP, None, host, PathMtu.MTU_1024)
    closed = protocol.close_qp(257, "10.77.0.1").encode()
    assert closed[0] >> 1 & 7 == Request.CLOSE_QP
    assert closed[21:25] == ip_bytes("10.77.0.1") and closed[25:29] == struct.pack(">I", 257)
    assert protocol.status(258).encode()[25:29] == struct.pack(">I", 258)
    start = protocol.start_run(256, length=4096, count=10, divider=5, write=True,
                               immediate=True, ring=1 << 20).encode()
    assert start[0] == 1
    assert start[25:29] == struct.pack(">I", 256)
    assert start[37:45] == struct.pack(">Q", 1 << 20)
    assert start[51] == 0b1111
    assert start[52:64] == struct.pack(">III", 4096, 10, 5)
    send = protocol.start_run(256, length=1, count=1, write=False)
    assert send.encode()[51] == 0b0011


def test_credited_start_and_credit():
    """A credited start sets txmeta bit 4; CREDIT is request NULL, txmeta exactly 0x11,
    rem_qpn the endpoint QP, count (bytes 56-59) the messages consumed mod 2^32."""
    start = protocol.start_run(300, length=64, count=9, write=True, ring=640, credited=True)
    assert start.encode()[51] == 0b1_1011
    assert Datagram.decode(start.encode()) == start
    raw = protocol.credit(300, (1 << 32) + 7).encode()
    assert raw[0] == 1 and raw[51] == 0x11
    assert raw[25:29] == struct.pack(">I", 300) and raw[56:60] == struct.pack(">I", 7)
    assert raw[1:25] == bytes(24) and raw[29:51] == bytes(22) and raw[60:] == bytes(4)
    assert Datagram.decode(raw) == protocol.credit(300, 7)
    with pytest.raises(protocol.ProtocolError, match="not both"):
        protocol.TxMeta(mtu=PathMtu.MTU_1024, credited=True)
    # an OPEN_QP asking for MTU 256 is not read as credited
    opened = protocol.open_qp(QpInfo(ip="10.77.0.1"), mtu=PathMtu.MTU_256)
    assert Datagram.decode(opened.encode()).txmeta.mtu == PathMtu.MTU_256


def test_reply_echoes_the_request():
    request = protocol.open_qp(QpInfo(17, 5, 6, 7, "10.77.0.1"), mtu=PathMtu.MTU_2048)
    endpoint = QpInfo(256, 0x42, ip="10.77.0.2")
    reply = protocol.reply(request, Ack.ACK, endpoint, mtu=PathMtu.MTU_2048)
    decoded = Datagram.decode(reply.encode())
    assert decoded.rem == request.loc and decoded.loc == endpoint
    assert decoded.ack == Ack.ACK and decoded.txmeta.mtu == PathMtu.MTU_2048


def test_close_all_and_its_count():
    """CLOSE_QP with rem_qpn 0xFFFFFF (extension); the ACK's count at bytes 56-59."""
    request = protocol.close_all("10.77.0.1").encode()
    assert request[0] == 1 | Request.CLOSE_QP << 1
    assert request[21:25] == ip_bytes("10.77.0.1") and request[25:29] == b"\0\xff\xff\xff"
    assert request[29:] == bytes(35)
    reply = protocol.reply(Datagram.decode(request), Ack.ACK, QpInfo(ip="10.77.0.2"), count=3)
    assert reply.encode()[56:60] == struct.pack(">I", 3)


def reference_payload(k: int, length: int) -> bytes:
    out = bytearray()
    j = 0
    while len(out) < length:
        out += (((k & U32) << 32) | j).to_bytes(8, "little")
        j += 1
    return bytes(out[:length])


@pytest.mark.parametrize("length", [0, 1, 7, 8, 9, 63, 64, 65])
@pytest.mark.parametrize("k", [0, 1, 0x1234, U32])
def test_generator_payload_rule(length, k):
    payload = protocol.generator_payload(k, length)
    assert len(payload) == length
    assert payload == reference_payload(k, length)
    if length >= 16:
        assert payload[8:16] == struct.pack("<II", 1, k)


def test_generator_immediate():
    assert protocol.generator_immediate(5) == 5
    assert protocol.generator_immediate(U32 + 3) == 2


def test_connect_request_byte_positions():
    """CONNECT (request 6, extension): loc_ip the host, length (bytes 52-55) the
    rdma_cm port it listens on, txmeta bits 7:4 the path MTU; nothing else set."""
    raw = protocol.connect("10.77.0.1", 18515, PathMtu.MTU_1024, reply_port=4000).encode()
    expected = (struct.pack(">B", 1 | 6 << 1) + bytes(20) + ip_bytes("10.77.0.1") + bytes(24)
                + struct.pack(">HBIII", 4000, 3 << 4, 18515, 0, 0))
    assert raw == expected
    assert Datagram.decode(raw).request == Request.CONNECT
    for port in (0, 1 << 16):
        with pytest.raises(ValueError, match="1..65535"):
            protocol.connect("10.77.0.1", port, PathMtu.MTU_1024)


def connect_reply(ack: int, *, qpn: int = 0, psn: int = 0, mtu: int = 0, count: int = 0) -> bytes:
    """A CONNECT reply as the endpoint sends it, packed with struct alone."""
    endpoint = struct.pack(">IIIQ", qpn, psn, 0, 0) + ip_bytes("10.77.0.2")
    host = bytes(20) + ip_bytes("10.77.0.1")
    return (struct.pack(">B", 1 | 6 << 1 | 1 << 4 | ack << 5) + endpoint + host
            + struct.pack(">HBIII", 0, mtu << 4, 0, count, 0))


def test_connect_ack_decodes():
    reply = Datagram.decode(connect_reply(1, qpn=0x101, psn=0xABCDEF, mtu=3))
    assert (reply.request, reply.ack) == (Request.CONNECT, Ack.ACK)
    assert reply.loc == QpInfo(qpn=0x101, psn=0xABCDEF, ip="10.77.0.2")
    assert reply.rem == QpInfo(ip="10.77.0.1")
    assert reply.txmeta.mtu == PathMtu.MTU_1024


@pytest.mark.parametrize("reason", [3, 4, 8, 26, 28])
def test_connect_nak_carries_the_rej_reason_in_count(reason):
    reply = Datagram.decode(connect_reply(3, count=reason))
    assert (reply.request, reply.ack, reply.count) == (Request.CONNECT, Ack.NAK, reason)
    request = protocol.connect("10.77.0.1", 18515, PathMtu.MTU_1024)
    assert protocol.reply(request, Ack.NAK, QpInfo(ip="10.77.0.2"), count=reason) == reply
