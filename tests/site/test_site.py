"""The built site as a reader meets it: offline, in a real browser.

Every page listed in ``_toc.yml`` is served from ``_build/html`` on 127.0.0.1
and opened in headless Chromium, with every address outside the machine sent
to a proxy that refuses and records it. After MathJax has run, the page's DOM
must show no traceback, no unrendered TeX, no missing image, no broken
internal link, and the page must have asked for nothing outside the site.
Static passes over the built HTML check what a reader relies on without a
browser: every internal link and anchor, the downloads, the bibliography,
the glossary, chapter and equation numbers. (tests/test_book.py checks the
build itself: its log, the execution of the chapters, the glue.)

Run by ``make test`` after the book is built (``make site-tests``). Set
``LNORM_SITE_DIR`` to check a build made elsewhere (``--path-output``).
"""

from __future__ import annotations

import functools
import http.server
import json
import posixpath
import re
import socketserver
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

import pytest
import yaml
from bs4 import BeautifulSoup
from built_site import (
    ROOT,
    SITE,
    built,
    executed_cells,
    needs_site,
    toc_docnames,
)
from cdp import Browser, chromium

pytestmark = needs_site


# Chromium contacts these hosts on its own (component updates, clock, sign-in),
# whatever page it shows: Chromium 150 asks for www.google.com and
# android.clients.google.com while it shows about:blank. Listed exactly, so
# that a page loading anything from a CDN or a font service (cdn.jsdelivr.net,
# unpkg.com, fonts.googleapis.com, ...) is still caught; and what the page
# itself asks for is checked apart, through the browser's Network events.
BROWSER_SERVICE_HOSTS = frozenset(
    {"accounts.google.com", "clients2.google.com", "update.googleapis.com",
     "www.google.com", "android.clients.google.com"}
)

# The symbols every chapter shares (see the glossary page).
GLOSSARY_SYMBOLS = (
    "x",
    "xhat",
    "mu",
    "var",
    "rstd",
    "g",
    "D",
    "eps",
    "gamma",
    "beta",
    "dy",
)
# Labels chapters link to across the book, in chapter order.
CHAPTER_LABELS = (
    "ch-forward",
    "ch-derivation",
    "ch-gradcheck",
    "ch-stability",
    "ch-low-precision",
    "ch-cost",
    "ch-gpu",
)
DERIVATION_EQUATIONS = ("eq-rstd", "eq-xhat", "eq-dx", "eq-dgamma", "eq-dbeta")

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-default-apps",
    "--disable-client-side-phishing-detection",
    "--disable-domain-reliability",
    "--no-pings",
    "--metrics-recording-only",
    "--password-store=basic",
    "--disable-features=NetworkTimeServiceQuerying,OptimizationHints,Translate,MediaRouter",
)

# Tags whose href/src the browser fetches while loading the page.
LOADING_TAGS = frozenset(
    {"script", "link", "img", "iframe", "source", "audio", "video", "embed"}
)
# How image files start, to catch an empty or truncated figure.
IMAGE_MAGIC = {
    ".png": b"\x89PNG\r\n\x1a\n",
    ".jpg": b"\xff\xd8",
    ".jpeg": b"\xff\xd8",
    ".gif": b"GIF8",
}
NON_LINK_SCHEMES = ("mailto:", "javascript:", "data:", "tel:", "blob:", "about:")


PAGES = toc_docnames()
# The root page (intro) is not numbered; the API appendix's module pages are
# its sections (10.1, 10.2, ...), not chapters.
CHAPTERS = [
    p for p in PAGES[1:] if not p.startswith("book/api/") or p.endswith("/index")
]


def source_of(docname: str) -> str:
    """The MyST markdown source the page was built from (its copy in the build)."""
    return (SITE / "_sources" / f"{docname}.md").read_text(encoding="utf-8")


def is_notebook(docname: str) -> bool:
    """A chapter is a notebook when its front matter names a kernel."""
    match = re.match(r"---\n(.*?)\n---\n", source_of(docname), re.S)
    return bool(match) and "kernelspec" in yaml.safe_load(match.group(1))


def parse(html: str) -> BeautifulSoup:
    return BeautifulSoup(html, "html.parser")


@functools.lru_cache(maxsize=None)
def ids_in(relpath: str) -> frozenset[str]:
    """Every anchor a fragment can point to in one built HTML file."""
    soup = built(relpath)
    ids = {tag["id"] for tag in soup.find_all(id=True)}
    ids |= {tag["name"] for tag in soup.find_all("a", attrs={"name": True})}
    return frozenset(ids)


