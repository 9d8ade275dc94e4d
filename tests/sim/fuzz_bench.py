"""A seeded fuzz of the whole core; run through tests/sim/test_core.py.

A few thousand mutated frames of every protocol the endpoint speaks (Ethernet,
ARP, IPv4, ICMP, UDP echo, the CM on UDP 17185, RoCEv2 acknowledgements on
4791, IB CM MADs to QP1) go in back to back, in batches of a hundred; after each
batch a probe (a ping or an ARP request from the peer) must be answered. At the end
every frame (the bench's answers to the core's ARP requests included) is accounted
for: answered, or counted by the counter of the layer that took or dropped it. A QP
opened before the fuzz then runs a generator run that must land byte for byte.

The QP1 MADs (a REQ as rdma_connect sends it, an RTU and a REJ) are mutated where
QP1 and the passive CM look: a byte of the BTH, the DETH or the MAD header, a field
of the CM message set at random, the MAD cut or lengthened (IPv4 and UDP lengths to
match), each with its ICRC made right again; or a bit of the ICRC flipped. Each is
dropped and counted by QP1's receiver or the passive CM, or answered with a REP or
REJ. They come from the other peer (which answers ARP) and from off the subnet (the
REQ refused by the access list, its REJ unreachable); never from the silent address
on the subnet, whose REPs would be retransmitted and counted again when unresolved.

The seed is ``FUZZ_SEED`` from the environment (default 1), printed first;
``FUZZ_SEED=<n> make test`` repeats a run.

The fuzz cannot close or disturb the QP it protects, by construction: a
mutated frame never names that QP (its QPN in a CM datagram's ``rem_qpn`` or a
BTH's destination QP, or the close-all QPN 0xFFFFFF), never comes from the
QP's host (IPv4 source or CM ``loc_ip``), never carries an ARP binding for
the host, and never starts a generator run (the start bit of byte 51 is
cleared), so no frame can legitimately close, re-open, start or acknowledge
it. Everything else about the frames is random.
"""

import os
import random

import cocotb
from cm_bench import Host, open_qp, start_run
from network_bench import OTHER_IP, OTHER_MAC, OUR_IP, OUR_MAC, PARAMS, PEER_IP, PEER_MAC, ping
from roce_bench import RoceRun
from roce_bench import start as start_roce
from scapy.contrib.roce import AETH, BTH
from scapy.layers.inet import ICMP, IP, UDP
from scapy.layers.l2 import ARP, Ether
from scapy.packet import Raw

from gateware import headers
from gateware.cm.datagram import CM_PORT
from gateware.cm.manager import ConnectionManager
from gateware.config import parse_ipv4
from gateware.roce.requests import FIRST_QPN
from host import protocol
from host.protocol import Ack, Datagram, QpInfo
from sim.models import ib_cm

SEED = int(os.environ.get("FUZZ_SEED", "1"))
FRAMES = 5000
BATCH = 100

#: Where fields sit in a frame with an IPv4 header of 20 bytes (the only kind the
#: core takes) and in the CM datagram (from the codec's layout).
IP_AT = len(Ether(src=OUR_MAC, dst=OUR_MAC))
IP_SRC = IP_AT + 12
UDP_PAYLOAD = IP_AT + len(IP()) + len(UDP())
QP_INFO_BYTES = len(QpInfo().encode())
CM_LOC_IP = UDP_PAYLOAD + 1 + QP_INFO_BYTES - 4
CM_REM_QPN = UDP_PAYLOAD + 1 + QP_INFO_BYTES
CM_TXMETA = UDP_PAYLOAD + 1 + 2 * QP_INFO_BYTES + 2
BTH_DQPN = UDP_PAYLOAD + 5
ARP_SPA = IP_AT + 14
CLOSE_ALL = 0xFFFFFF
#: Where the parts of a GSI packet start in its frame: BTH, DETH, MAD, the CM message.
GSI_BTH = UDP_PAYLOAD
GSI_DETH = GSI_BTH + headers.BTH.length
GSI_MAD = GSI_DETH + ib_cm.DETH_FORMAT.size
GSI_CM = GSI_MAD + ib_cm.MAD_HEADER_FORMAT.size

#: Sources of the fuzz frames: the other bench peer (answers ARP), an address on our
#: subnet that never answers, one off it.
SOURCES = [(OTHER_IP, OTHER_MAC), ("10.77.0.50", "52:54:00:00:00:50"),
           ("192.0.2.1", "52:54:00:00:00:51")]
#: The sources of the QP1 MADs (see the module's docstring).
GSI_SOURCES = [SOURCES[0], SOURCES[2]]


