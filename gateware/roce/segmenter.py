from amaranth import *
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ..stream import BEAT_BYTES, NO_META, keep_count, keep_mask, packet_signature
from .descriptor import MAX_PACKET_PAYLOAD, PACKET_DESCRIPTOR, ROCE_TX_META
from .icrc import ICRC_BYTES
from .requests import COMPLETION, CompletionStatus

__all__ = ["PayloadSegmenter"]


class PayloadSegmenter(wiring.Component):
    """Cuts each message's payload into the packets the planner describes.

    A packet of ``payload_length`` bytes comes out as that much payload, zero
    pad bytes up to a multiple of 4, and 4 zero bytes where the ICRC goes
    (the IP-level ICRC inserter fills them), with the descriptor's meta.
    Path MTUs are multiples of the beat, so a packet boundary inside a
    message falls on a beat boundary of the payload stream and the payload
    passes without shifting.

    The payload stream must hold exactly the message's length. When it ends
    early, the rest of the message goes out as zeros (PAYLOAD_SHORT); bytes
    beyond the length are dropped up to its ``last`` (PAYLOAD_LONG); either
    way the next message starts clean. A ``drop`` descriptor sends nothing
    and drains its payload. Each message's completion is pushed with its last
    beat (after the drain, if any). Latency 0; one beat per cycle, no idle
    cycle between packets.
    """

    def __init__(self, *, width=BEAT_BYTES):
        if MAX_PACKET_PAYLOAD % width:
            raise ValueError(f"Beat width {width} must divide the path MTUs")
        self._width = width
        super().__init__({
            "i_packet": In(stream.Signature(PACKET_DESCRIPTOR)),
            "i_payload": In(packet_signature(NO_META, width=width)),
            "o": Out(packet_signature(ROCE_TX_META, width=width)),
            "o_completion": Out(stream.Signature(COMPLETION)),
        })

    def elaborate(self, platform):
        m = Module()
        width = self._width
        descriptor = self.i_packet.p
        payload = self.i_payload

        start = Signal(init=1)                  # the next beat is a packet's first
        payload_left = Signal(range(MAX_PACKET_PAYLOAD + 1))
        frame_left = Signal(range(MAX_PACKET_PAYLOAD + 8))
        ended = Signal()                        # the message's payload has had its last
        short = Signal()
        long = Signal()
        draining = Signal()

        padded = descriptor.payload_length + (-descriptor.payload_length)[:2] + ICRC_BYTES
        beat_payload = Signal.like(payload_left)    # payload bytes left, this beat included
        beat_frame = Signal.like(frame_left)        # bytes left, this beat included
        m.d.comb += [
            beat_payload.eq(Mux(start, descriptor.payload_length, payload_left)),
            beat_frame.eq(Mux(start, padded, frame_left)),
        ]

        take = Signal()                             # this beat carries payload from the input
        lanes = Signal(width)                       # its lanes that hold payload
        m.d.comb += [
            take.eq((beat_payload != 0) & ~ended),
            lanes.eq(keep_mask(beat_payload, width) & payload.p.keep & Mux(take, -1, 0)),
        ]
        last_beat = beat_frame <= width

        got = keep_count(payload.p.keep)
        ends_short = (beat_payload > got) | ~descriptor.message_end
        ends_long = descriptor.message_end & (got > beat_payload)

        status = Signal(CompletionStatus)
        m.d.comb += [
            self.o_completion.p.eq(descriptor.completion),
            self.o_completion.p.status.eq(status),
        ]

        with m.If(~draining & ~descriptor.drop):
            sending = self.o.valid & self.o.ready
            closing = last_beat & descriptor.message_end
            consumed_last = take & payload.p.last
            completes = closing & (ended | consumed_last)
            m.d.comb += [
                self.o.valid.eq(self.i_packet.valid & (payload.valid | ~take)
                                & (self.o_completion.ready | ~completes)),
                self.o.p.data.eq(payload.p.data & Cat(lane.replicate(8) for lane in lanes)),
                self.o.p.keep.eq(keep_mask(beat_frame, width)),
                self.o.p.last.eq(last_beat),
                self.o.p.meta.eq(descriptor.meta),
                payload.ready.eq(take & self.o.ready & self.o.valid),
                status.eq(Mux(short | (consumed_last & ends_short), CompletionStatus.PAYLOAD_SHORT,
                              Mux(long | (consumed_last & ends_long),
                                  CompletionStatus.PAYLOAD_LONG, CompletionStatus.SUCCESS))),
            ]
            with m.If(sending):
                m.d.sync += [
                    start.eq(last_beat),
                    payload_left.eq(Mux(take & (beat_payload > width), beat_payload - width, 0)),
                    frame_left.eq(beat_frame - width),
                ]
                with m.If(consumed_last):
                    m.d.sync += [
                        ended.eq(1),
                        short.eq(short | ends_short),
                        long.eq(long | ends_long),
                    ]
                with m.If(last_beat & ~descriptor.message_end):
                    m.d.comb += self.i_packet.ready.eq(1)
                with m.If(completes):
                    m.d.comb += [
                        self.i_packet.ready.eq(1),
                        self.o_completion.valid.eq(1),
                    ]
                    m.d.sync += [ended.eq(0), short.eq(0), long.eq(0)]
                with m.Elif(closing):
                    m.d.sync += draining.eq(1)

        with m.Else():
            # Drain the rest of the message's payload, then complete it.
            m.d.comb += [
                payload.ready.eq(self.i_packet.valid & self.o_completion.ready),
                status.eq(Mux(descriptor.drop, CompletionStatus.BAD_REQUEST,
                              Mux(short, CompletionStatus.PAYLOAD_SHORT,
                                  Mux(long | payload.p.keep.any(), CompletionStatus.PAYLOAD_LONG,
                                      CompletionStatus.SUCCESS)))),
            ]
            with m.If(payload.valid & payload.ready):
                with m.If(payload.p.keep.any()):
                    m.d.sync += long.eq(1)
                with m.If(payload.p.last):
                    m.d.comb += [
                        self.i_packet.ready.eq(1),
                        self.o_completion.valid.eq(1),
                    ]
                    m.d.sync += [draining.eq(0), ended.eq(0), short.eq(0), long.eq(0)]

        return m
