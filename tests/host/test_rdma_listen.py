""":class:`host.rdma_listen.Listener` without a guest: its CONNECT loop against a
scripted endpoint (CONNECT datagrams in, the REQ, ESTABLISHED and the answer out)
and stand-ins for the few pyverbs calls it makes; the private data it checks and
sends is packed here with struct."""

from __future__ import annotations

import struct
import sys
import types

import pytest

from host import rdma_listen
from host.errors import HostError
from host.protocol import Ack, Datagram, PathMtu, QpInfo, Request
from host.protocol import reply as endpoint_reply
from host.rdma_connect import CmEvent
from host.rdma_listen import ConnectRejected, Listener

HOST, ENDPOINT, PORT, QPN, PSN = "10.77.0.1", "10.77.0.2", 18515, 0x101, 0x123456
#: The buffer the host names in its accept: version 1, rkey, address, length.
ACCEPT_DATA = struct.pack(">B3xIQQ", 1, 0x77, 0x7F00_0000_1000, 4096)


def req_private(version: int = 1, qpn: int = QPN) -> bytes:
    """The user part of the endpoint's REQ private data, as rdma_cm hands it over."""
    return struct.pack(">B3xI", version, qpn).ljust(56, b"\0")


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple] = []


class ConnectionId(Recorder):
    """The pyverbs CMID of the endpoint's connection request."""

    def __init__(self, events: Events) -> None:
        super().__init__()
        self.events = events

    def init_qp_attr(self, state: str) -> tuple[types.SimpleNamespace, str]:
        return types.SimpleNamespace(state=state, min_rnr_timer=None), f"mask-{state}"

    def create_qp(self, attr: object) -> None:
        self.calls.append(("create_qp", attr))

    def accept(self, param: ConnParam) -> None:
        self.calls.append(("accept", param.qpn, param.private))
        self.events.pending.append(CmEvent(9))        # the endpoint's RTU: ESTABLISHED

    def reject(self) -> None:
        self.calls.append(("reject",))


class ConnParam:
    """pyverbs' ConnParam: built with ``qp_num``, which it shows as ``qpn``."""

    def __init__(self, data_len: int, qp_num: int) -> None:
        self.data_len, self.qpn, self.private = data_len, qp_num, b""

    def set_private_data(self, data: bytes) -> None:
        self.private = bytes(data)


class Events:
    """Listener.events: ``pending`` events; a ("request", private) entry is the REQ."""

    def __init__(self) -> None:
        self.pending: list = []
        self.connection = ConnectionId(self)

    def ready(self, timeout: float = 0.0) -> bool:
        return bool(self.pending)

    def request(self, listen_id: object, what: str, timeout: float):
        kind, private = self.pending.pop(0)
        assert kind == "request" and listen_id == "listen-id"
        return self.connection, CmEvent(4, 0, private)

    def get(self, what: str, timeout: float) -> CmEvent:
        return self.pending.pop(0)


class Endpoint:
    """The endpoint's CM as the host's CmClient sees it: each CONNECT is recorded; the
    first sends the REQ (``private``); ``answer`` comes back from the ``answer_on``-th
    CONNECT on (once the host accepted, for an ACK), or never (None)."""

    def __init__(self, events: Events, answer: Datagram | None, *, answer_on: int = 1,
                 private: bytes | None = None) -> None:
        self.endpoint = ENDPOINT
        self.events = events
        self.answer = answer
        self.answer_on = answer_on
        self.private = req_private() if private is None else private
        self.sent: list[Datagram] = []

    def send(self, request: Datagram) -> None:
        self.sent.append(Datagram.decode(request.encode()))
        if len(self.sent) == 1 and self.private:
            self.events.pending.append(("request", self.private))

    def receive(self, accept, timeout: float):
        accepted = any(call[0] == "accept" for call in self.events.connection.calls)
        if (self.answer is None or len(self.sent) < self.answer_on
                or (self.answer.ack == Ack.ACK and not accepted) or not accept(self.answer)):
            return None
        return self.answer, self.answer.encode()


@pytest.fixture
def pyverbs(monkeypatch):
    """Stand-ins for the pyverbs names Listener.connect imports."""
    enums = types.SimpleNamespace(IBV_QPT_RC="rc", IBV_QPS_RTR="rtr", IBV_QPS_RTS="rts")
    modules = {"pyverbs": types.ModuleType("pyverbs"),
               "pyverbs.enums": types.ModuleType("pyverbs.enums"),
               "pyverbs.cmid": types.ModuleType("pyverbs.cmid"),
               "pyverbs.qp": types.ModuleType("pyverbs.qp")}
    vars(modules["pyverbs.enums"]).update(vars(enums))
    modules["pyverbs.cmid"].ConnParam = ConnParam
    modules["pyverbs.qp"].QPCap = lambda **kwargs: ("cap", kwargs)
    modules["pyverbs.qp"].QPInitAttr = lambda **kwargs: ("init", kwargs)
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(rdma_listen, "CONNECT_RESEND", 0.01)


