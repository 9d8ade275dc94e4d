"""A reference model of the DCQCN reaction point of one QP, independent of the gateware.

DCQCN (Zhu et al., "Congestion Control for Large-Scale RDMA Deployments", SIGCOMM
2015, section 3.1 and figure 6) as ConnectX firmware runs it, with the firmware's
parameter names and defaults. Rates are in Mb/s, times in microseconds, α is a
fraction of 1024 (the firmware's fixed point with 10 fraction bits).

Where the names and defaults come from:

- NVIDIA, "DCQCN CC Parameters" (DOCA SDK documentation, networking-docs.nvidia.com,
  archive 3.4.0) and Mellanox community DOC-2790 "DCQCN Parameters": ``dce_tcp_g``
  1019, ``dce_tcp_rtt`` 1 µs, ``initial_alpha_value`` 1023,
  ``rate_to_set_on_first_cnp`` 0, ``rpg_min_dec_fac`` 50 %, ``rpg_min_rate`` 1 Mb/s,
  ``rpg_gd`` 11 (the rate cut is Rc·α/2^rpg_gd: with α in 1/1024 that is the paper's
  Rc·α/2), ``rate_reduce_monitor_period`` 4 µs, ``rpg_time_reset`` 300 µs,
  ``rpg_byte_reset`` 32767 bytes, ``rpg_threshold`` 1, ``rpg_ai_rate`` 5 Mb/s,
  ``rpg_hai_rate`` 50 Mb/s, ``rpg_max_rate`` 0 (the line rate), ``clamp_tgt_rate`` 0,
  ``clamp_tgt_rate_after_time_inc`` 1. α moves once every ``dce_tcp_rtt``:
  α·g/1024 + (1024 − g) if a CNP came in that period, α·g/1024 if none.
- Linux ``drivers/infiniband/hw/mlx5/cong.c`` (the same names as debugfs files of
  ``cc_params``: ``rp_time_reset``, ``rp_byte_reset``, ``rp_threshold``, ...) and
  ``include/uapi/linux/dcbnl.h`` (802.1Qau QCN, where the ``rpg_*`` names come from:
  ``rpg_time_reset`` in µs, ``rpg_byte_reset`` in bytes, ``rpg_threshold`` the count of
  time or byte stages before the increase moves on).
- The NS-3 DCQCN of alibaba-edu/High-Precision-Congestion-Control (``rdma-hw.cc``,
  the "Mlx" functions) for the order of events: a CNP is acted on at most once per
  ``rate_reduce_monitor_period`` (later ones wait for the period's end); the target
  rate is set to the current rate on a cut unless neither ``clamp_tgt_rate`` nor
  (``clamp_tgt_rate_after_time_inc`` and a timer stage since the last cut) holds.

The reaction point (paper, figure 6):

- **Cut** (a CNP, at most one per ``rate_reduce_monitor_period``): Rt = Rc (see the
  clamp above), Rc = max(Rc·(1 − α/2^(rpg_gd − 10)), Rc·rpg_min_dec_fac/100,
  rpg_min_rate); the timer, the byte counter and both stage counts start again. The
  first CNP of a QP at the line rate starts α at ``initial_alpha_value`` (and sets
  Rc = Rt = ``rate_to_set_on_first_cnp`` instead of a cut when that is not 0).
- **Increase events**: every ``rpg_time_reset`` µs (the timer stage T counts them)
  and every ``rpg_byte_reset`` bytes sent (the byte stage BC); with F =
  ``rpg_threshold``: fast recovery while max(T, BC) < F (Rt stays), hyper increase
  when min(T, BC) > F (Rt += ``rpg_hai_rate``), additive increase otherwise (Rt +=
  ``rpg_ai_rate``); Rt is held to the line rate, then Rc = (Rt + Rc)/2.
- Once Rc reaches the line rate, the QP is no longer rate limited: its next CNP is
  a first CNP again.
"""

from dataclasses import dataclass, field

__all__ = ["DcqcnSettings", "ReactionPoint", "ALPHA_ONE", "LINE_RATE_MBPS"]

#: α = 1 in the firmware's fixed point (10 fraction bits).
ALPHA_ONE = 1024

#: The line rate of the endpoint (100GBASE).
LINE_RATE_MBPS = 100_000


@dataclass(frozen=True)
class DcqcnSettings:
    """ConnectX's reaction-point settings (``/sys/kernel/debug/mlx5/<pci>/cc_params``),
    with the firmware's defaults."""
    line_rate: int = LINE_RATE_MBPS            # Mb/s
    rpg_time_reset: int = 300                  # µs between timer increase events
    rpg_byte_reset: int = 32767                # bytes between byte-counter events (0: none)
    rpg_threshold: int = 1                     # F: stages of fast recovery
    rpg_max_rate: int = 0                      # Mb/s; 0: the line rate
    rpg_ai_rate: int = 5                       # Mb/s, additive increase
    rpg_hai_rate: int = 50                     # Mb/s, hyper increase
    rpg_gd: int = 11                           # cut = Rc·α / 2^rpg_gd (α in 1/1024)
    rpg_min_dec_fac: int = 50                  # %: a cut keeps at least this much of Rc
    rpg_min_rate: int = 1                      # Mb/s
    rate_to_set_on_first_cnp: int = 0          # Mb/s; 0: cut from the line rate
    rate_reduce_monitor_period: int = 4        # µs: at most one cut per period
    dce_tcp_g: int = 1019                      # α ← α·g/1024 (+ 1024 − g with a CNP)
    dce_tcp_rtt: int = 1                       # µs: α update period
    initial_alpha_value: int = 1023            # α at a QP's first CNP
    clamp_tgt_rate: int = 0
    clamp_tgt_rate_after_time_inc: int = 1

    def __post_init__(self):
        for name in ("rpg_time_reset", "rate_reduce_monitor_period", "dce_tcp_rtt",
                     "line_rate", "rpg_min_rate"):
            if getattr(self, name) < 1:
                raise ValueError(f"DCQCN setting {name} must be at least 1, "
                                 f"not {getattr(self, name)!r}")
        if not 0 <= self.dce_tcp_g < ALPHA_ONE:
            raise ValueError(f"dce_tcp_g must be 0..1023, not {self.dce_tcp_g!r}")
        if not 0 <= self.initial_alpha_value < ALPHA_ONE:
            raise ValueError(f"initial_alpha_value must be 0..1023, "
                             f"not {self.initial_alpha_value!r}")
        if not 0 <= self.rpg_min_dec_fac <= 100:
            raise ValueError(f"rpg_min_dec_fac is a percentage, not {self.rpg_min_dec_fac!r}")

    @property
    def max_rate(self) -> int:
        return self.rpg_max_rate or self.line_rate


