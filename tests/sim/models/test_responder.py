"""The RoCEv2 responder model (sim/models/responder.py), driven by frames from
sim/models/rocev2.py."""

import dataclasses
import struct

import pytest
from scapy.contrib.roce import AETH, BTH
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from sim.models.responder import (
    ACK_UNLIMITED,
    CLOCK_HZ,
    CNP_DSCP,
    COUNTERS,
    NAK_INVALID_REQUEST,
    NAK_REMOTE_ACCESS,
    NAK_SEQUENCE,
    OP_ACKNOWLEDGE,
    OP_CNP,
    RNR_NAK,
    Completion,
    ConnectX,
    Faults,
    Responder,
    round_trip_cycles,
    rxe_udp_source_port,
    spread_losses,
)
from sim.models.rocev2 import Message, PacketFields, generator_payload, message_packets, roce_frame
from tests.rxe_vectors import RXE_ACKNOWLEDGE, RXE_WRITE_ONLY

OUR_MAC, OUR_IP = "02:00:00:00:00:02", "10.77.0.2"          # the endpoint: the requester
PEER_MAC, PEER_IP = "52:54:00:12:34:56", "10.77.0.1"        # the responder
QPN, PEER_QPN = 0x17, 0x123
BASE, SIZE, RKEY = 0x377BC000, 1 << 14, 0xD3D
PSN = 0x1000
MTU = 256


def make_responder(**kwargs) -> Responder:
    params = dict(mac=PEER_MAC, ip=PEER_IP, peer_mac=OUR_MAC, peer_ip=OUR_IP, qpn=QPN,
                  peer_qpn=PEER_QPN, expected_psn=PSN, rkey=RKEY, memory_base=BASE,
                  memory_size=SIZE, path_mtu=MTU)
    params.update(kwargs)
    return Responder(**params)


def frame_of(fields: PacketFields, **kwargs) -> bytes:
    params = dict(src_mac=OUR_MAC, dst_mac=PEER_MAC, src_ip=OUR_IP, dst_ip=PEER_IP,
                  dest_qp=QPN, src_port=0xC0DE, tos=0x02, ip_id=0)
    params.update(kwargs)
    return roce_frame(fields, **params)


def packets(verb: str, payload: bytes, *, psn: int = PSN, offset: int = 0, immediate: int = 0,
            ack_interval: int = 0, rkey: int = RKEY) -> list[PacketFields]:
    message = Message(verb, payload, remote_address=BASE + offset, immediate=immediate)
    return message_packets(message, psn=psn, path_mtu=MTU, rkey=rkey, ack_interval=ack_interval)


def frames(verb: str, payload: bytes, **kwargs) -> list[bytes]:
    return [frame_of(fields) for fields in packets(verb, payload, **kwargs)]


def icrc_ok(frame: bytes) -> bool:
    return Ether(frame)[BTH].compute_icrc(b"") == frame[-4:]


def answer(frame: bytes) -> tuple[int, int, int]:
    """(AETH syndrome, PSN, MSN) of an ACKNOWLEDGE frame, checked to be well formed."""
    packet = Ether(frame)
    assert icrc_ok(frame)
    assert (packet.dst, packet.src) == (OUR_MAC, PEER_MAC)
    assert (packet[IP].src, packet[IP].dst, packet[IP].ttl, packet[IP].tos) == \
        (PEER_IP, OUR_IP, 64, 0)
    assert packet[UDP].chksum == 0 and packet[UDP].dport == 4791
    assert packet[BTH].opcode == OP_ACKNOWLEDGE and packet[BTH].dqpn == PEER_QPN
    return packet[AETH].syndrome, packet[BTH].psn, packet[AETH].msn


def exchange(responder: Responder, sent: list[bytes], now: int = 0) -> list[tuple[int, int, int]]:
    for frame in sent:
        responder.receive(frame, now)
    return [answer(frame) for frame in responder.poll(now)]


def payload(length: int, k: int = 1) -> bytes:
    return generator_payload(k, length)


# The rxe vector.

def test_rxe_write_only_gets_the_ack_rxe_sent():
    responder = make_responder(ip_id_start=0xAC89, path_mtu=1024)
    responder.receive(RXE_WRITE_ONLY, 0)
    assert responder.poll(0) == [RXE_ACKNOWLEDGE]
    assert responder.memory[:64] == b"HELLO-ROCE-FROM-HOST-" + bytes(range(43))
    assert (responder.expected_psn, responder.msn) == (PSN + 1, 1)
    assert responder.src_port == rxe_udp_source_port(QPN, PEER_QPN) == 0xDA25


def test_ip_id_counts_and_frames_are_rxe_shaped():
    responder = make_responder(ip_id_start=0xFFFF)
    sent = []
    for k in range(3):
        sent += frames("RDMA_WRITE", payload(8, k), psn=PSN + k, offset=8 * k)
    for frame in sent:
        responder.receive(frame, 0)
    out = responder.poll(0)
    assert [Ether(frame)[IP].id for frame in out] == [0xFFFF, 0, 1]
    assert all(Ether(frame)[IP].flags == "DF" and Ether(frame)[UDP].sport == 0xDA25
               for frame in out)
    assert [answer(frame) for frame in out] == [(ACK_UNLIMITED, PSN + k, k + 1) for k in range(3)]


