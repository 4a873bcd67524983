"""Every chapter has the frame that ../shared/TEACHING.md asks for.

Over the sources (no build needed):

* a visible code cell has no line over 79 characters, nor has the package
  source it prints with ``inspect.getsource(module.name)``;
* the prose shows numbers with ``{eval}`` only: no ``glue(`` call, no
  ``{glue}`` role (the book's build turns ``{eval}`` into glue itself);
* no ``{code-cell}`` sits inside a ``{solution}`` directive, where Jupyter
  Book drops it silently (use ``solution-start`` / ``solution-end``);
* the prose quotes at most 25 computed values.

Over the built site (marker ``built_book``):

* the chapter opens with *In this chapter you will learn* (3 to 5 bullets)
  and *You need*, before its first section;
* it has a section *What to remember* and a section *Exercises* with at least
  4 exercises, each with a solution collapsed in a dropdown;
* every code cell of a gated solution was executed during the build, ends in
  an ``assert``, and shows on the page inside its solution.

Every chapter of ``_toc.yml`` is covered; the chapters in ``NOT_YET_CONVERTED``
are exempt until the issue that rewrites them takes them off the list.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import re

import jupytext
import pytest
from bs4 import BeautifulSoup
from built_site import (
    CODE,
    DISPLAY_MATH,
    INLINE_MATH,
    ROOT,
    SITE,
    built,
    executed_cells,
    needs_site,
    toc_docnames,
)

# Pages of the table of contents that are not chapters: no frame.
NOT_CHAPTERS = {
    "book/intro", "book/07_references", "book/glossary", "book/terms"}


def is_chapter(doc: str) -> bool:
    """A chapter of the book, not a front or back page or the API appendix."""
    return doc not in NOT_CHAPTERS and not doc.startswith("book/api/")


# Chapters still in the first edition's form; each issue that rewrites one
# removes it here.
NOT_YET_CONVERTED: set[str] = set()

MAX_LINE = 79
MAX_PROSE_VALUES = 25
HIDDEN_TAGS = {"remove-cell", "remove-input"}
EVAL_ROLE = re.compile(r"(?<!`)\{eval\}`")
GLUE_ROLE = re.compile(r"\{glue(?::[a-z]+)?\}`")
# A listing of the package's own source: ``inspect.getsource(fused.backward)``,
# ``fused`` being a module of lnorm.
PRINTED_SOURCE = re.compile(r"inspect\.getsource\((\w+)\.(\w+)\)")


def chapters() -> list[str]:
    return [d for d in toc_docnames() if is_chapter(d)]


def converted() -> list[str]:
    return [d for d in chapters() if d not in NOT_YET_CONVERTED]


@functools.lru_cache(maxsize=None)
def read_notebook(doc: str):
    """The chapter as jupytext reads it, once per session (do not modify it)."""
    return jupytext.read(ROOT / f"{doc}.md")


def visible_code_cells(nb) -> list[tuple[int, str]]:
    """(index, source) of the code cells a reader sees on the page."""
    cells = []
    for i, cell in enumerate(nb.cells):
        tags = set(cell.get("metadata", {}).get("tags", []))
        if cell.cell_type == "code" and not (tags & HIDDEN_TAGS):
            cells.append((i, cell.source))
    return cells


def gated_solution_cells(cells) -> list[list[int]]:
    """Indices of the code cells of each gated solution, in order.

    A gated solution opens in a Markdown cell with ``{solution-start}`` and
    closes in a later one with ``{solution-end}``; jupytext cuts its code
    cells out between them.
    """
    solutions: list[list[int]] = []
    inside = False
    for i, cell in enumerate(cells):
        if cell["cell_type"] == "markdown":
            text = "".join(cell["source"])
            starts = [m.start() for m in re.finditer(r"\{solution-start\}", text)]
            ends = [m.start() for m in re.finditer(r"\{solution-end\}", text)]
            for _, kind in sorted(
                [(s, "start") for s in starts] + [(e, "end") for e in ends]
            ):
                if kind == "start":
                    solutions.append([])
                    inside = True
                else:
                    inside = False
        elif cell["cell_type"] == "code" and inside:
            solutions[-1].append(i)
    return solutions


# --- Over the sources ------------------------------------------------------


def test_not_yet_converted_lists_only_chapters():
    assert NOT_YET_CONVERTED <= set(chapters()), "a stale entry in NOT_YET_CONVERTED"


def printed_sources(source: str) -> list[tuple[str, str]]:
    """(what, text) of each lnorm function a cell prints the source of."""
    found = []
    for module, name in PRINTED_SOURCE.findall(source):
        obj = getattr(importlib.import_module(f"lnorm.{module}"), name)
        found.append((f"{module}.{name}", inspect.getsource(obj)))
    return found


def test_printed_sources_are_found():
    cell = "print(inspect.getsource(fused.backward))"
    (what, text), = printed_sources(cell)
    assert what == "fused.backward" and "def backward(" in text


@pytest.mark.parametrize("doc", converted())
def test_visible_code_lines_fit_the_page(doc):
    listings = [
        (f"cell {i}", source)
        for i, source in visible_code_cells(read_notebook(doc))
    ]
    listings += [
        (f"cell {i}, the source of {what}", text)
        for i, source in visible_code_cells(read_notebook(doc))
        for what, text in printed_sources(source)
    ]
    long = [
        f"{where}: {line!r} ({len(line)} characters)"
        for where, source in listings
        for line in source.splitlines()
        if len(line) > MAX_LINE
    ]
    assert not long, (
        f"{doc}: visible code lines over {MAX_LINE} characters:\n" + "\n".join(long)
    )


@pytest.mark.parametrize("doc", converted())
def test_numbers_reach_the_prose_through_eval_only(doc):
    # Glue shows in JupyterLab as a bare name; {eval} shows the value there and,
    # through book/_ext/lnorm_eval.py, on the site.
    nb = read_notebook(doc)
    code = [(i, c.source) for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    calls = [i for i, source in code if "glue(" in source]
    roles = [
        m.group(0)
        for c in nb.cells
        if c.cell_type == "markdown"
        for m in GLUE_ROLE.finditer(c.source)
    ]
    assert not calls, f"{doc}: cells {calls} call glue(; write {{eval}} in the prose"
    assert not roles, f"{doc}: glue roles {roles} in the prose; use {{eval}}"


# A number typed into the prose the way measurements print: two or more
# decimals, or e-notation. Code (with the roles), math and link targets are
# left out first.
TYPED_NUMBER = re.compile(r"(?<![\w.])(\d+\.\d{2,}|\d(?:\.\d+)?e[-+]?\d+)(?!\w)")
NOT_PROSE = [CODE, DISPLAY_MATH, INLINE_MATH, re.compile(r"\]\([^)]*\)")]
# Typed on purpose, and not measured: what each one is.
NOT_MEASURED = {
    ("book/04b_low_precision", "25.09"): "Apex's release number",
    ("book/05_cost", "25.09"): "Apex's release number",
    ("book/04b_low_precision", "0.25"): "float16's spacing at 256, exact",
    ("book/06_gpu", "0.85"): "the share v4 was designed for (asserted)",
}


def typed_numbers(markdown: str) -> list[str]:
    for pattern in NOT_PROSE:
        markdown = pattern.sub(" ", markdown)
    return TYPED_NUMBER.findall(markdown)


def test_typed_numbers_finds_measurement_like_numbers_only():
    text = "took 1.23 ms, error 3e-7; $0.125$ and `0.75`, {eval}`f\"{a:.3f}\"`"
    assert typed_numbers(text) == ["1.23", "3e-7"]
    assert typed_numbers("float16, 2-core, 1.5 times, (8, 512, 1024)") == []


@pytest.mark.parametrize("doc", converted())
def test_prose_types_no_measured_number(doc):
    found = [
        number
        for c in read_notebook(doc).cells
        if c.cell_type == "markdown"
        for number in typed_numbers(c.source)
        if (doc, number) not in NOT_MEASURED
    ]
    assert not found, (
        f"{doc}: {found} typed in the prose; a measured number comes from "
        "the code ({eval}), or add it to NOT_MEASURED with what it is"
    )


@pytest.mark.parametrize("doc", converted())
def test_cells_the_site_hides_are_collapsed_in_the_notebook(doc):
    # JupyterLab reads jupyter.source_hidden; it knows nothing of the site's tags.
    nb = read_notebook(doc)
    hidden_on_site = {
        i
        for i, c in enumerate(nb.cells)
        if c.cell_type == "code"
        and set(c.metadata.get("tags", [])) & (HIDDEN_TAGS | {"hide-input"})
    }
    in_solutions = {i for cells in gated_solution_cells(nb.cells) for i in cells}
    assert in_solutions, f"{doc}: no gated solution with code"
    open_ = sorted(
        i
        for i in hidden_on_site | in_solutions
        if not nb.cells[i].metadata.get("jupyter", {}).get("source_hidden")
    )
    assert not open_, (
        f"{doc}: cells {open_} are hidden on the site or part of a solution; "
        "add :jupyter: {source_hidden: true}"
    )
    # A collapsed cell shows its first line in JupyterLab: for a solution that
    # line must not give the answer away.
    telling = sorted(
        i for i in in_solutions if not nb.cells[i].source.lstrip().startswith("#")
    )
    assert not telling, (
        f"{doc}: solution cells {telling} start with code, which JupyterLab "
        "shows on the collapsed cell; start them with a comment"
    )
    # A Markdown cell collapsed this way opens on Run All (JupyterLab renders
    # it): a solution's explanation goes into its solution-start directive.
    md = [
        i
        for i, c in enumerate(nb.cells)
        if c.cell_type == "markdown"
        and c.metadata.get("jupyter", {}).get("source_hidden")
    ]
    assert not md, f"{doc}: Markdown cells {md} collapsed by metadata"


@pytest.mark.parametrize("doc", chapters())
def test_no_code_cell_inside_a_solution_directive(doc):
    # Jupyter Book silently drops a code-cell nested in {solution}: the cell
    # never runs and the reader never sees it.
    text = (ROOT / f"{doc}.md").read_text(encoding="utf-8")
    for m in re.finditer(r"^(`{3,}|:{3,})\{solution\}.*?^\1\s*$", text, re.M | re.S):
        assert "{code-cell}" not in m.group(0), (
            f"{doc}: a code-cell inside a {{solution}} directive is dropped; "
            "use {solution-start} ... {solution-end}"
        )


@pytest.mark.parametrize("doc", converted())
def test_prose_quotes_few_computed_values(doc):
    nb = read_notebook(doc)
    roles = sum(
        len(EVAL_ROLE.findall(c.source)) for c in nb.cells if c.cell_type == "markdown"
    )
    assert 0 < roles <= MAX_PROSE_VALUES, (
        f"{doc}: {roles} computed values in the prose (1 to {MAX_PROSE_VALUES}); "
        "put the rest in a figure or a Measurements table"
    )


# --- Over the built site ----------------------------------------------------


def on_the_site(test):
    """Mark a test of the built site: it skips only where no site was built
    (no index.html); a built site that lacks the chapter's page fails it."""
    for mark in needs_site:
        test = mark(test)
    return test


