"""The order in which ``make test``'s workers take the tests.

``make test`` runs pytest-xdist with ``--dist loadgroup --no-loadscope-reorder``: the work
units (a test, or all the tests of one ``xdist_group``) go to the workers in collection
order, and a worker is given the next unit whenever it has two tests or fewer left, so it
always holds one queued behind the one it runs. The tests that take minutes
(:data:`LONGEST_FIRST`) are collected first, longest first, the first two side by side
and then each behind a short unit: so none of them starts late and leaves the other
worker idle at the end, and a worker busy with one never holds the next one queued while
the other worker is free. Without pytest-xdist the order is the same.
"""

from itertools import islice

import pytest

#: The tests that take minutes: xdist groups, or the start of node IDs; longest first, as
#: ``make test`` on a clean clone timed them. The Soft-RoCE group builds the core's Verilator
#: model (netdev), which every cocotb test waits for, with the guest's image beside: it starts
#: first (with ``SYNTHESIS=1`` beside the netlist test, and the board top's synthesis
#: follows it).
LONGEST_FIRST = (
    "tests/sim/test_netlist.py",    # the reduced core through Yosys and Icarus: an hour
    "softroce",                     # the image, the core's model, a boot, two demo runs
    "board-synthesis",              # VCU118Top (2 QPs) through Yosys: 45-55 minutes
    "vcu118-tree",                  # the board's build trees: three tops converted
    "tests/sim/test_core.py::test_core[dcqcn_bench-",
    "tests/sim/test_core.py::test_core[fuzz_bench-",
)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "synthesis: synthesizes the design with Yosys (tens of CPU-minutes; "
                   "make test and CI leave these out, make test SYNTHESIS=1 runs them)")
    config.addinivalue_line(
        "markers", "convergence: a whole-core run until a control loop settles (minutes; "
                   "make bench runs these, make test leaves them out)")


def _shared_fixture(item) -> str | None:
    """The first fixture of module scope that the tests define and ``item`` uses, as
    ``<module>::<name>``; None if it uses none. (Fixtures of session scope are builds that
    a file lock and a cache already share between the workers.)"""
    for definitions in item._fixtureinfo.name2fixturedefs.values():
        fixture = definitions[-1]
        if fixture.scope == "module" and fixture.baseid.startswith("tests"):
            return f"{fixture.baseid}::{fixture.argname}"
    return None


def _unit(item) -> str:
    """The work unit of ``item`` under ``--dist loadgroup``: its group, or itself."""
    group = item.get_closest_marker("xdist_group")
    return group.args[0] if group else item.nodeid


def _rank(unit: str) -> int | None:
    return next((rank for rank, name in enumerate(LONGEST_FIRST)
                 if unit == name or unit.startswith(name)), None)


# First, so that the groups are set before pytest-xdist names the tests by them.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """Every test that boots the Soft-RoCE guest runs on the same worker (one guest image
    build, one QEMU at a time, each module's guest booted once), and so do the tests that
    share any other fixture of module scope (it is made once, not once on each worker);
    the units in the order the module's docstring gives."""
    for item in items:
        if item.get_closest_marker("softroce"):
            item.add_marker(pytest.mark.xdist_group("softroce"))
        elif not item.get_closest_marker("xdist_group") and (shared := _shared_fixture(item)):
            item.add_marker(pytest.mark.xdist_group(shared))
    units: dict[str, list] = {}
    for item in items:
        units.setdefault(_unit(item), []).append(item)
    long = sorted((unit for unit in units if _rank(unit) is not None), key=_rank)
    short = [unit for unit in units if _rank(unit) is None]
    order = long[:2] + short[:2]
    rest = iter(short[2:])
    for unit in long[2:]:
        order += [unit, *islice(rest, 1)]
    order += rest
    items[:] = [item for unit in order for item in units[unit]]
