"""A congested switch port for simulations, and the notification point behind it.

RoCEv2 congestion control (IBTA RoCEv2 annex A17.9) has three parts: the switch
whose queue builds up marks packets ECN CE (congestion point), the receiving NIC
answers a marked packet with a CNP to the sender's QP (notification point), and the
sender cuts that QP's rate (reaction point, DCQCN: ``sim/models/dcqcn.py``). This module
models the first two, independently of the gateware, in the benches' time unit
(clock cycles; any unit works if rates and thresholds use it too):

- :class:`EgressQueue`: the switch's bottleneck egress port, a FIFO of ``buffer``
  bytes drained at ``rate`` bytes a cycle. It marks ECN-capable packets with RED on
  the queue depth they leave behind as they leave (:class:`Red`; marking at dequeue,
  as the DCQCN authors' NS-3 switch does, so the mark does not wait out the queue),
  never Not-ECT ones; it drops
  (counted) a packet that does not fit; it asks the sender to pause when the depth
  passes ``xoff`` and to resume when it falls back to ``xon``. It knows packets only
  by their size, so the closed-loop runs of ``sim/bench/dcqcn.py`` use it directly.
- :class:`CongestedSwitch`: the same port for Ethernet frames. It rewrites the
  IPv4 ECN bits of the packets it marks (the ICRC masks them, annex A17.8.1; the
  IPv4 header checksum is recomputed) and sends 802.1Qbb PFC frames for the
  RoCEv2 priority, or 802.3x PAUSE, back toward the sender.
- :class:`NotificationPoint`: at most one CNP per QP per ``gap`` cycles, as a
  ConnectX does (``min_time_between_cnps``); the responder model
  (``sim/models/responder.py``, ``ConnectX``) sends its CNPs through one.

Defaults: RED as the DCQCN paper recommends (Zhu et al., "Congestion Control for
Large-Scale RDMA Deployments", SIGCOMM 2015, section 5: K_min 5 KB, K_max 200 KB,
P_max 1 %); ConnectX-5/6 firmware's ``MIN_TIME_BETWEEN_CNPS`` 4 us and ``CNP_DSCP``
48 (``mlxconfig`` defaults).
"""

import random
from collections import deque
from dataclasses import dataclass, field

from scapy.contrib.mac_control import MACControlClassBasedFlowControl, MACControlPause
from scapy.contrib.roce import BTH
from scapy.layers.inet import IP
from scapy.layers.l2 import Ether

__all__ = ["Red", "SwitchSettings", "EgressQueue", "CongestedSwitch", "NotificationPoint",
           "DCQCN_RED", "MIN_TIME_BETWEEN_CNPS_US", "MAC_CONTROL_ADDRESS", "PAUSE_QUANTUM_BITS",
           "ECN_NOT_ECT", "ECN_CE", "ecn_capable"]

#: ConnectX-5/6 firmware's default ``MIN_TIME_BETWEEN_CNPS`` (mlxconfig), microseconds.
MIN_TIME_BETWEEN_CNPS_US = 4

#: The destination of PAUSE and PFC frames (IEEE 802.3 annex 31B).
MAC_CONTROL_ADDRESS = "01:80:c2:00:00:01"

#: A pause quantum: 512 bit times at the line rate (IEEE 802.3 31B.2).
PAUSE_QUANTUM_BITS = 512

#: The IPv4 TOS's ECN codepoints (RFC 3168 section 5): Not-ECT, and CE.
ECN_NOT_ECT = 0b00
ECN_CE = 0b11
_ECN_MASK = 0b11


def ecn_capable(ecn: int) -> bool:
    """ECT(0), ECT(1) or already CE: a packet a switch may mark (RFC 3168 section 5)."""
    return ecn & _ECN_MASK != ECN_NOT_ECT