def listener(timeout: float = 2.0) -> Listener:
    """A Listener past its bind and listen (which need a device)."""
    made = Listener.__new__(Listener)
    made.timeout, made.host_ip, made.port = timeout, HOST, PORT
    made.where = f"the endpoint's connection to {HOST} rdma_cm port {PORT}"
    made.events = Events()
    made.listen_id = made.cmid = "listen-id"
    made.connection = None
    made.established = False
    made.req_version = made.req_qpn = None
    return made


def ack(qpn: int = QPN) -> Datagram:
    request = Datagram(Request.CONNECT, loc=QpInfo(ip=HOST))
    return endpoint_reply(request, Ack.ACK, QpInfo(qpn=qpn, psn=PSN, ip=ENDPOINT),
                          mtu=PathMtu.MTU_1024)


def nak(reason: int) -> Datagram:
    request = Datagram(Request.CONNECT, loc=QpInfo(ip=HOST))
    return endpoint_reply(request, Ack.NAK, QpInfo(ip=ENDPOINT), count=reason)


def test_connect_is_resent_until_answered_and_accepts_with_the_buffer(pyverbs):
    made = listener()
    endpoint = Endpoint(made.events, ack(), answer_on=3)
    answer = made.connect(endpoint, ACCEPT_DATA, PathMtu.MTU_1024)
    assert (answer.loc.qpn, answer.loc.psn) == (QPN, PSN)
    assert made.established and (made.req_version, made.req_qpn) == (1, QPN)
    assert made.cmid is made.events.connection
    assert len(endpoint.sent) >= 3
    for sent in endpoint.sent:
        raw = sent.encode()
        assert raw[0] == 1 | 6 << 1 and raw[21:25] == bytes((10, 77, 0, 1))
        assert raw[51] == 3 << 4 and raw[52:56] == struct.pack(">I", PORT)
    calls = made.events.connection.calls
    assert calls[0][0] == "create_qp" and calls[0][1][1]["qp_type"] == "rc"
    assert calls[1] == ("accept", 0, ACCEPT_DATA)


def test_a_callers_qp_goes_to_rts_before_the_accept(pyverbs):
    made = listener()

    class Qp:
        qp_num = 42
        modified: list = []

        def modify(self, attr, mask) -> None:
            self.modified.append((attr.state, attr.min_rnr_timer, mask))

    qp = Qp()
    made.connect(Endpoint(made.events, ack()), ACCEPT_DATA, PathMtu.MTU_1024, qp=qp,
                 min_rnr_timer=12)
    assert qp.modified == [("rtr", 12, "mask-rtr"), ("rts", None, "mask-rts")]
    assert made.events.connection.calls == [("accept", 42, ACCEPT_DATA)]


def test_connect_port_names_another_port(pyverbs):
    made = listener()
    endpoint = Endpoint(made.events, nak(8), private=b"")
    with pytest.raises(ConnectRejected) as error:
        made.connect(endpoint, ACCEPT_DATA, PathMtu.MTU_1024, connect_port=PORT + 1)
    assert endpoint.sent[0].length == PORT + 1
    assert error.value.reason == 8
    assert "NAK, REJ reason 8 (invalid service ID): nothing listens" in str(error.value)


@pytest.mark.parametrize("reason, words", [
    (3, "every endpoint QP is in use"), (4, "never answered"), (26, "path MTU"),
    (28, "version 1"), (99, "check the port")])
def test_a_nak_names_its_reason_and_the_fix(pyverbs, reason, words):
    made = listener()
    with pytest.raises(ConnectRejected, match=words) as error:
        made.connect(Endpoint(made.events, nak(reason), private=b""), ACCEPT_DATA,
                     PathMtu.MTU_1024)
    assert error.value.reason == reason


def test_a_req_of_another_version_is_rejected(pyverbs):
    made = listener()
    with pytest.raises(HostError, match="private data version 2, QPN 257"):
        made.connect(Endpoint(made.events, None, private=req_private(version=2)),
                     ACCEPT_DATA, PathMtu.MTU_1024)
    assert made.events.connection.calls == [("reject",)]


def test_an_ack_for_another_qp_than_the_req_fails(pyverbs):
    made = listener()
    with pytest.raises(HostError, match="names QP 258, its REQ QP 257"):
        made.connect(Endpoint(made.events, ack(qpn=QPN + 1)), ACCEPT_DATA, PathMtu.MTU_1024)


def test_silence_names_the_timeout(pyverbs):
    made = listener(timeout=0.1)
    with pytest.raises(HostError, match=r"no REQ to 10.77.0.1 port 18515 and no answer to "
                                         r"CONNECT from 10.77.0.2 within 0.1 s"):
        made.connect(Endpoint(made.events, None, private=b""), ACCEPT_DATA, PathMtu.MTU_1024)
