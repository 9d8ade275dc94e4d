"""cocotb tests of the network layer of NetworkCore; run through tests/sim/test_core.py."""

import json
import os

import cocotb
from cm_bench import Host, open_qp, start_run
from roce_bench import RoceRun
from roce_bench import start as start_roce
from scapy.contrib.roce import BTH
from scapy.layers.inet import ICMP, IP, TCP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import ARP, Ether
from scapy.packet import Raw

from sim.models import ib_cm
from sim.testbench import MIN_FRAME, NetworkBench

PARAMS = json.loads(os.environ["BENCH_PARAMS"])
OUR_MAC, OUR_IP = "02:00:00:00:00:02", "10.77.0.2"
PEER_MAC, PEER_IP = "52:54:00:12:34:56", "10.77.0.1"
OTHER_MAC, OTHER_IP = "52:54:00:00:00:07", "10.77.0.7"
SILENT_IP = "10.77.0.99"          # a peer that never answers ARP


async def start(dut, **kwargs):
    bench = NetworkBench(dut, pcap=PARAMS["pcap"], peers={PEER_IP: PEER_MAC, OTHER_IP: OTHER_MAC},
                         **kwargs)
    await bench.reset()
    return bench


def padded(packet):
    frame = bytes(packet)
    return frame + bytes(max(0, MIN_FRAME - len(frame)))


def ping(size=56, *, src_ip=PEER_IP, src_mac=PEER_MAC, ident=0x1234, seq=1, tos=0):
    payload = bytes((index * 7 + seq) & 0xFF for index in range(size))
    return (Ether(src=src_mac, dst=OUR_MAC) / IP(src=src_ip, dst=OUR_IP, tos=tos) /
            ICMP(type=8, id=ident, seq=seq) / Raw(payload))


def datagram(size, *, dport=7, sport=40000, src_ip=PEER_IP, src_mac=PEER_MAC):
    payload = bytes((index * 13 + size) & 0xFF for index in range(size))
    return (Ether(src=src_mac, dst=OUR_MAC) / IP(src=src_ip, dst=OUR_IP) /
            UDP(sport=sport, dport=dport) / Raw(payload))


def check_ping_reply(frame, request):
    """The reply Scapy would build for ``request``, with the IP id the core chose."""
    reply = Ether(frame)
    assert IP in reply and ICMP in reply, reply.summary()
    expected = (Ether(src=OUR_MAC, dst=request.src) /
                IP(src=OUR_IP, dst=request[IP].src, id=reply[IP].id, flags="DF", ttl=64,
                   tos=request[IP].tos) /
                ICMP(type=0, id=request[ICMP].id, seq=request[ICMP].seq) /
                request[Raw])
    assert frame == padded(expected), (
        f"echo reply differs from Scapy's:\n{frame.hex()}\n{padded(expected).hex()}")


def check_udp_echo(frame, request):
    reply = Ether(frame)
    expected = (Ether(src=OUR_MAC, dst=request.src) /
                IP(src=OUR_IP, dst=request[IP].src, id=reply[IP].id, flags="DF", ttl=64) /
                UDP(sport=request[UDP].dport, dport=request[UDP].sport, chksum=0) /
                request[Raw])
    assert frame == padded(expected), (
        f"UDP echo differs from Scapy's:\n{frame.hex()}\n{padded(expected).hex()}")


@cocotb.test()
async def arp_reply_matches_scapy(dut):
    bench = await start(dut)
    request = (Ether(src=PEER_MAC, dst="ff:ff:ff:ff:ff:ff") /
               ARP(op=1, hwsrc=PEER_MAC, psrc=PEER_IP, pdst=OUR_IP))
    await bench.send(bytes(request))
    frame = await bench.recv()
    expected = (Ether(src=OUR_MAC, dst=PEER_MAC) /
                ARP(op=2, hwsrc=OUR_MAC, psrc=OUR_IP, hwdst=PEER_MAC, pdst=PEER_IP))
    assert frame == padded(expected), f"{frame.hex()} != {padded(expected).hex()}"
    # A request for another address is ignored.
    await bench.send(bytes(Ether(src=PEER_MAC, dst="ff:ff:ff:ff:ff:ff") /
                           ARP(op=1, hwsrc=PEER_MAC, psrc=PEER_IP, pdst="10.77.0.3")))
    await bench.idle(200)
    counters = bench.counters()["arp"]
    assert counters["replies"] == 1 and counters["ignored"] == 1, counters
    assert not bench.received
    bench.close()


