# amaranth: UnusedElaboratable=no
"""The Verilog the simulators get: every flip-flop has an initial value, as on the FPGA.

Yosys leaves the registers of memory read ports without one; Icarus (4-state) then starts
them at X, and X that a port's next address takes from its own data never clears (under
Icarus it would hold every timer of the reliability engine dead)."""

import re

from amaranth import *
from amaranth.lib import memory, wiring
from amaranth.lib.wiring import In, Out

from sim.runner import simulation_verilog


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
