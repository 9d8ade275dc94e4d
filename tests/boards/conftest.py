"""The board tests' shared tree."""

import pytest

from .trees import EXAMPLE_ARGS, SMALL_ARGS, path_without_vivado, run_build


@pytest.fixture(scope="session")
def example_tree(tmp_path_factory):
    """``make bitstream QSFP=2 SOURCE=example`` with a small core, without Vivado on PATH:
    ``(tree, the command's stderr)``. It is both the build tests' tree for QSFP2 and the
    example source's tree (their modules share a worker): converting a whole top takes
    about a minute."""
    build_dir = tmp_path_factory.mktemp("vcu118-qsfp2-example")
    run = run_build("bitstream", "--qsfp", "2", "--build-dir", str(build_dir), *SMALL_ARGS,
                    *EXAMPLE_ARGS, path=path_without_vivado())
    assert run.returncode == 1, run.stderr
    return build_dir, run.stderr
