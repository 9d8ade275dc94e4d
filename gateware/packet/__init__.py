"""Blocks that act on whole packets of a beat stream, whatever the protocol."""
