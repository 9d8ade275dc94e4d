"""The documentation site and the README.

The site is built as ``make docs`` builds it, with warnings as errors and every
cross-reference resolved, into a temporary directory. The tables and plots the pages
include (``docs/generated/``) are written by ``make bench`` and ``make resources``;
where a checkout has none yet, the build uses a placeholder for each, so that this
test judges the hand-written pages and the docstrings either way.
"""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("sphinx", reason="the docs need the dev extra (pip install -e '.[dev]')")

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

#: What the pages include from docs/generated/, relative to docs/.
GENERATED = {
    *(f"generated/bench/{name}.md" for name in (
        "tx_efficiency", "roce_goodput", "connectx_rate", "connectx_goodput", "latency", "dual",
        "pause", "dcqcn", "checker", "cm_setup", "connect_rate", "elaboration",
        "many_qps", "timer_scan", "qp_state")),
    "generated/resources/resources.md", "generated/resources/resources_dual.md",
    "generated/resources/scans.md", "generated/resources/engine.md",
    "generated/resources/top_1024.md", "generated/resources/top_4096.md",
    "generated/resources/blocks_1024.md",
    *(f"generated/waves/{port}.json" for port in (
        "work_request", "payload", "completion", "qp_write", "qp_status", "connection")),
}

#: A diagram that renders: a clock and nothing else.
PLACEHOLDER_WAVE = '{"signal": [{"name": "clk", "wave": "p..."}]}\n'

#: ``{include} path`` and ``:file: path`` lines of the pages.
INCLUDE = re.compile(r"^```\{include\}\s+(\S+)|^:file:\s+(\S+)", re.MULTILINE)


def included_files():
    """Paths (relative to docs/) of every file a page includes."""
    found = set()
    for page in DOCS.rglob("*.md"):
        if page.is_relative_to(DOCS / "generated"):
            continue
        for match in INCLUDE.finditer(page.read_text()):
            target = (page.parent / (match[1] or match[2])).resolve()
            found.add(target.relative_to(DOCS.resolve()).as_posix())
    return found


def test_the_pages_include_exactly_the_generated_files():
    included = included_files()
    assert {path for path in included if path.startswith("generated/")} == GENERATED


def test_the_site_builds_without_a_warning(tmp_path):
    source = tmp_path / "docs"
    shutil.copytree(DOCS, source, ignore=shutil.ignore_patterns("_build"))
    for path in GENERATED:
        target = source / path
        if target.exists():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.suffix == ".json":
            target.write_text(PLACEHOLDER_WAVE)
        else:
            target.write_text(f"*Not generated in this checkout: {path}.*\n")
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-n", "-q", "-b", "html",
         str(source), str(tmp_path / "html")],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "html" / "index.html").exists()


def test_the_readme_is_short_and_has_the_headline_markers():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    begin = readme.index("<!-- headline:begin -->")
    assert readme.index("<!-- headline:end -->") > begin


def test_no_issue_numbers_in_the_readme_or_the_docs():
    for path in [ROOT / "README.md", ROOT / "CHANGELOG.md", *DOCS.rglob("*.md")]:
        if path.is_relative_to(DOCS / "generated"):
            continue
        text = path.read_text()
        assert not re.search(r"issue [0-9]", text, re.IGNORECASE), path
