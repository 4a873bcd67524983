"""The glossary is the contract: every symbol in a chapter's math means one
thing, and the glossary or the chapter's short local list says what.

For every page of ``_toc.yml`` the test reads the Markdown (not the code
cells), collects its math (``$...$``, ``$$...$$``, ``{math}`` roles and
directives), splits it into symbols and fails on a symbol that is neither a
term of ``book/glossary.md`` nor in that page's local list below. A local
list holds at most ``MAX_LOCAL`` symbols, and a symbol is local to one page
only and never also in the glossary, so that no two pages give one symbol
two meanings.

How math becomes symbols (``symbols``):

* a Latin letter is a symbol (``x``, ``D``, ``h``); digits, operators and
  commands such as ``\\sum``, ``\\log`` or ``\\le`` are not;
* a Greek letter is a symbol named by its command (``\\mu`` is ``mu``,
  ``\\Delta`` is ``Delta``; ``\\pi`` is a number, not a symbol);
  ``\\varepsilon`` is ``eps``; ``\\ell`` is ``ell``;
* ``\\hat x`` is ``xhat``, ``\\tilde G`` is ``Gtilde``; a bar or overline is
  the symbol ``bar`` (the row mean) and what is under it is read as usual;
* ``d`` directly before a symbol is an adjoint: ``dx``, ``dy``, ``dgamma``,
  ``dbeta``; a derivative ``\\frac{d\\,a}{d\\,b}`` is not;
* ``\\mathrm{rstd}`` or ``\\operatorname{rstd}`` is ``rstd``; ``m_{\\rm hi}``
  and ``m_{\\rm lo}`` are ``m_hi`` and ``m_lo``; ``\\mathrm{i}`` is the
  imaginary unit ``imag``; ``\\text{...}`` is prose and has no symbols.
"""

from __future__ import annotations

import re
from collections import Counter

import pytest
from built_site import ROOT, toc_docnames

MAX_LOCAL = 8

# Symbols that mean something in one page only: symbol -> meaning there.
LOCAL: dict[str, dict[str, str]] = {
    "book/02_derivation": {
        "f": "a function of the summation index, in a rule of expand_sums",
        "r": "RMSNorm's reciprocal root mean square (an exercise)",
    },
    "book/03_gradcheck": {
        "E": "E(h), the error of a central difference at step h",
        "tol": "the tolerance of a check",
        "rel": "the relative error of eq-rel-error",
        "imag": "the imaginary unit of the complex step",
        "alpha": "alpha_1, alpha_2: the factors of a family of wrong formulas",
    },
    "book/04_stability": {
        "Q": "Q_n, Welford's running sum of squared deviations",
        "xi": "xi_n = x_n - m_{n-1}, Welford's increment",
    },
    "book/04b_low_precision": {
        "lambda": "lambda, the coefficient of x in the uncentred dx",
        "nu": "nu, the constant term of the uncentred dx",
        "omega": "omega, the relative spread of g along a row",
        "z": "z_j, standard normal values",
        "V": "V, the size of one outlier entry",
        "ell": "the exponent of a power of two, 2^ell",
    },
}

# Greek letters and \\ell are symbols, except pi, a number. Every other command is an
# operator, a function or layout, not a symbol.
SYMBOL_COMMANDS = {"ell"}
GREEK = {
    "alpha", "beta", "gamma", "delta", "epsilon", "varepsilon", "zeta", "eta",
    "theta", "iota", "kappa", "lambda", "mu", "nu", "xi", "rho",
    "sigma", "tau", "upsilon", "phi", "varphi", "chi", "psi", "omega",
    "Gamma", "Delta", "Theta", "Lambda", "Xi", "Pi", "Sigma", "Phi", "Psi",
    "Omega",
}
ALIASES = {"varepsilon": "eps", "epsilon": "eps"}
# \mathrm / \operatorname words that are operators, not symbols.
OPERATOR_WORDS = {"diag", "Im", "Re", "argmin", "ulp", "sign", "mean"}

FENCE = re.compile(r"^(`{3,}|:{3,})\s*(\S*)")
# Fenced blocks whose body is not Markdown prose.
CODE_INFO = re.compile(r"^(\{(code-cell|eval-rst)\}|[a-z0-9]*)$")
# An indented code block (four spaces after a blank line): code, not math.
INDENTED_CODE = re.compile(r"^\n((?:(?: {4}|\t).*\n|[ \t]*\n)+)", re.M)
MATH_ROLE = re.compile(r"\{math\}`([^`]*)`")
ROLE_OR_CODE = re.compile(r"\{[a-z:-]+\}`[^`]*`|``.*?``|`[^`\n]*`", re.S)
DISPLAY = re.compile(r"\$\$(.*?)\$\$", re.S)
INLINE = re.compile(r"(?<![\\$])\$((?:[^$\n]|\n(?![ \t]*\n))+?)\$")