# Execution.

@pytest.mark.parametrize("length", [0, 1, 3, MTU - 1, MTU])
def test_write_only_lands_byte_exact(length):
    responder = make_responder()
    data = payload(length)
    assert exchange(responder, frames("RDMA_WRITE", data, offset=100)) == \
        [(ACK_UNLIMITED, PSN, 1)]
    assert responder.memory[100:100 + length] == data
    assert not any(responder.memory[:100]) and not any(responder.memory[100 + length:])
    assert responder.stats["bytes_written"] == length
    assert responder.receive_queue == []


@pytest.mark.parametrize("length", [MTU + 1, 2 * MTU, 3 * MTU + 5])
def test_write_first_middle_last_lands_byte_exact(length):
    responder = make_responder()
    data = payload(length, k=7)
    sent = frames("RDMA_WRITE", data, offset=MTU + 8)
    assert [Ether(frame)[BTH].opcode for frame in sent] == \
        [0x06] + [0x07] * (len(sent) - 2) + [0x08]
    assert exchange(responder, sent) == [(ACK_UNLIMITED, PSN + len(sent) - 1, 1)]
    assert responder.memory[MTU + 8:MTU + 8 + length] == data
    assert responder.stats["executed"] == len(sent)
    assert responder.stats["messages"] == 1


def test_send_and_immediate_verbs_land_in_the_receive_queue():
    responder = make_responder()
    responder.post_receive(4)
    messages = [("SEND", payload(2 * MTU + 9, 1), 0),
                ("SEND_WITH_IMMEDIATE", payload(MTU + 5, 2), 0x11223344),
                ("RDMA_WRITE_WITH_IMMEDIATE", payload(MTU + 1, 3), 0xCAFEF00D),
                ("RDMA_WRITE_WITH_IMMEDIATE", b"", 0x55)]
    psn, sent = PSN, []
    for verb, data, immediate in messages:
        sent += frames(verb, data, psn=psn, immediate=immediate, offset=64)
        psn += len(message_packets(Message(verb, data), psn=0, path_mtu=MTU, rkey=0))
    answers = exchange(responder, sent)
    assert [msn for _, _, msn in answers] == [1, 2, 3, 4]
    assert answers[-1][:2] == (ACK_UNLIMITED, psn - 1)
    assert responder.receive_queue == [
        Completion(opcode=0x02, data=messages[0][1], immediate=None),
        Completion(opcode=0x03, data=messages[1][1], immediate=0x11223344),
        Completion(opcode=0x09, data=messages[2][1], immediate=0xCAFEF00D),
        Completion(opcode=0x0B, data=b"", immediate=0x55),
    ]
    assert responder.memory[64:64 + MTU + 1] == messages[2][1]
    assert responder.receives_posted == 0


# Acknowledgement and sequence rules.

def test_ack_coalescing():
    responder = make_responder()
    data = payload(5 * MTU)
    assert exchange(responder, frames("RDMA_WRITE", data)) == [(ACK_UNLIMITED, PSN + 4, 1)]
    responder = make_responder()
    assert exchange(responder, frames("RDMA_WRITE", data, ack_interval=2)) == \
        [(ACK_UNLIMITED, PSN + 1, 0), (ACK_UNLIMITED, PSN + 3, 0), (ACK_UNLIMITED, PSN + 4, 1)]


def test_psn_gap_gets_one_sequence_nak_per_gap():
    responder = make_responder()
    sent = [frames("RDMA_WRITE", payload(16, k), psn=PSN + k, offset=16 * k)[0] for k in range(6)]
    assert exchange(responder, [sent[0]]) == [(ACK_UNLIMITED, PSN, 1)]
    assert exchange(responder, sent[2:4]) == [(NAK_SEQUENCE, PSN + 1, 1)]
    assert responder.expected_psn == PSN + 1 and not any(responder.memory[32:64])
    assert exchange(responder, sent[1:3]) == [(ACK_UNLIMITED, PSN + 1, 2),
                                              (ACK_UNLIMITED, PSN + 2, 3)]
    assert exchange(responder, [sent[5]]) == [(NAK_SEQUENCE, PSN + 3, 3)]
    assert responder.stats["naks_sequence"] == 2
    assert responder.stats["out_of_sequence"] == 3
    assert responder.stats["out_of_sequence_dropped"] == 1
    assert responder.state == "RTS"


def test_duplicate_is_reacked_and_not_executed_again():
    responder = make_responder()
    first = frames("RDMA_WRITE", payload(2 * MTU), ack_interval=0)
    second = frames("RDMA_WRITE", payload(8, 2), psn=PSN + 2, offset=1000)
    assert exchange(responder, first + second) == [(ACK_UNLIMITED, PSN + 1, 1),
                                                  (ACK_UNLIMITED, PSN + 2, 2)]
    responder.memory[:] = bytes(SIZE)
    assert exchange(responder, first) == [(ACK_UNLIMITED, PSN + 2, 2)] * 2
    assert not any(responder.memory)
    assert responder.stats["duplicates"] == 2
    assert responder.stats["executed"] == 3


