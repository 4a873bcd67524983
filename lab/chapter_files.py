"""How `make lab` saves a chapter: only what the learner edited, as it was typed.

JupyterLab saves the whole notebook, and jupytext would write every chapter in
its own layout: version fields in the front matter, each ``:tags:`` option pair
as a YAML block, the values of the ``{eval}`` roles. So a chapter that was only
opened and run would come back changed. This contents manager compares what
Lab saves with the chapter on disk, cell by cell, ignoring what running and
viewing change (outputs, execution counts, the stored values of ``{eval}``
roles, which cells are collapsed, the kernel's metadata):

* nothing edited: the file is not written at all;
* cells edited in place: only the lines of those cells' text change;
* cells added, deleted or moved, or their options changed: jupytext writes the
  cells in its own layout; the front matter is kept as it is.

It also puts one collapsed cell, never saved, at the top of each chapter of
``_toc.yml``, for jupyterlab-myst, which reads a notebook's front matter from
its first Markdown cell and resolves references within one notebook only: the
chapter's numbering (Eq. (2.8), Exercise 2.1, as on the site) and the
equations of other chapters that the chapter cites, with the site's numbers.

And it shows some of the book's MyST as the site does, where jupyterlab-myst
cannot (:func:`display`); a saved cell gets its text back (:func:`undisplay`).

`lab/jupyter_server_config.py` makes JupyterLab use it. The pure functions
(:func:`cell_spans`, :func:`save_text`) are tested in ``tests/lab``.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat
import yaml
from jupytext import AsyncTextFileContentsManager
from jupytext.myst import (
    CODE_DIRECTIVE,
    RAW_DIRECTIVE,
    get_parser,
    myst_to_notebook,
    notebook_to_myst,
    read_fenced_cell,
)

# Cell metadata that running or viewing a chapter sets: never saved.
VIEW_STATE = {
    "user_expressions",
    "execution",
    "collapsed",
    "scrolled",
    "jupyter",
    "trusted",
}
# The metadata key of the cell that make lab adds at the top (never saved).
LAB_CELL = "lnorm_lab"
# Display math, with its label if any ($$ ... $$ (label)), and {math} directives.
DISPLAY = re.compile(
    r"^\$\$\n(?P<tex>.*?)\n\$\$ *(?:\((?P<label>[\w-]+)\))?$", re.M | re.S
)
DIRECTIVE = re.compile(
    r"\{math\}[^\n]*\n(?:[ \t]*:[\w-]+:[^\n]*\n)*?[ \t]*:label: *([\w-]+)"
)
EQ_ROLE = re.compile(r"\{eq\}`([\w-]+)`")


def chapters(root: Path) -> list[str]:
    """The chapters of ``_toc.yml``, numbered as on the site (from 1)."""
    toc = yaml.safe_load((root / "_toc.yml").read_text(encoding="utf-8"))
    return [str(c["file"]) for c in toc.get("chapters", [])]


def equations(text: str) -> list[tuple[str, str]]:
    """(label, TeX) of a chapter's labelled equations, in order: the site
    numbers these only."""
    markdown = "\n\n".join(
        c.source for c in myst_to_notebook(text).cells if c.cell_type == "markdown"
    )
    found = [(m["label"], m["tex"], m.start()) for m in DISPLAY.finditer(markdown)]
    found += [(m[1], "", m.start()) for m in DIRECTIVE.finditer(markdown)]
    return [
        (label, tex) for label, tex, _ in sorted(found, key=lambda f: f[2]) if label
    ]


def is_page(root: Path, path: str) -> bool:
    """Whether ``path`` is a chapter of ``_toc.yml`` or its first page."""
    if not (root / "_toc.yml").exists():
        return False
    first = yaml.safe_load((root / "_toc.yml").read_text(encoding="utf-8"))["root"]
    return path.removesuffix(".md") in [*chapters(root), first]


def lab_cell(root: Path, path: str) -> dict[str, Any] | None:
    """The cell make lab puts at the top of page ``path`` of :func:`is_page`
    (None if there is nothing to put: a page with no number that cites no
    other chapter's equation)."""
    docs = chapters(root)
    doc = path.removesuffix(".md")
    text = (root / path).read_text(encoding="utf-8")
    here = {label for label, _ in equations(text)}
    cited = set(EQ_ROLE.findall(text)) - here
    lines = [
        "*Added by `make lab`, never saved:* the equations of other chapters "
        "cited here, with the site's numbers, for jupyterlab-myst."
    ]
    if doc in docs:
        number = docs.index(doc) + 1
        numbering = {
            kind: {"enumerator": f"{number}.%s"} for kind in ("equation", "exercise")
        }
        front = yaml.safe_dump({"numbering": numbering}, default_flow_style=None)
        lines = [
            "---",
            front.strip(),
            "---",
            f"*Added by `make lab`, never saved:* chapter {number}'s numbering for "
            "jupyterlab-myst"
            + (
                ", and the equations of other chapters that it cites." if cited else "."
            ),
        ]
    if doc not in docs and not cited:
        return None
    for other_number, other in enumerate(docs, 1):
        if other == doc or not cited or not (root / f"{other}.md").exists():
            continue
        other_text = (root / f"{other}.md").read_text(encoding="utf-8")
        for i, (label, tex) in enumerate(equations(other_text), 1):
            if label in cited:
                lines += [
                    "",
                    "```{math}",
                    f":label: {label}",
                    f":enumerator: {other_number}.{i}",
                    tex or "\\;",
                    "```",
                ]
    return nbformat.v4.new_markdown_cell(
        "\n".join(lines),
        metadata={
            LAB_CELL: True,
            "editable": False,
            "deletable": False,
        },
    )


@dataclass
class Span:
    """Where a cell's source sits in the file: lines [start, stop)."""

    start: int
    stop: int


def cell_spans(text: str) -> tuple[int, list[Span]]:
    """The end line of the front matter and each cell's source lines, as
    jupytext's MyST reader (``jupytext.myst.myst_to_notebook``) splits them."""
    lines = text.splitlines()
    tokens = get_parser().parse(text + "\n")
    header = 0
    if tokens and tokens[0].type == "front_matter":
        header = tokens.pop(0).map[1]
    spans: list[Span] = []
    start, nesting = header, 0

    def markdown(stop: int) -> None:
        # The source is the lines between, without leading or trailing blanks.
        a, b = start, stop
        while a < b and not lines[a].strip():
            a += 1
        while b > a and not lines[b - 1].strip():
            b -= 1
        if a < b:
            spans.append(Span(a, b))

    for token in tokens:
        nesting += token.nesting
        if nesting != 0:
            continue
        fenced = token.type == "fence" and token.info.startswith(
            (CODE_DIRECTIVE, RAW_DIRECTIVE)
        )
        if fenced:
            markdown(token.map[0])
            _, body = read_fenced_cell(token, len(spans), "Code")
            # The body is the last lines inside the fence.
            stop = token.map[1] - 1
            spans.append(Span(stop - len(body), stop))
            start = token.map[1]
        elif token.type == "myst_block_break":
            markdown(token.map[0])
            start = token.map[1]
    markdown(len(lines))
    return header, spans


# -- What jupyterlab-myst 2.7 cannot show as the site does ------------------------
# Each rewrite is undone on save: see undisplay.
ROLE_LINES = re.compile(r"(\{[\w:-]+\}`)([^`]*\n[^`]*)(`)")
PY_ROLE = re.compile(r"\{py:(\w+)\}`([^`]+)`")
CITE = re.compile(r"\{cite(?::(\w+))?\}`([^`]+)`")


def _py_role(m: re.Match) -> str:
    """A {py:...} role as the site shows it: the name in code, short after a
    tilde, with () for a function (jupyterlab-myst shows the raw target)."""
    kind, target = m[1], m[2]
    if "<" in target:
        name = target.split("<")[0].strip()
    else:
        name = target.split(".")[-1] if target.startswith("~") else target
    return f"`{name}()`" if kind in ("func", "meth") else f"`{name}`"


def cite_labels(bib: Path) -> dict[str, tuple[str, str]]:
    """Key: (author-year label, one line of the entry), as the site's
    references read (book/_ext/lnorm_site.py's labels)."""
    import sys

    from pybtex.database import parse_file

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "book" / "_ext"))
    from lnorm_site import AuthorYearLabels  # the site's one label rule

    labels = {}
    for key, entry in parse_file(str(bib)).entries.items():
        year = entry.fields.get("year", "n.d.")
        title = re.sub(r"[{}\"]", "", entry.fields.get("title", ""))
        labels[key] = (AuthorYearLabels.label(entry), f"{title} ({year})")
    return labels


