"""book/prose.py: the number format and the table idiom every chapter uses."""

import math
import sys

import numpy as np
import pytest
from built_site import ROOT

sys.path.insert(0, str(ROOT / "book"))
from prose import Inline, Sci, Typeset, glue, inline, sci, table  # noqa: E402


@pytest.mark.parametrize(
    "value, digits, latex, text",
    [
        (1.2345e-5, 2, r"1.2 \times 10^{-5}", "1.2 × 10⁻⁵"),
        (-6.02e23, 3, r"-6.02 \times 10^{23}", "-6.02 × 10²³"),
        (9.96e-6, 2, r"10^{-5}", "10⁻⁵"),  # rounds up into the next decade
        (1e-5, 2, r"10^{-5}", "10⁻⁵"),
        (-1e3, 1, r"-10^{3}", "-10³"),
        (3.5, 2, "3.5", "3.5"),
        (0.0, 2, "0", "0"),
        (math.inf, 2, r"\infty", "inf"),
        (math.nan, 2, r"\mathrm{NaN}", "nan"),
    ],
)
def test_sci_typesets_a_times_ten_to_the_k(value, digits, latex, text):
    s = sci(value, digits)
    assert s.latex() == latex
    assert str(s) == text
    assert Typeset(s)._repr_markdown_() == f"${latex}$"
    assert not hasattr(s, "_repr_markdown_")  # JupyterLab shows the text


def test_sci_keeps_the_value_and_accepts_numpy_scalars():
    s = sci(np.float32(2.5e-7))
    assert isinstance(s, Sci)
    assert float(s) == pytest.approx(2.5e-7, rel=1e-6)
    assert s.latex() == r"2.5 \times 10^{-7}"


@pytest.mark.parametrize("bad", ["1e-5", None, True, 1 + 2j])
def test_sci_rejects_what_is_not_a_real_number(bad):
    with pytest.raises(TypeError, match="real number"):
        sci(bad)


@pytest.mark.parametrize("digits", [0, -1, 1.5])
def test_sci_rejects_bad_digits(digits):
    with pytest.raises(ValueError, match="digits"):
        sci(1.0, digits)


def test_table_formats_cells_and_collapses():
    t = table(
        ["D", "error", "ratio", "name"],
        [[1024, 3.21e-7, 2.5, "fused"], [8, 0.0, 12345.0, "x"]],
    )
    assert t.text() == [
        ["1,024", "3.21 × 10⁻⁷", "2.50", "fused"],
        ["8", "0", "1.23 × 10⁴", "x"],
    ]
    page = t._repr_html_()
    assert page.startswith(
        '<details class="lnorm-table"><summary>Measurements</summary>'
    )
    assert page.count("<tr>") == 3 and "<th>error</th>" in page
    assert " open>" in table(["a"], [[1]], open=True)._repr_html_()


def test_table_escapes_html_and_checks_row_length():
    assert "&lt;b&gt;" in table(["<b>"], [["x"]])._repr_html_()
    with pytest.raises(ValueError, match="2 cells, but there are 1 columns"):
        table(["a"], [[1, 2]])


@pytest.mark.parametrize(
    "value, shown",
    [(f"{2.0 / 3:.2f}", "0.67"), ("float16", "float16"), (1024, "1024"), (-3, "-3")],
)
def test_inline_shows_text_and_integers_without_quotes(value, shown):
    out = inline(value)
    assert isinstance(out, Inline) and repr(out) == shown == str(out)


def test_inline_typesets_a_sci_for_the_site():
    s = sci(3.2e-7)
    t = inline(s)
    assert isinstance(t, Typeset) and t.number is s
    assert repr(t) == "3.2 × 10⁻⁷" and t._repr_markdown_() == r"$3.2 \times 10^{-7}$"


@pytest.mark.parametrize(
    "bad", [0.1 + 0.2, np.float64(0.5), np.int64(3), np.float32(1.5), True, None,
            np.arange(3)]
)
def test_inline_refuses_what_would_show_its_repr(bad):
    # A float prints 17 digits, a NumPy scalar "np.float64(0.5)": both would
    # reach the reader's sentence as they are.
    with pytest.raises(TypeError, match="format it"):
        inline(bad)


def test_glue_hands_checked_values_to_myst_nb(monkeypatch):
    import myst_nb

    seen = {}

    def record(name, value, display):
        seen[name] = (value, display)

    monkeypatch.setattr(myst_nb, "glue", record)
    glue(a=sci(1e-5), b=f"{0.25:.1f}", c=7)
    assert {k: (repr(v), d) for k, (v, d) in seen.items()} == {
        "a": ("10⁻⁵", False),
        "b": ("0.2", False),
        "c": ("7", False),
    }
    with pytest.raises(TypeError):
        glue(d=np.float64(0.5))


def test_table_rounds_before_it_chooses_the_form():
    # 0.09999 to three digits is 0.100 (three digits, not four), and 9999.7
    # rounds to 10000, which is past the fixed-point range: a power of ten.
    cells = table(["a"], [[0.09999], [9999.7], [0.0123456], [123.456]]).text()
    assert cells == [["0.100"], ["10⁴"], ["0.0123"], ["123"]]
    assert "×" in str(sci(1.5e4, 3))


@pytest.mark.parametrize("digits", [0, -1, 2.5, True])
def test_table_refuses_digits_that_are_not_a_positive_integer(digits):
    with pytest.raises(ValueError, match="table: digits"):
        table(["a"], [[1.5]], digits=digits)