def test_rnr_nak_without_a_receive_then_ack_after_posting():
    responder = make_responder(rnr_timer=0x0E)
    sent = frames("SEND", payload(20))
    assert exchange(responder, sent) == [(RNR_NAK | 0x0E, PSN, 0)]
    assert responder.expected_psn == PSN and responder.receive_queue == []
    responder.post_receive()
    assert exchange(responder, sent) == [(ACK_UNLIMITED, PSN, 1)]
    assert responder.receive_queue == [Completion(0x04, payload(20), None)]
    assert responder.stats["naks_rnr"] == 1


def test_write_with_immediate_needs_a_receive():
    responder = make_responder()
    sent = frames("RDMA_WRITE_WITH_IMMEDIATE", payload(2 * MTU), immediate=9)
    assert exchange(responder, sent) == [(RNR_NAK | 1, PSN + 1, 0)]
    assert responder.memory[:MTU] == payload(2 * MTU)[:MTU]
    responder.post_receive()
    assert exchange(responder, sent[1:]) == [(ACK_UNLIMITED, PSN + 1, 1)]
    assert responder.receive_queue == [Completion(0x09, payload(2 * MTU), 9)]


def test_rnr_then_later_packets_get_a_sequence_nak():
    responder = make_responder()
    sent = frames("SEND", payload(8)) + frames("SEND", payload(8), psn=PSN + 1)
    assert exchange(responder, sent) == [(RNR_NAK | 1, PSN, 0), (NAK_SEQUENCE, PSN, 0)]


def test_psn_wraps_at_24_bits():
    start = 0xFFFFFE
    responder = make_responder(expected_psn=start)
    data = payload(4 * MTU, k=3)
    sent = frames("RDMA_WRITE", data, psn=start, ack_interval=1)
    assert [Ether(frame)[BTH].psn for frame in sent] == [0xFFFFFE, 0xFFFFFF, 0, 1]
    assert exchange(responder, sent) == [(ACK_UNLIMITED, 0xFFFFFE, 0), (ACK_UNLIMITED, 0xFFFFFF, 0),
                                         (ACK_UNLIMITED, 0, 0), (ACK_UNLIMITED, 1, 1)]
    assert responder.memory[:4 * MTU] == data and responder.expected_psn == 2
    assert exchange(responder, sent[1:2]) == [(ACK_UNLIMITED, 1, 1)]           # behind: duplicate
    ahead = frames("RDMA_WRITE", b"x", psn=(2 + (1 << 23) - 1) & 0xFFFFFF)
    assert exchange(responder, ahead) == [(NAK_SEQUENCE, 2, 1)]                 # ahead: a gap
    behind = frames("RDMA_WRITE", b"x", psn=(2 + (1 << 23)) & 0xFFFFFF)
    assert exchange(responder, behind) == [(ACK_UNLIMITED, 1, 1)]
    assert responder.stats["duplicates"] == 2


# Class C errors.

def refused(responder: Responder, sent: list[bytes], syndrome: int, psn: int, msn: int = 0):
    assert exchange(responder, sent) == [(syndrome, psn, msn)]
    assert responder.state == "ERROR"
    after = frames("RDMA_WRITE", payload(4), psn=responder.expected_psn, offset=SIZE - 4)
    assert exchange(responder, after) == []
    assert responder.stats["dropped_error_state"] == 1
    assert not any(responder.memory[SIZE - 4:])


def test_first_packet_shorter_than_path_mtu_is_an_invalid_request():
    first, *_ = packets("RDMA_WRITE", payload(3 * MTU))
    short = dataclasses.replace(first, payload=first.payload[:-4])
    responder = make_responder()
    refused(responder, [frame_of(short)], NAK_INVALID_REQUEST, PSN)
    assert responder.stats["naks_invalid_request"] == 1


def test_middle_packet_longer_than_path_mtu_is_an_invalid_request():
    first, middle, last = packets("SEND", payload(3 * MTU))
    long = dataclasses.replace(middle, payload=middle.payload + b"ABCD")
    responder = make_responder()
    responder.post_receive()
    refused(responder, [frame_of(first), frame_of(long)], NAK_INVALID_REQUEST, PSN + 1)


def test_write_only_longer_than_path_mtu_is_an_invalid_request():
    responder = make_responder()
    only = packets("RDMA_WRITE", payload(MTU + 4), rkey=RKEY)
    whole = dataclasses.replace(only[0], opcode=0x0A, payload=payload(MTU + 4),
                                ack_request=True)
    refused(responder, [frame_of(whole)], NAK_INVALID_REQUEST, PSN)


def test_write_longer_than_its_dma_length_is_an_invalid_request():
    (only,) = packets("RDMA_WRITE", payload(16))
    lying = dataclasses.replace(only, reth=(BASE, RKEY, 12))
    refused(make_responder(), [frame_of(lying)], NAK_INVALID_REQUEST, PSN)


def test_send_longer_than_its_receive_is_an_invalid_request():
    responder = make_responder()
    responder.post_receive(length=16)
    refused(responder, frames("SEND", payload(17)), NAK_INVALID_REQUEST, PSN)