@cocotb.test()
async def ping_reply_accepted_by_scapy(dut):
    bench = await start(dut)
    for seq, size in enumerate((0, 1, 18, 56, 1472), 1):
        request = ping(size, seq=seq, tos=0x2 if seq % 2 else 0)
        await bench.send(bytes(request))
        frame = await bench.recv()
        check_ping_reply(frame, request)
        reply = Ether(frame)
        # Scapy recomputes both checksums and agrees with the core's.
        rebuilt = reply.copy()
        del rebuilt[IP].chksum, rebuilt[ICMP].chksum
        rebuilt = Ether(bytes(rebuilt))
        assert rebuilt[IP].chksum == reply[IP].chksum
        assert rebuilt[ICMP].chksum == reply[ICMP].chksum
    # The core resolved the peer once and then used its cache.
    assert len(bench.arp_requests) == 1
    bench.close()


@cocotb.test()
async def arp_resolution_survives_lost_reply(dut):
    bench = await start(dut)
    bench.arp_replies_to_lose = 1
    request = ping(32)
    await bench.send(bytes(request))
    frame = await bench.recv(timeout_cycles=4 * PARAMS["arp_retry_interval"])
    check_ping_reply(frame, request)
    assert len(bench.arp_requests) == 2, "the core did not ask again after the lost reply"
    for arp in bench.arp_requests:
        assert arp.dst == "ff:ff:ff:ff:ff:ff" and arp[ARP].pdst == PEER_IP
        assert arp[ARP].hwsrc == OUR_MAC and arp[ARP].psrc == OUR_IP
    bench.close()


@cocotb.test()
async def unresolved_peer_is_dropped(dut):
    bench = await start(dut)
    await bench.send(bytes(ping(16, src_ip=SILENT_IP, src_mac=OTHER_MAC)))
    await bench.idle((PARAMS["arp_retries"] + 1) * PARAMS["arp_retry_interval"])
    assert not bench.received, "a reply went out to an unresolved address"
    assert len(bench.arp_requests) == PARAMS["arp_retries"]
    assert bench.counters()["arp"]["unresolved"] == 1
    request = ping(16)
    await bench.send(bytes(request))
    check_ping_reply(await bench.recv(), request)
    bench.close()


@cocotb.test()
async def arp_entry_expires(dut):
    bench = await start(dut)
    for seq in (1, 2):
        request = ping(8, seq=seq)
        await bench.send(bytes(request))
        check_ping_reply(await bench.recv(), request)
    assert len(bench.arp_requests) == 1
    await bench.idle(PARAMS["arp_lifetime"] + 100)
    request = ping(8, seq=3)
    await bench.send(bytes(request))
    check_ping_reply(await bench.recv(), request)
    assert len(bench.arp_requests) == 2, "the expired entry was used"
    bench.close()


@cocotb.test()
async def udp_echo_and_port_demux(dut):
    bench = await start(dut)
    for size in (0, 1, 18, 100):
        request = datagram(size)
        await bench.send(bytes(request))
        check_udp_echo(await bench.recv(), request)
    await bench.send(bytes(datagram(10, dport=9)))
    await bench.idle(300)
    assert bench.counters()["udp"]["port"] == 1
    assert not bench.received
    bench.close()