def templates(rng, protected_qpn):
    """Well-formed frames of every protocol, built once with Scapy."""
    frames = []
    for src_ip, src_mac in SOURCES:
        eth = Ether(src=src_mac, dst=OUR_MAC)
        ip = IP(src=src_ip, dst=OUR_IP)
        frames += [
            bytes(Ether(src=src_mac, dst="ff:ff:ff:ff:ff:ff") /
                  ARP(op=1, hwsrc=src_mac, psrc=src_ip, pdst=OUR_IP)),
            bytes(eth / ARP(op=2, hwsrc=src_mac, psrc=src_ip, hwdst=OUR_MAC, pdst=OUR_IP)),
            bytes(eth / ARP(op=1, hwsrc=src_mac, psrc=src_ip, pdst="10.77.0.3")),
            bytes(Ether(src=src_mac, dst="ff:ff:ff:ff:ff:ff", type=0x86DD) / Raw(bytes(50))),
            bytes(eth / ip / ICMP(type=13) / Raw(bytes(20))),
            bytes(eth / ip / UDP(sport=4000, dport=9) / Raw(bytes(30))),
        ]
        for size in (0, 18, 100, 700, 1400):
            frames.append(bytes(eth / ip / ICMP(type=8, id=rng.getrandbits(16), seq=size) /
                                Raw(rng.randbytes(size))))
            frames.append(bytes(eth / ip / UDP(sport=rng.randrange(1024, 65536), dport=7) /
                                Raw(rng.randbytes(size))))
        for request in (protocol.status(protected_qpn + 1),
                        protocol.open_qp(QpInfo(0x99, 7, 8, 0x1000, src_ip)),
                        protocol.close_qp(protected_qpn + 2, src_ip),
                        protocol.start_run(protected_qpn + 3, length=64, count=2),
                        Datagram(protocol.Request.SEND_QP_INFO, loc=QpInfo(0x98, ip=src_ip))):
            frames.append(bytes(eth / ip / UDP(sport=50001, dport=CM_PORT) / request.encode()))
        for qpn in (protected_qpn + 1, protected_qpn + 5, FIRST_QPN + 200):
            for syndrome in (0x1F, 0x60, 0x20):
                frames.append(bytes(eth / IP(src=src_ip, dst=OUR_IP, flags="DF") /
                                    UDP(sport=0xC001, dport=4791, chksum=0) /
                                    BTH(opcode=0x11, dqpn=qpn, psn=rng.getrandbits(24)) /
                                    AETH(syndrome=syndrome, msn=1)))
    return frames


def gsi_templates(rng):
    """Valid QP1 MADs: REQs as rdma_connect sends them (path MTUs 256 to 4096), an RTU
    and a REJ, each of comm IDs that name no connection."""
    frames = []
    for src_ip, src_mac in GSI_SOURCES:
        messages = [("REQ", ib_cm.connect_request(
            comm_id=rng.getrandbits(32), port=CM_PORT, src_ip=src_ip, dst_ip=OUR_IP,
            qpn=rng.getrandbits(24), psn=rng.getrandbits(24), rkey=rng.getrandbits(32),
            base=rng.getrandbits(64), length=1 << 16, path_mtu=mtu)) for mtu in (1, 3, 5)]
        messages += [(kind, ib_cm.cm_message(kind, local_comm_id=rng.getrandbits(32),
                                             remote_comm_id=rng.getrandbits(32)))
                     for kind in ("RTU", "REJ")]
        for kind, message in messages:
            frames.append(ib_cm.gsi_frame(
                ib_cm.mad(kind, message, transaction_id=rng.getrandbits(64)),
                src_ip=src_ip, dst_ip=OUR_IP, src_mac=src_mac, dst_mac=OUR_MAC,
                sport=0xC000 | rng.getrandbits(14)))
    return frames


