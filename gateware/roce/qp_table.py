from amaranth import *
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from .qp_context import lookup
from .requests import QP_INDEX_BITS, QP_STATE, QP_WRITE, check_qp_count

__all__ = ["QpTable", "QP_PATH"]

#: What the transmit engine reads of a QP for every message: where its packets go and
#: how they are cut. (The PSNs and timers live in the reliability engine.)
QP_PATH = data.StructLayout({name: QP_STATE.members[name]
                             for name in ("remote_qpn", "rkey", "remote_ip", "path_mtu",
                                          "src_port")})


class QpTable(wiring.Component):
    """The path of every QP, in block RAM.

    ``i_write`` sets a QP (the connection manager or user logic); its path
    fields are kept here. ``read_qp`` → ``read_path``: read latency 1 cycle; a
    write is seen by reads issued from the next cycle on. ``r_remote_ip``: the
    peer's IPv4 address, for the acknowledgement intake's check of an
    acknowledgement's source, read alike (a memory of its own: a copy of the
    path's field, not of the whole path, for this second reader).
    """

    def __init__(self, qps):
        self._qps = check_qp_count(qps)
        super().__init__({
            "i_write": In(stream.Signature(QP_WRITE, always_ready=True)),
            "read_qp": In(QP_INDEX_BITS),
            "read_path": Out(QP_PATH),
            "r_remote_ip": In(lookup(QP_PATH.members["remote_ip"], QP_INDEX_BITS)),
        })

    @property
    def qps(self):
        return self._qps

    def elaborate(self, platform):
        m = Module()
        m.submodules.paths = paths = memory.Memory(shape=QP_PATH, depth=self._qps, init=[])
        write = paths.write_port()
        read = paths.read_port()
        m.d.comb += [
            write.addr.eq(self.i_write.p.qp),
            write.en.eq(self.i_write.valid),
            read.addr.eq(self.read_qp),
            self.read_path.eq(read.data),
        ]
        for name in QP_PATH.members:
            m.d.comb += write.data[name].eq(self.i_write.p.state[name])

        m.submodules.remote_ips = remote_ips = memory.Memory(
            shape=QP_PATH.members["remote_ip"], depth=self._qps, init=[])
        ip_write = remote_ips.write_port()
        ip_read = remote_ips.read_port()
        m.d.comb += [
            ip_write.addr.eq(self.i_write.p.qp),
            ip_write.en.eq(self.i_write.valid),
            ip_write.data.eq(self.i_write.p.state.remote_ip),
            ip_read.addr.eq(self.r_remote_ip.addr),
            self.r_remote_ip.data.eq(ip_read.data),
        ]
        return m
