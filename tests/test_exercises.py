"""Exercises whose checks test what they ask: each passes on 100 seeds and
fails on a planted wrong answer.

For each exercise below, the code cells of its gated solution
(``{solution-start} label`` ... ``{solution-end}``) are read from the
chapter's source and run after the chapter's first code cell (its imports),
with nothing else of the chapter: a solution is self-contained. Each solution
draws its data from exactly one ``np.random.default_rng(<seed>)``; the test
replaces that seed with 0 to 99 and the solution's asserts must hold for every
one. Then a wrong answer is planted into the solution's code (a text
substitution: the predicted value replaced by a plausible wrong one), and the
same asserts must fail with an ``AssertionError``.
"""

from __future__ import annotations

import ast
import contextlib
import io
import re
import sys
from functools import cache
from pathlib import Path

import jupytext
import pytest

BOOK = Path(__file__).resolve().parents[1] / "book"
SEEDS = range(100)
#: Seeds a planted answer is run on; it must fail on each.
PLANTED_SEEDS = range(10)
RNG_CALL = re.compile(r"np\.random\.default_rng\((\d+)\)")

#: label: (chapter, [(what the solution says, a planted wrong answer), ...]).
EXERCISES = {
    "ex-fwd-memory": ("01_forward", [
        # Chapter 1's old answer: x "alive anyway", two float32s per row.
        ('assert held("x_mean_rstd", 8, 2048, 4096) == 8 * GiB + 8 * MiB',
         'assert held("x_mean_rstd", 8, 2048, 4096) == 8 * MiB'),
        # Which activation another layer keeps: x instead of y.
        ('kept_alive={"y"}', 'kept_alive={"x"}'),
    ]),
    "ex-der-tutorial": ("02_derivation", [
        # The gradient at a constant row without its mean path.
        ("limit = (g_t - g_t.mean(-1, keepdims=True)) / 1e-5",
         "limit = g_t / 1e-5"),
        # A sign error in the derived formula.
        ("- c * gc / ((D - 1)", "+ c * gc / ((D - 1)"),
    ]),
    "ex-gc-onesided": ("03_gradcheck", [
        # The central quotient's step and error instead of the one-sided's.
        ("h_pred = np.sqrt(2 * u)", "h_pred = u ** (1 / 3)"),
        ("err_pred = np.sqrt(2 * u)", "err_pred = u ** (2 / 3)"),
    ]),
    "ex-gc-relstep": ("03_gradcheck", [
        # "Relative steps keep every entry": no entry lost.
        ("lost = 2 * 3 / (2 * 2e4)", "lost = rounding / 3e4"),
        ("2 * b[2] / scale, rtol", "rounding / 3e4, rtol"),
        # "The fixed step passes too."
        ("and not fixed.passed", "and fixed.passed"),
    ]),
    "ex-var-dfactor": ("04_stability", [
        # The bound's factor 9, taken as the measured one.
        ("bound, predicted = (12 / 4) ** 2, 1",
         "bound, predicted = (12 / 4) ** 2, (12 / 4) ** 2"),
    ]),
    "ex-var-corrected": ("04_stability", [
        # A wrong identity: the correction added instead of subtracted.
        ("(d * d).sum(-1) - d.sum(-1) ** 2", "(d * d).sum(-1) + d.sum(-1) ** 2"),
        # The old answer: the right-hand form goes negative on real rows.
        ("and (cgl(d) >= 0).all()", "and (cgl(d) < 0).any()"),
    ]),
    "ex-lp-bug": ("04b_low_precision", [
        # The old answer: a float32 Welford mean off by about u |mu|.
        ("predicted = spacing * np.sqrt(1000) / 6", "predicted = U32 * 1e4"),
    ]),
}


@cache
def chapter(doc: str):
    return jupytext.read(BOOK / f"{doc}.md")


def solution_code(doc: str, label: str) -> str:
    """The code cells of the gated solution of ``label``, joined."""
    start = re.compile(r"\{solution-start\}\s+" + re.escape(label) + r"\s")
    cells, inside = [], False
    for cell in chapter(doc).cells:
        if cell.cell_type == "markdown":
            if start.search(cell.source):
                inside = True
            elif inside and "{solution-end}" in cell.source:
                return "\n\n".join(cells)
        elif inside:
            cells.append(cell.source)
    raise AssertionError(f"{doc}: no gated solution {label} with an end")


@cache
def imported(doc: str) -> dict:
    """The namespace after the chapter's first code cell, its imports."""
    first = next(c for c in chapter(doc).cells if c.cell_type == "code")
    if str(BOOK) not in sys.path:
        sys.path.insert(0, str(BOOK))  # the chapters import prose
    namespace: dict = {"__name__": f"chapter_{doc}"}
    with contextlib.chdir(BOOK):  # where chapters run (the figure style)
        exec(compile(first.source, f"{doc}.md: first cell", "exec"), namespace)
    return namespace


def run(doc: str, label: str, code: str, seed: int) -> None:
    """Run the solution's code with its generator seeded by ``seed``."""
    seeded = RNG_CALL.sub(f"np.random.default_rng({seed})", code)
    namespace = dict(imported(doc))
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(seeded, f"{doc}.md: {label}", "exec"), namespace)


@pytest.mark.parametrize("label", EXERCISES)
def test_solution_has_one_seed_and_ends_in_an_assert(label):
    doc, plants = EXERCISES[label]
    code = solution_code(doc, label)
    assert len(RNG_CALL.findall(code)) == 1, (
        f"{label}: draw the data from exactly one np.random.default_rng(seed)"
    )
    assert isinstance(ast.parse(code).body[-1], ast.Assert), (
        f"{label}: the solution does not end in an assert"
    )
    for said, _ in plants:
        assert code.count(said) == 1, f"{label}: the plant's text {said!r} moved"


@pytest.mark.parametrize("label", EXERCISES)
def test_solution_passes_on_100_seeds(label):
    doc, _ = EXERCISES[label]
    code = solution_code(doc, label)
    failed = []
    for seed in SEEDS:
        try:
            run(doc, label, code, seed)
        except AssertionError:
            failed.append(seed)
    assert not failed, f"{label}: the check fails for the seeds {failed}"


PLANTS = [
    pytest.param(label, said, wrong, id=f"{label}-{k}")
    for label, (_, plants) in EXERCISES.items()
    for k, (said, wrong) in enumerate(plants)
]


@pytest.mark.parametrize(("label", "said", "wrong"), PLANTS)
def test_solution_fails_on_a_planted_answer(label, said, wrong):
    doc, _ = EXERCISES[label]
    code = solution_code(doc, label)
    assert code.count(said) == 1
    planted = code.replace(said, wrong)
    for seed in PLANTED_SEEDS:
        with pytest.raises(AssertionError):
            run(doc, label, planted, seed)
