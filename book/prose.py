r"""Numbers for the book's prose: inline values, one number format, one table.

Every number a chapter quotes comes from a cell. The prose shows it with MyST's
inline role ``{eval}`expression```, evaluated in the chapter's kernel:

* a plain number, formatted by the expression: ``{eval}`f"{ratio:.1f}"```;
* a number in scientific notation, as a × 10^k: ``{eval}`sci(err, 1)```.
  The site typesets it as math, ``$1.2 \times 10^{-5}$`` (the book sets
  ``nb_render_markdown_format: myst``); JupyterLab shows it as text in the
  line, ``1.2 × 10⁻⁵``.

An expression gives text, a Python ``int`` or a :class:`Sci`; a float would
show all its digits, and a NumPy scalar its type too
(``np.float64(0.30000000000000004)``), so they are refused (see :func:`inline`).

In JupyterLab, jupyterlab-myst evaluates the roles when a Markdown cell runs.
For the site, the book's Sphinx hook (``book/_ext/lnorm_eval.py``) puts a
hidden cell before each such Markdown cell that evaluates the same expressions
at the same point and hands them to MyST-NB with :func:`glue`; chapters do not
call it themselves.

Measurements that the prose does not quote go into one collapsed table per
section, made by :func:`table` in a cell tagged ``remove-input``.

Example, in a chapter::

    from prose import sci, table
    err, ratio = 3.2e-7, 2.5
    # prose: the error is {eval}`sci(err, 1)`, {eval}`f"{ratio:.1f}"` times less
    table(["offset", "error"], [[1e4, 3.2e-7], [1e6, 4.1e-7]])

It lives with the chapters (``book/prose.py``): the chapters' kernels run in
``book/`` and import it as ``prose``; ``lnorm`` never does. It imports
MyST-NB only when :func:`glue` is called.

Examples
--------
>>> from prose import inline, sci, table
>>> str(sci(3.2e-7))
'3.2 × 10⁻⁷'
>>> inline(f"{2.5:.1f}"), inline(sci(3.2e-7))
(2.5, 3.2 × 10⁻⁷)
>>> table(["offset", "error"], [[1e4, 3.2e-7], [1e6, 4.1e-7]]).text()
[['10⁴', '3.20 × 10⁻⁷'], ['10⁶', '4.10 × 10⁻⁷']]
"""

from __future__ import annotations

import html
import math
import numbers
from collections.abc import Iterable, Sequence

__all__ = ["Sci", "sci", "Inline", "Typeset", "inline", "glue", "table", "Table"]

_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def _digits(digits: object, who: str) -> int:
    """``digits`` as an int >= 1, else ValueError naming ``who`` ("sci", "table")."""
    if (not isinstance(digits, numbers.Integral) or isinstance(digits, bool)
            or digits < 1):
        raise ValueError(f"{who}: digits must be an integer >= 1, got {digits!r}")
    return int(digits)