TOKEN = re.compile(
    r"(?P<mhilo>m_\{\s*(?:\\rm\s+|\\mathrm\s*\{)(?P<hilo>hi|lo)\}?\s*\})"
    r"|(?P<rmword>\\(?:mathrm|operatorname|mathit|rm)\s*\{\s*(?P<w1>[A-Za-z]+)"
    r"\s*\}|\\rm\s+(?P<w2>[A-Za-z]+))"
    r"|(?P<accent>\\(?:hat|widehat|tilde|widetilde)\s*\{?\s*"
    r"(?P<acc_arg>\\[A-Za-z]+|[A-Za-z])\s*\}?)"
    r"|(?P<adjoint>(?<![A-Za-z\\])d(?=\s*(?:\\(?:hat|gamma|beta|mu|sigma|"
    r"mathrm|operatorname)\b|[A-Za-z])))"
    r"|(?P<command>\\[A-Za-z]+)"
    r"|(?P<letter>[A-Za-z])"
)
SKIP_ARG = re.compile(
    r"\\(?:text|textrm|textit|mbox|mathbb|label|tag|begin|end|mathbf"
    r"|hspace|quad|qquad)\s*\{[^{}]*\}")


def prose_and_math(markdown: str) -> tuple[str, list[str]]:
    """A page's Markdown without front matter and code blocks, and the bodies
    of its ``{math}`` directives."""
    markdown = re.sub(r"\A---\n.*?\n---\n", "", markdown, count=1, flags=re.S)
    kept, math, stack = [], [], []  # stack: (fence, kind) of open blocks
    for line in markdown.splitlines():
        m = FENCE.match(line)
        if stack and m and m.group(1) == stack[-1][0] and not m.group(2):
            stack.pop()
            continue
        if m and not (stack and stack[-1][1] != "prose"):
            info = m.group(2)
            kind = ("math" if info == "{math}" else
                    "code" if m.group(1)[0] == "`" and CODE_INFO.match(info)
                    else "prose")
            stack.append((m.group(1), kind))
            continue
        kind = stack[-1][1] if stack else "prose"
        if kind == "math":
            math.append(line)
        elif kind == "prose" and not line.lstrip().startswith(":"):
            kept.append(line)
    return "\n".join(kept) + "\n", ["\n".join(math)] if math else []


def math_of(markdown: str) -> list[str]:
    """Every math expression of a page's Markdown, code cells left out."""
    text, found = prose_and_math(markdown)
    found += MATH_ROLE.findall(text)
    text = ROLE_OR_CODE.sub(" ", text)
    text = INDENTED_CODE.sub("\n", text)
    found += DISPLAY.findall(text)
    found += INLINE.findall(DISPLAY.sub(" ", text))
    return found


def symbols(tex: str) -> list[str]:
    """The symbols of one math expression, named as the glossary names them."""
    # a total derivative, d a / d b: its d's are not adjoints
    tex = re.sub(r"\\frac\s*\{\s*d([^{}]*)\}\s*\{\s*d",
                 r"\\frac{\\partial \1}{\\partial ", tex)
    tex = re.sub(r"(?<![A-Za-z\\])d\s*/\s*d(?=\s*[A-Za-z\\])",
                 r"\\partial/\\partial ", tex)
    tex = SKIP_ARG.sub(" ", tex)
    out: list[str] = []
    pending_adjoint = False
    for m in TOKEN.finditer(tex):
        name = None
        if m.group("mhilo"):
            name = "m_" + m.group("hilo")
        elif m.group("rmword"):
            word = m.group("w1") or m.group("w2")
            if word in OPERATOR_WORDS:
                continue
            name = {"i": "imag"}.get(word, word)
        elif m.group("accent"):
            arg = m.group("acc_arg").lstrip("\\")
            kind = "hat" if "hat" in m.group("accent") else "tilde"
            name = ALIASES.get(arg, arg) + kind
        elif m.group("adjoint"):
            pending_adjoint = True
            continue
        elif m.group("command"):
            cmd = m.group("command")[1:]
            if cmd in ("bar", "overline"):
                name = "bar"
            elif cmd in GREEK or cmd in SYMBOL_COMMANDS:
                name = ALIASES.get(cmd, cmd)
            else:
                continue
        else:
            name = m.group("letter")
        if pending_adjoint:
            pending_adjoint = False
            name = "d" + name
        out.append(name)
    return out


