"""What the benches write for the documentation: their tables as Markdown fragments
and JSON, with the commit and machine they ran on, and their plots as SVG.

A bench builds :class:`Table` objects (the same ones print its tables on the
terminal, row by row) and hands them to :func:`write`, which writes
``docs/generated/<group>/<name>.md`` (MyST, to be included into a page: a
provenance line, then each table; no top-level heading) and ``<name>.json`` (the
same rows as numbers, for other tools), and saves its figures next to them as
SVG, referenced from the fragment by a relative path.

``python -m sim.bench.report --readme [FILE]`` rewrites the block between
``<!-- headline:begin -->`` and ``<!-- headline:end -->`` in README.md (or FILE)
with a table of headline figures taken from that JSON (:data:`HEADLINES`), each
with the commit it came from.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
GENERATED = ROOT / "docs" / "generated"
BENCH_DIR = GENERATED / "bench"
#: Written by the benches, so not a change of the tree they measure.
EXCLUDED_FROM_DIRTY = "docs/generated"

__all__ = ["Column", "Table", "Provenance", "provenance", "write", "headline_table",
           "rewrite_readme", "main"]


@dataclass(frozen=True)
class Column:
    """A column: the row key it shows, its heading, and how a value is shown: a
    format spec for ``format(value, spec)``, or a function of the whole row (a
    cell that joins several values). ``None`` shows as ``-``."""
    key: str
    title: str
    spec: str | Callable[[dict], str] = ""
    align: str = "right"

    def __post_init__(self):
        if self.align not in ("left", "right"):
            raise ValueError(f"align must be 'left' or 'right', not {self.align!r}")

    def cell(self, row: dict) -> str:
        if callable(self.spec):
            return self.spec(row)
        value = row.get(self.key)
        return "-" if value is None else format(value, self.spec)


@dataclass
class Table:
    """Rows of a bench's result: ``rows`` hold the values (numbers stay numbers in
    the JSON; a row may hold keys no column shows), ``columns`` how they print.
    ``name`` identifies the table in the JSON; ``caption`` and ``note`` are the
    Markdown before and after it."""
    name: str
    columns: Sequence[Column]
    rows: list[dict] = field(default_factory=list)
    caption: str = ""
    note: str = ""

    def header(self) -> str:
        """The heading and alignment lines of the Markdown table."""
        titles = "| " + " | ".join(column.title for column in self.columns) + " |"
        rule = "|" + "".join("---:|" if column.align == "right" else "---|"
                             for column in self.columns)
        return f"{titles}\n{rule}"

    def line(self, row: dict) -> str:
        return "| " + " | ".join(column.cell(row) for column in self.columns) + " |"

    def add(self, row: dict) -> str:
        """Appends ``row`` and returns its Markdown line (to print as it comes)."""
        self.rows.append(row)
        return self.line(row)

    def markdown(self) -> str:
        parts = [self.caption] if self.caption else []
        parts.append("\n".join([self.header(), *(self.line(row) for row in self.rows)]))
        if self.note:
            parts.append(self.note)
        return "\n\n".join(parts)

    def as_json(self) -> dict:
        return {"name": self.name, "caption": self.caption, "note": self.note,
                "columns": [{"key": column.key, "title": column.title}
                            for column in self.columns],
                "rows": self.rows}

    def find(self, **match) -> dict | None:
        return _find(self.rows, match)


def _find(rows: Iterable[dict], match: dict) -> dict | None:
    return next((row for row in rows
                 if all(row.get(key) == value for key, value in match.items())), None)


@dataclass(frozen=True)
class Provenance:
    """Where a result came from: the command, the commit (short hash; ``dirty`` when
    tracked files outside ``docs/generated`` had changes), the machine and the date."""
    command: str
    commit: str
    dirty: bool
    platform: str
    cpus: int
    date: str

    @property
    def revision(self) -> str:
        return self.commit + ("+dirty" if self.dirty else "")

    def line(self) -> str:
        return (f"Written by `{self.command}` at commit `{self.revision}` on "
                f"`{self.platform}` ({self.cpus} CPUs), {self.date}.")


def _git(*args: str) -> str | None:
    try:
        result = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True,
                                text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return result.stdout.strip()


def provenance(command: str | None = None) -> Provenance:
    """The provenance of a result computed now: ``command`` defaults to
    ``python -m <the main module> <its arguments>``."""
    if command is None:
        command = f"python -m {_main_module()} {shlex.join(sys.argv[1:])}".rstrip()
    commit = _git("rev-parse", "--short", "HEAD") or "unknown"
    status = _git("status", "--porcelain", "--untracked-files=no", "--", ".",
                  f":(exclude){EXCLUDED_FROM_DIRTY}")
    return Provenance(command=command, commit=commit, dirty=bool(status),
                      platform=platform.platform(), cpus=os.cpu_count() or 1,
                      date=datetime.date.today().isoformat())


def _main_module() -> str:
    main_module = sys.modules.get("__main__")
    spec = getattr(main_module, "__spec__", None)
    if spec is not None and spec.name:
        return spec.name
    return Path(sys.argv[0]).stem


def _fragment(origin: Provenance, tables: Sequence[Table], figures: Sequence[tuple[str, str]],
              text: str) -> str:
    parts = [origin.line()]
    if text:
        parts.append(text)
    parts += [table.markdown() for table in tables]
    parts += [f"![{caption}]({file})" for file, caption in figures]
    return "\n\n".join(parts) + "\n"


def write(name: str, tables: Sequence[Table], *, figures: dict | None = None, text: str = "",
          directory: Path = BENCH_DIR, origin: Provenance | None = None,
          extra: dict | None = None) -> Path:
    """Writes ``directory/<name>.md`` (the provenance line, ``text``, the tables, the
    figures) and ``<name>.json`` (the provenance and the tables' rows; ``extra`` too),
    and saves each of ``figures`` (``{"file.svg": (matplotlib figure, caption)}``) as
    ``directory/file.svg``. Returns the fragment's path."""
    origin = origin or provenance()
    directory.mkdir(parents=True, exist_ok=True)
    shown = []
    for file, (figure, caption) in (figures or {}).items():
        save_svg(figure, directory / file)
        shown.append((file, caption))
    fragment = directory / f"{name}.md"
    fragment.write_text(_fragment(origin, tables, shown, text))
    document = {"provenance": {"command": origin.command, "commit": origin.commit,
                               "dirty": origin.dirty, "platform": origin.platform,
                               "cpus": origin.cpus, "date": origin.date},
                "tables": [table.as_json() for table in tables],
                "figures": [file for file, _ in shown], **(extra or {})}
    (directory / f"{name}.json").write_text(json.dumps(document, indent=1) + "\n")
    print(f"wrote {_shown_path(fragment)}", file=sys.stderr)
    return fragment


def _shown_path(path: Path) -> str:
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


def save_svg(figure, path: Path) -> None:
    """Saves a matplotlib figure as SVG with no date and fixed element ids, so the
    same data gives the same file."""
    import matplotlib
    from matplotlib import pyplot

    with matplotlib.rc_context({"svg.hashsalt": "roce-endpoint"}):
        figure.savefig(path, format="svg", metadata={"Date": None})
    pyplot.close(figure)


def figure(rows: int = 1, columns: int = 1, size: tuple[float, float] = (7, 3.5)):
    """A matplotlib figure and its axes, drawn without a display."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot

    return pyplot.subplots(rows, columns, figsize=size)


# The headline tool.

BEGIN, END = "<!-- headline:begin -->", "<!-- headline:end -->"


@dataclass(frozen=True)
class Headline:
    """A figure of the headline table: ``show`` of the row of table ``table`` in
    ``group/source.json`` that has the values of ``match``."""
    label: str
    source: str
    table: str
    match: dict
    show: Callable[[dict], str]
    group: str = "bench"

    def value(self, generated: Path) -> tuple[str, str] | None:
        """(the value shown, the commit) or None when the JSON or the row is missing."""
        path = generated / self.group / f"{self.source}.json"
        try:
            document = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        table = next((t for t in document["tables"] if t["name"] == self.table), None)
        row = table and _find(table["rows"], self.match)
        if not row:
            return None
        try:
            shown = self.show(row)
        except (KeyError, TypeError, ValueError):
            return None
        origin = document["provenance"]
        return shown, origin["commit"] + ("+dirty" if origin["dirty"] else "")


def _rate(row: dict) -> str:
    return f"{row['mmsg_per_s']:.1f} Mmsg/s ({row['of_line']:.2%} of the line)"


#: The README's headline figures: where each comes from in docs/generated.
def _board_top(qps: int, name: str, target: str, *, delay: bool) -> list[Headline]:
    """A board top's headlines, from the table ``name`` writes: its resources, its deepest
    path and, with ``delay`` (its domains mapped alone), its core clock's slowest path in
    the delay model."""
    headlines = [
        Headline(f"VCU118Top ({qps:,} QPs), Yosys synth_xilinx", name, "resources",
                 {"target": target},
                 lambda row: f"{row['lut']:,} LUT, {row['ff']:,} FF, {row['bram36']:g} "
                             f"BRAM36, {row['uram']} URAM", group="resources"),
        Headline(f"VCU118Top ({qps:,} QPs), deepest path", name, "worst_paths",
                 {"target": target},
                 lambda row: f"{row['lut_levels']} LUT levels at {row['mhz']:g} MHz "
                             f"({row['domain']}; budget {row['budget']})", group="resources"),
    ]
    if delay:
        headlines.append(Headline(
            f"VCU118Top ({qps:,} QPs), core clock, slowest path (delay model)", name,
            "domains", {"target": target, "domain": "sync"},
            lambda row: f"{row['delay_ns']:.2f} ns against {row['period_ns']:.2f}"
                        f" ({'within' if row['within_period'] else 'over'})",
            group="resources"))
    return headlines


HEADLINES = [
    Headline("RDMA WRITE goodput, 4 KiB messages, one QP, 100GbE line", "roce_goodput",
             "one_qp", {"mtu": 4096, "size": 4096},
             lambda row: f"{row['line_gbps']:.2f} Gb/s ({row['of_theory']:.2%} of the "
                         "line's theory)"),
    Headline("64-byte WRITE rate, 1 QP, 1 µs round trip", "connectx_rate", "rate",
             {"verb": "RDMA_WRITE", "qps": 1, "round_trip_us": 1}, _rate),
    Headline("64-byte WRITE rate, 1 QP, 10 µs round trip", "connectx_rate", "rate",
             {"verb": "RDMA_WRITE", "qps": 1, "round_trip_us": 10}, _rate),
    Headline("64-byte WRITE rate, 16 QPs, 2 µs round trip", "connectx_rate", "rate",
             {"verb": "RDMA_WRITE", "qps": 16, "round_trip_us": 2}, _rate),
    Headline("64-byte WRITE latency, work request → first byte at the MAC", "latency",
             "latency", {"qps": 1},
             lambda row: f"{row['to_mac_max']} cycles ({row['to_mac_ns_max']:.0f} ns)"),
    Headline("64-byte WRITE latency, work request → completion, 1 µs round trip", "latency",
             "latency", {"qps": 1},
             lambda row: f"{row['to_completion_max']} cycles "
                         f"({row['to_completion_ns_max']:.0f} ns)"),
    Headline("4 KiB WRITE goodput, both ports of the two-cage board at once (2-QP cores)",
             "dual", "dual",
             {"port": "both"},
             lambda row: f"{row['gbps']:.2f} Gb/s ({row['of_theory']:.2%} of theory)"),
    Headline("64 KiB WRITE goodput at 1 % packet loss", "connectx_goodput", "goodput",
             {"loss": 0.01},
             lambda row: f"{row['gbps']:.2f} Gb/s ({row['of_theory']:.2%} of theory)"),
    Headline("PFC response, 64-byte WRITEs", "pause", "pause", {"kind": "PFC", "length": 64},
             lambda row: f"{row['max']} cycles at most"),
    Headline("IB CM connection setup, REQ → REP, endpoint idle", "cm_setup", "setup",
             {"peer": "idle"},
             lambda row: f"{row['max_latency']} cycles at most ({row['max_latency_ns']:.0f} ns)"),
    Headline("IB CM connections, 16 QPs, next REQ on each REP", "cm_setup", "setup",
             {"peer": "window"},
             lambda row: f"{row['connections_per_s'] / 1e6:.2f} M connections/s"),
    Headline("1,024 QPs opened through the CM, 64-byte WRITEs on all", "many_qps", "many_qps",
             {"qps": 1024},
             lambda row: f"{row['completed']:,} of {row['messages']:,} completed, "
                         f"{row['lost']} lost"),
    Headline("ACK timeout found at 4,096 QPs, worst of 64", "timer_scan", "timer_scan",
             {"qps": 4096},
             lambda row: f"{row['single_worst']} cycles late "
                         f"({row['single_worst_us']:.2f} µs)"),
    Headline("A QP's transport state (engine, intake, timer start; no counters)", "qp_state",
             "transport", {},
             lambda row: f"{row['bits']} bits ({row['bytes']:.1f} bytes; goal "
                         f"{row['goal_bytes']})"),
    Headline("Elaborating the 4,096-QP core (to RTLIL)", "elaboration", "elaboration",
             {"qps": 4096},
             lambda row: f"{row['seconds']:.0f} s, {row['peak_gb']:.1f} GB"),
    *(headline
      for qps, name, target, delay in ((16, "resources", "VCU118Top", False),
                                       (1024, "top_1024", "VCU118Top (1024 QPs)", True),
                                       (4096, "top_4096", "VCU118Top (4096 QPs)", True))
      for headline in _board_top(qps, name, target, delay=delay)),
]


def headline_table(generated: Path = GENERATED,
                   headlines: Sequence[Headline] = HEADLINES) -> tuple[str, list[str]]:
    """The Markdown table of the headline figures found, and the labels of those
    not found."""
    lines = ["| figure | value | from | commit |", "|---|---:|---|---|"]
    missing = []
    for headline in headlines:
        found = headline.value(generated)
        if found is None:
            missing.append(headline.label)
            continue
        value, revision = found
        page = f"docs/generated/{headline.group}/{headline.source}.md"
        lines.append(f"| {headline.label} | {value} | [{headline.source}]({page}) | "
                     f"`{revision}` |")
    return "\n".join(lines), missing


def rewrite_readme(path: Path, table: str) -> None:
    """Replaces what lies between the headline markers in ``path`` with ``table``."""
    text = path.read_text()
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.DOTALL)
    if len(pattern.findall(text)) != 1:
        raise ValueError(f"{path}: expected one {BEGIN} … {END} block")
    path.write_text(pattern.sub(lambda _: f"{BEGIN}\n{table}\n{END}", text))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.bench.report",
                                     description="The headline figures of docs/generated.")
    parser.add_argument("--readme", nargs="?", type=Path, const=ROOT / "README.md",
                        metavar="FILE", help="rewrite the headline block of FILE "
                                             "(default: README.md) instead of printing it")
    parser.add_argument("--generated", type=Path, default=GENERATED,
                        help="the generated tree (default: %(default)s)")
    args = parser.parse_args(argv)
    table, missing = headline_table(args.generated)
    for label in missing:
        print(f"note: no result for {label!r} in {args.generated}", file=sys.stderr)
    if args.readme is None:
        print(table)
        return 0
    try:
        rewrite_readme(args.readme, table)
    except (OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"rewrote the headline block of {args.readme}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
