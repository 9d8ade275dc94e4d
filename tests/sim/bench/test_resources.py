"""The logic-depth budget of the board top, and how ``make resources`` counts paths per
clock domain.

The budget: the VCU118 top with the reduced core (``VCU118Top (2 QPs)``: every block of
the core, 2 QPs, small buffers) synthesized by Yosys as ``make resources`` does; no clock
domain may have a path with more LUT levels than :data:`MEASURED_LUT_LEVELS`, so a change
that deepens a path fails, nor a slower path in Yosys's delay model than
:data:`MEASURED_DELAY_NS`. Each domain is mapped to LUTs alone and for delay (as Vivado
times each clock against its own period), so neither a change in one clock's logic nor
the slowest adder of a domain can move the depth of another path.
Synthesis takes about 8 CPU-minutes with a native Yosys (Debian's 0.23, which ``make
test`` installs) and far more with the WebAssembly wheel, so the test needs a native one.
The README gives the design's budget: 6 on the CMAC clock, 8 in the core's."""

import json
import math
import re
import subprocess
from functools import partial
from random import Random

import pytest
from amaranth import Cat, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from sim.bench import resources
from sim.bench.resources import (
    LUT_LEVEL_BUDGET,
    TARGETS,
    SynthesisError,
    domain_depths,
    native_yosys_command,
    synthesize,
    worst_domain,
    worst_path_line,
    yosys_command,
    yosys_version,
)
from sim.runner import BUILD

#: The most LUT levels of a path into each domain's registers of the reduced board top,
#: per Yosys version (versions map the same design a level or so apart, and a change
#: anywhere can move a path by a level), as ``python -m sim.bench.resources "VCU118Top
#: (2 QPs)"`` prints them, each domain mapped alone for delay; 0.23 is Debian bookworm's.
#: Deepest (at 3459dfd): cmac, the transmit FIFO's read pointer (4; at e742d3b the store-and-
#: forward buffer's level into that FIFO's empty flag, 4); sync, the generator's
#: gate into its ``blocked`` flag (7; held at 8, the core's whole budget, as a change
#: anywhere can move a path by a level); init, the status UART's shift register (4) or,
#: as logic elsewhere moves the mapping, the receive-reset watchdog's countdown in
#: :class:`~boards.cmac_port.CmacPort` (5).
MEASURED_LUT_LEVELS = {"0.23": {"cmac": 4, "sync": 8, "init": 5}}

#: The delay of the slowest path into each domain of the reduced board top in Yosys's
#: timing model (ns), as the same run gives it, per Yosys version, so that a change that
#: makes a domain slower in the model fails (as one that deepens it does). The core's
#: domain is over its 4.0 ns (at e742d3b, 10 of its paths' ends): the ACK handler's
#: check of a message read from the ring (4.70), the resend walker's (4.54), both behind
#: a read of distributed RAM at 2 QPs. The CMAC's is within its 3.10 (3.07, into the
#: store-and-forward buffer's level; 3.37 in Amaranth's AsyncFIFO's pointers before).
MEASURED_DELAY_NS = {"0.23": {"cmac": 3.073, "sync": 4.699, "init": 2.871}}

#: How far a domain's figure may move when only other logic changed: abc9 maps a domain
#: alone, but from a netlist the whole design's coarse passes numbered and ordered, so its
#: choices move with them. The CMAC domain, whose logic did not change, went from 3.353 to
#: 3.487 ns between 3459dfd and c7d5294, which changed only the core's. Less than a LUT
#: and its wire (0.43 ns at the least), so a path a LUT longer still fails.
DELAY_JITTER_NS = 0.2


def board_synthesis(test):
    """A test of the board top's synthesis, which they share: on one pytest worker, and
    a ``synthesis`` test (``make test SYNTHESIS=1``)."""
    return pytest.mark.synthesis(pytest.mark.xdist_group("board-synthesis")(test))


