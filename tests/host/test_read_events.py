"""The example's host reader (host/read_events.py) on the fake endpoint, whose user logic
is a model of the example event source: fragments of host/fragments.py into the ring,
immediate = event number; each fragment read once, in order, and checked."""

import functools
import io

from host import fragments
from host.cm import CmClient
from host.protocol import Datagram
from host.read_events import main, read_events
from host.receive import Receiver, RunConfig

from .fakes import FIRST_HOST_QPN, FakeBackend, FakeEndpoint


class EventEndpoint(FakeEndpoint):
    """A fake endpoint whose user logic sends event ``k``'s fragment (timestamp
    ``1000 + 37·k``) into ring slot ``k mod slots`` as a WRITE with immediate ``k``,
    once a QP is open; ``damage``: {event: byte offset} to flip on the way."""

    def __init__(self, backend, *, size, count, slots, damage=None):
        super().__init__(backend, user_run=Datagram())
        self.size, self.count, self.slots = size, count, slots
        self.damage = damage or {}

    def _generate(self, qp, start):
        index = qp.host.qpn - FIRST_HOST_QPN
        for k in range(self.count):
            data = bytearray(fragments.fragment(k, 1000 + 37 * k, self.size))
            if k in self.damage:
                data[self.damage[k]] ^= 0x10
            address = qp.host.base_addr + k % self.slots * self.size
            self.backend.write(qp.host.rkey, address, bytes(data))
            if not self._retry(qp, functools.partial(self.backend.deliver_write_imm, index,
                                                     self.size, k)):
                return


def read(size, count, slots, damage=None):
    backend = FakeBackend()
    config = RunConfig(write=True, immediate=True, size=size, count=count, ring=slots * size,
                       start=False, check="none")
    with EventEndpoint(backend, size=size, count=count, slots=slots, damage=damage) as endpoint, \
            CmClient("127.0.0.1", cm_port=endpoint.port, timeout=0.3) as cm, \
            Receiver(config, backend, cm) as receiver:
        headers = list(read_events(receiver))
        return headers, receiver.qps[0]


def test_every_fragment_is_read_once_in_order():
    headers, qp = read(size=96, count=20, slots=4)
    assert headers == [(0, fragments.Fragment(k, 1000 + 37 * k, 96)) for k in range(20)]
    assert (qp.errors, qp.first_error) == (0, None)


def test_a_damaged_fragment_is_counted_and_named():
    headers, qp = read(size=64, count=10, slots=3, damage={4: 40})
    assert [header.event for _, header in headers] == [0, 1, 2, 3, 5, 6, 7, 8, 9]
    assert qp.errors == 1
    assert qp.first_error.startswith("fragment of event 4 (slot at byte 64): payload")
    assert qp.first_error.endswith("(byte 40)")


def test_the_command_prints_the_headers_and_a_summary():
    backend = FakeBackend()
    out, err = io.StringIO(), io.StringIO()
    with EventEndpoint(backend, size=48, count=8, slots=4) as endpoint:
        code = main(["--endpoint", f"127.0.0.1:{endpoint.port}", "--timeout", "0.3",
                     "--size", "48", "--count", "8", "--slots", "4", "--every", "4"],
                    backend=backend, stdout=out, stderr=err)
    assert code == 0, err.getvalue()
    assert out.getvalue().splitlines() == [
        "event 0: timestamp 1000, 48 bytes", "event 4: timestamp 1148, 48 bytes",
        "8 of 8 fragments intact, events 0-7, timestamps 1000-1259, 0 errors"]
    assert f"the ring is at {FakeBackend.base(0):#x}" in err.getvalue()


def test_a_size_that_is_no_fragment_is_refused():
    err = io.StringIO()
    assert main(["--size", "20"], backend=FakeBackend(), stderr=err) == 2
    assert "multiple of 8 bytes" in err.getvalue()
