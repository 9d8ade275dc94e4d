"""Frames exchanged with Linux Soft-RoCE (rdma_rxe, kernel 6.1, Debian bookworm), from the
project's shared/vectors/rxe-frames.md: independent test vectors for the ICRC, the header
layouts and ACK parsing. Ethernet frames without FCS; the last 4 bytes are the ICRC.

Requester 10.77.0.2 (MAC 02:00:00:00:00:02) → rxe 10.77.0.1 (MAC 52:54:00:12:34:56): RDMA
WRITE ONLY, dest QPN 0x17, PSN 0x1000, AckReq, VA 0x377bc000, rkey 0xd3d, DMA length 64,
UDP source port 0xc0de, checksum 0; rxe accepted it and sent the ACKNOWLEDGE below (dest
QPN 0x123, PSN 0x1000, AETH syndrome 0x1f, MSN 1, IP id 0xac89, UDP source port 0xda25).
"""

__all__ = ["RXE_WRITE_ONLY", "RXE_ACKNOWLEDGE", "ETHERNET_HEADER"]

ETHERNET_HEADER = 14

RXE_WRITE_ONLY = bytes.fromhex(
    "52540012345602000000000208004500007c00004000401125d50a4d00020a4d0001c0de12b7006800000a00ffff"
    "000000178000100000000000377bc00000000d3d0000004048454c4c4f2d524f43452d46524f4d2d484f53542d00"
    "0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f202122232425262728292ac452c91c")

RXE_ACKNOWLEDGE = bytes.fromhex(
    "020000000002525400123456080045000030ac894000401179970a4d00010a4d0002da2512b7001c00001100ffff"
    "00000123000010001f000001cb9a8e50")
