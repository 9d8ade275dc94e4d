"""The congested switch model (sim/models/switch.py): hand-computed queues, Scapy-built frames,
PFC and PAUSE frames and CNPs checked field by field with struct."""

import struct

import pytest
from scapy.contrib.roce import BTH
from scapy.layers.inet import IP
from scapy.layers.l2 import Ether
from scapy.utils import checksum

from sim.models.responder import OP_CNP, ConnectX, Responder, round_trip_cycles
from sim.models.rocev2 import Message, message_packets, roce_frame
from sim.models.switch import (
    DCQCN_RED,
    MAC_CONTROL_ADDRESS,
    MIN_TIME_BETWEEN_CNPS_US,
    CongestedSwitch,
    EgressQueue,
    NotificationPoint,
    Red,
    SwitchSettings,
)

OUR_MAC, OUR_IP = "02:00:00:00:00:02", "10.77.0.2"
PEER_MAC, PEER_IP = "52:54:00:12:34:56", "10.77.0.1"
QPN, PEER_QPN, RKEY = 0x300, 0x102, 0xC000
ETHERTYPE_MAC_CONTROL = 0x8808
ALWAYS = Red(k_min=0, k_max=0, p_max=0.0)       # every ECN-capable packet leaving others behind
NEVER = Red(k_min=1 << 30, k_max=1 << 30, p_max=0.0)


def write_frames(count, *, tos=0x02, payload=256):
    """``count`` Scapy-built RDMA WRITE ONLY frames to QPN, ECT(0) by default."""
    frames = []
    for index in range(count):
        message = Message("RDMA_WRITE", bytes([index]) * payload, remote_address=0x1000_0000)
        fields, = message_packets(message, psn=index, path_mtu=4096, rkey=RKEY)
        frames.append(roce_frame(fields, src_mac=OUR_MAC, dst_mac=PEER_MAC, src_ip=OUR_IP,
                                 dst_ip=PEER_IP, dest_qp=QPN, src_port=0xC200, tos=tos,
                                 ip_id=index))
    return frames


def test_red_probability_is_the_papers_ramp():
    red = Red(k_min=100, k_max=300, p_max=0.1)
    assert [red.probability(depth) for depth in (0, 100, 200, 300, 301)] == \
        [0.0, 0.0, 0.05, 0.1, 1.0]
    assert (DCQCN_RED.k_min, DCQCN_RED.k_max, DCQCN_RED.p_max) == (5_000, 200_000, 0.01)


def test_queue_drains_at_its_rate_in_order():
    # 2 bytes a cycle and 2 of overhead: 10 bytes take 6 cycles, 4 bytes take 3.
    queue = EgressQueue(SwitchSettings(rate=2, buffer=100, red=NEVER, overhead=2))
    assert queue.offer("a", 10, True, 0) == "queued"
    assert queue.offer("b", 4, True, 1) == "queued"          # waits behind a: done at 9
    assert queue.depth() == 14 and queue.next_due == 6
    assert queue.advance(5) == []
    assert queue.advance(6) == [(6, "a", False)] and queue.depth() == 4
    assert queue.advance(20) == [(9, "b", False)] and queue.depth() == 0
    queue.offer("c", 4, False, 30)                          # an idle port starts at once
    assert queue.advance(33) == [(33, "c", False)]
    assert (queue.stats.arrived, queue.stats.departed, queue.stats.max_depth) == (3, 3, 14)
    with pytest.raises(ValueError, match="backwards"):
        queue.advance(32)


def test_full_queue_tail_drops_and_counts():
    queue = EgressQueue(SwitchSettings(rate=1, buffer=20, red=NEVER))
    assert [queue.offer(n, 8, True, 0) for n in range(3)] == ["queued", "queued", "dropped"]
    assert queue.offer(3, 4, True, 0) == "queued"           # a smaller one still fits
    assert (queue.stats.dropped, queue.depth()) == (1, 20)
    assert [item for _, item, _ in queue.advance(1000)] == [0, 1, 3]


