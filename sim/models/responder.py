"""A RoCEv2 responder for tests: the host side of one RC queue pair, modelled on Soft-RoCE.

:class:`Responder` plays the remote QP the endpoint talks to. It takes the Ethernet
frames (no FCS) the endpoint transmits, checks and executes them the way Linux
``rdma_rxe`` does (see ``SOFTROCE.md``), keeps a memory image and a receive queue,
and answers with ACKNOWLEDGE frames byte-identical to the ones rxe sends. A
:class:`Faults` description makes it misbehave on purpose: lose, duplicate, delay,
reorder or corrupt packets on their way in and ACKs on their way out, invent ACKs,
answer RNR, stall or never answer. Every random choice comes from one
``random.Random(seed)``, so a run is reproducible. A :class:`ConnectX` description
makes it answer as a ConnectX-class NIC does instead (see below).

The model knows nothing about its transport: :meth:`Responder.receive` takes a frame
and the time it arrived, :meth:`Responder.poll` returns the frames due by a time.
Time is an integer (clock cycles of the bench); delays are counted in it. Without
faults a packet is handled when it arrives and its answer is due the same cycle.

Responder rules (IBTA vol. 1 ch. 9.7, as rxe implements them), in rxe's order:

1. Frame checks, failures dropped silently and counted: destination MAC, IPv4 to
   ``ip`` from ``peer_ip`` with a good header checksum and no fragmentation, UDP to
   4791 with a zero or correct checksum, ICRC (Scapy's BTH ICRC), BTH version 0,
   destination QPN, P_Key, and an RC request opcode.
2. PSN: the expected PSN is executed; one ahead of it (within half the 24-bit space)
   gets NAK sequence error carrying the expected PSN, once until the expected one
   arrives, later ones are dropped; one behind it is a duplicate, re-ACKed with the
   PSN before the expected one and not executed again.
3. Opcode sequence: a MIDDLE or LAST must continue a message of its kind, a FIRST or
   ONLY must not interrupt one; RDMA READ and atomics are refused (the QP grants
   remote write only). Any of these is NAK invalid request (class C).
4. Resources: SEND FIRST/ONLY and RDMA WRITE with immediate consume a posted
   receive; without one the packet gets an RNR NAK and the PSN does not advance.
5. Length: FIRST and MIDDLE carry exactly ``path_mtu`` bytes, LAST and ONLY at most
   that; a WRITE carries exactly its RETH DMA length, a SEND fits its receive.
   Otherwise NAK invalid request (class C).
6. RDMA WRITE FIRST/ONLY with a non-zero DMA length needs the rkey and a range
   inside the memory image; otherwise NAK remote access error (class C).
7. Execute, advance the expected PSN, count a message (the MSN) at LAST/ONLY, post a
   :class:`Completion` for SEND and WRITE with immediate, and ACK the packet if it
   has AckReq set (one ACK covers every earlier packet).

A class C error sends its NAK with the packet's PSN and moves the QP to ``"ERROR"``,
where every later packet is dropped.

Two answers come from these rules in both modes and are what a fast requester finds
hardest: a duplicate packet (one resent after a NAK or a timeout) is answered with an
ACK whether or not it asks for one (IBTA C9-105: a duplicate ACK follows every resent
duplicate), and with an empty receive queue a SEND at PSN p gets an RNR NAK for p while
the packets in flight behind it get one NAK PSN sequence error for p right after (rule 2:
p was not executed).

The ConnectX-like mode (``connectx=ConnectX(...)``) differs from rxe where a ConnectX-5
at 100 Gb/s does: every answer arrives a configurable round trip after its packet left;
besides the ACK of every AckReq packet, one ACK covers every ``coalesce`` packets that
did not ask; and congestion-marked packets (ECN CE) get CNPs (RoCEv2 annex A17.9.3).
"""

import heapq
import itertools
import random
from collections import deque
from dataclasses import dataclass, fields

from scapy.contrib.roce import AETH, BTH, cnp
from scapy.layers.inet import IP, UDP, in4_chksum
from scapy.layers.l2 import Ether
from scapy.packet import Padding
from scapy.utils import checksum

from sim.models.rocev2 import PKEY, RETH, ROCEV2_PORT, ImmDt
from sim.models.switch import NotificationPoint

__all__ = ["Faults", "ConnectX", "Completion", "Responder", "COUNTERS", "rxe_udp_source_port",
           "spread_losses", "round_trip_cycles", "ACK_UNLIMITED", "RNR_NAK", "NAK_SEQUENCE",
           "NAK_INVALID_REQUEST", "NAK_REMOTE_ACCESS", "OP_ACKNOWLEDGE", "OP_CNP",
           "CNP_DSCP", "CLOCK_HZ"]