def mutate_gsi(frame, rng):
    """A mutation of a QP1 MAD where QP1 and the CM look (see the module's docstring);
    the ICRC is right again but when it is the ICRC that is mutated."""
    frame = bytearray(frame)
    kind = rng.randrange(6)
    if kind == 5:
        frame[-4 + rng.randrange(4)] ^= 1 << rng.randrange(8)
        return bytes(frame)
    if kind < 3:
        start, end = ((GSI_BTH, GSI_DETH), (GSI_DETH, GSI_MAD), (GSI_MAD, GSI_CM))[kind]
        frame[rng.randrange(start, end)] = rng.getrandbits(8)
    elif kind == 3:
        header, message = ib_cm.parse_mad(bytes(frame[GSI_MAD:-4]))
        attribute = {v: k for k, v in ib_cm.ATTRIBUTE_IDS.items()}[header.attribute_id]
        name, field = rng.choice(list(ib_cm.CM_MESSAGES[attribute].items()))
        value = (rng.randbytes(field.width // 8) if name in ib_cm.BYTES_FIELDS
                 else rng.getrandbits(field.width))
        fields = {**ib_cm.parse_cm_message(attribute, message), name: value}
        frame[GSI_CM:-4] = ib_cm.cm_message(attribute, **fields)
    packet = Ether(bytes(frame))
    if kind == 4:
        body = bytes(packet[BTH].payload)
        body = (body[:rng.randrange(len(body))] if rng.random() < 0.5
                else body + rng.randbytes(rng.choice((1, 4, 64, 200))))
        packet[BTH].remove_payload()
        packet[BTH].add_payload(Raw(body))
        packet[IP].len = packet[IP].chksum = packet[UDP].len = None
    packet[BTH].icrc = None
    return bytes(packet)


def mutate(frame, rng):
    """A random mutation of a frame: flipped bits, overwritten bytes, a byte in a header
    set at random, a cut or an extension. Returns (frame, tuser error, pad to 60)."""
    frame = bytearray(frame)
    kind = rng.randrange(6)
    if kind == 0:
        for _ in range(rng.randint(1, 8)):
            position = rng.randrange(len(frame) * 8)
            frame[position // 8] ^= 1 << position % 8
    elif kind == 1:
        at = rng.randrange(len(frame))
        frame[at:at + rng.randint(1, 4)] = rng.randbytes(rng.randint(1, 4))
    elif kind == 2:
        frame[rng.randrange(min(len(frame), UDP_PAYLOAD + 20))] = rng.getrandbits(8)
    elif kind == 3:
        frame = frame[:rng.randrange(1, len(frame) + 1)]
    elif kind == 4:
        frame += rng.randbytes(rng.randint(1, 200))
    error = rng.random() < 0.02
    pad = rng.random() < 0.9
    return bytes(frame), error, pad


def protect(frame, protected_qpn):
    """The frame, changed so that it cannot steer the protected QP (see the module's
    docstring); a change that spoils a checksum only makes the frame a drop."""
    frame = bytearray(frame)
    peer = parse_ipv4(PEER_IP).to_bytes(4, "big")
    other = parse_ipv4(OTHER_IP).to_bytes(4, "big")
    for at in (IP_SRC, CM_LOC_IP, ARP_SPA):
        if frame[at:at + 4] == peer:
            frame[at:at + 4] = other
    for at in (CM_REM_QPN + 1, BTH_DQPN):
        if int.from_bytes(frame[at:at + 3], "big") in (protected_qpn, CLOSE_ALL):
            frame[at:at + 3] = (protected_qpn + 7).to_bytes(3, "big")
    if len(frame) > CM_TXMETA:
        frame[CM_TXMETA] &= ~2
    return bytes(frame)


def liveness_probe(batch):
    """A probe from the peer, a ping or an ARP request by turns, and a test of a frame
    for its answer."""
    if batch % 2:
        def answers(frame):
            packet = Ether(frame)
            return (ICMP in packet and packet[ICMP].type == 0 and
                    (packet[ICMP].id, packet[ICMP].seq) == (0x7E57, batch))
        return bytes(ping(24, ident=0x7E57, seq=batch)), answers

    def answers(frame):
        packet = Ether(frame)
        return ARP in packet and packet[ARP].op == 2 and packet[ARP].pdst == PEER_IP
    return bytes(Ether(src=PEER_MAC, dst="ff:ff:ff:ff:ff:ff") /
                 ARP(op=1, hwsrc=PEER_MAC, psrc=PEER_IP, pdst=OUR_IP)), answers


def replies(frames):
    """The core's answers among frames (ARP replies aside): ICMP echo replies and UDP
    echo replies."""
    icmp = udp = 0
    for frame in frames:
        packet = Ether(frame)
        if ICMP in packet and packet[ICMP].type == 0:
            icmp += 1
        elif UDP in packet and packet[UDP].sport == 7:
            udp += 1
    return icmp, udp


def difference(after, before):
    """Counters (nested dicts) after minus before."""
    return {key: difference(value, before[key]) if isinstance(value, dict)
            else value - before[key] for key, value in after.items()}


def accounted(counters, *, icmp_replies, udp_replies, cm_replies, cm_naks, mad_replies):
    """Frames the counters and the replies account for: each frame is dropped and counted
    by exactly one layer, or taken (an ARP binding learnt, an acknowledgement, an RTU or
    a host's REJ that the passive CM acts on), or answered (``mad_replies``: the REPs and
    REJs from QP1, without those sent again on timeout); a reply dropped on its way out
    for its next hop counts as answered."""
    arp, icmp, cm, qp1 = counters["arp"], counters["icmp"], counters["cm"], counters["qp1"]
    ib = counters["ib_cm"]
    dropped = (sum(counters["eth"].values()) + sum(counters["ip"].values()) +
               sum(counters["udp"].values()) +
               arp["malformed"] + arp["ignored"] + arp["truncated"] +
               icmp["ignored"] + icmp["dropped"] + icmp["truncated"] +
               counters["udp_echo_dropped"] + sum(counters["roce_ack"].values()) +
               sum(qp1.values()) - qp1["received"] + ib["attribute"] + ib["unknown"] +
               # An OPEN_QP asking for a bad path MTU is answered NAK and counted malformed;
               # a REQ from outside the access list answered REJ 28 and counted access.
               sum(cm[reason] for reason in ConnectionManager.DROP_REASONS) - cm_naks -
               ib["rej_denied"])
    taken = arp["learnt"] + ib["established"] + ib["rejected_by_host"]
    answered = (icmp_replies + udp_replies + cm_replies + mad_replies - ib["rep_retransmitted"] +
                arp["unresolved"] + arp["unreachable"])
    return dropped + taken + answered


@cocotb.test()
async def mutated_frames_of_every_protocol(dut):
    dut._log.info("FUZZ_SEED=%d (%d frames)", SEED, FRAMES)
    rng = random.Random(SEED)
    bench = await start_roce(dut)
    bench.peers[OTHER_IP] = OTHER_MAC
    run = RoceRun(bench)
    host = Host(0x61, psn=0xABC, rkey=0x6161, base=0x40_0000, path_mtu=1024)
    qp = await open_qp(run, host, memory_size=1 << 16)
    corpus = templates(rng, qp.qpn)
    gsi = set(gsi_templates(rng))
    corpus += sorted(gsi) * 2

    def mutant(frame):
        if frame in gsi and rng.random() < 0.8:
            return mutate_gsi(frame, rng), rng.random() < 0.02, True
        return mutate(frame, rng)
    fuzz = [mutant(rng.choice(corpus)) for _ in range(FRAMES)]
    fuzz = [(protect(frame, qp.qpn), error, pad) for frame, error, pad in fuzz]

    baseline = bench.counters()
    asked_before = len(bench.arp_requests)
    sent = 0
    answers = []
    cm_answers = []
    for batch, first in enumerate(range(0, FRAMES, BATCH)):
        for frame, error, pad in fuzz[first:first + BATCH]:
            await bench.send(frame, error=error, pad=pad)
        sent += len(fuzz[first:first + BATCH])
        await bench.wait_sent()
        await bench.idle(300)
        answers += bench.received
        bench.received.clear()
        cm_answers += bench.cm_replies
        bench.cm_replies.clear()
        # The probe: a ping or an ARP request from the peer, answered within 5,000 cycles.
        probe, answers_probe = liveness_probe(batch)
        await bench.send(probe)
        sent += 1
        for _ in range(50):
            if any(answers_probe(frame) for frame in bench.received):
                break
            await bench.idle(100)
        assert any(answers_probe(frame) for frame in bench.received), (
            f"probe {batch} unanswered (FUZZ_SEED={SEED})")
        answers += bench.received
        bench.received.clear()

    # Let every ARP resolution run out, then account for every frame.
    await bench.idle((PARAMS["arp_retries"] + 1) * PARAMS["arp_retry_interval"] + 1000)
    answers += bench.received
    bench.received.clear()
    cm_answers += bench.cm_replies
    bench.cm_replies.clear()
    counters = difference(bench.counters(), baseline)
    # The bench's peers answer the core's ARP requests for them: frames in too.
    sent += sum(arp[ARP].pdst in bench.peers for arp in bench.arp_requests[asked_before:])
    icmp_replies, udp_replies = replies(answers)
    mad_replies = sum(BTH in Ether(frame) and Ether(frame)[BTH].opcode == ib_cm.UD_SEND_ONLY
                      for frame in answers)
    cm_naks = sum(Datagram.decode(bytes(Ether(frame)[UDP].payload)).ack == Ack.NAK
                  for frame in cm_answers)
    total = accounted(counters, icmp_replies=icmp_replies, udp_replies=udp_replies,
                      cm_replies=len(cm_answers), cm_naks=cm_naks, mad_replies=mad_replies)
    dut._log.info("%d frames: %d ICMP, %d UDP echo, %d CM replies (%d NAK) and %d MADs "
                  "from QP1; counters %s", sent, icmp_replies, udp_replies, len(cm_answers),
                  cm_naks, mad_replies, counters)
    assert counters["eth"]["overflow"] == 0, counters["eth"]
    assert total == sent, f"{sent} frames sent, {total} accounted for (FUZZ_SEED={SEED})"

    # The protected QP still runs, byte for byte.
    await start_run(run, qp, host, length=2000, count=6, write=True, immediate=True)
    await run.finish()
    bench.close()
