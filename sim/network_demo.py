"""``make sim``: the simulated endpoint answers ARP, ping and UDP echo from a Scapy host,
then writes into its memory over RoCEv2."""

import os
import sys
from pathlib import Path

from sim.bench.core_runs import core_build
from sim.runner import BUILD, run, simulator


def main() -> int:
    pcap = BUILD / "pcap" / "network-demo.pcap"
    print(f"Building the endpoint's Verilog and compiling it with {simulator()} "
          "(cached after the first run)...", flush=True)
    design = core_build()
    os.environ.setdefault("COCOTB_LOG_LEVEL", "WARNING")
    os.environ.setdefault("PYTHONWARNINGS", "ignore::DeprecationWarning")
    try:
        run(design, module="network_demo_bench", test_dir=Path(__file__).parent,
            params={"pcap": str(pcap)})
    except AssertionError as error:
        print(f"make sim: FAILED: {error}", file=sys.stderr)
        return 1
    print(f"\nmake sim: done. pcap: {pcap}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
