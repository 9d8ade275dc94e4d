"""Sphinx configuration of the documentation site (``make docs``).

Pages are Markdown (MyST); API pages come from the docstrings through autodoc;
figures and tables come from ``docs/generated/`` (written by ``make bench`` and
``make resources``) and are included, never typed in. The pages include each fragment
with ``:relative-images:``, so a plot a fragment shows is named relative to the
fragment itself (``![...](tx_efficiency.svg)`` beside ``tx_efficiency.md``).
"""

from pathlib import Path

import json5
from docutils.parsers.rst import directives
from sphinx.ext.napoleon import Config as NapoleonConfig
from sphinx.ext.napoleon import NumpyDocstring
from sphinxcontrib.yowasp_wavedrom import WaveDromDirective, wavedrom_diagram

project = "roce-endpoint"
author = "the roce-endpoint authors"
copyright = "the roce-endpoint authors"
release = "0.1.0"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinxcontrib.yowasp_wavedrom",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
# Fragments that pages include; each is read through the page that includes it.
exclude_patterns = ["generated/**/*.md", "diagrams/**"]

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

html_theme = "furo"
html_title = "roce-endpoint"
html_static_path = []

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"members": True, "undoc-members": True}

nitpicky = True
# A return annotation such as ``-> bytes`` is looked up loosely and also matches every
# attribute named ``bytes`` (``PathMtu.bytes``, ``Status.bytes``): "more than one target".
suppress_warnings = ["ref.python"]
# The site is built without network access, so there are no intersphinx inventories:
# references to the standard library, numpy, Amaranth and pyverbs stay unresolved.
# Everything of this project's own must resolve.
nitpick_ignore_regex = [
    (r"py:.*", r"(int|str|bytes|bool|float|object|None|memoryview|type|Exception|"
               r"ValueError|TypeError|OSError)"),
    (r"py:.*", r"(collections\.abc|typing|enum|dataclasses|socket|threading|pathlib|argparse|"
               r"io|numpy|np|amaranth|pyverbs)(\..*)?"),
    (r"py:.*", r"(Callable|Iterator|Iterable|Sequence|Protocol|Path|IntEnum|Enum)"),
]


class WaveDromFile(WaveDromDirective):
    """The ``wavedrom`` directive, also with a ``:file:`` option: the WaveJSON diagram
    read from that file (relative to the page) instead of the directive's content.

    ``docs/generated/waves/*.json`` are written by a command, so the pages name the
    files rather than copy them.
    """

    has_content = True
    option_spec = {"file": directives.path}

    def run(self):
        if "file" not in self.options:
            return super().run()
        env = self.state.document.settings.env
        relative, absolute = env.relfn2path(self.options["file"], env.docname)
        env.note_dependency(relative)
        try:
            source = json5.loads(Path(absolute).read_text(), allow_duplicate_keys=False)
        except (OSError, ValueError) as error:
            return [self.reporter.error(f"WaveJSON file {relative}: {error}",
                                        line=self.lineno)]
        node = wavedrom_diagram(self.block_text, name=self.arguments[0], src=source,
                                loc=f"{absolute}:1")
        self.add_name(node)
        return [node]


NUMPY_SECTIONS = NapoleonConfig(napoleon_google_docstring=False, napoleon_use_rtype=False)


def numpy_sections(app, what, name, obj, options, lines):
    """Numpy-style sections (``Parameters``) in the docstrings of classes and functions.

    Not in ``#:`` comments of constants and attributes: Napoleon would read their
    first ``text: more text`` as a type and a description.
    """
    if what in ("class", "exception", "function", "method"):
        lines[:] = NumpyDocstring(lines, NUMPY_SECTIONS, app, what, name, obj, options).lines()


def setup(app):
    app.connect("autodoc-process-docstring", numpy_sections)
    app.add_directive("wavedrom", WaveDromFile, override=True)
