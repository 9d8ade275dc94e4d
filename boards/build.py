"""``make bitstream`` and ``make program``: the Vivado build of a board, and loading it.

``python -m boards.build bitstream`` writes the complete Vivado build tree
(``top.v``, ``top.xdc``, ``top.tcl`` with the recipe of each CMAC IP,
``build_top.sh`` and ``program.tcl``) for one QSFP28 cage (``--qsfp 1`` or
``2``: :class:`~boards.vcu118_top.VCU118Top`) or both (``--qsfp both``:
:class:`~boards.vcu118_top.VCU118DualTop`) and runs it when ``vivado`` is on ``PATH``. Without
Vivado it stops there with one line saying so and how to finish on a
machine that has it. The flow stops before ``write_bitstream`` when the routed
design fails timing (:mod:`boards.timing_gate`); ``make bitstream`` then says
which checks failed and where the reports are, and no ``top.bit`` is left.
``python -m boards.build program`` loads the bitstream through Vivado's
hardware manager (a board on this machine's JTAG, or on a ``hw_server``
named with ``--hw-server``); ``python -m boards.build flash`` writes it to
the board's configuration flash, so that it loads at power-up
(:mod:`boards.jtag`).
"""

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

from gateware.core import CMAC_CLOCK_HZ
from gateware.roce.requests import PathMtu

from .cmac_ip import cmac_ip_tcl
from .jtag import write_jtag_scripts
from .timing_gate import failed_checks, gate_report_name, timing_gate_tcl
from .vcu118 import VCU118Platform
from .vcu118_port import SOURCES
from .vcu118_top import CORE_CLOCK_HZ, PORT2_ADDRESS, VCU118DualTop, VCU118Top

__all__ = ["write_tree", "run_vivado", "main"]

ROOT = Path(__file__).resolve().parent.parent
#: Per board: its platform, and its top for one cage and for both.
BOARDS = {"vcu118": (VCU118Platform, VCU118Top, VCU118DualTop)}
NAME = "top"
#: The example source's build parameters when not given (``--source example``).
EXAMPLE_DEFAULTS = {"fragment_bytes": 4096, "ring_slots": 64}
#: The ``--qsfp`` choices: one cage, or both.
CAGES = ("1", "2", "both")


def _build_dir(args) -> Path:
    return args.build_dir or ROOT / "build" / f"{args.board}-qsfp{args.qsfp}"


def _clock_constraints(platform, ip_names) -> str:
    """Timing constraints beyond the platform's ``create_clock`` of each clock pin: the
    board clock, the core's clock (its MMCM's output) and each CMAC's clocks are
    asynchronous; status pins are not timed."""
    cmac_groups = "".join(
        f" -group [get_clocks -include_generated_clocks -of_objects [get_pins -of_objects"
        f" [get_cells -hierarchical -filter {{REF_NAME == {name}}}]"
        " -filter {REF_PIN_NAME == gt_txusrclk2}]]" for name in ip_names)
    return "\n".join([
        "# The board's 125 MHz clock, the core's 250 MHz (Vivado derives it at the MMCM's",
        "# output) and each CMAC's GT clocks (which the IP's own constraints create) are",
        "# asynchronous; every crossing goes through a synchronizer or an asynchronous FIFO",
        "# (whose gray-code pointers have a bus skew constraint after synthesis).",
        "set_clock_groups -asynchronous"
        " -group [get_clocks clk125_0__p]"
        " -group [get_clocks -of_objects [get_pins core_mmcm/CLKOUT0]]"
        f"{cmac_groups}",
        "# LEDs, switches, the UART and QSFP28 low-speed pins: static or slow, not timed.",
        "set_false_path -to [get_ports {led_* uart_0__tx__io uart_0__rts__io}]",
        "set_false_path -to [get_ports {qsfp_*__modsel__io qsfp_*__reset__io qsfp_*__lpmode__io}]",
        "set_false_path -from [get_ports {cpu_reset_0__io qsfp_*__present__io switch_*__io}]",
        platform.bitstream_constraints(),
    ])


def _crossing_constraints(fifos) -> str:
    """Tcl run after synthesis: each asynchronous FIFO's (``fifos``, hierarchical names)
    gray-code pointers (write and
    read position) reach their synchronizer with a bus skew under the faster clock's
    period, so the synchronizer never samples a mix of two positions. Amaranth's flow
    puts false paths on the synchronizers' inputs (``amaranth.vivado.false_path``, applied
    just before this) and the clock groups cut the FIFO's memory paths; a bus skew
    constraint holds through both (UG903)."""
    skew = 1e9 / max(CMAC_CLOCK_HZ, CORE_CLOCK_HZ)
    lines = ["# Bus skew of the asynchronous FIFOs' gray-code pointers (boards/build.py)."]
    for fifo in fifos:
        for synchronizer in ("produce_cdc", "consume_cdc"):
            to = (f"[get_cells -hierarchical -filter "
                  f"{{NAME =~ {fifo}/{synchronizer}/stage0_reg*}}]")
            lines.append(
                f"set_bus_skew -from [all_fanin -flat -startpoints_only [get_pins -of_objects "
                f"{to} -filter {{REF_PIN_NAME == D}}]] -to {to} {skew:.3f}")
    return "\n".join(lines)


