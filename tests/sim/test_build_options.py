"""The core's build options (sim/build_options.py) as ``python -m sim.bench.dual`` and
``python -m sim.netdev`` parse them."""

import argparse

import pytest

from sim.build_options import add_build_arguments, build_arguments, built_with


def parser():
    parser = argparse.ArgumentParser()
    add_build_arguments(parser, "the board's")
    return parser


def test_only_the_options_given_are_build_parameters():
    """Left out, an option adds nothing to the build's parameters, so a build without
    options is the default build."""
    assert build_arguments(parser().parse_args([])) == {}
    assert build_arguments(parser().parse_args(["--messages", "32", "--qps", "2"])) == {
        "qps": 2, "messages": 32}
    assert build_arguments(parser().parse_args(["--message-slots", "8192"])) == {
        "message_slots": 8192}
    assert "(default: the board's)" in parser().format_help()


def test_a_build_has_networkcores_defaults_where_its_parameters_say_nothing():
    assert built_with({}) == {"qps": 16, "retransmit_beats": 2048, "retransmit_pages": 512,
                              "messages": 1024, "message_slots": 4096}
    assert built_with({"qps": 4, "window": 8}) == {
        "qps": 4, "retransmit_beats": 2048, "retransmit_pages": 512, "messages": 1024,
        "message_slots": 4096}


@pytest.mark.parametrize("argv", [["--qps", "4097"], ["--retransmit-beats", "4096.0"],
                                  ["--messages", "1"], ["--message-slots", "100"],
                                  ["--retransmit-pages", "100"]])
def test_a_value_the_core_refuses_is_refused_when_parsed(argv):
    with pytest.raises(SystemExit):
        parser().parse_args(argv)
