"""One Verilator (or Icarus) build of the whole core, shared by every cocotb test; the
Soft-RoCE tests kept on one pytest worker."""

import pytest

from gateware.core import NetworkCore
from sim.bench import CORE_PARAMS
from sim.runner import build


@pytest.fixture(scope="session")
def core_design():
    return build("core", lambda: NetworkCore(**CORE_PARAMS), key=repr(CORE_PARAMS))


def pytest_collection_modifyitems(items):
    """Under pytest-xdist (``make test``), every test that boots the Soft-RoCE guest runs
    on the same worker (``--dist loadgroup``): one guest image build, one QEMU at a time,
    and each module's guest fixture booted once instead of once per worker."""
    for item in items:
        if item.get_closest_marker("softroce"):
            item.add_marker(pytest.mark.xdist_group("softroce"))
