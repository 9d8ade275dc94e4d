"""The board's status as a line of text on its USB-UART, for bring-up without a debugger."""

from amaranth import *
from amaranth.lib import data, memory, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["StatusUart", "status_line"]

HEX_DIGITS = b"0123456789abcdef"


def _digits(width):
    return (width + 3) // 4


def status_line(layout, value):
    """The line :class:`StatusUart` sends for ``value`` (a dict by field name): each field
    of ``layout`` in order as ``name=`` and its value in hex, zero-padded to the field's
    width, separated by spaces; CR LF at the end."""
    return " ".join(f"{name}={value[name]:0{_digits(field.width)}x}"
                    for name, field in layout) + "\r\n"


class StatusUart(wiring.Component):
    """Sends ``i`` as a line of text (:func:`status_line`) every ``interval`` cycles, on a
    UART (8 data bits, no parity, 1 stop bit, ``divisor`` cycles a bit) at ``o_tx``.

    ``i`` is sampled once at the start of each line, so a line is one moment's
    values. Read it with any terminal at the matching baud rate (115,200 on
    the board: ``picocom -b 115200 /dev/ttyUSB1``, the VCU118's CP2105
    enhanced port).

    Parameters
    ----------
    layout : data.StructLayout
        The fields, each at most 32 bits wide.
    divisor : int
        Clock cycles per bit (the clock's frequency over the baud rate).
    interval : int
        Cycles from the start of one line to the start of the next; at least
        the line's length on the wire.
    """

    def __init__(self, layout, *, divisor, interval):
        if not isinstance(layout, data.StructLayout):
            raise TypeError(f"layout must be a StructLayout, not {layout!r}")
        if divisor < 2:
            raise ValueError(f"divisor must be at least 2, not {divisor!r}")
        self._layout = layout
        self._divisor = divisor
        # What each character of the line is: a constant, or the hex digit of the bits
        # from an offset up to 4 bits but not past the field's end.
        self._characters = []
        for index, (name, field) in enumerate(layout):
            self._characters += [("text", ord(c)) for c in (" " if index else "") + name + "="]
            end = field.offset + field.width
            self._characters += [("digit", (field.offset + 4 * digit,
                                            min(field.offset + 4 * digit + 4, end)))
                                 for digit in reversed(range(_digits(field.width)))]
        self._characters += [("text", ord("\r")), ("text", ord("\n"))]
        # Per character: 10 bits, and a cycle each to fetch and load it.
        wire_cycles = len(self._characters) * (10 * divisor + 2)
        if interval < wire_cycles:
            raise ValueError(f"interval {interval} is shorter than a line on the wire "
                             f"({wire_cycles} cycles)")
        self._interval = interval
        super().__init__({
            "i": In(layout),
            "o_tx": Out(1, init=1),
        })

    def elaborate(self, platform):
        m = Module()
        until_line = Signal(range(self._interval), init=self._interval - 1)
        with m.If(until_line == 0):
            m.d.sync += until_line.eq(self._interval - 1)
        with m.Else():
            m.d.sync += until_line.eq(until_line - 1)

        # The line's characters in order: a constant, or the next hex digit. The digits,
        # sampled at the start of a line, are kept in the order they are sent (wiring
        # only), 4 bits each, and shifted out as they go; the constants and which
        # characters are digits come from a table (a ROM) by `position`, read a cycle
        # later. (A multiplexer of every digit by `position` was 12 LUT levels deep at
        # the CMAC clock.)
        position = Signal(range(len(self._characters)))
        fields = self.i.as_value()
        digits = [value for kind, value in self._characters if kind == "digit"]
        queue = Signal(4 * len(digits))
        in_order = Cat(Cat(fields[start:stop], C(0, 4 - (stop - start)))
                       for start, stop in digits)
        entry = data.StructLayout({"text": 8, "is_digit": 1})
        m.submodules.table = table = memory.Memory(
            shape=entry, depth=len(self._characters),
            init=[{"text": value if kind == "text" else 0, "is_digit": kind == "digit"}
                  for kind, value in self._characters])
        read = table.read_port()
        m.d.comb += read.addr.eq(position)
        is_digit = read.data.is_digit
        character = Mux(is_digit, Array(HEX_DIGITS)[queue[:4]], read.data.text)

        # The UART: start bit, 8 data bits LSB first, stop bit.
        shift = Signal(10)
        bits_left = Signal(range(11))
        bit_timer = Signal(range(self._divisor))
        m.d.sync += self.o_tx.eq(Mux(bits_left != 0, shift[0], 1))
        with m.If(bits_left != 0):
            with m.If(bit_timer == self._divisor - 1):
                m.d.sync += [bit_timer.eq(0), shift.eq(shift >> 1), bits_left.eq(bits_left - 1)]
            with m.Else():
                m.d.sync += bit_timer.eq(bit_timer + 1)

        with m.FSM(name="line"):
            with m.State("IDLE"):
                with m.If(until_line == 0):
                    m.d.sync += [queue.eq(in_order), position.eq(0)]
                    m.next = "FETCH"
            with m.State("FETCH"):
                m.next = "LOAD"
            with m.State("LOAD"):
                m.d.sync += [shift.eq(Cat(0, character, 1)), bits_left.eq(10)]
                with m.If(is_digit):
                    m.d.sync += queue.eq(queue >> 4)
                m.next = "SEND"
            with m.State("SEND"):
                with m.If(bits_left == 0):
                    with m.If(position == len(self._characters) - 1):
                        m.next = "IDLE"
                    with m.Else():
                        m.d.sync += position.eq(position + 1)
                        m.next = "FETCH"
        return m
