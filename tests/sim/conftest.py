"""One Verilator (or Icarus) build of the whole core, shared by every cocotb test."""

import pytest

from gateware.core import NetworkCore
from sim.bench import CORE_PARAMS
from sim.runner import build


@pytest.fixture(scope="session")
def core_design():
    return build("core", lambda: NetworkCore(**CORE_PARAMS), key=repr(CORE_PARAMS))
