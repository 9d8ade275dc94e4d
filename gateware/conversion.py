"""Converting the design without the zero contents of its large memories.

Amaranth gives every memory initial contents, zeros when it has none, and writes them
into the RTLIL bit by bit: the 16-QP core's retransmit pool is 32,768 words of 512 bits,
16 Mbit that Python builds one object a bit and Yosys then reads and writes back out as
32,768 lines of ``initial`` (converting the default board top took 192 s, 43 s without
them). Amaranth has no memory without initial contents (amaranth-lang/amaranth#270).

:func:`large_memories_without_zero_init` leaves out the contents of memories of more
than :data:`LARGE_MEMORY_WORDS` words that are all zero, for whoever starts them at zero
anyway: the FPGA (block RAM and UltraRAM are zero at configuration, and UltraRAM takes
no initial contents), and the simulators once :func:`zero_uninitialized_memories` has
given the Verilog a loop that clears them. Small memories keep theirs: Yosys maps some
of them (and the logic around them) differently without.
"""

import contextlib
import re

from amaranth.back import rtlil

__all__ = ["LARGE_MEMORY_WORDS", "large_memories_without_zero_init",
           "zero_uninitialized_memories"]

#: Memories of more words than this, all zero, are converted without initial contents.
LARGE_MEMORY_WORDS = 1024


@contextlib.contextmanager
def large_memories_without_zero_init(words: int | None = None):
    """While it is entered, Amaranth's RTLIL back end (which its Verilog back end and
    its platforms' builds use) writes no initial contents for memories of more than
    ``words`` words (default :data:`LARGE_MEMORY_WORDS`) whose contents are all zero."""
    words = LARGE_MEMORY_WORDS if words is None else words
    emit_memory = rtlil.ModuleEmitter.emit_memory

    def emit_nonzero_memory(emitter, cell_idx, cell):
        if cell.depth > words and not any(cell.init):
            return
        emit_memory(emitter, cell_idx, cell)

    rtlil.ModuleEmitter.emit_memory = emit_nonzero_memory
    try:
        yield
    finally:
        rtlil.ModuleEmitter.emit_memory = emit_memory


#: A memory as Yosys writes it, and the ``initial`` block that follows when it has
#: contents. Its name is a plain identifier (``storage``) or an escaped one, which a
#: space ends (``\table `` for a keyword, ``\state$93 `` for a name with a ``$``).
_MEMORY = re.compile(r"^(  reg \[\d+:0\] (\\\S+ |[^\s\\]\S*) ?\[(\d+):0\];\n)"
                     r"(?!  initial begin\n)", re.MULTILINE)


def zero_uninitialized_memories(verilog: str) -> str:
    """The Verilog with a loop that clears each memory written without initial contents
    (Verilog-2001, for Icarus as for Verilator: a named block's own counter)."""
    count = 0

    def clear(match: re.Match) -> str:
        nonlocal count
        count += 1
        name, last = match[2], int(match[3])       # an escaped name keeps its space
        return (f"{match[1]}  initial begin : zero_memory_{count}\n"
                f"    integer i;\n"
                f"    for (i = 0; i <= {last}; i = i + 1) {name}[i] = 0;\n"
                f"  end\n")
    return _MEMORY.sub(clear, verilog)
