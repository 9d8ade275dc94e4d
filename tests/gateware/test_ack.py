"""AckReceiver against acknowledgements and CNPs built by Scapy, the ACK captured from
Linux Soft-RoCE, and every kind of datagram it must drop."""

import random
import re
from collections import Counter

from amaranth import Signal
from amaranth.back import rtlil
from scapy.contrib.roce import AETH, BTH, CNP_OPCODE, CNPPadding
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from gateware.config import parse_ipv4
from gateware.roce.ack import AckReceiver
from gateware.roce.requests import FIRST_QPN

from ..rxe_vectors import RXE_ACKNOWLEDGE
from .streams import run_testbenches, to_beats, udp_delivery

WIDTH = 64
QPS = 64

def ack_frame(*, qpn, psn, syndrome=0x1F, msn=1, src="10.77.0.1", ip_id=7, corrupt=False,
              opcode=0x11, version=0, payload=b""):
    frame = (Ether(src="52:54:00:12:34:56", dst="02:00:00:00:00:02")
             / IP(src=src, dst="10.77.0.2", id=ip_id, flags="DF", ttl=64)
             / UDP(sport=0xDA25, dport=4791, chksum=0)
             / BTH(opcode=opcode, version=version, dqpn=qpn, psn=psn)
             / AETH(syndrome=syndrome, msn=msn)
             / Raw(payload))
    frame = bytes(frame)
    if corrupt:
        frame = frame[:-1] + bytes([frame[-1] ^ 0x40])
    return frame


def cnp_frame(*, qpn, corrupt=False, payload=b""):
    """A RoCEv2 CNP (BECN set, as ConnectX sends them), its ICRC by Scapy."""
    frame = bytes(Ether(src="52:54:00:12:34:56", dst="02:00:00:00:00:02")
                  / IP(src="10.77.0.1", dst="10.77.0.2", flags="DF", ttl=64, tos=0x02)
                  / UDP(sport=0xC001, dport=4791, chksum=0)
                  / BTH(opcode=CNP_OPCODE, dqpn=qpn, becn=1, psn=0)
                  / CNPPadding() / Raw(payload))
    if corrupt:
        frame = frame[:-1] + bytes([frame[-1] ^ 0x40])
    return frame


def run(cases, *, gaps, width=WIDTH):
    """Feed ``cases`` [(frame, expected event or None)]; return the events, the counters
    and the QPs of the CNPs."""
    dut = AckReceiver(qps=QPS, width=width)
    events = []
    cnps = []

    async def source(ctx):
        rng = random.Random(1)
        for frame, _ in cases:
            meta, payload = udp_delivery(frame)
            for beat_data, keep, last in to_beats(payload, width):
                while gaps and rng.random() < 0.3:
                    await ctx.tick()
                ctx.set(dut.i.valid, 1)
                ctx.set(dut.i.payload, {"data": beat_data, "keep": keep, "last": last,
                                        "meta": meta})
                await ctx.tick()
                ctx.set(dut.i.valid, 0)
        for _ in range(5):
            await ctx.tick()

    async def sink(ctx):
        async for _, _, valid, event, cnp, qp in ctx.tick().sample(
                dut.o.valid, dut.o.payload, dut.o_cnp.valid, dut.o_cnp.payload):
            if valid:
                events.append({name: int(getattr(event, name))
                               for name in ("qp", "src_ip", "psn", "syndrome", "msn")})
            if cnp:
                cnps.append(qp)

    counters = {}

    async def main(ctx):
        await source(ctx)
        for name in ("acks", "icrc_errors", "unsupported", "unknown_qp"):
            counters[name] = ctx.get(getattr(dut.o_counters, name))

    run_testbenches(dut, main, sink)
    return events, counters, cnps


def event(qpn, psn, syndrome=0x1F, msn=1, src="10.77.0.1"):
    return {"qp": qpn - FIRST_QPN, "src_ip": parse_ipv4(src),
            "psn": psn, "syndrome": syndrome, "msn": msn}


def test_soft_roce_ack_vector():
    events, counters, _ = run([(RXE_ACKNOWLEDGE, None)], gaps=False)
    assert events == [event(0x123, 0x1000, 0x1F, 1)]
    assert counters == {"acks": 1, "icrc_errors": 0, "unsupported": 0, "unknown_qp": 0}


