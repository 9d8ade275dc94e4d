from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..headers import BTH, IMMDT, RETH, UDP_PORT_ROCEV2
from .descriptor import MAX_PACKET_PAYLOAD, PACKET_DESCRIPTOR
from .opcodes import Opcode
from .qp_table import PSN_UPDATE
from .requests import (
    MAX_MESSAGE_BYTES,
    QP_INDEX_BITS,
    QP_STATE,
    WORK_REQUEST,
    CompletionStatus,
    PathMtu,
    Verb,
)

__all__ = ["PacketPlanner", "TRANSMIT_CONFIG", "PKEY_DEFAULT"]

#: Settings of the transmit engine that hold for every QP.
TRANSMIT_CONFIG = data.StructLayout({
    "tos": 8,               # IPv4 DSCP/ECN byte of every RoCEv2 packet
    "ack_interval": 16,     # AckReq also on every N-th packet of a message (0: last only)
})

#: The default partition key (full membership), the only one RoCE uses.
PKEY_DEFAULT = 0xFFFF

#: RoCEv2 source ports lie in 0xC000–0xFFFF (IBTA annex A17): these bits are always set.
ROCEV2_SOURCE_PORTS = 0xC000


def _opcode(verb, first, last):
    """The RC opcode of a packet: the verb's family, and where the packet sits."""
    write = verb in (Verb.RDMA_WRITE, Verb.RDMA_WRITE_WITH_IMMEDIATE)
    immediate = verb in (Verb.RDMA_WRITE_WITH_IMMEDIATE, Verb.SEND_WITH_IMMEDIATE)
    family = "RDMA_WRITE" if write else "SEND"
    position = {(1, 1): "ONLY", (1, 0): "FIRST", (0, 0): "MIDDLE", (0, 1): "LAST"}[first, last]
    suffix = "_WITH_IMMEDIATE" if immediate and last else ""
    return Opcode[f"{family}_{position}{suffix}"]


