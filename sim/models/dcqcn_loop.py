"""Closed-loop congestion control in pure Python: N QPs of one sender into a congested
switch port, their CNPs back to their reaction points.

The sender has one line of ``line_rate`` bytes a cycle; its QPs always have data and
each sends frames of ``frame`` bytes (plus ``overhead`` on the wire) no faster than
its reaction point allows (:class:`sim.models.dcqcn.ReactionPoint`, whose times are in
microseconds and rates in Mb/s: ``clock_hz`` converts). The line starts the
next frame of the QP whose pacing allows it first (round robin on a tie), and
none while the switch has paused it (PFC). A frame reaches the switch's
:class:`sim.models.switch.EgressQueue` when its last byte is on the wire; a marked frame
that leaves the queue draws a CNP (through a :class:`sim.models.switch.NotificationPoint`)
that reaches its QP's reaction point ``round_trip`` cycles later, as the responder
model's ConnectX mode answers. Times are in cycles (floats).

:func:`run_loop` returns the sending rate of every QP and the queue depth, sampled
every ``sample`` cycles; :func:`convergence` finds when the rates came within a
tolerance of each other and stayed there, and each QP's share of the bottleneck.
This is the model ``make bench`` plots beside the gateware's run
(``sim/bench/dcqcn.py``), and what picks the marking and timer settings that
converge.
"""

import heapq
from dataclasses import dataclass, field

from sim.models.dcqcn import ReactionPoint
from sim.models.switch import EgressQueue, NotificationPoint, SwitchSettings

__all__ = ["LoopSettings", "LoopResult", "run_loop", "convergence"]


@dataclass(frozen=True)
class LoopSettings:
    """The sender and the wire around the switch (cycles and bytes)."""
    line_rate: float            # the sender's line, bytes a cycle
    frame: int                  # bytes of each frame (no FCS)
    round_trip: int             # from a marked frame leaving the switch to its CNP arriving
    cnp_gap: int                # the receiver's min_time_between_cnps
    sample: int                 # cycles of each rate sample
    clock_hz: float             # cycles a second
    overhead: int = 24          # FCS, preamble and inter-frame gap
    recheck: int = 322          # cycles at most between looks at the rates of paced QPs

    def microseconds(self, cycles: float) -> float:
        return cycles * 1e6 / self.clock_hz

    def bytes_per_cycle(self, mbps: float) -> float:
        return mbps * 1e6 / 8 / self.clock_hz

    def __post_init__(self) -> None:
        if not self.line_rate > 0 or self.frame <= 0 or self.sample <= 0 \
                or self.round_trip < 0 or self.cnp_gap < 0 or self.overhead < 0:
            raise ValueError(f"LoopSettings out of range: {self!r}")


@dataclass
class LoopResult:
    """Samples of a run: ``times[k]`` ends sample k; ``rates[q][k]`` is the bytes a
    cycle QP q sent in it; ``depths[k]`` the largest queue depth a frame found in it."""
    times: list[float] = field(default_factory=list)
    rates: list[list[float]] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)
    cnps: list[int] = field(default_factory=list)
    max_depth: int = 0
    marked: int = 0
    dropped: int = 0
    pauses: int = 0


