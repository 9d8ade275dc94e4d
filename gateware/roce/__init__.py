"""RoCEv2 (InfiniBand transport over UDP 4791): the requester side of a
Reliable Connection."""
