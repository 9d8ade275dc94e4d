"""The InfiniBand timers of a requester, in ticks of 4.096 us.

The core counts time in ticks whose length in clock cycles is a run-time
setting (``TRANSMIT_CONFIG.tick``: 1320 cycles at the CMAC's 322 MHz), so a
simulation can run the same timers in few cycles. The ACK timeout of a QP is
2^timeout ticks (IBTA 9.7.6.1.3, "local ACK timeout"); an RNR NAK's 5-bit code
selects a wait from IBTA table 45, rounded up to whole ticks.
"""

import math

__all__ = ["TICK_US", "RNR_DELAYS_US", "rnr_delay_ticks", "ticks_at"]

#: One tick: the unit of the IBTA ACK timeout.
TICK_US = 4.096

#: IBTA vol. 1 table 45: the minimum RNR NAK timer field, code → microseconds.
RNR_DELAYS_US = (
    655360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920, 2560,
    3840, 5120, 7680, 10240, 15360, 20480, 30720, 40960, 61440, 81920, 122880, 163840,
    245760, 327680, 491520,
)


def rnr_delay_ticks(code):
    """The wait an RNR NAK with timer ``code`` asks for, in whole ticks (rounded up)."""
    return math.ceil(RNR_DELAYS_US[code] / TICK_US)


def ticks_at(frequency_hz):
    """Cycles of one tick at a clock frequency."""
    return round(frequency_hz * TICK_US / 1e6)
