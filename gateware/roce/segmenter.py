from amaranth import *
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ..stream import BEAT_BYTES, NO_META, keep_count, keep_mask, packet_signature
from .descriptor import (
    MAX_PACKET_PAYLOAD,
    MESSAGE_END,
    PACKET_DESCRIPTOR,
    ROCE_TX_META,
    buffer_beat,
    buffer_write,
)
from .requests import CompletionStatus

__all__ = ["PayloadSegmenter"]


class PayloadSegmenter(wiring.Component):
    """Cuts each message's payload into the packets the planner describes.

    A packet of ``payload_length`` bytes comes out as that much payload, zero
    pad bytes up to a multiple of 4, and 4 zero bytes where the ICRC goes
    (the IP-level ICRC inserter fills them), with the descriptor's meta. (The
    descriptor also brings that length, ``frame_length``, and whether it fits
    in one beat and has payload at all, worked out by the planner; the
    segmenter's own counts and flags for the next beat are registers too.)
    Path MTUs are multiples of the beat, so a packet boundary inside a
    message falls on a beat boundary of the payload stream and the payload
    passes without shifting.

    The payload stream must hold exactly the message's length. When it ends
    early, the rest of the message goes out as zeros (PAYLOAD_SHORT); bytes
    beyond the length are dropped up to its ``last`` (PAYLOAD_LONG); either
    way the next message starts clean. A ``drop`` descriptor sends nothing
    and drains the rest of its message's payload. Each message's end is
    reported with its status on ``o_message_end`` with its last beat (after
    the drain, if any).

    Every payload beat of a new packet is also written (masked to the
    payload, so pad and ICRC slot stay zero) to the retransmit buffer at the
    descriptor's address on; a ``replay`` descriptor takes its payload from
    the buffer's ``i_replay`` beats instead and leaves the message's payload
    stream alone. Latency 0; one beat per cycle (while ``o_message_end`` is
    ready, also for beats that end no message), no idle cycle between
    packets.
    """

    def __init__(self, *, ring_beats, width=BEAT_BYTES):
        if MAX_PACKET_PAYLOAD % width:
            raise ValueError(f"Beat width {width} must divide the path MTUs")
        self._ring_bits = (ring_beats - 1).bit_length()
        self._width = width
        super().__init__({
            "i_packet": In(stream.Signature(PACKET_DESCRIPTOR)),
            "i_payload": In(packet_signature(NO_META, width=width)),
            "i_replay": In(stream.Signature(buffer_beat(width))),
            "o": Out(packet_signature(ROCE_TX_META, width=width)),
            "o_write": Out(stream.Signature(buffer_write(width), always_ready=True)),
            "o_message_end": Out(stream.Signature(MESSAGE_END)),
        })

    def elaborate(self, platform):
        m = Module()
        width = self._width
        descriptor = self.i_packet.p
        payload = self.i_payload
        replay = descriptor.replay
        resent = self.i_replay

        start = Signal(init=1)                  # the next beat is a packet's first
        payload_left = Signal(range(MAX_PACKET_PAYLOAD + 1))
        frame_left = Signal(range(MAX_PACKET_PAYLOAD + 8))
        # Worked out a beat ahead (and for a packet's first beat, by the planner):
        left_nonzero = Signal()                 # payload_left != 0
        frame_last = Signal()                   # frame_left <= width
        ended = Signal()                        # the message's payload has had its last
        short = Signal()
        long = Signal()
        draining = Signal()
        left_full = Signal()                    # payload_left >= width
        frame_left_full = Signal()              # frame_left >= width

        beat_payload = Signal.like(payload_left)    # payload bytes left, this beat included
        beat_frame = Signal.like(frame_left)        # bytes left, this beat included
        m.d.comb += [
            beat_payload.eq(Mux(start, descriptor.payload_length, payload_left)),
            beat_frame.eq(Mux(start, descriptor.frame_length, frame_left)),
        ]

        # The lanes of a beat: all of them, or (on a packet's last beat) those of the bytes
        # past its last full beat. The counts fall by a beat a beat, so the latter come
        # from the descriptor's lengths for every beat, one LUT deep.
        beat_bits = (width - 1).bit_length()
        all_lanes = C((1 << width) - 1, width)
        payload_keep = Mux(Mux(start, descriptor.payload_length >= width, left_full),
                           all_lanes, keep_mask(descriptor.payload_length[:beat_bits], width))
        frame_keep = Mux(Mux(start, descriptor.frame_length >= width, frame_left_full),
                         all_lanes, keep_mask(descriptor.frame_length[:beat_bits], width))

        take = Signal()                             # this beat carries payload from the input
        lanes = Signal(width)                       # its lanes that hold payload
        source_valid = Mux(replay, resent.valid, payload.valid)
        m.d.comb += [
            take.eq(Mux(start, descriptor.has_payload, left_nonzero) & (replay | ~ended)),
            lanes.eq(payload_keep & payload.p.keep & Mux(take, -1, 0)),
        ]
        beat_data = Signal(8 * width)
        m.d.comb += beat_data.eq(Mux(replay, resent.p.data & Mux(take, -1, 0),
                                     payload.p.data & Cat(lane.replicate(8) for lane in lanes)))
        last_beat = Mux(start, descriptor.single_beat, frame_last)

        got = keep_count(payload.p.keep)
        ends_short = (beat_payload > got) | ~descriptor.message_end
        ends_long = descriptor.message_end & (got > beat_payload)

        status = Signal(CompletionStatus)
        message_end = self.o_message_end
        m.d.comb += [
            message_end.p.tracked.eq(descriptor.tracked),
            message_end.p.slot.eq(descriptor.slot),
            message_end.p.completion.eq(descriptor.completion),
            message_end.p.completion.status.eq(status),
        ]

        # Where this beat goes in the retransmit buffer: the ring offset wraps in the QP's ring.
        ring_bits = self._ring_bits
        beat = Signal(range(MAX_PACKET_PAYLOAD // width + 1))
        offset = descriptor.address[:ring_bits] + Mux(start, 0, beat)
        m.d.comb += [
            self.o_write.p.address.eq(Cat(offset[:ring_bits], descriptor.address[ring_bits:])),
            self.o_write.p.data.eq(beat_data),
        ]

        with m.If(~draining & ~descriptor.drop):
            sending = self.o.valid & self.o.ready
            closing = last_beat & descriptor.message_end
            consumed_last = take & ~replay & payload.p.last
            completes = closing & (ended | consumed_last)
            m.d.comb += [
                # A beat waits for room for a message end, also a beat that ends none: the
                # handshake does not wait on the beat's own checks.
                self.o.valid.eq(self.i_packet.valid & (source_valid | ~take)
                                & message_end.ready),
                self.o.p.data.eq(beat_data),
                self.o.p.keep.eq(frame_keep),
                self.o.p.last.eq(last_beat),
                self.o.p.meta.eq(descriptor.meta),
                payload.ready.eq(take & ~replay & self.o.ready & self.o.valid),
                resent.ready.eq(take & replay & self.o.ready & self.o.valid),
                self.o_write.valid.eq(sending & ~replay
                                      & Mux(start, descriptor.has_payload, left_nonzero)),
                status.eq(Mux(short | (consumed_last & ends_short), CompletionStatus.PAYLOAD_SHORT,
                              Mux(long | (consumed_last & ends_long),
                                  CompletionStatus.PAYLOAD_LONG, CompletionStatus.SUCCESS))),
            ]
            with m.If(sending):
                m.d.sync += [
                    start.eq(last_beat),
                    beat.eq(Mux(start, 1, beat + 1)),
                    payload_left.eq(Mux(take & (beat_payload > width), beat_payload - width, 0)),
                    left_nonzero.eq(take & (beat_payload > width)),
                    left_full.eq(take & (beat_payload >= 2 * width)),
                    frame_left_full.eq(beat_frame >= 2 * width),
                    frame_left.eq(beat_frame - width),
                    frame_last.eq(beat_frame <= 2 * width),
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
                        message_end.valid.eq(1),
                    ]
                    m.d.sync += [ended.eq(0), short.eq(0), long.eq(0)]
                with m.Elif(closing):
                    m.d.sync += draining.eq(1)

        with m.Elif(ended):
            # A message whose payload already ended and that is dropped: nothing to drain.
            m.d.comb += [
                message_end.valid.eq(self.i_packet.valid),
                self.i_packet.ready.eq(message_end.ready),
                status.eq(CompletionStatus.PAYLOAD_SHORT),
            ]
            with m.If(message_end.valid & message_end.ready):
                m.d.sync += [draining.eq(0), ended.eq(0), short.eq(0), long.eq(0)]

        with m.Else():
            # Drain the rest of the message's payload, then complete it.
            m.d.comb += [
                payload.ready.eq(self.i_packet.valid & message_end.ready),
                status.eq(Mux(descriptor.drop, descriptor.completion.status,
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
                        message_end.valid.eq(1),
                    ]
                    m.d.sync += [draining.eq(0), ended.eq(0), short.eq(0), long.eq(0)]

        return m
