"""Where the built site is, and which pages it must have: shared by the tests
of the built book (tests/test_book.py, tests/test_site.py), the frame test
and the JupyterLab tests; and what of a chapter's Markdown is not prose."""

from __future__ import annotations

import functools
import json
import os
import posixpath
import re
from pathlib import Path

import pytest
import yaml
from bs4 import BeautifulSoup

ROOT = Path(__file__).resolve().parents[1]
# LNORM_SITE_DIR checks a build made elsewhere (jupyter-book --path-output).
SITE = Path(os.environ.get("LNORM_SITE_DIR", ROOT / "_build" / "html")).resolve()

# Marks every test of the built site: it needs a build, and skips without one.
needs_site = [
    pytest.mark.built_book,
    pytest.mark.skipif(
        not (SITE / "index.html").is_file(),
        reason=f"site not built: no {SITE / 'index.html'} (run `make book` first)",
    ),
]


# MyST Markdown that is not prose: code (fences, spans, and with them the
# roles, {eval}`...` and {cite}`...`), then math, display before inline.
CODE = re.compile(r"```.*?```|``.*?``|`[^`]*`", re.S)
DISPLAY_MATH = re.compile(r"\$\$.*?\$\$", re.S)
INLINE_MATH = re.compile(r"\$[^$]+\$")


def executed_cells(doc: str) -> list[dict] | None:
    """The cells of the notebook the build executed for ``doc``, or None for a
    page that is not a notebook."""
    path = SITE / "_sources" / f"{doc}.ipynb"
    if not path.is_file():
        return None
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def toc_docnames() -> list[str]:
    """Docnames of every page in ``_toc.yml``, root first, in reading order."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    names = [toc["root"]]

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if "file" in node:
                names.append(str(node["file"]))
            for key in ("parts", "chapters", "sections"):
                walk(node.get(key, []))
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk({key: toc[key] for key in ("parts", "chapters") if key in toc})
    return [posixpath.splitext(name)[0] for name in names]


@functools.lru_cache(maxsize=None)
def built(relpath: str) -> BeautifulSoup:
    """One built HTML file (``relpath`` in the site), parsed once per test session:
    the site tests and the frame test share it (do not modify it)."""
    return BeautifulSoup((SITE / relpath).read_text(encoding="utf-8"), "html.parser")
