"""The one exception type of the host tools: a failure whose message names the fix."""

from __future__ import annotations

__all__ = ["HostError", "StartNotTaken"]


class HostError(Exception):
    """A failure the user can act on; ``str()`` says what went wrong and how to fix it.

    ``qp-server`` prints it as ``qp-server: error: <message>`` and exits with 1.
    """


class StartNotTaken(HostError):
    """The endpoint did not take a generator start (its generator is busy)."""
