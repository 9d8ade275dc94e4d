from amaranth import *
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from .requests import QP_INDEX_BITS, QP_STATE, QP_WRITE

__all__ = ["QpTable", "PSN_UPDATE"]

#: The transmit engine's write-back of a QP's next PSN after a message.
PSN_UPDATE = data.StructLayout({"qp": QP_INDEX_BITS, "psn": 24})


class QpTable(wiring.Component):
    """The transmit state of every QP, in block RAM.

    ``i_write`` sets a QP's whole state (the connection manager or user
    logic); ``i_psn`` is the engine's write-back of the next PSN and takes
    precedence, so ``i_write`` waits (is not ready) in a cycle the engine
    writes. ``read_qp`` → ``read_state``: read latency 1 cycle; a write is
    seen by reads issued from the next cycle on.
    """

    def __init__(self, qps):
        if not isinstance(qps, int) or not 1 <= qps <= 1 << QP_INDEX_BITS:
            raise ValueError(f"QP count must be 1..{1 << QP_INDEX_BITS}, not {qps!r}")
        self._qps = qps
        super().__init__({
            "i_write": In(stream.Signature(QP_WRITE)),
            "i_psn": In(stream.Signature(PSN_UPDATE, always_ready=True)),
            "read_qp": In(QP_INDEX_BITS),
            "read_state": Out(QP_STATE),
        })

    @property
    def qps(self):
        return self._qps

    def elaborate(self, platform):
        m = Module()
        static = data.StructLayout({name: shape for name, shape in QP_STATE.members.items()
                                    if name != "next_psn"})
        m.submodules.static = static_mem = memory.Memory(shape=static, depth=self._qps, init=[])
        m.submodules.psn = psn_mem = memory.Memory(shape=24, depth=self._qps, init=[])

        static_write = static_mem.write_port()
        psn_write = psn_mem.write_port()
        static_read = static_mem.read_port()
        psn_read = psn_mem.read_port()

        setting = self.i_write.valid & self.i_write.ready
        m.d.comb += [
            self.i_write.ready.eq(~self.i_psn.valid),
            static_write.addr.eq(self.i_write.p.qp),
            static_write.en.eq(setting),
            psn_write.addr.eq(Mux(self.i_psn.valid, self.i_psn.p.qp, self.i_write.p.qp)),
            psn_write.data.eq(Mux(self.i_psn.valid, self.i_psn.p.psn,
                                  self.i_write.p.state.next_psn)),
            psn_write.en.eq(self.i_psn.valid | setting),
            static_read.addr.eq(self.read_qp),
            psn_read.addr.eq(self.read_qp),
            self.read_state.next_psn.eq(psn_read.data),
        ]
        for name in static.members:
            m.d.comb += [
                static_write.data[name].eq(self.i_write.p.state[name]),
                self.read_state[name].eq(static_read.data[name]),
            ]
        return m