def bad_inputs():
    """(name, frame, error flag, counter path) for every kind of bad input."""
    good = ping(20)
    eth = Ether(src=PEER_MAC, dst=OUR_MAC)
    ip = IP(src=PEER_IP, dst=OUR_IP)
    checksum_bad = bytearray(bytes(good))
    checksum_bad[14 + 10] ^= 0x55
    long_claim = bytearray(bytes(eth / ip / UDP(sport=1, dport=7) / Raw(bytes(30))))
    long_claim[14 + 2:14 + 4] = (200).to_bytes(2, "big")       # IP length beyond the frame
    long_claim[14 + 10:14 + 12] = bytes(2)
    long_claim = bytes(Ether(bytes(long_claim)).__class__(bytes(long_claim)))
    fixed = Ether(long_claim)
    del fixed[IP].chksum
    fixed[IP].len = 200
    udp_length = bytes(eth / ip / UDP(sport=1, dport=7, len=20) / Raw(bytes(30)))
    truncated_udp = bytes(eth / IP(src=PEER_IP, dst=OUR_IP, proto=17) / Raw(b"\x00\x07\x00"))
    return [
        ("runt", bytes(good)[:50], False, ("eth", "runt")),
        ("mac_error", bytes(good), True, ("eth", "mac_error")),
        ("oversize", bytes(eth / ip / UDP(dport=7) / Raw(bytes(40000))), False,
         ("eth", "overflow")),
        ("wrong_mac", bytes(Ether(src=PEER_MAC, dst="02:00:00:00:00:99") / ip / ICMP()),
         False, ("eth", "address")),
        ("ipv6", bytes(Ether(src=PEER_MAC, dst=OUR_MAC) / IPv6() / UDP()), False,
         ("eth", "ethertype")),
        ("version", bytes(eth / IP(src=PEER_IP, dst=OUR_IP, version=6) / ICMP()), False,
         ("ip", "version")),
        ("options", bytes(eth / IP(src=PEER_IP, dst=OUR_IP, options=b"\x01\x01\x01\x00") /
                          ICMP()), False, ("ip", "options")),
        ("checksum", bytes(checksum_bad), False, ("ip", "checksum")),
        ("fragment", bytes(eth / IP(src=PEER_IP, dst=OUR_IP, flags="MF") / ICMP() /
                           Raw(bytes(16))), False, ("ip", "fragment")),
        ("fragment_offset", bytes(eth / IP(src=PEER_IP, dst=OUR_IP, frag=3) / Raw(bytes(16))),
         False, ("ip", "fragment")),
        ("wrong_ip", bytes(eth / IP(src=PEER_IP, dst="10.77.0.3") / ICMP()), False,
         ("ip", "address")),
        ("ip_length", bytes(fixed), False, ("ip", "length")),
        ("protocol", bytes(eth / ip / TCP()), False, ("ip", "protocol")),
        ("udp_length", udp_length, False, ("udp", "length")),
        ("udp_truncated", truncated_udp, False, ("udp", "truncated")),
        ("arp_malformed", bytes(Ether(src=PEER_MAC, dst="ff:ff:ff:ff:ff:ff") /
                                ARP(op=1, hwlen=8, hwsrc=PEER_MAC + ":00:00", psrc=PEER_IP,
                                    pdst=OUR_IP)), False, ("arp", "malformed")),
        ("icmp_other", bytes(eth / ip / ICMP(type=13)), False, ("icmp", "ignored")),
    ]


@cocotb.test()
async def bad_input_dropped_and_counted(dut):
    bench = await start(dut)
    request = ping(20, seq=100)
    await bench.send(bytes(request))           # resolve the peer first
    check_ping_reply(await bench.recv(), request)
    for seq, (name, frame, error, (layer, counter)) in enumerate(bad_inputs()):
        before = bench.counters()
        await bench.send(frame, error=error, pad=name != "runt")
        request = ping(20 + seq, seq=seq)
        await bench.send(bytes(request))
        check_ping_reply(await bench.recv(), request)
        after = bench.counters()
        assert after[layer][counter] == before[layer][counter] + 1, (
            f"{name}: {layer}.{counter} went from {before[layer][counter]} to "
            f"{after[layer][counter]}")
        changed = [(group, key) for group in after if isinstance(after[group], dict)
                   for key in after[group] if after[group][key] != before[group][key]
                   and (group, key) not in ((layer, counter), ("arp", "requests"))]
        assert not changed, f"{name}: other counters moved too: {changed}"
        assert not bench.received, f"{name}: the core answered a bad frame"
    bench.close()


@cocotb.test()
async def frame_lengths_under_backpressure(dut):
    bench = await start(dut, tx_ready=0.6, seed=7)
    boundaries = {n for k in range(1, 24) for n in (64 * k - 1, 64 * k, 64 * k + 1)}
    lengths = sorted({60, 1514} | {n for n in boundaries if 60 <= n <= 1514}) + [9014]
    for length in lengths:
        # Like an echo client: the next datagram goes when the last one came back.
        request = datagram(length - 42)
        assert len(bytes(request)) == length
        await bench.send(bytes(request))
        check_udp_echo(await bench.recv(timeout_cycles=50_000), request)
    assert bench.counters()["udp_echo_dropped"] == 0
    dut._log.info("echoed %d frames of %d..%d bytes", len(lengths), lengths[0], lengths[-1])
    bench.close()


@cocotb.test()
async def runtime_address_change(dut):
    bench = await start(dut)
    new_mac, new_ip = 0x020000000042, (10 << 24) | (77 << 16) | 42
    await bench.configure(mac=new_mac, ip=new_ip, netmask=0xFFFFFF00)
    await bench.send(bytes(Ether(src=PEER_MAC, dst="ff:ff:ff:ff:ff:ff") /
                           ARP(op=1, hwsrc=PEER_MAC, psrc=PEER_IP, pdst="10.77.0.42")))
    frame = await bench.recv()
    expected = (Ether(src="02:00:00:00:00:42", dst=PEER_MAC) /
                ARP(op=2, hwsrc="02:00:00:00:00:42", psrc="10.77.0.42", hwdst=PEER_MAC,
                    pdst=PEER_IP))
    assert frame == padded(expected)
    await bench.send(bytes(ping(8)))           # to the old address: dropped
    await bench.idle(300)
    assert bench.counters()["eth"]["address"] == 1
    bench.close()