@dataclass(frozen=True)
class Red:
    """RED marking on the queue depth in bytes (DCQCN paper, figure 5): no packet at a
    depth of ``k_min`` or less, a probability rising linearly to ``p_max`` at
    ``k_max``, every packet above ``k_max``."""
    k_min: int
    k_max: int
    p_max: float

    def __post_init__(self) -> None:
        for name in ("k_min", "k_max"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"Red.{name} must be a non-negative integer, not {value!r}")
        if self.k_max < self.k_min:
            raise ValueError(f"Red.k_max ({self.k_max}) is below k_min ({self.k_min})")
        if isinstance(self.p_max, bool) or not isinstance(self.p_max, int | float) \
                or not 0 <= self.p_max <= 1:
            raise ValueError(f"Red.p_max must be a probability in [0, 1], not {self.p_max!r}")

    def probability(self, depth: int) -> float:
        """The marking probability of a packet arriving at a queue of ``depth`` bytes."""
        if depth <= self.k_min:
            return 0.0
        if depth > self.k_max:
            return 1.0
        return self.p_max * (depth - self.k_min) / (self.k_max - self.k_min)


#: The DCQCN paper's recommended marking (section 5).
DCQCN_RED = Red(k_min=5_000, k_max=200_000, p_max=0.01)


@dataclass(frozen=True)
class SwitchSettings:
    """A bottleneck egress port.

    - ``rate``: bytes it sends a cycle, counting each packet's ``overhead`` too.
    - ``buffer``: bytes the queue holds; a packet that does not fit is dropped.
    - ``red``: ECN marking of ECN-capable packets.
    - ``xoff``, ``xon``: queue bytes at which it asks the sender to pause (None:
      never) and at or below which it asks it to resume.
    - ``pause_quanta``: the pause time its XOFF frames ask for; while the queue
      stays above ``xon`` it repeats them every half of that (``quantum_cycles``: the
      cycles of one quantum, 512 bit times at the sender's line rate).
    - ``pfc_priority``: the priority its PFC frames pause (the RoCEv2 class); None:
      802.3x PAUSE frames, which pause everything.
    - ``overhead``: bytes a packet costs on the wire besides its frame (FCS,
      preamble, inter-frame gap: 24).
    - ``seed``: of the random marking decisions.
    """
    rate: float
    buffer: int
    red: Red = DCQCN_RED
    xoff: int | None = None
    xon: int = 0
    pause_quanta: int = 0xFFFF
    quantum_cycles: float = 1.0
    pfc_priority: int | None = 3
    overhead: int = 24
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.rate, bool) or not isinstance(self.rate, int | float) \
                or not self.rate > 0:
            raise ValueError(f"SwitchSettings.rate must be a positive number, not {self.rate!r}")
        for name in ("buffer", "xon", "overhead", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"SwitchSettings.{name} must be a non-negative integer, "
                                 f"not {value!r}")
        if not isinstance(self.red, Red):
            raise TypeError(f"SwitchSettings.red must be a Red, not {self.red!r}")
        if self.xoff is not None and not self.xon < self.xoff <= self.buffer:
            raise ValueError(f"SwitchSettings needs xon < xoff <= buffer, not xon {self.xon}, "
                             f"xoff {self.xoff}, buffer {self.buffer}")
        if not 0 < self.pause_quanta <= 0xFFFF or not self.quantum_cycles > 0:
            raise ValueError(f"SwitchSettings.pause_quanta must lie in 1..0xFFFF and "
                             f"quantum_cycles be positive, not {self.pause_quanta!r}, "
                             f"{self.quantum_cycles!r}")
        if self.pfc_priority is not None and self.pfc_priority not in range(8):
            raise ValueError(f"SwitchSettings.pfc_priority must be 0..7 or None, "
                             f"not {self.pfc_priority!r}")


@dataclass
class QueueStats:
    """What an :class:`EgressQueue` did; depths in bytes."""
    arrived: int = 0
    departed: int = 0
    marked: int = 0
    dropped: int = 0
    xoff_sent: int = 0
    xon_sent: int = 0
    max_depth: int = 0
    bytes_arrived: int = 0


@dataclass
class _Entry:
    item: object
    size: int
    ect: bool
    done: float                 # when its last byte has left