class Sci:
    r"""A number to be typeset as ``a × 10^k``.

    Built by :func:`sci`. It shows as Unicode text, ``a × 10ᵏ``: that is
    what JupyterLab puts into a sentence for ``{eval}`sci(x)```, in line
    with the words. On the site the prose typesets it as math,
    ``$a \times 10^{k}$`` (see :func:`inline`).
    A mantissa of exactly one is dropped (``10⁻⁵``, not ``1.0 × 10⁻⁵``);
    numbers with ``k = 0``, zero, NaN and infinities print plainly.

    Its parameters and errors are :func:`sci`'s.

    Attributes
    ----------
    value : float
        The number itself (unrounded).
    mantissa : str
        The digits shown before ``× 10^k``, already rounded.
    exponent : int
        The power of ten ``k``.
    digits : int
        Significant digits of the mantissa.

    See Also
    --------
    sci : The function the chapters call.
    inline : Checks a value the prose shows.

    Examples
    --------
    >>> n = Sci(-0.00031416, digits=3)
    >>> n.mantissa, n.exponent, str(n), float(n)
    ('-3.14', -4, '-3.14 × 10⁻⁴', -0.00031416)
    >>> print(n.latex())
    -3.14 \times 10^{-4}
    """

    def __init__(self, value: float, digits: int = 2) -> None:
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(
                f"sci: value must be a real number, got {type(value).__name__}"
            )
        self.value = float(value)
        self.digits = _digits(digits, "sci")
        if not math.isfinite(self.value):
            self.mantissa, self.exponent = repr(self.value), 0
            return
        if self.value == 0.0:
            self.mantissa, self.exponent = "0", 0
            return
        # Round first, then read the exponent: 9.96e-6 with 2 digits is 1.0e-5.
        mantissa, exponent = f"{self.value:.{self.digits - 1}e}".split("e")
        self.mantissa, self.exponent = mantissa, int(exponent)

    def _parts(self) -> tuple[str, str | None]:
        """(mantissa, exponent) to print; exponent None for plain numbers."""
        if not math.isfinite(self.value) or self.value == 0.0 or self.exponent == 0:
            return self.mantissa, None
        # "1.0 × 10^-5" reads as "10^-5": drop a mantissa that is exactly one.
        if self.mantissa.lstrip("-").rstrip("0").rstrip(".") == "1":
            return ("-" if self.mantissa.startswith("-") else ""), str(self.exponent)
        return self.mantissa, str(self.exponent)

    def latex(self) -> str:
        r"""Return the number in TeX, without dollar signs: ``1.2 \times 10^{-5}``.

        Returns
        -------
        str
            ``a \times 10^{k}``; ``10^{k}`` for a mantissa of one; the plain
            mantissa for ``k = 0``; ``\mathrm{NaN}`` and ``\infty`` for
            non-finite values.

        See Also
        --------
        sci : Builds the number.

        Examples
        --------
        >>> print(sci(0.000012345).latex(), sci(-1e-5).latex())
        1.2 \times 10^{-5} -10^{-5}
        >>> print(sci(float("-inf")).latex())
        -\infty
        """
        if math.isnan(self.value):
            return r"\mathrm{NaN}"
        if math.isinf(self.value):
            return ("-" if self.value < 0 else "") + r"\infty"
        mantissa, exponent = self._parts()
        if exponent is None:
            return mantissa
        if mantissa in ("", "-"):
            return f"{mantissa}10^{{{exponent}}}"
        return f"{mantissa} \\times 10^{{{exponent}}}"

    def __str__(self) -> str:
        if not math.isfinite(self.value):
            return self.mantissa
        mantissa, exponent = self._parts()
        if exponent is None:
            return mantissa
        power = "10" + exponent.translate(_SUPERSCRIPT)
        if mantissa in ("", "-"):
            return f"{mantissa}{power}"
        return f"{mantissa} × {power}"

    def __repr__(self) -> str:
        return str(self)

    def __float__(self) -> float:
        return self.value



def sci(value: float, digits: int = 2) -> Sci:
    r"""Wrap ``value`` to be typeset as a × 10^k with ``digits`` significant digits.

    Parameters
    ----------
    value : float
        Any real number (NumPy scalars too, not ``bool``); NaN and infinities
        print as such.
    digits : int, default 2
        Significant digits of the mantissa ``a`` (>= 1).

    Returns
    -------
    Sci
        Show it in the prose with ``{eval}`sci(value)```.

    Raises
    ------
    TypeError
        ``value`` is not a real number.
    ValueError
        ``digits`` is not an integer >= 1.

    See Also
    --------
    Sci : The class, with its plain-text and TeX forms.
    table : Formats very small and large numbers the same way.

    Examples
    --------
    >>> str(sci(0.000012345))
    '1.2 × 10⁻⁵'
    >>> sci(0.000012345).latex()
    '1.2 \\times 10^{-5}'
    >>> sci(1e-5).latex(), sci(3.5).latex()
    ('10^{-5}', '3.5')
    """
    return Sci(value, digits)


class Typeset:
    r"""A :class:`Sci` for the site's prose: inline math in Markdown.

    Built by :func:`inline`. MyST-NB pastes its Markdown form,
    ``$a \times 10^{k}$``, into the sentence, where MathJax typesets it; its
    ``repr`` is the Unicode form of the number.

    Examples
    --------
    >>> t = Typeset(sci(2.5e-7))
    >>> t, t._repr_markdown_()
    (2.5 × 10⁻⁷, '$2.5 \\times 10^{-7}$')
    """

    def __init__(self, number: Sci) -> None:
        self.number = number

    def __repr__(self) -> str:
        return str(self.number)

    def _repr_markdown_(self) -> str:
        return f"${self.number.latex()}$"


