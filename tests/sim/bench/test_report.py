"""sim/bench/report.py: tables rendered as Markdown, the provenance line with the
commit of a real git tree (dirty or not), the fragment and JSON a bench writes, and
the README's headline block rewritten from that JSON."""

import json
import re
import subprocess

import pytest

from sim.bench import report
from sim.bench.report import Column, Provenance, Table

ORIGIN = Provenance(command="python -m sim.bench.example --fast", commit="abc1234",
                    dirty=False, platform="Linux-6.1-x86_64", cpus=2, date="2026-01-02")


def example() -> Table:
    table = Table("example", [
        Column("verb", "verb", align="left"), Column("size", "message"),
        Column("gbps", "Gb/s", ".2f"), Column("share", "of line", ".1%"),
        Column("span", "range", lambda row: f"{row['low']}-{row['high']}")],
        caption="An example.", note="A note.")
    table.add({"verb": "WRITE", "size": 64, "gbps": 39.526, "share": 0.9991, "low": 1,
               "high": 2})
    table.add({"verb": "SEND", "size": 4096, "gbps": None, "share": 1.0, "low": 3, "high": 4})
    return table


def test_a_table_renders_as_markdown():
    assert example().markdown() == (
        "An example.\n\n"
        "| verb | message | Gb/s | of line | range |\n"
        "|---|---:|---:|---:|---:|\n"
        "| WRITE | 64 | 39.53 | 99.9% | 1-2 |\n"
        "| SEND | 4096 | - | 100.0% | 3-4 |\n\n"
        "A note.")


def test_add_returns_the_row_as_printed():
    table = Table("t", [Column("a", "A", "03d")])
    assert table.add({"a": 7, "hidden": 1}) == "| 007 |"
    assert table.rows == [{"a": 7, "hidden": 1}]
    assert table.find(hidden=1) == {"a": 7, "hidden": 1} and table.find(a=8) is None


def test_a_column_aligns_only_left_or_right():
    with pytest.raises(ValueError, match="center"):
        Column("a", "A", align="center")


def test_the_provenance_line_names_command_commit_machine_and_date():
    assert ORIGIN.line() == ("Written by `python -m sim.bench.example --fast` at commit "
                             "`abc1234` on `Linux-6.1-x86_64` (2 CPUs), 2026-01-02.")
    dirty = Provenance(**{**ORIGIN.__dict__, "dirty": True})
    assert "`abc1234+dirty`" in dirty.line()


def _git(tree, *args):
    subprocess.run(["git", "-C", str(tree), *args], check=True, capture_output=True)


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """A git tree with one commit, standing in for the repository."""
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "config", "user.email", "bench@example.com")
    _git(tmp_path, "config", "user.name", "bench")
    (tmp_path / "code.py").write_text("x = 1\n")
    (tmp_path / "docs" / "generated").mkdir(parents=True)
    (tmp_path / "docs" / "generated" / "old.md").write_text("old\n")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-qm", "one")
    monkeypatch.setattr(report, "ROOT", tmp_path)
    return tmp_path


def test_provenance_takes_the_commit_and_sees_changes_outside_generated(tree):
    head = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
                          check=True, capture_output=True, text=True).stdout.strip()
    origin = report.provenance("python -m x")
    assert (origin.commit, origin.dirty) == (head, False)
    assert f"at commit `{head}` on" in origin.line()
    (tree / "docs" / "generated" / "old.md").write_text("rewritten by a bench\n")
    (tree / "untracked.txt").write_text("")
    assert not report.provenance("python -m x").dirty
    (tree / "code.py").write_text("x = 2\n")
    origin = report.provenance("python -m x")
    assert origin.dirty and f"`{head}+dirty`" in origin.line()


def test_write_gives_the_fragment_and_the_json(tmp_path):
    fragment = report.write("example", [example()], directory=tmp_path, origin=ORIGIN,
                            text="Some words.")
    text = fragment.read_text()
    assert text.startswith(ORIGIN.line() + "\n\nSome words.\n\nAn example.\n\n| verb |")
    assert not re.search(r"^# ", text, re.MULTILINE)
    document = json.loads((tmp_path / "example.json").read_text())
    assert document["provenance"]["commit"] == "abc1234"
    (table,) = document["tables"]
    assert table["name"] == "example" and table["rows"][0]["gbps"] == 39.526


