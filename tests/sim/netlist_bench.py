"""One cocotb test, run on the core's RTL and on its ``synth_xilinx`` netlist by
tests/sim/test_netlist.py, which compares the two runs' frames byte for byte: an ARP
request, a ping, and a QP opened through the CM that runs the generator's RDMA WRITEs
into a responder model. Each run also checks its frames against Scapy and the model."""

import cocotb
from cm_bench import Host, check_status, open_qp, start_run
from network_bench import OUR_IP, OUR_MAC, PEER_IP, PEER_MAC, check_ping_reply, padded, ping
from roce_bench import RoceRun, start
from scapy.layers.l2 import ARP, Ether


@cocotb.test()
async def arp_ping_and_a_write_through_the_cm(dut):
    bench = await start(dut, seed=3)
    await bench.send(bytes(Ether(src=PEER_MAC, dst="ff:ff:ff:ff:ff:ff") /
                           ARP(op=1, hwsrc=PEER_MAC, psrc=PEER_IP, pdst=OUR_IP)))
    expected = (Ether(src=OUR_MAC, dst=PEER_MAC) /
                ARP(op=2, hwsrc=OUR_MAC, psrc=OUR_IP, hwdst=PEER_MAC, pdst=PEER_IP))
    frame = await bench.recv()
    assert frame == padded(expected), f"{frame.hex()} != {padded(expected).hex()}"
    request = ping(56)
    await bench.send(bytes(request))
    check_ping_reply(await bench.recv(), request)
    run = RoceRun(bench)
    host = Host(0x42, psn=0x77, rkey=0xBEEF, base=0x7F00_0000_0000, path_mtu=1024)
    qp = await open_qp(run, host)
    # No more simulated time than the comparison needs: the gate-level run costs about
    # 0.1 s of CPU a cycle.
    await start_run(run, qp, host, length=1500, count=2, write=True, immediate=False,
                    settle_cycles=0)
    await run.finish(idle_cycles=20)
    await check_status(bench, qp, messages=2)
    bench.close()