class Inline(str):
    """Text shown inline as it is: its ``repr`` has no quotes.

    Built by :func:`inline`. A notebook shows a value by its ``repr``; for a
    ``str`` that adds quotes, which MyST-NB would print into the prose.

    Examples
    --------
    >>> Inline("2.5")
    2.5
    """

    def __repr__(self) -> str:
        return str(self)


def inline(value: object) -> Inline | Typeset:
    r"""Check a value the prose shows, and return it ready to be shown.

    Parameters
    ----------
    value : str, int or Sci
        What an ``{eval}`` expression gave: text (an f-string formats a
        number, ``f"{x:.2f}"``), a Python ``int`` (not a ``bool`` or a NumPy
        integer) or a :class:`Sci`.

    Returns
    -------
    Inline or Typeset
        ``Inline`` for text and integers; a ``Sci`` becomes ``Typeset``,
        inline math on the site.

    Raises
    ------
    TypeError
        Anything else (a float, a ``bool``, a NumPy scalar or array): it
        would show its ``repr``, all digits and a type name; the message says
        how to format it.

    See Also
    --------
    sci : Numbers typeset as a × 10^k.

    Examples
    --------
    >>> inline(1024), inline("float32"), inline(sci(1e-5))
    (1024, float32, 10⁻⁵)
    >>> inline(0.1 + 0.2)
    Traceback (most recent call last):
    ...
    TypeError: inline: type float shows all its digits; format it: f"{x:.3g}" or sci(x)
    """
    if isinstance(value, Sci):
        return Typeset(value)
    if isinstance(value, str):
        return Inline(value)
    if type(value) is int:
        return Inline(str(value))
    raise TypeError(
        f"inline: type {type(value).__name__} shows all its digits; "
        'format it: f"{x:.3g}" or sci(x)'
    )


def glue(**values: object) -> None:
    r"""Hand the values of ``{eval}`` roles to MyST-NB, without displaying them.

    The book's Sphinx hook (``book/_ext/lnorm_eval.py``) calls it in a hidden
    cell it puts before each Markdown cell with ``{eval}`` roles; chapters
    write ``{eval}`` and never call it.

    Parameters
    ----------
    **values
        ``name=value`` pairs; each value must pass :func:`inline`.

    Returns
    -------
    None

    Raises
    ------
    TypeError
        A value that :func:`inline` refuses: the build stops at the cell
        (values before it in the call are already glued).
    ModuleNotFoundError
        MyST-NB is not installed (it comes with the book's requirements).

    See Also
    --------
    inline : What a value may be.

    Examples
    --------
    Outside a notebook nothing is shown:

    >>> glue(eps=sci(1e-5), D=1024, name=f"{0.5:.2f}")
    """
    from myst_nb import glue as _myst_glue

    for name, value in values.items():
        _myst_glue(name, inline(value), display=False)


def _cell(value: object, digits: int) -> str:
    if (isinstance(value, Sci) or isinstance(value, bool)
            or not isinstance(value, numbers.Real)):
        return str(value)
    if isinstance(value, numbers.Integral):
        return f"{int(value):,}"
    v = float(value)
    if v == 0.0 or not math.isfinite(v):
        return f"{v:g}"
    # Round first, then choose the form: 0.09999 to 3 digits is 0.100, and
    # 9999.7 is 1.00 × 10⁴, not 10000.
    v = float(f"{v:.{digits - 1}e}")
    if 1e-2 <= abs(v) < 1e4:
        return _fixed(v, digits)
    return str(Sci(v, digits))


def _fixed(v: float, digits: int) -> str:
    """``digits`` significant digits without exponent (for 0.01 <= |v| < 1e4)."""
    decimals = max(digits - 1 - math.floor(math.log10(abs(v))), 0)
    return f"{v:.{decimals}f}"