@pytest.mark.parametrize("case", ["middle_first", "last_of_other_kind", "first_inside"])
def test_opcode_sequence_errors_are_invalid_requests(case):
    write = packets("RDMA_WRITE", payload(3 * MTU))
    send = packets("SEND", payload(3 * MTU), psn=PSN + 1)
    responder = make_responder()
    responder.post_receive()
    sent, psn = {"middle_first": ([write[1]], PSN),
                 "last_of_other_kind": ([write[0], send[2]], PSN + 1),
                 "first_inside": ([write[0], send[0]], PSN + 1)}[case]
    psn_fixed = [dataclasses.replace(fields, psn=PSN + index) for index, fields in enumerate(sent)]
    refused(responder, [frame_of(fields) for fields in psn_fixed], NAK_INVALID_REQUEST, psn)


def test_rdma_read_is_refused():
    (only,) = packets("RDMA_WRITE", b"")
    read = dataclasses.replace(only, opcode=0x0C, reth=(BASE, RKEY, 64))
    refused(make_responder(), [frame_of(read)], NAK_INVALID_REQUEST, PSN)


@pytest.mark.parametrize("offset,rkey,length", [(0, RKEY + 1, 8), (-8, RKEY, 16),
                                                (SIZE - 8, RKEY, 16), (SIZE, RKEY, 1)])
def test_bad_rkey_or_range_is_a_remote_access_error(offset, rkey, length):
    responder = make_responder()
    sent = frames("RDMA_WRITE", payload(length), offset=offset, rkey=rkey)
    refused(responder, sent, NAK_REMOTE_ACCESS, PSN)
    assert responder.stats["naks_remote_access"] == 1


def test_zero_length_write_needs_no_valid_key():
    responder = make_responder()
    sent = frames("RDMA_WRITE", b"", offset=-BASE + 1, rkey=0xBAD)
    assert exchange(responder, sent) == [(ACK_UNLIMITED, PSN, 1)]


# Silent drops.

def rebuilt(frame: bytes, layer, **changes) -> bytes:
    packet = Ether(frame)
    for name, value in changes.items():
        setattr(packet[layer], name, value)
    packet[BTH].icrc = None
    if layer is IP and "chksum" not in changes:
        packet[IP].chksum = None
    return bytes(packet)


def test_bad_icrc_is_dropped_silently_and_counted():
    responder = make_responder()
    good = frames("RDMA_WRITE", payload(8))[0]
    bad = good[:-1] + bytes([good[-1] ^ 0x80])
    assert exchange(responder, [bad]) == []
    assert responder.stats["icrc_errors"] == 1 and not any(responder.memory)
    assert exchange(responder, [good]) == [(ACK_UNLIMITED, PSN, 1)]


@pytest.mark.parametrize("change,counter", [
    (lambda f: rebuilt(f, Ether, dst="52:54:00:00:00:07"), "not_for_us"),
    (lambda f: rebuilt(f, IP, dst="10.77.0.7"), "not_for_us"),
    (lambda f: rebuilt(f, UDP, dport=4792), "not_for_us"),
    (lambda f: rebuilt(f, IP, src="10.77.0.7"), "wrong_source"),
    (lambda f: rebuilt(f, IP, chksum=0x1234), "bad_ip_checksum"),
    (lambda f: rebuilt(f, UDP, chksum=0x1234), "bad_udp_checksum"),
    (lambda f: rebuilt(f, BTH, dqpn=QPN + 1), "bad_qpn"),
    (lambda f: rebuilt(f, BTH, pkey=0x7FFF), "bad_pkey"),
    (lambda f: rebuilt(f, BTH, version=1), "bad_version"),
    (lambda f: rebuilt(f, BTH, opcode=0x11), "not_request"),
    (lambda f: rebuilt(f, BTH, opcode=0x24), "bad_opcode"),
    (lambda f: f[:50], "malformed"),
])
def test_header_checks_drop_silently_and_count(change, counter):
    responder = make_responder()
    bad = change(frames("RDMA_WRITE", payload(8))[0])
    assert exchange(responder, [bad]) == []
    assert responder.stats[counter] == 1
    assert responder.stats["packets_received"] == 0 and not any(responder.memory)


def test_correct_udp_checksum_and_ethernet_padding_are_accepted():
    responder = make_responder()
    responder.post_receive(2)
    packet = Ether(frames("RDMA_WRITE", payload(8))[0])
    packet[UDP].chksum = None
    checked = bytes(packet)
    assert Ether(checked)[UDP].chksum != 0
    padded = frames("SEND", b"", psn=PSN + 1)[0]
    assert len(padded) < 60
    assert exchange(responder, [checked, padded + bytes(60 - len(padded))]) == \
        [(ACK_UNLIMITED, PSN, 1), (ACK_UNLIMITED, PSN + 1, 2)]


# Faults.

def write_run(responder: Responder, count: int, *, now: int = 0, ack_interval: int = 1
              ) -> list[bytes]:
    """``count`` one-packet WRITEs with AckReq, fed at ``now``; what comes back at ``now``."""
    for k in range(count):
        for frame in frames("RDMA_WRITE", payload(8, k), psn=PSN + k, offset=8 * k):
            responder.receive(frame, now)
    return responder.poll(now)