@pytest.fixture(scope="module")
def reduced_board_top():
    try:
        yosys = native_yosys_command()
    except SynthesisError as error:
        pytest.skip(str(error))
    if yosys_version() not in MEASURED_LUT_LEVELS:
        pytest.skip(f"LUT levels measured with Yosys {', '.join(MEASURED_LUT_LEVELS)}, "
                    f"not {yosys_version()}: add its figures to MEASURED_LUT_LEVELS")
    name = "VCU118Top (2 QPs)"
    result = synthesize(name, TARGETS[name], yosys, BUILD / "resources-test", timeout=3600,
                        whole=False)
    assert result.error is None, result.error
    return result


@board_synthesis
def test_no_clock_domain_of_the_board_top_gets_deeper(reduced_board_top):
    result = reduced_board_top
    measured = MEASURED_LUT_LEVELS[yosys_version()]
    depths = {domain.name: domain for domain in result.domains}
    assert sorted(depths) == sorted(LUT_LEVEL_BUDGET)
    assert all(domain.flip_flops > 0 for domain in depths.values()), depths
    # The memories are block RAM and UltraRAM, not flip-flops.
    sync = json.loads((BUILD / "resources-test" / "sync.json").read_text())["modules"]["top"]
    assert any(cell["type"] in ("URAM288", "RAMB36E2") for cell in sync["cells"].values())
    over = {name: (domain.lut_levels, f"{domain.start} → {domain.end}")
            for name, domain in depths.items() if domain.lut_levels > measured[name]}
    assert not over, f"paths deeper than the budget {measured}: {over}"
    line = worst_path_line(worst_domain(result.domains))
    assert re.fullmatch(r"worst path: \d+ LUT levels at [\d.]+ MHz \(\w+, .+ → .+\)", line)


@board_synthesis
def test_no_clock_domain_of_the_board_top_gets_slower(reduced_board_top):
    measured = MEASURED_DELAY_NS[yosys_version()]
    slower = {domain.name: (domain.delay_ns, f"{domain.slow_start} → {domain.slow_end}")
              for domain in reduced_board_top.domains
              if domain.delay_ns > measured[domain.name] + DELAY_JITTER_NS}
    assert not slower, (f"slower in the delay model than measured {measured} "
                        f"(+{DELAY_JITTER_NS} ns): {slower}")


@board_synthesis
def test_the_cmac_clock_meets_its_budget(reduced_board_top):
    depths = {domain.name: domain for domain in reduced_board_top.domains}
    assert depths["cmac"].lut_levels <= LUT_LEVEL_BUDGET["cmac"]


class ThreeDomains(wiring.Component):
    """A register in each of the board top's domains behind an XOR tree: of 1296 inputs in
    sync, 36 in cmac, 6 in init (deepest in sync, shallowest in init)."""

    def __init__(self):
        super().__init__({"i": In(1296), "o_sync": Out(1), "o_cmac": Out(1), "o_init": Out(1)})

    def elaborate(self, platform):
        m = Module()
        for domain, inputs in (("sync", 1296), ("cmac", 36), ("init", 6)):
            register = Signal(name=f"{domain}_xor", reset_less=True)
            m.d[domain] += register.eq(self.i[:inputs].xor())
            m.d.comb += getattr(self, f"o_{domain}").eq(register)
        return m


@pytest.fixture(scope="module")
def three_domains(tmp_path_factory):
    """:class:`ThreeDomains` synthesized whole and each domain alone: (result, its files)."""
    try:
        yosys = yosys_command()
    except SynthesisError as error:
        pytest.skip(str(error))
    workdir = tmp_path_factory.mktemp("three-domains")
    result = synthesize("three domains", ThreeDomains, yosys, workdir, timeout=300,
                        each_domain=True)
    assert result.error is None, result.error
    return result, workdir


