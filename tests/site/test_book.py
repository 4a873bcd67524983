"""Checks over the built book (run by `make test` after `make book`'s build step).

These read the built site (`_build/html`, or LNORM_SITE_DIR) and
`_build/build.log`; the browser and link tests live in tests/test_site.py.
"""

import re
from pathlib import Path

import pytest
from bs4 import BeautifulSoup
from built_site import ROOT, SITE, needs_site, toc_docnames

LOG = ROOT / "_build" / "build.log"

pytestmark = needs_site


def test_build_log_reports_no_warning():
    log = LOG.read_text(errors="replace")
    assert "build succeeded." in log, "the last build did not succeed"
    m = re.search(r"build succeeded, (\d+) warnings?", log)
    assert m is None, f"the build reported {m.group(1)} warnings"


@pytest.mark.parametrize("doc", toc_docnames())
def test_every_toc_entry_is_a_built_page(doc):
    page = SITE / f"{doc}.html"
    assert page.exists(), f"{page} missing"
    assert page.stat().st_size > 5_000


def executable_pages() -> list[str]:
    """Pages of ``_toc.yml`` whose source has code cells: the build runs them."""
    return [
        d for d in toc_docnames() if "{code-cell}" in (ROOT / f"{d}.md").read_text()
    ]


def test_every_chapter_is_executable():
    # A chapter added to _toc.yml is checked below without editing this file.
    assert {
        d for d in toc_docnames() if re.search(r"/0\d", d) and "references" not in d
    } <= set(executable_pages())


@pytest.mark.parametrize("doc", executable_pages())
def test_chapters_were_executed_and_their_numbers_resolved(doc):
    html = (SITE / f"{doc}.html").read_text()
    # Executed code cells leave output areas; an unexecuted page has none.
    assert html.count('class="cell_output') >= 1, f"{doc}: no executed output"
    # No error output, no unresolved glue role left as text.
    assert "Traceback (most recent call last)" not in html
    assert 'class="output traceback' not in html
    # A role that did not resolve is left in the prose as its source text, or
    # as the glue name book/_ext/lnorm_eval.py gave it (the build also warns,
    # and warnings fail it); a float or NumPy scalar would show its repr
    # (book/prose.py's inline refuses them in the build). Code listings may
    # mention the roles legitimately, so they are taken out first.
    soup = BeautifulSoup(html, "html.parser")
    for listing in soup.select("pre, code"):
        listing.decompose()
    prose = soup.get_text()
    for raw in ("{glue", "glue:text", "{eval", "lnorm_eval_", "np.float", "np.int"):
        assert raw not in prose, f"{doc}: {raw!r} in the prose"


def test_intro_links_every_chapter():
    html = (SITE / "book" / "intro.html").read_text()
    for doc in toc_docnames()[1:]:
        name = Path(doc).name
        if name.startswith("0"):
            assert f'href="{name}.html' in html, f"intro does not link {name}"
