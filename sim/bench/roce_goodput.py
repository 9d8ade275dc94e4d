"""RoCEv2 goodput from one QP, and from several at once: the transmit engine,
UDP, IPv4, ICRC and Ethernet framing fed by the built-in generator pool (through
the request arbiter, as in the core), measured in cycles at the MAC's 512-bit
bus. A responder ACKs every packet that asks for it 1 us later (a ConnectX-5's
round trip through a switch is about that), so the engine's retransmit ring and
message slots are in the loop. Prints a table; ``make bench``.

Two sinks: (a) always ready, which shows the engine's own rate and any idle
beat; (b) throttled to a 100GbE line: each frame costs its bytes plus 4 of FCS
and 20 of preamble and inter-frame gap at 100 Gb/s, against the CMAC's
322.265625 MHz user clock. Theoretical goodput is the payload over those line
bytes at 100 Gb/s.

Writes the tables and a plot of goodput against message size to
``docs/generated/bench/roce_goodput.{md,json,svg}``.
"""

import argparse
import sys

from amaranth import *
from amaranth.lib import data
from amaranth.lib.wiring import connect
from amaranth.sim import Simulator

from gateware.config import config_value
from gateware.core import CMAC_CLOCK_HZ
from gateware.eth.tx import EthernetTransmitter
from gateware.headers import BTH, ETHERNET, ETHERTYPE_IPV4, IPV4, RETH, UDP
from gateware.ip.tx import IPv4Transmitter
from gateware.roce.generator_pool import GeneratorPool
from gateware.roce.icrc import ICRC_BYTES, IcrcInserter
from gateware.roce.request_arbiter import RequestArbiter
from gateware.roce.requests import PathMtu, Verb
from gateware.roce.timers import ticks_at
from gateware.roce.tx import RequesterTransmitter
from gateware.stream import BEAT_BYTES
from gateware.udp.tx import UdpTransmitter
from sim.bench import report
from sim.bench.report import Column, Table

LINE_BITS_PER_SECOND = 100e9
LINE_OVERHEAD = 4 + 20                      # FCS, preamble and inter-frame gap
LINE_BYTES_PER_CYCLE = LINE_BITS_PER_SECOND / 8 / CMAC_CLOCK_HZ
SIZES = [64, 256, 1024, 4096, 16384, 65536, 262144, 1048576]
MANY_QPS = 4
ACK_DELAY = round(1e-6 * CMAC_CLOCK_HZ)    # cycles from a packet to its ACK
PEER_IP = 0x0A4D0001
REMOTE_QPN = 0x11                           # the peer's QPN of QP 0 (QP q: + q)


def frame_bytes(payload, first):
    """Bytes of a WRITE packet's Ethernet frame (no FCS)."""
    transport = BTH.length + (RETH.length if first else 0)
    return max(60, ETHERNET.length + IPV4.length + UDP.length + transport
               + payload + (-payload % 4) + ICRC_BYTES)


def message_frames(size, mtu):
    payloads = [min(mtu, size - offset) for offset in range(0, size, mtu)] or [0]
    return [frame_bytes(payload, index == 0) for index, payload in enumerate(payloads)]


def theoretical_gbps(size, mtu):
    line = sum(frame + LINE_OVERHEAD for frame in message_frames(size, mtu))
    return size / line * LINE_BITS_PER_SECOND / 1e9


class Chain(Elaboratable):
    """Generator pool → request arbiter (user logic idle) → transmit engine → UDP →
    IPv4 → ICRC → Ethernet (the ARP layer of the core, which only chooses the
    destination MAC, is left out)."""

    def __init__(self, qps):
        self.generator = GeneratorPool(qps=qps, runs=qps)
        self.requests = RequestArbiter(inputs=2)
        self.engine = RequesterTransmitter(qps=qps)
        self.udp = UdpTransmitter()
        self.ip = IPv4Transmitter()
        self.icrc = IcrcInserter()
        self.eth = EthernetTransmitter()

    def elaborate(self, platform):
        m = Module()
        m.submodules += [self.generator, self.requests, self.engine, self.udp, self.ip,
                         self.icrc, self.eth]
        config = config_value(mac="02:00:00:00:00:02", ip="10.77.0.2")
        connect(m, self.generator.o_request, self.requests.i_request[1])
        connect(m, self.generator.o_payload, self.requests.i_payload[1])
        connect(m, self.requests.o_request, self.engine.i_request)
        connect(m, self.requests.o_payload, self.engine.i_payload)
        connect(m, self.engine.o, self.udp.i)
        connect(m, self.udp.o, self.ip.i)
        connect(m, self.ip.o, self.icrc.i)
        m.d.comb += [
            self.engine.o_completion.ready.eq(1),
            self.engine.i_config.tos.eq(2),
            self.engine.i_config.tick.eq(ticks_at(CMAC_CLOCK_HZ)),
            self.ip.i_config.eq(config),
            self.eth.i_config.eq(config),
            self.eth.i.valid.eq(self.icrc.o.valid),
            self.icrc.o.ready.eq(self.eth.i.ready),
            self.eth.i.p.data.eq(self.icrc.o.p.data),
            self.eth.i.p.keep.eq(self.icrc.o.p.keep),
            self.eth.i.p.last.eq(self.icrc.o.p.last),
            self.eth.i.p.meta.dst_mac.eq(0x525400123456),
            self.eth.i.p.meta.ethertype.eq(ETHERTYPE_IPV4),
        ]
        return m