def display(source: str, labels: dict[str, tuple[str, str]]) -> str:
    """A Markdown cell as make lab shows it in JupyterLab:

    * a role broken over two lines is joined (jupyterlab-myst misses it);
    * ``{py:func}`~a.b.f``` reads ``f()`` in code, as on the site;
    * a citation reads "[Ba et al., 2016]", a link to references.bib whose
      title is the entry (jupyterlab-myst 2.7 is given no bibliography);
    * unlabelled display math is unnumbered, as on the site (jupyterlab-myst
      numbers every equation; ``equation*`` is its way to number none).
    """
    source = ROLE_LINES.sub(lambda m: m[1] + m[2].replace("\n", " ") + m[3], source)
    source = PY_ROLE.sub(_py_role, source)

    def cite(m: re.Match) -> str:
        keys = [k.strip() for k in m[2].split(",")]
        if not all(k in labels for k in keys):
            return m[0]
        links = "; ".join(
            f'[{labels[k][0]}](references.bib "{labels[k][1]}")' for k in keys
        )
        return f"\\[{links}\\]"

    source = CITE.sub(cite, source)
    return DISPLAY.sub(
        lambda m: (
            m[0]
            if m["label"] or m["tex"].startswith("\\begin{equation*}")
            else f"$$\n\\begin{{equation*}}\n{m['tex']}\n\\end{{equation*}}\n$$"
        ),
        source,
    )