@cocotb.test()
async def minimum_frames_after_a_jumbo_are_absorbed(dut):
    """A 9000-byte frame, then 128 minimum frames back to back (one a cycle, faster
    than 100 Gb/s line rate): the receive FIFO loses none of them."""
    bench = await start(dut)
    request = ping(8, seq=999)
    await bench.send(bytes(request))           # resolve the peer first
    check_ping_reply(await bench.recv(), request)
    jumbo_size = 9000 - 42
    pings = [ping(18, seq=seq) for seq in range(128)]
    assert {len(bytes(frame)) for frame in pings} == {MIN_FRAME}

    # A jumbo frame that nothing answers (no service on the port): every ping is answered.
    await bench.send(bytes(datagram(jumbo_size, dport=9)))
    for frame in pings:
        await bench.send(bytes(frame))
    await bench.wait_sent()
    await bench.idle(1000)
    counters = bench.counters()
    assert counters["eth"]["overflow"] == 0, counters["eth"]
    assert counters["udp"]["port"] == 1 and counters["icmp"]["dropped"] == 0, counters
    assert len(bench.received) == len(pings)
    for frame in pings:
        check_ping_reply(bench.received.popleft(), frame)

    # A jumbo UDP echo: its reply holds the transmitter while the pings come in, so the
    # ICMP echo service may drop some (counted); the receive FIFO still loses none.
    jumbo = datagram(jumbo_size)
    await bench.send(bytes(jumbo))
    for frame in pings:
        await bench.send(bytes(frame))
    await bench.wait_sent()
    await bench.idle(2000)
    replies = list(bench.received)
    bench.received.clear()
    echoes = [frame for frame in replies if UDP in Ether(frame)]
    assert len(echoes) == 1
    check_udp_echo(echoes[0], jumbo)
    answered = {Ether(frame)[ICMP].seq: frame for frame in replies if ICMP in Ether(frame)}
    for seq, frame in answered.items():
        check_ping_reply(frame, pings[seq])
    counters = bench.counters()
    assert counters["eth"]["overflow"] == 0, counters["eth"]
    assert len(answered) + counters["icmp"]["dropped"] == len(pings), (
        len(answered), counters["icmp"])
    dut._log.info("after the jumbo echo: %d pings answered, %d dropped by the ICMP service",
                  len(answered), counters["icmp"]["dropped"])
    bench.close()


#: Sources RFC 1122 §3.2.1.3 says to discard, on our subnet 10.77.0.0/24.
DISCARDED_SOURCES = {
    "limited broadcast": "255.255.255.255",
    "directed broadcast": "10.77.0.255",
    "host number zero": "10.77.0.0",
    "multicast": "224.0.0.251",
    "this host": "0.0.0.0",
    "loopback": "127.0.0.1",
    "class E": "240.0.0.7",
    "our own address": OUR_IP,
}


@cocotb.test()
async def rfc1122_sources_are_discarded(dut):
    """A ping, a UDP echo and a CM datagram from each discarded source: dropped and counted
    as ip.source, nothing answered, no ARP request; a reply to an address off our subnet
    with no gateway is unreachable (counted), not ARPed for directly."""
    bench = await start(dut)
    for name, source in DISCARDED_SOURCES.items():
        before = bench.counters()["ip"]["source"]
        await bench.send(bytes(ping(16, src_ip=source, src_mac=OTHER_MAC)))
        await bench.send(bytes(datagram(16, src_ip=source, src_mac=OTHER_MAC)))
        await bench.send(bytes(datagram(64, dport=17185, src_ip=source, src_mac=OTHER_MAC)))
        await bench.idle(300)
        assert not bench.received and not bench.arp_requests, name
        assert bench.counters()["ip"]["source"] == before + 3, name
    await bench.send(bytes(ping(16, src_ip="192.0.2.9", src_mac=OTHER_MAC)))
    await bench.send(bytes(datagram(16, src_ip="198.51.100.3", src_mac=OTHER_MAC)))
    await bench.idle(300)
    assert not bench.received and not bench.arp_requests
    assert bench.counters()["arp"]["unreachable"] == 2, bench.counters()["arp"]
    request = ping(16)                         # and a good one is answered
    await bench.send(bytes(request))
    check_ping_reply(await bench.recv(), request)
    bench.close()