def measure(size, mtu, count, throttled, qps=1):
    """Runs of ``count`` messages on ``qps`` QPs at once: cycles from the first beat
    to the last (throttled: until the line has sent the last frame, its FCS and gap
    too), beats, and idle cycles inside messages (one QP only)."""
    chain = Chain(qps)
    out = chain.eth.o
    result = {"first": None, "last": None, "beats": 0, "idle_inside": 0, "frames": 0,
              "debt": 0.0}

    async def control(ctx):
        await ctx.tick()
        for qp in range(qps):
            ctx.set(chain.engine.i_qp_write.valid, 1)
            ctx.set(chain.engine.i_qp_write.p, {"qp": qp, "state": {
                "remote_qpn": REMOTE_QPN + qp, "next_psn": 0, "rkey": 1,
                "remote_ip": PEER_IP, "path_mtu": PathMtu.from_bytes(mtu),
                "src_port": 0xC000, "timeout": 1, "retry_count": 7, "rnr_retry": 7}})
            await ctx.tick().until(chain.engine.i_qp_write.ready)
        ctx.set(chain.engine.i_qp_write.valid, 0)
        for qp in range(qps):
            ctx.set(chain.generator.i_start.valid, 1)
            ctx.set(chain.generator.i_start.p, {"qp": qp, "verb": Verb.RDMA_WRITE,
                                                "length": size, "count": count, "divider": 0,
                                                "base": 0, "ring": 0})
            await ctx.tick()
        ctx.set(chain.generator.i_start.valid, 0)

    async def sink(ctx):
        frames_per_message = len(message_frames(size, mtu))
        credit, cycle, frames_in_message = 0.0, 0, 0
        ctx.set(out.ready, 1)
        async for _, _, valid, ready, keep, last in ctx.tick().sample(
                out.valid, out.ready, out.p.keep, out.p.last):
            if valid and ready:
                if result["first"] is None:
                    result["first"] = cycle
                result["beats"] += 1
                result["last"] = cycle
                credit -= bin(keep).count("1") + (LINE_OVERHEAD if last else 0)
                result["debt"] = max(0.0, -credit)
                if last:
                    result["frames"] += 1
                    frames_in_message = (frames_in_message + 1) % frames_per_message
            elif result["first"] is not None and frames_in_message and not valid:
                result["idle_inside"] += 1
            if throttled:
                credit = min(credit + LINE_BYTES_PER_CYCLE, BEAT_BYTES)
                ctx.set(out.ready, credit > 0)
            cycle += 1

    async def responder(ctx):
        """ACKs each AckReq packet the engine sends, ``ACK_DELAY`` cycles later."""
        engine = chain.engine
        due, cycle, first = [], 0, True
        async for _, _, valid, ready, beat, last in ctx.tick().sample(
                engine.o.valid, engine.o.ready, engine.o.p.data, engine.o.p.last):
            cycle += 1
            if valid and ready:
                if first:
                    wire = beat.to_bytes(BEAT_BYTES, "little")[:BTH.length]
                    bth = data.Const(BTH, int.from_bytes(wire, "big"))
                    if bth.ack_request:
                        due.append((cycle + ACK_DELAY, int(bth.dest_qp) - REMOTE_QPN,
                                    int(bth.psn)))
                first = bool(last)
            if due and due[0][0] <= cycle:
                _, qp, psn = due.pop(0)
                ctx.set(engine.i_ack.p, {"qp": qp, "src_ip": PEER_IP, "psn": psn,
                                         "syndrome": 0x1F, "msn": 0})
                ctx.set(engine.i_ack.valid, 1)
            else:
                ctx.set(engine.i_ack.valid, 0)

    sim = Simulator(chain)
    sim.add_clock(1 / CMAC_CLOCK_HZ)
    sim.add_testbench(sink, background=True)
    sim.add_testbench(responder, background=True)
    sim.add_testbench(control)
    expected_frames = qps * count * len(message_frames(size, mtu))

    async def done(ctx):
        while result["frames"] < expected_frames:
            await ctx.tick()
        await ctx.tick()
    sim.add_testbench(done)
    sim.run()
    cycles = result["last"] - result["first"] + 1
    if throttled:
        cycles += result["debt"] / LINE_BYTES_PER_CYCLE
    return cycles, result["beats"], result["idle_inside"]


