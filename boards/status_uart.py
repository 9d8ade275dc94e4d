"""The board's status as a line of text on its USB-UART, for bring-up without a debugger."""

from amaranth import *
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["StatusUart", "PortStatusUart", "status_line"]

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
    values; ``o_sampled`` is high in the cycle it is (a parent that shows several
    records in turn moves to the next there). Read it with any terminal at the
    matching baud rate (115,200 on the board: ``picocom -b 115200
    /dev/ttyUSB1``, the VCU118's CP2105 enhanced port).

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
        # Per character: 10 bits, and a cycle to load the next.
        wire_cycles = len(self._characters) * (10 * divisor + 1)
        if interval < wire_cycles:
            raise ValueError(f"interval {interval} is shorter than a line on the wire "
                             f"({wire_cycles} cycles)")
        self._interval = interval
        super().__init__({
            "i": In(layout),
            "o_tx": Out(1, init=1),
            "o_sampled": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        # `line_due` is a register, high in the cycle `until_line` is 0.
        until_line = Signal(range(self._interval), init=self._interval - 1)
        line_due = Signal()
        m.d.sync += line_due.eq(until_line == 1)
        with m.If(line_due):
            m.d.sync += until_line.eq(self._interval - 1)
        with m.Else():
            m.d.sync += until_line.eq(until_line - 1)

        # The whole line, sampled at its start as characters in the order they are sent:
        # constants, and each digit's 4 bits as their hex character (one LUT a bit), 7 bits
        # a character (ASCII). It rotates by a character as each goes out, so a character
        # is always the low bits of a register and no path here is more than a few LUT
        # levels deep at the CMAC clock, whatever the mapper does (a multiplexer of every
        # digit by position takes 12 LUT levels; a table of the constants by position, 7).
        # Rotated, not shifted: zeros shifted in would make Yosys prove the constant
        # characters' flip-flops constant one at a time, each by a run over the design.
        fields = self.i.as_value()
        line = []
        for kind, value in self._characters:
            if kind == "text":
                line.append(C(value, 7))
            else:
                start, stop = value
                character = Signal(7, name=f"digit_{start}")
                m.d.comb += character.eq(Array(HEX_DIGITS)[fields[start:stop]])
                line.append(character)
        line = Cat(line)
        queue = Signal(len(line))
        characters_left = Signal(range(len(self._characters) + 1))

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

        with m.If(line_due & (characters_left == 0)):
            m.d.comb += self.o_sampled.eq(1)
            m.d.sync += [queue.eq(line), characters_left.eq(len(self._characters))]
        with m.Elif((bits_left == 0) & (characters_left != 0)):
            m.d.sync += [shift.eq(Cat(0, queue[:7], 0, 1)), bits_left.eq(10),
                         queue.eq(queue.rotate_right(7)),
                         characters_left.eq(characters_left - 1)]
        return m


class PortStatusUart(wiring.Component):
    """Sends the status of several ports in turn, a line each (:func:`status_line` of
    ``port`` then the fields of ``layout``; ports are numbered from 1), on a UART at
    ``o_tx``: each port's line every ``interval`` cycles, the ports' lines spread evenly
    over it.

    ``i`` holds one record per port; a port's record is sampled at the start of its
    line, as :class:`StatusUart` samples its input.

    Parameters
    ----------
    layout : data.StructLayout
        A port's fields, each at most 32 bits wide.
    ports : int
        The number of ports (at most 15).
    divisor : int
        Clock cycles per bit.
    interval : int
        Cycles between two lines of one port.
    """

    def __init__(self, layout, *, ports, divisor, interval):
        if not 1 <= ports <= 15:
            raise ValueError(f"ports must be from 1 to 15, not {ports!r}")
        self._ports = ports
        self._line = data.StructLayout({"port": 4, **{name: field.shape
                                                      for name, field in layout}})
        self._uart = StatusUart(self._line, divisor=divisor, interval=interval // ports)
        super().__init__({
            "i": In(data.ArrayLayout(layout, ports)),
            "o_tx": Out(1, init=1),
        })

    @property
    def line_layout(self):
        """The layout of each line: ``port``, then the port's fields."""
        return self._line

    def elaborate(self, platform):
        m = Module()
        m.submodules.uart = uart = self._uart
        shown = Signal(range(self._ports))
        with m.If(uart.o_sampled):
            m.d.sync += shown.eq(Mux(shown == self._ports - 1, 0, shown + 1))
        record = self.i[shown]
        m.d.comb += [
            uart.i.port.eq(shown + 1),
            *[uart.i[name].eq(record[name]) for name, _ in self.i.shape().elem_shape],
            self.o_tx.eq(uart.o_tx),
        ]
        return m