def page(doc: str) -> BeautifulSoup:
    """The chapter's built page, parsed once per session (do not modify it)."""
    assert (SITE / f"{doc}.html").is_file(), f"{doc}: not in the built site {SITE}"
    return built(f"{doc}.html")


def admonitions_before_first_section(soup: BeautifulSoup) -> dict[str, object]:
    article = soup.select_one("article") or soup
    first = article.find("section")
    boxes = {}
    for box in first.find_all("div", class_="admonition"):
        # Only boxes of the chapter's opening, not of a subsection.
        if box.find_parent("section") is not first:
            continue
        title = box.find(class_="admonition-title")
        if title is not None:
            boxes[title.get_text(" ", strip=True)] = box
    return boxes


def section(soup: BeautifulSoup, title: str):
    for heading in soup.find_all(["h2"]):
        if heading.get_text(" ", strip=True).rstrip("#¶ ").endswith(title):
            return heading.find_parent("section")
    return None


@pytest.mark.parametrize("doc", converted())
@on_the_site
def test_chapter_opens_with_learn_and_need(doc):
    boxes = admonitions_before_first_section(page(doc))
    learn = [
        b for t, b in boxes.items() if t.startswith("In this chapter you will learn")
    ]
    need = [b for t, b in boxes.items() if t.startswith("You need")]
    assert learn, (
        f"{doc}: no 'In this chapter you will learn' box before the first section"
    )
    assert need, f"{doc}: no 'You need' box before the first section"
    bullets = learn[0].find_all("li")
    assert 3 <= len(bullets) <= 5, (
        f"{doc}: {len(bullets)} bullets in 'you will learn' (3 to 5)"
    )


