# amaranth: UnusedElaboratable=no
"""The Verilog the simulators get: every flip-flop has an initial value, as on the FPGA.

Yosys leaves the registers of memory read ports without one; Icarus (4-state) then starts
them at X, and X that a port's next address takes from its own data never clears (under
Icarus it would hold every timer of the reliability engine dead).

And the Verilator model: only the top module's signals are public."""

import re
import shutil
import subprocess

import pytest
from amaranth import *
from amaranth.lib import memory, wiring
from amaranth.lib.wiring import In, Out

from sim.runner import _installed_icarus_base, build, icarus_base, simulation_verilog


class Sweep(wiring.Component):
    """A sweep over a memory whose next address depends on the word it read, as the
    reliability engine's timer sweep does; and a plain synchronous read port."""

    o: Out(8)
    i_addr: In(3)
    o_data: Out(8)

    def elaborate(self, platform):
        m = Module()
        m.submodules.store = store = memory.Memory(shape=8, depth=8, init=[])
        write = store.write_port()
        sweep = store.read_port(transparent_for=(write,))
        plain = store.read_port()
        position = Signal(3)
        following = Mux(sweep.data[0], position, position + 1)
        m.d.sync += position.eq(following)
        m.d.comb += [sweep.addr.eq(following), self.o.eq(sweep.data),
                     plain.addr.eq(self.i_addr), self.o_data.eq(plain.data),
                     write.addr.eq(position), write.data.eq(position), write.en.eq(1)]
        return m


def test_every_register_starts_defined():
    text = simulation_verilog(Sweep(), "top")
    registers = re.findall(r"^\s+reg (?:\[\d+:0\] )?(\S+?)( = [^;]+)?;$", text, re.M)
    port_registers = [(name, init) for name, init in registers if re.fullmatch(r"_\d+_", name)]
    assert len(port_registers) >= 2, text
    assert all(init for _, init in port_registers), port_registers


def _chain(length: int) -> str:
    """Verilog of ``length`` flip-flops of one clock in a shift chain (scalar nets, as
    a netlist's), fed by bit 0 of a counter; it prints the last 8 after ``length + 40``
    cycles. The nodangle pass's compile time grows with ``length`` squared."""
    wires = "".join(f"  wire c{k};\n" for k in range(length + 1))
    stages = "".join(f"  FF f{k} (.C(clk), .D(c{k}), .Q(c{k + 1}));\n" for k in range(length))
    tail = ", ".join(f"c{k}" for k in range(length, length - 8, -1))
    return (f"module top;\n  reg clk = 0;\n  reg [15:0] count = 0;\n{wires}"
            f"  assign c0 = count[0];\n{stages}"
            f"  always #1 clk = ~clk;\n  always @(posedge clk) count <= count + 1;\n"
            f"  initial begin #{2 * (length + 40)} $display(\"tail %b\", {{{tail}}}); "
            f"$finish; end\nendmodule\n"
            "module FF (input C, input D, output reg Q);\n  initial Q = 0;\n"
            "  always @(posedge C) Q <= D;\nendmodule\n")


@pytest.mark.skipif(shutil.which("iverilog") is None,
                    reason="needs Icarus: apt-get install iverilog")
def test_icarus_base_leaves_out_only_nodangle_and_simulates_alike(tmp_path):
    """The design's meaning is the installed base's: the same output from a clock that
    drives 3,000 flip-flops (a chain that shifts a counter's bit 0)."""
    base = icarus_base()
    installed = _installed_icarus_base()
    ours = (base / "vvp.conf").read_text().splitlines()
    theirs = (installed / "vvp.conf").read_text().splitlines()
    assert "functor:nodangle" in theirs and "functor:nodangle" not in ours
    assert [line for line in theirs if line != "functor:nodangle"] == ours
    source = tmp_path / "chain.v"
    source.write_text(_chain(3000))
    outputs = []
    for extra in ([], ["-B", str(base)]):
        subprocess.run(["iverilog", "-g2005", *extra, "-o", str(tmp_path / "chain.vvp"),
                        str(source)], check=True)
        run = subprocess.run(["vvp", "-n", str(tmp_path / "chain.vvp")], check=True,
                             capture_output=True, text=True)
        outputs.append(run.stdout)
    assert "tail 01010101" in outputs[0] or "tail 10101010" in outputs[0], outputs[0]
    assert outputs[1] == outputs[0]


class Counter(wiring.Component):
    o: Out(8)

    def elaborate(self, platform):
        m = Module()
        hidden = Signal(8, name="hidden_count")
        m.d.sync += hidden.eq(hidden + 1)
        m.d.comb += self.o.eq(hidden)
        return m


class Wrapper(wiring.Component):
    """:class:`Counter` as a submodule, its output the top's port."""

    o: Out(8)

    def elaborate(self, platform):
        m = Module()
        m.submodules.counter = counter = Counter()
        m.d.comb += self.o.eq(counter.o)
        return m


def test_the_verilator_model_makes_only_the_top_modules_signals_public():
    """The benches reach the ports alone; a submodule's signals stay out of the model's
    public variables (the VPI's), so that Verilator may optimize them."""
    design = build("ports-public", Wrapper(), sim="verilator")
    symbols = (design.directory / "Vtop__Syms__Slow.cpp").read_text()
    public = re.findall(r'(\w+)->varInsert\("([^"]+)"', symbols)
    names = {name for _, name in public}
    assert {"clk", "rst", "o"} <= names, public
    assert not any("hidden_count" in name for name in names), public
    assert {scope for scope, _ in public} == {"__Vscopep_TOP", "__Vscopep_top"}, public
