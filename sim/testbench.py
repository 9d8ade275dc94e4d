"""The cocotb bench around :class:`gateware.core.NetworkCore`.

One :class:`NetworkBench` owns the clock, the MAC-side receive source
(cocotbext-axi), a transmit monitor that reads the 512-bit bus once per beat
and applies random backpressure, the pcap of both directions, a Scapy peer
that answers the core's ARP requests for the addresses it holds, and the
RoCEv2 side: QP writes, work requests with their payload (a cocotbext-axi
source with optional random gaps), generator starts, the completions and
the per-QP status. Responder models (:class:`sim.models.responder.Responder`) can be
attached: they receive the core's packets for their QPN and their answers
are sent back into the core, in a time counted in clock cycles (``cycle``). A
congested switch (:class:`sim.models.switch.CongestedSwitch`) can sit in front of them.
With ``line=True`` the MAC side takes beats at a 100GbE line's rate, as the CMAC does.
A top that holds several cores on one clock gives each core's ports a prefix of its own
(``port``) and has a bench for each; one of them drives the clock.
"""

import enum
import random
from collections import deque

import cocotb
from amaranth.lib import data
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, Event, RisingEdge, with_timeout
from cocotb.utils import get_sim_time
from cocotbext.axi import AxiStreamBus, AxiStreamFrame, AxiStreamSource
from scapy.contrib.roce import BTH
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import ARP, Ether

from gateware.cm.datagram import CM_PORT
from gateware.cm.manager import CM_CONFIG
from gateware.config import NetworkConfig
from gateware.core import TOS_ECT0, NetworkCore
from gateware.eth.mac_control import PAUSE_CONFIG
from gateware.examples.event_source import EVENT_CONFIG, EVENT_STATUS
from gateware.headers import UDP_PORT_ROCEV2
from gateware.roce.dcqcn import DCQCN_CONFIG, DCQCN_DEFAULTS
from gateware.roce.planner import TRANSMIT_CONFIG
from gateware.roce.requests import COMPLETION, QP_STATUS, QP_WRITE, WORK_REQUEST
from sim.bench.roce_goodput import LINE_BYTES_PER_CYCLE, LINE_OVERHEAD
from sim.pcap import PcapWriter

__all__ = ["NetworkBench", "EventCoreBench", "CLOCK_PERIOD_PS", "MIN_FRAME", "CORE_PARAMS",
           "SOURCE_PARAMS"]

#: 322.265625 MHz, the CMAC's user clock, rounded to an even number of picoseconds.
CLOCK_PERIOD_PS = 3104

#: The core as the benches build it: ARP timers (in cycles) and the IB CM's millisecond
#: (10,000 cycles, 31 µs: its REP and DREQ retransmissions) small enough that retries
#: and expiry fit in a short simulation, and retransmit rings of 512 beats (32 KiB) per
#: QP, so that a QP holds a few packets' pages of the retransmit pool at most.
CORE_PARAMS = {"arp_retry_interval": 3000, "arp_lifetime": 40_000, "arp_retries": 3,
               "ib_cm_ms": 10_000, "retransmit_beats": 512}

#: The example event source as the benches build it beside the core
#: (:func:`sim.bench.core_runs.core_build`): fragments of 1000 bytes, 8 in flight.
SOURCE_PARAMS = {"fragment_bytes": 1000, "window": 8}

#: A MAC on the wire never delivers less (without FCS); shorter frames are padded.
MIN_FRAME = 60


def _is_roce(frame):
    """Whether ``frame`` is a RoCEv2 frame: IPv4 (no options), UDP to port 4791."""
    return (frame[12:14] == b"\x08\x00" and frame[14] == 0x45 and frame[23] == 17
            and frame[36:38] == UDP_PORT_ROCEV2.to_bytes(2, "big"))


def _decode(layout, value):
    """A nested dict of a StructLayout constant."""
    view = data.Const(layout, value)
    result = {}
    for name, field in layout:
        member = view[name]
        if isinstance(field.shape, data.StructLayout):
            result[name] = _decode(field.shape, member.as_value().value)
        elif isinstance(member, enum.Enum):
            result[name] = member.value
        else:
            result[name] = int(member)
    return result


def _encode(layout, value):
    """The integer of a StructLayout constant given as a (nested) dict."""
    return layout.const(value).as_value().value