def target_of(page: str, href: str) -> str:
    """The site-relative path an address on ``page`` points to (``page`` itself for
    ``#anchor``)."""
    path = unquote(urlsplit(href).path)
    return (
        posixpath.normpath(posixpath.join(posixpath.dirname(page), path))
        if path
        else page
    )


def check_reference(page: str, value: str, loading: bool) -> str | None:
    """Why a reference found on ``page`` (site-relative path) is broken, or None.

    ``loading`` is True for addresses the browser fetches by itself
    (scripts, styles, images); those must stay inside the site.
    """
    value = value.strip()
    if not value or value.startswith(NON_LINK_SCHEMES):
        return None
    parts = urlsplit(value)
    if parts.scheme or parts.netloc:
        return f"loads {value} from outside the site" if loading else None
    target = target_of(page, value)
    if target.startswith("../") or target == "..":
        return f"{value} points outside the site"
    path = SITE / target
    if path.is_dir():
        target = posixpath.join(target, "index.html")
        path = SITE / target
    if not path.is_file():
        return f"{value}: no file {target} in the build"
    if parts.fragment and target.endswith(".html"):
        if unquote(parts.fragment) not in ids_in(target):
            return f"{value}: no anchor #{parts.fragment} in {target}"
    return None


def broken_references(page: str, soup: BeautifulSoup) -> list[str]:
    """Every broken href/src on one page (a parsed file or a browser DOM)."""
    problems = []
    for tag in soup.find_all(True):
        for attr in ("href", "src"):
            if not tag.has_attr(attr):
                continue
            loading = tag.name in LOADING_TAGS and not (
                tag.name == "link" and "canonical" in (tag.get("rel") or [])
            )
            problem = check_reference(page, tag[attr], loading)
            if problem:
                problems.append(f"<{tag.name} {attr}>: {problem}")
    for meta in soup.find_all(
        "meta", attrs={"http-equiv": re.compile("refresh", re.I)}
    ):
        match = re.search(r"url=(\S+)", meta.get("content", ""), re.I)
        if match:
            problem = check_reference(page, match.group(1), loading=True)
            if problem:
                problems.append(f"<meta refresh>: {problem}")
    return problems


# ---------------------------------------------------------------- the browser


@dataclass(frozen=True)
class Visit:
    """What one page did in the browser."""

    dom: BeautifulSoup
    requests: tuple[tuple[str, int], ...]  # (path, HTTP status) served by the site
    outside: tuple[str, ...]  # hosts outside the machine the browser asked for
    console_errors: tuple[str, ...]
    sideways: tuple[str, ...]  # code boxes that scroll sideways, dropdowns open
    page_urls: tuple[str, ...] = ()  # every URL the page itself requested


@contextmanager
def serving(
    handler: type[socketserver.BaseRequestHandler], tcp: type[socketserver.TCPServer]
) -> Iterator[socketserver.TCPServer]:
    """Run a server on an ephemeral 127.0.0.1 port in a thread; always shut it down."""
    server = tcp(("127.0.0.1", 0), handler)
    server.daemon_threads = True  # type: ignore[attr-defined]
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True
    )
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def site_handler(
    log: list[tuple[str, int]],
) -> type[http.server.SimpleHTTPRequestHandler]:
    """Serves SITE read-only and records every request with its status."""

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(SITE), **kwargs)

        def log_request(self, code="-", size="-"):
            log.append((urlsplit(self.path).path, int(code)))

        def log_message(self, format, *args):  # quiet: the log list says it all
            pass

    return Handler


def refusing_proxy(hosts: list[str]) -> type[socketserver.BaseRequestHandler]:
    """A proxy that answers 403 to everything and records the host asked for."""

    class Refuse(socketserver.BaseRequestHandler):
        def handle(self):
            self.request.settimeout(5)
            try:
                line = self.request.recv(8192).split(b"\r\n", 1)[0].decode("latin-1")
            except OSError:
                return
            fields = line.split()
            if len(fields) >= 2:
                target = fields[1]
                host = (
                    urlsplit(target).hostname
                    if "://" in target
                    else target.rsplit(":", 1)[0]
                )
                hosts.append(host or target)
            try:
                self.request.sendall(
                    b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n"
                    b"Connection: close\r\n\r\n"
                )
            except OSError:
                pass

    return Refuse