class EgressQueue:
    """A FIFO egress port with RED marking and PFC thresholds (see :class:`SwitchSettings`).

    :meth:`offer` takes a packet at a time; :meth:`advance` returns those that have
    left by a time. A packet is in the queue (its ``size`` counts in :meth:`depth`)
    until its last byte has left; it leaves ``(size + overhead) / rate`` cycles after
    the one before it, or after it arrived if the port was idle. Times never go back.
    """

    def __init__(self, settings: SwitchSettings) -> None:
        if not isinstance(settings, SwitchSettings):
            raise TypeError(f"settings must be a SwitchSettings, not {settings!r}")
        self._settings = settings
        self._random = random.Random(settings.seed)
        self._queue: deque[_Entry] = deque()
        self._depth = 0
        self._busy_until = 0.0
        self._now = 0.0
        self._paused = False
        self._last_xoff = 0.0
        self._pause_changes: list[tuple[float, bool]] = []
        self.stats = QueueStats()

    @property
    def settings(self) -> SwitchSettings:
        return self._settings

    @property
    def paused(self) -> bool:
        """Whether the last pause request to the sender was an XOFF."""
        return self._paused

    def depth(self) -> int:
        """Bytes in the queue now (as of the last :meth:`offer` or :meth:`advance`)."""
        return self._depth

    @property
    def next_due(self) -> float | None:
        """When something happens next without a new packet: a departure, or an XOFF
        to repeat. None if nothing will."""
        times = [self._queue[0].done] if self._queue else []
        if self._paused:
            times.append(self._last_xoff + self._refresh_cycles)
        return min(times, default=None)

    @property
    def _refresh_cycles(self) -> float:
        return self._settings.pause_quanta * self._settings.quantum_cycles / 2

    def offer(self, item: object, size: int, ect: bool, now: float) -> str:
        """A packet of ``size`` bytes arrives at ``now``, ECN-capable if ``ect``:
        ``"dropped"`` (it does not fit) or ``"queued"``."""
        self.advance(now)
        settings, stats = self._settings, self.stats
        stats.arrived += 1
        stats.bytes_arrived += size
        if self._depth + size > settings.buffer:
            stats.dropped += 1
            return "dropped"
        start = max(self._busy_until, now)
        self._busy_until = start + (size + settings.overhead) / settings.rate
        self._queue.append(_Entry(item, size, ect, self._busy_until))
        self._depth += size
        stats.max_depth = max(stats.max_depth, self._depth)
        if settings.xoff is not None and not self._paused and self._depth >= settings.xoff:
            self._send_pause(True, now)
        return "queued"

    def advance(self, now: float) -> list[tuple[float, object, bool]]:
        """The packets that have left by ``now``: their departure time, item and
        whether they were marked."""
        if now < self._now:
            raise ValueError(f"time went backwards: {now} after {self._now}")
        self._now = now
        settings = self._settings
        departed = []
        while True:
            head = self._queue[0].done if self._queue else None
            refresh = self._last_xoff + self._refresh_cycles if self._paused else None
            if head is not None and head <= now and (refresh is None or head <= refresh):
                entry = self._queue.popleft()
                self._depth -= entry.size
                self.stats.departed += 1
                marked = entry.ect and self._mark(self._depth)
                departed.append((entry.done, entry.item, marked))
                if self._paused and self._depth <= settings.xon:
                    self._send_pause(False, entry.done)
            elif refresh is not None and refresh <= now:
                self._send_pause(True, refresh)
            else:
                return departed

    def _mark(self, depth: int) -> bool:
        probability = self._settings.red.probability(depth)
        marked = probability >= 1 or (probability > 0 and self._random.random() < probability)
        self.stats.marked += marked
        return marked

    def pause_changes(self) -> list[tuple[float, bool]]:
        """The pause requests to the sender since the last call: (time, True for XOFF,
        False for XON), oldest first."""
        changes, self._pause_changes = self._pause_changes, []
        return changes

    def _send_pause(self, pause: bool, when: float) -> None:
        if pause:
            self.stats.xoff_sent += 1
            self._last_xoff = when
        else:
            self.stats.xon_sent += 1
        self._paused = pause
        self._pause_changes.append((when, pause))