@cocotb.test()
async def qp1_counts_cm_mads_and_drops_a_bad_icrc(dut):
    """A REQ to QP1 (RoCEv2 UD SEND ONLY with DETH, as rdma_cm sends it) is counted as
    received; the same frame with one bit of its MAD flipped is dropped as an ICRC error,
    and the REQ after it is received again. Each REQ taken (its private data has no user
    part: version 0) is answered with REJ 28 to the host's QP1, the bad one with nothing,
    and the ACK receiver sees none of them."""
    bench = await start(dut)
    message = ib_cm.cm_message(
        "REQ", local_comm_id=0x5EED0001, service_id=ib_cm.service_id(17185),
        local_ca_guid=0x525400FFFE123456, local_qpn=0x11, starting_psn=0x1234,
        partition_key=0xFFFF, path_mtu=3, rnr_retry_count=7, max_cm_retries=15,
        private_data=ib_cm.cma_header(src_ip=PEER_IP, dst_ip=OUR_IP, port=0xC001))
    request = ib_cm.mad("REQ", message, transaction_id=0x0000_0001_5EED_0001)
    good = ib_cm.gsi_frame(request, src_ip=PEER_IP, dst_ip=OUR_IP, src_mac=PEER_MAC,
                           dst_mac=OUR_MAC, sport=0xC0DE)
    bad = bytearray(good)
    bad[14 + 20 + 8 + 12 + 8 + 40] ^= 0x04          # a bit of the REQ's local CA GUID
    before = bench.counters()
    for frame in (good, bytes(bad), good):        # each after the REJ of the one before
        await bench.send(frame)
        await bench.wait_sent()
        await bench.idle(300)
    counters = bench.counters()
    qp1 = {name: counters["qp1"][name] - before["qp1"][name] for name in counters["qp1"]}
    assert qp1 == {**dict.fromkeys(qp1, 0), "received": 2, "icrc": 1}, qp1
    assert counters["roce_ack"] == before["roce_ack"], counters["roce_ack"]
    assert counters["ib_cm"]["rej_version"] == before["ib_cm"]["rej_version"] + 2
    assert len(bench.received) == 2
    assert [request[ARP].pdst for request in bench.arp_requests] == [PEER_IP]  # the REJ's
    for frame in bench.received:
        gsi = ib_cm.parse_gsi_frame(frame)
        assert gsi.icrc_ok and (gsi.dst_ip, gsi.dest_qp) == (PEER_IP, 1), gsi
        header, reply = ib_cm.parse_mad(gsi.datagram)
        assert (header.attribute_id, header.transaction_id) == (
            ib_cm.ATTRIBUTE_IDS["REJ"], 0x0000_0001_5EED_0001), header
        rej = ib_cm.parse_cm_message("REJ", reply)
        assert (rej["remote_comm_id"], rej["reason"]) == (0x5EED0001, 28), rej
    bench.close()


@cocotb.test()
async def a_silent_host_never_stalls_a_qp(dut):
    """A generator run on a QP whose peer is resolved, and meanwhile a ping from an address
    on our subnet that never answers ARP: the echo reply waits beside the stream and is
    dropped and counted after the ARP tries; the RoCEv2 stream never pauses for it (its
    largest gap stays below 100 cycles) and the run lands byte for byte."""
    bench = await start_roce(dut)
    run = RoceRun(bench)
    host = Host(0x51, psn=0x100, rkey=0x5151, base=0x20_0000, path_mtu=1024)
    qp = await open_qp(run, host, memory_size=1 << 18)
    sent_at = []
    deliver = bench._deliver

    def timed(frame):
        if BTH in Ether(frame):
            sent_at.append(bench.cycle)
        deliver(frame)
    bench._deliver = timed

    await start_run(run, qp, host, length=1024, count=120, write=True, immediate=False)
    while len(sent_at) < 5:
        await bench.idle(10)
    await bench.send(bytes(ping(32, src_ip=SILENT_IP, src_mac=OTHER_MAC)))
    await run.finish()
    gaps = [later - earlier for earlier, later in zip(sent_at, sent_at[1:], strict=False)]
    dut._log.info("RoCEv2 frames %d, largest gap %d cycles", len(sent_at), max(gaps))
    assert max(gaps) < 100, f"the RoCEv2 stream paused {max(gaps)} cycles"
    await bench.idle((PARAMS["arp_retries"] + 1) * PARAMS["arp_retry_interval"])
    asked = [arp[ARP].pdst for arp in bench.arp_requests]
    assert asked.count(SILENT_IP) == PARAMS["arp_retries"], asked
    assert bench.counters()["arp"]["unresolved"] == 1
    assert not bench.received, "a reply went out to an unresolved address"
    bench.close()
