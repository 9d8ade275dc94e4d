"""The golden model's AckReq rule (sim/models/rocev2.py): the last packet of a message, and
every packet whose payload reaches the next quarter of the QP's retransmit ring."""

import pytest

from sim.models.rocev2 import Message, RetransmitRing, message_packets


def ack_requests(ring, length, path_mtu=4096):
    packets = message_packets(Message("RDMA_WRITE", bytes(length)), psn=0, path_mtu=path_mtu,
                              rkey=0, ring=ring)
    return [packet.ack_request for packet in packets]


def test_quarter_boundaries_of_the_ring():
    ring = RetransmitRing(512)                  # a quarter: 128 beats, two full packets
    assert ack_requests(ring, 5 * 4096) == [False, True, False, True, True]
    assert ring.tail == 5 * 64
    assert ack_requests(ring, 4096 + 1) == [True, True]         # 320 + 64 reaches 384
    assert ack_requests(ring, 3 * 4096) == [False, True, True]
    assert ring.tail == 9 * 64 + 1


@pytest.mark.parametrize("tail, payload, ack", [
    (120, 8 * 64, True), (120, 7 * 64, False), (120, 7 * 64 + 1, True),
    (127, 0, False), (255, 1, True), (256, 64 * 127 + 1, True), (256, 64 * 127, False)])
def test_a_packet_that_reaches_a_quarter(tail, payload, ack):
    ring = RetransmitRing(512, tail=tail)
    assert ring.ack_request(payload) == ack
    assert ring.tail == tail + -(-payload // 64)


def test_without_a_ring_only_the_last_packet():
    assert ack_requests(None, 5 * 256, path_mtu=256) == [False] * 4 + [True]
