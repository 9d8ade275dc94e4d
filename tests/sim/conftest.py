"""One Verilator (or Icarus) build of the whole core, shared by every cocotb test."""

import pytest

from sim.bench.core_runs import core_build


@pytest.fixture(scope="session")
def core_design():
    return core_build()