def test_packet_drop():
    responder = make_responder(faults=Faults(packet_drop=1.0))
    assert write_run(responder, 3) == [] and not any(responder.memory)
    assert responder.stats["packets_dropped_fault"] == 3
    assert responder.stats["frames_received"] == 3
    responder = make_responder(faults=Faults(packet_drop=0.5), seed=3)
    answers = [answer(frame) for frame in write_run(responder, 20)]
    dropped = responder.stats["packets_dropped_fault"]
    assert 0 < dropped < 20
    gap = responder.expected_psn - PSN          # the first packet lost
    survivors_after_gap = 20 - dropped - gap
    assert answers == [(ACK_UNLIMITED, PSN + k, k + 1) for k in range(gap)] + \
        [(NAK_SEQUENCE, PSN + gap, gap)] * (survivors_after_gap > 0)
    again = make_responder(faults=Faults(packet_drop=0.5), seed=3)
    assert [answer(frame) for frame in write_run(again, 20)] == answers


def test_packet_duplicate():
    responder = make_responder(faults=Faults(packet_duplicate=1.0))
    responder.post_receive(2)
    assert [answer(frame) for frame in write_run(responder, 1)] == [(ACK_UNLIMITED, PSN, 1)] * 2
    assert exchange(responder, frames("SEND", payload(4), psn=PSN + 1), now=1) == \
        [(ACK_UNLIMITED, PSN + 1, 2)] * 2
    assert responder.stats["duplicates"] == 2
    assert responder.stats["packets_duplicated_fault"] == 2
    assert len(responder.receive_queue) == 1 and responder.receives_posted == 1


def test_packet_corrupt():
    responder = make_responder(faults=Faults(packet_corrupt=1.0))
    assert write_run(responder, 2) == []
    assert responder.stats["icrc_errors"] == responder.stats["packets_corrupted_fault"] == 2


def test_packet_delay_and_jitter():
    responder = make_responder(faults=Faults(packet_delay=100))
    assert write_run(responder, 1) == [] and not any(responder.memory)
    assert responder.next_due == 100
    assert responder.poll(99) == [] and not any(responder.memory)
    assert [answer(frame) for frame in responder.poll(100)] == [(ACK_UNLIMITED, PSN, 1)]
    assert responder.next_due is None

    responder = make_responder(faults=Faults(packet_delay=10, packet_jitter=5), seed=1)
    responder.receive(frames("RDMA_WRITE", payload(8))[0], 0)
    due = responder.next_due
    assert 10 <= due <= 15
    assert responder.poll(due - 1) == []
    assert len(responder.poll(due)) == 1


def test_packet_reorder():
    faults = Faults(packet_reorder=0.3, reorder_delay=50)
    responder = make_responder(faults=faults, seed=5)
    early = [answer(frame) for frame in write_run(responder, 20)]
    late = [answer(frame) for frame in responder.poll(50)]
    assert 0 < responder.stats["packets_reordered_fault"] < 20
    held = len(early) - 1             # the first packet held back: a gap behind it
    assert early == [(ACK_UNLIMITED, PSN + k, k + 1) for k in range(held)] + \
        [(NAK_SEQUENCE, PSN + held, held)]
    assert late[0] == (ACK_UNLIMITED, PSN + held, held + 1)
    again = make_responder(faults=faults, seed=5)
    assert [answer(frame) for frame in write_run(again, 20)] == early


def test_ack_drop():
    responder = make_responder(faults=Faults(ack_drop=1.0))
    assert write_run(responder, 2) == []
    assert responder.memory[:16] == payload(8, 0) + payload(8, 1)
    assert responder.stats["acks_dropped_fault"] == responder.stats["acks_sent"] == 2


def test_ack_duplicate():
    responder = make_responder(faults=Faults(ack_duplicate=1.0))
    out = write_run(responder, 1)
    assert len(out) == 2 and out[0] == out[1]
    assert responder.stats["acks_duplicated_fault"] == 1
    assert responder.stats["frames_sent"] == 2


def test_ack_corrupt():
    clean = write_run(make_responder(), 1)
    responder = make_responder(faults=Faults(ack_corrupt=1.0))
    (corrupt,) = write_run(responder, 1)
    assert not icrc_ok(corrupt) and icrc_ok(clean[0])
    difference = int.from_bytes(bytes(a ^ b for a, b in zip(corrupt, clean[0], strict=True)))
    assert difference.bit_count() == 1 and difference < 1 << 32
    assert responder.stats["acks_corrupted_fault"] == 1


def test_ghost_ack():
    responder = make_responder(faults=Faults(ghost_ack=1.0))
    real, ghost = [answer(frame) for frame in write_run(responder, 1)]
    assert real == (ACK_UNLIMITED, PSN, 1)
    assert ghost[0] == ACK_UNLIMITED
    assert (1 << 22) <= (ghost[1] - responder.expected_psn) % (1 << 24) < 1 << 23
    assert responder.stats["ghost_acks"] == 1


def test_ack_delay_and_jitter():
    responder = make_responder(faults=Faults(ack_delay=30))
    assert write_run(responder, 1, now=5) == []
    assert responder.memory[:8] == payload(8, 0)
    assert responder.poll(34) == [] and len(responder.poll(35)) == 1

    dues = []
    for _ in range(2):
        responder = make_responder(faults=Faults(ack_delay=30, ack_jitter=20), seed=9)
        write_run(responder, 5)
        dues.append(responder.next_due)
        assert 30 <= dues[-1] <= 50
        assert responder.poll(dues[-1] - 1) == [] and responder.poll(dues[-1])
    assert dues[0] == dues[1]


