"""Packet streams: the beat layout every block of the endpoint exchanges.

A packet is a sequence of beats. Each beat carries ``width`` byte lanes
(64 on the 512-bit CMAC bus); byte lane 0 (``data[0:8]``) is the first byte
on the wire. ``keep`` marks the valid lanes and is contiguous from lane 0:
all ones on every beat but the last. A packet of zero bytes is one beat with
``keep`` all zero and ``last`` set.

``meta`` is a per-packet side band (a :class:`~amaranth.lib.data.StructLayout`,
possibly empty): the headers that extractors took off on receive, or the
fields that inserters turn into headers on transmit. It is valid with the
first beat of a packet; blocks sample it there and keep it stable for the
beats they emit.
"""

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = [
    "BEAT_BYTES", "NO_META", "beat_layout", "packet_signature", "meta_with", "meta_without",
    "meta_project", "forward", "registered",
    "keep_mask", "keep_count", "beats_for", "axi_stream_signature",
]

#: Byte lanes of the CMAC's 512-bit AXI-Stream.
BEAT_BYTES = 64

#: The side band of a stream that carries none.
NO_META = data.StructLayout({})


def beat_layout(meta=NO_META, *, width=BEAT_BYTES):
    """The layout of one beat: ``data`` (8 × ``width`` bits), ``keep``, ``last``, ``meta``."""
    if not isinstance(width, int) or width < 1:
        raise ValueError(f"Beat width must be a positive number of bytes, not {width!r}")
    if not isinstance(meta, data.StructLayout):
        raise TypeError(f"Beat meta must be a data.StructLayout, not {meta!r}")
    return data.StructLayout({
        "data": unsigned(8 * width),
        "keep": unsigned(width),
        "last": unsigned(1),
        "meta": meta,
    })


def packet_signature(meta=NO_META, *, width=BEAT_BYTES, always_ready=False):
    """A :class:`~amaranth.lib.stream.Signature` of packet beats."""
    return stream.Signature(beat_layout(meta, width=width), always_ready=always_ready)


def meta_with(meta, **fields):
    """``meta`` with more fields appended (a new layout; ``meta`` is unchanged)."""
    members = dict(meta.members)
    for name in fields:
        if name in members:
            raise ValueError(f"Meta already has a field {name!r}")
    return data.StructLayout({**members, **fields})


def meta_without(meta, *names):
    """``meta`` with the named fields removed."""
    members = dict(meta.members)
    for name in names:
        if name not in members:
            raise ValueError(f"Meta has no field {name!r}")
        del members[name]
    return data.StructLayout(members)


def meta_project(meta, layout):
    """The bits of ``layout`` taken field by field from the meta view ``meta``."""
    return Cat(Value.cast(meta[name]) for name in layout.members)


def forward(source, sink):
    """Statements that pass beats from ``source`` to ``sink`` (handshake, data, keep,
    last) and leave ``sink``'s meta to the caller: for a layer that rewrites meta."""
    return [
        sink.valid.eq(source.valid),
        source.ready.eq(sink.ready),
        sink.p.data.eq(source.p.data),
        sink.p.keep.eq(source.p.keep),
        sink.p.last.eq(source.p.last),
    ]


def registered(m, source, name):
    """An always-ready stream of ``source``'s ``valid`` and payload a cycle later, in
    registers of ``m``'s ``sync`` domain (named ``name``): an event registered before
    the logic it drives."""
    payload = source.signature.members["payload"].shape
    copy = stream.Signature(payload, always_ready=True).create(path=(name,))
    m.d.sync += [copy.valid.eq(source.valid), copy.p.eq(source.p)]
    return copy


def keep_mask(count, width):
    """``keep`` for a beat holding ``min(count, width)`` bytes (``count`` is a Value)."""
    return Cat(count > lane for lane in range(width))


def keep_count(keep):
    """Number of bytes a contiguous ``keep`` marks valid (a thermometer code).

    Bit ``b`` of the count is the parity of the lanes ``m·2^b − 1`` (``m ≥ 1``)
    that are set, so each bit is one flat XOR instead of an adder chain.
    """
    width = len(keep)
    bits = []
    for b in range(width.bit_length()):
        step = 1 << b
        bits.append(Cat(keep[k - 1] for k in range(step, width + 1, step)).xor())
    return Cat(*bits)


def beats_for(length, width=BEAT_BYTES):
    """Beats on the bus for a packet of ``length`` bytes (Python integers)."""
    return max(1, -(-length // width))


def axi_stream_signature(*, width=BEAT_BYTES, ready=True):
    """An AXI-Stream port as the CMAC names it (``tdata``, ``tkeep``, ``tlast``,
    ``tuser`` as the error flag, ``tvalid``, and ``tready`` unless ``ready`` is
    false, as on the CMAC's receive side). Used only at the core's boundary."""
    members = {
        "tdata": Out(8 * width),
        "tkeep": Out(width),
        "tlast": Out(1),
        "tuser": Out(1),
        "tvalid": Out(1),
    }
    if ready:
        members["tready"] = In(1)
    return wiring.Signature(members)