def test_write_saves_figures_as_svg_next_to_the_fragment(tmp_path):
    figure, axis = report.figure()
    axis.plot([1, 2], [3, 4])
    fragment = report.write("plotted", [example()], directory=tmp_path, origin=ORIGIN,
                            figures={"plotted.svg": (figure, "A line")})
    assert fragment.read_text().endswith("![A line](plotted.svg)\n")
    svg = (tmp_path / "plotted.svg").read_text()
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg
    assert "dc:date" not in svg


def test_the_readme_headline_block_is_rewritten_from_the_json(tmp_path):
    generated = tmp_path / "generated"
    goodput = Table("one_qp", [Column("line_gbps", "Gb/s")])
    goodput.add({"mtu": 4096, "size": 4096, "line_gbps": 97.684, "of_theory": 1.0002})
    goodput.add({"mtu": 1024, "size": 4096, "line_gbps": 92.27, "of_theory": 1.0})
    report.write("roce_goodput", [goodput], directory=generated / "bench", origin=ORIGIN)
    readme = tmp_path / "README.md"
    readme.write_text("# Title\n\nBefore.\n\n<!-- headline:begin -->\nstale\n"
                      "<!-- headline:end -->\n\nAfter.\n")
    assert report.main(["--readme", str(readme), "--generated", str(generated)]) == 0
    text = readme.read_text()
    assert text.startswith("# Title\n\nBefore.\n\n<!-- headline:begin -->\n| figure |")
    assert text.endswith("<!-- headline:end -->\n\nAfter.\n")
    assert "stale" not in text
    assert ("| RDMA WRITE goodput, 4 KiB messages, one QP, 100GbE line | 97.68 Gb/s (100.02% "
            "of the line's theory) | [roce_goodput](docs/generated/bench/roce_goodput.md) | "
            "`abc1234` |") in text
    assert "VCU118Top" not in text          # no resources JSON: no row
    resources = Table("resources", [Column("lut", "LUT")], rows=[
        {"target": "VCU118Top", "lut": 46755, "ff": 53983, "bram36": 67.5, "uram": 57}])
    worst = Table("worst_paths", [Column("summary", "worst")], rows=[
        {"target": "VCU118Top", "lut_levels": 12, "mhz": 322.265625, "domain": "cmac",
         "budget": 6}])
    report.write("resources", [resources, worst], directory=generated / "resources",
                 origin=Provenance(**{**ORIGIN.__dict__, "commit": "def5678", "dirty": True}))
    assert report.main(["--readme", str(readme), "--generated", str(generated)]) == 0
    text = readme.read_text()
    assert ("| VCU118Top (16 QPs), Yosys synth_xilinx | 46,755 LUT, 53,983 FF, 67.5 BRAM36, "
            "57 URAM | [resources](docs/generated/resources/resources.md) | `def5678+dirty` |"
            ) in text
    assert "| 12 LUT levels at 322.266 MHz (cmac; budget 6) |" in text
    assert "slowest path (delay model)" not in text     # the 16-QP top has no such row
    domains = Table("domains", [Column("delay_ns", "ns")], rows=[
        {"target": "VCU118Top (4096 QPs)", "domain": "sync", "delay_ns": 4.012,
         "period_ns": 4.0, "within_period": False}])
    report.write("top_4096", [domains], directory=generated / "resources", origin=ORIGIN)
    assert report.main(["--readme", str(readme), "--generated", str(generated)]) == 0
    text = readme.read_text()
    assert ("| VCU118Top (4,096 QPs), core clock, slowest path (delay model) | 4.01 ns "
            "against 4.00 (over) | [top_4096](docs/generated/resources/top_4096.md) | "
            "`abc1234` |") in text
    # A second run gives the same file.
    assert report.main(["--readme", str(readme), "--generated", str(generated)]) == 0
    assert readme.read_text() == text


def test_a_readme_without_one_headline_block_is_an_error(tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text("no markers\n")
    assert report.main(["--readme", str(readme), "--generated", str(tmp_path)]) == 1
    assert "expected one" in capsys.readouterr().err
    assert readme.read_text() == "no markers\n"