def test_ack_reorder():
    responder = make_responder(faults=Faults(ack_reorder=0.3, reorder_delay=40), seed=2)
    early = write_run(responder, 20)
    psns = [answer(frame)[1] for frame in early + responder.poll(40)]
    assert sorted(psns) == [PSN + k for k in range(20)]
    assert psns != sorted(psns)
    assert len(early) == 20 - responder.stats["acks_reordered_fault"]


def test_rnr_burst():
    responder = make_responder(faults=Faults(rnr_burst=2))
    responder.post_receive(2)
    sent = frames("SEND", payload(8))
    answers = [exchange(responder, sent, now) for now in range(3)]
    assert answers == [[(RNR_NAK | 1, PSN, 0)]] * 2 + [[(ACK_UNLIMITED, PSN, 1)]]
    assert exchange(responder, frames("SEND", payload(8), psn=PSN + 1), 3) == \
        [(ACK_UNLIMITED, PSN + 1, 2)]
    assert responder.stats["rnr_by_fault"] == responder.stats["naks_rnr"] == 2


def test_rnr_rate():
    def run(seed):
        responder = make_responder(faults=Faults(rnr_rate=0.5), seed=seed)
        responder.post_receive(10)
        history = []
        for k in range(10):
            sent = frames("SEND", payload(4, k), psn=PSN + k)
            while True:
                (reply,) = exchange(responder, sent)
                history.append(reply[0])
                if reply[0] == ACK_UNLIMITED:
                    break
        assert [c.data for c in responder.receive_queue] == [payload(4, k) for k in range(10)]
        return history, responder.stats["rnr_by_fault"]
    history, rnrs = run(4)
    assert rnrs > 0 and history.count(RNR_NAK | 1) == rnrs
    assert run(4) == (history, rnrs)


def test_stall():
    responder = make_responder(faults=Faults(stall_at=100, stall_cycles=50))
    replies = []
    for k, now in enumerate([99, 100, 149, 150]):
        replies.append(exchange(responder, frames("RDMA_WRITE", payload(8, k), psn=PSN), now))
    assert replies == [[(ACK_UNLIMITED, PSN, 1)], [], [], [(ACK_UNLIMITED, PSN, 1)]]
    assert responder.stats["dropped_stall"] == 2


def test_silent():
    responder = make_responder(faults=Faults(silent=True))
    responder.post_receive()
    assert write_run(responder, 3) == [] and exchange(responder, frames("SEND", b"x")) == []
    assert not any(responder.memory) and responder.receive_queue == []
    assert responder.stats["dropped_silent"] == 4 and responder.stats["frames_sent"] == 0


def test_every_fault_is_reproducible_from_the_seed():
    faults = Faults(packet_drop=0.1, packet_duplicate=0.1, packet_corrupt=0.1,
                    packet_jitter=20, packet_reorder=0.1, ack_drop=0.1, ack_duplicate=0.1,
                    ack_corrupt=0.1, ack_jitter=20, ack_reorder=0.1, ghost_ack=0.1,
                    reorder_delay=30, rnr_rate=0.2)

    def run(seed):
        responder = make_responder(faults=faults, seed=seed)
        responder.post_receive(30)
        out = []
        for k in range(30):
            verb = "SEND" if k % 3 == 0 else "RDMA_WRITE"
            for frame in frames(verb, payload(8, k), psn=PSN + k, offset=8 * k):
                responder.receive(frame, k)
            out += responder.poll(k)
        return out + responder.poll(1000), dict(responder.stats)
    assert run(11) == run(11)
    assert run(11) != run(12)


# Arguments.

def test_arguments_are_checked():
    with pytest.raises(ValueError, match="path_mtu"):
        make_responder(path_mtu=1500)
    with pytest.raises(ValueError, match="qpn"):
        make_responder(qpn=1 << 24)
    with pytest.raises(TypeError, match="rkey"):
        make_responder(rkey="0xd3d")
    with pytest.raises(ValueError, match="packet_drop"):
        Faults(packet_drop=1.5)
    with pytest.raises(ValueError, match="ack_delay"):
        Faults(ack_delay=-1)
    with pytest.raises(TypeError, match="stall_at"):
        Faults(stall_at=1.5)
    responder = make_responder()
    responder.poll(10)
    with pytest.raises(ValueError, match="backwards"):
        responder.poll(9)
    with pytest.raises(ValueError, match="count"):
        responder.post_receive(-1)
    assert set(responder.stats) == set(COUNTERS)


# Deterministic losses.

def test_packet_drop_at_loses_exactly_those_frames():
    responder = make_responder(faults=Faults(packet_drop_at=(1, 3)))
    answers = [answer(frame) for frame in write_run(responder, 5)]
    assert answers == [(ACK_UNLIMITED, PSN, 1), (NAK_SEQUENCE, PSN + 1, 1)]
    assert responder.stats["packets_dropped_fault"] == 2
    assert responder.stats["out_of_sequence_dropped"] == 1      # index 4; index 3 was lost


def test_ack_drop_at_loses_exactly_those_answers():
    responder = make_responder(faults=Faults(ack_drop_at=(0, 2)))
    assert [answer(frame)[1] for frame in write_run(responder, 4)] == [PSN + 1, PSN + 3]
    assert responder.stats["acks_dropped_fault"] == 2


