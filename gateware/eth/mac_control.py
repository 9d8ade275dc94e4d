"""Received IEEE 802.3x PAUSE and 802.1Qbb PFC frames, and the pause timers they set."""

import math

from amaranth import *
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out, connect, flipped

from ..counters import counters_layout, event_counter
from ..headers import MAC_CONTROL, OPCODE_PAUSE, OPCODE_PFC
from ..packet.extract import HeaderExtractor
from ..stream import BEAT_BYTES, packet_signature
from .rx import ETH_RX_META

__all__ = ["MacControl", "PAUSE_CONFIG", "QUANTUM_FRACTION_BITS", "ROCE_PRIORITY",
           "quantum_cycles_at"]

#: Fraction bits of ``PAUSE_CONFIG.quantum_cycles``.
QUANTUM_FRACTION_BITS = 8

#: The priority of RoCEv2 traffic by default: DSCP 26 maps to it under ``mlnx_qos --trust dscp``.
ROCE_PRIORITY = 3

#: Settings of the pause timers.
PAUSE_CONFIG = data.StructLayout({
    "roce_priority": 3,         # the 802.1p priority of RoCEv2 frames, whose PFC pauses them
    "quantum_cycles": 16,       # clock cycles of one pause quantum (512 bit times), 8.8 fixed point
})

#: Bits of a pause timer: 0xFFFF quanta of up to 256 cycles.
_TIMER_BITS = 16 + 16 - QUANTUM_FRACTION_BITS


def quantum_cycles_at(clock_hz, line_bps=100e9):
    """``PAUSE_CONFIG.quantum_cycles`` at a clock and line rate, rounded up (a pause never
    ends early): 512 bit times are 5.12 ns at 100 Gb/s, 1.65 cycles of 322 MHz."""
    value = math.ceil(clock_hz * 512 / line_bps * (1 << QUANTUM_FRACTION_BITS))
    if not 0 < value < 1 << 16:
        raise ValueError(f"A pause quantum of {value / (1 << QUANTUM_FRACTION_BITS)} cycles "
                         f"does not fit the setting (up to 256 cycles)")
    return value


class MacControl(wiring.Component):
    """Takes MAC control frames (EtherType 0x8808, their Ethernet header already off) and
    keeps the pause timers of the transmit side.

    * PAUSE (IEEE 802.3 annex 31B, opcode 0x0001): ``o_pause_all`` for ``pause_time``
      quanta. Every frame the endpoint sends waits.
    * PFC (IEEE 802.1Qbb clause 36, opcode 0x0101): if the class-enable vector has the
      bit of ``i_config.roce_priority``, ``o_pause_roce`` for that priority's time. A
      PFC for another priority pauses nothing here (the endpoint sends nothing else on
      a lossless priority).

    A quantum is 512 bit times, ``i_config.quantum_cycles`` clock cycles (8.8 fixed
    point, see :func:`quantum_cycles_at`). Each frame sets its timer anew (a refresh);
    a time of 0 ends the pause at once. ``o_pause_roce`` is high during a PAUSE too.
    A priority changed at run time keeps the time already counting.

    Latency: the timer is set 3 cycles after the frame's first beat leaves the header
    extractor (one beat after it comes in). Always ready.

    Counters (32 bits, wrapping): ``pause`` and ``pfc`` frames, ``other`` MAC control
    frames (other opcodes, dropped), ``paused_cycles`` (cycles ``o_pause_roce`` is high).
    """

    def __init__(self, *, width=BEAT_BYTES):
        self._width = width
        super().__init__({
            "i": In(packet_signature(ETH_RX_META, width=width)),
            "i_config": In(PAUSE_CONFIG),
            "o_pause_all": Out(1),
            "o_pause_roce": Out(1),
            "o_counters": Out(self.counters_layout()),
        })

    @staticmethod
    def counters_layout():
        return counters_layout("pause", "pfc", "other", "paused_cycles")

    def elaborate(self, platform):
        m = Module()
        m.submodules.header = header = HeaderExtractor(
            "mac_control", MAC_CONTROL, ETH_RX_META, width=self._width)
        connect(m, flipped(self.i), header.i)
        m.d.comb += header.o.ready.eq(1)

        # Stage 1: the first beat of a frame says which timer it sets and to how many quanta.
        first = Signal(init=1)
        with m.If(header.o.valid):
            m.d.sync += first.eq(header.o.p.last)
        control = header.o.p.meta.mac_control
        arrives = header.o.valid & first
        is_pause = arrives & (control.opcode == OPCODE_PAUSE)
        is_pfc = arrives & (control.opcode == OPCODE_PFC)
        times = Array(control[f"time{priority}"] for priority in range(8))

        set_all = Signal()
        set_roce = Signal()
        quanta = Signal(16)
        m.d.sync += [
            set_all.eq(is_pause),
            set_roce.eq(is_pfc & control.parameter.bit_select(self.i_config.roce_priority, 1)),
            quanta.eq(Mux(is_pause, control.parameter, times[self.i_config.roce_priority])),
        ]

        # Stage 2: quanta → cycles, rounded up.
        set_all_cycles = Signal()
        set_roce_cycles = Signal()
        cycles = Signal(_TIMER_BITS)
        round_up = (1 << QUANTUM_FRACTION_BITS) - 1
        m.d.sync += [
            set_all_cycles.eq(set_all),
            set_roce_cycles.eq(set_roce),
            cycles.eq((quanta * self.i_config.quantum_cycles + round_up)
                      >> QUANTUM_FRACTION_BITS),
        ]

        # Stage 3: the timers count down to 0; a frame sets its timer anew.
        def timer(name, load):
            """Whether the timer ``name`` runs (``count != 0``) from the next cycle on."""
            count = Signal(_TIMER_BITS, name=name)
            runs_next = Signal(name=f"{name}_runs_next")
            with m.If(load):
                m.d.sync += count.eq(cycles)
                m.d.comb += runs_next.eq(cycles != 0)
            with m.Elif(count != 0):
                m.d.sync += count.eq(count - 1)
                m.d.comb += runs_next.eq(count[1:] != 0)
            return runs_next

        # Both outputs are registers set from the timers' next values, so a pause does not
        # chain with the compares, nor with the OR of the two timers (same cycles).
        all_next = timer("timer_all", set_all_cycles)
        roce_next = timer("timer_roce", set_roce_cycles)
        m.d.sync += [
            self.o_pause_all.eq(all_next),
            self.o_pause_roce.eq(roce_next | all_next),
        ]

        counters = self.o_counters
        m.d.comb += [
            counters.pause.eq(event_counter(m, is_pause, "pause")),
            counters.pfc.eq(event_counter(m, is_pfc, "pfc")),
            counters.other.eq(event_counter(m, arrives & ~is_pause & ~is_pfc, "other")),
            counters.paused_cycles.eq(event_counter(m, self.o_pause_roce, "paused_cycles")),
        ]
        return m