def run_loop(points: list[ReactionPoint], switch: SwitchSettings, settings: LoopSettings,
             cycles: int) -> LoopResult:
    """Run ``points`` (one per QP) into a switch port with ``switch`` settings for
    ``cycles`` cycles."""
    if not points:
        raise ValueError("run_loop needs at least one reaction point")
    queue = EgressQueue(switch)
    notification = NotificationPoint(settings.cnp_gap)
    wire = settings.frame + settings.overhead
    serialise = wire / settings.line_rate
    count = len(points)
    result = LoopResult(rates=[[] for _ in points], cnps=[0] * count)
    cnps: list[tuple[float, int]] = []           # (arrival at the sender, QP)
    last_start = [-float(wire)] * count          # when each QP last started a frame
    sent = [0] * count                           # bytes in the current sample
    sample_end = float(settings.sample)
    sample_depth = 0
    line_free = 0.0
    last_served = count - 1
    paused = False

    def take_departures(now: float) -> None:
        nonlocal paused
        for when, qp, marked in queue.advance(now):
            if marked and notification.notify(qp, when):
                heapq.heappush(cnps, (when + settings.round_trip, qp))
        for _, pause in queue.pause_changes():
            paused = pause
            result.pauses += pause

    def close_samples(until: float) -> None:
        nonlocal sample_end, sample_depth
        while sample_end <= until:
            result.times.append(sample_end)
            for qp in range(count):
                result.rates[qp].append(sent[qp] / settings.sample)
                sent[qp] = 0
            result.depths.append(sample_depth)
            sample_depth = queue.depth()
            sample_end += settings.sample

    now = 0.0
    while now < cycles:
        ready = max(now, line_free)
        if cnps and cnps[0][0] <= ready:
            when, qp = heapq.heappop(cnps)
            now = max(now, when)
            points[qp].cnp(settings.microseconds(now))
            result.cnps[qp] += 1
            continue
        if paused:                  # nothing starts until the queue lets XON go
            now = min(queue.next_due, cnps[0][0]) if cnps else queue.next_due
            take_departures(now)
            close_samples(now)
            continue
        # Each QP's pacing, at the rate its reaction point allows now; a rate that
        # rises meanwhile is seen at the next look, ``recheck`` later at most.
        starts = []
        for qp in range(count):
            points[qp].advance(settings.microseconds(ready))
            rate = min(settings.bytes_per_cycle(points[qp].rate), settings.line_rate)
            if not rate > 0:
                raise ValueError(f"QP {qp}'s reaction point gave the rate {rate!r} at {ready}")
            starts.append(max(ready, last_start[qp] + wire / rate))
        start = min(starts)
        if start >= cycles:
            break
        if cnps and cnps[0][0] <= start:
            now = cnps[0][0]            # taken first at the next look
            continue
        if start > ready + settings.recheck:
            now = ready + settings.recheck
            take_departures(now)
            close_samples(now)
            continue
        qp = min(range(count), key=lambda q: (starts[q], (q - last_served - 1) % count))
        last_served = qp
        now = last_start[qp] = start
        line_free = now + serialise
        points[qp].advance(settings.microseconds(now))
        points[qp].sent(settings.frame)
        close_samples(now)
        sent[qp] += wire
        take_departures(line_free)
        sample_depth = max(sample_depth, queue.depth())
        queue.offer(qp, settings.frame, True, line_free)
        take_departures(line_free)
    close_samples(cycles)
    result.max_depth = queue.stats.max_depth
    result.marked = queue.stats.marked
    result.dropped = queue.stats.dropped
    return result


def convergence(result: LoopResult, *, window: int = 1, tolerance: float = 0.1,
                tail: float = 0.25) -> tuple[float | None, list[float]]:
    """When the QPs' rates, averaged over ``window`` samples, came within ``tolerance``
    of their mean and stayed there to the end (the start of the first such window;
    None: they did not), and each QP's mean rate over the last ``tail`` of the run."""
    count = len(result.rates)
    windows = len(result.times) // window
    converged_at = None
    for k in range(windows):
        span = slice(k * window, (k + 1) * window)
        rates = [sum(result.rates[qp][span]) / window for qp in range(count)]
        mean = sum(rates) / count
        within = mean > 0 and all(abs(rate - mean) <= tolerance * mean for rate in rates)
        if not within:
            converged_at = None
        elif converged_at is None:
            converged_at = result.times[k * window] - result.times[0] if k else 0.0
    last = max(1, round(len(result.times) * tail))
    shares = [sum(rates[-last:]) / last for rates in result.rates]
    return converged_at, shares
