"""The core's build parameters as command-line options, for the programs that build
:class:`~gateware.core.NetworkCore` (``python -m sim.netdev``, ``python -m
sim.bench.dual``), as ``make bitstream`` takes them (``QPS``, ``RETRANSMIT_BEATS``,
``MESSAGES``, ``MESSAGE_SLOTS``). Each value is checked when it is parsed, by the check of
the gateware block that takes it, so a value the core cannot be built with is a usage
error (a pool too small for the QPs is refused as the core is built)."""

from __future__ import annotations

import argparse
import inspect
from collections.abc import Callable, Mapping

from gateware.core import NetworkCore
from gateware.roce.page_pool import check_retransmit_pages, check_ring_beats
from gateware.roce.reliability import check_message_count, check_message_slots
from gateware.roce.requests import check_qp_count

__all__ = ["BUILD_OPTIONS", "add_build_arguments", "build_arguments", "built_with",
           "message_slots_for"]

#: The options: each one's name, the NetworkCore parameter it sets, its help and the
#: check of its values.
BUILD_OPTIONS: tuple[tuple[str, str, str, Callable[[int], int]], ...] = (
    ("--qps", "qps", "each core's QPs", check_qp_count),
    ("--retransmit-beats", "retransmit_beats",
     "beats of each QP's retransmit ring: the most of the pool a QP may hold", check_ring_beats),
    ("--retransmit-pages", "retransmit_pages", "4 KiB pages of the retransmit pool all QPs share",
     check_retransmit_pages),
    ("--messages", "messages", "unacknowledged messages per QP, its cap on the slot pool",
     check_message_count),
    ("--message-slots", "message_slots", "message slots all QPs share", check_message_slots),
)


def _checked(check: Callable[[int], int]) -> Callable[[str], int]:
    """An argparse type: the integer ``check`` accepts."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        try:
            return check(value)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None
    return parse


def add_build_arguments(parser: argparse.ArgumentParser,
                        defaults: Mapping[str, object] | str) -> None:
    """Adds the options to ``parser``, in a group of their own; ``defaults`` says in
    their help what a build without them has: a text for all, or one for each
    parameter. An option left out parses as None."""
    group = parser.add_argument_group(
        "the core's build", "a build parameter other than the default takes a build of "
        "its own (cached after the first time); a value the core cannot be built with is "
        "refused")
    for option, name, helptext, check in BUILD_OPTIONS:
        default = defaults if isinstance(defaults, str) else defaults[name]
        group.add_argument(option, type=_checked(check), dest=name, metavar="N",
                           help=f"{helptext} (default: {default})")


def build_arguments(args: argparse.Namespace) -> dict[str, int]:
    """The NetworkCore parameters of the options given in ``args``."""
    return {name: getattr(args, name) for _, name, _, _ in BUILD_OPTIONS
            if getattr(args, name) is not None}


def message_slots_for(qps: int) -> int:
    """Message slots for a build of ``qps`` QPs: NetworkCore's default, or twice the QPs
    where that is too few (each QP holds a slot, and the pool keeps a few back)."""
    default = inspect.signature(NetworkCore).parameters["message_slots"].default
    return check_message_slots(max(default, 2 * qps), qps)


def built_with(params: Mapping[str, object]) -> dict[str, object]:
    """The value of each option's parameter in a build with ``params``: the one given
    there, else NetworkCore's default."""
    defaults = inspect.signature(NetworkCore).parameters
    return {name: params.get(name, defaults[name].default) for _, name, _, _ in BUILD_OPTIONS}
