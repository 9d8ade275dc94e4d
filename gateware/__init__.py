"""A TX-focused RoCEv2 endpoint for FPGAs, written in Amaranth."""