def write_tree(build_dir: Path, *, board: str = "vcu118", qsfp: int | str = 1,
               rsfec: bool = True, hw_server: str = "localhost:3121", port2=None,
               **core) -> Path:
    """Elaborate the top (for cage ``qsfp``, 1 or 2, or ``"both"``; ``port2``: the second
    port's addresses, see :class:`~boards.vcu118_top.VCU118DualTop`) and write the complete
    Vivado build tree; returns the script to run."""
    platform_class, single, dual = BOARDS[board]
    platform = platform_class(toolchain="Vivado")
    if str(qsfp) == "both":
        top = dual(rsfec=rsfec, port2=port2, **core)
    elif port2:
        raise ValueError("port2's addresses need both cages (qsfp='both')")
    else:
        top = single(qsfp=int(qsfp), rsfec=rsfec, **core)
    cmacs = top.cmac_ips
    plan = platform.build(
        top, name=NAME, build_dir=str(build_dir), do_build=False,
        add_constraints=_clock_constraints(platform, [name for _, name in cmacs]),
        script_after_read="\n".join(cmac_ip_tcl(cage, name) for cage, name in cmacs),
        script_after_synth=_crossing_constraints(top.clock_crossing_fifos),
        script_before_bitstream=timing_gate_tcl(NAME))
    plan.extract(str(build_dir))
    write_jtag_scripts(build_dir, name=NAME, device=platform.device, hw_server=hw_server)
    return build_dir / f"build_{NAME}.sh"


def _bitstream(args) -> int:
    build_dir = _build_dir(args)
    core = {name: value for name, value in [
        ("mac", args.mac), ("ip", args.ip), ("netmask", args.netmask),
        ("gateway", args.gateway), ("qps", args.qps),
        ("retransmit_beats", args.retransmit_beats),
        ("retransmit_pages", args.retransmit_pages), ("messages", args.messages),
        ("message_slots", args.message_slots), ("generator_runs", args.generator_runs),
        ("path_mtu", PathMtu.from_bytes(args.path_mtu) if args.path_mtu else None),
    ] if value is not None}
    if args.source != "generator":
        example = {name: default if getattr(args, name) is None else getattr(args, name)
                   for name, default in EXAMPLE_DEFAULTS.items()}
        core.update(source=args.source, fragment_bytes=example["fragment_bytes"],
                    source_config={"slots": example["ring_slots"],
                                   "slot_bytes": example["fragment_bytes"]})
    port2 = {name: value for name, value in [
        ("mac", args.mac2), ("ip", args.ip2), ("netmask", args.netmask2),
        ("gateway", args.gateway2)] if value is not None}
    if port2 and args.qsfp != "both":
        print("error: --mac2, --ip2, --netmask2 and --gateway2 are port 2's, of --qsfp both",
              file=sys.stderr)
        return 2
    print(f"writing the Vivado build tree to {build_dir} …", file=sys.stderr, flush=True)
    script = write_tree(build_dir, board=args.board, qsfp=args.qsfp, rsfec=args.rsfec,
                        hw_server=args.hw_server, port2=port2 or None, **core)
    return run_vivado(script)


def run_vivado(script: Path) -> int:
    """Runs a written tree's ``script`` (from :func:`write_tree`) with Vivado; returns its
    exit code, and on a failure prints one ``error:`` line that says what to do."""
    build_dir = script.parent
    if not shutil.which("vivado"):
        print(f"error: Vivado is not on PATH; the complete build is written to {build_dir}: "
              f"on a machine with Vivado, source its settings64.sh and run "
              f"`sh {script.name}` in that directory, or rerun `make bitstream` with Vivado "
              f"on PATH",
              file=sys.stderr)
        return 1
    outputs = [build_dir / f"{NAME}.bit", build_dir / f"{NAME}.bin",
               build_dir / gate_report_name(NAME)]
    for output in outputs:
        output.unlink(missing_ok=True)
    run = subprocess.run(["sh", script.name], cwd=build_dir)
    failed = failed_checks(build_dir / gate_report_name(NAME))
    if run.returncode or failed:
        for output in outputs[:2]:
            output.unlink(missing_ok=True)
    if failed:
        print(f"error: timing failed after routing ({'; '.join(failed)}), no bitstream "
              f"written; the worst paths are in {build_dir / gate_report_name(NAME)}, the full "
              f"report in {build_dir / (NAME + '_timing.rpt')}", file=sys.stderr)
        return run.returncode or 1
    if run.returncode:
        print(f"error: Vivado failed ({run.returncode}); see {build_dir / (NAME + '.log')}",
              file=sys.stderr)
        return run.returncode
    print(f"bitstream: {build_dir / (NAME + '.bit')}", file=sys.stderr)
    return 0


