"""The timing model of ``make resources``: the cells' arcs as read from a ``specify``
block, and the slowest path through a small netlist worked out by hand."""

import pytest

from sim.bench import timing
from sim.bench.timing import WIRE_PS, cell_arcs, library_arcs, slowest_paths

CELLS = """
module FDRE (output reg Q, input C, CE, D, R);
  specify
    $setup(D , posedge C &&& CE, /*-46*/ 0); // Negative times not currently supported
    if (CE) (posedge C => (Q : D)) = 303;
  endspecify
endmodule
module LUT2 (output O, input I0, I1);
  specify
    (I0 => O) = 238;
    (I1 => O) = 127;
  endspecify
endmodule
module MUXF7 (output O, input I0, I1, S);
  specify
    (I0 => O) = 642 + 223 /* to cross F7BMUX */ + 174 /* CMUX */;
    (S => O) = 296;
  endspecify
endmodule
module RAM64M (output DOA, DOB, input [5:0] ADDRA, ADDRB, input DIA, DIB, WCLK, WE);
  specify
    $setup(DIA, posedge WCLK &&& WE, 384);
    if (WE) (posedge WCLK => (DOA : DIA)) = 1153;
    (ADDRA[0] => DOA) = 642; (ADDRB[0] => DOB) = 642;
    (ADDRA[5] => DOA) = 127;
  endspecify
endmodule
"""


@pytest.fixture
def library(tmp_path):
    path = tmp_path / "cells_sim.v"
    path.write_text(CELLS)
    return library_arcs(path)


def test_arcs_are_read_with_their_sums_edges_and_setups(library):
    assert library["LUT2"].through == {("I0", "O"): 238, ("I1", "O"): 127}
    assert library["MUXF7"].through == {("I0", "O"): 642 + 223 + 174, ("S", "O"): 296}
    assert library["FDRE"].from_clock == {"Q": 303} and library["FDRE"].sampled == {"D"}
    assert library["RAM64M"].from_clock == {"DOA": 1153}
    assert library["RAM64M"].through[("ADDRA[5]", "DOA")] == 127


def test_an_ultrascale_ram_reads_as_its_7_series_kin_on_every_port(library):
    arcs = cell_arcs(library, "RAM64M8")
    assert arcs.through[("ADDRH[0]", "DOH")] == arcs.through[("ADDRA[0]", "DOA")] == 642
    assert arcs.through[("ADDRE[5]", "DOE")] == 127
    assert arcs.from_clock["DOG"] == 1153 and {"DIC", "WE"} <= arcs.sampled
    assert cell_arcs(library, "URAM288") == timing.Arcs({}, {})


def cell(kind, directions, connections):
    return {"type": kind, "port_directions": directions, "connections": connections}


def sequential(kind):
    return kind == "FDRE"


def clock_of(cell, port):
    return cell["connections"].get("C", cell["connections"].get("WCLK"))[0]


def test_the_slowest_path_by_hand(library):
    """Registers a (bit 3) and b (4) into a LUT2 (5), and a into a MUXF7's select with the
    LUT's output on I0 (6), into register o (7); a distributed RAM read at LUT2's output
    (8), written from o. The slowest into o: 303 + W + 238 (LUT2's I0) + 1039 (MUXF7's
    I0, no wire: abc9 adds it before LUTs only)."""
    ff = {"C": "input", "CE": "input", "D": "input", "R": "input", "Q": "output"}
    module = {
        "ports": {"clk": {"direction": "input", "bits": [2]}},
        "cells": {
            "a": cell("FDRE", ff, {"C": [2], "CE": ["1"], "D": [10], "R": ["0"], "Q": [3]}),
            "b": cell("FDRE", ff, {"C": [2], "CE": ["1"], "D": [11], "R": ["0"], "Q": [4]}),
            "lut": cell("LUT2", {"I0": "input", "I1": "input", "O": "output"},
                        {"I0": [3], "I1": [4], "O": [5]}),
            "mux": cell("MUXF7", {"I0": "input", "I1": "input", "S": "input", "O": "output"},
                        {"I0": [5], "I1": ["0"], "S": [3], "O": [6]}),
            "o": cell("FDRE", ff, {"C": [2], "CE": ["1"], "D": [6], "R": ["0"], "Q": [7]}),
            "ram": cell("RAM64M8", {"ADDRA": "input", "DIA": "input", "WE": "input",
                                    "WCLK": "input", "DOA": "output"},
                        {"ADDRA": [5, 4, "0", "0", "0", "0"], "DIA": [7], "WE": ["1"],
                         "WCLK": [2], "DOA": [8]}),
            "p": cell("FDRE", ff, {"C": [2], "CE": ["1"], "D": [8], "R": ["0"], "Q": [9]}),
        },
    }
    names = {3: "a", 4: "b", 5: "lut_o", 6: "mux_o", 7: "o", 8: "ram_o", 9: "p"}
    paths = {path.end: path for path in slowest_paths(module, library, sequential,
                                                      clock_of, names)}
    assert paths["o"].ns == pytest.approx((303 + WIRE_PS + 238 + 1039) / 1000)
    assert paths["o"].start == "a" and paths["o"].clock == 2
    # Into p: the RAM's read from the LUT's output (ADDRA[0]: 642 and a wire), or its
    # write-to-read from the clock (1153), whichever is later.
    assert paths["p"].ns == pytest.approx(max(303 + 2 * WIRE_PS + 238 + 642, 1153) / 1000)
    # The RAM's write ends a path too: o's output into its data input.
    assert paths["ram_o"].ns == pytest.approx(0.303) and paths["ram_o"].start == "o"