def test_paths_are_counted_in_the_domain_of_their_end(three_domains):
    result, workdir = three_domains
    module = json.loads((workdir / "netlist.json").read_text())["modules"]["top"]
    hz = {"cmac": 322e6, "sync": 250e6, "init": 125e6}
    depths = {d.name: d for d in domain_depths(module, result.paths, hz)}
    # A register and the output port it drives are one net: either name may be given.
    assert {name: (d.flip_flops, d.end in (f"{name}_xor", f"o_{name}"))
            for name, d in depths.items()} == {name: (1, True) for name in depths}
    assert depths["sync"].lut_levels > depths["cmac"].lut_levels > depths["init"].lut_levels >= 1
    # The worst path is the one with least room under its domain's budget.
    margins = {name: LUT_LEVEL_BUDGET[name] - d.lut_levels for name, d in depths.items()}
    worst = depths[min(margins, key=margins.get)]
    line = worst_path_line(worst_domain(list(depths.values())))
    assert line.startswith(f"worst path: {worst.lut_levels} LUT levels at "
                           f"{hz[worst.name] / 1e6:g} MHz ({worst.name}, i[")


@pytest.mark.parametrize("returncode, stderr, message", [
    (-9, "", "converting the design was killed by signal 9 (out of memory?)"),
    (1, "", "converting the design failed (1)"),
    (1, "Traceback …\nsim.bench.resources.SynthesisError: could not build the design: X\n",
     "could not build the design: X"),
])
def test_a_failed_conversion_is_an_error_that_says_why(monkeypatch, returncode, stderr,
                                                       message):
    # A conversion the kernel killed for its memory (the 256-QP core with 128 KiB rings
    # took over 21 GB) once came back as an error without words, which reads as success.
    monkeypatch.setattr(resources.subprocess, "run", lambda *args, **kwargs:
                        subprocess.CompletedProcess(args, returncode, "", stderr))
    result = synthesize("PacketGate", TARGETS["PacketGate"], ["yosys"], BUILD, timeout=1)
    assert result.error == message


def test_each_domain_is_mapped_alone(three_domains):
    """Each domain's map holds its own register and XOR tree, nothing of the others; its
    depth is at least that of a tree of 6-input LUTs (1296 = 6⁴ inputs in sync)."""
    result, workdir = three_domains
    depths = {d.name: d for d in result.domains}
    for domain, inputs in (("sync", 1296), ("cmac", 36), ("init", 6)):
        module = json.loads((workdir / f"{domain}.json").read_text())["modules"]["top"]
        kinds = [cell["type"] for cell in module["cells"].values()]
        assert sum(kind.startswith("FD") for kind in kinds) == depths[domain].flip_flops == 1
        luts = sum(bool(re.fullmatch(r"LUT\d", kind)) for kind in kinds)
        # An XOR of n inputs takes at least (n - 1) / 5 LUTs; at most twice that here.
        assert (inputs - 1) / 5 <= luts <= 2 * (inputs - 1) / 5 + 1, (domain, luts)
        assert depths[domain].lut_levels >= math.ceil(math.log(inputs, 6) - 1e-9)
        assert depths[domain].end in (f"{domain}_xor", f"o_{domain}")
    # A deeper tree is a slower path in the timing model too.
    assert depths["sync"].delay_ns > depths["cmac"].delay_ns > depths["init"].delay_ns > 0


class TwoPortDomains(wiring.Component):
    """A register behind an XOR tree in each domain of the two-cage top: each port's CMAC
    clock (``cmac1``: 36 inputs, ``cmac2``: 216), each port's core domain (``sync1``,
    ``sync2``: 6 inputs each) and ``init`` (6)."""

    WIDTHS = {"cmac1": 36, "cmac2": 216, "sync1": 6, "sync2": 6, "init": 6}

    def __init__(self):
        super().__init__({"i": In(216), **{f"o_{domain}": Out(1) for domain in self.WIDTHS}})

    def elaborate(self, platform):
        m = Module()
        for domain, inputs in self.WIDTHS.items():
            register = Signal(name=f"{domain}_xor", reset_less=True)
            m.d[domain] += register.eq(self.i[:inputs].xor())
            m.d.comb += getattr(self, f"o_{domain}").eq(register)
        return m