OP_ACKNOWLEDGE = 0x11
OP_CNP = 0x81                   # RoCEv2 annex A17.9.3: congestion notification packet
CNP_DSCP = 48                   # mlx5's default DSCP of the CNPs it sends (cnp_dscp)

#: The bench's clock: the CMAC's user clock of the core, 322.265625 MHz.
CLOCK_HZ = 322_265_625
ACK_UNLIMITED = 0x1F            # ACK, credit count 31: no end-to-end credit limit
RNR_NAK = 0x20                  # | the 5-bit RNR timer code
NAK_SEQUENCE = 0x60
NAK_INVALID_REQUEST = 0x61
NAK_REMOTE_ACCESS = 0x62

PSN_BITS = 24
PSN_MASK = (1 << PSN_BITS) - 1
PATH_MTUS = (256, 512, 1024, 2048, 4096)

_ETHERTYPE_IPV4 = 0x0800
_IPPROTO_UDP = 17
_ETH_LEN = len(Ether(src="00:00:00:00:00:00", dst="00:00:00:00:00:00"))
_IPV4_LEN = len(IP())
_UDP_LEN = len(UDP())
_ICRC_LEN = len(BTH.pack_icrc(0))
_BTH_LEN = len(BTH(icrc=0)) - _ICRC_LEN
_RETH_LEN = len(RETH())
_IMMDT_LEN = len(ImmDt())
_ECN_CE = 0b11                  # the IPv4 TOS's ECN bits of a congestion-marked packet

# IBTA vol. 1 table 38, RC requests this model executes: opcode -> (kind, position, ImmDt).
_REQUESTS = {
    0x00: ("SEND", "FIRST", False), 0x01: ("SEND", "MIDDLE", False),
    0x02: ("SEND", "LAST", False), 0x03: ("SEND", "LAST", True),
    0x04: ("SEND", "ONLY", False), 0x05: ("SEND", "ONLY", True),
    0x06: ("WRITE", "FIRST", False), 0x07: ("WRITE", "MIDDLE", False),
    0x08: ("WRITE", "LAST", False), 0x09: ("WRITE", "LAST", True),
    0x0A: ("WRITE", "ONLY", False), 0x0B: ("WRITE", "ONLY", True),
}
_REFUSED = {0x0C, 0x13, 0x14}                 # RDMA READ request, COMPARE SWAP, FETCH ADD
_RESPONSES = set(range(0x0D, 0x13))           # READ responses, ACKNOWLEDGE, ATOMIC ACKNOWLEDGE

COUNTERS = (
    # what crossed the interface
    "frames_received", "frames_sent",
    # faults on the way in
    "packets_dropped_fault", "packets_duplicated_fault", "packets_corrupted_fault",
    "packets_reordered_fault", "dropped_silent", "dropped_stall",
    # frame and header checks (all silent drops)
    "malformed", "not_for_us", "wrong_source", "bad_ip_checksum", "bad_udp_checksum",
    "icrc_errors", "bad_version", "bad_qpn", "bad_pkey", "bad_opcode", "not_request",
    # the transport
    "packets_received", "dropped_error_state", "executed", "duplicates",
    "out_of_sequence", "out_of_sequence_dropped", "messages", "completions",
    "bytes_written", "bytes_sent_to_receives", "rnr_by_fault",
    # answers the responder decided to send (NAKs are ACKNOWLEDGE packets too); of the
    # ACKs, those for a packet that did not ask (coalesced); congestion notification
    "acks_sent", "naks_sequence", "naks_rnr", "naks_invalid_request", "naks_remote_access",
    "acks_coalesced", "ce_marked", "cnps_sent",
    # faults on the way out, applied to every ACKNOWLEDGE frame
    "acks_dropped_fault", "acks_duplicated_fault", "acks_corrupted_fault",
    "acks_reordered_fault", "ghost_acks",
)


def rxe_udp_source_port(qpn: int, peer_qpn: int) -> int:
    """The UDP source port rxe picks for a QP (``rdma_get_udp_sport`` with no flow
    label, include/rdma/ib_verbs.h): a flow label hashed from both QPNs, folded into
    0xC000-0xFFFF."""
    value = qpn * peer_qpn
    value ^= value >> 20
    value ^= value >> 40
    flow_label = value & 0xFFFFF
    low = (flow_label & 0x3FFF) ^ (flow_label >> 14)
    return 0xC000 | low


def round_trip_cycles(microseconds: float) -> int:
    """A round trip in cycles of the bench's clock (:data:`CLOCK_HZ`)."""
    return round(microseconds * 1e-6 * CLOCK_HZ)


