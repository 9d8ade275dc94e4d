"""A Vivado-free check that synthesis keeps the design's meaning: the reduced core
(2 QPs, small buffers) simulated as RTL and as Yosys's ``synth_xilinx`` netlist (Xilinx
cells with Yosys's models, memories in distributed RAM), the same bench on both
(tests/sim/netlist_bench.py: ARP, ping, an RDMA WRITE run opened through the CM); the
frames the core sends, and the cycles they leave on, must be the same."""

import shutil
from pathlib import Path

import pytest
from scapy.layers.l2 import Ether
from scapy.utils import rdpcap

from gateware.core import NetworkCore
from sim.bench.resources import SMALL_CORE, SynthesisError, native_yosys_command
from sim.netlist import cell_models, synthesized_netlist
from sim.runner import BUILD, build, build_verilog, run
from sim.testbench import CORE_PARAMS

HERE = Path(__file__).parent
CORE_MAC = "02:00:00:00:00:02"
NETLIST_CORE = {**CORE_PARAMS, **SMALL_CORE}


def small_core():
    return NetworkCore(**NETLIST_CORE)


def core_frames(pcap):
    """(time, bytes) of every frame the core sent, in order."""
    return [(packet.time, bytes(packet)) for packet in rdpcap(str(pcap))
            if Ether(bytes(packet)).src == CORE_MAC]


#: The reduced core is about as small as the core goes: a QP's retransmit ring holds a packet
#: of the path MTU (64 beats at 4096 bytes), the ICRC inserter needs beats of 44 bytes or
#: more, and most of the netlist is the 64-byte datapath, not buffers or per-QP state (the
#: 16-QP board top's core domain has 51,000 flip-flops, this netlist 56,300).
#: Both run on Icarus, the RTL too: its Icarus build takes about 90 s of CPU where
#: Verilator's takes 390 s, and the bench is short (2.5 µs). Most of the test is the
#: netlist's synthesis (about 27 CPU-minutes: see sim.netlist); then Icarus's compile of
#: the netlist, about 4 minutes (without the nodangle pass: see sim.runner.icarus_base),
#: and the gate-level run, about 2 minutes (on scalar nets: see sim.netlist.NETLIST_SCRIPT).
@pytest.mark.synthesis
@pytest.mark.skipif(shutil.which("iverilog") is None,
                    reason="the netlist runs on Icarus Verilog: apt-get install iverilog")
def test_netlist_sends_the_frames_of_the_rtl():
    try:
        native_yosys_command()
    except SynthesisError as error:
        pytest.skip(str(error))
    netlist = synthesized_netlist(small_core, repr(NETLIST_CORE))
    designs = {
        "rtl": build("netlist-rtl", small_core, key=repr(NETLIST_CORE), sim="icarus"),
        "netlist": build_verilog("netlist-gates", netlist, library=cell_models(), sim="icarus"),
    }
    frames = {}
    for kind, design in designs.items():
        pcap = BUILD / "pcap" / f"netlist-{kind}.pcap"
        run(design, module="netlist_bench", test_dir=HERE,
            params={**NETLIST_CORE, "pcap": str(pcap)})
        frames[kind] = core_frames(pcap)
    assert len(frames["rtl"]) >= 6, "ARP reply, ping reply, CM reply, two WRITEs, STATUS"
    assert len(frames["netlist"]) == len(frames["rtl"]), \
        f"{len(frames['netlist'])} frames from the netlist, {len(frames['rtl'])} from the RTL"
    for index, (rtl, netlist) in enumerate(zip(frames["rtl"], frames["netlist"], strict=True)):
        assert netlist == rtl, f"frame {index}: netlist {netlist[1].hex()} at {netlist[0]} ns, " \
                               f"RTL {rtl[1].hex()} at {rtl[0]} ns"