@pytest.mark.parametrize("doc", converted())
@on_the_site
def test_chapter_closes_with_what_to_remember(doc):
    remember = section(page(doc), "What to remember")
    assert remember is not None, f"{doc}: no section 'What to remember'"
    text = " ".join(p.get_text(" ", strip=True) for p in remember.find_all(["p", "li"]))
    sentences = [s for s in re.split(r"(?<=[.!?])\s+(?=[A-Z(])", text) if s.strip()]
    assert 4 <= len(sentences) <= 6, (
        f"{doc}: 'What to remember' has {len(sentences)} sentences"
    )
    # The section before the exercises, and laws rather than measurements:
    # no computed value and no measurement-like number in it.
    sections = re.split(r"^## ", (ROOT / f"{doc}.md").read_text(), flags=re.M)
    titles = [part.split("\n", 1)[0] for part in sections]
    at = titles.index("What to remember")
    assert titles[at + 1:at + 2] == ["Exercises"], f"{doc}: {titles}"
    body = sections[at]
    assert not EVAL_ROLE.search(body) and not typed_numbers(body), (
        f"{doc}: 'What to remember' quotes a measured value"
    )


@pytest.mark.parametrize("doc", converted())
@on_the_site
def test_chapter_has_four_exercises_with_hidden_solutions(doc):
    soup = page(doc)
    exercises_section = section(soup, "Exercises")
    assert exercises_section is not None, f"{doc}: no section 'Exercises'"
    exercises = exercises_section.select("div.exercise")
    solutions = exercises_section.select("div.solution")
    assert len(exercises) >= 4, f"{doc}: {len(exercises)} exercises (at least 4)"
    assert len(solutions) >= len(exercises), f"{doc}: an exercise has no solution"
    for sol in solutions:
        assert "dropdown" in sol.get("class", []), (
            f"{doc}: solution {sol.get('id')} not collapsed"
        )
        # Every solution explains, not only computes: its text written inside
        # a solution-start directive must reach the page.
        words = " ".join(p.get_text(" ") for p in sol.select("p"))
        assert len(words.split()) >= 12, (
            f"{doc}: solution {sol.get('id')} shows no explanation: {words!r}"
        )


