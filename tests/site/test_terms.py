"""The glossary of terms (book/terms.md) and the chapters' links to it.

Every word of ``CHECKED`` is defined on the terms page, and each page of the
book that uses the word links it to its entry at its first use: the first
time the word appears in the page's prose (headings, code cells, code and
math left out), it is the text of a link to ``terms.html#term-...``.

A page uses a word when the word's entry names the page's chapter label, or,
for a word with one meaning only (``UNAMBIGUOUS``), when it appears anywhere
in the page's prose. Words such as "block" or "floor" have other meanings in
other chapters ("a transformer block", "a bug is a floor"), so they count only
in the chapters their entry names.

Static checks of the built HTML: no browser.
"""

from __future__ import annotations

import functools
import re

import pytest
from bs4 import BeautifulSoup, NavigableString
from built_site import ROOT, SITE, needs_site, toc_docnames

pytestmark = needs_site

TERMS_PAGE = "book/terms"

# Term (as written in the glossary) -> how a chapter's prose spells it.
CHECKED = {
    "ulp": r"\bulps?\b",
    "SM": r"\bSMs?\b",
    "warp slot": r"\bwarp slots?\b",
    "occupancy": r"\boccupancy\b",
    "GPC": r"\bGPCs?\b",
    "PTX": r"\bPTX\b",
    "NVRTC": r"\bNVRTC\b",
    "cp.async": r"\bcp\.async\b",
    "write-allocate": r"\bwrite-allocate\b",
    "roofline": r"\brooflines?\b",
    "Sterbenz's lemma": r"\bSterbenz\b",
    "DRAM": r"\bDRAM\b",
    "HBM": r"\bHBM\d?e?\b",
    "L2": r"\bL2\b",
    "warp": r"\bwarps?\b(?! slots?\b)",
    "block": r"\bblocks?\b",
    "copy floor": r"\bfloor\b",
    "pairwise summation": r"\bpairwise\b",
    "Little's law": r"\bLittle's law\b",
    "arithmetic intensity": r"\barithmetic intensity\b",
    "last-level cache": r"\blast-level cache\b",
    "shared memory": r"\bshared memory\b",
    "atomic add": r"\batomic",
    "register": r"\bregisters?\b",
    "thread": r"\bthreads?\b",
}
# Words with one meaning in the whole book: used wherever they appear.
UNAMBIGUOUS = {
    "ulp", "SM", "warp slot", "occupancy", "GPC", "PTX", "NVRTC", "cp.async",
    "write-allocate", "roofline", "Sterbenz's lemma", "DRAM", "HBM", "L2",
    "Little's law", "arithmetic intensity", "last-level cache",
}
# Defined because readers meet them in the GPU code and the literature, though
# no chapter's prose says them now: their entries name the chapter whose code
# does.
NOT_IN_PROSE = {"GPC", "HBM"}
# Not prose: code, math, and headings (a link does not belong in a title).
SKIP_TAGS = {"script", "style", "pre", "code", "h1", "h2", "h3", "h4", "h5", "h6"}
SKIP_CLASSES = {"cell", "math", "MathJax", "headerlink"}

PAGES = [p for p in toc_docnames() if p == "book/intro" or re.match(r"book/0[1-6]", p)]


@functools.lru_cache(maxsize=None)
def soup(docname: str) -> BeautifulSoup:
    html = (SITE / f"{docname}.html").read_text(encoding="utf-8")
    return BeautifulSoup(html, "html.parser")


def plain(text: str) -> str:
    """Text with Sphinx's typographic apostrophes made plain again."""
    return text.replace("\u2019", "'")


@functools.lru_cache(maxsize=None)
def entries() -> dict[str, tuple[str, frozenset[str]]]:
    """Term -> (its anchor on the terms page, the chapter labels its entry names)."""
    found = {}
    for dt in soup(TERMS_PAGE).select("dl.glossary dt"):
        dd = dt.find_next_sibling("dd")
        labels = {
            a["href"].split("#", 1)[1]
            for a in dd.select("a.reference.internal[href*='#ch-']")
        }
        name = "".join(
            t for t in dt.find_all(string=True)
            if not t.find_parent(class_="headerlink"))
        found[plain(name).strip()] = (
            dt["id"], frozenset(labels))
    return found


def label_page(label: str) -> str:
    """The page a chapter label such as ``ch-gpu`` is on."""
    for page in PAGES:
        if f"({label})=" in (ROOT / f"{page}.md").read_text(encoding="utf-8"):
            return page
    raise AssertionError(f"no page defines the label {label}")


def prose_nodes(page: BeautifulSoup):
    """The page's prose text nodes in reading order."""
    main = page.select_one("article") or page
    for text in main.find_all(string=True):
        if not isinstance(text, NavigableString):
            continue
        skip = False
        for parent in text.parents:
            if parent is main:
                break
            classes = set(parent.get("class") or [])
            if parent.name in SKIP_TAGS or SKIP_CLASSES & classes:
                skip = True
                break
        if not skip:
            yield text


def first_use(docname: str, pattern: str):
    """The first prose text node of the page that contains the word, or None."""
    word = re.compile(pattern)
    return next((t for t in prose_nodes(soup(docname)) if word.search(plain(t))), None)


def links_to(text: NavigableString, anchor: str) -> bool:
    link = text.find_parent("a")
    return bool(link) and link.get("href", "").endswith(f"terms.html#{anchor}")


def test_terms_page_defines_every_checked_word() -> None:
    missing = set(CHECKED) - set(entries())
    assert not missing, f"book/terms.md does not define {sorted(missing)}"


def test_every_entry_names_a_chapter() -> None:
    for term, (_, labels) in entries().items():
        for label in labels:
            label_page(label)
    bare = [t for t, (_, labels) in entries().items() if not labels]
    assert not bare, f"entries that name no chapter: {bare}"


@pytest.mark.parametrize("docname", PAGES)
def test_chapter_links_each_term_at_its_first_use(docname: str) -> None:
    problems = []
    for term, pattern in CHECKED.items():
        anchor, labels = entries()[term]
        named = docname in {label_page(label) for label in labels}
        text = first_use(docname, pattern)
        if text is None:
            if named and term not in NOT_IN_PROSE:
                problems.append(f"{term}: the entry names this chapter, "
                                "which never uses the word")
            continue
        if not (named or term in UNAMBIGUOUS):
            continue
        if not links_to(text, anchor):
            problems.append(
                f"{term}: first used unlinked in {str(text).strip()[:70]!r};"
                f" write {{term}}`{term}` there")
    assert not problems, f"{docname}: " + "; ".join(problems)