class _PortSignals:
    """The signals of one core in a top that holds several: each of its ports' names with
    ``prefix`` in front; the clock (``clk``) and reset (``rst``) are the top's."""

    def __init__(self, dut, prefix):
        self._dut, self._prefix = dut, prefix

    def __getattr__(self, name):
        if name in ("clk", "rst"):
            return getattr(self._dut, name)
        return getattr(self._dut, self._prefix + name)


class NetworkBench:
    """Drives one :class:`NetworkCore` from cocotb.

    Parameters
    ----------
    dut : the simulated core.
    pcap : path of the pcap file of every frame in both directions.
    tx_ready : probability that the MAC side accepts a beat in a cycle.
    peers : ``{ip: mac}`` of the Scapy hosts on the link; the bench answers
        the core's ARP requests for them.
    forward : when given, a function that takes every frame the core sends
        (after the pcap), and the bench neither answers ARP nor keeps frames.
    line : the MAC side takes beats at the rate of a 100GbE line (each frame costs
        its bytes, FCS, preamble and gap), instead of ``tx_ready``; ``line_cycles``
        then tells how long the line was busy.
    port : the prefix of the core's port names in a top that holds several cores
        (``p1_``); the top's ``clk`` and ``rst`` serve them all.
    clock : whether this bench drives the clock (one bench of a top with several cores).
    address : ``(mac, ip)`` of the core when the top writes its ``config`` port itself
        (as a board's :class:`~boards.board_address.BoardAddress` does): the bench then
        leaves that port alone.
    """

    #: Whether the example source holds the user ports (``use_source`` of the benches'
    #: build): not here, in :class:`EventCoreBench`.
    SOURCE = False

    def __init__(self, dut, *, pcap, tx_ready=1.0, peers=None, seed=0, payload_gaps=0.0,
                 forward=None, line=False, port="", clock=True, address=None):
        top = dut
        if port:
            dut = _PortSignals(dut, port)
        self.dut = dut
        self.forward = forward            # takes every frame from the core, instead of the peers
        self.rng = random.Random(seed)
        self.tx_ready = tx_ready
        self.peers = dict(peers or {})
        self.arp_replies_to_lose = 0
        self.arp_requests = []            # every ARP request the core sent
        self.received = deque()           # frames from the core, but ARP requests and CM replies
        self.cm_replies = deque()         # frames from the core's connection manager
        self._cm_arrival = Event()
        self.core_mac, self.core_ip = address or ("02:00:00:00:00:02", "10.77.0.2")
        self._config_port = address is None
        self._arrival = Event()
        self.cycle = 0                    # clock cycles since the bench started
        self._responders = {}             # attached responder models by their QPN
        self._responder_due = None        # the earliest next_due of any of them
        self.switch = None                # a CongestedSwitch in front of the responders
        self._switch_due = None
        self.tx_beats = 0
        self.tx_cycles_valid = 0
        self.line = line
        self._line_credit = 0.0           # bytes the line may take (negative: it is behind)
        self._line_debt = 0.0             # bytes the line still had to send at the last beat
        # The cycles of the first and the last beat of the RoCEv2 frames sent (an ARP
        # refresh after a measured run's last frame is no part of it).
        self.tx_first_cycle = None
        self.tx_last_cycle = None
        self.timing = False               # note the cycles below (record_timing)
        self.rx_last_cycles = []          # the cycle of each frame's last beat into the core
        self.tx_first_cycles = []         # (cycle of its first beat, frame) of each frame out
        self._frame_start = None
        self.roce_sent = []               # (cycle, dest QP, PSN) of every RoCEv2 frame sent
        self._tos, self._dcqcn = TOS_ECT0, True   # the core's defaults
        self.answers = []                 # (cycle, frame) of every responder frame sent in
        self.request_cycles = []          # the cycle in which each work request was taken
        self.completion_cycles = []       # the cycle of each completion
        self.pcap = PcapWriter(pcap)
        self.width = len(dut.tx__tkeep)
        self.source = AxiStreamSource(AxiStreamBus.from_prefix(top, f"{port}rx_"), dut.clk,
                                      dut.rst)
        self.payload_gaps = payload_gaps
        self._payload_rng = random.Random(seed + 1)
        self.completions = deque()        # completions, decoded, in order
        self._completion = Event()
        self._requests = deque()
        self._request_ready = Event()
        self._payloads = deque()
        self._payload_ready = Event()
        self._payload_busy = False
        if clock:
            cocotb.start_soon(Clock(dut.clk, CLOCK_PERIOD_PS, unit="ps").start())
        cocotb.start_soon(self._transmit_monitor())
        cocotb.start_soon(self._completion_monitor())
        cocotb.start_soon(self._request_driver())
        cocotb.start_soon(self._payload_driver())

    async def reset(self):
        self.dut.rst.value = 1
        # Every input starts at 0, payloads too, as the registers that drive them on the
        # FPGA do: Icarus starts an input no one drove at X, and the core reads some
        # payloads while their valid is low (the pacing gate looks a request's QP up a
        # cycle ahead), so an X there once stopped every work request on Icarus.
        ports = ("config", "work_request", "qp_write", "connect", "roce_config", "cm_config",
                 "pause_config", "dcqcn_config", *(("source_config",) if self.SOURCE else ()))
        for port in ports[0 if self._config_port else 1:]:
            getattr(self.dut, f"{port}__valid").value = 0
            getattr(self.dut, f"{port}__payload").value = 0
        for signal in ("tvalid", "tdata", "tkeep", "tlast", "tuser"):
            getattr(self.dut, f"payload__{signal}").value = 0
        self.dut.qp_status_select.value = 0
        self.dut.completion__ready.value = 1
        self.dut.connection__ready.value = 0    # no user logic: the events are counted lost
        if hasattr(self.dut, "use_source"):     # the benches' build (designs without: no source)
            self.dut.use_source.value = self.SOURCE
        self.dut.tx__tready.value = 0
        await ClockCycles(self.dut.clk, 4)
        self.dut.rst.value = 0
        await ClockCycles(self.dut.clk, 2)

    async def configure(self, *, mac, ip, netmask, gateway=0):
        self.core_mac, self.core_ip = mac, ip
        value = NetworkConfig.const({"mac": mac, "ip": ip, "netmask": netmask,
                                     "gateway": gateway}).as_value().value
        self.dut.config__payload.value = value
        self.dut.config__valid.value = 1
        await RisingEdge(self.dut.clk)
        self.dut.config__valid.value = 0

    async def _put(self, port, layout, value):
        """One transfer on a stream port of the core (valid/ready, payload a struct)."""
        getattr(self.dut, f"{port}__payload").value = _encode(layout, value)
        getattr(self.dut, f"{port}__valid").value = 1
        while True:
            await RisingEdge(self.dut.clk)
            if getattr(self.dut, f"{port}__ready").value == 1:
                break
        getattr(self.dut, f"{port}__valid").value = 0

    async def set_qp(self, qp, state):
        """Write a QP's transmit state (a dict of QP_STATE)."""
        await self._put("qp_write", QP_WRITE, {"qp": qp, "state": state})

    async def configure_roce(self, *, tos, tick):
        """Set the RoCEv2 traffic class and the clock cycles of a 4.096 us timer tick."""
        await self._put("roce_config", TRANSMIT_CONFIG, {"tos": tos, "tick": tick})
        self._tos = tos

    async def configure_pause(self, *, roce_priority, quantum_cycles):
        """Set the priority whose PFC frames pause RoCEv2 frames, and the cycles of a pause
        quantum (8.8 fixed point)."""
        await self._put("pause_config", PAUSE_CONFIG, {"roce_priority": roce_priority,
                                                       "quantum_cycles": quantum_cycles})

    async def configure_dcqcn(self, **changes):
        """Set the DCQCN reaction point: ConnectX's defaults at the bench's clock, but for
        ``changes`` (fields of DCQCN_CONFIG)."""
        defaults = DCQCN_DEFAULTS(1e12 / CLOCK_PERIOD_PS)
        await self._put("dcqcn_config", DCQCN_CONFIG, {**defaults, **changes})
        self._dcqcn = bool(changes.get("enable", defaults["enable"]))

    @property
    def roce_tos(self):
        """The IPv4 traffic class of the core's RoCEv2 frames: ``roce_config``'s DSCP, and
        the ECN field DCQCN sets (ECT(0) while it is on, Not-ECT when it is off)."""
        return self._tos & ~0b11 | (0b10 if self._dcqcn else 0b00)

    async def configure_cm(self, **config):
        """Set how the connection manager sets up the QPs it opens, its access list and
        lease (a dict of every field of CM_CONFIG)."""
        await self._put("cm_config", CM_CONFIG, config)

    def cm_frame(self, datagram, *, host_ip, sport):
        """An Ethernet frame carrying a CM datagram from the peer at ``host_ip``."""
        return bytes(Ether(src=self.peers[host_ip], dst=self.core_mac)
                     / IP(src=host_ip, dst=self.core_ip)
                     / UDP(sport=sport, dport=CM_PORT) / bytes(datagram))

    async def cm_request(self, datagram, *, host_ip, sport=50000, reply=True,
                         timeout_cycles=5000, settle_cycles=None):
        """Send a CM datagram (bytes) from ``host_ip`` and return the UDP payload of the
        reply (None when ``reply`` is False: then only wait ``settle_cycles``, by default
        ``timeout_cycles`` / 10)."""
        self.cm_replies.clear()
        await self.send(self.cm_frame(datagram, host_ip=host_ip, sport=sport))
        if not reply:
            await self.idle(timeout_cycles // 10 if settle_cycles is None else settle_cycles)
            return None
        return await self.cm_reply(host_ip=host_ip, sport=sport, timeout_cycles=timeout_cycles)

    async def cm_reply(self, *, host_ip, sport=50000, timeout_cycles=5000):
        """The UDP payload of the connection manager's next reply (to ``host_ip``, UDP
        port ``sport``)."""
        async def wait():
            while not self.cm_replies:
                self._cm_arrival.clear()
                await self._cm_arrival.wait()
            return self.cm_replies.popleft()
        frame = await with_timeout(wait(), timeout_cycles * CLOCK_PERIOD_PS, "ps")
        packet = Ether(frame)
        assert packet[IP].dst == host_ip and packet[UDP].dport == sport, packet.summary()
        return bytes(packet[UDP].payload)

    def post(self, request, payload):
        """Queue a work request (a dict of WORK_REQUEST) and its payload bytes."""
        self._requests.append(request)
        self._request_ready.set()
        self._payloads.append(bytes(payload))
        self._payload_ready.set()

    def all_posted(self):
        """Every queued work request and payload beat has been taken by the core."""
        return not self._requests and not self._payloads and not self._payload_busy

    async def _request_driver(self):
        while True:
            while not self._requests:
                self._request_ready.clear()
                await self._request_ready.wait()
            await self._put("work_request", WORK_REQUEST, self._requests.popleft())
            self.request_cycles.append(self.cycle)

    async def _payload_driver(self):
        """Drives each payload as one packet, a beat per cycle but for random gaps
        (``payload_gaps``: the probability of an idle cycle before a beat)."""
        dut, width = self.dut, self.width
        while True:
            while not self._payloads:
                self._payload_ready.clear()
                await self._payload_ready.wait()
            payload = self._payloads.popleft()
            self._payload_busy = True
            chunks = [payload[at:at + width] for at in range(0, len(payload), width)] or [b""]
            for index, chunk in enumerate(chunks):
                while self.payload_gaps and self._payload_rng.random() < self.payload_gaps:
                    dut.payload__tvalid.value = 0
                    await RisingEdge(dut.clk)
                dut.payload__tdata.value = int.from_bytes(chunk, "little")
                dut.payload__tkeep.value = (1 << len(chunk)) - 1
                dut.payload__tlast.value = int(index == len(chunks) - 1)
                dut.payload__tvalid.value = 1
                while True:
                    await RisingEdge(dut.clk)
                    if dut.payload__tready.value == 1:
                        break
            dut.payload__tvalid.value = 0
            self._payload_busy = False

    async def _completion_monitor(self):
        dut = self.dut
        while True:
            await RisingEdge(dut.clk)
            if dut.completion__valid.value == 1 and dut.completion__ready.value == 1:
                self.completions.append(
                    _decode(COMPLETION, dut.completion__payload.value.to_unsigned()))
                self.completion_cycles.append(self.cycle)
                self._completion.set()

    async def wait_completions(self, count, timeout_cycles=20_000):
        """Wait until ``count`` completions have come since the bench started."""
        async def wait():
            while len(self.completions) < count:
                self._completion.clear()
                await self._completion.wait()
        await with_timeout(wait(), timeout_cycles * CLOCK_PERIOD_PS, "ps")

    async def qp_status(self, qp):
        """A QP's reliability state and counters (a dict of QP_STATUS)."""
        self.dut.qp_status_select.value = qp
        await ClockCycles(self.dut.clk, 2)      # the output is registered
        return _decode(QP_STATUS, self.dut.qp_status.value.to_unsigned())

    def _now_ns(self):
        return get_sim_time(unit="ns")

    def _rx_frame(self, frame, *, error=False, pad=True):
        """A frame as the MAC delivers it (padded to the minimum), written to the pcap."""
        frame = bytes(frame)
        if pad and len(frame) < MIN_FRAME:
            frame += bytes(MIN_FRAME - len(frame))
        self.pcap.write(frame, self._now_ns())
        return AxiStreamFrame(frame, tuser=int(error))

    async def send(self, frame, *, error=False, pad=True):
        """Deliver one frame as the MAC would (``error``: tuser set with the last beat)."""
        await self.source.send(self._rx_frame(frame, error=error, pad=pad))

    def queue(self, frame):
        """Queue one frame for the MAC without waiting (frames queued go in back to back)."""
        self.source.send_nowait(self._rx_frame(frame))

    def attach(self, responder):
        """Connect a responder model: the core's packets to its QPN go to it (they
        stay in ``received`` too), and its answers go into the core when due."""
        self._responders[responder.qpn] = responder

    def attach_switch(self, switch):
        """Put a congested switch between the core and the attached responders: the
        core's RoCEv2 frames reach them as they leave its queue (ECN-marked or not),
        and its PFC or PAUSE frames go into the core."""
        self.switch = switch

    def _serve_switch(self):
        """Hand the frames that left the switch to their responders, and its pause
        frames to the core."""
        forwarded, upstream = self.switch.poll(self.cycle)
        for frame in upstream:
            self.source.send_nowait(self._rx_frame(frame))
        for frame in forwarded:
            responder = self._responders.get(Ether(frame)[BTH].dqpn)
            if responder is not None:
                responder.receive(frame, self.cycle)
                self._serve(responder)
        self._switch_due = self.switch.next_due

    def _serve(self, responder):
        """Send the responder's frames that are due, and note when it is due next."""
        for frame in responder.poll(self.cycle):
            self.answers.append((self.cycle, frame))
            self.source.send_nowait(self._rx_frame(frame))
        times = [due for due in (r.next_due for r in self._responders.values())
                 if due is not None]
        self._responder_due = min(times, default=None)

    def record_timing(self):
        """From now on note the cycle in which each frame's last beat goes into the core
        (``rx_last_cycles``) and in which each frame's first beat comes out, with the frame
        (``tx_first_cycles``): the cycles of :attr:`cycle`, each beat seen at the clock
        edge that takes it."""
        self.timing = True

    def first_beat_cycle(self, frame):
        """The cycle of the first beat of ``frame`` (one the core sent since
        :meth:`record_timing`)."""
        return next(cycle for cycle, sent in self.tx_first_cycles if sent is frame)

    async def wait_sent(self):
        await self.source.wait()

    async def recv(self, timeout_cycles=20_000):
        """The next frame the core transmits, but its ARP requests (see ``arp_requests``)."""
        async def wait():
            while not self.received:
                self._arrival.clear()
                await self._arrival.wait()
            return self.received.popleft()
        return await with_timeout(wait(), timeout_cycles * CLOCK_PERIOD_PS, "ps")

    async def idle(self, cycles):
        await ClockCycles(self.dut.clk, cycles)

    def line_cycles(self):
        """Cycles the line was busy from the first beat of a RoCEv2 frame on until it has
        sent the last RoCEv2 frame, its FCS and gap included (``line=True``); the other
        frames in between count too."""
        return self.tx_last_cycle - self.tx_first_cycle + 1 + \
            self._line_debt / LINE_BYTES_PER_CYCLE

    def counters(self):
        return _decode(NetworkCore.counters_layout(), self.dut.counters.value.to_unsigned())

    async def _transmit_monitor(self):
        dut, width = self.dut, self.width
        frame = bytearray()
        while True:
            await RisingEdge(dut.clk)
            self.cycle += 1
            if self._responder_due is not None and self._responder_due <= self.cycle:
                for responder in list(self._responders.values()):
                    due = responder.next_due
                    if due is not None and due <= self.cycle:
                        self._serve(responder)
            if self._switch_due is not None and self._switch_due <= self.cycle:
                self._serve_switch()
            if dut.tx__tvalid.value == 1:
                self.tx_cycles_valid += 1
                if dut.tx__tready.value == 1:
                    self.tx_beats += 1
                    if not frame:
                        self._frame_start = self.cycle
                    keep = dut.tx__tkeep.value.to_unsigned()
                    count = bin(keep).count("1")
                    assert keep == (1 << count) - 1, f"tkeep {keep:#x} is not contiguous"
                    beat = dut.tx__tdata.value.to_unsigned().to_bytes(width, "little")
                    frame += beat[:count]
                    last = dut.tx__tlast.value == 1
                    self._line_credit -= count + (LINE_OVERHEAD if last else 0)
                    if last and _is_roce(frame):
                        if self.tx_first_cycle is None:
                            self.tx_first_cycle = self._frame_start
                        self.tx_last_cycle = self.cycle
                        self._line_debt = max(0.0, -self._line_credit)
                    if last:
                        self._deliver(bytes(frame))
                        frame = bytearray()
                    else:
                        assert count == width, "a beat before the last is not full"
            if self.timing and dut.rx__tvalid.value == 1 and dut.rx__tlast.value == 1:
                self.rx_last_cycles.append(self.cycle)
            if self.line:
                self._line_credit = min(self._line_credit + LINE_BYTES_PER_CYCLE, width)
                ready = self._line_credit > 0
            else:
                ready = self.tx_ready >= 1 or self.rng.random() < self.tx_ready
            dut.tx__tready.value = int(ready)

    def _deliver(self, frame):
        self.pcap.write(frame, self._now_ns())
        if self.timing:
            self.tx_first_cycles.append((self._frame_start, frame))
        if self.forward is not None:
            self.forward(frame)
            return
        packet = Ether(frame)
        if ARP in packet and packet[ARP].op == 1:
            self.arp_requests.append(packet)
            mac = self.peers.get(packet[ARP].pdst)
            if mac is None:
                return
            if self.arp_replies_to_lose:
                self.arp_replies_to_lose -= 1
                return
            reply = (Ether(src=mac, dst=packet.src) /
                     ARP(op=2, hwsrc=mac, psrc=packet[ARP].pdst,
                         hwdst=packet[ARP].hwsrc, pdst=packet[ARP].psrc))
            cocotb.start_soon(self.send(bytes(reply)))
            return
        if UDP in packet and packet[UDP].sport == CM_PORT:
            self.cm_replies.append(frame)
            self._cm_arrival.set()
            return
        self.received.append(frame)
        self._arrival.set()
        if BTH in packet:                           # Scapy's BTH: UDP port 4791
            self.roce_sent.append((self.cycle, packet[BTH].dqpn, packet[BTH].psn))
            responder = self._responders.get(packet[BTH].dqpn)
            if self.switch is not None:
                self.switch.receive(frame, self.cycle)
                self._serve_switch()
            elif responder is not None:
                responder.receive(frame, self.cycle)
                self._serve(responder)

    def close(self):
        self.pcap.close()


class EventCoreBench(NetworkBench):
    """:class:`NetworkBench` on the benches' build with its source on (``use_source``):
    the source holds the user request ports, so the bench drives none and reads the
    source's status instead of completions."""

    SOURCE = True

    async def _request_driver(self):
        pass

    async def _payload_driver(self):
        pass

    async def _completion_monitor(self):
        pass

    async def configure_source(self, **config):
        """Write the source's configuration (fields of EVENT_CONFIG)."""
        await self._put("source_config", EVENT_CONFIG, config)

    def source_status(self):
        return _decode(EVENT_STATUS, self.dut.source_status.value.to_unsigned())

    async def wait_source(self, condition, timeout_cycles):
        for _ in range(timeout_cycles // 10):
            if condition(self.source_status()):
                return
            await self.idle(10)
        raise AssertionError(f"source status after {timeout_cycles} cycles: "
                             f"{self.source_status()}")