def test_only_ecn_capable_packets_are_marked_as_they_leave():
    queue = EgressQueue(SwitchSettings(rate=1, buffer=1000, red=ALWAYS))
    for item, ect in (("a", True), ("not-ect", False), ("b", True), ("last", True)):
        assert queue.offer(item, 10, ect, 0) == "queued"
    # The last leaves an empty queue behind: depth 0 <= K_min.
    assert [marked for _, _, marked in queue.advance(1000)] == [True, False, True, False]
    assert queue.stats.marked == 2


def test_red_marks_with_its_probability_between_the_thresholds():
    # 111 packets of 100 bytes at once: packet n leaves 100 (110 - n) bytes behind,
    # marked with probability 0.5 * (depth - 1000) / 9000 between K_min 1000 and
    # K_max 10000, always above.
    red = Red(k_min=1000, k_max=10_000, p_max=0.5)
    queue = EgressQueue(SwitchSettings(rate=1, buffer=1 << 20, red=red, seed=7))
    for n in range(111):
        queue.offer(n, 100, True, 0)
    marks = [marked for _, _, marked in queue.advance(1 << 20)]
    assert marks[:10] == [True] * 10                        # above K_max
    assert not any(marks[100:])                             # at or below K_min
    expected = sum(red.probability(100 * (110 - n)) for n in range(10, 100))
    assert abs(sum(marks[10:100]) - expected) <= 4 * expected ** 0.5, (marks, expected)


def test_xoff_above_the_threshold_and_xon_when_drained():
    # 1 byte a cycle: three 10-byte packets reach XOFF 30 at 0; XON at 10 when the
    # second has left (depth 10), at cycle 20.
    queue = EgressQueue(SwitchSettings(rate=1, buffer=100, red=NEVER, xoff=30, xon=10,
                                       overhead=0))
    for n in range(3):
        queue.offer(n, 10, True, 0)
    assert queue.paused and queue.pause_changes() == [(0, True)]
    queue.advance(15)
    assert queue.pause_changes() == []
    queue.advance(25)
    assert not queue.paused and queue.pause_changes() == [(20, False)]
    assert (queue.stats.xoff_sent, queue.stats.xon_sent) == (1, 1)


def test_xoff_is_repeated_every_half_pause_time_while_the_queue_stays_full():
    # 4 quanta of 5 cycles: repeat every 10 cycles; the queue drains below XON at 45.
    queue = EgressQueue(SwitchSettings(rate=1, buffer=100, red=NEVER, xoff=40, xon=5,
                                       pause_quanta=4, quantum_cycles=5, overhead=0))
    queue.offer("big", 40, True, 0)
    queue.offer("small", 5, True, 0)
    assert queue.next_due == 10
    queue.advance(100)
    assert queue.pause_changes() == [(0, True), (10, True), (20, True), (30, True),
                                     (40, False)]


def test_marked_frame_changes_only_its_ecn_bits_and_ip_checksum():
    switch = CongestedSwitch(SwitchSettings(rate=1, buffer=1 << 16, red=ALWAYS))
    frames = write_frames(3) + write_frames(1, tos=0x00)   # the last one is Not-ECT
    for frame in frames:
        switch.receive(frame, 0)
    assert [arrival.verdict for arrival in switch.arrivals] == ["queued"] * 4
    assert {arrival.dqpn for arrival in switch.arrivals} == {QPN}
    forwarded, upstream = switch.poll(1 << 20)
    assert upstream == []
    assert forwarded[3] == frames[3]                        # Not-ECT: never marked
    for original, marked in zip(frames[:3], forwarded[:3], strict=True):
        ip_start = len(Ether())
        changed = [at for at in range(len(original)) if original[at] != marked[at]]
        assert len(marked) == len(original)
        assert set(changed) <= {ip_start + 1, ip_start + 10, ip_start + 11}   # TOS, checksum
        assert marked[ip_start + 1] == 0x03                 # DSCP 0, ECN CE
        assert checksum(marked[ip_start:ip_start + len(IP())]) == 0
        packet = Ether(marked)
        assert packet[BTH].compute_icrc(b"") == marked[-4:]     # the ICRC still holds


