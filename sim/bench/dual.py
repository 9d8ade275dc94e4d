"""Both cores of the two-cage top at line rate at once: 4 KiB RDMA WRITEs on each port,
each port's core against its own ConnectX-like responder on its own 100GbE line. Prints
a table and writes it to ``docs/generated/bench/dual.{md,json}``; ``make bench``.

The design (:class:`DualCores`) is the core-domain part of each port of
:class:`~boards.vcu118_top.VCU118DualTop`, taken from an instance of it: each port's
core as the top builds it (its default build, 16 QPs, or with the build parameters
given) and its address writer
(:class:`~boards.board_address.BoardAddress`, switches off), so port 1 has the
core's default addresses and port 2 :data:`~boards.vcu118_top.PORT2_ADDRESS`. Both
cores run on one clock, the 322.265625 MHz of the CMAC's user clock, in which every
figure is counted (the board runs them at 250 MHz, whose 512-bit beats carry
128 Gb/s). It runs under Verilator (sim/bench/dual_runs.py, cocotb): the work
requests and their payloads go into each core's user port, and each core's MAC side
takes beats at the rate of a 100 Gb/s line (:class:`~sim.testbench.NetworkBench`);
the responder model in ConnectX mode (sim/models/responder.py) answers a round trip
later. Each port's goodput is its messages' bytes over the cycles its line was busy,
from its first beat to the end of its last frame; the total is both ports' bytes
over the cycles from the first port's first beat to the end of the last frame of
either. Theory: the payload over the line's bytes of the frames at 100 Gb/s
(:func:`~sim.bench.roce_goodput.theoretical_gbps`).
"""

import argparse
import json
import os
import sys
import tempfile
import warnings
from pathlib import Path

from amaranth import *
from amaranth.hdl import UnusedElaboratable
from amaranth.lib import wiring
from amaranth.lib.wiring import connect

from sim.bench import report
from sim.bench.report import Column, Table
from sim.bench.roce_goodput import message_frames, theoretical_gbps
from sim.build_options import add_build_arguments, build_arguments
from sim.models.responder import CLOCK_HZ, round_trip_cycles
from sim.runner import BUILD, ROOT, build, run, simulator, sources_digest

__all__ = ["DualCores", "port_row", "total_row", "dual_table", "main"]

LENGTH = PATH_MTU = 4096
MESSAGES = 256
ROUND_TRIP_US = 2
#: Each port's goodput, of its line's theory, that the bench asks for.
TARGET = 0.99


class DualCores(wiring.Component):
    """The core-domain part of each port of a two-cage top (``top``, a
    :class:`~boards.vcu118_top.VCU118DualTop`): port ``n``'s core, whose ports are
    this component's with ``p<n>_`` in front (every port of the core but ``config``),
    and its address writer, which writes the core's ``config`` after reset."""

    def __init__(self, top):
        self._ports = [top.port1, top.port2]
        super().__init__({
            f"{prefix}{name}": member
            for prefix, port in zip(self.prefixes, self._ports, strict=True)
            for name, member in port.core.signature.members.items() if name != "config"})

    @property
    def prefixes(self):
        return [f"p{n}_" for n in range(1, len(self._ports) + 1)]

    @property
    def addresses(self):
        """Each port's ``(mac, ip)`` as its address writer writes them (switches off)."""
        return [(port.address.addresses["mac"], port.address.addresses["ip"])
                for port in self._ports]

    def elaborate(self, platform):
        m = Module()
        for n, (prefix, port) in enumerate(zip(self.prefixes, self._ports, strict=True), 1):
            m.submodules[f"core{n}"] = core = port.core
            m.submodules[f"address{n}"] = address = port.address
            connect(m, address.o_config, core.config)
            m.d.comb += address.i_switches.eq(0)
            for name, member in core.signature.members.items():
                if name == "config":
                    continue
                outer, inner = getattr(self, prefix + name), getattr(core, name)
                if not member.is_port:
                    connect(m, wiring.flipped(outer), inner)
                elif member.flow == wiring.In:
                    m.d.comb += inner.eq(outer)
                else:
                    m.d.comb += outer.eq(inner)
        return m


def port_row(measured: dict) -> dict:
    """A port's row: what the run measured on it (``port``, ``ip``, ``messages``,
    ``length``, ``path_mtu``, ``line_cycles``, ...) and its goodput against the theory."""
    theory = theoretical_gbps(measured["length"], measured["path_mtu"])
    gbps = (measured["messages"] * measured["length"] * 8
            / (measured["line_cycles"] / CLOCK_HZ) / 1e9)
    return {**measured, "frame": message_frames(measured["length"], measured["path_mtu"])[0],
            "gbps": gbps, "theory_gbps": theory, "of_theory": gbps / theory}


