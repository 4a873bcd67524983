"""The book's figures and display math as a reader sees them at 1280 px.

In headless Chromium, with a 1280-pixel window (the width the book is written
for, as in tests/site/test_site.py), every chapter page is opened once and
measured after MathJax has run:

* every figure is shown at 0.8 of its natural width or more. The book's
  figure style (book/lnorm.mplstyle) sets text of 9 pt or more at 100 dpi, so
  on screen no tick label or legend is smaller than 9 px (9 pt at 100 dpi
  and 0.8 is 10 px); the chapters' code may not pass a smaller ``fontsize``;
* no display equation is wider than the text column: none scrolls sideways
  and none sticks out of it, with every solution opened.

Static checks of the built HTML: every image has alt text that says what it
shows in a sentence, not a file name, and every chapter that draws applies
the book's figure style.
"""

from __future__ import annotations

import functools
import http.server
import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from bs4 import BeautifulSoup
from built_site import ROOT, SITE, executed_cells, needs_site, toc_docnames
from cdp import Browser, chromium

pytestmark = needs_site

WINDOW_WIDTH = 1280
# The least share of its natural width a figure may be shown at.
MIN_SCALE = 0.8
# The least font size, in points, that a chapter's figure code may ask for.
MIN_FONT_PT = 9
STYLE = 'plt.style.use("lnorm.mplstyle")'

# The pages with figures: the intro and the chapters.
PAGES = [p for p in toc_docnames() if p == "book/intro" or re.match(r"book/0[1-6]", p)]

# Opens every dropdown and hidden cell (solutions hold math too), makes every
# image load now, waits until each is decoded, then measures.
MEASURE = """(async () => {
  document.querySelectorAll('details').forEach(d => { d.open = true; });
  document.querySelectorAll('.toggle-hidden .toggle-button').forEach(b => b.click());
  const images = [...document.querySelectorAll('article img')];
  images.forEach(i => { i.loading = 'eager'; });
  await Promise.all(images.map(i => i.decode().catch(() => null)));
  await new Promise(done => setTimeout(done, 300));
  const article = document.querySelector('article').getBoundingClientRect();
  const figures = images.filter(i => i.offsetParent !== null).map(i => ({
    src: i.getAttribute('src'), shown: i.getBoundingClientRect().width,
    natural: i.naturalWidth}));
  const math = [...document.querySelectorAll(
      'article div.math, article mjx-container[display="true"]')]
    .filter(m => m.offsetParent !== null)
    .filter(m => m.scrollWidth > m.clientWidth + 1
                 || m.getBoundingClientRect().right > article.right + 1)
    .map(m => `${m.clientWidth} px box, ${m.scrollWidth} px of math: `
              + m.textContent.slice(0, 60));
  return {figures, math};
})()"""


@contextmanager
def serving_site() -> Iterator[int]:
    """SITE over HTTP on an ephemeral 127.0.0.1 port, quietly; yields the port."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(SITE), **kwargs)

        def log_message(self, format, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture(scope="module")
def measured() -> dict[str, dict]:
    """Each page's figures and overflowing equations, measured in Chromium."""
    if chromium() is None:
        pytest.skip("chromium is not installed (Debian: apt-get install chromium)")
    results = {}
    with serving_site() as port:
        # Nothing may leave the machine: every other host goes to a closed port.
        browser = Browser(width=WINDOW_WIDTH, height=2000,
                          flags=("--proxy-server=http://127.0.0.1:9",))
        try:
            for docname in PAGES:
                browser.load(f"http://127.0.0.1:{port}/{docname}.html")
                browser.evaluate(
                    "(window.MathJax && MathJax.startup && MathJax.startup.promise"
                    " ? MathJax.startup.promise : Promise.resolve()).then(() => true)")
                results[docname] = browser.evaluate(MEASURE)
        finally:
            browser.close()
    return results


@pytest.mark.parametrize("docname", PAGES)
def test_figures_are_shown_at_their_size(measured: dict, docname: str) -> None:
    figures = measured[docname]["figures"]
    unloaded = [f["src"] for f in figures if not f["natural"]]
    assert not unloaded, f"{docname}: images that did not load: {unloaded}"
    small = [
        f"{f['src'].rsplit('/', 1)[-1][:12]}: {f['shown']:.0f} of {f['natural']} px"
        f" ({f['shown'] / f['natural']:.2f})"
        for f in figures
        if f["shown"] < MIN_SCALE * f["natural"]
    ]
    assert not small, (
        f"{docname}: figures shrunk below {MIN_SCALE} of their natural width at "
        f"{WINDOW_WIDTH} px, so their text is too small to read: {small}; make "
        "them narrower (at most 8.2 inches at the style's 100 dpi)"
    )