def test_the_two_cage_tops_domains_are_each_cmac_and_the_cores_clock(tmp_path):
    """Each port's CMAC clock is a domain with the budget of ``cmac``; the ports' core
    domains are one (on the board one clock drives both)."""
    try:
        yosys = yosys_command()
    except SynthesisError as error:
        pytest.skip(str(error))
    result = synthesize("two ports", TwoPortDomains, yosys, tmp_path, timeout=300,
                        each_domain=True, whole=False)
    assert result.error is None, result.error
    depths = {d.name: d for d in result.domains}
    assert list(depths) == ["cmac1", "cmac2", "sync", "init"]
    assert {name: (d.flip_flops, d.budget) for name, d in depths.items()} == {
        "cmac1": (1, LUT_LEVEL_BUDGET["cmac"]), "cmac2": (1, LUT_LEVEL_BUDGET["cmac"]),
        "sync": (2, LUT_LEVEL_BUDGET["sync"]), "init": (1, LUT_LEVEL_BUDGET["init"])}
    assert depths["cmac1"].hz == depths["cmac2"].hz > depths["sync"].hz
    assert depths["cmac2"].lut_levels > depths["cmac1"].lut_levels >= 2
    assert worst_domain(result.domains).name == "cmac2"


def test_a_finished_run_is_measured_again_without_yosys(three_domains, monkeypatch):
    result, workdir = three_domains
    text = (workdir / "design.il").read_text()
    monkeypatch.setattr(resources, "convert", lambda factory: (False, text))

    def no_yosys(*args, **kwargs):
        raise AssertionError("Yosys ran")
    monkeypatch.setattr(resources, "run_yosys", no_yosys)
    again = synthesize("three domains", ThreeDomains, ["yosys"], workdir, timeout=1,
                       each_domain=True, reuse=True)
    assert again.error is None, again.error
    assert (again.cells, again.lut_levels, again.domains) == \
        (result.cells, result.lut_levels, result.domains)
    # Another design's text is synthesized.
    monkeypatch.setattr(resources, "convert", lambda factory: (False, text + "\n"))
    with pytest.raises(AssertionError, match="Yosys ran"):
        synthesize("three domains", ThreeDomains, ["yosys"], workdir, timeout=1,
                   each_domain=True, reuse=True)


def test_a_board_top_fits_the_xcvu9p_when_each_resource_does():
    def board(name, luts, levels, delay_ns):
        result = resources.Result(name, cells={"LUT6": luts, "FDRE": 10, "RAMB36E2": 4,
                                               "URAM288": 2})
        result.domains = [resources.DomainDepth("cmac1", 322e6, 5, levels, "a", "b", 3.0),
                          resources.DomainDepth("sync", 250e6, 5, 8, "a", "b", delay_ns)]
        return result
    boards = [board("small", 1000, 6, 4.0), board("large", resources.XCVU9P["lut"] + 1, 7, 4.01)]
    fit = resources.fit_table(resources.table(boards), {b.name: b for b in boards})
    small, large = fit.rows
    assert small["lut"] == pytest.approx(1000 / 1_182_240)
    assert small["bram36"] == pytest.approx(4 / 2160) and small["uram"] == 2 / 960
    assert (small["fits"], small["within_budget"], small["within_period"]) == (True, True, True)
    assert (large["fits"], large["within_budget"], large["within_period"]) == \
        (False, False, False)
    assert "| large | 100.00% |" in fit.markdown()
    assert "**no** | **no** | **no** |" in fit.markdown()
    domains = resources.domain_table(boards).markdown()
    assert "| 3.00 | 3.11 |" in domains and "| 4.01 **over** | 4.00 |" in domains


def test_a_components_domain_is_reported_and_only_board_tops_fit_the_fpga(monkeypatch):
    """``--each-domain``: a component's mapped domain has its row and its worst path, and
    the table of the XCVU9P's shares holds board tops alone (none without one)."""
    monkeypatch.setattr(resources, "yosys_version", lambda: "0.23")
    component = resources.Result("engine", cells={"LUT6": 10})
    component.domains = [resources.DomainDepth("sync", 250e6, 5, 7, "a", "b", 5.3)]
    top = resources.Result("top", cells={"LUT6": 20}, board=True)
    top.domains = [resources.DomainDepth("sync", 250e6, 5, 8, "c", "d", 3.9)]
    _, domains, worst, fit = resources.report_tables([component, top])
    assert [row["target"] for row in domains.rows] == ["engine", "top"]
    assert [row["target"] for row in worst.rows] == ["engine", "top"]
    assert [row["target"] for row in fit.rows] == ["top"]
    assert len(resources.report_tables([component])) == 3