def glossary_terms() -> set[str]:
    """The terms of the ``{glossary}`` directive of book/glossary.md."""
    text = (ROOT / "book" / "glossary.md").read_text(encoding="utf-8")
    body = re.search(r"```\{glossary\}\n(.*?)\n```", text, re.S).group(1)
    return {line.strip() for line in body.splitlines()
            if line.strip() and not line.startswith((" ", "\t"))}


def unknown_symbols(doc: str, text: str, terms: set[str]) -> Counter:
    """Symbols of a page's math in neither the glossary nor its local list."""
    allowed = terms | set(LOCAL.get(doc, {}))
    return Counter(s for tex in math_of(text) for s in symbols(tex)
                   if s not in allowed)


def page_text(doc: str) -> str:
    return (ROOT / f"{doc}.md").read_text(encoding="utf-8")


PAGES = toc_docnames()


@pytest.mark.parametrize("doc", PAGES)
def test_every_symbol_is_in_the_glossary_or_local(doc):
    unknown = unknown_symbols(doc, page_text(doc), glossary_terms())
    assert not unknown, (
        f"{doc}.md uses symbols that book/glossary.md does not define and "
        f"LOCAL[{doc!r}] does not list: {dict(unknown)}; add each to the "
        "glossary (one meaning for the whole book) or, if it lives in this "
        "page only, to its local list")


def test_local_lists_are_short_used_and_do_not_shadow():
    terms = glossary_terms()
    owners = Counter(s for names in LOCAL.values() for s in names)
    for doc, names in LOCAL.items():
        assert doc in PAGES, f"LOCAL names {doc}, which is not in _toc.yml"
        assert len(names) <= MAX_LOCAL, (
            f"{doc} has {len(names)} local symbols, more than {MAX_LOCAL}: "
            "move the ones other pages could use to the glossary")
        clash = set(names) & terms
        assert not clash, f"{doc}: local symbols {clash} are glossary terms"
        used = {s for tex in math_of(page_text(doc)) for s in symbols(tex)}
        assert set(names) <= used, (
            f"{doc}: local symbols {set(names) - used} are not used")
    shared = [s for s, n in owners.items() if n > 1]
    assert not shared, f"symbols local to more than one page: {shared}"


@pytest.mark.parametrize("tex, expected", [
    (r"dx = \mathrm{rstd}\,(g - \overline{g} - \hat x\,\overline{g\hat x})",
     ["dx", "rstd", "g", "bar", "g", "xhat", "bar", "g", "xhat"]),
    (r"m_{\rm hi} + m_{\rm lo}", ["m_hi", "m_lo"]),
    (r"\frac{d\sigma^2}{dx_j} = \frac2D\,(x_j - \mu)",
     ["sigma", "x", "j", "D", "x", "j", "mu"]),
    (r"d\gamma = \sum_{\text{rows}} dy\odot\hat x", ["dgamma", "dy", "xhat"]),
    (r"\varepsilon + \delta_{ij} + \Delta\mu",
     ["eps", "delta", "i", "j", "Delta", "mu"]),
    (r"\operatorname{Im} L(a + \mathrm{i} h e_i)",
     ["L", "a", "imag", "h", "e", "i"]),
    (r"\sum_j d_j = -D\,\Delta\mu", ["j", "d", "j", "D", "Delta", "mu"]),
    (r"d/dx", ["x"]),
])
def test_symbols_are_read_as_the_glossary_names_them(tex, expected):
    assert symbols(tex) == expected


def test_math_is_found_in_prose_and_directives_not_in_code():
    page = "\n".join([
        "Prose $a + b$ and $$c$$ and {math}`d`.",
        "```{code-cell} ipython3", "x = '$zeta$'", "```",
        "```{exercise}", ":label: e", "Inside $\\hat q$.", "```",
        "```{math}", "\\nu", "```",
        "", "    def f(x): return '$Q$'", "",
    ])
    found = sorted(s for tex in math_of(page) for s in symbols(tex))
    assert found == ["a", "b", "c", "d", "nu", "qhat"]


def test_a_planted_symbol_fails():
    """The check can fail: a chapter with an unknown symbol is reported."""
    doc, terms = "book/01_forward", glossary_terms()
    text = page_text(doc)
    assert not unknown_symbols(doc, text, terms)
    planted = text + "\nA planted symbol: $\\zeta + \\hat q$.\n"
    assert set(unknown_symbols(doc, planted, terms)) == {"zeta", "qhat"}