def undisplay(
    shown: str,
    chapter: list[str],
    labels: dict[str, tuple[str, str]],
    displayed: list[str] | None = None,
) -> str:
    """The text to save for a Markdown cell that reads ``shown`` in Lab, in a
    chapter whose Markdown cells are ``chapter`` on disk: the cell's text on
    disk if unedited, else ``shown`` with each rewrite of :func:`display` in
    the cell it was edited from undone (``displayed``: the cells of
    ``chapter`` as display() shows them, if known)."""
    if displayed is None:
        displayed = [display(source, labels) for source in chapter]
    if shown in displayed:
        return chapter[displayed.index(shown)]
    if not chapter:
        return shown
    ratios = [difflib.SequenceMatcher(None, d, shown).ratio() for d in displayed]
    source = chapter[ratios.index(max(ratios))]
    pairs: dict[str, str] = {}
    for pattern in (ROLE_LINES, PY_ROLE, CITE, DISPLAY):
        for m in pattern.finditer(source):
            if (new := display(m[0], labels)) != m[0]:
                pairs.setdefault(new, m[0])
    for new, old in pairs.items():
        # In order, which occurrences of ``new`` were ``old`` on disk (a
        # rewrite) and which were typed so: undone by place while the count
        # is the same, else only where there is no doubt.
        spans = [m.span() for m in re.finditer(re.escape(old), source)]
        typed = [
            m.start()
            for m in re.finditer(re.escape(new), source)
            if not any(a <= m.start() < b for a, b in spans)
        ]
        found = sorted([(a, True) for a, _ in spans] + [(t, False) for t in typed])
        parts = shown.split(new)
        if len(parts) - 1 == len(found):
            rebuilt = [parts[0]]
            for (_, rewritten), part in zip(found, parts[1:]):
                rebuilt += [old if rewritten else new, part]
            shown = "".join(rebuilt)
        elif all(rewritten for _, rewritten in found):
            shown = shown.replace(new, old)
    return shown


def _key(cell: dict[str, Any]) -> tuple[str, str, str]:
    """What a cell is, ignoring what running and viewing it change."""
    meta = {k: v for k, v in cell.get("metadata", {}).items() if k not in VIEW_STATE}
    return cell["cell_type"], cell["source"], repr(sorted(meta.items()))