def test_acks_naks_and_drops_back_to_back_and_with_gaps():
    rng = random.Random(3)
    good = []
    for _ in range(40):
        qpn = FIRST_QPN + rng.randrange(QPS)
        psn = rng.getrandbits(24)
        syndrome = rng.choice([0x1F, 0x00, 0x20 | rng.getrandbits(5), 0x60, 0x61, 0x62, 0x63])
        msn = rng.getrandbits(24)
        src = f"10.77.0.{rng.randrange(1, 250)}"
        good.append((ack_frame(qpn=qpn, psn=psn, syndrome=syndrome, msn=msn, src=src),
                     event(qpn, psn, syndrome, msn, src)))
    bad = {
        "icrc_errors": [ack_frame(qpn=FIRST_QPN, psn=5, corrupt=True)],
        "unknown_qp": [ack_frame(qpn=FIRST_QPN + QPS, psn=5), ack_frame(qpn=FIRST_QPN - 1,
                                                                        psn=5)],
        "unsupported": [ack_frame(qpn=FIRST_QPN, psn=5, opcode=0x04),          # SEND ONLY
                        ack_frame(qpn=FIRST_QPN, psn=5, version=1),
                        ack_frame(qpn=FIRST_QPN, psn=5, payload=bytes(4)),     # longer
                        ack_frame(qpn=FIRST_QPN, psn=5, payload=bytes(100))],  # two beats
    }
    cases = list(good)
    for frames in bad.values():
        for frame in frames:
            cases.insert(rng.randrange(len(cases) + 1), (frame, None))
    for gaps in (False, True):
        events, counters, _ = run(cases, gaps=gaps)
        assert events == [expected for _, expected in cases if expected is not None]
        assert counters == {"acks": len(good),
                            **{reason: len(frames) for reason, frames in bad.items()}}


def test_cnps_are_told_apart_from_acknowledgements():
    """A CNP for one of our QPs comes out on ``o_cnp`` (32 bytes after the UDP header: at
    beat widths 64 and 32, the least that holds one); a bad one is dropped like an
    acknowledgement, and neither is ``unsupported``."""
    cases = [(cnp_frame(qpn=FIRST_QPN + 9), None),
             (ack_frame(qpn=FIRST_QPN + 1, psn=7), event(FIRST_QPN + 1, 7)),
             (cnp_frame(qpn=FIRST_QPN), None),
             (cnp_frame(qpn=FIRST_QPN + 3, corrupt=True), None),
             (cnp_frame(qpn=FIRST_QPN + QPS), None),
             (cnp_frame(qpn=FIRST_QPN, payload=bytes(4)), None),
             (cnp_frame(qpn=FIRST_QPN + QPS - 1), None)]
    for width, gaps in ((WIDTH, False), (32, True)):
        events, counters, cnps = run(cases, gaps=gaps, width=width)
        assert events == [event(FIRST_QPN + 1, 7)]
        assert cnps == [9, 0, QPS - 1]
        assert counters == {"acks": 1, "icrc_errors": 1, "unsupported": 1, "unknown_qp": 1}


def test_the_icrc_check_is_in_the_rtlil_once():
    """Amaranth emits an expression again at each use, and again for each bit sliced out
    of it: the ICRC check's matrix products, reversed and compared, once made 14,800 cells
    (7,200 of them copies of the same 32-bit AND) out of some 400. No two cells of the
    receiver may compute the same thing from the same inputs but a few 1-bit ones."""
    receiver = AckReceiver(qps=QPS)
    ports = [port for _, _, port in receiver.signature.flatten(receiver)
             if isinstance(port, Signal)]            # not the always-ready streams' ready
    text = rtlil.convert(receiver, ports=ports)
    cells = Counter(re.sub(r"\n    connect \\Y .*", "", cell)
                    for cell in re.findall(r"^  cell \$\w+ \S+\n(?:    .*\n)*", text, re.M))
    copies = sum(count - 1 for count in cells.values())
    assert sum(cells.values()) < 1000
    assert copies <= 0.05 * sum(cells.values()), cells.most_common(3)
