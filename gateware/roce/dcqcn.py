"""DCQCN's reaction point, per QP: the rate each QP may send at, cut on CNPs and raised
again by timers and a byte counter (Zhu et al., SIGCOMM 2015; the settings of ConnectX
firmware, see ``sim/models/dcqcn.py`` for their meaning and sources)."""

from amaranth import *
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from ..arith import difference_at_least, sum_above
from ..stream import registered
from .deadline_scan import DeadlineScan
from .flag_memory import FlagMemory, write_flags
from .qp_context import qp_bits_of
from .requests import QP_INDEX_BITS, check_qp_count

__all__ = ["DcqcnReactionPoint", "DCQCN_CONFIG", "DCQCN_DEFAULTS", "RATE_UPDATE",
           "RATE_FRACTION_BITS", "INTERVAL_FRACTION_BITS", "INTERVAL_BITS", "ALPHA_BITS",
           "rate_interval"]

#: Fraction bits of a rate in Mb/s: 1/256 Mb/s, so a halving keeps 1 % down to 1 Mb/s.
RATE_FRACTION_BITS = 8

#: α in 1/1024 in the settings, as the firmware keeps it; the state keeps 6 bits more,
#: so that a thousand updates' rounding stays far below 1 % of a cut.
ALPHA_BITS = 10
_ALPHA_EXTRA = 6
_ALPHA = ALPHA_BITS + _ALPHA_EXTRA

#: Fraction bits of a pacing interval in clock cycles per byte.
INTERVAL_FRACTION_BITS = 16

_RATE = 17 + RATE_FRACTION_BITS         # up to 131071 Mb/s
_MBPS = 17                              # settings in whole Mb/s
_MICROSECONDS = 17                      # settings in µs (ConnectX: 1..131071)
_TIME_BITS = 20                         # the µs count timers are stamped with (wraps)
_STAGE_BITS = 5
INTERVAL_BITS = 32                          # cycles per byte: up to 2^16 at 1 Mb/s

#: The reaction point's settings (ConnectX's names; rates in Mb/s, times in µs).
#: ``rpg_min_dec_fac`` is not here: with ``rpg_gd`` ≥ 11 a cut is at most half the
#: rate, so its default (50 %) never binds.
DCQCN_CONFIG = data.StructLayout({
    "enable": 1,                        # 0: no QP is ever rate limited (and ECN Not-ECT)
    "cycles_per_us": 10,                # clock cycles of one µs (the time base)
    "line_rate": _MBPS,
    "rpg_max_rate": _MBPS,              # 0: the line rate
    "rpg_min_rate": _MBPS,
    "rpg_ai_rate": _MBPS,
    "rpg_hai_rate": _MBPS,
    "rate_to_set_on_first_cnp": _MBPS,  # 0: cut from the line rate
    "rpg_time_reset": _MICROSECONDS,
    "rpg_byte_reset": 24,               # bytes; 0: no byte counter
    "rpg_threshold": _STAGE_BITS,
    "rpg_gd": 4,
    "rate_reduce_monitor_period": _MICROSECONDS,
    "dce_tcp_g": ALPHA_BITS,
    "dce_tcp_rtt": _MICROSECONDS,
    "initial_alpha_value": ALPHA_BITS,
    "clamp_tgt_rate": 1,
    "clamp_tgt_rate_after_time_inc": 1,
})


def DCQCN_DEFAULTS(clock_hz):
    """ConnectX's defaults at a clock frequency (a dict for ``DCQCN_CONFIG.const``)."""
    return {
        "enable": 1, "cycles_per_us": round(clock_hz / 1e6), "line_rate": 100_000,
        "rpg_max_rate": 0, "rpg_min_rate": 1, "rpg_ai_rate": 5, "rpg_hai_rate": 50,
        "rate_to_set_on_first_cnp": 0, "rpg_time_reset": 300, "rpg_byte_reset": 32767,
        "rpg_threshold": 1, "rpg_gd": 11, "rate_reduce_monitor_period": 4,
        "dce_tcp_g": 1019, "dce_tcp_rtt": 1, "initial_alpha_value": 1023,
        "clamp_tgt_rate": 0, "clamp_tgt_rate_after_time_inc": 1,
    }