@dataclass
class Arrival:
    """One frame at a :class:`CongestedSwitch`: when, the queue depth it found, its
    destination QP (None if not RoCEv2), its size and whether it was queued or dropped."""
    time: int
    depth: int
    dqpn: int | None
    size: int
    verdict: str


class CongestedSwitch:
    """An :class:`EgressQueue` for Ethernet frames (no FCS), between a sender and its
    receivers.

    :meth:`receive` takes a frame from the sender; :meth:`poll` returns the frames
    that have left toward the receivers by then, and the PFC or PAUSE frames for the
    sender (from ``mac``, the switch port's address). Marked frames leave with their
    IPv4 ECN bits set to CE and the header checksum recomputed; nothing else
    changes (the ICRC does not cover the ECN bits). Times are integers (cycles).
    ``arrivals`` lists every frame taken (for plots of rate and depth).
    """

    def __init__(self, settings: SwitchSettings, *, mac: str = "02:00:00:5e:00:01") -> None:
        self._queue = EgressQueue(settings)
        self._mac = mac
        self.arrivals: list[Arrival] = []
        self.pause_frames_sent: list[tuple[int, bytes]] = []

    @property
    def queue(self) -> EgressQueue:
        return self._queue

    @property
    def next_due(self) -> int | None:
        """The first whole cycle at which :meth:`poll` has something, or None."""
        due = self._queue.next_due
        return None if due is None else -int(-due // 1)

    def receive(self, frame: bytes, now: int) -> None:
        frame = bytes(frame)
        packet = Ether(frame)
        ect = IP in packet and ecn_capable(packet[IP].tos)
        dqpn = packet[BTH].dqpn if BTH in packet else None
        depth = self._queue.depth()
        verdict = self._queue.offer(packet, len(frame), ect, now)
        self.arrivals.append(Arrival(now, depth, dqpn, len(frame), verdict))

    def poll(self, now: int) -> tuple[list[bytes], list[bytes]]:
        """(frames that left toward the receivers, PFC or PAUSE frames for the
        sender) by ``now``, oldest first."""
        forwarded = []
        for _, packet, marked in self._queue.advance(now):
            if marked:
                packet[IP].tos |= ECN_CE
                packet[IP].chksum = None
            forwarded.append(bytes(packet))
        upstream = []
        for when, pause in self._queue.pause_changes():
            frame = self.pause_frame(self._queue.settings.pause_quanta if pause else 0)
            self.pause_frames_sent.append((int(when), frame))
            upstream.append(frame)
        return forwarded, upstream

    def pause_frame(self, quanta: int) -> bytes:
        """A PFC frame for the RoCEv2 priority, or a PAUSE frame, asking for ``quanta``
        (IEEE 802.1Qbb 36.1.3.1, 802.3 31B.3.1; padded to 60 bytes)."""
        priority = self._queue.settings.pfc_priority
        if priority is None:
            control = MACControlPause(pause_time=quanta)
        else:
            control = MACControlClassBasedFlowControl(**{f"c{priority}_enabled": 1,
                                                         f"c{priority}_pause_time": quanta})
        return bytes(Ether(src=self._mac, dst=MAC_CONTROL_ADDRESS) / control)


@dataclass
class NotificationPoint:
    """A receiver's CNP rate limit: at most one CNP per QP per ``gap`` cycles (mlx5's
    ``min_time_between_cnps``; the DCQCN paper's N)."""
    gap: int
    _last: dict[int, int] = field(default_factory=dict)

    def last_cnp(self, qpn: int) -> int | None:
        """When the last CNP for QP ``qpn`` went, or None."""
        return self._last.get(qpn)

    def notify(self, qpn: int, now: int) -> bool:
        """A CE-marked packet of QP ``qpn`` arrived at ``now``: whether to send a CNP."""
        last = self._last.get(qpn)
        if last is not None and now - last < self.gap:
            return False
        self._last[qpn] = now
        return True