def test_spread_losses_is_exact_seeded_and_spread():
    for rate, frames_count in ((0.01, 10_000), (0.001, 5_000), (0.0001, 10_000)):
        losses = spread_losses(rate, frames_count, seed=3)
        assert len(losses) == round(rate * frames_count)
        assert len(set(losses)) == len(losses) and all(0 <= i < frames_count for i in losses)
        block = round(1 / rate)
        assert [i // block for i in losses] == list(range(len(losses)))
    assert spread_losses(0.01, 1099) == spread_losses(0.01, 1000)       # whole blocks only
    assert spread_losses(0.01, 1000, seed=3) == spread_losses(0.01, 1000, seed=3)
    assert spread_losses(0.01, 1000, seed=3) != spread_losses(0.01, 1000, seed=4)
    with pytest.raises(ValueError, match="loss rate"):
        spread_losses(0, 100)
    with pytest.raises(TypeError, match="packet_drop_at"):
        Faults(packet_drop_at=[1, 2])
    with pytest.raises(TypeError, match="ack_drop_at"):
        Faults(ack_drop_at=(-1,))


# The ConnectX-like mode.

ROUND_TRIP = 500


def connectx(**kwargs) -> Responder:
    mode = {"round_trip": ROUND_TRIP, **kwargs.pop("mode", {})}
    return make_responder(connectx=ConnectX(**mode), **kwargs)


def test_round_trip_in_cycles_of_the_core_clock():
    assert CLOCK_HZ == 322_265_625
    assert [round_trip_cycles(us) for us in (1, 2, 5)] == [322, 645, 1611]
    assert ConnectX().round_trip == 645


def test_every_answer_comes_one_round_trip_after_its_packet():
    responder = connectx()
    for k in range(3):
        responder.receive(frames("RDMA_WRITE", payload(8, k), psn=PSN + k, offset=8 * k)[0],
                          10 * k)
    assert responder.next_due == ROUND_TRIP
    assert responder.poll(ROUND_TRIP - 1) == []
    assert [answer(frame) for frame in responder.poll(ROUND_TRIP + 10)] == \
        [(ACK_UNLIMITED, PSN, 1), (ACK_UNLIMITED, PSN + 1, 2)]
    assert [answer(frame) for frame in responder.poll(ROUND_TRIP + 20)] == \
        [(ACK_UNLIMITED, PSN + 2, 3)]
    assert responder.memory[:24] == payload(8, 0) + payload(8, 1) + payload(8, 2)


def test_coalesced_acks_for_packets_that_do_not_ask():
    responder = connectx(mode={"coalesce": 2})
    sent = frames("RDMA_WRITE", payload(7 * MTU))                   # AckReq on the last only
    assert exchange(responder, sent, now=ROUND_TRIP) == []
    assert [answer(frame) for frame in responder.poll(2 * ROUND_TRIP)] == \
        [(ACK_UNLIMITED, PSN + 1, 0), (ACK_UNLIMITED, PSN + 3, 0), (ACK_UNLIMITED, PSN + 5, 0),
         (ACK_UNLIMITED, PSN + 6, 1)]
    assert responder.stats["acks_coalesced"] == 3 and responder.stats["acks_sent"] == 4
    # An AckReq packet's ACK restarts the count.
    responder = connectx(mode={"coalesce": 3, "round_trip": 0})
    sent = frames("RDMA_WRITE", payload(6 * MTU), ack_interval=2)   # AckReq: PSN + 1, 3, 5
    assert [psn for _, psn, _ in exchange(responder, sent)] == [PSN + 1, PSN + 3, PSN + 5]
    assert responder.stats["acks_coalesced"] == 0


def test_rxe_mode_never_coalesces_nor_delays():
    responder = make_responder()
    assert responder.connectx is None
    assert exchange(responder, frames("RDMA_WRITE", payload(7 * MTU))) == \
        [(ACK_UNLIMITED, PSN + 6, 1)]


def test_every_resent_duplicate_gets_a_duplicate_ack():
    """C9-105: a duplicate ACK follows every resent duplicate, asked for or not."""
    responder = connectx(mode={"round_trip": 0, "coalesce": 4})
    sent = frames("RDMA_WRITE", payload(3 * MTU))
    assert exchange(responder, sent) == [(ACK_UNLIMITED, PSN + 2, 1)]
    assert not any(Ether(frame)[BTH].ackreq for frame in sent[:2])
    assert exchange(responder, sent) == [(ACK_UNLIMITED, PSN + 2, 1)] * 3
    assert responder.stats["duplicates"] == 3 and responder.stats["executed"] == 3


def test_rnr_nak_then_sequence_nak_for_the_same_psn_each_round():
    """An empty receive queue with packets in flight: RNR NAK for p, then NAK sequence
    error for p, one round trip after; the packets after that are dropped; the next
    round (the requester resends from p) gets the same pair, until a receive is posted."""
    responder = connectx()
    sent = frames("SEND", payload(8)) + [
        frames("RDMA_WRITE", payload(8, k), psn=PSN + k, offset=8 * k)[0] for k in (1, 2, 3)]
    for round_start in (0, 2000):
        for offset, frame in enumerate(sent):
            responder.receive(frame, round_start + offset)
        assert responder.poll(round_start + ROUND_TRIP - 1) == []
        assert [answer(frame) for frame in responder.poll(round_start + ROUND_TRIP + 1)] == \
            [(RNR_NAK | 1, PSN, 0), (NAK_SEQUENCE, PSN, 0)]
    assert responder.stats["naks_rnr"] == responder.stats["naks_sequence"] == 2
    assert responder.stats["out_of_sequence_dropped"] == 4
    responder.post_receive()
    for offset, frame in enumerate(sent):
        responder.receive(frame, 4000 + offset)
    assert [answer(frame) for frame in responder.poll(5000)] == \
        [(ACK_UNLIMITED, PSN + k, k + 1) for k in range(4)]


def cnp_fields(frame: bytes) -> tuple[int, int, bytes]:
    """(IPv4 TOS, UDP source port, BTH and payload) of a CNP frame, checked to be one."""
    packet = Ether(frame)
    assert icrc_ok(frame)
    assert (packet.dst, packet.src, packet[IP].src, packet[IP].dst) == \
        (OUR_MAC, PEER_MAC, PEER_IP, OUR_IP)
    assert packet[UDP].dport == 4791 and packet[UDP].chksum == 0
    transport = bytes(packet[UDP].payload)
    assert len(transport) == 12 + 16 + 4                # BTH, 16 reserved bytes, ICRC
    return packet[IP].tos, packet[UDP].sport, transport[:-4]


def cnp_transport(dqpn: int, pkey: int = 0xFFFF) -> bytes:
    """A CNP's BTH and payload from RoCEv2 annex A17.9.3, field by field: opcode 0x81,
    SE/M/PadCnt/TVer 0, P_Key, BECN (bit 6 of the next byte), DestQP, AckReq 0 and
    PSN 0, then 16 reserved bytes."""
    return struct.pack("!BBHI", OP_CNP, 0, pkey, 0x40 << 24 | dqpn) + bytes(4) + bytes(16)


def test_cnp_format_matches_the_annex():
    # The BTH of Mellanox's example CNP for QP 0xd2, as Wireshark shows it.
    assert cnp_transport(0xD2) == bytes.fromhex("8100ffff400000d2" + "00" * 20)
    responder = connectx(mode={"cnp_every": 3, "round_trip": 0})
    for k in range(4):
        responder.receive(frames("RDMA_WRITE", payload(8, k), psn=PSN + k, offset=8 * k)[0], 0)
    out = responder.poll(0)
    # The third packet's CNP, before its ACK: the notification point sees it first.
    assert [Ether(frame)[BTH].opcode for frame in out] == \
        [OP_ACKNOWLEDGE] * 2 + [OP_CNP] + [OP_ACKNOWLEDGE] * 2
    tos, sport, transport = cnp_fields(out[2])
    assert (tos, sport, transport) == (CNP_DSCP << 2, responder.src_port, cnp_transport(PEER_QPN))
    assert [answer(frame)[1] for frame in out[:2] + out[3:]] == [PSN + k for k in range(4)]
    assert responder.stats["ce_marked"] == responder.stats["cnps_sent"] == 1


def test_cnps_answer_congestion_marks_at_most_one_per_gap():
    responder = connectx(mode={"cnp_gap": 100, "round_trip": 0, "cnp_dscp": 26})
    times = [0, 10, 50, 100, 150, 250]
    marked = {0, 1, 3, 4, 5}                                     # index 2 arrives ECT(0)
    for k, now in enumerate(times):
        frame = frame_of(packets("RDMA_WRITE", payload(8, k), psn=PSN + k, offset=8 * k)[0],
                         tos=0x03 if k in marked else 0x02)
        responder.receive(frame, now)
    out = responder.poll(1000)
    cnps = [frame for frame in out if Ether(frame)[BTH].opcode == OP_CNP]
    assert len(cnps) == 3                                        # at 0, 100, 250
    assert {cnp_fields(frame)[0] for frame in cnps} == {26 << 2}
    assert responder.stats["ce_marked"] == 5 and responder.stats["cnps_sent"] == 3
    assert len(out) - len(cnps) == 6 and responder.memory[:48] == b"".join(
        payload(8, k) for k in range(6))


def test_cnp_interval_marks_one_packet_per_interval():
    responder = connectx(mode={"cnp_interval": 100, "round_trip": 0})
    times = [0, 10, 99, 100, 180, 210, 330]
    for k, now in enumerate(times):
        responder.receive(frames("RDMA_WRITE", payload(8, k), psn=PSN + k, offset=8 * k)[0],
                          now)
    out = responder.poll(1000)
    assert sum(Ether(frame)[BTH].opcode == OP_CNP for frame in out) == 4   # 0, 100, 210, 330
    assert responder.stats["ce_marked"] == responder.stats["cnps_sent"] == 4


def test_connectx_arguments_are_checked():
    with pytest.raises(ValueError, match="round_trip"):
        ConnectX(round_trip=-1)
    with pytest.raises(ValueError, match="coalesce"):
        ConnectX(coalesce=1.5)
    with pytest.raises(ValueError, match="cnp_dscp"):
        ConnectX(cnp_dscp=64)
    with pytest.raises(TypeError, match="connectx"):
        make_responder(connectx={"round_trip": 10})
