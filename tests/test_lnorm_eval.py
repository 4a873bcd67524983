"""book/_ext/lnorm_eval.py: the {eval} roles of a chapter, rewritten into glue.

The rewrite must put each expression's hidden cell exactly where JupyterLab
evaluates it (after the code cells above the Markdown cell, before those
below), leave code cells and the front matter alone, and give every role its
own glue name. Executing the rewritten notebook checks that the values are the
ones the expressions give at that point.
"""

from __future__ import annotations

import sys

import jupytext
import pytest
from built_site import ROOT

sys.path.insert(0, str(ROOT / "book" / "_ext"))
sys.path.insert(0, str(ROOT / "book"))
import prose  # noqa: E402
from lnorm_eval import (  # noqa: E402
    GLUE_IMPORT,
    evals_to_glue,
    is_notebook,
    restore_evals,
)

HEADER = """---
jupytext:
  text_representation:
    extension: .md
    format_name: myst
kernelspec:
  display_name: Python 3
  language: python
  name: python3
---
"""

CHAPTER = (
    HEADER
    + """
# Title

```{code-cell} ipython3
x = 1.5
```

First {eval}`f"{x:.2f}"` and {eval}`sci(x)`.

```{code-cell} ipython3
s = "{eval}`x`"  # code is left alone
x = 2.5
```

+++ {"jupyter": {"source_hidden": true}}

Later {eval}`f"{x:.1f}"`, and ``{eval}`x` `` in a code span.
"""
)


def cells(text: str) -> list[tuple[str, str, list[str]]]:
    nb = jupytext.reads(text, fmt="md:myst")
    return [(c.cell_type, c.source, c.metadata.get("tags", [])) for c in nb.cells]


def test_each_markdown_cell_gets_its_glue_cell_right_before_it():
    out = cells(evals_to_glue(CHAPTER))
    kinds = [(kind, tags) for kind, _, tags in out]
    assert kinds == [
        ("markdown", []),
        ("code", []),
        ("code", ["remove-cell"]),
        ("markdown", []),
        ("code", []),
        ("code", ["remove-cell"]),
        ("markdown", []),
    ]
    assert 'lnorm_eval_0=(f"{x:.2f}")' in out[2][1]
    assert "lnorm_eval_1=(sci(x))" in out[2][1]
    assert out[3][1] == "First {glue}`lnorm_eval_0` and {glue}`lnorm_eval_1`."
    assert 'lnorm_eval_2=(f"{x:.1f}")' in out[5][1]
    assert "lnorm_eval_3" not in out[5][1]  # the code span is not a role
    assert out[6][1].startswith("Later {glue}`lnorm_eval_2`, and ``{eval}`x` ``")


def test_code_front_matter_and_cell_metadata_are_kept():
    text = evals_to_glue(CHAPTER)
    assert text.startswith(HEADER)
    assert 's = "{eval}`x`"' in text
    nb = jupytext.reads(text, fmt="md:myst")
    assert nb.cells[-1].metadata == {"jupyter": {"source_hidden": True}}


def test_text_without_roles_comes_back_unchanged():
    text = HEADER + "\n# Title\n\n```{code-cell} ipython3\nx = 1\n```\n"
    assert evals_to_glue(text) is text


def test_executed_rewrite_shows_the_value_at_that_point(monkeypatch):
    # Run the rewritten code cells in order, as the kernel does: the first
    # Markdown cell sees x = 1.5 (its two roles show it differently), the
    # last x = 2.5.
    glued: dict[str, object] = {}

    def capture(**values):
        glued.update({k: prose.inline(v) for k, v in values.items()})

    monkeypatch.setattr(prose, "glue", capture)
    scope: dict[str, object] = {"sci": prose.sci}
    for cell in jupytext.reads(evals_to_glue(CHAPTER), fmt="md:myst").cells:
        if cell.cell_type == "code":
            exec(cell.source, scope)
    assert {k: repr(v) for k, v in glued.items()} == {
        "lnorm_eval_0": "1.50",
        "lnorm_eval_1": "1.5",
        "lnorm_eval_2": "2.5",
    }


@pytest.mark.parametrize(
    "text, expected",
    [(CHAPTER, True), ("---\ntitle: x\n---\n# Glossary\n", False), ("# No", False)],
)
def test_is_notebook_reads_the_kernelspec(text, expected):
    assert is_notebook(text) is expected


def test_every_chapter_rewrites_into_a_valid_notebook():
    paths = sorted((ROOT / "book").glob("0*.md"))
    assert len(paths) >= 7  # the chapters are there to be checked
    for path in paths:
        source = path.read_text(encoding="utf-8")
        rewritten = evals_to_glue(source)
        before = jupytext.reads(source, fmt="md:myst")
        after = jupytext.reads(rewritten, fmt="md:myst")
        roles = source.count("{eval}`")
        added = len(after.cells) - len(before.cells)
        assert "{eval}`" not in "".join(
            c.source for c in after.cells if c.cell_type == "markdown"
        ), path.name
        # One hidden cell per Markdown cell with roles, and at least one role each.
        assert (roles == 0) == (added == 0) and added <= roles, path.name


def glue_output(name: str, text: str) -> dict:
    prefix = "application/papermill.record/"
    return {
        "output_type": "display_data",
        "data": {prefix + "text/plain": text},
        "metadata": {"scrapbook": {"name": name, "mime_prefix": prefix}},
    }


def test_restore_gives_the_chapter_back_with_outputs_and_values():
    executed = jupytext.reads(evals_to_glue(CHAPTER), fmt="md:myst")
    glue_cells = [c for c in executed.cells if c.source.startswith(GLUE_IMPORT)]
    glue_cells[0].outputs = [glue_output("lnorm_eval_0", "1.50")] + [
        glue_output("lnorm_eval_1", "1.5")
    ]
    glue_cells[1].outputs = [glue_output("lnorm_eval_2", "2.5")]
    executed.cells[1].outputs = [{"output_type": "stream", "text": "x"}]
    executed.cells[1].execution_count = 1

    restored = restore_evals(jupytext.reads(CHAPTER, fmt="md:myst"), executed)
    source = jupytext.reads(CHAPTER, fmt="md:myst")
    assert [c.source for c in restored.cells] == [c.source for c in source.cells]
    assert restored.cells[1].outputs == [{"output_type": "stream", "text": "x"}]
    assert restored.cells[1].execution_count == 1
    first, last = restored.cells[2].metadata, restored.cells[4].metadata
    pairs = [(e["expression"], e["result"]["data"]) for e in first["user_expressions"]]
    assert pairs == [
        ('f"{x:.2f}"', {"text/plain": "1.50"}),
        ("sci(x)", {"text/plain": "1.5"}),
    ]
    assert [e["expression"] for e in last["user_expressions"]] == ['f"{x:.1f}"']
    assert last["jupyter"] == {"source_hidden": True}


def test_restore_refuses_a_notebook_of_another_chapter():
    executed = jupytext.reads(evals_to_glue(CHAPTER), fmt="md:myst")
    other = jupytext.reads(HEADER + "\n# Other\n", fmt="md:myst")
    with pytest.raises(ValueError, match="does not match"):
        restore_evals(other, executed)
