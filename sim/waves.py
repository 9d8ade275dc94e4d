"""Timing diagrams of the core's user-facing streams, from a simulation; ``python -m
sim.waves`` writes them to ``docs/generated/waves/`` as WaveDrom JSON.

A short run of :class:`~gateware.core.NetworkCore` in Amaranth's simulator, in the
reduced configuration the logic-depth tests synthesize (2 QPs, small rings; the ports
are the full core's): user logic writes QP 0 and QP 1 (``qp_write``), posts two RDMA
WRITEs on QP 0 with their payloads (``work_request``, ``payload``); the core resolves
the peer by ARP, sends, a responder model (``sim/models/responder.py``) acknowledges,
and the completions come out (``completion``, held for two cycles by user logic that
is not ready); then user logic reads QP 0's and QP 1's status (``qp_status_select`` →
``qp_status``, a cycle later); then the peer sends an OPEN_QP and a CLOSE_QP to the
connection manager, back to back, and the connection events come out (``connection``).
A recorder samples every port on each clock edge, as
the core sees it; each diagram shows a window of the cycles around its stream's
transfers, numbered from the start of the run.

A diagram per stream: the clock, ``valid`` and ``ready`` (``tvalid``/``tready`` on the
AXI-Stream ``payload``), and a few payload fields, shown while ``valid`` is high.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from amaranth.hdl import Value
from amaranth.sim import Simulator
from scapy.contrib.roce import BTH
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import ARP, Ether
from scapy.packet import Raw

from gateware.config import parse_ipv4
from gateware.core import NetworkCore
from gateware.roce.requests import CompletionStatus, ConnectionEvent, PathMtu, Verb
from host import protocol
from sim.models.responder import ConnectX, Responder

__all__ = ["CORE", "Field", "Diagram", "DIAGRAMS", "record", "wavedrom", "generate", "main"]

ROOT = Path(__file__).resolve().parent.parent
WAVES_DIR = ROOT / "docs" / "generated" / "waves"

#: The reduced core (``sim.bench.resources.SMALL_CORE``), with a clock slow enough that
#: the ARP and ACK timers do not matter in a short run.
CORE = {"qps": 2, "retransmit_beats": 128, "retransmit_pages": 4, "messages": 8,
        "generator_runs": 1, "rx_depth": 64, "echo_depth": 64, "clock_hz": 10_000_000}
WIDTH = 64
CORE_MAC, CORE_IP = "02:00:00:00:00:02", "10.77.0.2"
PEER_MAC, PEER_IP = "52:54:00:12:34:56", "10.77.0.1"
PEER_QPN, CORE_QPN = 0x11, 256
#: The host QP and buffer of the peer's OPEN_QP.
CM_HOST = protocol.QpInfo(qpn=0x22, psn=0x333, rkey=0xABCD, base_addr=0x7F00_0000_1000,
                          ip=PEER_IP)
ROUND_TRIP = 8              # cycles from a request packet's last beat to its ACK
PAYLOADS = (bytes(range(100)), bytes(range(64, 128)))   # two beats, then one
MAX_CYCLES = 2000


@dataclass(frozen=True)
class Field:
    """A signal of a diagram: ``name`` as shown, ``path`` to it from the core (dots
    for ports and struct fields), and ``show`` for its value as text: None for a
    one-bit wave (0/1)."""
    name: str
    path: str
    show: Callable[[int], str] | None = None


def _hex(value: int) -> str:
    return f"{value:x}"


def _bytes(count: int) -> Callable[[int], str]:
    """The first ``count`` bytes of a beat (lane 0 first), in hex."""
    return lambda value: (value & ((1 << 8 * count) - 1)).to_bytes(count, "little").hex() + "…"


def _keep(value: int) -> str:
    return f"{bin(value).count('1')} B"


def _verb(value: int) -> str:
    return Verb(value).name


@dataclass(frozen=True)
class Diagram:
    """A timing diagram: its file name, title, the port whose handshakes set the window
    (``valid`` and ``ready``; for a port without them, ``trigger``, whose changes set
    it), and its fields, grouped under ``group`` (shown while ``valid`` is high)."""
    name: str
    title: str
    valid: str | None
    ready: str | None
    fields: Sequence[Field]
    group: str = "payload"
    window_from: str | None = None      # a diagram whose window this one shares
    trigger: str | None = None


DIAGRAMS = [
    Diagram("work_request", "work_request: two RDMA WRITEs on QP 0", "work_request.valid",
            "work_request.ready", [
                Field("verb", "work_request.payload.verb", _verb),
                Field("qp", "work_request.payload.qp", str),
                Field("tag", "work_request.payload.tag", str),
                Field("length", "work_request.payload.length", str),
                Field("remote_address", "work_request.payload.remote_address", _hex)]),
    Diagram("payload", "payload: their 100 and 64 bytes (AXI-Stream, lane 0 first)",
            "payload.tvalid", "payload.tready", [
                Field("tdata[0:4]", "payload.tdata", _bytes(4)),
                Field("tkeep", "payload.tkeep", _keep),
                Field("tlast", "payload.tlast")], group="beat", window_from="work_request"),
    Diagram("completion", "completion: both WRITEs acknowledged (user logic not ready at "
            "first)", "completion.valid", "completion.ready", [
                Field("qp", "completion.payload.qp", str),
                Field("tag", "completion.payload.tag", str),
                Field("status", "completion.payload.status",
                      lambda value: CompletionStatus(value).name),
                Field("first_psn", "completion.payload.first_psn", _hex),
                Field("packets", "completion.payload.packets", str)]),
    Diagram("qp_write", "qp_write: QP 0 and QP 1 set by user logic", "qp_write.valid",
            "qp_write.ready", [
                Field("qp", "qp_write.payload.qp", str),
                Field("remote_qpn", "qp_write.payload.state.remote_qpn", _hex),
                Field("next_psn", "qp_write.payload.state.next_psn", _hex),
                Field("path_mtu", "qp_write.payload.state.path_mtu",
                      lambda value: PathMtu(value).name),
                Field("remote_ip", "qp_write.payload.state.remote_ip",
                      lambda value: ".".join(str(b) for b in value.to_bytes(4, "big")))]),
    Diagram("qp_status", "qp_status: QP 1, then QP 0, a cycle after the select", None,
            None, group="qp_status", trigger="qp_status_select", fields=[
                Field("qp_status_select", "qp_status_select", str),
                Field("error", "qp_status.error"),
                Field("outstanding", "qp_status.outstanding", str),
                Field("counters.packets", "qp_status.counters.packets", str),
                Field("counters.bytes", "qp_status.counters.bytes", str),
                Field("counters.acks", "qp_status.counters.acks", str)]),
    Diagram("connection", "connection: an OPEN_QP takes QP 0, a CLOSE_QP frees it",
            "connection.valid", "connection.ready", [
                Field("qp", "connection.payload.qp", str),
                Field("event", "connection.payload.event",
                      lambda value: ConnectionEvent(value).name),
                Field("base", "connection.payload.base", _hex),
                Field("state.rkey", "connection.payload.state.rkey", _hex),
                Field("state.remote_qpn", "connection.payload.state.remote_qpn", _hex)]),
]


def _signal(dut: NetworkCore, path: str):
    value = dut
    for part in path.split("."):
        value = getattr(value, part)
    return value


def _beats(payload: bytes) -> list[tuple[int, int, bool]]:
    chunks = [payload[at:at + WIDTH] for at in range(0, len(payload), WIDTH)] or [b""]
    return [(int.from_bytes(chunk, "little"), (1 << len(chunk)) - 1, index == len(chunks) - 1)
            for index, chunk in enumerate(chunks)]


def record() -> list[dict[str, int]]:
    """Runs the scenario; per cycle, the value of every path the diagrams name."""
    dut = NetworkCore(mac=CORE_MAC, ip=CORE_IP, **CORE)
    paths = sorted({path for diagram in DIAGRAMS
                    for path in [diagram.valid, diagram.ready, diagram.trigger,
                                 *(field.path for field in diagram.fields)] if path})
    signals = [Value.cast(_signal(dut, path)) for path in paths]
    trace: list[dict[str, int]] = []
    inbox: list[bytes] = []
    state = {"completions": 0, "cm_replies": 0}
    responder = Responder(mac=PEER_MAC, ip=PEER_IP, peer_mac=CORE_MAC, peer_ip=CORE_IP,
                          qpn=PEER_QPN, peer_qpn=CORE_QPN, expected_psn=0x100, rkey=0x77,
                          memory_base=0x1000, memory_size=256, path_mtu=1024,
                          connectx=ConnectX(round_trip=ROUND_TRIP))

    async def recorder(ctx):
        async for _, _, *values in ctx.tick().sample(*signals):
            trace.append(dict(zip(paths, values, strict=True)))

    async def mac_rx(ctx):
        rx = dut.rx
        while True:
            if not inbox:
                await ctx.tick()
                continue
            frame = inbox.pop(0)
            frame += bytes(max(0, 60 - len(frame)))
            for data, keep, last in _beats(frame):
                ctx.set(rx.tvalid, 1)
                ctx.set(rx.tdata, data)
                ctx.set(rx.tkeep, keep)
                ctx.set(rx.tlast, last)
                await ctx.tick()
            ctx.set(rx.tvalid, 0)

    async def mac_tx(ctx):
        tx = dut.tx
        ctx.set(tx.tready, 1)
        frame, cycle = b"", 0
        async for _, _, valid, data, keep, last in ctx.tick().sample(
                tx.tvalid, tx.tdata, tx.tkeep, tx.tlast):
            cycle += 1
            inbox.extend(responder.poll(cycle))
            if not valid:
                continue
            frame += int(data).to_bytes(WIDTH, "little")[:bin(keep).count("1")]
            if last:
                packet = Ether(frame)
                if ARP in packet and packet[ARP].op == 1:
                    inbox.append(bytes(Ether(src=PEER_MAC, dst=packet.src) / ARP(
                        op=2, hwsrc=PEER_MAC, psrc=PEER_IP, hwdst=packet.src,
                        pdst=packet[ARP].psrc)))
                elif BTH in packet:
                    responder.receive(frame, cycle)
                elif UDP in packet and packet[UDP].sport == protocol.CM_PORT:
                    state["cm_replies"] += 1
                frame = b""

    async def completions(ctx):
        completion = dut.completion
        ctx.set(completion.ready, 0)
        await ctx.tick().until(completion.valid)
        await ctx.tick().repeat(2)
        ctx.set(completion.ready, 1)
        async for _, _, valid in ctx.tick().sample(completion.valid):
            state["completions"] += int(valid)

    async def user(ctx):
        await ctx.tick().repeat(2)
        for qp in (0, 1):
            ctx.set(dut.qp_write.valid, 1)
            ctx.set(dut.qp_write.payload, {"qp": qp, "state": {
                "remote_qpn": PEER_QPN + qp, "next_psn": 0x100 * (qp + 1), "rkey": 0x77,
                "remote_ip": parse_ipv4(PEER_IP), "path_mtu": PathMtu.MTU_1024,
                "src_port": 0xC000 + qp, "timeout": 10, "retry_count": 7, "rnr_retry": 7}})
            await ctx.tick().until(dut.qp_write.ready)
        ctx.set(dut.qp_write.valid, 0)
        await ctx.tick().repeat(3)
        for tag, payload in enumerate(PAYLOADS, start=1):
            ctx.set(dut.work_request.valid, 1)
            ctx.set(dut.work_request.payload, {
                "verb": Verb.RDMA_WRITE, "qp": 0, "tag": tag, "length": len(payload),
                "remote_address": 0x1000 + 128 * (tag - 1), "immediate": 0})
            await ctx.tick().until(dut.work_request.ready)
            ctx.set(dut.work_request.valid, 0)
            for data, keep, last in _beats(payload):
                ctx.set(dut.payload.tvalid, 1)
                ctx.set(dut.payload.tdata, data)
                ctx.set(dut.payload.tkeep, keep)
                ctx.set(dut.payload.tlast, last)
                await ctx.tick().until(dut.payload.tready)
            ctx.set(dut.payload.tvalid, 0)
        for _ in range(MAX_CYCLES):
            if state["completions"] == len(PAYLOADS):
                break
            await ctx.tick()
        else:
            raise RuntimeError(f"{state['completions']} completions after {MAX_CYCLES} cycles")
        await ctx.tick().repeat(3)
        for qp in (1, 0):
            ctx.set(dut.qp_status_select, qp)
            await ctx.tick().repeat(3)
        await ctx.tick().repeat(10)
        # The peer opens a QP through the CM and closes it at once.
        ctx.set(dut.connection.ready, 1)
        for datagram in (protocol.open_qp(CM_HOST), protocol.close_qp(CORE_QPN, PEER_IP)):
            inbox.append(bytes(Ether(src=PEER_MAC, dst=CORE_MAC) / IP(src=PEER_IP, dst=CORE_IP)
                               / UDP(sport=40000, dport=protocol.CM_PORT)
                               / Raw(datagram.encode())))
        for _ in range(MAX_CYCLES):
            if state["cm_replies"] == 2:
                break
            await ctx.tick()
        else:
            raise RuntimeError(f"{state['cm_replies']} CM replies after {MAX_CYCLES} cycles")
        await ctx.tick().repeat(10)

    sim = Simulator(dut)
    sim.add_clock(1e-9)
    for testbench in (recorder, mac_rx, mac_tx, completions):
        sim.add_testbench(testbench, background=True)
    sim.add_testbench(user)
    sim.run()
    if bytes(responder.memory[:len(PAYLOADS[0])]) != PAYLOADS[0] or \
            bytes(responder.memory[128:128 + len(PAYLOADS[1])]) != PAYLOADS[1]:
        raise RuntimeError("the responder's memory does not hold the payloads")
    return trace


def window(trace: list[dict[str, int]], diagram: Diagram, *, before: int = 2,
           after: int = 3, least: int = 16, most: int = 24) -> range:
    """The cycles around the diagram's transfers (or changes, for a port without
    ``valid``): from ``before`` cycles ahead of the first to ``after`` past the last,
    at least ``least`` and at most ``most``."""
    if diagram.valid is not None:
        busy = [cycle for cycle, values in enumerate(trace) if values[diagram.valid]]
    else:
        busy = [cycle for cycle in range(1, len(trace))
                if trace[cycle][diagram.trigger] != trace[cycle - 1][diagram.trigger]]
    if not busy:
        raise RuntimeError(f"{diagram.name}: nothing happened in the run")
    start = max(0, busy[0] - before)
    stop = min(len(trace), max(busy[-1] + after + 1, start + least), start + most)
    return range(start, stop)


def _wave(values: list[str | None], data: list[str] | None) -> str:
    """WaveDrom wave string: a bit as 0/1, text as ``=`` (its text in ``data``), ``x``
    for None; ``.`` repeats the previous cycle."""
    wave, previous = "", object()
    for value in values:
        if value == previous:
            wave += "."
        elif value is None:
            wave += "x"
        elif data is None:
            wave += value
        else:
            wave += "="
            data.append(value)
        previous = value
    return wave


def wavedrom(trace: list[dict[str, int]], diagram: Diagram, cycles: range) -> dict:
    """The WaveDrom JSON of ``diagram`` over ``cycles`` of ``trace``."""
    rows = [trace[cycle] for cycle in cycles]
    signal: list = [{"name": "clk", "wave": "p" + "." * (len(rows) - 1)}]
    for name, path in (("valid", diagram.valid), ("ready", diagram.ready)):
        if path is not None:
            short = path.split(".")[-1]
            signal.append({"name": short if short.startswith("t") else name,
                           "wave": _wave([str(row[path]) for row in rows], None)})
    payload = []
    for field in diagram.fields:
        if field.show is None:
            shown = [str(row[field.path]) if diagram.valid is None or row[diagram.valid]
                     else None for row in rows]
            payload.append({"name": field.name, "wave": _wave(shown, None)})
            continue
        data: list[str] = []
        shown = [field.show(row[field.path]) if diagram.valid is None or row[diagram.valid]
                 else None for row in rows]
        payload.append({"name": field.name, "wave": _wave(shown, data), "data": data})
    signal += [{}, [diagram.group, *payload]]
    return {"signal": signal,
            "head": {"text": diagram.title, "tick": cycles.start},
            "config": {"hscale": 1}}


def generate(directory: Path = WAVES_DIR, trace: list[dict[str, int]] | None = None
             ) -> list[Path]:
    """Writes a JSON file per diagram of ``trace`` (by default the scenario, run now);
    returns their paths."""
    if trace is None:
        trace = record()
    windows: dict[str, range] = {}
    written = []
    for diagram in DIAGRAMS:
        cycles = window(trace, diagram)
        if diagram.window_from:
            shared = windows[diagram.window_from]
            cycles = range(min(shared.start, cycles.start), max(shared.stop, cycles.stop))
            cycles = range(cycles.start, min(cycles.stop, cycles.start + 24))
        windows[diagram.name] = cycles
        written.append(directory / f"{diagram.name}.json")
    directory.mkdir(parents=True, exist_ok=True)
    for diagram, path in zip(DIAGRAMS, written, strict=True):
        path.write_text(dumps(wavedrom(trace, diagram, windows[diagram.name])))
    return written


def dumps(document: dict) -> str:
    """WaveDrom JSON with a signal a line."""
    lines = [f'  {json.dumps(entry, ensure_ascii=False)}' for entry in document["signal"]]
    return ('{"signal": [\n' + ",\n".join(lines) + "\n],\n"
            f' "head": {json.dumps(document["head"], ensure_ascii=False)},\n'
            f' "config": {json.dumps(document["config"])}}}\n')


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.waves", description=__doc__.split(
        "\n\n")[0])
    parser.add_argument("--directory", type=Path, default=WAVES_DIR,
                        help="where the JSON goes (default: %(default)s)")
    args = parser.parse_args(argv)
    for path in generate(args.directory):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
