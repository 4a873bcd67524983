"""Sphinx hooks for the lnorm book's site.

1. The References page labels each entry the way chapters cite it, "Ba et al.,
   2016", instead of pybtex's alpha keys ("BKH16", "NVIDIACorporation23").
2. Each chapter's download menu offers the executed ``.ipynb`` next to the
   ``.md`` source, with the values of its ``{eval}`` roles stored as
   jupyterlab-myst stores them.
3. The text written inside a ``solution-start`` directive is kept (see
   :class:`SolutionStartBody`).

About 2: sphinx-book-theme lists a chapter's ``.ipynb`` in its download menu only when a
launch service (Binder, JupyterHub, Colab, thebe) is configured, and this book
configures none: everything it needs runs on the reader's own machine. This
hook writes the executed notebook next to the page's ``.md`` source in
``_sources/`` and tells the theme about it, so the download menu offers both.

The outputs come from MyST-NB's execution cache (``_build/.jupyter_cache``):
the copy MyST-NB itself leaves in ``_build/jupyter_execute`` has no outputs
when a page was rendered from the cache (MyST-NB 1.4 writes the notebook it
read, not the one merged with the cached outputs).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
from docutils import nodes
from jupyter_cache import get_cache
from lnorm_eval import evals_to_glue, restore_evals
from myst_nb.core.read import create_nb_reader
from pybtex.plugin import register_plugin
from pybtex.style.formatting.plain import Style as PlainStyle
from pybtex.style.labels import BaseLabelStyle
from pybtex.style.sorting.author_year_title import SortingStyle
from sphinx.application import Sphinx
from sphinx.transforms import SphinxTransform
from sphinx_exercise.nodes import solution_start_node
from sphinx_exercise.transforms import MergeGatedSolutions


class AuthorYearLabels(BaseLabelStyle):
    """Labels that read like the in-text citations: "Ba et al., 2016"."""

    def format_labels(self, sorted_entries: list[Any]) -> Iterator[str]:
        labels = [self.label(entry) for entry in sorted_entries]
        repeated = {label for label, count in Counter(labels).items() if count > 1}
        seen: Counter[str] = Counter()
        for label in labels:
            # Same authors and year twice: 2016a, 2016b, as author-year styles
            # do. Needed: sphinxcontrib-bibtex warns on a duplicate label, and
            # the book builds with warnings as errors.
            suffix = chr(ord("a") + seen[label]) if label in repeated else ""
            seen[label] += 1
            yield label + suffix

    @staticmethod
    def label(entry: Any) -> str:
        people = entry.persons.get("author") or entry.persons.get("editor") or []
        names = [re.sub(r"[{}]", "", " ".join(person.last_names)) for person in people]
        if len(names) > 2:
            who = f"{names[0]} et al."
        elif names:
            who = " and ".join(names)
        else:
            who = entry.fields.get("title", entry.key)
        return f"{who}, {entry.fields.get('year', 'n.d.')}"


class AuthorYearSorting(SortingStyle):
    """Author, year, title; braces ignored, so {NVIDIA Corporation} sorts under N."""

    def person_key(self, person: Any) -> str:
        return re.sub(r"[{}]", "", super().person_key(person))


class AuthorYearStyle(PlainStyle):
    """pybtex's plain style with author-year labels, sorted by author, year, title."""

    default_label_style = "lnorm_author_year"
    default_sorting_style = "lnorm_author_year"


def executed_notebook(app: Sphinx, docname: str) -> nbformat.NotebookNode | None:
    """The page's notebook with the outputs of its cached execution, or None.

    It is the chapter as written, ``{eval}`` roles and all, with their values
    stored for jupyterlab-myst (see :func:`lnorm_eval.restore_evals`).
    """
    source = Path(app.env.doc2path(docname))
    text = source.read_text(encoding="utf-8")
    config = (app.env.myst_config, app.env.mystnb_config)
    reader = create_nb_reader(str(source), *config, text)
    if reader is None:
        return None
    # What MyST-NB read and executed: the source with its {eval} roles rewritten.
    rewritten = reader.read(evals_to_glue(text))
    cache = get_cache(app.env.mystnb_config.execution_cache_path)
    try:
        _, executed = cache.merge_match_into_notebook(rewritten)
    except KeyError:  # never executed, or its code changed since
        return None
    return restore_evals(reader.read(text), executed)


def offer_executed_notebook(
    app: Sphinx, pagename: str, templatename: str, context: dict[str, Any], doctree: Any
) -> None:
    """Write ``_sources/<pagename>.ipynb`` and add it to the download menu."""
    if doctree is None or "kernelspec" not in app.env.metadata.get(pagename, {}):
        return  # not a notebook page (intro, glossary, references, search)
    notebook = executed_notebook(app, pagename)
    if notebook is None:
        return
    target = Path(app.outdir) / "_sources" / f"{pagename}.ipynb"
    target.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, target)
    context["ipynb_source"] = f"{pagename}.ipynb"


class SolutionStartBody(SphinxTransform):
    """Keep the text written inside a ``solution-start`` directive.

    A chapter writes a solution's explanation inside its ``solution-start``
    directive: JupyterLab (jupyterlab-myst) shows it there in a closed box, so
    a learner meets it only on a click, even after *Run All*. sphinx-exercise
    1.2.1 drops such text when it merges a gated solution. This transform runs
    just before that merge and moves the text out of the directive, in front of
    the solution's code cells, where the merge collects it.
    """

    default_priority = MergeGatedSolutions.default_priority - 1

    def apply(self, **kwargs: Any) -> None:
        for start in list(self.document.findall(solution_start_node)):
            body = [c for c in start.children if isinstance(c, nodes.section)]
            moved = [child for section in body for child in section.children]
            for section in body:
                start.remove(section)
            parent = start.parent
            at = parent.index(start) + 1
            for offset, child in enumerate(moved):
                parent.insert(at + offset, child)


def setup(app: Sphinx) -> dict[str, Any]:
    # Selected in _config.yml with bibtex_default_style: lnorm_author_year.
    register_plugin("pybtex.style.labels", "lnorm_author_year", AuthorYearLabels)
    register_plugin("pybtex.style.sorting", "lnorm_author_year", AuthorYearSorting)
    register_plugin("pybtex.style.formatting", "lnorm_author_year", AuthorYearStyle)
    # Priority 500 runs before the theme's header buttons (501) read the context.
    app.connect("html-page-context", offer_executed_notebook, priority=500)
    app.add_transform(SolutionStartBody)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