def spread_losses(rate: float, frames: int, seed: int = 0) -> tuple[int, ...]:
    """Indices of the frames to lose among the first ``frames`` for an exact loss ``rate``:
    one in each whole block of ``round(1 / rate)`` frames, at a position drawn from
    ``seed``. Over the blocks the rate is exact, and the losses fall as randomly as that
    allows (never more than two in a row). Give it to ``Faults(packet_drop_at=...)``."""
    if not 0 < rate <= 1:
        raise ValueError(f"the loss rate must lie in (0, 1], not {rate!r}")
    block = round(1 / rate)
    rng = random.Random(seed)
    return tuple(start + rng.randrange(block)
                 for start in range(0, frames // block * block, block))


@dataclass(frozen=True)
class Faults:
    """What the responder does wrong on purpose. Rates are probabilities per packet or
    per frame (0 = never, 1 = always); delays are in the bench's time unit (cycles).

    Incoming packets (requester to responder), applied as :meth:`Responder.receive`
    takes a frame:

    - ``packet_drop``: the packet is lost.
    - ``packet_duplicate``: the packet arrives twice (the copy right after it).
    - ``packet_corrupt``: one bit of the packet's ICRC flips, so it fails the ICRC check.
    - ``packet_delay`` + a uniform ``0..packet_jitter``: cycles before it is handled.
    - ``packet_reorder``: the packet is held ``reorder_delay`` more cycles, so later
      packets overtake it.
    - ``packet_drop_at``: the indices (0 = the first frame :meth:`Responder.receive`
      takes) of frames that are lost, whatever the rates (see :func:`spread_losses`).

    Outgoing frames (every ACKNOWLEDGE: ACKs and NAKs), applied as the responder
    sends them:

    - ``ack_drop``, ``ack_duplicate``, ``ack_corrupt`` (one bit of the ICRC flips),
      ``ack_delay`` + ``0..ack_jitter``, ``ack_reorder`` (``reorder_delay`` more).
    - ``ack_drop_at``: the indices (0 = the first) of ACKNOWLEDGE frames the responder
      sends that are lost, whatever the rates.
    - ``ghost_ack``: an extra ACK follows (after ``ack_delay``, never dropped or
      corrupted), for a PSN 2^22 to 2^23 - 1 ahead of the expected one: one the
      requester never sent.

    Behaviour:

    - ``rnr_burst``: the first ``rnr_burst`` packets that need a receive get an RNR
      NAK even if receives are posted (receives posted late); then they reappear.
    - ``rnr_rate``: afterwards, each packet that needs a receive gets an RNR NAK with
      this probability.
    - ``stall_at``, ``stall_cycles``: packets handled in ``[stall_at, stall_at +
      stall_cycles)`` are lost (a host that stops answering for a while).
    - ``silent``: every packet is lost: a peer that never answers.
    """
    packet_drop: float = 0.0
    packet_duplicate: float = 0.0
    packet_corrupt: float = 0.0
    packet_delay: int = 0
    packet_jitter: int = 0
    packet_reorder: float = 0.0
    ack_drop: float = 0.0
    ack_duplicate: float = 0.0
    ack_corrupt: float = 0.0
    ack_delay: int = 0
    ack_jitter: int = 0
    ack_reorder: float = 0.0
    ghost_ack: float = 0.0
    reorder_delay: int = 1000
    rnr_burst: int = 0
    rnr_rate: float = 0.0
    stall_at: int | None = None
    stall_cycles: int = 0
    silent: bool = False
    packet_drop_at: tuple[int, ...] = ()
    ack_drop_at: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if field.type == tuple[int, ...]:
                if not isinstance(value, tuple) or any(
                        isinstance(index, bool) or not isinstance(index, int) or index < 0
                        for index in value):
                    raise TypeError(f"Faults.{field.name} must be a tuple of frame indices, "
                                    f"not {value!r}")
            elif field.type is float:
                if isinstance(value, bool) or not isinstance(value, int | float):
                    raise TypeError(f"Faults.{field.name} must be a number, not {value!r}")
                if not 0.0 <= value <= 1.0:
                    raise ValueError(f"Faults.{field.name} must be a probability in [0, 1], "
                                     f"not {value!r}")
            elif field.type is int or (field.name == "stall_at" and value is not None):
                if isinstance(value, bool) or not isinstance(value, int):
                    raise TypeError(f"Faults.{field.name} must be an integer, not {value!r}")
                if value < 0:
                    raise ValueError(f"Faults.{field.name} must not be negative, not {value!r}")


@dataclass(frozen=True)
class ConnectX:
    """How a ConnectX-class responder answers where it differs from rxe. Times are in
    the bench's cycles (:func:`round_trip_cycles` converts microseconds).

    - ``round_trip``: from a request leaving the requester to the answer reaching it
      (both wires, a switch, the NIC): every answer, ACK, NAK or CNP, is due that long
      after its packet arrived (faults' delays come on top).
    - ``coalesce``: one ACK, for the newest, also covers every ``coalesce`` executed
      packets that did not ask for one (0: only AckReq packets are acknowledged, as rxe
      does). The ACK of an AckReq packet restarts the count.
    - ``cnp_every``: every n-th request packet counts as congestion-marked (ECN CE, as
      a congested switch marks it), besides those that arrive marked (0: only those).
      Each marked packet gets a CNP for the QP unless one went less than ``cnp_gap``
      cycles before (mlx5's ``min_time_between_cnps``).
    - ``cnp_interval``: a request packet counts as marked when the QP's last CNP went
      at least this many cycles before (or none did): a CNP every interval while the
      QP sends, as a switch that marks the flow steadily causes (0: none).
    - ``cnp_dscp``: the DSCP of the CNPs' IPv4 header (mlx5's ``cnp_dscp``); their ECN
      bits are 0 (not ECN-capable), so a CNP is never marked itself.

    A CNP (RoCEv2 annex A17.9.3) is a BTH with opcode 0x81, BECN set, P_Key, DestQP
    the requester's QP, PSN 0 and AckReq 0, then 16 reserved bytes of zeros and the
    ICRC, over UDP to 4791 from the QP's source port, as ConnectX sends them.
    """
    round_trip: int = round_trip_cycles(2)
    coalesce: int = 0
    cnp_every: int = 0
    cnp_gap: int = 0
    cnp_interval: int = 0
    cnp_dscp: int = CNP_DSCP

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"ConnectX.{field.name} must be a non-negative integer, "
                                 f"not {value!r}")
        if self.cnp_dscp >= 64:
            raise ValueError(f"ConnectX.cnp_dscp must fit in 6 bits, not {self.cnp_dscp!r}")


@dataclass(frozen=True)
class Completion:
    """A receive completion: the opcode of the message's last packet, the message's
    data (a SEND's payload; for RDMA WRITE with immediate, the bytes it wrote) and the
    immediate value, or None."""
    opcode: int
    data: bytes
    immediate: int | None


def _check_int(name: str, value: int, bits: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer, not {value!r}")
    if not 0 <= value < (1 << bits):
        raise ValueError(f"{name} must fit in {bits} unsigned bits, not {value:#x}")


def _psn_distance(psn: int, expected: int) -> int:
    """``psn - expected`` in the 24-bit PSN space, in [-2^23, 2^23)."""
    difference = (psn - expected) & PSN_MASK
    return difference - (1 << PSN_BITS) if difference >= 1 << (PSN_BITS - 1) else difference


class _ClassC(Exception):
    """A request the responder refuses with a NAK and moving the QP to ERROR."""

    def __init__(self, syndrome: int) -> None:
        super().__init__(hex(syndrome))
        self.syndrome = syndrome


class Responder:
    """One RC responder QP (the host side), checking and answering like rxe.

    ``mac``/``ip`` are the responder's, ``peer_mac``/``peer_ip`` the requester's (the
    endpoint). ``qpn`` is this QP's number (the requests' destination QP),
    ``peer_qpn`` the requester's (the ACKs' destination QP). The memory image covers
    virtual addresses ``[memory_base, memory_base + memory_size)`` under ``rkey``.

    ACK frames are built as rxe builds them: DF, TTL 64, TOS 0, an IP id counting up
    from ``ip_id_start``, the UDP source port ``src_port`` (by default the one rxe
    derives from the two QPNs), UDP checksum 0, P_Key ``pkey`` and the ICRC. RNR NAKs
    carry ``rnr_timer`` (the IBTA 5-bit code, 1 = 0.01 ms). ``connectx`` (a
    :class:`ConnectX`) makes it answer as a ConnectX-class NIC; None: as rxe.
    """

    def __init__(self, *, mac: str, ip: str, peer_mac: str, peer_ip: str, qpn: int,
                 peer_qpn: int, expected_psn: int, rkey: int, memory_base: int,
                 memory_size: int, path_mtu: int, faults: Faults | None = None,
                 seed: int = 0, src_port: int | None = None, ip_id_start: int = 0,
                 rnr_timer: int = 1, pkey: int = PKEY, connectx: ConnectX | None = None) -> None:
        for name, value in (("mac", mac), ("peer_mac", peer_mac), ("ip", ip),
                            ("peer_ip", peer_ip)):
            if not isinstance(value, str):
                raise TypeError(f"{name} must be a string, not {value!r}")
        _check_int("qpn", qpn, 24)
        _check_int("peer_qpn", peer_qpn, 24)
        _check_int("expected_psn", expected_psn, PSN_BITS)
        _check_int("rkey", rkey, 32)
        _check_int("memory_base", memory_base, 64)
        _check_int("memory_size", memory_size, 64)
        if memory_base + memory_size > 1 << 64:
            raise ValueError(f"memory [{memory_base:#x}, +{memory_size:#x}) passes 2^64")
        if path_mtu not in PATH_MTUS:
            raise ValueError(f"path_mtu must be one of {PATH_MTUS}, not {path_mtu!r}")
        if faults is None:
            faults = Faults()
        if not isinstance(faults, Faults):
            raise TypeError(f"faults must be a Faults, not {faults!r}")
        if connectx is not None and not isinstance(connectx, ConnectX):
            raise TypeError(f"connectx must be a ConnectX or None, not {connectx!r}")
        if src_port is None:
            src_port = rxe_udp_source_port(qpn, peer_qpn)
        _check_int("src_port", src_port, 16)
        _check_int("ip_id_start", ip_id_start, 16)
        _check_int("rnr_timer", rnr_timer, 5)
        _check_int("pkey", pkey, 16)

        self._mac, self._peer_mac = mac.lower(), peer_mac.lower()
        self._ip, self._peer_ip = ip, peer_ip
        self._qpn, self._peer_qpn = qpn, peer_qpn
        self._rkey = rkey
        self._memory_base = memory_base
        self._memory = bytearray(memory_size)
        self._path_mtu = path_mtu
        self._faults = faults
        self._packet_drop_at = frozenset(faults.packet_drop_at)
        self._ack_drop_at = frozenset(faults.ack_drop_at)
        self._connectx = connectx
        self._round_trip = connectx.round_trip if connectx else 0
        self._random = random.Random(seed)
        self._src_port = src_port
        self._ip_id = ip_id_start
        self._rnr_timer = rnr_timer
        self._pkey = pkey

        self._state = "RTS"
        self._expected_psn = expected_psn
        self._msn = 0
        self._sent_sequence_nak = False
        self._receives: deque[int | None] = deque()  # posted receives: length or None
        self._receive_queue: list[Completion] = []
        self._rnr_burst_left = faults.rnr_burst
        self._message: str | None = None            # kind of the message in progress
        self._write_at = 0                          # memory index of the next WRITE byte
        self._write_start = 0
        self._write_left = 0
        self._send_data = bytearray()
        self._send_limit: int | None = None
        self._not_acknowledged = 0                  # executed packets no ACK covers yet
        self._requests_seen = 0                     # request packets, for cnp_every
        self._notification = NotificationPoint(connectx.cnp_gap if connectx else 0)
        self._acks_decided = 0                      # ACKNOWLEDGE frames, for ack_drop_at

        self._order = itertools.count()
        self._inbound: list[tuple[int, int, bytes]] = []
        self._outbound: list[tuple[int, int, bytes]] = []
        self._now = 0
        self.stats: dict[str, int] = dict.fromkeys(COUNTERS, 0)
        """Counters of everything the responder did; the keys are :data:`COUNTERS`."""

    # Accessors.

    @property
    def memory(self) -> bytearray:
        """The memory image: byte ``i`` is virtual address ``memory_base + i``."""
        return self._memory

    @property
    def receive_queue(self) -> list[Completion]:
        """Receive completions, oldest first (the list itself: tests may clear it)."""
        return self._receive_queue

    @property
    def state(self) -> str:
        """``"RTS"`` or, after a class C error, ``"ERROR"``."""
        return self._state

    @property
    def qpn(self) -> int:
        """Our QPN: the destination QPN of the packets we take."""
        return self._qpn

    @property
    def expected_psn(self) -> int:
        return self._expected_psn

    @property
    def msn(self) -> int:
        """Messages completed, modulo 2^24 (the MSN the next ACK carries)."""
        return self._msn

    @property
    def receives_posted(self) -> int:
        return len(self._receives)

    @property
    def faults(self) -> Faults:
        return self._faults

    @property
    def connectx(self) -> ConnectX | None:
        return self._connectx

    @property
    def src_port(self) -> int:
        return self._src_port

    @property
    def next_due(self) -> int | None:
        """The earliest time something is pending (a delayed packet or a frame to
        send), or None if nothing is."""
        times = [queue[0][0] for queue in (self._inbound, self._outbound) if queue]
        return min(times) if times else None

    def post_receive(self, count: int = 1, length: int | None = None) -> None:
        """Post ``count`` receives of ``length`` bytes each (None: any length)."""
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"count must be a non-negative integer, not {count!r}")
        if length is not None and (isinstance(length, bool) or not isinstance(length, int)
                                   or length < 0):
            raise ValueError(f"length must be None or a non-negative integer, not {length!r}")
        self._receives.extend([length] * count)

    # The interface to the bench.

    def receive(self, frame: bytes, now: int) -> None:
        """Take one Ethernet frame (no FCS) that arrived at time ``now``. Unless
        incoming faults delay it, it is handled at once."""
        self._advance_clock(now)
        index = self.stats["frames_received"]
        self.stats["frames_received"] += 1
        frame = bytes(frame)
        faults = self._faults
        if index in self._packet_drop_at or self._chance(faults.packet_drop):
            self.stats["packets_dropped_fault"] += 1
            return
        copies = 1
        if self._chance(faults.packet_duplicate):
            self.stats["packets_duplicated_fault"] += 1
            copies = 2
        for _ in range(copies):
            copy = frame
            if self._chance(faults.packet_corrupt):
                self.stats["packets_corrupted_fault"] += 1
                copy = self._corrupt_icrc(copy)
            due = now + self._delay(faults.packet_delay, faults.packet_jitter)
            if self._chance(faults.packet_reorder):
                self.stats["packets_reordered_fault"] += 1
                due += faults.reorder_delay
            heapq.heappush(self._inbound, (due, next(self._order), copy))
        self._handle_due(now)

    def poll(self, now: int) -> list[bytes]:
        """The frames due to be sent by time ``now``, in the order they leave."""
        self._advance_clock(now)
        self._handle_due(now)
        frames = []
        while self._outbound and self._outbound[0][0] <= now:
            frames.append(heapq.heappop(self._outbound)[2])
        self.stats["frames_sent"] += len(frames)
        return frames

    # Receive side.

    def _advance_clock(self, now: int) -> None:
        if isinstance(now, bool) or not isinstance(now, int):
            raise TypeError(f"now must be an integer, not {now!r}")
        if now < self._now:
            raise ValueError(f"time went backwards: {now} after {self._now}")
        self._now = now

    def _handle_due(self, now: int) -> None:
        while self._inbound and self._inbound[0][0] <= now:
            due, _, frame = heapq.heappop(self._inbound)
            self._handle(frame, due)

    def _handle(self, frame: bytes, now: int) -> None:
        faults = self._faults
        if faults.silent:
            self.stats["dropped_silent"] += 1
            return
        if faults.stall_at is not None and \
                faults.stall_at <= now < faults.stall_at + faults.stall_cycles:
            self.stats["dropped_stall"] += 1
            return
        bth = self._check_frame(frame)
        if bth is None:
            return
        self.stats["packets_received"] += 1
        if self._connectx is not None:
            self._notify_congestion(bth, now)
        if self._state == "ERROR":
            self.stats["dropped_error_state"] += 1
            return

        distance = _psn_distance(bth.psn, self._expected_psn)
        if distance > 0:
            self.stats["out_of_sequence"] += 1
            if self._sent_sequence_nak:
                self.stats["out_of_sequence_dropped"] += 1
            else:
                self._sent_sequence_nak = True
                self.stats["naks_sequence"] += 1
                self._send_ack(NAK_SEQUENCE, self._expected_psn, now)
            return
        if distance < 0:
            self.stats["duplicates"] += 1
            self.stats["acks_sent"] += 1
            self._not_acknowledged = 0
            self._send_ack(ACK_UNLIMITED, (self._expected_psn - 1) & PSN_MASK, now)
            return
        self._sent_sequence_nak = False

        try:
            executed = self._execute(bth)
        except _ClassC as error:
            self._state = "ERROR"
            self._message = None
            kind = {NAK_INVALID_REQUEST: "naks_invalid_request",
                    NAK_REMOTE_ACCESS: "naks_remote_access"}[error.syndrome]
            self.stats[kind] += 1
            self._send_ack(error.syndrome, bth.psn, now)
            return
        if not executed:
            self.stats["naks_rnr"] += 1
            self._send_ack(RNR_NAK | self._rnr_timer, bth.psn, now)
            return
        self._not_acknowledged += 1
        coalesce = self._connectx.coalesce if self._connectx else 0
        if bth.ackreq or (coalesce and self._not_acknowledged >= coalesce):
            self.stats["acks_sent"] += 1
            if not bth.ackreq:
                self.stats["acks_coalesced"] += 1
            self._not_acknowledged = 0
            self._send_ack(ACK_UNLIMITED, bth.psn, now)

    def _notify_congestion(self, bth: BTH, now: int) -> None:
        """The notification point of RoCEv2 congestion control (annex A17.9): a CNP
        for a congestion-marked request packet, at most one per ``cnp_gap``."""
        connectx = self._connectx
        self._requests_seen += 1
        last_cnp = self._notification.last_cnp(self._qpn)
        marked = bth.underlayer.underlayer.tos & _ECN_CE == _ECN_CE or \
            (connectx.cnp_every and self._requests_seen % connectx.cnp_every == 0) or \
            (connectx.cnp_interval and (last_cnp is None
                                        or now - last_cnp >= connectx.cnp_interval))
        if not marked:
            return
        self.stats["ce_marked"] += 1
        if not self._notification.notify(self._qpn, now):
            return
        self.stats["cnps_sent"] += 1
        heapq.heappush(self._outbound, (now + self._round_trip, next(self._order),
                                        self._cnp_frame()))

    def _check_frame(self, frame: bytes) -> BTH | None:
        """The frame's BTH (with its payload) if it passes every check rxe makes
        before the transport, else None (the reason counted)."""
        packet = Ether(frame)
        if len(frame) < _ETH_LEN or packet.type != _ETHERTYPE_IPV4 or IP not in packet:
            self.stats["not_for_us"] += 1
            return None
        ip = packet[IP]
        ip_start = len(frame) - len(ip.original)
        if len(ip.original) < _IPV4_LEN or ip.version != 4 or ip.ihl * 4 < _IPV4_LEN \
                or not ip.ihl * 4 + _UDP_LEN <= ip.len <= len(ip.original):
            self.stats["malformed"] += 1
            return None
        ip_end = ip_start + ip.len
        if packet.dst.lower() != self._mac or ip.dst != self._ip or ip.proto != _IPPROTO_UDP \
                or UDP not in packet or packet[UDP].dport != ROCEV2_PORT:
            self.stats["not_for_us"] += 1
            return None
        if checksum(frame[ip_start:ip_start + ip.ihl * 4]) != 0:
            self.stats["bad_ip_checksum"] += 1
            return None
        if ip.flags.MF or ip.frag:
            self.stats["malformed"] += 1
            return None
        if ip.src != self._peer_ip:
            self.stats["wrong_source"] += 1
            return None
        if Padding in packet:
            packet[Padding].underlayer.remove_payload()
        udp = packet[UDP]
        if udp.len != ip.len - ip.ihl * 4 or udp.len < _UDP_LEN + _BTH_LEN + _ICRC_LEN:
            self.stats["malformed"] += 1
            return None
        if udp.chksum != 0 and in4_chksum(_IPPROTO_UDP, ip, bytes(udp)) != 0:
            self.stats["bad_udp_checksum"] += 1
            return None
        bth = packet[BTH]
        if bth.compute_icrc(b"") != frame[ip_end - _ICRC_LEN:ip_end]:
            self.stats["icrc_errors"] += 1
            return None
        if bth.version != 0:
            self.stats["bad_version"] += 1
            return None
        if bth.dqpn != self._qpn:
            self.stats["bad_qpn"] += 1
            return None
        if bth.pkey != self._pkey:
            self.stats["bad_pkey"] += 1
            return None
        if bth.opcode in _RESPONSES:
            self.stats["not_request"] += 1
            return None
        if bth.opcode not in _REQUESTS and bth.opcode not in _REFUSED:
            self.stats["bad_opcode"] += 1
            return None
        return bth

    def _execute(self, bth: BTH) -> bool:
        """Check and execute the request with the expected PSN. False: RNR (nothing
        changed); raises :class:`_ClassC` for a request to refuse."""
        if bth.opcode in _REFUSED:
            raise _ClassC(NAK_INVALID_REQUEST)
        kind, position, immediate = _REQUESTS[bth.opcode]
        if position in ("MIDDLE", "LAST"):
            if self._message != kind:
                raise _ClassC(NAK_INVALID_REQUEST)
        elif self._message is not None:
            raise _ClassC(NAK_INVALID_REQUEST)

        data = bytes(bth.payload)
        has_reth = kind == "WRITE" and position in ("FIRST", "ONLY")
        headers = (_RETH_LEN if has_reth else 0) + (_IMMDT_LEN if immediate else 0)
        if len(data) < headers + bth.padcount:
            raise _ClassC(NAK_INVALID_REQUEST)
        reth = RETH(data[:_RETH_LEN]) if has_reth else None
        imm = ImmDt(data[headers - _IMMDT_LEN:headers]).imm if immediate else None
        payload = data[headers:len(data) - bth.padcount]

        needs_receive = position in ("FIRST", "ONLY") if kind == "SEND" else immediate
        if needs_receive and not self._take_receive(kind):
            return False

        if len(payload) > self._path_mtu or \
                (position in ("FIRST", "MIDDLE") and len(payload) != self._path_mtu):
            raise _ClassC(NAK_INVALID_REQUEST)

        if kind == "WRITE":
            if reth is not None:
                self._start_write(reth)
            if len(payload) > self._write_left or \
                    (position in ("LAST", "ONLY") and len(payload) != self._write_left):
                raise _ClassC(NAK_INVALID_REQUEST)
            self._memory[self._write_at:self._write_at + len(payload)] = payload
            self._write_at += len(payload)
            self._write_left -= len(payload)
            self.stats["bytes_written"] += len(payload)
        else:
            if self._send_limit is not None and \
                    len(self._send_data) + len(payload) > self._send_limit:
                raise _ClassC(NAK_INVALID_REQUEST)
            self._send_data += payload
            self.stats["bytes_sent_to_receives"] += len(payload)

        self.stats["executed"] += 1
        self._expected_psn = (bth.psn + 1) & PSN_MASK
        if position in ("FIRST", "MIDDLE"):
            self._message = kind
            return True
        self._message = None
        self._msn = (self._msn + 1) & PSN_MASK
        self.stats["messages"] += 1
        if kind == "SEND" or immediate:
            data = self._send_data if kind == "SEND" else \
                self._memory[self._write_start:self._write_at]
            self._receive_queue.append(Completion(opcode=bth.opcode, data=bytes(data),
                                                  immediate=imm))
            self.stats["completions"] += 1
        return True

    def _take_receive(self, kind: str) -> bool:
        """Consume a posted receive for a SEND or a WRITE with immediate; False if
        there is none (or the RNR faults say so)."""
        if self._rnr_burst_left:
            self._rnr_burst_left -= 1
            self.stats["rnr_by_fault"] += 1
            return False
        if self._chance(self._faults.rnr_rate):
            self.stats["rnr_by_fault"] += 1
            return False
        if not self._receives:
            return False
        length = self._receives.popleft()
        if kind == "SEND":
            self._send_limit = length
            self._send_data = bytearray()
        return True

    def _start_write(self, reth: RETH) -> None:
        """Check a WRITE's RETH (C9-88: a zero-length one needs no valid key or
        address) and aim the write at it."""
        start = reth.va - self._memory_base
        if reth.dlen and (reth.rkey != self._rkey or start < 0
                          or start + reth.dlen > len(self._memory)):
            raise _ClassC(NAK_REMOTE_ACCESS)
        self._write_at = self._write_start = max(start, 0) if reth.dlen else 0
        self._write_left = reth.dlen

    # Send side.

    def _send_ack(self, syndrome: int, psn: int, now: int) -> None:
        """Queue one ACKNOWLEDGE frame through the outgoing faults."""
        faults = self._faults
        frame = self._ack_frame(syndrome, psn)
        index = self._acks_decided
        self._acks_decided += 1
        if index in self._ack_drop_at or self._chance(faults.ack_drop):
            self.stats["acks_dropped_fault"] += 1
        else:
            if self._chance(faults.ack_corrupt):
                self.stats["acks_corrupted_fault"] += 1
                frame = self._corrupt_icrc(frame)
            due = now + self._round_trip + self._delay(faults.ack_delay, faults.ack_jitter)
            if self._chance(faults.ack_reorder):
                self.stats["acks_reordered_fault"] += 1
                due += faults.reorder_delay
            heapq.heappush(self._outbound, (due, next(self._order), frame))
            if self._chance(faults.ack_duplicate):
                self.stats["acks_duplicated_fault"] += 1
                heapq.heappush(self._outbound, (due, next(self._order), frame))
        if self._chance(faults.ghost_ack):
            self.stats["ghost_acks"] += 1
            ghost = (self._expected_psn + (1 << 22) + self._random.randrange(1 << 22)) & PSN_MASK
            heapq.heappush(self._outbound, (now + self._round_trip + faults.ack_delay,
                                            next(self._order),
                                            self._ack_frame(ACK_UNLIMITED, ghost)))

    def _ack_frame(self, syndrome: int, psn: int) -> bytes:
        return self._frame(BTH(opcode=OP_ACKNOWLEDGE, pkey=self._pkey, dqpn=self._peer_qpn,
                               psn=psn) / AETH(syndrome=syndrome, msn=self._msn), tos=0)

    def _cnp_frame(self) -> bytes:
        transport = cnp(self._peer_qpn)
        transport.pkey = self._pkey
        return self._frame(transport, tos=self._connectx.cnp_dscp << 2)

    def _frame(self, transport, *, tos: int) -> bytes:
        """An answer's Ethernet frame around its BTH and what follows; the ICRC is added."""
        frame = (Ether(src=self._mac, dst=self._peer_mac)
                 / IP(src=self._ip, dst=self._peer_ip, id=self._ip_id, flags="DF", ttl=64, tos=tos)
                 / UDP(sport=self._src_port, dport=ROCEV2_PORT, chksum=0)
                 / transport)
        self._ip_id = (self._ip_id + 1) & 0xFFFF
        return bytes(frame)

    # Randomness.

    def _chance(self, rate: float) -> bool:
        return rate > 0 and self._random.random() < rate

    def _delay(self, fixed: int, jitter: int) -> int:
        return fixed + (self._random.randint(0, jitter) if jitter else 0)

    def _corrupt_icrc(self, frame: bytes) -> bytes:
        """The frame with one random bit of its ICRC flipped (past any padding)."""
        packet = Ether(frame)
        end = len(frame)
        if IP in packet:
            end = min(end, len(frame) - len(packet[IP].original) + packet[IP].len)
        bit = self._random.randrange(8 * _ICRC_LEN)
        damaged = bytearray(frame)
        damaged[end - _ICRC_LEN + bit // 8] ^= 1 << (bit % 8)
        return bytes(damaged)
