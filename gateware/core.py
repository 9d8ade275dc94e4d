"""The whole vendor-free endpoint: everything between the MAC's two AXI-Streams."""

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out, connect, flipped

from .arp.layer import ARP_COUNTERS, ArpLayer
from .cm.datagram import CM_PORT
from .cm.ib_cm import IbCm
from .cm.lease import lease_tick
from .cm.manager import CM_CONFIG, CONNECT_REQUEST, ConnectionManager, access_list
from .cm.qp1 import QP1_COUNTERS, Qp1Receiver, Qp1Split, Qp1Transmitter
from .config import NetworkConfig, config_value
from .counters import COUNTER_BITS
from .eth.mac_control import PAUSE_CONFIG, ROCE_PRIORITY, MacControl, quantum_cycles_at
from .eth.rx import EthernetReceiver
from .eth.tx import ETH_TX_META, EthernetTransmitter
from .headers import UDP_PORT_ROCEV2
from .icmp.echo import ICMP_COUNTERS, IcmpEcho
from .ip.rx import IPv4Receiver
from .ip.tx import IP_TX_META, NEXT_HOP_META, IPv4Transmitter
from .packet.arbiter import PacketArbiter
from .packet.gate import PacketGate
from .packet.register import PacketRegister
from .roce.ack import ACK_COUNTERS, AckReceiver
from .roce.dcqcn import DCQCN_CONFIG, DCQCN_DEFAULTS
from .roce.generator_pool import GeneratorPool
from .roce.icrc import IcrcInserter
from .roce.pacer import PacedGate
from .roce.planner import TRANSMIT_CONFIG
from .roce.request_arbiter import RequestArbiter
from .roce.requests import (
    COMPLETION,
    CONNECTION_EVENT,
    QP_INDEX_BITS,
    QP_STATUS,
    QP_WRITE,
    WORK_REQUEST,
    PathMtu,
)
from .roce.timers import ticks_at
from .roce.tx import RequesterTransmitter
from .stream import BEAT_BYTES, NO_META, axi_stream_signature
from .udp.echo import UdpEcho
from .udp.rx import UdpReceiver
from .udp.tx import UDP_TX_META, UdpTransmitter

__all__ = ["NetworkCore", "ECHO_PORT", "CMAC_CLOCK_HZ", "DSCP_ROCE", "TOS_ECT0",
           "IB_CM_REQ_TIMEOUT"]

#: The CMAC's user clock on the VCU118 (the core's ``sync`` domain there).
CMAC_CLOCK_HZ = 322_265_625

#: UDP echo service (RFC 862), for bring-up.
ECHO_PORT = 7

#: DSCP of RoCEv2 packets by default: 26, the common lossless RoCE class (priority 3
#: on a ConnectX with ``mlnx_qos --trust dscp``).
DSCP_ROCE = 26

#: Default IPv4 traffic class of RoCEv2 packets: DSCP 26, ECN ECT(0), so that
#: ECN-capable switches mark instead of dropping.
TOS_ECT0 = DSCP_ROCE << 2 | 0b10

#: The ECN field of RoCEv2 packets (RFC 3168): ECT(0) while DCQCN reacts to the CNPs
#: that marks bring, Not-ECT when it is off (whatever ``roce_config.tos`` says).
ECN_ECT0 = 0b10
ECN_NOT_ECT = 0b00

#: The CM Response Timeouts of the endpoint's REQ (CONNECT): 2^(18 - 8) ms, about a
#: second, between its REQs, and the time it gives the host to answer one.
IB_CM_REQ_TIMEOUT = 18