def ends_in_a_real_assert(code: str) -> bool:
    """Whether the last statement the code runs is an ``assert`` of something
    that is not a constant (the last statement of a loop's or a block's body
    counts)."""
    def ends(body: list[ast.stmt]) -> bool:
        if not body:
            return False
        last = body[-1]
        if isinstance(last, ast.Assert):
            return not isinstance(last.test, ast.Constant)
        if isinstance(last, ast.If):  # both branches
            return ends(last.body) and ends(last.orelse)
        if isinstance(last, (ast.For, ast.While, ast.With)):
            return ends(getattr(last, "orelse", None) or last.body)
        return False

    return ends(ast.parse(code).body)


def test_ends_in_a_real_assert():
    assert ends_in_a_real_assert("x = 1\nassert x == 1")
    assert ends_in_a_real_assert("for i in range(2):\n    assert i < 2")
    assert not ends_in_a_real_assert("assert x == 1\nprint(x)")
    assert not ends_in_a_real_assert("x = 1\nassert True")
    assert not ends_in_a_real_assert("s = 'assert x'")
    assert not ends_in_a_real_assert("")
    assert not ends_in_a_real_assert("if x:\n    assert x\nelse:\n    y = 1")


@pytest.mark.parametrize("doc", converted())
@on_the_site
def test_no_line_of_code_or_output_on_the_page_is_too_long(doc):
    # What the source-based test above cannot see: files shown with
    # literalinclude (the CUDA sources) and what cells print.
    blocks = page(doc).select("article pre")
    assert blocks, f"{doc}: no code on the page"
    long = [
        f"{line!r} ({len(line)} characters)"
        for pre in blocks
        for line in pre.get_text().splitlines()
        if len(line) > MAX_LINE
    ]
    assert not long, (
        f"{doc}: lines over {MAX_LINE} characters on the page:\n" + "\n".join(long)
    )


@pytest.mark.parametrize("doc", converted())
@on_the_site
def test_solution_code_ran_and_checks_its_answer(doc):
    cells = executed_cells(doc)
    assert cells is not None, f"{doc}: the build left no executed notebook"
    solutions = [s for s in gated_solution_cells(cells) if s]
    for cell_ids in solutions:
        for i in cell_ids:
            assert cells[i].get("execution_count") is not None, (
                f"{doc}: solution cell {i} was not executed"
            )
        last = "".join(cells[cell_ids[-1]]["source"])
        assert ends_in_a_real_assert(last), (
            f"{doc}: the last code cell of a solution (cell {cell_ids[-1]}) "
            "does not end in an assert that checks something"
        )
    # The executed cells are on the page, inside their solution.
    shown = sum(len(sol.select("div.cell")) for sol in page(doc).select("div.solution"))
    assert shown == sum(len(s) for s in solutions), (
        f"{doc}: {shown} code cells shown inside solutions, "
        f"{sum(len(s) for s in solutions)} in the executed notebook"
    )


def test_gated_solution_parser_finds_the_code_cells():
    md = lambda s: {"cell_type": "markdown", "source": [s]}  # noqa: E731
    code = lambda s: {"cell_type": "code", "source": [s]}  # noqa: E731
    cells = [
        md("```{exercise}\n:label: a\nQ\n```\n```{solution-start} a\n```\nText"),
        code("x = 1"),
        code("assert x == 1"),
        md("```{solution-end}\n```\n```{solution-start} b\n```"),
        code("assert True"),
        md("```{solution-end}\n```"),
        code("outside = 1"),
    ]
    assert gated_solution_cells(cells) == [[1, 2], [4]]