def _hardware_manager(args) -> int:
    """``program`` and ``flash``: run the tree's ``<command>.tcl`` in the hardware manager."""
    build_dir = _build_dir(args)
    if not (build_dir / f"{NAME}.bit").exists():
        print(f"error: no bitstream at {build_dir / (NAME + '.bit')}; run `make bitstream` "
              f"first (with the same BOARD and QSFP)", file=sys.stderr)
        return 1
    script = f"{args.command}.tcl"
    if not shutil.which("vivado"):
        print(f"error: Vivado is not on PATH; source Vivado's settings64.sh (the hardware "
              f"manager loads the bitstream), or run `vivado -mode batch -source {script}` "
              f"in {build_dir} on a machine with Vivado and the board's JTAG",
              file=sys.stderr)
        return 1
    write_jtag_scripts(build_dir, name=NAME, device=BOARDS[args.board][0].device,
                       hw_server=args.hw_server, target=args.jtag_target)
    return subprocess.run(["vivado", "-mode", "batch", "-nojournal", "-log",
                           f"{args.command}.log", "-source", script],
                          cwd=build_dir).returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name, helptext in [("bitstream", "write the Vivado build tree and run it"),
                           ("program", "load the bitstream into the board over JTAG"),
                           ("flash", "write the bitstream to the board's configuration flash")]:
        command = commands.add_parser(name, help=helptext)
        command.add_argument("--board", choices=sorted(BOARDS), default="vcu118")
        command.add_argument("--qsfp", choices=CAGES, default="1",
                             help="QSFP28 cage, or both (a port on each; default: "
                                  "%(default)s)")
        command.add_argument("--build-dir", type=Path,
                             help="default: build/<board>-qsfp<qsfp>")
        command.add_argument("--hw-server", default="localhost:3121",
                             help="Vivado hw_server with the board's JTAG (default: %(default)s)")
        if name != "bitstream":
            command.add_argument("--jtag-target", default="",
                                 help="part of the JTAG target's name (the cable's serial "
                                      "number) when several boards are on the hw_server")
    bitstream = commands.choices["bitstream"]
    bitstream.add_argument("--rsfec", type=int, choices=(0, 1), default=1,
                           help="Clause 91 RS-FEC on the link, as on the peer (default: 1)")
    for option, helptext in [
            ("--mac", "the FPGA's MAC address (default 02:00:00:00:00:02)"),
            ("--ip", "the FPGA's IPv4 address (default 10.77.0.2)"),
            ("--netmask", "default 255.255.255.0"),
            ("--gateway", "default 0.0.0.0 (none)")]:
        bitstream.add_argument(option, help=helptext)
    for option, helptext in [
            ("--mac2", f"port 2's MAC address with --qsfp both (default {PORT2_ADDRESS['mac']})"),
            ("--ip2", f"port 2's IPv4 address with --qsfp both (default {PORT2_ADDRESS['ip']})"),
            ("--netmask2", "port 2's, with --qsfp both (default 255.255.255.0)"),
            ("--gateway2", "port 2's, with --qsfp both (default 0.0.0.0, none)")]:
        bitstream.add_argument(option, help=helptext)
    for option, helptext in [
            ("--qps", "queue pairs (default 16)"),
            ("--retransmit-beats", "64-byte beats of each QP's retransmit ring: the most of "
                                   "the pool it may hold (default 2048)"),
            ("--retransmit-pages", "4 KiB pages of the retransmit pool all QPs share "
                                   "(default 512)"),
            ("--messages", "unacknowledged messages per QP, its cap on the slot pool "
                           "(default 1024)"),
            ("--message-slots", "message slots all QPs share (default 4096)"),
            ("--generator-runs", "generator runs at once (default 4)")]:
        bitstream.add_argument(option, type=int, help=helptext)
    bitstream.add_argument("--path-mtu", type=int, choices=[mtu.bytes for mtu in PathMtu],
                           help="path MTU of QPs the CM opens when the host leaves it to us "
                                "(default 4096)")
    bitstream.add_argument("--source", choices=sorted(SOURCES), default="generator",
                           help="what drives the core's user request ports: nothing (the "
                                "generator) or the example event source (default: %(default)s)")
    for option, helptext in [
            ("--fragment-bytes", "bytes of the example source's fragments"),
            ("--ring-slots", "fragments the host's ring holds (its address comes with the "
                             "host's OPEN_QP)")]:
        name = option[2:].replace("-", "_")
        bitstream.add_argument(option, type=lambda text: int(text, 0), help=f"{helptext} "
                               f"(with --source example; default {EXAMPLE_DEFAULTS[name]})")
    args = parser.parse_args(argv)
    if args.command == "bitstream" and args.source == "generator" and any(
            getattr(args, name) is not None for name in EXAMPLE_DEFAULTS):
        parser.error("--fragment-bytes and --ring-slots are the example source's: add "
                     "--source example (SOURCE=example)")
    return _bitstream(args) if args.command == "bitstream" else _hardware_manager(args)


if __name__ == "__main__":
    sys.exit(main())
