"""The design converted without the zero contents of its large memories: only those lose
them, and the simulators' Verilog still starts them at zero."""

import re
import shutil
import subprocess

import pytest
from amaranth import Module
from amaranth.back import verilog
from amaranth.lib import memory, wiring
from amaranth.lib.wiring import In, Out

from gateware.conversion import large_memories_without_zero_init
from sim.runner import simulation_verilog

#: name: (contents, words, width); "table" is a Verilog keyword, so its name is escaped.
MEMORIES = {"listed": ([1, 2, 3], 16, 8), "small": ([], 4, 8), "storage": ([], 16, 8),
            "table": ([], 16, 1)}
#: The memories of more than 4 words and no contents but zeros.
LARGE_ZERO = {"storage", "table"}


class Memories(wiring.Component):
    """Each memory of :data:`MEMORIES` read at ``address`` into an output of its name."""

    def __init__(self):
        super().__init__({"address": In(4), **{f"o_{name}": Out(width)
                                               for name, (_, _, width) in MEMORIES.items()}})

    def elaborate(self, platform):
        m = Module()
        for name, (init, depth, width) in MEMORIES.items():
            m.submodules[name] = store = memory.Memory(shape=width, depth=depth, init=init)
            read = store.read_port(domain="comb")
            m.d.comb += [read.addr.eq(self.address), getattr(self, f"o_{name}").eq(read.data)]
        return m


def initialized(text):
    """``{memory: whether an initial block follows its declaration}``."""
    declared = re.compile(r"^  reg \[\d+:0\] \\?(\w+) +\[\d+:0\];\n(  initial begin)?", re.M)
    return {match[1]: bool(match[2]) for match in declared.finditer(text)}


def test_only_large_memories_of_zeros_lose_their_contents():
    with large_memories_without_zero_init(words=4):
        text = verilog.convert(Memories())
    assert initialized(text) == {name: name not in LARGE_ZERO for name in MEMORIES}
    # Outside it, Amaranth's back end is its own again.
    assert initialized(verilog.convert(Memories())) == dict.fromkeys(MEMORIES, True)


@pytest.mark.skipif(shutil.which("iverilog") is None,
                    reason="needs Icarus: apt-get install iverilog")
def test_the_simulators_verilog_starts_them_at_zero(tmp_path, monkeypatch):
    monkeypatch.setattr("gateware.conversion.LARGE_MEMORY_WORDS", 4)
    text = simulation_verilog(Memories(), "memories")
    assert "zero_memory" in text
    outputs = " ".join(f"o_{name}" for name in MEMORIES)
    reads = "".join(f"    address = {address}; #1 $display(\"%d %d %d %d\", "
                    f"{', '.join(f'o_{name}' for name in MEMORIES)});\n"
                    for address in range(16))
    bench = (f"module bench;\n  reg [3:0] address;\n  wire [7:0] {outputs.replace(' ', ', ')};\n"
             f"  memories dut (.address(address), "
             + ", ".join(f".o_{name}(o_{name})" for name in MEMORIES)
             + f");\n  initial begin\n{reads}  end\nendmodule\n")
    (tmp_path / "design.v").write_text(text + bench)
    subprocess.run(["iverilog", "-g2005", "-s", "bench", "-o", str(tmp_path / "bench.vvp"),
                    str(tmp_path / "design.v")], check=True)
    run = subprocess.run(["vvp", "-n", str(tmp_path / "bench.vvp")], check=True,
                         capture_output=True, text=True)
    rows = [[int(value) for value in line.split()] for line in run.stdout.splitlines()]
    listed = [1, 2, 3] + [0] * 13
    # (the small memory's 4 words repeat: its address is the low 2 bits)
    assert rows == [[listed[address], 0, 0, 0] for address in range(16)]
