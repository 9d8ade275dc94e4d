"""The receive API against the fake endpoint and verbs backend: every message once, in
order, as a view of the registered buffer; slots released and reposted."""

import contextlib
import time

import pytest

from host.cm import CmClient
from host.protocol import Request, generator_payload
from host.receive import Receiver, RunConfig

from .fakes import FakeBackend, FakeEndpoint


class CountingBackend(FakeBackend):
    """Records every receive posted: (qp, wr_id)."""

    def __init__(self):
        super().__init__()
        self.posts = []

    def post_receive(self, qp, wr_id, offset, length):
        super().post_receive(qp, wr_id, offset, length)
        self.posts.append((qp, wr_id))


@contextlib.contextmanager
def receiving(config):
    """A started receiver on a fake endpoint: (receiver, backend, endpoint)."""
    backend = CountingBackend()
    with FakeEndpoint(backend) as endpoint, \
            CmClient("127.0.0.1", cm_port=endpoint.port, timeout=0.3) as cm, \
            Receiver(config, backend, cm) as receiver:
        yield receiver, backend, endpoint


def receive_all(config):
    with receiving(config) as (receiver, backend, endpoint):
        got = []
        for message in receiver.messages():
            assert isinstance(message.data, memoryview)
            assert message.data.obj is backend.buffers[message.qp], "a view, not a copy"
            got.append((message.qp, message.k, bytes(message.data), message.imm))
        qps = receiver.qps
    return got, qps, backend, endpoint


@pytest.mark.parametrize("config", [
    RunConfig(write=False, size=100, count=25, receives=3, qps=2),
    RunConfig(write=False, immediate=True, size=64, count=12, receives=2),
    RunConfig(write=True, immediate=True, size=48, count=20, ring=48 * 4, qps=2),
    RunConfig(write=True, size=64, count=30, qps=2),
    RunConfig(write=True, size=20, count=9),
])
def test_every_message_once_in_order(config):
    got, qps, backend, endpoint = receive_all(config)
    for qp in range(config.qps):
        mine = [(k, data, imm) for index, k, data, imm in got if index == qp]
        assert [k for k, _, _ in mine] == list(range(config.count))
        for k, data, imm in mine:
            assert data == generator_payload(k, config.size)
            assert imm == (k if config.immediate else None)
    assert all(qp.first_error is None and qp.errors == 0 for qp in qps)
    assert all(qp.landed == config.count and qp.landed_bytes == config.count * config.size
               for qp in qps)
    if config.uses_completions:
        for qp in range(config.qps):
            posts = [wr_id for index, wr_id in backend.posts if index == qp]
            assert len(posts) == config.count, "one receive per message, each reposted"
            receives = config.posted_receives
            assert posts == [k % receives for k in range(config.count)]
    assert not any(qp.status.open for qp in endpoint.qps), "closed at the end"


def test_a_receive_is_reposted_only_when_the_batch_is_released():
    config = RunConfig(write=False, size=16, count=6, receives=2)
    with receiving(config) as (receiver, backend, _):
        seen = []
        for batch in receiver.batches():
            posted = len(backend.posts)
            seen += [message.k for message in batch]
            assert len(backend.posts) == posted, "held: nothing reposted yet"
            batch.release()
            assert len(backend.posts) == min(config.count, posted + batch.count)
            batch.release()
            assert len(backend.posts) == min(config.count, posted + batch.count), "once"
    assert seen == list(range(6))


def test_a_lapped_slot_is_reported_and_skipped():
    with receiving(RunConfig(write=True, size=32, count=50, ring=320)) as (receiver, _, _):
        ks = [message.k for message in receiver.messages()]
        qp = receiver.qps[0]
    assert ks == list(range(40, 50))
    assert qp.unchecked == 40
    assert qp.first_error == "message 0 was overwritten by message 40 before it was checked"


def test_a_credited_ring_is_never_lapped_by_a_slow_host():
    """The same ring and run as above, with a host that holds each batch a while: with
    credit every message arrives, each CREDIT counts the messages released; without it
    the same slow host loses messages (so the run above does lap)."""
    def run(credit):
        config = RunConfig(write=True, size=32, count=50, ring=320, credit=credit)
        with receiving(config) as (receiver, _, endpoint):
            ks = []
            for batch in receiver.batches():
                time.sleep(0.02)
                ks += [message.k for message in batch]
                batch.release()
            credits = [request.count for request in endpoint.requests
                       if request.request == Request.NULL and request.txmeta.credited
                       and not request.txmeta.start]
            return ks, receiver.qps[0], credits

    ks, qp, credits = run(credit=True)
    assert ks == list(range(50)) and qp.errors == qp.unchecked == 0, qp.first_error
    assert credits == sorted(credits) and credits[-1] == 50 and len(credits) >= 5
    ks, qp, _ = run(credit=False)
    assert len(ks) < 50 and qp.unchecked > 0


def test_credit_is_refused_where_posted_receives_hold_the_endpoint_back():
    for write, immediate in ((False, False), (True, True)):
        with pytest.raises(ValueError, match="plain WRITE"):
            RunConfig(write=write, immediate=immediate, credit=True)


@pytest.mark.parametrize("size", [8, 64, 20])
@pytest.mark.parametrize("landed", [0, 1, 63, 64, 65, 320, 321, 399, 400])
def test_the_landed_prefix_of_a_ring_across_growing_windows(size, landed):
    from host.protocol import QpInfo
    from host.receive import QpRun

    slots, first = 400, 800     # the third lap: slots still hold the second lap's messages
    ring = bytearray(b"".join(generator_payload(first - slots + i, size) for i in range(slots)))
    for i in range(landed):
        ring[i * size:(i + 1) * size] = generator_payload(first + i, size)
    receiver = Receiver(RunConfig(write=True, size=size, count=2000, ring=slots * size),
                        FakeBackend(), cm=None)
    receiver._buffers = [memoryview(ring)]
    assert receiver._landed_run(QpRun(0, QpInfo()), first, slots) == landed
    assert receiver._landed_run(QpRun(0, QpInfo()), first, min(slots, 70)) == min(landed, 70)
