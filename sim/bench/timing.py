"""Path delays of a mapped Xilinx netlist in Yosys's timing model: where a clock domain's
slowest path runs and how long it takes, for :mod:`sim.bench.resources`.

The model is the one ``synth_xilinx -abc9`` maps against: the timing arcs in the
``specify`` blocks of Yosys's ``xilinx/cells_sim.v`` (Artix-7 figures from Project
X-Ray; Yosys has none for UltraScale+) and 300 ps of wire before each LUT input
(abc9's ``-W``; abc9 adds none before a carry or wide multiplexer, whose arcs hold
their routing), here also before a distributed RAM's read address. A path starts at a
clock edge (a flip-flop's clock to output, 303 ps) and ends at a register's input, with
no setup time. Where abc9 sees the whole path, the figure is abc9's own.

The UltraScale+ cells of ``-family xcup`` that have no arcs there take those of their
7-series kin: ``RAM64M8`` and ``RAM32M16`` read as ``RAM64M`` and ``RAM32M`` do (abc9
itself sees no path through them: its figure stops at their address and starts again at
their output). Block RAM, UltraRAM and DSP outputs have no arc in the model and start
their paths at 0.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from functools import cache
from pathlib import Path

__all__ = ["WIRE_PS", "Arcs", "SlowestPath", "cell_arcs", "path_ends", "slowest_paths"]

#: abc9's wire delay for the 7-series model (``&if -W 300`` in its log), in ps.
WIRE_PS = 300

#: The UltraScale+ distributed RAMs and the 7-series cell whose read arcs they take, by
#: the letter-for-letter renaming of their ports (``ADDRE`` reads as ``ADDRA``).
KIN = {"RAM64M8": "RAM64M", "RAM32M16": "RAM32M"}


@dataclass(frozen=True)
class Arcs:
    """A cell type's timing: combinational arcs ``(input, output) → ps``, clock-edge
    arcs ``output → ps`` (its clock to that output) and the inputs sampled on a clock
    (``$setup`` checks: a path ends there), bits named ``PORT`` or ``PORT[i]``."""
    through: dict[tuple[str, str], int]
    from_clock: dict[str, int]
    sampled: frozenset[str] = frozenset()


_SPECIFY = re.compile(r"^module\s+(\w+)\b.*?^endmodule", re.MULTILINE | re.DOTALL)
_SETUP = re.compile(r"\$setup\s*\(\s*([\w\[\]]+)\s*,")
_ARC = re.compile(r"\(\s*(posedge\s+|negedge\s+)?([\w\[\]]+)\s*\*?=>\s*"
                  r"\(?\s*([\w\[\]]+)[^)]*\)?\s*\)\s*=\s*([\d\s+]+);")


@cache
def library_arcs(path: Path) -> dict[str, Arcs]:
    """Every cell type's arcs in a ``cells_sim.v``."""
    text = re.sub(r"/\*.*?\*/|//[^\n]*", "", path.read_text(), flags=re.DOTALL)
    cells = {}
    for module in _SPECIFY.finditer(text):
        through, from_clock = {}, {}
        for edge, source, sink, value in _ARC.findall(module[0]):
            ps = sum(int(term) for term in value.split("+") if term.strip())
            if edge:
                from_clock[sink] = max(from_clock.get(sink, 0), ps)
            else:
                through[source, sink] = max(through.get((source, sink), 0), ps)
        cells[module[1]] = Arcs(through, from_clock, frozenset(_SETUP.findall(module[0])))
    return cells


def cell_arcs(library: dict[str, Arcs], kind: str) -> Arcs:
    """The arcs of a cell type, or of its 7-series kin (:data:`KIN`) for any port letter."""
    if kind not in KIN:
        return library.get(kind, Arcs({}, {}))
    kin = library[KIN[kind]]
    through = {}
    for port in "ABCDEFGH":
        for (source, sink), ps in kin.through.items():
            if source.startswith("ADDRA"):
                through[source.replace("ADDRA", f"ADDR{port}", 1),
                        sink.replace("DOA", f"DO{port}", 1)] = ps
    from_clock = {sink.replace("DOA", f"DO{port}", 1): ps
                  for port in "ABCDEFGH" for sink, ps in kin.from_clock.items()
                  if sink.startswith("DOA")}
    sampled = {re.sub(r"^(ADDR|DI)A", rf"\g<1>{port}", bit)
               for port in "ABCDEFGH" for bit in kin.sampled} | {"WE"}
    return Arcs(through, from_clock, frozenset(sampled))


@dataclass
class SlowestPath:
    """The slowest path into a register input or output port: its arrival in ns, where
    it starts (a register's output or an input port) and the end's clock bit (None for
    an output port)."""
    ns: float
    start: str
    end: str
    clock: int | None


def _bit_name(port: str, index: int, width: int) -> str:
    return f"{port}[{index}]" if width > 1 else port


