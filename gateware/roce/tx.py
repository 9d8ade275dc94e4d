from amaranth import *
from amaranth.lib import fifo, stream, wiring
from amaranth.lib.wiring import In, Out, connect, flipped

from ..packet.insert import HeaderInserter
from ..packet.register import PacketRegister
from ..stream import BEAT_BYTES, NO_META, packet_signature
from ..udp.tx import UDP_TX_META
from .descriptor import PACKET_DESCRIPTOR, ROCE_TX_META, TRANSPORT, TRANSPORT_LENGTHS
from .planner import TRANSMIT_CONFIG, PacketPlanner
from .qp_table import QpTable
from .requests import COMPLETION, QP_WRITE, WORK_REQUEST
from .segmenter import PayloadSegmenter

__all__ = ["RequesterTransmitter"]


class RequesterTransmitter(wiring.Component):
    """The RoCEv2 requester's transmit engine: work requests and their payload
    in, UDP datagrams to port 4791 out (BTH, RETH, ImmDt, payload, pad, and a
    4-byte ICRC placeholder that the IP-level ICRC inserter fills).

    ``i_request`` takes one work request per message and ``i_payload`` its
    payload as one packet; ``o_completion`` reports each message once its
    last packet has left. ``i_qp_write`` sets a QP's transmit state. Planner →
    descriptor FIFO → segmenter → register → transport header inserter →
    register: 2 cycles of latency on the data path, one beat per cycle, no
    idle cycle between the packets of a message.
    """

    def __init__(self, *, qps=16, width=BEAT_BYTES, descriptors=4):
        self._qps = qps
        self._width = width
        self._descriptors = descriptors
        super().__init__({
            "i_request": In(stream.Signature(WORK_REQUEST)),
            "i_payload": In(packet_signature(NO_META, width=width)),
            "i_qp_write": In(stream.Signature(QP_WRITE)),
            "i_config": In(TRANSMIT_CONFIG),
            "o": Out(packet_signature(UDP_TX_META, width=width)),
            "o_completion": Out(stream.Signature(COMPLETION)),
        })

    @property
    def qps(self):
        return self._qps

    def elaborate(self, platform):
        m = Module()
        width = self._width

        m.submodules.table = table = QpTable(self._qps)
        m.submodules.planner = planner = PacketPlanner(qps=self._qps)
        m.submodules.descriptors = descriptors = fifo.SyncFIFOBuffered(
            width=PACKET_DESCRIPTOR.size, depth=self._descriptors)
        m.submodules.segmenter = segmenter = PayloadSegmenter(width=width)
        m.submodules.segmented = segmented = PacketRegister(ROCE_TX_META, width=width)
        m.submodules.transport = transport = HeaderInserter(
            "transport", TRANSPORT, ROCE_TX_META, width=width, lengths=TRANSPORT_LENGTHS)
        m.submodules.framed = framed = PacketRegister(UDP_TX_META, width=width)

        connect(m, flipped(self.i_qp_write), table.i_write)
        connect(m, planner.o_psn, table.i_psn)
        m.d.comb += [
            table.read_qp.eq(planner.read_qp),
            planner.read_state.eq(table.read_state),
            planner.i_config.eq(self.i_config),
        ]
        connect(m, flipped(self.i_request), planner.i_request)

        m.d.comb += [
            descriptors.w_en.eq(planner.o_packet.valid),
            descriptors.w_data.eq(planner.o_packet.p),
            planner.o_packet.ready.eq(descriptors.w_rdy),
            segmenter.i_packet.valid.eq(descriptors.r_rdy),
            segmenter.i_packet.p.eq(descriptors.r_data),
            descriptors.r_en.eq(segmenter.i_packet.ready),
        ]
        connect(m, flipped(self.i_payload), segmenter.i_payload)
        connect(m, segmenter.o_completion, flipped(self.o_completion))
        connect(m, segmenter.o, segmented.i)
        connect(m, segmented.o, transport.i)
        connect(m, transport.o, framed.i)
        connect(m, framed.o, flipped(self.o))
        return m
