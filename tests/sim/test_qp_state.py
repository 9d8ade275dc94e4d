"""sim.qp_state: every per-QP memory of the reliability engine is counted, and a QP's
transport state stays within its goal of 32 bytes at the core's defaults and at the
largest pools."""

import inspect

import pytest

from gateware.core import NetworkCore
from gateware.roce.qp_context import per_qp_layouts
from gateware.roce.reliability import ReliabilityEngine
from sim.qp_state import TRANSPORT_GOAL_BITS, transport_bits


def test_every_memory_of_the_engine_is_counted():
    counted = ReliabilityEngine.qp_state_bits(1024, 4096)
    assert set(counted) == {*per_qp_layouts(12, 12), "flags"}


@pytest.mark.parametrize(("messages", "message_slots"), [
    (inspect.signature(NetworkCore).parameters["messages"].default,
     inspect.signature(NetworkCore).parameters["message_slots"].default),
    (1 << 15, 1 << 16)])
def test_the_transport_state_is_within_32_bytes(messages, message_slots):
    assert transport_bits(messages, message_slots) <= TRANSPORT_GOAL_BITS == 256