@pytest.mark.parametrize("priority", [3, None])
def test_pause_frames_field_by_field(priority):
    switch = CongestedSwitch(SwitchSettings(rate=1, buffer=100, red=NEVER, xoff=20, xon=0,
                                            pfc_priority=priority, overhead=0),
                             mac="02:00:00:5e:00:01")
    for frame in write_frames(1, payload=0):
        switch.receive(frame, 0)                            # 66 bytes: past XOFF
    _, upstream = switch.poll(0)
    _, resume = switch.poll(1000)
    assert len(upstream) == len(resume) == 1
    for frame, quanta in ((upstream[0], 0xFFFF), (resume[0], 0)):
        assert len(frame) == 60
        dst, src, ethertype, opcode = struct.unpack_from("!6s6sHH", frame)
        assert dst == bytes.fromhex(MAC_CONTROL_ADDRESS.replace(":", ""))
        assert src == bytes.fromhex("0200005e0001") and ethertype == ETHERTYPE_MAC_CONTROL
        if priority is None:
            assert opcode == 0x0001 and struct.unpack_from("!H", frame, 16) == (quanta,)
            assert frame[18:] == bytes(42)
        else:
            vector, *times = struct.unpack_from("!H8H", frame, 16)
            assert opcode == 0x0101 and vector == 1 << priority
            assert times == [quanta if c == priority else 0 for c in range(8)]
            assert frame[34:] == bytes(26)


def test_notification_point_limits_cnps_per_qp():
    point = NotificationPoint(gap=10)
    assert [point.notify(qpn, now) for qpn, now in
            ((1, 0), (1, 5), (2, 5), (1, 9), (1, 10), (2, 14), (2, 15))] == \
        [True, False, True, False, True, False, True]


def test_marked_frames_draw_cnps_from_a_connectx_receiver():
    """The whole path of a frame: the switch marks it, the responder (the ConnectX's
    notification point) answers with a CNP in the annex A17.9.3 format, at most one
    per ``min_time_between_cnps``."""
    gap = round_trip_cycles(MIN_TIME_BETWEEN_CNPS_US)
    switch = CongestedSwitch(SwitchSettings(rate=1, buffer=1 << 20, red=ALWAYS, overhead=0))
    responder = Responder(mac=PEER_MAC, ip=PEER_IP, peer_mac=OUR_MAC, peer_ip=OUR_IP, qpn=QPN,
                          peer_qpn=PEER_QPN, expected_psn=0, rkey=RKEY,
                          memory_base=0x1000_0000, memory_size=1 << 16, path_mtu=4096,
                          connectx=ConnectX(round_trip=0, cnp_gap=gap))
    for frame in write_frames(4):
        switch.receive(frame, 0)
    answers = []
    for now in range(0, 2 * gap, 32):
        for frame in switch.poll(now)[0]:
            responder.receive(frame, now)
        answers += responder.poll(now)
    cnps = [frame for frame in answers if Ether(frame)[BTH].opcode == OP_CNP]
    # Frames 0-2 leave others behind and are marked, all within one gap.
    assert responder.stats["ce_marked"] == 3 and len(cnps) == 1
    transport = bytes(Ether(cnps[0])[BTH])
    opcode, flags, pkey, becn_dqpn, psn = struct.unpack_from("!BBHII", transport)
    assert (opcode, flags, pkey, becn_dqpn, psn) == (0x81, 0, 0xFFFF, 0x40 << 24 | PEER_QPN, 0)
    assert transport[12:28] == bytes(16) and len(transport) == 12 + 16 + 4
    assert Ether(cnps[0])[BTH].compute_icrc(b"") == transport[-4:]


@pytest.mark.parametrize("settings, message", [
    (dict(rate=0, buffer=1), "rate"),
    (dict(rate=1, buffer=-1), "buffer"),
    (dict(rate=1, buffer=100, xoff=50, xon=50), "xon < xoff"),
    (dict(rate=1, buffer=100, xoff=200), "xon < xoff"),
    (dict(rate=1, buffer=100, pfc_priority=8), "pfc_priority"),
    (dict(rate=1, buffer=100, pause_quanta=0), "pause_quanta"),
])
def test_bad_settings_are_refused(settings, message):
    with pytest.raises(ValueError, match=message):
        SwitchSettings(**settings)
    with pytest.raises(ValueError, match="k_max"):
        Red(k_min=10, k_max=5, p_max=0.1)