# After the load event: MathJax typesets once its startup promise resolves.
MATHJAX_DONE = (
    "(window.MathJax && MathJax.startup && MathJax.startup.promise"
    " ? MathJax.startup.promise : Promise.resolve()).then(() => true)"
)


# The width the book is written for: code lines of at most 79 characters must
# fit without scrolling sideways (_static/lnorm.css sizes the code for it).
WINDOW_WIDTH = 1280

# After the DOM is read: open every dropdown (solutions) and every hidden cell,
# then list each visible code box whose content is wider than the box, as
# "box width < content width: widest line". The toggles switch classes at
# once (only opacity and height are animated): two frames of layout suffice,
# not a fixed wait; a line made too long in a hidden cell is still caught.
SIDEWAYS = """(() => {
  document.querySelectorAll('details').forEach(d => { d.open = true; });
  document.querySelectorAll('.toggle-hidden .toggle-button').forEach(b => b.click());
  const frame = () => new Promise(done => requestAnimationFrame(done));
  return frame().then(frame).then(() =>
    [...document.querySelectorAll('pre')]
      .filter(p => p.offsetParent !== null && p.scrollWidth > p.clientWidth + 1)
      .map(p => `${p.clientWidth} < ${p.scrollWidth}: ` + p.textContent.split('\\n')
        .reduce((a, l) => (l.length > a.length ? l : a), '')));
})()"""


@pytest.fixture(scope="module")
def visits() -> dict[str, Visit]:
    """Open every toc page in headless Chromium once; the tests below inspect the
    results. One browser, driven over CDP (tests/cdp.py), with its cache off:
    nothing comes from the previous page's cache."""
    if chromium() is None:
        pytest.skip(
            "chromium is not installed "
            "(Debian: apt-get install chromium; .ci/run does it)"
        )
    requests: list[tuple[str, int]] = []
    outside: list[str] = []
    results: dict[str, Visit] = {}
    with (
        serving(site_handler(requests), http.server.ThreadingHTTPServer) as site,
        serving(refusing_proxy(outside), socketserver.ThreadingTCPServer) as proxy,
    ):
        browser = Browser(
            width=WINDOW_WIDTH,
            flags=(
                *CHROMIUM_FLAGS,
                f"--proxy-server=http://127.0.0.1:{proxy.server_address[1]}",
            )
        )
        try:
            browser.call("Network.enable")
            browser.call("Network.setCacheDisabled", cacheDisabled=True)
            for docname in PAGES:
                first_request, first_outside = len(requests), len(outside)
                browser.events.clear()
                url = f"http://127.0.0.1:{site.server_address[1]}/{docname}.html"
                browser.load(url)
                browser.evaluate(MATHJAX_DONE)
                dom = parse(browser.evaluate("document.documentElement.outerHTML"))
                sideways = tuple(browser.evaluate(SIDEWAYS))
                results[docname] = Visit(
                    dom=dom,
                    requests=tuple(requests[first_request:]),
                    outside=tuple(outside[first_outside:]),
                    console_errors=tuple(browser.errors()),
                    sideways=sideways,
                    page_urls=tuple(
                        e["params"]["request"]["url"] for e in browser.events
                        if e.get("method") == "Network.requestWillBeSent"),
                )
        finally:
            browser.close()
    return results


def visible_text_nodes(soup: BeautifulSoup) -> Iterator[str]:
    """Text a reader sees as prose: not code, not scripts, not rendered math."""
    skip = {
        "script",
        "style",
        "pre",
        "code",
        "textarea",
        "noscript",
        "template",
        "mjx-container",
        "mjx-assistive-mml",
    }
    for text in soup.find_all(string=True):
        if not any(parent.name in skip for parent in text.parents):
            yield str(text)


def mathjax_text(node: BeautifulSoup) -> str:
    """The characters MathJax draws in a node (each is an <mjx-c class="mjx-c5C">)."""
    codes = [
        cls[5:]
        for c in node.find_all("mjx-c")
        for cls in c.get("class", [])
        if cls.startswith("mjx-c")
    ]
    return (
        "".join(
            chr(int(code, 16)) for code in codes if re.fullmatch(r"[0-9A-Fa-f]+", code)
        )
        or str(node)[:80]
    )


RAW_TEX = re.compile(r"\\\(|\\\)|\\\[|\\\]|\$\$|\$[^\s$][^$\n]*\$")