class NetworkCore(wiring.Component):
    """The RoCEv2 endpoint over Ethernet, ARP, IPv4, ICMP echo and UDP on the
    MAC's 512-bit streams.

    ``rx`` takes frames from the MAC without FCS (``tuser`` set with the last
    beat marks a bad frame; there is no ``tready``); ``tx`` gives frames to
    the MAC, which adds the FCS. ``config`` writes our MAC and IPv4 addresses,
    netmask and gateway at run time; until written they are the build-time
    defaults. ``counters`` holds every drop and event counter, by layer.

    ``roce_config`` sets the RoCEv2 traffic class and the cycles of the IB
    timers' 4.096 us tick (default: at ``clock_hz``); ``pause_config`` the
    PAUSE/PFC settings (see :class:`~gateware.eth.mac_control.MacControl`):
    while the link pauses them no RoCEv2 frame starts (a PAUSE: no frame at
    all) and the ACK timers stand still; ``dcqcn_config`` the DCQCN
    reaction point (on by default, with ConnectX's defaults; its ``enable`` also
    picks the ECN field: ECT(0) when on, Not-ECT when off); ``qp_status_select`` →
    ``qp_status``: that QP's reliability state and counters, a cycle later.

    The connection manager on UDP port 17185 opens and closes QPs and starts
    the generator's runs; ``qp_write`` sets a QP directly (user logic), out
    of the connection manager's sight. ``connection`` tells user logic of each
    QP the connection manager opens (with the host's buffer address and rkey)
    and frees (closed or expired), through a queue of 4 events; user logic that
    takes none never stalls the connection manager (an event that finds the
    queue full is dropped and counted in ``counters.cm.events_lost``). QP1
    takes the IB CM's MADs (UDP port 4791, destination QP 1; see
    :mod:`~gateware.cm.qp1`), each valid one counted in ``counters.qp1``, and
    answers a host's ``rdma_connect`` on the rdma_cm port 17185
    (:class:`~gateware.cm.ib_cm.IbCm`: REQ → REP or REJ, RTU; DREQ → DREP;
    counted in ``counters.ib_cm``): the QP it sets up is the connection manager's,
    taken (the first free QP after the last one an IB open took, so a host that
    reconnects gets another) and freed as OPEN_QP's and CLOSE_QP's are, and served by
    STATUS, starts, CLOSE_QP and the lease as any. The host's DREQ frees it; freed
    by CLOSE_QP, close-all or the lease, its host gets a DREQ, retransmitted until
    DREP. The other way round, a host's CONNECT datagram or user logic's ``connect``
    makes the endpoint open a connection to a host's rdma_cm listener (its REQ every
    2^(:data:`IB_CM_REQ_TIMEOUT` - 8) ms, five times at most; the REP answered with
    RTU), reported by CONNECT/ACK or NAK and a ``connection`` event. The comm IDs
    start at a free-running counter that reset does not clear, XOR the MAC's low 32
    bits, sampled after reset.

    Parameters
    ----------
    mac, ip, netmask, gateway : str
        Build-time defaults of the addresses.
    clock_hz : int
        Frequency of the ``sync`` domain; sets the ARP, CM, IB, IB CM (the REP's
        ms tick) and DCQCN timers (the VCU118 top builds the core at 250 MHz).
    arp_retry_interval, arp_lifetime : int or None
        ARP timers in cycles (default: 1 s and 60 s at ``clock_hz``).
    ib_cm_ms : int or None
        Cycles of the IB CM's millisecond, the unit of its REP and DREQ timers
        (default: 1 ms at ``clock_hz``).
    rx_depth : int
        Beats of the receive FIFO (holds the frame being received; 512 beats
        take a 9000-byte jumbo frame with room to spare).
    qps : int
        RoCEv2 queue pairs (QPN 256 + index).
    retransmit_beats : int
        Beats (64 bytes) of each QP's retransmit ring, a power of 2: the most
        payload a QP may have unacknowledged (``roce_config.qp_pages`` caps it
        lower at run time). The default, 128 KiB, is 10.5 us at 100 Gb/s, more
        than a 10 us round trip and the ACK timeout of 8.2 us (timeout 1).
    retransmit_pages : int
        Pages (4 KiB) of the retransmit pool all QPs share, a power of 2. A QP
        takes pages as it sends and gives them back as its packets are
        acknowledged (an idle QP holds none), so the pool is sized by the
        bandwidth-delay product, not the QP count: the default, 2 MiB, is
        168 us of a 100 Gb/s line, 16 round trips of 10 us in flight.
    messages : int
        Unacknowledged messages a QP may have, a power of 2: its cap on the pool of
        message slots. The default, 1,024, keeps the line full of 64-byte messages
        on one QP at a 10 us round trip (770 messages).
    message_slots : int
        Message slots all QPs share, a power of 2: outstanding messages, plus one
        per QP for its next message (so more than ``qps``).
        A slot costs a little over 30 bytes of block RAM (twice: two readers).
    generator_runs : int
        Generator runs that may be in progress at once (each on its own QP).
    path_mtu, qp_timeout, retry_count, rnr_retry :
        Defaults of the QPs the connection manager opens (``cm_config`` sets
        them at run time): path MTU when OPEN_QP leaves it to us, ACK timeout
        (4.096 us × 2^t), retries after timeouts and NAKs, RNR retries (7:
        without limit).
    cm_lease : int or None
        Cycles an idle or failed QP lives without a CM request from its host
        (default 60 s at ``clock_hz``; 0: for ever). ``cm_config`` sets it at
        run time (``lease_tick``: the lease / ``LEASE_SWEEPS``), and the CM's
        access list, by default the subnet of ``ip``/``netmask``.
    roce_priority, pause_quantum_cycles : int
        Defaults of ``pause_config``: the priority whose PFC frames pause RoCEv2
        frames, and the cycles of a pause quantum in 8.8 fixed point (default: 512
        bit times of a 100 Gb/s line at ``clock_hz``).
    """

    def __init__(self, *, mac="02:00:00:00:00:02", ip="10.77.0.2", netmask="255.255.255.0",
                 gateway="0.0.0.0", clock_hz=CMAC_CLOCK_HZ, arp_retry_interval=None,
                 arp_lifetime=None, arp_retries=3, ib_cm_ms=None, rx_depth=512,
                 echo_depth=256, qps=16,
                 retransmit_beats=2048, retransmit_pages=512, messages=1024,
                 message_slots=4096,
                 generator_runs=4,
                 path_mtu=PathMtu.MTU_4096, qp_timeout=14, retry_count=7, rnr_retry=7,
                 cm_lease=None, roce_priority=ROCE_PRIORITY, pause_quantum_cycles=None,
                 width=BEAT_BYTES):
        self._defaults = config_value(mac=mac, ip=ip, netmask=netmask, gateway=gateway)
        self._arp_retry_interval = arp_retry_interval or clock_hz
        self._arp_lifetime = arp_lifetime or 60 * clock_hz
        self._arp_retries = arp_retries
        self._rx_depth = rx_depth
        self._echo_depth = echo_depth
        self._qps = qps
        self._retransmit_beats = retransmit_beats
        self._retransmit_pages = retransmit_pages
        self._messages = messages
        self._message_slots = message_slots
        self._generator_runs = generator_runs
        self._cm_defaults = CM_CONFIG.const({
            "path_mtu": path_mtu, "timeout": qp_timeout, "retry_count": retry_count,
            "rnr_retry": rnr_retry, **access_list(ip, netmask),
            "lease_tick": lease_tick(60 * clock_hz if cm_lease is None else cm_lease)})
        self._tick = ticks_at(clock_hz)
        self._ms_cycles = ib_cm_ms or round(clock_hz / 1000)
        self._pause_defaults = PAUSE_CONFIG.const({
            "roce_priority": roce_priority,
            "quantum_cycles": pause_quantum_cycles or quantum_cycles_at(clock_hz)})
        self._dcqcn_defaults = DCQCN_CONFIG.const(DCQCN_DEFAULTS(clock_hz))
        self._width = width
        super().__init__({
            "rx": In(axi_stream_signature(width=width, ready=False)),
            "tx": Out(axi_stream_signature(width=width)),
            "config": In(stream.Signature(NetworkConfig)),
            "counters": Out(self.counters_layout()),
            "work_request": In(stream.Signature(WORK_REQUEST)),
            "payload": In(axi_stream_signature(width=width)),
            "completion": Out(stream.Signature(COMPLETION)),
            "qp_write": In(stream.Signature(QP_WRITE)),
            "cm_config": In(stream.Signature(CM_CONFIG)),
            "roce_config": In(stream.Signature(TRANSMIT_CONFIG)),
            "pause_config": In(stream.Signature(PAUSE_CONFIG)),
            "dcqcn_config": In(stream.Signature(DCQCN_CONFIG)),
            "qp_status_select": In(QP_INDEX_BITS),
            "qp_status": Out(QP_STATUS),
            "connection": Out(stream.Signature(CONNECTION_EVENT)),
            "connect": In(stream.Signature(CONNECT_REQUEST)),
        })

    @staticmethod
    def counters_layout():
        return data.StructLayout({
            "eth": EthernetReceiver.counters_layout(),
            "ip": IPv4Receiver.counters_layout(),
            "udp": UdpReceiver.counters_layout(),
            "arp": ARP_COUNTERS,
            "icmp": ICMP_COUNTERS,
            "udp_echo_dropped": unsigned(COUNTER_BITS),
            "roce_ack": ACK_COUNTERS,
            "roce_tx": RequesterTransmitter.counters_layout(),
            "cm": ConnectionManager.counters_layout(),
            "generator": GeneratorPool.counters_layout(),
            "mac_control": MacControl.counters_layout(),
            "qp1": QP1_COUNTERS,
            "ib_cm": IbCm.counters_layout(),
        })

    def elaborate(self, platform):
        m = Module()
        width = self._width

        config = Signal(NetworkConfig, init=self._defaults)
        m.d.comb += self.config.ready.eq(1)
        with m.If(self.config.valid):
            m.d.sync += config.eq(self.config.p)

        m.submodules.eth_rx = eth_rx = EthernetReceiver(depth=self._rx_depth, width=width)
        m.submodules.mac_control = mac_control = MacControl(width=width)
        m.submodules.arp = arp = ArpLayer(lifetime=self._arp_lifetime,
                                          retry_interval=self._arp_retry_interval,
                                          retries=self._arp_retries,
                                          patient_ports=(UDP_PORT_ROCEV2, CM_PORT), width=width)
        m.submodules.ip_rx = ip_rx = IPv4Receiver(width=width)
        m.submodules.icmp = icmp = IcmpEcho(depth=self._echo_depth, width=width)
        m.submodules.udp_rx = udp_rx = UdpReceiver([ECHO_PORT, UDP_PORT_ROCEV2, CM_PORT],
                                                   width=width)
        m.submodules.cm = cm = ConnectionManager(qps=self._qps, width=width)
        m.submodules.qp1_split = qp1_split = Qp1Split(width=width)
        m.submodules.ack_rx = ack_rx = AckReceiver(qps=self._qps, width=width)
        m.submodules.qp1_rx = qp1_rx = Qp1Receiver(width=width)
        m.submodules.qp1_tx = qp1_tx = Qp1Transmitter(width=width)
        m.submodules.ib_cm = ib_cm = IbCm(qps=self._qps, port=CM_PORT)
        m.submodules.udp_echo = udp_echo = UdpEcho(depth=self._echo_depth, width=width)
        m.submodules.generator = generator = GeneratorPool(
            qps=self._qps, runs=self._generator_runs, width=width)
        m.submodules.requests = requests = RequestArbiter(inputs=2, width=width)
        m.submodules.roce_tx = roce_tx = RequesterTransmitter(
            qps=self._qps, ring_beats=self._retransmit_beats,
            pages=self._retransmit_pages, messages=self._messages,
            message_slots=self._message_slots, width=width,
            paced_readers=1 + self._generator_runs)
        m.submodules.udp_mux = udp_mux = PacketArbiter(UDP_TX_META, inputs=4, width=width)
        m.submodules.udp_tx = udp_tx = UdpTransmitter(width=width)
        m.submodules.ip_mux = ip_mux = PacketArbiter(IP_TX_META, inputs=2, priority=True,
                                                     width=width)
        m.submodules.ip_tx = ip_tx = IPv4Transmitter(width=width)
        m.submodules.icrc = icrc = IcrcInserter(width=width)
        # Register slices on the transmit path between the layers whose logic is
        # combinational (latency 0), so no path spans several of them.
        m.submodules.ip_out = ip_out = PacketRegister(NEXT_HOP_META, width=width)
        m.submodules.arp_out = arp_out = PacketRegister(ETH_TX_META, width=width)
        m.submodules.mac_out = mac_out = PacketRegister(NO_META, width=width)
        m.submodules.eth_tx = eth_tx = EthernetTransmitter(width=width)
        # PAUSE and PFC hold frames at their start: RoCEv2 frames as they leave the
        # requester (so the others pass meanwhile), and every frame before the MAC.
        m.submodules.roce_gate = roce_gate = PacketGate(UDP_TX_META, width=width)
        m.submodules.pause_gate = pause_gate = PacketGate(width=width)   # before the MAC
        # And after UDP and ICMP. (On the receive path, each layer's router ends in one.)
        m.submodules.udp_out = udp_out = PacketRegister(IP_TX_META, width=width)
        m.submodules.icmp_out = icmp_out = PacketRegister(IP_TX_META, width=width)
        # And after the connection manager, whose replies leave straight from its FSM.
        m.submodules.cm_out = cm_out = PacketRegister(UDP_TX_META, width=width)
        m.submodules.qp1_out = qp1_out = PacketRegister(UDP_TX_META, width=width)
        for layer in (eth_rx, arp, ip_rx, ip_tx, eth_tx):
            m.d.comb += layer.i_config.eq(config)

        # Receive: MAC → Ethernet → ARP | IPv4 → ICMP | UDP → services.
        m.d.comb += [
            eth_rx.i.valid.eq(self.rx.tvalid),
            eth_rx.i.p.data.eq(self.rx.tdata),
            eth_rx.i.p.keep.eq(self.rx.tkeep),
            eth_rx.i.p.last.eq(self.rx.tlast),
            eth_rx.i_error.eq(self.rx.tuser),
        ]
        connect(m, eth_rx.o_arp, arp.i_rx)
        connect(m, eth_rx.o_ipv4, ip_rx.i)
        connect(m, ip_rx.o_icmp, icmp.i)
        connect(m, ip_rx.o_udp, udp_rx.i)
        connect(m, udp_rx.o[0], udp_echo.i)
        connect(m, udp_rx.o[1], qp1_split.i)
        connect(m, qp1_split.o_other, ack_rx.i)
        connect(m, qp1_split.o_qp1, qp1_rx.i)
        connect(m, udp_rx.o[2], cm.i)
        connect(m, eth_rx.o_mac_control, mac_control.i)

        # PAUSE and PFC: the timers, their settings, and what they stop.
        pause_config = Signal(PAUSE_CONFIG, init=self._pause_defaults)
        m.d.comb += self.pause_config.ready.eq(1)
        with m.If(self.pause_config.valid):
            m.d.sync += pause_config.eq(self.pause_config.p)
        m.d.comb += [
            mac_control.i_config.eq(pause_config),
            roce_gate.i_hold.eq(mac_control.o_pause_roce),
            # A PAUSE holds every frame before the MAC; a PFC holds RoCEv2 frames only where
            # they leave the requester (roce_gate): held before the MAC, one would hold the
            # ARP, ICMP and CM frames behind it until the pause ends.
            pause_gate.i_hold.eq(mac_control.o_pause_all),
            roce_tx.i_paused.eq(mac_control.o_pause_roce),
        ]

        # Connection manager: sets and closes QPs, starts runs, reads status.
        cm_config = Signal(CM_CONFIG, init=self._cm_defaults)
        m.d.comb += self.cm_config.ready.eq(1)
        with m.If(self.cm_config.valid):
            m.d.sync += cm_config.eq(self.cm_config.p)
        m.d.comb += [
            cm.i_ip.eq(config.ip),
            cm.i_config.eq(cm_config),
        ]
        connect(m, flipped(self.qp_write), cm.i_qp_write)
        connect(m, cm.o_qp_write, roce_tx.i_qp_write)
        connect(m, cm.o_qp_close, roce_tx.i_qp_close)
        connect(m, cm.o_start, generator.i_start)
        connect(m, cm.o_stop, generator.i_stop)
        connect(m, cm.o_credit, generator.i_credit)
        connect(m, cm.o_connection, flipped(self.connection))
        connect(m, flipped(self.connect), cm.i_connect)
        m.d.comb += [
            generator.query_qp.eq(cm.run_qp),
            cm.run.eq(generator.query),
            cm.start_taken.eq(generator.start_taken),
            roce_tx.status_qp[1].eq(cm.status_qp),
            cm.status.eq(roce_tx.status[1]),
        ]

        # RoCEv2 requester: user logic | generator → transmit engine.
        roce_config = Signal(TRANSMIT_CONFIG, init={"tos": TOS_ECT0, "tick": self._tick})
        m.d.comb += self.roce_config.ready.eq(1)
        with m.If(self.roce_config.valid):
            m.d.sync += roce_config.eq(self.roce_config.p)
        m.d.comb += [
            roce_tx.i_config.eq(roce_config),
            requests.i_payload[0].valid.eq(self.payload.tvalid),
            requests.i_payload[0].p.data.eq(self.payload.tdata),
            requests.i_payload[0].p.keep.eq(self.payload.tkeep),
            requests.i_payload[0].p.last.eq(self.payload.tlast),
            self.payload.tready.eq(requests.i_payload[0].ready),
        ]
        # DCQCN: its settings; the ECN field says whether it is on (RFC 3168: ECT(0)
        # only from a sender that reacts to congestion); user requests of a paced QP
        # wait at the work_request port, the generator's runs are passed over.
        dcqcn_config = Signal(DCQCN_CONFIG, init=self._dcqcn_defaults)
        m.d.comb += self.dcqcn_config.ready.eq(1)
        with m.If(self.dcqcn_config.valid):
            m.d.sync += dcqcn_config.eq(self.dcqcn_config.p)
        m.submodules.paced_gate = paced_gate = PacedGate()
        m.d.comb += [
            roce_tx.i_dcqcn.eq(dcqcn_config),
            # (the traffic class's ECN bits, over the roce_config assignment above)
            roce_tx.i_config.tos.eq(Cat(Mux(dcqcn_config.enable, ECN_ECT0, ECN_NOT_ECT),
                                        roce_config.tos[2:])),
        ]
        # The pacer's lookups: the user's requests' gate, then each generator run's.
        connect(m, paced_gate.r_paced, roce_tx.paced[0])
        for index in range(self._generator_runs):
            connect(m, generator.r_paced[index], roce_tx.paced[1 + index])
        # QP1: the IB CM's passive side between its receiver and transmitter, its QPs
        # taken and freed by the connection manager. Its MADs get the RoCEv2 DSCP,
        # Not-ECT (nothing slows them down when marked). The comm ID seed: a counter
        # that reset leaves running, so each reset starts the comm IDs elsewhere.
        connect(m, qp1_rx.o, ib_cm.i)
        connect(m, ib_cm.o, qp1_tx.i)
        connect(m, ib_cm.o_open, cm.i_ib_open)
        connect(m, cm.o_ib_opened, ib_cm.i_opened)
        connect(m, ib_cm.o_close, cm.i_ib_close)
        connect(m, cm.o_ib_closed, ib_cm.i_closed)
        connect(m, cm.o_ib_connect, ib_cm.i_connect)
        connect(m, ib_cm.o_connected, cm.i_ib_connected)
        seed = Signal(32, reset_less=True)
        m.d.sync += seed.eq(seed + 1)
        m.d.comb += [
            ib_cm.i_config.mac.eq(config.mac),
            ib_cm.i_config.ip.eq(config.ip),
            ib_cm.i_config.max_mtu.eq(PathMtu.MTU_4096),
            ib_cm.i_config.ms_cycles.eq(self._ms_cycles),
            ib_cm.i_config.req_timeout.eq(IB_CM_REQ_TIMEOUT),
            ib_cm.i_seed.eq(seed ^ config.mac[:32]),
            qp1_tx.i_tos.eq(Cat(C(ECN_NOT_ECT, 2), roce_config.tos[2:])),
        ]
        connect(m, flipped(self.work_request), paced_gate.i)
        connect(m, paced_gate.o, requests.i_request[0])
        connect(m, generator.o_request, requests.i_request[1])
        connect(m, generator.o_payload, requests.i_payload[1])
        connect(m, requests.o_request, roce_tx.i_request)
        connect(m, requests.o_payload, roce_tx.i_payload)
        connect(m, roce_tx.o_completion, flipped(self.completion))
        connect(m, ack_rx.o, roce_tx.i_ack)
        connect(m, ack_rx.o_icrc_error, roce_tx.i_icrc_error)
        connect(m, ack_rx.o_cnp, roce_tx.i_cnp)
        m.d.comb += [
            roce_tx.status_qp[0].eq(self.qp_status_select),
            self.qp_status.eq(roce_tx.status[0]),
        ]

        # Transmit: services → UDP → IPv4 (with ICMP first) → ICRC → ARP → Ethernet → pause
        # gate → MAC.
        connect(m, udp_echo.o, udp_mux.i[0])
        connect(m, cm.o, cm_out.i)
        connect(m, cm_out.o, udp_mux.i[1])
        connect(m, roce_tx.o, roce_gate.i)
        connect(m, roce_gate.o, udp_mux.i[2])
        connect(m, qp1_tx.o, qp1_out.i)
        connect(m, qp1_out.o, udp_mux.i[3])
        connect(m, udp_mux.o, udp_tx.i)
        connect(m, icmp.o, icmp_out.i)
        connect(m, icmp_out.o, ip_mux.i[0])
        connect(m, udp_tx.o, udp_out.i)
        connect(m, udp_out.o, ip_mux.i[1])
        connect(m, ip_mux.o, ip_tx.i)
        connect(m, ip_tx.o, ip_out.i)
        connect(m, ip_out.o, icrc.i)
        connect(m, icrc.o, arp.i_ip)
        connect(m, arp.o, arp_out.i)
        connect(m, arp_out.o, eth_tx.i)
        connect(m, eth_tx.o, pause_gate.i)
        connect(m, pause_gate.o, mac_out.i)
        m.d.comb += [
            self.tx.tvalid.eq(mac_out.o.valid),
            self.tx.tdata.eq(mac_out.o.p.data),
            self.tx.tkeep.eq(mac_out.o.p.keep),
            self.tx.tlast.eq(mac_out.o.p.last),
            mac_out.o.ready.eq(self.tx.tready),
        ]

        m.d.comb += [
            self.counters.eth.eq(eth_rx.o_counters),
            self.counters.ip.eq(ip_rx.o_counters),
            self.counters.udp.eq(udp_rx.o_counters),
            self.counters.arp.eq(arp.o_counters),
            self.counters.icmp.eq(icmp.o_counters),
            self.counters.udp_echo_dropped.eq(udp_echo.o_dropped),
            self.counters.roce_ack.eq(ack_rx.o_counters),
            self.counters.roce_tx.eq(roce_tx.counters),
            self.counters.cm.eq(cm.o_counters),
            self.counters.generator.eq(generator.o_counters),
            self.counters.mac_control.eq(mac_control.o_counters),
            self.counters.qp1.eq(qp1_rx.o_counters),
            self.counters.ib_cm.eq(ib_cm.o_counters),
        ]
        return m