#: A QP's new rate: whether it is limited, and if so its rate (Mb/s, fixed point) and
#: the clock cycles one byte takes at it (fixed point, for the pacer).
RATE_UPDATE = data.StructLayout({
    "qp": QP_INDEX_BITS,
    "limited": 1,
    "rate": _RATE,
    "interval": INTERVAL_BITS,
})


def rate_interval(rate, cycles_per_us):
    """What the gateware computes for a rate (fixed point): cycles per byte × 2^16."""
    return (cycles_per_us * 8 << INTERVAL_FRACTION_BITS + RATE_FRACTION_BITS) // rate


#: A QP's reaction-point state, in a memory.
_STATE = data.StructLayout({
    "limited": 1,                       # rate limited since a CNP (else: the line rate)
    "rate": _RATE,                      # Rc
    "target": _RATE,                    # Rt
    "alpha": _ALPHA,                    # in 1/2^16
    "cnp_in_period": 1,                 # a CNP came in this α period
    "cut_waiting": 1,                   # a CNP waits for the monitor period to end
    "time_stage": _STAGE_BITS,          # T
    "byte_stage": _STAGE_BITS,          # BC
    "alpha_time": _TIME_BITS,           # start of this α period
    "timer_time": _TIME_BITS,           # start of this increase-timer period
    "cut_time": _TIME_BITS,             # the last cut
})

#: A QP's bytes sent since the byte counter last ran out (it runs out at
#: ``rpg_byte_reset``, up to 2^24 - 1).
_BYTE_COUNT_BITS = 24

#: A bit per QP each: events waiting for a visit (``cnp_waiting``, ``byte_event``,
#: ``reset_waiting``), the visits' copy of ``limited`` for the byte counter, and
#: ``bytes_clear``: the byte count starts again (a cut).
_FLAGS = ("cnp_waiting", "byte_event", "reset_waiting", "limited", "bytes_clear")

#: Most α periods one visit catches up on (a longer backlog is dropped).
_ALPHA_CATCH_UP = 8