def save_text(
    text: str, notebook: dict[str, Any], labels: dict[str, tuple[str, str]]
) -> str | None:
    """The chapter's new text for the ``notebook`` Lab saves, or None when the
    learner edited nothing (``text`` is the chapter on disk, ``labels`` the
    citations :func:`display` showed)."""
    old = myst_to_notebook(text)
    old_cells = [_key(c) for c in old.cells]
    chapter = [c.source for c in old.cells if c.cell_type == "markdown"]
    displayed = [display(source, labels) for source in chapter]
    cells = []
    for cell in notebook["cells"]:
        if cell["metadata"].get(LAB_CELL):
            continue
        if cell["cell_type"] == "markdown":
            source = undisplay(cell["source"], chapter, labels, displayed)
            cell = {**cell, "source": source}
        cells.append(cell)
    notebook = {**notebook, "cells": cells}
    new_cells = [_key(c) for c in notebook["cells"]]
    if old_cells == new_cells:
        return None
    lines = text.splitlines()
    header, spans = cell_spans(text)
    same_layout = len(old_cells) == len(new_cells) and len(spans) == len(old_cells)
    if same_layout and all(
        o[0] == n[0] and o[2] == n[2] for o, n in zip(old_cells, new_cells)
    ):
        # Edited in place: each changed source goes where the old one was,
        # from the last cell up so that the earlier spans keep their lines.
        for span, o, n in reversed(list(zip(spans, old_cells, new_cells))):
            if o[1] == n[1]:
                continue
            if "\n".join(lines[span.start : span.stop]) != o[1]:
                break  # not where jupytext read it: write it all
            lines[span.start : span.stop] = n[1].splitlines()
        else:
            spliced = "\n".join(lines) + "\n"
            # Still the same cells when read back (a fence or a +++ typed into
            # a cell would split it): else jupytext writes them all.
            if [_key(c) for c in myst_to_notebook(spliced).cells] == new_cells:
                return spliced
    # Cells added, deleted, moved or re-tagged: jupytext's layout for the cells,
    # the front matter as it was. A cell kept from the chapter keeps its
    # collapsed state as the chapter sets it.
    kept = difflib.SequenceMatcher(
        None, [k[:2] for k in old_cells], [k[:2] for k in new_cells], autojunk=False
    )
    authored = {}
    for block in kept.get_matching_blocks():
        for i in range(block.size):
            authored[block.b + i] = old.cells[block.a + i].metadata.get("jupyter")
    cells = []
    for i, cell in enumerate(notebook["cells"]):
        meta = {k: v for k, v in cell["metadata"].items() if k not in VIEW_STATE}
        if authored.get(i):
            meta["jupyter"] = authored[i]
        make = {
            "code": nbformat.v4.new_code_cell,
            "markdown": nbformat.v4.new_markdown_cell,
            "raw": nbformat.v4.new_raw_cell,
        }[cell["cell_type"]]
        cells.append(make(cell["source"], metadata=meta))
    body = notebook_to_myst(
        nbformat.v4.new_notebook(cells=cells), default_lexer="ipython3"
    )
    front = "\n".join(lines[:header])
    return f"{front}\n\n{body}" if header else body


class ChapterContentsManager(AsyncTextFileContentsManager):
    """jupytext's contents manager, saving a MyST chapter with :func:`save_text`."""

    async def save(self, model: dict[str, Any], path: str = "") -> dict[str, Any]:
        path = path.strip("/")
        if (
            model.get("type") != "notebook"
            or not path.endswith(".md")
            or not await self.file_exists(path)
        ):
            return await super().save(model, path)
        on_disk = await self.get(path, content=True, type="file", format="text")
        text = on_disk["content"]
        if "format_name: myst" not in text.split("\n---", 1)[0]:
            return await super().save(model, path)
        labels = self._labels(path)
        new = save_text(text, model["content"], labels)
        if new is None:
            self.log.info("Not saving %s: nothing edited", path)
        else:
            self.log.info("Saving %s: the edited cells", path)
            await super().save({"type": "file", "format": "text", "content": new}, path)
        return await self.get(path, content=False)

    async def get(
        self, path: str, content: bool = True, type=None, format=None, **kwargs: Any
    ) -> dict[str, Any]:
        model = await super().get(
            path, content=content, type=type, format=format, **kwargs
        )
        if content and model["type"] == "notebook" and path.endswith(".md"):
            root, page = Path(self.root_dir), path.strip("/")
            if is_page(root, page):
                labels = self._labels(path)
                for c in model["content"].cells:
                    if c.cell_type == "markdown":
                        c.source = display(c.source, labels)
                cell = lab_cell(root, page)
                if cell is not None:
                    model["content"].cells.insert(0, cell)
        return model

    def _labels(self, path: str) -> dict[str, tuple[str, str]]:
        """The citations' labels, from references.bib beside the chapter."""
        bib = Path(self.root_dir) / path.strip("/")
        bib = bib.parent / "references.bib"
        return cite_labels(bib) if bib.exists() else {}
