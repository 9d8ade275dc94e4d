"""One Verilator (or Icarus) build of the whole core, shared by every cocotb test."""

import pytest

from gateware.core import NetworkCore
from sim.runner import build
from sim.testbench import CORE_PARAMS


@pytest.fixture(scope="session")
def core_design():
    return build("core", lambda: NetworkCore(**CORE_PARAMS), key=repr(CORE_PARAMS))