class DcqcnReactionPoint(wiring.Component):
    """The DCQCN reaction point of ``qps`` QPs.

    ``i_cnp`` takes a CNP's QP, ``i_bytes`` the QP and wire bytes of each packet sent
    (for the byte counter), ``i_reset`` a QP set again (it returns to the line rate);
    all are always ready and may come every cycle. Each QP's state (``_STATE``)
    lives in a memory. A visit of a QP, if it is rate limited or has a CNP waiting,
    updates α for every α period that ended (at most 8 a visit, 3 cycles each), cuts
    the rate for a waiting CNP once the monitor period since the last cut is over, and
    makes one rate-increase event (timer, else byte counter). A changed rate leaves on
    ``o_rate`` with the QP's pacing interval, cycles per byte =
    8·``cycles_per_us``/rate, from a 37-step divider. Products (Rc·α, α·g) come from
    one registered multiplier, a cycle each. With ``enable`` low nothing is limited: a
    visit returns a limited QP to the line rate.

    The QPs to visit come from a ``DeadlineScan`` of up to 32 QPs a cycle (time:
    the count of µs): those marked since their last visit and those whose hint has
    come. Marked are a QP's CNP taken (``i_cnp`` with ``enable``, in its cycle), its
    reset (``i_reset``, in its cycle) and its byte counter reaching ``rpg_byte_reset``
    (2 cycles after the packet's ``i_bytes``). A visit ends by writing the QP's hint,
    worked out in the 3 cycles after it (the µs to each deadline, the least, its time)
    and written in the 4th: armed while the QP is limited, at the earliest of the end
    of its α period (``alpha_time`` + ``dce_tcp_rtt``), of its rate-increase timer
    (``timer_time`` + ``rpg_time_reset``) and, with a cut waiting, of its monitor period
    (``cut_time`` + ``rate_reduce_monitor_period``), or at once when the visit leaves an
    event behind (a byte event put off by a timer event, a deadline already past). A
    QP marked from the visit's read of its events to the hint's write keeps its mark
    (the hint is not written), so it is visited again. A limited QP thus always has a
    hint within its α period (so with ``enable`` low it returns to the line rate within
    that), and a QP at the line rate with nothing waiting is not visited. A change of
    the settings' periods takes effect for each QP at its next visit: its hint stays as
    its last visit wrote it.

    Latency: a visit takes 3 cycles for a QP with nothing to do (the candidate taken,
    its state and events read, the decision), 46 to the rate update for a cut (with the
    division); the update leaves in the visit's last cycle. A CNP is acted on within a
    pass of the scan (``qps`` / 32 rows, a cycle each), 2 cycles from the row to its
    offer, the visits of the other candidates found on the way (and a cycle per row
    that holds one) and its own visit: at 4,096 QPs with nothing else waiting,
    128 + 2 + 46 = 176 cycles from the CNP to the first cut's rate update.
    """

    @staticmethod
    def qp_state_bits():
        """Bits the reaction point keeps per QP: its state, its byte count, its flags, and
        its scan's."""
        return {"state": _STATE.size, "byte_count": _BYTE_COUNT_BITS, "flags": len(_FLAGS),
                **DeadlineScan.qp_state_bits(_TIME_BITS)}

    def __init__(self, *, qps):
        self._qps = check_qp_count(qps)
        super().__init__({
            "i_config": In(DCQCN_CONFIG),
            "i_cnp": In(stream.Signature(QP_INDEX_BITS, always_ready=True)),
            "i_bytes": In(stream.Signature(data.StructLayout({"qp": QP_INDEX_BITS,
                                                              "bytes": 14}),
                                           always_ready=True)),
            "i_reset": In(stream.Signature(QP_INDEX_BITS, always_ready=True)),
            "o_rate": Out(stream.Signature(RATE_UPDATE, always_ready=True)),
        })

    @property
    def qps(self):
        return self._qps

    def elaborate(self, platform):
        m = Module()
        qps = self._qps
        qp_bits = qp_bits_of(qps)
        entries = 1 << qp_bits
        config = self.i_config

        # The time base: a count of µs (``now``), and the count ``now`` has the next cycle
        # (``ahead``), so that a visit's deadlines are judged a cycle ahead, into registers.
        cycle = Signal(10)
        ahead = Signal(_TIME_BITS)
        now = Signal(_TIME_BITS)
        with m.If(cycle + 1 >= config.cycles_per_us):
            m.d.sync += [cycle.eq(0), ahead.eq(ahead + 1)]
        with m.Else():
            m.d.sync += cycle.eq(cycle + 1)
        m.d.sync += now.eq(ahead)

        # The QPs to visit: marked by their events, or their hint has come.
        m.submodules.scan = scan = DeadlineScan(qps=qps, time_bits=_TIME_BITS, marks=3)
        cnp_mark, reset_mark, byte_mark = scan.i_mark
        m.d.comb += [
            scan.i_now.eq(now),
            cnp_mark.valid.eq(self.i_cnp.valid & config.enable),
            cnp_mark.p.eq(self.i_cnp.p),
            reset_mark.valid.eq(self.i_reset.valid),
            reset_mark.p.eq(self.i_reset.p),
        ]

        def marked(qp):
            """Whether QP ``qp`` is marked this cycle."""
            return Cat(mark.valid & (mark.p[:len(qp)] == qp) for mark in scan.i_mark).any()

        # The flags (:data:`_FLAGS`, in memories: :class:`FlagMemory`). Writers, the later
        # winning: a packet sent, the visit, the events.
        m.submodules.flags = flags = FlagMemory(
            flags=_FLAGS, depth=entries, addr_bits=QP_INDEX_BITS,
            writers=(("sent", ("bytes_clear",)), ("visit", _FLAGS),
                     ("cnp", ("cnp_waiting",)), ("reset", ("reset_waiting",)),
                     ("bytes", ("byte_event",))),
            reads=("sync", "sync"))
        visited = flags.r[0].data

        # The byte counter: a read-modify-write a cycle, from a registered input. The count
        # and the QP's flags are read a cycle ahead, from the input, through registered
        # ports: the count's passes on that cycle's write, the flags' gives them as they
        # were before that cycle's writes, and those writes of the QP are registered apart
        # (``sent_written``).
        m.submodules.byte_count = byte_count = memory.Memory(shape=_BYTE_COUNT_BITS,
                                                             depth=entries, init=[])
        count_write = byte_count.write_port()
        count_read = byte_count.read_port(transparent_for=(count_write,))
        sent = registered(m, self.i_bytes, "sent")
        sent_written = {(writer, name): Signal(data.StructLayout({"en": 1, "value": 1}),
                                               name=f"sent_written_{writer}_{name}")
                        for writer, name in (("sent", "bytes_clear"), ("visit", "bytes_clear"),
                                             ("visit", "limited"))}
        m.d.comb += flags.r[1].addr.eq(self.i_bytes.p.qp)
        sent_read = flags.r[1].data
        sent_flags = {}
        for name in ("limited", "bytes_clear"):
            value = sent_read[name]
            for (writer, flag), written in sent_written.items():     # the later wins
                if flag == name:
                    port = getattr(flags, f"w_{writer}")
                    m.d.sync += [
                        written.en.eq(getattr(port, name).en
                                      & (port.addr[:qp_bits] == self.i_bytes.p.qp[:qp_bits])),
                        written.value.eq(getattr(port, name).value),
                    ]
                    value = Mux(written.en, written.value, value)
            sent_flags[name] = value
        qp_limited, clear = sent_flags["limited"], sent_flags["bytes_clear"]
        # The count with the packet's bytes, and that less ``rpg_byte_reset`` (the packet's
        # bytes less it are registered with the packet), from two adders side by side: the
        # sign of the second tells whether the count reached the reset. A count cleared
        # since counts from 0: that choice is made after the adds, so that the flags'
        # lookup does not chain with them.
        reset_bytes = Signal.like(config.rpg_byte_reset)
        sent_over = Signal(signed(_BYTE_COUNT_BITS + 2))
        m.d.sync += [
            reset_bytes.eq(config.rpg_byte_reset),
            sent_over.eq(self.i_bytes.p.bytes - config.rpg_byte_reset),
        ]
        counted = Signal(_BYTE_COUNT_BITS + 1)
        over = Signal(signed(_BYTE_COUNT_BITS + 3))
        reached = Signal()
        m.d.comb += [
            count_read.addr.eq(self.i_bytes.p.qp),
            counted.eq(Mux(clear, sent.p.bytes, count_read.data + sent.p.bytes)),
            over.eq(Mux(clear, sent_over, count_read.data + sent_over)),
            reached.eq(over >= 0),
            count_write.addr.eq(sent.p.qp),
            count_write.en.eq(sent.valid & qp_limited & (reset_bytes != 0)),
            count_write.data.eq(Mux(reached, over, counted)),
        ]
        byte_event = Signal()
        m.d.comb += byte_event.eq(sent.valid & qp_limited & (reset_bytes != 0) & reached)
        m.d.sync += [byte_mark.valid.eq(byte_event), byte_mark.p.eq(sent.p.qp)]

        # The visits' per-QP state.
        m.submodules.state = state_memory = memory.Memory(shape=_STATE, depth=entries,
                                                          init=[])
        state_read = state_memory.read_port()
        state_write = state_memory.write_port()
        index = Signal(range(entries))
        state = Signal(_STATE)
        cnp = Signal()                          # a CNP was waiting at this visit
        reset = Signal()                        # a reset was waiting (or not enabled)
        byte = Signal()                         # a byte event was waiting
        catch_up = Signal(range(_ALPHA_CATCH_UP + 1))
        changed = Signal()                      # the rate changed in this visit
        again = Signal()                        # the visit put an event off
        remarked = Signal()                     # the QP was marked since the visit's read
        product = Signal(_RATE + _ALPHA)        # a product; a cut's rate; a raise's room
        quotient = Signal(INTERVAL_BITS)
        remainder = Signal(_RATE + 1)
        step = Signal(range(64))
        step_rate = Signal(_MBPS)               # the increase of Rt of this event
        # The dividend, 8·cycles_per_us in fixed point, is shifted out from its top bit; all
        # its bits below the time base's are zeros, so the register holds the time base
        # alone and shifts zeros in behind it. (Held whole, its 27 zeros cost Yosys 27
        # rounds of its optimizer over the whole core, one bit proved constant each.)
        dividend_bits = len(config.cycles_per_us) + 3 + INTERVAL_FRACTION_BITS + RATE_FRACTION_BITS
        dividend = Signal(len(config.cycles_per_us))

        max_rate = Signal(_RATE)                # (registers: settings change seldom)
        first_rate = Signal(_RATE)              # the first cut's rate, at most max_rate
        m.d.sync += max_rate.eq(Mux(config.rpg_max_rate != 0, config.rpg_max_rate,
                                    config.line_rate) << RATE_FRACTION_BITS)
        # The average's compare with the maximum, beside the average's add: (r + t) >> 1
        # + 1 ≥ max ⟺ r + t > 2·max − 3 (always, for a max below 2).
        max_twice_less = Signal(_RATE + 1)
        max_below_two = Signal()
        m.d.sync += [max_twice_less.eq((max_rate << 1) - 3), max_below_two.eq(max_rate < 2)]
        first = config.rate_to_set_on_first_cnp << RATE_FRACTION_BITS
        m.d.sync += first_rate.eq(Mux(first < max_rate, first, max_rate))
        min_rate = config.rpg_min_rate << RATE_FRACTION_BITS
        g_complement = (1 << ALPHA_BITS) - config.dce_tcp_g

        m.d.comb += [
            state_read.addr.eq(scan.o_candidate.p),     # (read for the LOAD that may follow)
            state_write.addr.eq(index),
            state_write.data.eq(state),
            self.o_rate.p.qp.eq(index),
            self.o_rate.p.limited.eq(state.limited),
            self.o_rate.p.rate.eq(state.rate),
            self.o_rate.p.interval.eq(quotient),
        ]

        # The visit's reads and writes of the flags of its QP. The flags are read a cycle
        # ahead, with the state, as they were before that cycle's events, and those events
        # of the QP registered apart (a register after the flags' memories, not before).
        m.d.comb += [flags.r[0].addr.eq(state_read.addr), flags.w_visit.addr.eq(index)]
        fresh = Signal(data.StructLayout({"cnp": 1, "reset": 1, "byte": 1}))
        for event, qp, valid in ((fresh.cnp, self.i_cnp.p, self.i_cnp.valid & config.enable),
                                 (fresh.reset, self.i_reset.p, self.i_reset.valid),
                                 (fresh.byte, byte_mark.p, byte_mark.valid)):
            m.d.sync += event.eq(valid & (qp[:len(index)] == state_read.addr))

        def set_bit(name, value=1):
            m.d.comb += [getattr(flags.w_visit, name).en.eq(1),
                         getattr(flags.w_visit, name).value.eq(value)]

        def clear_bit(name):
            set_bit(name, 0)

        m.d.comb += write_flags(flags.w_sent, sent.p.qp, sent.valid, 0)   # (a cut's set wins)

        # Whether each period of the visited QP has ended, from its state of the cycle
        # before, registered (no carry chain of a deadline goes on into the FSM's choice).
        # So no state that moves a period's start is followed by one that looks at it.
        alpha_ended, cut_ended, timer_ended = Signal(), Signal(), Signal()
        m.d.sync += [
            alpha_ended.eq(difference_at_least(ahead, state.alpha_time, config.dce_tcp_rtt)),
            cut_ended.eq(difference_at_least(ahead, state.cut_time,
                                             config.rate_reduce_monitor_period)),
            timer_ended.eq(difference_at_least(ahead, state.timer_time,
                                               config.rpg_time_reset)),
        ]

        # A visit's end (``ending``): whether its QP's hint is armed, and whether the QP
        # was marked since the visit's read.
        ending = Signal()
        ending_armed = Signal()
        ending_stale = Signal()
        m.d.sync += remarked.eq(remarked | marked(index))

        def start_division():
            """The divider's start: the steps that follow divide by ``state.rate`` as
            this cycle leaves it."""
            m.d.sync += [
                dividend.eq(config.cycles_per_us),
                remainder.eq(0),
                quotient.eq(0),
                step.eq(dividend_bits - 1),
            ]
            m.next = "DIVIDE"

        with m.FSM():
            with m.State("NEXT"):
                m.d.comb += scan.o_candidate.ready.eq(1)
                with m.If(scan.o_candidate.valid):
                    m.d.sync += index.eq(scan.o_candidate.p)
                    m.next = "LOAD"
            # The state and events read into registers; what to do decided from them.
            with m.State("LOAD"):
                m.d.sync += [
                    state.eq(state_read.data),
                    cnp.eq((visited.cnp_waiting | fresh.cnp) & config.enable),
                    reset.eq(visited.reset_waiting | fresh.reset | ~config.enable),
                    byte.eq(visited.byte_event | fresh.byte),
                    catch_up.eq(0),
                    changed.eq(0),
                    again.eq(0),
                    remarked.eq(marked(index)),
                ]
                clear_bit("cnp_waiting")
                clear_bit("byte_event")
                clear_bit("reset_waiting")
                m.next = "DECIDE"
            with m.State("DECIDE"):
                with m.If(reset & (state.limited | cnp)):
                    m.d.sync += [state.eq(0), changed.eq(1), quotient.eq(0)]
                    m.next = "WRITE"
                with m.Elif(state.limited | cnp):
                    m.next = "ALPHA"
                with m.Else():
                    m.d.comb += [ending.eq(1),                          # not armed
                                 ending_stale.eq(remarked | marked(index))]
                    m.next = "NEXT"

            # α: once for every period that ended (the first CNP starts the periods).
            with m.State("ALPHA"):
                m.d.sync += product.eq(state.alpha * config.dce_tcp_g)
                with m.If(state.limited & alpha_ended & (catch_up < _ALPHA_CATCH_UP)):
                    m.next = "ALPHA_UPDATE"
                with m.Else():
                    with m.If(state.limited & alpha_ended):
                        m.d.sync += state.alpha_time.eq(now)        # too far behind
                    m.next = "CUT_CHECK"
            with m.State("ALPHA_UPDATE"):
                m.d.sync += [
                    state.alpha.eq((product >> ALPHA_BITS)
                                   + Mux(state.cnp_in_period, g_complement << _ALPHA_EXTRA, 0)),
                    state.cnp_in_period.eq(0),
                    state.alpha_time.eq(state.alpha_time + config.dce_tcp_rtt),
                    catch_up.eq(catch_up + 1),
                ]
                m.next = "ALPHA_SETTLE"
            with m.State("ALPHA_SETTLE"):      # (``alpha_ended`` of the new alpha_time)
                m.next = "ALPHA"

            # A cut, for a waiting CNP: at once for the first, else once the monitor
            # period since the last cut is over (until then the CNP keeps waiting).
            with m.State("CUT_CHECK"):
                m.next = "INCREASE_CHECK"
                with m.If(cnp):
                    m.d.sync += state.cnp_in_period.eq(1)
                    with m.If(~state.limited):
                        m.d.sync += [
                            state.limited.eq(1),
                            state.alpha.eq(config.initial_alpha_value << _ALPHA_EXTRA),
                            state.alpha_time.eq(now),
                            state.rate.eq(max_rate),
                            state.target.eq(max_rate),
                            state.cut_time.eq(now),
                            state.timer_time.eq(now),
                            state.time_stage.eq(0),
                            state.byte_stage.eq(0),
                            changed.eq(1),
                        ]
                        set_bit("bytes_clear")
                        clear_bit("byte_event")
                        with m.If(config.rate_to_set_on_first_cnp != 0):
                            m.d.sync += [state.rate.eq(first_rate),
                                         state.target.eq(first_rate)]
                            m.next = "DIVIDE_START"
                        with m.Else():
                            m.next = "CUT_PRODUCT"
                    with m.Else():
                        m.d.sync += state.cut_waiting.eq(1)
                        with m.If(cut_ended):
                            m.next = "CUT_PRODUCT"
                with m.Elif(state.cut_waiting & cut_ended):
                    m.next = "CUT_PRODUCT"
            with m.State("CUT_PRODUCT"):
                m.d.sync += product.eq(state.rate * state.alpha)
                m.next = "CUT_SHIFT"
            with m.State("CUT_SHIFT"):
                m.d.sync += product.eq(product >> (config.rpg_gd + _ALPHA_EXTRA))
                m.next = "CUT"
            with m.State("CUT"):
                # (the rate lowered, then floored at ``rpg_min_rate`` as the divider starts)
                cut = product
                lowered = Signal(_RATE)
                m.d.comb += lowered.eq(Mux(cut < state.rate, state.rate - cut, 0))
                with m.If(config.clamp_tgt_rate
                          | (config.clamp_tgt_rate_after_time_inc & (state.time_stage != 0))):
                    m.d.sync += state.target.eq(state.rate)
                m.d.sync += [
                    product.eq(lowered),
                    state.cut_waiting.eq(0),
                    state.time_stage.eq(0),
                    state.byte_stage.eq(0),
                    state.cut_time.eq(now),
                    state.timer_time.eq(now),
                    byte.eq(0),
                    changed.eq(1),
                ]
                set_bit("bytes_clear")
                clear_bit("byte_event")
                m.next = "CUT_FLOOR"
            with m.State("CUT_FLOOR"):
                m.d.sync += state.rate.eq(Mux(product > min_rate, product, min_rate))
                start_division()

            # One increase event: the timer's, else the byte counter's.
            with m.State("INCREASE_CHECK"):
                saturated = (1 << _STAGE_BITS) - 1
                with m.If(timer_ended):
                    m.d.sync += [
                        state.timer_time.eq(state.timer_time + config.rpg_time_reset),
                        state.time_stage.eq(state.time_stage
                                            + (state.time_stage != saturated)),
                    ]
                    with m.If(byte):
                        set_bit("byte_event")
                        m.d.sync += again.eq(1)
                    m.next = "INCREASE"
                with m.Elif(byte):
                    m.d.sync += state.byte_stage.eq(state.byte_stage
                                                    + (state.byte_stage != saturated))
                    m.next = "INCREASE"
                with m.Else():
                    m.next = "WRITE"
            with m.State("INCREASE"):
                # (the greater stage below the threshold: both are; the lesser above it:
                # both are; compared side by side, not one after the other)
                threshold = config.rpg_threshold
                stages = (state.time_stage, state.byte_stage)
                with m.If(Cat(stage < threshold for stage in stages).all()):
                    m.d.sync += step_rate.eq(0)                     # fast recovery
                with m.Elif(Cat(stage > threshold for stage in stages).all()):
                    m.d.sync += step_rate.eq(config.rpg_hai_rate)   # hyper increase
                with m.Else():
                    m.d.sync += step_rate.eq(config.rpg_ai_rate)    # additive increase
                # The room Rt has under the maximum, for the raise to compare the step with.
                m.d.sync += product.eq(Mux(state.target < max_rate, max_rate - state.target, 0))
                m.next = "RAISE"
            with m.State("RAISE"):
                increase = step_rate << RATE_FRACTION_BITS
                m.d.sync += [
                    state.target.eq(Mux(increase < product, state.target + increase, max_rate)),
                    changed.eq(1),
                ]
                m.next = "AVERAGE"
            with m.State("AVERAGE"):
                average = (state.rate + state.target) >> 1
                m.d.sync += state.rate.eq(average)
                # Back at the line rate (to the last fraction bit): no longer limited.
                with m.If(max_below_two | sum_above(state.rate, state.target, max_twice_less)):
                    m.d.sync += [state.limited.eq(0), state.rate.eq(max_rate),
                                 state.target.eq(max_rate), quotient.eq(0)]
                    m.next = "WRITE"
                with m.Else():
                    m.next = "DIVIDE_START"

            # The pacing interval: cycles per byte = 8·cycles_per_us / rate, long division.
            with m.State("DIVIDE_START"):
                start_division()
            with m.State("DIVIDE"):
                # (the dividend's bits from its top one on, shifted out of a register, not
                # picked by ``step``)
                shifted = Cat(dividend[-1], remainder)
                fits = shifted >= state.rate
                m.d.sync += [
                    remainder.eq(Mux(fits, shifted - state.rate, shifted)),
                    quotient.eq(Cat(fits, quotient)),
                    dividend.eq(dividend << 1),
                    step.eq(step - 1),
                ]
                with m.If(step == 0):
                    m.next = "WRITE"

            with m.State("WRITE"):
                m.d.comb += [
                    state_write.en.eq(1),
                    self.o_rate.valid.eq(changed),
                    ending.eq(1),
                    ending_armed.eq(state.limited),
                    ending_stale.eq(remarked | marked(index)),
                ]
                set_bit("limited", state.limited)
                m.next = "NEXT"

        # The hint, over the three cycles after the visit: the µs left to each deadline (0
        # once it has come, as the visit judges it; all ones for a monitor period with
        # no cut waiting; 0 for all when the visit put an event off), registered; the
        # least, registered; its time (the earliest deadline, or now), written. A QP
        # marked since the visit's read keeps its mark: the hint is not written (a mark in
        # the cycle of the write wins in the scan).
        hinting = data.StructLayout({"valid": 1, "qp": len(index), "armed": 1, "stale": 1,
                                     "now": _TIME_BITS})
        times = Signal(data.StructLayout({
            "visit": hinting, "cut": 1, "again": 1,
            "elapsed": data.ArrayLayout(_TIME_BITS, 3)}))
        left = Signal(data.StructLayout({"visit": hinting,
                                         "left": data.ArrayLayout(_MICROSECONDS, 3)}))
        soonest = Signal(data.StructLayout({"visit": hinting, "left": _MICROSECONDS}))
        m.d.sync += [
            times.visit.valid.eq(ending),
            times.visit.qp.eq(index),
            times.visit.armed.eq(ending_armed),
            times.visit.stale.eq(ending_stale),
            times.visit.now.eq(now),
            times.cut.eq(state.cut_waiting),
            times.again.eq(again),
        ]
        for n, since in enumerate((state.alpha_time, state.timer_time, state.cut_time)):
            m.d.sync += times.elapsed[n].eq(now - since)
        periods = (config.dce_tcp_rtt, config.rpg_time_reset,
                   config.rate_reduce_monitor_period)
        m.d.sync += [left.visit.eq(times.visit),
                     left.visit.stale.eq(times.visit.stale | marked(times.visit.qp))]
        for n, period in enumerate(periods):
            due = times.again | (times.elapsed[n] >= period)
            time_left = Mux(due, 0, period - times.elapsed[n])
            if n == 2:
                time_left = Mux(times.cut, time_left, (1 << _MICROSECONDS) - 1)
            m.d.sync += left.left[n].eq(time_left)
        alpha_left, timer_left, cut_left = left.left
        m.d.sync += [
            soonest.visit.eq(left.visit),
            soonest.visit.stale.eq(left.visit.stale | marked(left.visit.qp)),
            soonest.left.eq(Mux((alpha_left <= timer_left) & (alpha_left <= cut_left),
                                alpha_left,
                                Mux(timer_left <= cut_left, timer_left, cut_left))),
            scan.i_hint.valid.eq(soonest.visit.valid & ~soonest.visit.stale
                                 & ~marked(soonest.visit.qp)),
            scan.i_hint.p.qp.eq(soonest.visit.qp),
            scan.i_hint.p.hint.armed.eq(soonest.visit.armed),
            scan.i_hint.p.hint.at.eq(soonest.visit.now + soonest.left),
        ]

        # Events (later writers than the visit: a new event for the QP it visits wins). A
        # byte event a cycle after the count that makes it, as the scan's mark has it, so
        # that the count's add does not chain with the flags.
        for writer, qp, valid in (
                (flags.w_cnp, self.i_cnp.p, self.i_cnp.valid & config.enable),
                (flags.w_reset, self.i_reset.p, self.i_reset.valid),
                (flags.w_bytes, byte_mark.p, byte_mark.valid)):
            m.d.comb += write_flags(writer, qp, valid, 1)
        return m
