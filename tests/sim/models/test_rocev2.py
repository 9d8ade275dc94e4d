"""The golden model's AckReq rule (sim/models/rocev2.py): the last packet of a message, and
every packet whose payload starts a page (4 KiB: 64 beats) of the QP's retransmit ring or
crosses into one."""

import pytest

from sim.models.rocev2 import Message, RetransmitPages, message_packets


def ack_requests(ring, length, path_mtu=4096):
    packets = message_packets(Message("RDMA_WRITE", bytes(length)), psn=0, path_mtu=path_mtu,
                              rkey=0, ring=ring)
    return [packet.ack_request for packet in packets]


def test_pages_of_the_ring():
    ring = RetransmitPages()
    assert ack_requests(ring, 3 * 4096) == [True, True, True]       # each starts a page
    assert ring.tail == 3 * 64
    assert ack_requests(ring, 1) == [True]                          # starts page 3
    assert ack_requests(ring, 4096 + 1) == [True, True]             # 1 + 64 crosses into 4
    # 1 KiB packets from beat 258 (2 into page 4): the fourth and eighth cross a page.
    assert ack_requests(ring, 9 * 1024, path_mtu=1024) == [False] * 3 + [True] \
        + [False] * 3 + [True, True]
    assert ring.tail == 3 * 64 + 2 + 64 + 9 * 16


@pytest.mark.parametrize("tail, payload, ack", [
    (0, 1, True), (0, 0, False), (64, 64 * 64, True), (1, 63 * 64, False),
    (1, 63 * 64 + 1, True), (63, 64, False), (63, 65, True), (100, 28 * 64, False),
    (100, 28 * 64 + 1, True)])
def test_a_packet_that_enters_a_page(tail, payload, ack):
    ring = RetransmitPages(tail=tail)
    assert ring.ack_request(payload) == ack
    assert ring.tail == tail + -(-payload // 64)


def test_without_a_ring_only_the_last_packet():
    assert ack_requests(None, 5 * 256, path_mtu=256) == [False] * 4 + [True]