@dataclass
class ReactionPoint:
    """One QP's reaction point. Call :meth:`cnp` when a CNP arrives, :meth:`sent` for
    the bytes the QP sends, and :meth:`advance` to let time pass (it runs the timers
    in time order); :attr:`rate` is the current rate Rc in Mb/s."""
    settings: DcqcnSettings = field(default_factory=DcqcnSettings)
    now: float = 0.0
    limited: bool = False               # Rc below the line rate since a CNP
    rate: float = 0.0                   # Rc
    target: float = 0.0                 # Rt
    alpha: float = 0.0                  # in 1/1024
    time_stage: int = 0                 # T
    byte_stage: int = 0                 # BC
    cuts: int = 0
    increases: int = 0
    _bytes: int = 0                     # since the last byte event
    _cnp_pending: bool = False          # a CNP waits for the monitor period to end
    _cnp_in_period: bool = False        # a CNP came in this α period
    _last_cut: float = 0.0
    _next_alpha: float = 0.0
    _next_timer: float = 0.0

    def __post_init__(self):
        self.rate = self.target = float(self.settings.max_rate)

    def cnp(self, now: float) -> None:
        """A CNP for the QP at time ``now`` (µs)."""
        self.advance(now)
        s = self.settings
        if not self.limited:
            self.limited = True
            self.alpha = float(s.initial_alpha_value)
            self._next_alpha = now + s.dce_tcp_rtt
            self._cnp_in_period = True
            if s.rate_to_set_on_first_cnp:
                self.rate = self.target = float(min(s.rate_to_set_on_first_cnp, s.max_rate))
                self._restart(now)
                return
            self._cut(now)
            return
        self._cnp_in_period = True
        if now - self._last_cut >= s.rate_reduce_monitor_period:
            self._cut(now)
        else:
            self._cnp_pending = True

    def sent(self, length: int) -> None:
        """The QP sent ``length`` bytes (now): byte-counter increase events."""
        s = self.settings
        if not self.limited or not s.rpg_byte_reset:
            return
        self._bytes += length
        while self.limited and self._bytes >= s.rpg_byte_reset:
            self._bytes -= s.rpg_byte_reset
            self.byte_stage += 1
            self._increase()

    def advance(self, now: float) -> None:
        """Let time run to ``now`` (µs), with every timer event on the way in order."""
        s = self.settings
        while self.limited:
            due = [(self._next_alpha, 0), (self._next_timer, 1)]
            if self._cnp_pending:
                due.append((self._last_cut + s.rate_reduce_monitor_period, 2))
            when, kind = min(due)
            if when > now:
                break
            if kind == 0:
                self._alpha_update()
                self._next_alpha += s.dce_tcp_rtt
            elif kind == 1:
                self.time_stage += 1
                self._next_timer += s.rpg_time_reset
                self._increase()
            else:
                self._cnp_pending = False
                self._cut(when)
        self.now = now

    def _alpha_update(self) -> None:
        g = self.settings.dce_tcp_g
        self.alpha = self.alpha * g / ALPHA_ONE + (ALPHA_ONE - g if self._cnp_in_period else 0)
        self._cnp_in_period = False

    def _cut(self, now: float) -> None:
        s = self.settings
        clamp = s.clamp_tgt_rate or (s.clamp_tgt_rate_after_time_inc and self.time_stage > 0)
        if clamp:
            self.target = self.rate
        cut = self.rate * self.alpha / (1 << s.rpg_gd)
        self.rate = max(self.rate - cut, self.rate * s.rpg_min_dec_fac / 100, s.rpg_min_rate)
        self.cuts += 1
        self._cnp_in_period = True
        self._restart(now)

    def _restart(self, now: float) -> None:
        self.time_stage = self.byte_stage = self._bytes = 0
        self._last_cut = now
        self._next_timer = now + self.settings.rpg_time_reset

    def _increase(self) -> None:
        s = self.settings
        threshold = s.rpg_threshold
        if max(self.time_stage, self.byte_stage) < threshold:
            pass                                            # fast recovery
        elif min(self.time_stage, self.byte_stage) > threshold:
            self.target += s.rpg_hai_rate                   # hyper increase
        else:
            self.target += s.rpg_ai_rate                    # additive increase
        self.target = min(self.target, s.max_rate)
        self.rate = (self.rate + self.target) / 2
        self.increases += 1
        if self.rate >= s.max_rate - 1 / 256:
            self.rate = self.target = float(s.max_rate)
            self.limited = False
            self.cuts = 0
            self._cnp_pending = False