@pytest.mark.parametrize("docname", PAGES)
def test_display_math_fits_the_column(measured: dict, docname: str) -> None:
    wide = measured[docname]["math"]
    assert not wide, (
        f"{docname}: display equations wider than the column at {WINDOW_WIDTH} px"
        f" (they scroll sideways): {wide}; split them over lines (aligned)"
    )


# ---------------------------------------------------------------- static checks


@functools.lru_cache(maxsize=None)
def page(docname: str) -> BeautifulSoup:
    html = (SITE / f"{docname}.html").read_text(encoding="utf-8")
    return BeautifulSoup(html, "html.parser")


def alt_problem(alt: str | None, src: str) -> str | None:
    """Why an image's alt text does not say what the image shows, or None."""
    text = (alt or "").strip()
    name = src.rsplit("/", 1)[-1]
    if not text:
        return "no alt text"
    if name in text or re.search(r"\.(png|jpe?g|svg|gif)\b", text, re.I) or (
        re.fullmatch(r"[\w./-]+", text)
    ):
        return f"alt text is a file name: {text!r}"
    if len(text.split()) < 8 or not text.endswith("."):
        return f"alt text is not a sentence: {text!r}"
    return None


@pytest.mark.parametrize("docname", PAGES)
def test_every_image_says_what_it_shows(docname: str) -> None:
    images = page(docname).select("article img")
    problems = [
        f"{img.get('src', '?').rsplit('/', 1)[-1][:12]}: {why}"
        for img in images
        if (why := alt_problem(img.get("alt"), img.get("src", "")))
    ]
    assert not problems, (
        f"{docname}: {problems}; give the figure cell "
        "`mystnb: {image: {alt: ...}}` options, one sentence saying what it shows"
    )


def test_alt_text_check_catches_file_names() -> None:
    assert alt_problem(None, "_images/ab12.png")
    assert alt_problem("../_images/ab12.png", "../_images/ab12.png")
    assert alt_problem("ab12.png", "../_images/ab12.png")
    assert alt_problem("A plot.", "x.png")
    assert alt_problem(
        "Bars of the measured time of three rungs beside the model.", "x.png"
    ) is None


@pytest.mark.parametrize("docname", PAGES)
def test_chapter_applies_the_book_style_before_it_draws(docname: str) -> None:
    code = [c for c in executed_cells(docname) or [] if c["cell_type"] == "code"]
    drew = [i for i, c in enumerate(code) if "image/png" in json.dumps(c["outputs"])]
    if not drew:
        pytest.skip(f"{docname} draws no figure")
    before = "".join("".join(c["source"]) for c in code[: drew[0] + 1])
    assert STYLE in before, (
        f"{docname}: apply the book's figure style ({STYLE}) before the first "
        "figure, in the cell that imports pyplot"
    )


@pytest.mark.parametrize("docname", PAGES)
def test_no_figure_text_below_the_least_size(docname: str) -> None:
    text = (ROOT / f"{docname}.md").read_text(encoding="utf-8")
    small = [
        m.group(0)
        for m in re.finditer(r"\b(?:title_)?fontsize\s*=\s*([0-9.]+)", text)
        if float(m.group(1)) < MIN_FONT_PT
    ]
    assert not small, (
        f"{docname}: text below {MIN_FONT_PT} pt in its figures: {small}; "
        "leave the size to the book's style (book/lnorm.mplstyle)"
    )


def test_the_style_sets_legible_text() -> None:
    """The style's text sizes and resolution: what the 9-px law above rests on."""
    import matplotlib

    style = matplotlib.rc_params_from_file(
        ROOT / "book" / "lnorm.mplstyle", use_default_template=False
    )
    assert style["figure.dpi"] == 100
    for key in ("font.size", "axes.titlesize", "axes.labelsize", "xtick.labelsize",
                "ytick.labelsize", "legend.fontsize", "legend.title_fontsize"):
        assert float(style[key]) >= MIN_FONT_PT, f"lnorm.mplstyle: {key} below 9 pt"
