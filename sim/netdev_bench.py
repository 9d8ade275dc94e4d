"""The cocotb side of ``python -m sim.netdev``: the simulated core exchanges its
MAC-side frames with a UDP peer, one Ethernet frame per datagram."""

import json
import os
import select
import socket
import time
from pathlib import Path

import cocotb

from gateware.cm.lease import lease_tick
from gateware.cm.manager import access_list
from gateware.config import parse_ipv4
from gateware.core import CMAC_CLOCK_HZ
from gateware.roce.requests import PathMtu
from sim.models.link_faults import LinkFaults
from sim.testbench import EventCoreBench, NetworkBench

PARAMS = json.loads(os.environ["BENCH_PARAMS"])

#: Cycles between two looks at the socket.
POLL_CYCLES = 4
#: Seconds between two looks at the stop file while no frame has come yet.
WAIT_SECONDS = 0.2


def _address(text):
    host, _, port = text.rpartition(":")
    return host, int(port)


@cocotb.test()
async def netdev(dut):
    """Runs until the stop file appears (or ``seconds`` pass), then writes a summary.
    With ``source`` (an EVENT_CONFIG), the design is the EventCore, its source so
    configured."""
    stop_file = Path(PARAMS["stop_file"])
    frames = []
    source = PARAMS["source"]
    bench = (NetworkBench if source is None else EventCoreBench)(
        dut, pcap=PARAMS["pcap"], forward=frames.append)
    await bench.reset()
    await bench.configure(mac=int(PARAMS["mac"].replace(":", ""), 16),
                          ip=parse_ipv4(PARAMS["ip"]), netmask=parse_ipv4(PARAMS["netmask"]))
    await bench.configure_roce(tos=PARAMS["tos"], tick=PARAMS["tick"])
    await bench.configure_cm(path_mtu=PathMtu(PARAMS["path_mtu"]), timeout=PARAMS["timeout"],
                             retry_count=7, rnr_retry=7,
                             **access_list(PARAMS["ip"], PARAMS["netmask"]),
                             lease_tick=lease_tick(60 * CMAC_CLOCK_HZ))
    if source is not None:
        await bench.configure_source(**source)
    link = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    link.bind(_address(PARAMS["local"]))
    link.setblocking(False)
    remote = _address(PARAMS["remote"])
    to_core = LinkFaults(**PARAMS["faults_to_core"], seed=1)
    to_host = LinkFaults(**PARAMS["faults_to_host"], seed=2)
    sent = {"to_core": 0, "to_host": 0, "bad_fcs_to_core": 0}
    started = time.monotonic()
    deadline = started + PARAMS["seconds"] if PARAMS["seconds"] else None
    print(f"netdev: the endpoint {PARAMS['ip']} ({PARAMS['mac']}) is up on "
          f"{PARAMS['local']}, peer {PARAMS['remote']}", flush=True)
    checks = 0
    heard = False                           # the peer has sent a frame
    while True:
        if not heard:
            # Until the peer's first frame the core has nothing to send (it only answers),
            # so the simulation waits for one on the socket rather than run idle cycles
            # while, say, a guest boots.
            waiting, _, _ = select.select([link], [], [], WAIT_SECONDS)
            heard = bool(waiting)
            if not heard:
                if stop_file.exists() or (deadline is not None and time.monotonic() > deadline):
                    break
                continue
        while True:
            try:
                frame = link.recv(65536)
            except BlockingIOError:
                break
            for delivered, bad_fcs in to_core.apply(frame):
                sent["to_core"] += 1
                sent["bad_fcs_to_core"] += bad_fcs
                await bench.send(delivered, error=bad_fcs)
        while frames:
            for delivered, bad_fcs in to_host.apply(frames.pop(0)):
                if not bad_fcs:             # a NIC drops a frame with a bad FCS
                    sent["to_host"] += 1
                    link.sendto(delivered, remote)
        await bench.idle(POLL_CYCLES)
        checks += 1
        if checks % 256 == 0 and (stop_file.exists()
                                  or (deadline is not None and time.monotonic() > deadline)):
            break
    for delivered, _ in to_host.flush():
        link.sendto(delivered, remote)
    link.close()
    bench.close()
    counters = bench.counters()
    moved = {f"{group}.{name}": value for group, fields in counters.items()
             if isinstance(fields, dict) for name, value in fields.items() if value}
    summary = {"cycles": bench.cycle, "seconds": round(time.monotonic() - started, 1),
               "frames": sent, "faults_to_core": to_core.counts,
               "faults_to_host": to_host.counts, "counters": moved,
               "pcap": PARAMS["pcap"], "build": PARAMS["build"]}
    if source is not None:
        summary["source"] = bench.source_status()
    Path(PARAMS["summary"]).write_text(json.dumps(summary, indent=1))
    print(f"netdev: {bench.cycle} cycles in {summary['seconds']} s; frames {sent}; "
          f"faults to the core {to_core.counts}, to the host {to_host.counts}", flush=True)
    print(f"netdev: counters that moved: {moved}", flush=True)
    if source is not None:
        print(f"netdev: the event source: {summary['source']}", flush=True)