class Table:
    r"""A collapsed table of measurements, in HTML for the site and JupyterLab.

    Built by :func:`table`, which documents the parameters. In a notebook it
    shows as a ``<details>`` element whose summary line is ``title``; its
    ``repr`` is a plain-text table.

    See Also
    --------
    table : The function the chapters call.

    Examples
    --------
    >>> t = Table(["D", "ratio"], [[64, 1.5], [128, 2.25]], title="Ratios")
    >>> t.columns, t.text()
    (['D', 'ratio'], [['64', '1.50'], ['128', '2.25']])
    >>> t._repr_html_().startswith('<details class="lnorm-table"><summary>Ratios')
    True
    """

    def __init__(self, columns: Sequence[str], rows: Iterable[Sequence[object]],
                 title: str = "Measurements", digits: int = 3,
                 open: bool = False) -> None:
        self.columns = [str(c) for c in columns]
        self.rows = [list(r) for r in rows]
        for r in self.rows:
            if len(r) != len(self.columns):
                raise ValueError(
                    f"table: a row has {len(r)} cells, "
                    f"but there are {len(self.columns)} columns"
                )
        self.title = title
        self.digits = _digits(digits, "table")
        self.open = open

    def text(self) -> list[list[str]]:
        r"""Return the cells as the reader sees them.

        Integers with thousands separators; zero, NaN and infinities as
        ``format(v, "g")`` (``0``, ``nan``, ``inf``); other numbers with
        ``digits`` significant digits, as a × 10^k (Unicode) outside
        ``0.01 <= |v| < 1e4``; anything else, a ``bool`` or a :class:`Sci`
        included (it keeps its own digits), as ``str``.

        Returns
        -------
        list of list of str
            One list per row.

        See Also
        --------
        sci : The a × 10^k form.

        Examples
        --------
        >>> table(["n", "t"], [[12345, 0.000123], ["-", float("nan")]]).text()
        [['12,345', '1.23 × 10⁻⁴'], ['-', 'nan']]
        """
        return [[_cell(v, self.digits) for v in r] for r in self.rows]

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{html.escape(c)}</th>" for c in self.columns)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>"
            for r in self.text()
        )
        state = " open" if self.open else ""
        return (
            f'<details class="lnorm-table"{state}>'
            f"<summary>{html.escape(self.title)}</summary>"
            f'<table class="table"><thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table></details>"
        )

    def __repr__(self) -> str:
        widths = [
            max(len(c), *(len(r[i]) for r in self.text())) if self.rows else len(c)
            for i, c in enumerate(self.columns)
        ]
        lines = [
            self.title, "  ".join(c.ljust(w) for c, w in zip(self.columns, widths))
        ]
        lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in self.text()]
        return "\n".join(lines)


def table(columns: Sequence[str], rows: Iterable[Sequence[object]],
          title: str = "Measurements", digits: int = 3,
          open: bool = False) -> Table:
    r"""Make the book's one table: measurements collapsed under ``title``.

    Return it as the last value of a cell tagged ``remove-input``. Numbers are
    printed with ``digits`` significant digits; very small or large ones as
    a × 10^k (Unicode, so no math rendering is needed).

    Parameters
    ----------
    columns : sequence of str
        Column headings, with units.
    rows : iterable of sequences
        One sequence of cells per row, as long as ``columns``.
    title : str, default "Measurements"
        The line the reader clicks to open the table.
    digits : int, default 3
        Significant digits of numbers (an integer >= 1).
    open : bool, default False
        Show the table open instead of collapsed.

    Returns
    -------
    Table
        Shown as HTML by the notebook; :meth:`Table.text` gives the cells.

    Raises
    ------
    ValueError
        A row whose length differs from the number of columns, or ``digits``
        not an integer >= 1.

    See Also
    --------
    Table : The class, with its HTML and plain-text forms.
    inline : For the numbers the prose quotes instead.

    Examples
    --------
    >>> t = table(["D", "error", "ratio"], [[1024, 3.21e-7, 2.5]])
    >>> t.text()
    [['1,024', '3.21 × 10⁻⁷', '2.50']]
    """
    return Table(columns, rows, title=title, digits=digits, open=open)
