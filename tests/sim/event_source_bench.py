"""cocotb test of the example EventCore (gateware/examples/event_core.py): the core with
the event source on its user ports, as the board top builds it with ``SOURCE=example``
(here the benches' build, whose ``use_source`` gives the source those ports); run
through tests/sim/test_event_source.py.

A host opens a QP through the connection manager (which enables the source) and a
responder model plays its RC QP, with a receive posted per fragment and its ACKs a
round trip late. Every fragment
must land in its ring slot byte for byte as host/fragments.py describes it, with its
event number as the immediate; every frame is compared with the one Scapy builds
(roce_bench's RoceRun), and no fragment may start before the fragment that last used
its slot was acknowledged.
"""

import json
import os

import cocotb
from cm_bench import Host, cm, open_qp
from roce_bench import PEER_IP, PEER_MAC, TICK, RoceRun
from scapy.contrib.roce import AETH, BTH
from scapy.layers.l2 import Ether

from gateware.core import TOS_ECT0
from host import fragments, protocol
from sim.models.responder import Faults
from sim.models.rocev2 import Message
from sim.testbench import CLOCK_PERIOD_PS, EventCoreBench

PARAMS = json.loads(os.environ["BENCH_PARAMS"])
FRAGMENT = PARAMS["fragment_bytes"]
PSN_MASK = (1 << 24) - 1


def distance(psn, reference):
    """``psn - reference`` in the 24-bit PSN space, in [-2^23, 2^23)."""
    return (psn - reference + (1 << 23) & PSN_MASK) - (1 << 23)


@cocotb.test()
async def fragments_land_in_the_host_ring(dut):
    count, slots = 12, 3
    bench = EventCoreBench(dut, pcap=PARAMS["pcap"], peers={PEER_IP: PEER_MAC}, tx_ready=0.8,
                        seed=9)
    await bench.reset()
    await bench.configure_roce(tos=TOS_ECT0, tick=TICK)
    run = RoceRun(bench)
    host = Host(0x42, psn=0x77, rkey=0xBEEF, base=0x7F00_0000_0000, path_mtu=256,
                ring=slots * FRAGMENT)
    # The ring's address is not configured: the source takes the host's from its OPEN_QP.
    await bench.configure_source(slot_bytes=FRAGMENT, slots=slots, period=0, count=count)
    assert bench.source_status()["running"] == 0, "running before a QP was open"
    # The host's ACKs come 300 cycles (about a microsecond) late, so the ring's slots
    # bound the flight.
    qp = await open_qp(run, host, memory_size=host.ring, faults=Faults(ack_delay=300))
    qp.responder.post_receive(count)
    first_psn = qp.psn
    await bench.wait_source(lambda status: status["completed"] == count, 100_000)
    done = bench.cycle
    await bench.idle(200)
    status = bench.source_status()
    assert (status["running"], status["events"], status["failed"], status["in_flight"]) == \
        (0, count, 0, 0), status

    # What the host QP received: fragment k with immediate k, byte for byte.
    landed = qp.responder.receive_queue
    assert [completion.immediate for completion in landed] == list(range(count))
    stamps = [fragments.check(completion.data, k).timestamp
              for k, completion in enumerate(landed)]
    assert all(later > earlier for earlier, later in zip(stamps, stamps[1:], strict=False))
    # Every frame as Scapy builds it, and the ring's slots as the last fragments left them.
    for k, stamp in enumerate(stamps):
        run.expect(qp, Message("RDMA_WRITE_WITH_IMMEDIATE", fragments.fragment(k, stamp, FRAGMENT),
                               remote_address=host.base + k % slots * FRAGMENT, immediate=k),
                   tag=k)
    sent = [(cycle, psn) for cycle, dqpn, psn in bench.roce_sent if dqpn == host.qpn]
    run.check_frames(retransmissions=False)
    run.check_landed(qp)

    # No fragment started before its slot's previous fragment was acknowledged.
    packets = -(-FRAGMENT // host.path_mtu)
    acks = [(cycle, Ether(frame)[BTH].psn) for cycle, frame in bench.answers
            if AETH in Ether(frame) and Ether(frame)[AETH].syndrome & 0x60 == 0]

    def acknowledged(k):
        last = first_psn + (k + 1) * packets - 1
        return next(cycle for cycle, psn in acks if distance(psn, last) >= 0)

    def started(k):
        psn = first_psn + k * packets & PSN_MASK
        return next(cycle for cycle, sent_psn in sent if sent_psn == psn)

    in_flight = []
    for k in range(count):
        if k >= slots:
            assert started(k) > acknowledged(k - slots), f"fragment {k} overtook its slot"
        in_flight.append(sum(acknowledged(j) >= started(k) for j in range(k)) + 1)
    assert max(in_flight) == slots, f"in flight when each fragment started: {in_flight}"

    # Closing the QP stops the source; the next OPEN_QP would start again from event 0.
    close = protocol.close_qp(qp.qpn, PEER_IP)
    assert protocol.Datagram.decode(await cm(bench, close)).ack == protocol.Ack.ACK
    await bench.idle(10)
    status = bench.source_status()
    assert (status["running"], status["events"]) == (0, 0), status
    dut._log.info("%d fragments of %d bytes landed in %d slots; at most %d in flight; "
                  "%.2f us from the first packet to the last completion (within 10 cycles)",
                  count, FRAGMENT, slots, max(in_flight),
                  (done - sent[0][0]) * CLOCK_PERIOD_PS / 1e6)
    bench.close()