class OneLut(wiring.Component):
    """Two registers into an AND into a register, in sync: one LUT2 between registers."""

    def __init__(self):
        super().__init__({"a": In(1), "b": In(1), "o": Out(1)})

    def elaborate(self, platform):
        m = Module()
        a, b, o = (Signal(name=name, reset_less=True) for name in ("a_r", "b_r", "o_r"))
        m.d.sync += [a.eq(self.a), b.eq(self.b), o.eq(a & b)]
        m.d.comb += self.o.eq(o)
        return m


class SumAbove(wiring.Component):
    """Registers into a 32-bit sum compared with a constant, into a register, in sync:
    LUTs and two carry chains between registers."""

    def __init__(self):
        super().__init__({"a": In(32), "b": In(32), "o": Out(1)})

    def elaborate(self, platform):
        m = Module()
        a, b = Signal(32, name="a_r", reset_less=True), Signal(32, name="b_r", reset_less=True)
        o = Signal(name="o_r", reset_less=True)
        m.d.sync += [a.eq(self.a), b.eq(self.b), o.eq(a + b > 12345)]
        m.d.comb += self.o.eq(o)
        return m


def synthesize_sync(tmp_path, factory):
    """A design of one domain, ``sync``, mapped as a board top's domain: its
    :class:`~sim.bench.resources.DomainDepth` and its map's log."""
    try:
        yosys = native_yosys_command()
    except SynthesisError as error:
        pytest.skip(str(error))
    result = synthesize(factory.__name__, factory, yosys, tmp_path, timeout=300,
                        each_domain=True, whole=False)
    assert result.error is None, result.error
    [sync] = result.domains
    return sync, (tmp_path / "yosys-sync.log").read_text()


@pytest.fixture(scope="module")
def synthesized_sync(tmp_path_factory):
    """:func:`synthesize_sync` of a design, each design synthesized once."""
    made = {}

    def synthesized(factory):
        if factory not in made:
            made[factory] = synthesize_sync(tmp_path_factory.mktemp(factory.__name__), factory)
        return made[factory]
    return synthesized


def cell_delays(cells_sim: str, cell: str) -> list[int]:
    """The delays (ps) of a cell's timing arcs (``(A => B) = N;``), from Yosys's models."""
    body = re.search(rf"^module {cell}\b.*?^endmodule", cells_sim, re.MULTILINE | re.DOTALL)[0]
    return [int(value) for value in re.findall(r"=>[^;]*\)\s*=\s*(\d+);", body)]


def test_the_model_delay_of_one_lut_between_registers(synthesized_sync):
    """A register → LUT2 → register path takes what the model says, worked out from the
    cells' ``specify`` blocks: the flip-flop's clock to output, the wire into the LUT
    (abc9's ``-W``), the LUT's slower input."""
    sync, log = synthesized_sync(OneLut)
    assert (sync.lut_levels, sync.slow_end) == (1, sync.end)
    assert sync.end in ("o_r", "o") and sync.slow_start in ("a_r", "b_r")
    cells_sim = resources.cell_library(log).read_text()
    clock_to_q = max(cell_delays(cells_sim, "FDRE"))
    wire = int(re.search(r"&if -W (\d+)", log)[1])
    lut = max(cell_delays(cells_sim, "LUT2"))
    assert (clock_to_q, wire, lut) == (303, 300, 238)     # Artix-7 figures, Yosys 0.23
    assert sync.delay_ns == pytest.approx((clock_to_q + wire + lut) / 1000)
    assert sync.within_period


@pytest.mark.parametrize("factory", [OneLut, SumAbove])
def test_the_model_delay_is_abc9s_own_where_it_sees_the_whole_path(synthesized_sync, factory):
    """On a design of one domain abc9 maps nothing but the domain's paths, so its
    arrival time for the mapping (``Del``) is the slowest path's; the figure computed
    from the cells' arcs on the mapped netlist is the same, carries included."""
    sync, log = synthesized_sync(factory)
    [abc9] = re.findall(r"^ABC: D:\s+Del =\s*([\d.]+)\.", log, re.MULTILINE)
    assert sync.delay_ns == pytest.approx(float(abc9) / 1000)
    if factory is SumAbove:
        assert sync.delay_ns > 2.5                          # a LUT and two carry chains


