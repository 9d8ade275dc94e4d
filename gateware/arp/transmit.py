from amaranth import *
from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.wiring import In, Out

from ..config import NetworkConfig
from ..eth.tx import ETH_TX_META
from ..headers import ETHERTYPE_IPV4, IP_PROTO_UDP, IPV4, UDP
from ..ip.tx import NEXT_HOP_META
from ..packet.fifo import PacketFIFO
from ..stream import BEAT_BYTES, NO_META, packet_signature
from .resolver import RESOLVE, RESOLVED

__all__ = ["ArpTransmitter"]


#: Where a packet goes: its next hop, whether that is unreachable, whether it may wait.
_NEXT_HOP = data.StructLayout({"hop": 32, "unreachable": 1, "patient": 1})


class Route(enum.Enum, shape=3):
    DIRECT = 0          # the next hop is in the cache: out on ``o_direct``
    PARK = 1            # wait for the parking slot's hop, beside the stream
    WAIT = 4            # the slot's hop answered: wait in place until the slot has drained
    MISS = 2            # not resolved, may not wait (or the slot is taken): dropped
    UNREACHABLE = 3     # off our subnet with no gateway: dropped


class ArpTransmitter(wiring.Component):
    """Gives each IPv4 packet on ``i`` the MAC of its next hop (the destination
    on our subnet, else the gateway; with no gateway set, an off-subnet
    destination is unreachable and dropped), without ever holding the stream
    for an address that does not answer.

    The route of a packet is decided from registers when its first beat
    reaches the second of two register stages (the next hop is computed in
    the first, the cache's answer for it registered into the second): a hit
    goes out on ``o_direct``. A miss goes into the parking slot if it is free
    (or already waits for that hop): a FIFO of ``park_beats`` beats beside the
    stream; the resolver is made to ask for that hop (``o_resolve`` with
    ``force``, a register: the cycle after the packet's route is decided),
    and the parked packets leave on ``o_parked`` with the MAC learnt once it
    answers, or are dropped if it does not. While the slot
    holds packets, later packets to its hop join them, so their order is kept;
    the slot frees when it is empty (once the hop has answered, a packet to it
    waits in place for that, at most the slot's beats, instead of joining, so
    that a stream to the hop cannot keep the slot from draining). A *patient*
    packet (UDP with a source or destination port in ``patient_ports``) may
    take the slot from packets that are not (echo replies) while their hop is
    unresolved; those are dropped.
    Any other miss is dropped, and its hop asked for if the resolver is free.
    ``o_unresolved`` (a packet dropped for a hop not resolved, or that did not
    fit in the slot) and ``o_unreachable`` pulse once per packet.

    Latency: 2 cycles from ``i`` to ``o_direct``, one beat per cycle, also
    between packets to different next hops.
    """

    def __init__(self, *, patient_ports=(), park_beats=256, width=BEAT_BYTES):
        patient_ports = tuple(patient_ports)
        if not all(isinstance(port, int) and 0 < port < 65536 for port in patient_ports):
            raise ValueError(f"Patient ports must be UDP port numbers, not {patient_ports!r}")
        if patient_ports and width < IPV4.length + UDP.length:
            raise ValueError(f"Beat width {width} does not hold the IPv4 and UDP headers")
        self._patient_ports = patient_ports
        self._park_beats = park_beats
        self._width = width
        super().__init__({
            "i": In(packet_signature(NEXT_HOP_META, width=width)),
            "i_config": In(NetworkConfig),
            "o_lookup_ip": Out(32),
            "o_lookup_used": Out(1),
            "i_hit": In(1),
            "i_mac": In(48),
            "o_resolve": Out(stream.Signature(RESOLVE, always_ready=True)),
            "i_resolved": In(stream.Signature(RESOLVED, always_ready=True)),
            "o_direct": Out(packet_signature(ETH_TX_META, width=width)),
            "o_parked": Out(packet_signature(ETH_TX_META, width=width)),
            "o_unresolved": Out(1),
            "o_unreachable": Out(1),
        })

    def _patient(self, lanes):
        """Whether the IPv4 packet whose first beat is ``lanes`` may wait for its next hop."""
        if not self._patient_ports:
            return C(0)
        ip = IPV4.from_wire(lanes[:8 * IPV4.length])
        udp = UDP.from_wire(lanes[8 * IPV4.length:8 * (IPV4.length + UDP.length)])
        ports = Cat((udp.src_port == port) | (udp.dst_port == port)
                    for port in self._patient_ports)
        return (ip.protocol == IP_PROTO_UDP) & ports.any()

    def elaborate(self, platform):
        m = Module()
        config = self.i_config
        width = self._width

        # Two register stages of one beat each, so that no path runs from the
        # configuration through the next hop and the cache to the output: stage 1 holds a
        # beat with where its packet goes (``s1_to``, whose hop is the cache's lookup
        # address), stage 2 with the cache's answer for it. The route of a packet is
        # decided with its first beat in stage 2, from registers, and holds for the packet.
        ip = self.i
        direct = self.o_direct

        beat = ip.p.shape()
        in_first = Signal(init=1)
        s1 = Signal(beat)
        s1_valid = Signal()
        s1_first = Signal()
        s1_to = Signal(_NEXT_HOP)
        s2 = Signal(beat)
        s2_valid = Signal()
        s2_first = Signal()
        s2_to = Signal(_NEXT_HOP)
        hit = Signal()
        dst_mac = Signal(48)

        # The parking slot's state (below).
        m.submodules.park = park = PacketFIFO(NO_META, depth=self._park_beats, width=width)
        parked = self.o_parked
        slot_busy = Signal()
        slot_hop = Signal(32)
        slot_patient = Signal()
        slot_released = Signal()
        slot_failed = Signal()
        slot_mac = Signal(48)
        slot_packets = Signal(range(self._park_beats + 1))   # accepted by park, not yet out
        stale = Signal(range(self._park_beats + 1))          # of those, to drop
        any_stale = Signal()                                  # stale != 0, as a register
        allocate = Signal()                                   # a packet takes the slot
        take_slot = Signal()                                  # stage 2's packet would take it
        # Whether stage 2's hop is the slot's, from three registers loaded with its first
        # beat: its hop compared with the one of the packet before it and with the slot's,
        # and whether that packet took the slot as it left (then its hop is the slot's).
        # The compares end in registers of their own, so they do not chain with the
        # handshake that loads stage 2.
        s2_after_take = Signal()
        s2_hop_as_before = Signal()
        s2_hop_as_slot = Signal()
        s2_same_hop = Mux(s2_after_take, s2_hop_as_before, s2_hop_as_slot)

        take2 = Signal()
        load2 = s1_valid & (~s2_valid | take2)
        m.d.comb += ip.ready.eq(~s1_valid | load2)
        with m.If(ip.valid & ip.ready):
            m.d.sync += [
                s1.eq(ip.p),
                s1_first.eq(in_first),
                in_first.eq(ip.p.last),
            ]
            with m.If(in_first):
                on_link = ((ip.p.meta.dst_ip ^ config.ip) & config.netmask) == 0
                m.d.sync += [
                    s1_to.hop.eq(Mux(on_link, ip.p.meta.dst_ip, config.gateway)),
                    s1_to.unreachable.eq(~on_link & (config.gateway == 0)),
                    s1_to.patient.eq(self._patient(ip.p.data)),
                ]
        with m.If(ip.ready):
            m.d.sync += s1_valid.eq(ip.valid)
        m.d.comb += [
            self.o_lookup_ip.eq(s1_to.hop),
            # Marked every cycle a first beat is looked up (from registers only; marking again
            # changes nothing).
            self.o_lookup_used.eq(s1_valid & s1_first),
        ]
        with m.If(load2):
            m.d.sync += [
                s2.eq(s1),
                s2_first.eq(s1_first),
            ]
            with m.If(s1_first):
                m.d.sync += [
                    s2_to.eq(s1_to),
                    hit.eq(self.i_hit),
                    # As the slot will be: taken by the packet leaving stage 2 (a packet that
                    # takes the slot always leaves at once, so no handshake is needed here),
                    # or as it is.
                    s2_after_take.eq(s2_valid & s2_first & take_slot),
                    s2_hop_as_before.eq(s1_to.hop == s2_to.hop),
                    s2_hop_as_slot.eq(s1_to.hop == slot_hop),
                    dst_mac.eq(self.i_mac),
                ]
        with m.If(~s2_valid | take2):
            m.d.sync += s2_valid.eq(load2)

        # The parking slot: one next hop whose packets wait for its resolution in a FIFO
        # beside the stream, so that a miss holds no packet to another next hop. Later
        # packets to that hop join them (order kept); they leave with the MAC learnt, or
        # are dropped when the hop does not answer. A slot that only packets that may not
        # wait (echo replies) hold, and that is not resolved, is given to a patient packet
        # (RoCEv2, the connection manager's replies) to another hop that needs it: the
        # packets parked before are then dropped on their way out (``stale``).
        route = Signal(Route)
        route_first = Signal(Route)
        same_hop = slot_busy & s2_same_hop
        with m.If(s2_to.unreachable):
            m.d.comb += route_first.eq(Route.UNREACHABLE)
        with m.Elif(same_hop & slot_released):
            m.d.comb += route_first.eq(Route.WAIT)
        with m.Elif(same_hop):
            m.d.comb += route_first.eq(Route.PARK)
        with m.Elif(hit):
            m.d.comb += route_first.eq(Route.DIRECT)
        with m.Elif(~slot_busy | (s2_to.patient & ~slot_patient & ~slot_released)):
            m.d.comb += [route_first.eq(Route.PARK), take_slot.eq(1)]
        with m.Else():
            m.d.comb += route_first.eq(Route.MISS)
        # The handshake of stage 2 follows flags computed beside the route (each a LUT or
        # two from registers), not the route itself: this is the layer's longest path.
        is_direct = Signal()
        is_park = Signal()
        is_wait = Signal()
        unreachable = s2_to.unreachable
        with m.If(s2_first):
            m.d.comb += [
                is_direct.eq(~unreachable & ~same_hop & hit),
                is_wait.eq(~unreachable & same_hop & slot_released),
                is_park.eq(~unreachable & Mux(same_hop, ~slot_released, ~hit & take_slot)),
            ]
        with m.Else():
            m.d.comb += [
                is_direct.eq(route == Route.DIRECT),
                is_park.eq(route == Route.PARK),
            ]
        first_taken = take2 & s2_first
        with m.If(first_taken):
            m.d.sync += route.eq(route_first)

        m.d.comb += [
            direct.p.data.eq(s2.data),
            direct.p.keep.eq(s2.keep),
            direct.p.last.eq(s2.last),
            direct.p.meta.ethertype.eq(ETHERTYPE_IPV4),
            direct.p.meta.dst_mac.eq(dst_mac),
            park.i.p.data.eq(s2.data),
            park.i.p.keep.eq(s2.keep),
            park.i.p.last.eq(s2.last),
        ]
        m.d.comb += [
            direct.valid.eq(s2_valid & is_direct),
            take2.eq(Mux(is_direct, direct.ready, s2_valid & ~is_wait)),
            park.i.valid.eq(s2_valid & is_park),
        ]

        # A packet that takes the slot has its hop asked for in the next cycle (``force``);
        # a miss that is dropped, if the resolver is free then. From registers, so the
        # route's decision does not chain with the resolver's. (The resolver answers
        # nothing in the cycle it takes a start, and an answer in the cycle the slot is
        # taken is the abandoned resolution's, which ``allocate`` overrides below.)
        m.d.comb += allocate.eq(first_taken & take_slot)
        m.d.sync += self.o_resolve.valid.eq(
            first_taken & ((route_first == Route.MISS) | take_slot))
        with m.If(first_taken):
            m.d.sync += [
                self.o_resolve.p.ip.eq(s2_to.hop),
                self.o_resolve.p.force.eq(take_slot),
            ]

        parked_in = park.i.valid & park.i.p.last & ~park.o_overflow_drop
        parked_out = park.o.valid & park.o.ready & park.o.p.last
        dropping = slot_failed | any_stale
        m.d.sync += slot_packets.eq(slot_packets + parked_in - parked_out)
        m.d.comb += [
            parked.p.data.eq(park.o.p.data),
            parked.p.keep.eq(park.o.p.keep),
            parked.p.last.eq(park.o.p.last),
            parked.p.meta.ethertype.eq(ETHERTYPE_IPV4),
            parked.p.meta.dst_mac.eq(slot_mac),
            parked.valid.eq(park.o.valid & slot_released & ~dropping),
            park.o.ready.eq(Mux(dropping, 1, parked.ready & slot_released)),
        ]
        within = Signal()          # between the first and the last beat of a packet in stage 2
        with m.If(take2):
            m.d.sync += within.eq(~s2.last)
        parking = (is_park & s2_valid) | ((route == Route.PARK) & within)
        with m.If(allocate):
            m.d.sync += [
                stale.eq(slot_packets - parked_out),
                any_stale.eq(slot_packets != parked_out),
            ]
        with m.Elif(parked_out & any_stale):
            m.d.sync += [
                stale.eq(stale - 1),
                any_stale.eq(stale != 1),
            ]
        done = self.i_resolved
        with m.If(allocate):
            m.d.sync += [
                slot_busy.eq(1),
                slot_hop.eq(s2_to.hop),
                slot_patient.eq(s2_to.patient),
                slot_released.eq(0),
                slot_failed.eq(0),
            ]
        with m.Elif(done.valid & done.p.forced & slot_busy):
            m.d.sync += [
                slot_released.eq(done.p.ok),
                slot_failed.eq(~done.p.ok),
                slot_mac.eq(done.p.mac),
            ]
        with m.Elif((slot_released | slot_failed) & ~parking & (slot_packets == 0)):
            m.d.sync += slot_busy.eq(0)
        with m.If(first_taken & same_hop & s2_to.patient):
            m.d.sync += slot_patient.eq(1)

        m.d.comb += [
            self.o_unresolved.eq((first_taken & (route_first == Route.MISS)) |
                                 park.o_overflow_drop | (parked_out & dropping)),
            self.o_unreachable.eq(first_taken & (route_first == Route.UNREACHABLE)),
        ]

        return m
