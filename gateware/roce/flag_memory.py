"""1-bit flags of every QP that several parts write, kept in memories of one write port
each: a flag's value is the XOR of its writers' bits."""

from amaranth import *
from amaranth.lib import data, memory, wiring
from amaranth.lib.wiring import In, Out

from .qp_context import lookup

__all__ = ["FlagMemory", "flag_writes", "write_flags", "BLOCK_DEPTH", "block_ram_attrs"]

#: Entries from which a memory read only through registered ports is kept in block RAM
#: (a flag memory, as Yosys keeps it at 4,096 QPs by itself where at 1,024 it chose
#: distributed RAM; the connection managers' tables).
BLOCK_DEPTH = 512


def block_ram_attrs(depth):
    """The ``attrs`` of a memory of ``depth`` entries read only through registered
    ports: block RAM from :data:`BLOCK_DEPTH` entries on, else Yosys's own choice."""
    return {"ram_style": "block"} if depth >= BLOCK_DEPTH else {}


def flag_writes(names, addr_bits):
    """A writer's port: its QP (``addr``), and for each flag it writes whether it does
    (``en``) and the value."""
    return wiring.Signature({
        "addr": Out(addr_bits),
        **{name: Out(data.StructLayout({"en": 1, "value": 1})) for name in names},
    })


def write_flags(writer, addr, enable, value, names=None):
    """The statements that drive a writer's port (:func:`flag_writes`): in a cycle with
    ``enable`` the flags ``names`` (by default every flag it writes) of entry ``addr``
    take ``value``."""
    if names is None:
        names = [name for name in writer.signature.members if name != "addr"]
    statements = [writer.addr.eq(addr)]
    for name in names:
        statements += [getattr(writer, name).en.eq(enable), getattr(writer, name).value.eq(value)]
    return statements