@pytest.mark.parametrize("docname", PAGES)
def test_page_math_is_rendered(visits: dict[str, Visit], docname: str) -> None:
    dom = visits[docname].dom
    static = built(f"{docname}.html")
    math_nodes = dom.select("span.math, div.math")
    assert len(math_nodes) == len(static.select("span.math, div.math")), (
        "math nodes lost"
    )
    unrendered = [
        node.get_text()[:80]
        for node in math_nodes
        if node.find("mjx-container") is None
    ]
    assert not unrendered, (
        f"MathJax did not render {len(unrendered)} formulas, e.g. {unrendered[:3]}"
    )
    assert len(dom.find_all("mjx-container")) >= len(math_nodes)
    # MathJax shows a TeX error as merror, an undefined macro as red text.
    errors = dom.select("mjx-merror, [data-mjx-error]")
    errors += [
        node
        for node in dom.find_all("mjx-mtext")
        if "color: red" in node.get("style", "")
    ]
    assert not errors, (
        f"{len(errors)} TeX errors in formulas, e.g. {mathjax_text(errors[0])!r}"
    )
    raw = [
        match.group(0)
        for text in visible_text_nodes(dom)
        for match in RAW_TEX.finditer(text)
    ]
    assert not raw, f"TeX left as text in the page: {raw[:5]}"


@pytest.mark.parametrize("docname", PAGES)
def test_page_shows_no_traceback_or_error(
    visits: dict[str, Visit], docname: str
) -> None:
    visit = visits[docname]
    bad_outputs = visit.dom.select(".output.traceback, .output.stderr, .output.error")
    assert not bad_outputs, f"error output shown: {bad_outputs[0].get_text()[:300]}"
    # A traceback in a cell's output; the API appendix's docstring examples
    # may show an exception the function raises on purpose (doctest style).
    for cell in visit.dom.select(".cell_output, .output"):
        assert "Traceback (most recent call last)" not in cell.get_text()
    if not docname.startswith("book/api/"):
        assert "Traceback (most recent call last)" not in visit.dom.get_text()
    assert not visit.console_errors, f"JavaScript errors: {visit.console_errors}"


@pytest.mark.parametrize("docname", PAGES)
def test_no_code_scrolls_sideways(visits: dict[str, Visit], docname: str) -> None:
    # In a 1280-pixel window, with every solution and hidden cell opened.
    sideways = visits[docname].sideways
    assert not sideways, f"code boxes scroll sideways: {list(sideways)[:3]}"


@pytest.mark.parametrize("docname", PAGES)
def test_page_loads_only_from_the_site(visits: dict[str, Visit], docname: str) -> None:
    visit = visits[docname]
    outside = sorted(set(visit.outside) - BROWSER_SERVICE_HOSTS)
    assert not outside, f"the page asked for hosts outside the site: {outside}"
    own = [u for u in visit.page_urls if urlsplit(u).scheme in ("http", "https")
           and urlsplit(u).hostname != "127.0.0.1"]
    assert visit.page_urls and not own, f"the page requested outside the site: {own}"
    # Browsers ask for /favicon.ico on their own; this site has none.
    failed = [
        (path, status)
        for path, status in visit.requests
        if status >= 400 and path != "/favicon.ico"
    ]
    assert not failed, f"requests that failed: {failed}"
    assert (f"/{docname}.html", 200) in visit.requests


@pytest.mark.parametrize("docname", PAGES)
def test_page_images_exist(visits: dict[str, Visit], docname: str) -> None:
    page = f"{docname}.html"
    served = {path for path, status in visits[docname].requests if status == 200}
    for img in visits[docname].dom.find_all("img"):
        src = img.get("src", "")
        assert src, f"<img> without src on {page}"
        problem = check_reference(page, src, loading=True)
        assert problem is None, problem
        if src.startswith("data:"):
            continue
        target = target_of(page, src)
        assert f"/{target}" in served, f"the browser did not load {src}"
        head, suffix = (
            (SITE / target).read_bytes()[:512],
            posixpath.splitext(target)[1].lower(),
        )
        if suffix == ".svg":
            assert b"<svg" in head, f"{src} is not an SVG image"
        else:
            assert head.startswith(IMAGE_MAGIC.get(suffix, b"")) and len(head) > 64, (
                f"{src} is not a {suffix} image"
            )


