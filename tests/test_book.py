"""Checks over the built book (run by `make test` after `make book`'s build step).

These read `_build/html` and `_build/build.log`; the browser and link tests
live in tests/test_site.py.
"""

import re
from pathlib import Path

import pytest
from bs4 import BeautifulSoup

ROOT = Path(__file__).resolve().parents[1]
HTML = ROOT / "_build" / "html"
LOG = ROOT / "_build" / "build.log"

pytestmark = [
    pytest.mark.built_book,
    pytest.mark.skipif(not (HTML / "index.html").exists(), reason="the book is not built: run `make book`"),
]


def toc_chapters() -> list[str]:
    """Document names listed in _toc.yml (root first), read without a YAML dependency."""
    text = (ROOT / "_toc.yml").read_text()
    root = re.search(r"^root:\s*(\S+)", text, re.M).group(1)
    return [root] + re.findall(r"^\s*-\s*file:\s*(\S+)", text, re.M)


def test_build_log_reports_no_warning():
    log = LOG.read_text(errors="replace")
    assert "build succeeded." in log, "the last build did not succeed"
    m = re.search(r"build succeeded, (\d+) warnings?", log)
    assert m is None, f"the build reported {m.group(1)} warnings"


@pytest.mark.parametrize("doc", toc_chapters())
def test_every_toc_entry_is_a_built_page(doc):
    page = HTML / f"{doc}.html"
    assert page.exists(), f"{page} missing"
    assert page.stat().st_size > 5_000


@pytest.mark.parametrize("doc", [d for d in toc_chapters() if re.search(r"/0[1-6]_", d)])
def test_chapters_were_executed_and_glue_resolved(doc):
    html = (HTML / f"{doc}.html").read_text()
    # Executed code cells leave output areas; an unexecuted page has none.
    assert html.count('class="cell_output') >= 1, f"{doc}: no executed output"
    # No error output, no unresolved glue role left as text.
    assert "Traceback (most recent call last)" not in html
    assert 'class="output traceback' not in html
    # A glue role that did not resolve is left in the prose as its source text;
    # code listings may mention the role legitimately, so they are taken out first.
    soup = BeautifulSoup(html, "html.parser")
    for listing in soup.select("pre, code"):
        listing.decompose()
    prose = soup.get_text()
    assert "{glue" not in prose and "glue:text" not in prose


def test_intro_links_every_chapter():
    html = (HTML / "book" / "intro.html").read_text()
    for doc in toc_chapters()[1:]:
        name = Path(doc).name
        if name.startswith("0"):
            assert f'href="{name}.html' in html, f"intro does not link {name}"