class FlagMemory(wiring.Component):
    """Flags (``flags``, 1 bit each) of ``depth`` entries, written by several writers a
    cycle and read by several readers, in memories with one write port each (block or
    distributed RAM), not in registers: no multiplexer over all entries.

    ``writers`` gives each writer's name and the flags it writes (its port ``w_<name>``:
    :func:`flag_writes`); of two writes of one flag of one entry in a cycle, the later
    writer in the list wins.
    A write takes effect at the end of its cycle. ``reads`` names each reader's kind
    (``r[n]``): ``"comb"``, ``"transparent"`` and ``"sync"`` as
    :class:`~gateware.roce.qp_context.ContextMemory`'s, and ``"written"``: the entry at
    ``addr`` combinationally, as this cycle's writes leave them.

    A flag memory of :data:`BLOCK_DEPTH` entries or more whose reads are all registered
    is kept in block RAM (``ram_style``).

    Each writer has a memory of its flags, and a flag's value is the XOR of its
    writers' bits (a live-value table by XOR: LaForest and Steffan, FPGA 2012). A writer
    sets a flag by writing its own bit so that the XOR comes out as the value: the
    value XOR the other writers' bits; a writer that loses a flag to a later one keeps
    its own bit. All flags start at 0.

    The memories are written a cycle after the write, from registers: each writer's
    write is registered, the bits it needs are read through registered ports addressed
    by the write (showing the writes of that cycle), and its memory is written in the
    next cycle with the XOR of the two. So no path goes from a writer's logic through
    a read into a memory's write. Until its memory has it, a write registered is passed
    on to the reads of its entry, so every read kind gives what it would if the write
    had gone in at once.
    """

    _READS = ("comb", "transparent", "sync", "written")

    def __init__(self, *, flags, depth, writers, reads, addr_bits):
        self._flags = tuple(flags)
        writers = dict(writers)
        for names in writers.values():
            for name in names:
                if name not in self._flags:
                    raise ValueError(f"A writer writes {name!r}, which is not a flag")
        for name in self._flags:
            if not any(name in names for names in writers.values()):
                raise ValueError(f"Flag {name!r} has no writer")
        for kind in reads:
            if kind not in self._READS:
                raise ValueError(f"Read kind must be one of {self._READS}, not {kind!r}")
        self._names = tuple(writers)
        self._writers = [tuple(names) for names in writers.values()]
        self._reads = tuple(reads)
        self._depth = depth
        super().__init__({
            **{f"w_{writer}": In(flag_writes(names, addr_bits))
               for writer, names in writers.items()},
            "r": In(lookup(data.StructLayout({name: 1 for name in self._flags}),
                           addr_bits)).array(len(self._reads)),
        })

    def elaborate(self, platform):
        m = Module()
        writers = [getattr(self, f"w_{name}") for name in self._names]
        used = max((self._depth - 1).bit_length(), 1)      # address bits the memories use
        # Memories of many entries read only through registered ports go to block RAM: a
        # read starts at its output register, not at a tree of distributed RAMs and
        # multiplexers in front of the logic that decides on the flags.
        all_registered = not {"comb", "written"} & set(self._reads)
        attrs = block_ram_attrs(self._depth) if all_registered else {}
        stores = []
        for index, names in enumerate(self._writers):
            m.submodules[f"writer{index}"] = store = memory.Memory(
                shape=data.StructLayout({name: 1 for name in names}), depth=self._depth,
                init=[], attrs=attrs)
            stores.append(store)
        write_ports = [store.write_port() for store in stores]

        def reads_at(kind, addr, names):
            """Each store holding one of ``names``, read at ``addr``: its bits (a
            registered read shows the write its memory takes in the cycle of ``addr``)."""
            bits = {}
            for index, (store, written) in enumerate(zip(stores, self._writers, strict=True)):
                if not set(names) & set(written):
                    continue
                if kind == "comb":
                    port = store.read_port(domain="comb")
                else:
                    port = store.read_port(transparent_for=(write_ports[index],))
                m.d.comb += port.addr.eq(addr)
                bits[index] = port.data
            return bits

        def value_of(name, bits):
            """A flag's value: the XOR of its writers' bits."""
            return Cat(bits[index][name] for index, written in enumerate(self._writers)
                       if name in written).xor()

        def wins(index, name):
            """Whether writer ``index`` writes flag ``name`` this cycle: no later writer
            writes it to the same entry."""
            port = writers[index]
            later = [getattr(other, name).en & (other.addr[:used] == port.addr[:used])
                     for other, names in zip(writers[index + 1:], self._writers[index + 1:],
                                             strict=True)
                     if name in names]
            return getattr(port, name).en & ~Cat(later).any()

        # Each writer's write, registered with the flags it wins (``pending``), and the
        # bits its memory's write needs, read at its address as the cycle's writes of the
        # memories leave them; the memory written from the two a cycle later.
        pending = []
        for index, (port, names) in enumerate(zip(writers, self._writers, strict=True)):
            waiting = Signal(data.StructLayout({
                "addr": used,
                **{name: data.StructLayout({"en": 1, "value": 1}) for name in names},
            }), name=f"pending_{self._names[index]}")
            m.d.sync += waiting.addr.eq(port.addr[:used])
            for name in names:
                m.d.sync += [getattr(waiting, name).en.eq(wins(index, name)),
                             getattr(waiting, name).value.eq(getattr(port, name).value)]
            pending.append(waiting)
            bits = reads_at("transparent", port.addr, names)
            own = bits[index]
            write = write_ports[index]
            m.d.comb += [
                write.addr.eq(waiting.addr),
                write.en.eq(Cat(getattr(waiting, name).en for name in names).any()),
            ]
            for name in names:
                others = value_of(name, bits) ^ own[name]
                m.d.comb += write.data[name].eq(
                    Mux(getattr(waiting, name).en, getattr(waiting, name).value ^ others,
                        own[name]))

        def passed_on(name, value, hits, writes):
            """A flag's ``value`` with ``writes`` (ports or registered writes, the later
            winning) passed on where ``hits`` says each is to the entry read."""
            for port, hit, names in zip(writes, hits, self._writers, strict=True):
                if name in names:
                    value = Mux(getattr(port, name).en & hit, getattr(port, name).value, value)
            return value

        def hits(writes, addr):
            """Whether each of ``writes`` is to entry ``addr``."""
            return [port.addr[:used] == addr[:used] for port in writes]

        for number, (kind, reader) in enumerate(zip(self._reads, self.r, strict=True)):
            if kind in ("comb", "written"):
                # The memories as of the cycle's start, the writes registered in the cycle
                # before (and, for a written read, this cycle's) passed on.
                bits = reads_at("comb", reader.addr, self._flags)
                for name in self._flags:
                    value = passed_on(name, value_of(name, bits), hits(pending, reader.addr),
                                      pending)
                    if kind == "written":
                        value = passed_on(name, value, hits(writers, reader.addr), writers)
                    m.d.comb += reader.data[name].eq(value)
            else:
                # Registered: the memories with the writes of the cycle before the address's
                # (the memories take them in the address's cycle); for a transparent read,
                # the writes of the address's cycle passed on a cycle later, the addresses
                # compared in the address's cycle (so the read's data passes no comparison).
                bits = reads_at("transparent", reader.addr, self._flags)
                hit_then = []
                if kind == "transparent":
                    for index, hit in enumerate(hits(writers, reader.addr)):
                        registered = Signal(name=f"read{number}_hit{index}")
                        m.d.sync += registered.eq(hit)
                        hit_then.append(registered)
                for name in self._flags:
                    value = value_of(name, bits)
                    if kind == "transparent":
                        value = passed_on(name, value, hit_then, pending)
                    m.d.comb += reader.data[name].eq(value)
        return m
