"""The timing gate of the Vivado flow: no bitstream from a design that fails timing.

:func:`timing_gate_tcl` is Tcl that runs after routing (and the post-route
``phys_opt_design``), before ``write_bitstream``. It reads the worst slack of
the three checks of Vivado's Design Timing Summary: setup (WNS, the worst
path of max-delay analysis), hold (WHS, min-delay analysis) and pulse width
(WPWS, the clock pins' minimum period and pulse width). It writes one line
per check to ``<name>_timing_gate.rpt``, ``<check>: <slack> ns ok|FAIL``,
followed on a failure by the worst paths (slack, startpoint → endpoint,
clocks) or pulse-width violators, prints the same to the log, and, if any
check failed, stops the script with a Tcl error, which ends a batch Vivado
with a non-zero status before ``write_bitstream``. A design without timed
paths fails (its clocks are not constrained); one without pulse-width
checks passes that check.

:func:`failed_checks` reads that report back for ``make bitstream``.
"""

from pathlib import Path

__all__ = ["timing_gate_tcl", "gate_report_name", "failed_checks"]

#: How many failing paths of each check the gate lists.
WORST_PATHS = 5

_PROCEDURES = r"""
# The timing gate (boards/timing_gate.py): no bitstream unless the setup, hold and
# pulse-width slacks after routing are all >= 0.
proc timing_gate_worst_slack {delay_type} {
    # Worst slack of max (setup, recovery) or min (hold, removal) delay analysis; empty
    # without timed paths (get_property refuses an empty list).
    set worst [get_timing_paths -delay_type $delay_type -max_paths 1 -nworst 1]
    if {[llength $worst] == 0} {
        return ""
    }
    return [get_property SLACK $worst]
}

proc timing_gate_wpws {} {
    # WPWS: the ninth number of the Design Timing Summary's row of values (WNS TNS
    # TNS-failing TNS-total WHS THS THS-failing THS-total WPWS ...), two lines below its
    # header; NA without pulse-width checks.
    set lines [split [report_timing_summary -no_header -no_detailed_paths -return_string] "\n"]
    set header [lsearch -regexp $lines {WPWS\(ns\)}]
    if {$header < 0} {
        return ""
    }
    return [lindex [lindex $lines [expr {$header + 2}]] 8]
}

proc timing_gate_failing_paths {delay_type} {
    set lines {}
    foreach path [get_timing_paths -delay_type $delay_type -max_paths @WORST@ -nworst 1 \
                      -slack_lesser_than 0] {
        lappend lines [format "    %s ns  %s -> %s  (%s -> %s)" [get_property SLACK $path] \
            [get_property STARTPOINT_PIN $path] [get_property ENDPOINT_PIN $path] \
            [get_property STARTPOINT_CLOCK $path] [get_property ENDPOINT_CLOCK $path]]
    }
    return $lines
}

proc timing_gate {report} {
    # Writes one line per check to $report (and the log); returns the number of failures.
    set failures 0
    set out [open $report w]
    foreach {check slack details} [list \
            "setup (WNS)" [timing_gate_worst_slack max] {timing_gate_failing_paths max} \
            "hold (WHS)" [timing_gate_worst_slack min] {timing_gate_failing_paths min} \
            "pulse width (WPWS)" [timing_gate_wpws] \
                {split [report_pulse_width -all_violators -return_string] "\n"}] {
        if {[string is double -strict $slack]} {
            set ok [expr {$slack >= 0}]
            set line "$check: $slack ns"
        } elseif {$check eq "pulse width (WPWS)" && $slack in {"" NA}} {
            set ok 1
            set line "$check: no pulse-width checks"
        } else {
            set ok 0
            set line "$check: no timed paths (are the clocks constrained?)"
        }
        set lines [list "$line [expr {$ok ? "ok" : "FAIL"}]"]
        if {!$ok} {
            incr failures
            lappend lines {*}[eval $details]
        }
        foreach line $lines {
            puts $line
            puts $out $line
        }
    }
    close $out
    return $failures
}
"""


def gate_report_name(name: str) -> str:
    """The gate's report, next to Vivado's ``<name>_timing.rpt``."""
    return f"{name}_timing_gate.rpt"


def timing_gate_tcl(name: str) -> str:
    """The gate's procedures and their call, for ``script_before_bitstream``."""
    report = gate_report_name(name)
    return "\n".join([
        _PROCEDURES.replace("@WORST@", str(WORST_PATHS)).strip("\n"),
        f"if {{[timing_gate {report}]}} {{",
        f'    error "timing failed: no bitstream written; see {report} and {name}_timing.rpt"',
        "}",
    ])


def failed_checks(report: Path) -> list[str]:
    """The gate report's lines of the checks that failed (empty if none, or no report)."""
    if not report.exists():
        return []
    return [line for line in report.read_text().splitlines()
            if not line.startswith(" ") and line.endswith(" FAIL")]
