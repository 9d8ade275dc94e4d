"""Ethernet II framing on the MAC's stream."""
