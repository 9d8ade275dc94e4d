"""The endpoint's own addresses: set at run time, with build-time defaults."""

import ipaddress

from amaranth.lib import data

__all__ = ["NetworkConfig", "config_value", "parse_mac", "parse_ipv4"]

#: What the core's ``config`` stream carries: our MAC and IPv4 addresses, netmask
#: and gateway, each an integer whose most significant byte is first on the wire.
NetworkConfig = data.StructLayout({
    "mac": 48,
    "ip": 32,
    "netmask": 32,
    "gateway": 32,      # next hop for addresses outside ip/netmask; 0: none
})


def parse_mac(text):
    """``"02:00:00:00:00:02"`` → 48-bit integer; raises ValueError naming the bad text."""
    parts = str(text).split(":")
    if len(parts) != 6 or not all(len(part) == 2 for part in parts):
        raise ValueError(f"MAC address must look like 02:00:00:00:00:02, not {text!r}")
    try:
        return int("".join(parts), 16)
    except ValueError:
        raise ValueError(f"MAC address must be hexadecimal, not {text!r}") from None


def parse_ipv4(text):
    """``"10.77.0.2"`` → 32-bit integer; raises ValueError naming the bad text."""
    try:
        return int(ipaddress.IPv4Address(text))
    except ValueError:
        raise ValueError(f"Not an IPv4 address: {text!r}") from None


def config_value(*, mac, ip, netmask="255.255.255.0", gateway="0.0.0.0"):
    """A constant of :py:obj:`NetworkConfig` from address strings."""
    return NetworkConfig.const({
        "mac": parse_mac(mac),
        "ip": parse_ipv4(ip),
        "netmask": parse_ipv4(netmask),
        "gateway": parse_ipv4(gateway),
    })