@pytest.mark.parametrize("docname", PAGES)
def test_every_figure_a_cell_drew_is_on_the_page(
    visits: dict[str, Visit], docname: str
) -> None:
    # The test above checks the images that are there; this one, that none
    # of the executed notebook's image outputs went missing on the way.
    cells = executed_cells(docname)
    if cells is None:  # a page that is not a notebook
        assert not visits[docname].dom.select(".cell_output"), docname
        return
    drawn = sum(
        any(kind.startswith("image/") for kind in output.get("data", {}))
        for cell in cells
        if cell["cell_type"] == "code"
        for output in cell.get("outputs", [])
    )
    shown = len(visits[docname].dom.select(".cell_output img"))
    assert shown == drawn, f"{docname}: {drawn} figures drawn, {shown} shown"


@pytest.mark.parametrize("docname", PAGES)
def test_page_links_resolve_in_the_browser(
    visits: dict[str, Visit], docname: str
) -> None:
    problems = broken_references(f"{docname}.html", visits[docname].dom)
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------ static checks


def test_every_internal_link_and_anchor_resolves() -> None:
    pages = [
        path.relative_to(SITE).as_posix()
        for path in sorted(SITE.rglob("*.html"))
        if path.relative_to(SITE).parts[0] not in {"_static", "_sources"}
    ]
    problems = []
    for page in pages:
        soup = built(page)
        problems += [f"{page}: {problem}" for problem in broken_references(page, soup)]
    assert not problems, "\n".join(problems[:40])


def test_stylesheets_load_nothing_from_outside() -> None:
    outside = []
    for css in SITE.joinpath("_static").rglob("*.css"):
        text = css.read_text(encoding="utf-8", errors="replace")
        for match in re.finditer(
            r"""url\(\s*['"]?([^'")]+)|@import\s+['"]([^'"]+)""", text
        ):
            address = match.group(1) or match.group(2)
            if urlsplit(address).scheme in {"http", "https"} or address.startswith(
                "//"
            ):
                outside.append(f"{css.relative_to(SITE)}: {address}")
    assert not outside, outside


def test_math_is_served_from_the_site() -> None:
    page = f"{PAGES[1]}.html"
    scripts = [tag["src"] for tag in built(page).find_all("script", src=True)]
    mathjax = [src for src in scripts if "mathjax" in src.lower()]
    assert mathjax and all(
        check_reference(page, src, loading=True) is None for src in mathjax
    ), scripts
    fonts = list(SITE.joinpath("_static", "mathjax").rglob("MathJax_Main-Regular.woff"))
    assert fonts, "MathJax fonts are not in the build"


@pytest.mark.parametrize("docname", CHAPTERS)
def test_chapter_offers_its_source_for_download(docname: str) -> None:
    page = f"{docname}.html"
    soup = built(page)
    downloads = [a["href"] for a in soup.select(".dropdown-download-buttons a[href]")]
    assert all(
        check_reference(page, href, loading=False) is None for href in downloads
    ), downloads
    sources = [
        href for href in downloads if href.endswith(f"{posixpath.basename(docname)}.md")
    ]
    assert sources, f"no .md in the download menu: {downloads}"
    # The download is the page's MyST source (compared within the build, so a
    # chapter edited after the build does not count as a failure here).
    source = (SITE / target_of(page, sources[0])).read_text(encoding="utf-8")
    h1 = soup.select_one("article h1")
    title = h1.find(string=True, recursive=False) or h1.get_text()
    assert re.search(rf"^# .*{re.escape(title.strip()[:20])}", source, re.M), (
        "the .md is not this page's source"
    )
    if not is_notebook(docname):
        return
    ipynb = [href for href in downloads if href.endswith(".ipynb")]
    assert ipynb, f"no .ipynb in the download menu: {downloads}"
    notebook = json.loads(
        (SITE / target_of(page, ipynb[0])).read_text(encoding="utf-8")
    )
    code_cells = [cell for cell in notebook["cells"] if cell["cell_type"] == "code"]
    assert notebook["nbformat"] == 4
    assert len(code_cells) == len(re.findall(r"^```\{code-cell\}", source, re.M))
    assert all(cell["execution_count"] for cell in code_cells), (
        "the download is not the executed notebook"
    )


def bibliography_page() -> str:
    pages = [name for name in PAGES if "{bibliography}" in source_of(name)]
    assert len(pages) == 1, f"expected one page with the bibliography, found {pages}"
    return pages[0]


def test_bibliography_lists_every_reference() -> None:
    page = f"{bibliography_page()}.html"
    entries = built(page).select("div.citation")
    bib = (ROOT / "book" / "references.bib").read_text(encoding="utf-8")
    assert len(entries) == len(re.findall(r"^@\w+\{", bib, re.M))


