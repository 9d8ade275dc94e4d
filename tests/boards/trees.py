"""What the tests of the VCU118 build trees share: a small core, the example source's
options, and ``python -m boards.build`` run with or without Vivado on PATH."""

import os
import subprocess
import sys
from pathlib import Path

__all__ = ["SMALL_CORE", "SMALL_ARGS", "EXAMPLE_ARGS", "run_build", "path_without_vivado"]

#: Small core parameters: the same top and ports, quicker to convert.
SMALL_CORE = {"qps": 4, "retransmit_beats": 128, "retransmit_pages": 8, "messages": 8,
              "message_slots": 16}
#: The same as ``boards.build`` options.
SMALL_ARGS = [word for name, value in SMALL_CORE.items()
              for word in (f"--{name.replace('_', '-')}", str(value))]
#: The example event source on the core's user ports, with a small ring of its own.
EXAMPLE_ARGS = ["--source", "example", "--fragment-bytes", "1024", "--ring-slots", "8"]


def run_build(*args, path):
    """``python -m boards.build`` with ``PATH`` as given."""
    return subprocess.run([sys.executable, "-m", "boards.build", *args],
                          cwd=Path(__file__).resolve().parents[2],
                          env={**os.environ, "PATH": path}, capture_output=True, text=True)


def path_without_vivado():
    return os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep)
                           if not (Path(p) / "vivado").exists())
