"""One Verilator (or Icarus) build of the whole core, shared by every cocotb test; the
Soft-RoCE tests kept on one pytest worker; the tests that synthesize started first."""

import pytest

from gateware.core import NetworkCore
from sim.runner import build
from sim.testbench import CORE_PARAMS


@pytest.fixture(scope="session")
def core_design():
    return build("core", lambda: NetworkCore(**CORE_PARAMS), key=repr(CORE_PARAMS))


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "synthesis: synthesizes the reduced core with Yosys (minutes of CPU); "
                   "collected first, so that under pytest-xdist it starts first")


def pytest_collection_modifyitems(items):
    """Under pytest-xdist (``make test``), every test that boots the Soft-RoCE guest runs
    on the same worker (``--dist loadgroup``): one guest image build, one QEMU at a time,
    and each module's guest fixture booted once instead of once per worker. The tests
    that synthesize come first: started last, they would end minutes after the rest."""
    for item in items:
        if item.get_closest_marker("softroce"):
            item.add_marker(pytest.mark.xdist_group("softroce"))
    items.sort(key=lambda item: item.get_closest_marker("synthesis") is None)
