"""The chapters' inline numbers, ``{eval}`expr```, on the cached site build.

A chapter writes a number in its prose as MyST's inline role ``{eval}`expr```.
In JupyterLab, jupyterlab-myst evaluates ``expr`` in the kernel when the
Markdown cell runs (*Run All* runs them in order), so a learner sees the value.

MyST-NB evaluates ``{eval}`` only when it executes a page inline, which runs
every chapter again on every build: the execution cache would no longer apply.
This hook keeps the cache. Before MyST-NB reads a chapter, it rewrites each
Markdown cell that holds ``{eval}`` roles:

* a code cell tagged ``remove-cell`` is put right before the Markdown cell; it
  evaluates the cell's expressions where JupyterLab would, after the code cells
  above, and glues the values (``glue`` of ``book/prose.py``);
* each role becomes ``{glue}`lnorm_eval_<k>```, which MyST-NB fills in from the
  cached outputs.

The source files keep ``{eval}``; only what MyST-NB reads is rewritten, and
:func:`lnorm_site.executed_notebook` applies the same rewrite to find the cache.
"""

from __future__ import annotations

import re
from typing import Any

from sphinx.application import Sphinx
from sphinx.errors import ExtensionError

#: ``{eval}`expr```, not inside a longer code span.
EVAL_ROLE = re.compile(r"(?<!`)\{eval\}`([^`]+)`")
#: The glue names the rewrite gives the expressions.
GLUE_PREFIX = "lnorm_eval_"
#: First line of every code cell the rewrite adds.
GLUE_IMPORT = "from prose import glue as _lnorm_glue"
_FENCE = re.compile(r"^(`{3,}|~{3,})\{code-cell\}")


def _front_matter_end(lines: list[str]) -> int:
    """Index of the first line after the YAML front matter (0 if none)."""
    if lines and lines[0].rstrip() == "---":
        for i in range(1, len(lines)):
            if lines[i].rstrip() == "---":
                return i + 1
    return 0


def _markdown_cells(lines: list[str], start: int) -> list[tuple[int, int]]:
    """(first, end) line ranges of the Markdown cells of a MyST notebook.

    Cells are split by code cells and by ``+++`` lines; a range that starts
    with ``+++`` includes that line (it carries the cell's metadata).
    """
    cells: list[tuple[int, int]] = []
    first, fence = start, None
    for i in range(start, len(lines)):
        line = lines[i]
        if fence is not None:
            if line.rstrip() == fence:
                fence, first = None, i + 1
            continue
        opening = _FENCE.match(line)
        if opening or line.startswith("+++"):
            if i > first:
                cells.append((first, i))
            if opening:
                fence = opening.group(1)
            else:
                first = i
    if fence is None and len(lines) > first:
        cells.append((first, len(lines)))
    return cells


def evals_to_glue(text: str) -> str:
    """Rewrite the ``{eval}`` roles of a MyST notebook into glue, as above.

    Parameters
    ----------
    text : str
        The chapter's source (MyST markdown notebook).

    Returns
    -------
    str
        The same text where every Markdown cell with ``{eval}`` roles is
        preceded by a hidden code cell that glues the expressions' values, and
        each role reads ``{glue}`lnorm_eval_<k>```. Text without roles comes
        back unchanged.
    """
    if not EVAL_ROLE.search(text):
        return text
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    done, k = 0, 0
    for first, end in _markdown_cells(lines, _front_matter_end(lines)):
        cell = "".join(lines[first:end])
        expressions = EVAL_ROLE.findall(cell)
        if not expressions:
            continue
        names = [f"{GLUE_PREFIX}{k + j}" for j in range(len(expressions))]
        k += len(expressions)
        calls = ",\n    ".join(f"{n}=({e})" for n, e in zip(names, expressions))
        out.extend(lines[done:first])
        out.append(
            "```{code-cell} ipython3\n:tags: [remove-cell]\n"
            f"{GLUE_IMPORT}\n"
            f"_lnorm_glue(\n    {calls},\n)\n```\n\n"
        )
        it = iter(names)
        out.append(EVAL_ROLE.sub(lambda _: f"{{glue}}`{next(it)}`", cell))
        done = end
    out.extend(lines[done:])
    return "".join(out)


def restore_evals(source: Any, executed: Any) -> Any:
    """The chapter as a learner's notebook, with the outputs of the executed rewrite.

    Parameters
    ----------
    source : nbformat.NotebookNode
        The chapter as written, with its ``{eval}`` roles.
    executed : nbformat.NotebookNode
        The executed notebook of :func:`evals_to_glue` (from the cache).

    Returns
    -------
    nbformat.NotebookNode
        ``source`` with each code cell's outputs and execution count, and each
        Markdown cell's ``{eval}`` values in its ``user_expressions`` metadata,
        where jupyterlab-myst keeps them: JupyterLab shows the numbers before
        the learner runs anything.
    """
    values: list[dict[str, Any]] = []
    executed_cells = []
    for cell in executed.cells:
        if cell.cell_type == "code" and cell.source.startswith(GLUE_IMPORT):
            for output in cell.get("outputs", []):
                prefix = (
                    output.get("metadata", {})
                    .get("scrapbook", {})
                    .get("mime_prefix", "")
                )
                data = {k.removeprefix(prefix): v for k, v in output["data"].items()}
                # The kernel's answer to {eval}: plain text (the site's glue
                # also has Markdown, for math; JupyterLab would not get it).
                plain = {"text/plain": data["text/plain"]}
                values.append({"status": "ok", "data": plain, "metadata": {}})
        else:
            executed_cells.append(cell)
    if len(executed_cells) != len(source.cells):
        raise ValueError("the executed notebook does not match the chapter's cells")
    values.reverse()
    for cell, run in zip(source.cells, executed_cells):
        if cell.cell_type == "code":
            cell.outputs = run.get("outputs", [])
            cell.execution_count = run.get("execution_count")
        elif cell.cell_type == "markdown":
            expressions = EVAL_ROLE.findall(cell.source)
            if expressions:
                cell.metadata["user_expressions"] = [
                    {"expression": e, "result": values.pop()} for e in expressions
                ]
    if values:
        raise ValueError("more glued values than {eval} roles")
    return source


def is_notebook(text: str) -> bool:
    """Whether a MyST source is a notebook: its front matter names a kernel."""
    lines = text.splitlines()
    return "kernelspec:" in "\n".join(lines[: _front_matter_end(lines)])


def rewrite_source(app: Sphinx, docname: str, source: list[str]) -> None:
    """``source-read`` hook: rewrite the chapter before MyST-NB reads it."""
    if not EVAL_ROLE.search(source[0]):
        return
    if not is_notebook(source[0]):
        raise ExtensionError(
            f"{docname}: {{eval}} roles need a notebook page (a kernelspec in "
            "the front matter) whose code computes their values"
        )
    source[0] = evals_to_glue(source[0])


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("source-read", rewrite_source)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