def test_bibliography_labels_read_like_the_citations() -> None:
    """Entries are labelled "Ba et al., 2016" (book/_ext/lnorm_site.py), as chapters
    cite them."""
    page = f"{bibliography_page()}.html"
    entries = built(page).select("div.citation[id]")
    labels = [
        " ".join(entry.select_one("span.label").get_text().split()) for entry in entries
    ]
    assert labels and all(
        re.fullmatch(r"\[[^\[\],]+, \d{4}[a-z]?\]", label) for label in labels
    ), labels
    names = {label[1:-1] for label in labels}
    years = {name.rsplit(", ", 1)[1] for name in names}
    # {cite:p} links "Ba et al., 2016"; {cite:t} writes the names and links the year.
    entry_ids = {entry["id"] for entry in entries}
    linked = {
        " ".join(a.get_text().split())
        for docname in CHAPTERS
        for a in built(f"{docname}.html").find_all("a", href=True)
        if target_of(f"{docname}.html", a["href"]) == page
        and urlsplit(a["href"]).fragment in entry_ids
    }
    assert linked and linked <= names | years, sorted(linked - names - years)


@pytest.mark.parametrize("docname", PAGES)
def test_citations_link_to_the_bibliography(docname: str) -> None:
    page = f"{docname}.html"
    cited = [
        key.strip()
        for keys in re.findall(r"\{cite(?::\w+)?\}`([^`]+)`", source_of(docname))
        for key in keys.split(",")
    ]
    bib_page = f"{bibliography_page()}.html"
    entry_ids = {div["id"] for div in built(bib_page).select("div.citation[id]")}
    links = 0
    for a in built(page).find_all("a", href=True):
        links += (
            target_of(page, a["href"]) == bib_page
            and urlsplit(a["href"]).fragment in entry_ids
        )
    assert links >= len(cited), (
        f"{len(cited)} citations in the source, {links} links to {bib_page}"
    )


def test_glossary_defines_the_shared_symbols() -> None:
    pages = [name for name in PAGES if "{glossary}" in source_of(name)]
    assert pages, "no glossary page in _toc.yml"
    terms = {
        str(dt.find(string=True)).strip()
        for dt in built(f"{pages[0]}.html").select("dl.glossary dt")
    }
    missing = [symbol for symbol in GLOSSARY_SYMBOLS if symbol not in terms]
    assert not missing, f"glossary lacks {missing}; it has {sorted(terms)}"


def test_chapters_are_numbered_in_toc_order() -> None:
    numbers = []
    for docname in CHAPTERS:
        h1 = built(f"{docname}.html").select_one("article h1")
        number = h1.find("span", class_="section-number") if h1 else None
        numbers.append(number.get_text(strip=True) if number else None)
    assert numbers == [f"{i}." for i in range(1, len(CHAPTERS) + 1)]


def page_holding(anchor: str) -> str | None:
    holders = [name for name in CHAPTERS if anchor in ids_in(f"{name}.html")]
    assert len(holders) <= 1, f"#{anchor} is defined on several pages: {holders}"
    return holders[0] if holders else None


def test_shared_labels_exist_in_chapter_order() -> None:
    holders = {label: page_holding(label) for label in CHAPTER_LABELS}
    assert all(holders.values()), (
        f"chapter labels not found: {[k for k, v in holders.items() if not v]}"
    )
    order = [CHAPTERS.index(holders[label]) for label in CHAPTER_LABELS]
    assert order == sorted(order) and len(set(order)) == len(order), holders
    cost = page_holding("cost-model")
    assert cost == holders["ch-cost"], (
        f"label cost-model is on {cost}, not in {holders['ch-cost']}"
    )


def test_derivation_equations_are_numbered() -> None:
    derivation = page_holding("ch-derivation")
    assert derivation, "no page holds ch-derivation"
    soup = built(f"{derivation}.html")
    numbers = {}
    for label in DERIVATION_EQUATIONS:
        block = soup.find(id=f"equation-{label}")
        assert block is not None, f"equation {label} is not in {derivation}"
        eqno = block.find("span", class_="eqno")
        assert eqno is not None, f"equation {label} has no number"
        numbers[label] = str(eqno.find(string=True)).strip()
    assert len(set(numbers.values())) == len(numbers), numbers
    chapter = CHAPTERS.index(derivation) + 1
    assert all(
        re.fullmatch(rf"\({chapter}\.\d+\)", number) for number in numbers.values()
    ), numbers