def _cell_name(cell_name: str, cell: dict, names: dict[int, str]) -> str:
    """A cell named by its (first) output's net, or by its type where synthesis dropped
    the name."""
    out = next((bit for port, bits in cell["connections"].items()
                if cell["port_directions"][port] == "output" for bit in bits), None)
    name = re.sub(r"\[\d+\]$", "", names.get(out, "$"))
    return f"a {cell['type']} ({cell_name.rsplit('$', 1)[-1]})" if name.startswith("$") \
        else name


def path_ends(module: dict, names: dict[int, str], sequential,
              clock_of) -> dict[int, tuple[str, int | None]]:
    """Where paths end: each output port's bits, and each input bit of a sequential
    cell, named by the cell's output (or its type where synthesis dropped the name),
    with the clock bit it is sampled on (None for a port)."""
    ends: dict[int, tuple[str, int | None]] = {}
    for name, port in module["ports"].items():
        if port["direction"] == "output":
            ends.update((bit, (name, None)) for bit in port["bits"] if isinstance(bit, int))
    for cell_name, cell in module["cells"].items():
        if not sequential(cell["type"]):
            continue
        connections, directions = cell["connections"], cell["port_directions"]
        name = _cell_name(cell_name, cell, names)
        for port, bits in connections.items():
            if directions[port] == "input":
                clock = clock_of(cell, port)
                ends.update((bit, (name, clock)) for bit in bits
                            if isinstance(bit, int) and bit not in ends)
    return ends


def slowest_paths(module: dict, library: dict[str, Arcs], sequential, clock_of,
                  names: dict[int, str]) -> list[SlowestPath]:
    """Per end (a sequential cell's input named by the cell's output, or an output port),
    the slowest path into it, slowest first. ``sequential(kind)`` tells the cells that
    start and end paths (their clock arcs start them), ``clock_of(cell, port)`` the
    clock bit of a sequential cell's input, ``names`` a name per net bit."""
    arrival: dict[int, float] = {}
    origin: dict[int, str] = {}
    # Bits a clock edge drives (a register's output, a distributed RAM's data after a
    # write): ps from the edge. The combinational arcs, per driven bit: [(input bit, ps
    # with the wire)]. Inputs sampled on a clock that are not a sequential cell's.
    launch: dict[int, int] = {}
    fanin: dict[int, list[tuple[int, int]]] = defaultdict(list)
    sampled: list[tuple[str, dict, int]] = []
    arcs_of: dict[str, Arcs] = {}
    for cell_name, cell in module["cells"].items():
        kind, connections = cell["type"], cell["connections"]
        directions = cell["port_directions"]
        if kind not in arcs_of:
            arcs_of[kind] = cell_arcs(library, kind)
        arcs = arcs_of[kind]
        bits = {_bit_name(port, index, len(values)): value
                for port, values in connections.items() for index, value in enumerate(values)}
        for sink, ps in arcs.from_clock.items():
            bit = bits.get(sink)
            if isinstance(bit, int):
                launch[bit] = max(launch.get(bit, 0), ps)
        if sequential(kind):
            for port, values in connections.items():
                if directions[port] == "output":
                    launch.update((bit, launch.get(bit, 0)) for bit in values
                                  if isinstance(bit, int))
            continue
        sampled += [(cell_name, cell, bit) for name, bit in bits.items()
                    if isinstance(bit, int) and directions.get(name.split("[")[0]) == "input"
                    and (name in arcs.sampled or name.split("[")[0] in arcs.sampled)]
        for (source, sink), ps in arcs.through.items():
            source_bit, sink_bit = bits.get(source), bits.get(sink)
            if isinstance(sink_bit, int) and isinstance(source_bit, int):
                # abc9 adds its wire to LUT inputs only.
                wire = 0 if kind.startswith(("CARRY", "MUXF")) \
                    else WIRE_PS
                fanin[sink_bit].append((source_bit, ps + wire))

    # Longest arrival by depth-first search over the drivers (the netlist has no
    # combinational loop: :func:`~sim.bench.resources.depth` checks).
    def settle(bit: int) -> float:
        stack = [(bit, False)]
        while stack:
            current, expanded = stack.pop()
            if current in arrival:
                continue
            if not expanded:
                stack.append((current, True))
                stack.extend((source, False) for source, _ in fanin.get(current, ())
                             if source not in arrival)
                continue
            best, start = launch.get(current, 0), names.get(current, str(current))
            for source, ps in fanin.get(current, ()):
                if arrival[source] + ps > best:
                    best, start = arrival[source] + ps, origin[source]
            arrival[current], origin[current] = best, start
        return arrival[bit]

    ends = path_ends(module, names, sequential, clock_of)
    for cell_name, cell, bit in sampled:
        # A distributed RAM's write or a shift register's input: named by its data out.
        ends.setdefault(bit, (_cell_name(cell_name, cell, names), clock_of(cell, "WE")))
    worst: dict[tuple[str, int | None], tuple[float, str]] = {}
    for bit, end in ends.items():
        ps = settle(bit)
        if ps > worst.get(end, (-1.0, ""))[0]:
            worst[end] = (ps, origin[bit])
    return sorted((SlowestPath(ps / 1000, start, name, clock)
                   for (name, clock), (ps, start) in worst.items()),
                  key=lambda path: (path.ns, path.end), reverse=True)