class PacketPlanner(wiring.Component):
    """Cuts each work request into packets by its QP's path MTU.

    For every packet it hands the segmenter a descriptor: the BTH (opcode by
    position in the message, PSN counting modulo 2^24 from the QP's next PSN,
    AckReq on the last packet and on every ``ack_interval``-th), the RETH on
    the first packet of an RDMA WRITE, the ImmDt on the last packet of the
    immediate verbs, pad count, the UDP/IPv4 destination, and the payload
    bytes of the packet (UDP source port: the QP's, with its top two bits set,
    so always in 0xC000–0xFFFF). It reads the QP's state from the table when it takes
    a work request and writes the next PSN back with the last packet.

    A request for a QP index past ``qps``, longer than 2^31 bytes, or for a QP
    without a valid path MTU yields one ``drop`` descriptor, so its payload is
    drained and its completion says BAD_REQUEST. Two cycles per message, then
    one descriptor per cycle.
    """

    def __init__(self, *, qps):
        self._qps = qps
        super().__init__({
            "i_request": In(stream.Signature(WORK_REQUEST)),
            "i_config": In(TRANSMIT_CONFIG),
            "read_qp": Out(QP_INDEX_BITS),
            "read_state": In(QP_STATE),
            "o_psn": Out(stream.Signature(PSN_UPDATE, always_ready=True)),
            "o_packet": Out(stream.Signature(PACKET_DESCRIPTOR)),
        })

    def elaborate(self, platform):
        m = Module()

        request = Signal(WORK_REQUEST)
        state = Signal(QP_STATE)
        mtu_bytes = Signal(range(MAX_PACKET_PAYLOAD + 1))
        remaining = Signal(32)
        psn = Signal(24)
        packets = Signal(24)
        ack_countdown = Signal(16)
        first = Signal()

        mtu_of_state = Signal.like(mtu_bytes)
        with m.Switch(self.read_state.path_mtu):
            for mtu in PathMtu:
                with m.Case(mtu):
                    m.d.comb += mtu_of_state.eq(mtu.bytes)

        last = remaining <= mtu_bytes
        payload_length = Mux(last, remaining, mtu_bytes)[:len(mtu_bytes)]
        pad = (-payload_length)[:2]
        verb = request.verb
        write = (verb == Verb.RDMA_WRITE) | (verb == Verb.RDMA_WRITE_WITH_IMMEDIATE)
        immediate = (verb == Verb.RDMA_WRITE_WITH_IMMEDIATE) | (verb == Verb.SEND_WITH_IMMEDIATE)
        has_reth = write & first
        has_immdt = immediate & last

        opcode = Signal(Opcode)
        with m.Switch(Cat(last, first, verb)):
            for verb_value in Verb:
                for first_value in (0, 1):
                    for last_value in (0, 1):
                        with m.Case(last_value | first_value << 1 | verb_value.value << 2):
                            m.d.comb += opcode.eq(_opcode(verb_value, first_value, last_value))

        descriptor = self.o_packet.p
        transport = descriptor.meta.transport
        bth = Signal(BTH)
        reth = Signal(RETH)
        immdt = Signal(IMMDT)
        ack_interval = self.i_config.ack_interval
        m.d.comb += [
            bth.opcode.eq(opcode),
            bth.pad_count.eq(pad),
            bth.pkey.eq(PKEY_DEFAULT),
            bth.dest_qp.eq(state.remote_qpn),
            bth.ack_request.eq(last | ((ack_interval != 0) & (ack_countdown == 1))),
            bth.psn.eq(psn),
            reth.virtual_address.eq(request.remote_address),
            reth.rkey.eq(state.rkey),
            reth.dma_length.eq(request.length),
            immdt.immediate.eq(request.immediate),
            transport.bth.eq(bth),
            # Extensions packed right behind the BTH (the wire's first byte is the MSB).
            transport.extensions.eq(Mux(has_reth, Cat(immdt, reth),
                                        Cat(C(0, RETH.size), immdt))),
            descriptor.meta.transport_length.eq(
                BTH.length + Mux(has_reth, RETH.length, 0) + Mux(has_immdt, IMMDT.length, 0)),
            descriptor.meta.dst_ip.eq(state.remote_ip),
            descriptor.meta.src_port.eq(state.src_port | ROCEV2_SOURCE_PORTS),
            descriptor.meta.dst_port.eq(UDP_PORT_ROCEV2),
            descriptor.meta.length.eq(descriptor.meta.transport_length + payload_length + pad
                                      + 4),
            descriptor.meta.tos.eq(self.i_config.tos),
            descriptor.payload_length.eq(payload_length),
            descriptor.message_end.eq(last),
            descriptor.completion.qp.eq(request.qp),
            descriptor.completion.tag.eq(request.tag),
            descriptor.completion.first_psn.eq(state.next_psn),
            descriptor.completion.packets.eq(packets + 1),
        ]

        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += [
                    self.i_request.ready.eq(1),
                    self.read_qp.eq(self.i_request.p.qp),
                ]
                with m.If(self.i_request.valid):
                    m.d.sync += request.eq(self.i_request.p)
                    m.next = "LOAD"

            with m.State("LOAD"):
                valid_mtu = Cat(self.read_state.path_mtu == mtu for mtu in PathMtu).any()
                too_long = request.length > MAX_MESSAGE_BYTES
                m.d.sync += [
                    state.eq(self.read_state),
                    mtu_bytes.eq(mtu_of_state),
                    remaining.eq(request.length),
                    psn.eq(self.read_state.next_psn),
                    packets.eq(0),
                    ack_countdown.eq(ack_interval),
                    first.eq(1),
                ]
                with m.If((request.qp >= self._qps) | too_long | ~valid_mtu):
                    m.next = "REFUSE"
                with m.Else():
                    m.next = "PLAN"

            with m.State("REFUSE"):
                m.d.comb += [
                    self.o_packet.valid.eq(1),
                    descriptor.drop.eq(1),
                    descriptor.message_end.eq(1),
                    descriptor.completion.status.eq(CompletionStatus.BAD_REQUEST),
                    descriptor.completion.packets.eq(0),
                ]
                with m.If(self.o_packet.ready):
                    m.next = "IDLE"

            with m.State("PLAN"):
                m.d.comb += self.o_packet.valid.eq(1)
                with m.If(self.o_packet.ready):
                    m.d.sync += [
                        remaining.eq(remaining - payload_length),
                        psn.eq(psn + 1),
                        packets.eq(packets + 1),
                        ack_countdown.eq(Mux(ack_countdown <= 1, ack_interval,
                                             ack_countdown - 1)),
                        first.eq(0),
                    ]
                    with m.If(last):
                        m.d.comb += [
                            self.o_psn.valid.eq(1),
                            self.o_psn.p.qp.eq(request.qp),
                            self.o_psn.p.psn.eq(psn + 1),
                        ]
                        m.next = "IDLE"

        return m
