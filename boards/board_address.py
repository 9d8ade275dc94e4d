"""One bitstream for many boards: the endpoint's addresses from the board's DIP switches."""

from amaranth import *
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from gateware.config import NetworkConfig, config_value

__all__ = ["BoardAddress"]

#: Settle time of the switches' synchronizer after reset, in cycles.
SETTLE_CYCLES = 4


class BoardAddress(wiring.Component):
    """Writes the core's addresses once after reset: the build-time ones with the value of
    the switches added to the last octet of the IPv4 address and of the MAC address.

    With every switch off the addresses are the build-time ones, so a crate of
    boards loads one bitstream and each board's switches make its addresses
    unique. ``i_switches`` (the DIP switches, bit 0 = switch 0) must be
    synchronized to ``sync``; it is sampled ``SETTLE_CYCLES`` cycles after
    reset and not again until the next reset. ``o_config`` carries one write
    to the core's ``config`` port (netmask and gateway as built).

    Parameters
    ----------
    mac, ip, netmask, gateway : str
        The build-time addresses. The last octets must leave room for every
        switch setting: the IPv4 one up to .254, the MAC's up to 0xff.
    switches : int
        Number of switches.
    """

    def __init__(self, *, mac, ip, netmask="255.255.255.0", gateway="0.0.0.0", switches=4):
        self._addresses = {"mac": mac, "ip": ip, "netmask": netmask, "gateway": gateway}
        self._base = config_value(**self._addresses)
        top = (1 << switches) - 1
        if (self._base.ip & 0xff) + top > 254:
            raise ValueError(f"IPv4 address {ip} leaves no room for {switches} switches in its "
                             f"last octet (at most .{254 - top})")
        if (self._base.mac & 0xff) + top > 0xff:
            raise ValueError(f"MAC address {mac} leaves no room for {switches} switches in its "
                             f"last octet (at most {0xff - top:02x})")
        super().__init__({
            "i_switches": In(switches),
            "o_config": Out(stream.Signature(NetworkConfig)),
        })

    @property
    def addresses(self):
        """The build-time addresses (``mac``, ``ip``, ``netmask``, ``gateway``: texts), which
        it writes with every switch off."""
        return dict(self._addresses)

    def elaborate(self, platform):
        m = Module()
        settling = Signal(range(SETTLE_CYCLES + 1), init=SETTLE_CYCLES)
        written = Signal()
        with m.If(settling != 0):
            m.d.sync += settling.eq(settling - 1)
        m.d.comb += [
            self.o_config.valid.eq((settling == 0) & ~written),
            self.o_config.p.mac.eq(self._base.mac + self.i_switches),
            self.o_config.p.ip.eq(self._base.ip + self.i_switches),
            self.o_config.p.netmask.eq(self._base.netmask),
            self.o_config.p.gateway.eq(self._base.gateway),
        ]
        with m.If(self.o_config.valid & self.o_config.ready):
            m.d.sync += written.eq(1)
        return m