class LogicBesideAdder(wiring.Component):
    """In sync: 32 registers behind a random network of 300 two-input gates over 48 inputs
    (``fast``), and, with ``adder``, a register behind a 96-bit sum compared with a 96-bit
    value, whose carry chains make it the domain's slowest path (``sum_above``); a
    register behind a 6-input XOR in cmac and in init."""

    def __init__(self, adder):
        self._adder = adder
        super().__init__({"a": In(96), "b": In(96), "s": In(48), "o_fast": Out(32),
                          "o_sync": Out(1), "o_cmac": Out(1), "o_init": Out(1)})

    def elaborate(self, platform):
        m = Module()
        random = Random(1)
        nodes = list(self.s)
        for index in range(300):
            left, right = random.sample(nodes[-60:], 2)
            # Each gate a signal of its own, so that the RTLIL holds each once.
            node = Signal(name=f"gate_{index}")
            m.d.comb += node.eq(random.choice([left & right, left | right, left ^ right]))
            nodes.append(node)
        fast = Signal(32, name="fast")
        sum_above = Signal(name="sum_above")
        m.d.sync += fast.eq(Cat(nodes[-32:]))
        if self._adder:
            m.d.sync += sum_above.eq(self.a + self.b > Cat(self.a[48:], self.b[:48]))
        m.d.comb += [self.o_fast.eq(fast), self.o_sync.eq(sum_above)]
        for domain in ("cmac", "init"):
            register = Signal(name=f"{domain}_xor")
            m.d[domain] += register.eq(self.s[:6].xor())
            m.d.comb += getattr(self, f"o_{domain}").eq(register)
        return m


def test_a_path_is_as_deep_beside_a_slower_one_as_alone(tmp_path):
    """Each domain is mapped for delay: a path's LUT levels do not grow to fill the time
    of the domain's slowest path (with area recovery, abc9 mapped the gates 7 levels deep
    alone and 11 beside the adder)."""
    try:
        yosys = yosys_command()
    except SynthesisError as error:
        pytest.skip(str(error))
    found = {}
    for adder in (False, True):
        result = synthesize(f"logic beside an adder: {adder}", partial(LogicBesideAdder, adder),
                            yosys, tmp_path / str(adder), timeout=300, each_domain=True,
                            whole=False)
        assert result.error is None, result.error
        [sync] = [domain for domain in result.domains if domain.name == "sync"]
        found[adder] = sync
    alone, beside = found[False], found[True]
    assert beside.end == alone.end == "fast"
    assert beside.lut_levels == alone.lut_levels
    # The adder is mapped, to carry chains of 4 bits a cell.
    module = json.loads((tmp_path / "True" / "sync.json").read_text())["modules"]["top"]
    carries = sum(cell["type"] == "CARRY4" for cell in module["cells"].values())
    assert carries >= 96 // 4


def test_the_resources_table_counts_cells_and_shows_a_failure():
    done = resources.Result("Block", cells={"LUT6": 3, "INV": 1, "FDRE": 5, "RAMB36E2": 1,
                                            "RAMB18E2": 1, "RAM64M": 2, "CARRY4": 2},
                            depth_cells=4, ltp_cells=6, lut_levels=2, seconds=1.25)
    failed = resources.Result("Broken", error="Yosys ran out of time", seconds=30)
    table = resources.table([done, failed])
    lines = table.markdown().splitlines()
    assert lines[2] == "| Block | 4 | 5 | 1.5 | 0 | 8 | 0 | 2/0 | 0 | 4 (ltp 6) | 2 | 1.2 |"
    assert lines[3] == "| Broken | failed (below) |  |  |  |  |  |  |  |  |  | 30.0 |"
    assert table.find(target="Block")["bram36"] == 1.5