def goodput_figure(table: Table):
    """Goodput of one QP against the message size, per path MTU: the line-throttled
    sink, the sink always ready, and the theory."""
    figure, axis = report.figure()
    for mtu, colour in ((4096, "tab:blue"), (1024, "tab:orange")):
        rows = [row for row in table.rows if row["mtu"] == mtu]
        sizes = [row["size"] for row in rows]
        axis.plot(sizes, [row["line_gbps"] for row in rows], "o-", color=colour,
                  label=f"PMTU {mtu}, 100GbE line")
        axis.plot(sizes, [row["free_gbps"] for row in rows], "s--", color=colour,
                  label=f"PMTU {mtu}, sink always ready")
        axis.plot(sizes, [row["theory_gbps"] for row in rows], ":", color="black",
                  label="line theory" if mtu == 4096 else None)
    axis.set_xscale("log", base=2)
    axis.set_xlabel("message (bytes)")
    axis.set_ylabel("goodput (Gb/s)")
    axis.set_title("RDMA WRITE goodput of one QP")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=7)
    figure.tight_layout()
    return figure


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=SIZES)
    parser.add_argument("--bytes", type=int, default=128 * 1024,
                        help="payload per row at least (default 128 KiB)")
    args = parser.parse_args()
    origin = report.provenance()
    clock_ghz = CMAC_CLOCK_HZ / 1e9
    one = Table("one_qp", [
        Column("mtu", "PMTU"), Column("size", "message"), Column("packets", "packets"),
        Column("beats_per_packet", "beats/packet", ".2f"), Column("free_gbps", "(a) Gb/s", ".1f"),
        Column("idle", "(a) idle in msgs"), Column("line_gbps", "(b) Gb/s", ".2f"),
        Column("theory_gbps", "theory Gb/s", ".2f"), Column("of_theory", "(b)/theory", ".2%")],
        caption="RDMA WRITE from one QP; goodput in Gb/s at the 322.27 MHz CMAC clock; "
                f"ACKs {ACK_DELAY} cycles (1 us) after their packet. (a): sink always ready; "
                "(b): sink throttled to a 100GbE line; theory: the payload over the line "
                "bytes at 100 Gb/s.")
    print(one.caption)
    print(one.header())
    for mtu in (4096, 1024):
        for size in args.sizes:
            count = max(1, min(256, args.bytes // max(size, 1)))
            packets = len(message_frames(size, mtu))
            cycles, beats, idle = measure(size, mtu, count, throttled=False)
            cycles_t, _, _ = measure(size, mtu, count, throttled=True)
            line = count * size * 8 * clock_ghz / cycles_t
            theory = theoretical_gbps(size, mtu)
            print(one.add({"mtu": mtu, "size": size, "packets": packets,
                           "beats_per_packet": beats / (count * packets),
                           "free_gbps": count * size * 8 * clock_ghz / cycles, "idle": idle,
                           "line_gbps": line, "theory_gbps": theory,
                           "of_theory": line / theory}), flush=True)
    worst = min([row["of_theory"] for row in one.rows if row["size"] >= 4096], default=1.0)
    idle_total = sum(row["idle"] for row in one.rows)
    one.note = (f"Worst (b)/theory for messages ≥ 4 KiB: {worst:.2%} (target ≥ 99.5%); "
                f"idle beats inside messages: {idle_total} (target 0).")
    print(f"\n{one.note}")

    many = Table("many_qps", [
        Column("size", "message"), Column("free_gbps", "(a) Gb/s", ".1f"),
        Column("line_gbps", "(b) Gb/s", ".2f"), Column("theory_gbps", "theory Gb/s", ".2f"),
        Column("of_theory", "(b)/theory", ".2%")],
        caption=f"{MANY_QPS} QPs at once, a generator run on each, merged message by message; "
                "RDMA WRITE, PMTU 4096.")
    print(f"\n{many.caption}")
    print(many.header())
    for size in (256, 4096, 65536):
        count = max(1, min(64, args.bytes // max(size, 1) // MANY_QPS))
        cycles, _, _ = measure(size, 4096, count, throttled=False, qps=MANY_QPS)
        cycles_t, _, _ = measure(size, 4096, count, throttled=True, qps=MANY_QPS)
        total = MANY_QPS * count * size * 8 * clock_ghz
        theory = theoretical_gbps(size, 4096)
        print(many.add({"size": size, "qps": MANY_QPS, "free_gbps": total / cycles,
                        "line_gbps": total / cycles_t, "theory_gbps": theory,
                        "of_theory": total / cycles_t / theory}), flush=True)
        if size >= 4096:
            worst = min(worst, total / cycles_t / theory)
    report.write("roce_goodput", [one, many], origin=origin, figures={
        "roce_goodput.svg": (goodput_figure(one), "RDMA WRITE goodput against message size")})
    return 0 if worst >= 0.995 and idle_total == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