def total_row(rows: list[dict]) -> dict:
    """Both ports: their bytes over the cycles from the first beat of either to the end
    of the last frame of either, against the sum of their theories; ``together``: the
    cycles both lines were busy at once over the longer port's."""
    starts = [row["first_cycle"] for row in rows]
    ends = [row["first_cycle"] + row["line_cycles"] for row in rows]
    cycles = max(ends) - min(starts)
    gbps = sum(row["messages"] * row["length"] for row in rows) * 8 / (cycles / CLOCK_HZ) / 1e9
    theory = sum(row["theory_gbps"] for row in rows)
    return {"port": "both", "ip": "", "messages": sum(row["messages"] for row in rows),
            "line_cycles": cycles, "gbps": gbps, "theory_gbps": theory,
            "of_theory": gbps / theory,
            "together": max(0, min(ends) - max(starts)) / max(row["line_cycles"]
                                                              for row in rows)}


def dual_table(measured: list[dict]) -> Table:
    """The table of a run: a row per port (``measured`` as :func:`port_row` takes it),
    then the total."""
    rows = [port_row(row) for row in measured]
    table = Table("dual", [
        Column("port", "port", align="left"), Column("ip", "address", align="left"),
        Column("messages", "messages"), Column("frame", "frame B"),
        Column("line_cycles", "cycles", ".0f"), Column("gbps", "Gb/s", ".2f"),
        Column("theory_gbps", "theory Gb/s", ".2f"), Column("of_theory", "of theory", ".2%"),
        Column("retransmitted", "resent"), Column("timeouts", "timeouts")])
    for row in rows:
        table.add(row)
    total = total_row(rows)
    table.add(total)
    first = measured[0]
    table.caption = (
        f"Both ports of the two-cage top at once: {first['length'] // 1024} KiB RDMA WRITEs, "
        f"path MTU {first['path_mtu']}, one QP a port, each port's core against its own "
        f"ConnectX-like responder (round trip {first['round_trip']} cycles, "
        f"{first['round_trip'] / CLOCK_HZ * 1e6:.0f} µs) on its own 100 Gb/s line; cycles "
        "of the 322.265625 MHz clock.")
    table.note = (f"Both lines busy at once for {total['together']:.2%} of the longer "
                  f"port's cycles. Target: each port ≥ {TARGET:.0%} of its line's theory.")
    return table


def meets_target(table: Table) -> bool:
    """Every port's goodput is at least :data:`TARGET` of its line's theory."""
    return all(row["of_theory"] >= TARGET for row in table.rows if row["port"] != "both")


def measure(design, ports: list[dict], messages: int, round_trip: int) -> list[dict]:
    with tempfile.TemporaryDirectory() as directory:
        results = Path(directory) / "dual.json"
        run(design, module="dual_runs", test_dir=Path(__file__).parent,
            params={"ports": ports, "messages": messages, "length": LENGTH,
                    "path_mtu": PATH_MTU, "round_trip": round_trip,
                    "results": str(results)})
        return json.loads(results.read_text())


def peer_ip(ip: str) -> str:
    """The peer's address on a port's subnet: the port's with last octet 1."""
    return ".".join([*ip.split(".")[:3], "1"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--writes", type=int, default=MESSAGES,
                        help="4 KiB RDMA WRITEs per port (default: %(default)s)")
    add_build_arguments(parser, "the board's")
    args = parser.parse_args()
    # Build parameters of both ports' cores, as `make bitstream QSFP=both` passes them.
    core = build_arguments(args)
    origin = report.provenance()
    from boards.vcu118_top import VCU118DualTop

    # The top and its ports' CMAC sides, which the design leaves out, are never elaborated.
    warnings.filterwarnings("ignore", category=UnusedElaboratable)

    addresses = DualCores(VCU118DualTop(**core)).addresses
    ports = [{"prefix": f"p{n}_", "mac": mac, "ip": ip, "peer_ip": peer_ip(ip),
              "peer_mac": f"52:54:00:12:34:{0x56 + n:02x}",
              "pcap": str(BUILD / "pcap" / f"bench-dual-port{n}.pcap")}
             for n, (mac, ip) in enumerate(addresses, 1)]
    print(f"Building both cores with {simulator()} (cached after the first run)...",
          flush=True)
    design = build("dual", lambda: DualCores(VCU118DualTop(**core)),
                   key=f"{sources_digest(ROOT / 'boards')} {core!r}")
    os.environ.setdefault("COCOTB_LOG_LEVEL", "WARNING")
    os.environ.setdefault("PYTHONWARNINGS", "ignore::DeprecationWarning")
    table = dual_table(measure(design, ports, args.writes, round_trip_cycles(ROUND_TRIP_US)))
    built = ", ".join(f"{name}={value}" for name, value in core.items())
    table.caption += (f" Each core: VCU118DualTop's with {built}." if core else
                      " Each core: VCU118DualTop's default build.")
    print(table.markdown())
    report.write("dual", [table], origin=origin)
    return 0 if meets_target(table) else 1


if __name__ == "__main__":
    sys.exit(main())
