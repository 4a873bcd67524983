"""The chapters as notebooks: what a learner sees in JupyterLab.

The test serves a copy of the repository's chapters, laid out as in the
repository (``book/``, ``lnorm/``, ``lab/``, ``jupytext.toml``, ``_toc.yml``,
the ``Makefile``), with ``make lab`` itself: so JupyterLab finds its
configuration as it does for a learner, and nothing the test runs or saves
touches the working tree. Headless Chromium opens it; every chapter of
``_toc.yml`` with code is opened as a notebook (jupytext) and read; the
chapters of ``RUN`` are also run with *Run All* through JupyterLab's own
command (autosave every second), read again and saved. The tests read those
states:

* both extensions are loaded in the browser (``jupyter labextension list``
  reports a JupyterLab version mismatch only for some of them);
* every code cell ran, and none has an error output;
* no rendered Markdown cell shows raw MyST (``{cite}``, ``{glue``,
  ``{eval}``, ``(label)=``, ``$$``, directive fences) or a math error;
* every ``{eval}`` role shows a value after *Run All*: jupyterlab-myst stored a
  result for it, and no placeholder (the expression itself) is left;
* the cells the site hides are collapsed, and so is every solution;
* the Lab reads like the site: every equation reference resolves, to the
  site's number where the site numbers it, and exercises are numbered as on
  the site;
* opening, running, autosaving and saving leave every chapter byte for byte as
  it was, while an edit made through the server is written back as typed; a
  negative control serves the chapters as ``make lab`` used to (``book/`` as
  the root, where jupytext finds no configuration) and sees them rewritten.

``LNORM_LAB_CHAPTERS=book/01_forward,...`` limits the test to some chapters;
``LNORM_LAB_RUN=all`` (or a list) runs other chapters than ``RUN``;
``LNORM_LAB_SCREENSHOTS=<folder>`` saves a screenshot of each chapter run,
before and after *Run All*.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest
from built_site import CODE, DISPLAY_MATH, INLINE_MATH, ROOT, toc_docnames
from cdp import Browser, chromium, free_port

pytestmark = [
    pytest.mark.lab,
    pytest.mark.skipif(
        chromium() is None,
        reason="chromium is not installed (Debian: apt-get install chromium; "
        ".ci/run does it)",
    ),
]

EVAL_ROLE = re.compile(r"(?<!`)\{eval\}`([^`]+)`")
# Raw MyST a rendered Markdown cell must not show.
RAW_MYST = {
    "{cite": re.compile(r"\{cite(:\w+)?\}"),
    "{glue": re.compile(r"\{glue"),
    "{eval": re.compile(r"\{eval\}"),
    "{ref/term/eq/doc}": re.compile(r"\{(ref|term|eq|doc|numref|py:\w+)\}`"),
    "(label)=": re.compile(r"^\([\w-]+\)=", re.M),
    "$$": re.compile(r"\$\$"),
    "directive fence": re.compile(r"^(```|:::)\{", re.M),
}
# Lab's plugins that make a chapter a rendered notebook.
PLUGINS = ["jupyterlab-jupytext:plugin", "jupyterlab-myst:content-factory"]
# The chapters run with Run All by default: the book build executes every
# chapter already; these two have cross-chapter references and citations.
RUN = ("book/02_derivation", "book/04b_low_precision")
# What make lab serves, copied for the test (the repository's layout).
TREE = ("book", "lnorm", "lab", "jupytext.toml", "_toc.yml", "Makefile")


def formulas_in(markdown: str) -> int:
    """The $...$ and $$...$$ formulas of a Markdown cell, outside code."""
    text = CODE.sub(" ", markdown)
    display = len(DISPLAY_MATH.findall(text))
    return display + len(INLINE_MATH.findall(DISPLAY_MATH.sub(" ", text)))


def test_formulas_in_counts_math_outside_code():
    assert formulas_in("$a$ and $$b$$, `$c$` and\n```\n$d$\n```") == 2


def chapters_with(text: str) -> list[str]:
    """The chapters whose source contains ``text``."""
    return [d for d in chapters() if text in (ROOT / f"{d}.md").read_text()]


def chapters() -> list[str]:
    """The pages of _toc.yml with code cells: the chapters a learner runs."""
    chosen = os.environ.get("LNORM_LAB_CHAPTERS")
    docs = [
        d for d in toc_docnames() if "{code-cell}" in (ROOT / f"{d}.md").read_text()
    ]
    return [d for d in docs if chosen is None or d in chosen.split(",")]


def run_chapters() -> list[str]:
    """The chapters that the test runs with Run All."""
    chosen = os.environ.get("LNORM_LAB_RUN", ",".join(RUN))
    return [d for d in chapters() if chosen == "all" or d in chosen.split(",")]


# Per-cell state, gathered in the page: type, metadata, collapse state,
# execution, outputs and (for Markdown) the rendered text and stored values.
CELL_STATE = """
(panel => {
  return panel.content.widgets.map(w => {
    const m = w.model;
    const cell = {
      type: m.type,
      source: m.sharedModel.getSource(),
      jupyter: m.getMetadata('jupyter') || {},
      tags: m.getMetadata('tags') || [],
      inputHidden: w.inputHidden,
    };
    if (m.type === 'code') {
      cell.count = m.executionCount;
      cell.errors = m.outputs.toJSON()
        .filter(o => o.output_type === 'error')
        .map(o => o.ename + ': ' + o.evalue);
    } else if (m.type === 'markdown') {
      // jupyterlab-myst renders into a .myst widget; KaTeX keeps the TeX
      // source in hidden MathML, which is not what the learner reads.
      const rendered = w.node.querySelector('.jp-InputArea > .myst');
      const text = rendered ? rendered.cloneNode(true) : null;
      if (text) text.querySelectorAll('.katex-mathml').forEach(e => e.remove());
      cell.rendered = text ? text.textContent : null;
      cell.mathErrors = rendered
        ? Array.from(rendered.querySelectorAll('.katex-error'))
            .map(e => e.getAttribute('title') || e.textContent)
        : [];
      cell.katex = rendered ? rendered.querySelectorAll('.katex').length : 0;
      // A solution renders as a <details> element: closed until clicked.
      cell.closedSolutions = rendered
        ? rendered.querySelectorAll('details.myst-exercise:not([open])').length
        : 0;
      cell.codes = rendered
        ? Array.from(rendered.querySelectorAll('code')).map(c => c.textContent)
        : [];
      cell.expressions = m.getMetadata('user_expressions') || [];
      // What the site shows otherwise: references, exercise titles, boxes.
      const all = sel => rendered ? Array.from(rendered.querySelectorAll(sel)) : [];
      cell.notFound = all('[title$="Not Found"]')
        .map(e => e.title + ': ' + e.textContent);
      cell.refs = all('a.hover-link[href^="#eq-"]')
        .map(a => [a.getAttribute('href').slice(1), a.textContent]);
      cell.exercises = all('aside.myst-exercise .myst-exercise-title')
        .map(e => e.textContent).filter(t => t);
      cell.emptyBoxes = all('aside.myst-exercise')
        .filter(e => !e.textContent.trim() && e.offsetHeight > 0).length;
      cell.labCell = !!m.getMetadata('lnorm_lab');
    }
    return cell;
  });
})(PANEL)
"""


@dataclass
class Run:
    before: list[dict[str, Any]]  # opened, nothing run
    after: list[dict[str, Any]] | None  # after Run All (None: not run)
    opened: list[dict[str, Any]]  # then every collapsed cell opened
    seconds: float


@dataclass
class Lab:
    url: str
    token: str
    tree: Path  # the copy of the repository
    root: Path  # the folder it serves
    log: Path  # the server's output

    def api(self, method: str, path: str, body: Any = None) -> Any:
        """A call to the server's REST API (the contents API for chapters)."""
        request = urllib.request.Request(
            f"{self.url}/api/{path}",
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={
                "Authorization": f"token {self.token}",
                "Content-Type": "application/json",
            },
        )
        with urllib.request.urlopen(request, timeout=60) as r:
            return json.load(r)


# Open what is collapsed, as a learner who clicks a solution does: Lab renders a
# collapsed Markdown cell only then.
EXPAND = """
(panel => {
  for (const w of panel.content.widgets) w.inputHidden = false;
  return true;
})(PANEL)
"""


def wait_for_server(lab: Lab, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        try:
            lab.api("GET", "status")
            return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"JupyterLab did not start:\n{log.read_text()[-3000:]}")


def copy_tree(target: Path) -> Path:
    """The files make lab serves, laid out as in the repository."""
    for part in TREE:
        if (ROOT / part).is_dir():
            shutil.copytree(
                ROOT / part,
                target / part,
                ignore=shutil.ignore_patterns(
                    "__pycache__", "_build", ".ipynb_checkpoints"
                ),
            )
        else:
            shutil.copy2(ROOT / part, target / part)
    return target


def serve(
    tmp: Path, command: Callable[[list[str]], list[str]], tree: Path, root: Path
) -> Any:
    """Run ``command(options)``, a JupyterLab server on ``tree`` with the
    test's ``options``, and yield a :class:`Lab`."""
    settings = tmp / "settings"
    for plugin, values in {
        # Every cell in the page, not only those in view: the test reads them all.
        "notebook-extension/tracker": {"windowingMode": "none"},
        "apputils-extension/notification": {
            "fetchNews": "false",
            "checkForUpdates": False,
        },
        # Autosave every second: a run outlasts many autosave intervals.
        "docmanager-extension/plugin": {"autosaveInterval": 1},
    }.items():
        path = settings / "@jupyterlab" / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    env = dict(
        os.environ,
        JUPYTER_CONFIG_DIR=str(tmp / "config"),
        JUPYTER_RUNTIME_DIR=str(tmp / "runtime"),
        JUPYTERLAB_SETTINGS_DIR=str(settings),
        JUPYTERLAB_WORKSPACES_DIR=str(tmp / "workspaces"),
        # The chapters import lnorm: the copy, first on the path.
        PYTHONPATH=str(tree),
    )
    # Not the caller's: make lab finds its own, and under `make -j2
    # --output-sync` (make test) make's flags would hold the server's output
    # back until it stops.
    for name in ("JUPYTER_CONFIG_PATH", "MAKEFLAGS", "MFLAGS", "MAKELEVEL"):
        env.pop(name, None)
    port, token = free_port(), secrets.token_hex(8)
    options = [
        "--no-browser",
        f"--port={port}",
        "--ip=127.0.0.1",
        f"--IdentityProvider.token={token}",
        # window.jupyterapp: the test runs Lab's own commands (Run All).
        "--LabApp.expose_app_in_browser=True",
    ]
    log = tmp / "lab.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            command(options),
            env=env,
            stdout=out,
            stderr=out,
            cwd=tree,
            start_new_session=True,  # make and its jupyter, stopped together
        )
    lab = Lab(f"http://127.0.0.1:{port}", token, tree, root, log)
    try:
        wait_for_server(lab, process, log)
        yield lab
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> Any:
    """``make lab`` on a copy of the repository's chapters and configuration.

    It runs the Makefile's own target with this environment's interpreter
    (``-o`` keeps make from reinstalling it), with a throw-away configuration
    directory and Lab settings.
    """
    tmp = tmp_path_factory.mktemp("lab")
    tree = copy_tree(tmp / "repo")
    venv = Path(sys.executable).parent.parent
    yield from serve(
        tmp,
        lambda options: [
            "make",
            "--no-print-directory",
            f"VENV={venv}",
            "-o",
            f"{venv}/.installed",
            "lab",
            f"LAB_ARGS={' '.join(options)}",
        ],
        tree,
        tree,
    )


@pytest.fixture(scope="module")
def browser(lab: Lab) -> Any:
    b = Browser()
    try:
        b.open(f"{lab.url}/lab?token={lab.token}")
        b.wait_for(
            "!!(window.jupyterapp && window.jupyterapp.commands.hasCommand("
            "'docmanager:open'))",
            90,
            "JupyterLab to start in the browser",
        )
        b.evaluate("window.jupyterapp.restored.then(() => true)")
        yield b
    finally:
        b.close()


def panel(path: str) -> str:
    """JavaScript for the notebook panel of ``path``, kept by open_chapter."""
    return f"window.lnormPanels[{json.dumps(path)}]"


def state(b: Browser, path: str) -> list[dict[str, Any]]:
    return b.evaluate(CELL_STATE.replace("PANEL", panel(path)))


def open_chapter(b: Browser, path: str, kernel: bool = True) -> None:
    """Open ``path`` as a notebook; with no kernel unless it is to be run."""
    p = panel(path)
    preference = "" if kernel else ", kernelPreference: {shouldStart: false}"
    b.evaluate(
        "window.lnormPanels = window.lnormPanels || {}, "
        "window.jupyterapp.commands.execute('docmanager:open', "
        f"{{path: {json.dumps(path)}, factory: 'Jupytext Notebook'{preference}}})"
        f".then(w => {{ {p} = w; return w.context.ready; }})"
        f".then(() => {p}.sessionContext.ready).then(() => true)"
    )
    idle = (
        f"{p}.sessionContext.session?.kernel?.status === 'idle' && " if kernel else ""
    )
    b.wait_for(
        f"{p}.content.widgets.length > 0 && {idle}"
        f"{p}.content.widgets.every(w => w.model.type !== 'markdown'"
        " || w.inputHidden || w.node.querySelector('.jp-InputArea > .myst'))",
        60,
        f"{path} to open, rendered" + (", with an idle kernel" if kernel else ""),
    )


def to_front(b: Browser, path: str) -> None:
    b.evaluate(f"window.jupyterapp.shell.activateById({panel(path)}.id), true")
    b.wait_for(
        f"window.jupyterapp.shell.currentWidget === {panel(path)}",
        10,
        f"{path} to come to the front",
    )


def start_run_all(b: Browser, path: str) -> None:
    """*Run All* on ``path``, through JupyterLab's command (it acts on the
    notebook in front, so the chapter is brought to the front first)."""
    to_front(b, path)
    b.evaluate(
        "window.jupyterapp.commands.execute('notebook:run-all-cells').then(() => true)"
    )


def finished(path: str) -> str:
    """JavaScript: the kernel is idle, every code cell has run, and every
    Markdown cell with {eval} roles has its values (jupyterlab-myst asks the
    kernel for them when the cell runs, and stores them in its metadata)."""
    p = panel(path)
    return (
        f"{p}.sessionContext.session.kernel.status === 'idle' && "
        f"{p}.content.widgets.every(w => w.model.type === 'code' "
        "? w.model.executionCount !== null "
        ": !w.model.sharedModel.getSource().includes('{eval}`') "
        "|| (w.model.getMetadata('user_expressions') || []).length > 0)"
    )


def close_chapter(b: Browser, path: str) -> None:
    """Save and close the notebook, as a learner who answers *Save* when
    asked: a chapter is marked changed once open (jupytext's model is not
    the text), and autosave must not be cut off by closing it. Its kernel
    shuts down while the next chapter opens."""
    p = panel(path)
    b.evaluate(
        f"(() => {{ const w = {p}; delete {p}; "
        "return w.context.save().then(() => { "
        "w.sessionContext.shutdown().then(() => w.dispose()); return true; }); })()"
    )


def save(b: Browser, path: str) -> None:
    """*Save*, as the learner's Ctrl+S: the context saves through the server."""
    b.evaluate(f"{panel(path)}.context.save().then(() => true)")


@pytest.fixture(scope="module")
def runs(browser: Browser) -> dict[str, Run]:
    """Every chapter opened and read back, and those of run_chapters() run top
    to bottom (autosaving meanwhile), read back and saved, once.

    While the first chapter runs, the chapters not run are opened and read
    (with no kernel): Run All has already queued every cell of the first.
    """
    shots = os.environ.get("LNORM_LAB_SCREENSHOTS")
    to_run = run_chapters()
    others = [d for d in chapters() if d not in to_run]
    results: dict[str, Run] = {}

    def read(doc: str, start: float, before: Any, after: Any = None) -> None:
        path = f"{doc}.md"
        browser.evaluate(EXPAND.replace("PANEL", panel(path)))
        browser.wait_for(
            f"{panel(path)}.content.widgets.every(w => w.model.type !== "
            "'markdown' || w.node.querySelector('.jp-InputArea > .myst'))",
            30,
            f"the opened cells of {path} to render",
        )
        opened = state(browser, path)
        close_chapter(browser, path)
        results[doc] = Run(before, after, opened, time.monotonic() - start)

    def read_others() -> None:
        while others:
            doc = others.pop(0)
            start = time.monotonic()
            open_chapter(browser, f"{doc}.md", kernel=False)
            read(doc, start, state(browser, f"{doc}.md"))

    for doc in to_run:
        path = f"{doc}.md"
        start = time.monotonic()
        open_chapter(browser, path)
        before = state(browser, path)
        if shots:
            browser.screenshot(Path(shots) / f"{Path(doc).name}-before.png")
        start_run_all(browser, path)
        read_others()
        browser.wait_for(finished(path), 300, f"Run All of {path}")
        after = state(browser, path)
        if shots:
            to_front(browser, path)
            time.sleep(0.5)
            browser.screenshot(Path(shots) / f"{Path(doc).name}-after.png")
        # Past an autosave interval, then Save.
        time.sleep(1.5)
        save(browser, path)
        read(doc, start, before, after)
    read_others()
    return results


def test_extensions_are_loaded_in_the_browser(browser: Browser) -> None:
    active = browser.evaluate(
        f"{json.dumps(PLUGINS)}.map(p => window.jupyterapp.isPluginActivated(p))"
    )
    assert active == [True] * len(PLUGINS), dict(zip(PLUGINS, active))
    failed = [e for e in browser.errors() if "Failed to create module" in e]
    assert not failed, failed


@pytest.mark.parametrize("doc", run_chapters())
def test_chapter_runs_top_to_bottom(runs: dict[str, Run], doc: str) -> None:
    cells = runs[doc].after
    code = [c for c in cells if c["type"] == "code"]
    assert code, f"{doc}: no code cells in the notebook"
    not_run = [i for i, c in enumerate(cells) if c["type"] == "code" and not c["count"]]
    errors = [(i, c["errors"]) for i, c in enumerate(cells) if c.get("errors")]
    assert not not_run, f"{doc}: cells {not_run} did not run"
    assert not errors, f"{doc}: error outputs {errors}"
    counts = [c["count"] for c in code]
    assert counts == sorted(counts), f"{doc}: cells ran out of order"


@pytest.mark.parametrize("doc", chapters())
def test_markdown_is_rendered_not_raw(runs: dict[str, Run], doc: str) -> None:
    for when, cells in (("before", runs[doc].before), ("after", runs[doc].opened)):
        markdown = [c for c in cells if c["type"] == "markdown"]
        # Collapsed cells render when opened: all are checked after Run All.
        unrendered = [
            c["source"][:60]
            for c in markdown
            if c["rendered"] is None and (when == "after" or not c["inputHidden"])
        ]
        assert not unrendered, f"{doc} ({when}): cells not rendered: {unrendered}"
        for c in markdown:
            # jupyterlab-myst has no glue: a glue role shows as its bare name.
            assert not re.search(r"\{glue", c["source"]), (
                f"{doc}: a glue role shows as a bare name in JupyterLab; use {{eval}}"
            )
            if c["rendered"] is None:
                continue
            assert not c["mathErrors"], f"{doc} ({when}): math {c['mathErrors']}"
            # Every formula of the source typeset: raw inline math would
            # show neither an error nor a pattern of RAW_MYST.
            assert c["katex"] >= formulas_in(c["source"]), (
                f"{doc} ({when}): {c['katex']} formulas typeset, "
                f"{formulas_in(c['source'])} in a cell starting {c['source'][:60]!r}"
            )
            for name, pattern in RAW_MYST.items():
                assert not pattern.search(c["rendered"]), (
                    f"{doc} ({when}): {name} shown raw in a cell starting "
                    f"{c['source'][:60]!r}"
                )


@pytest.mark.parametrize(
    "doc", [d for d in chapters_with("{eval}`") if d in run_chapters()]
)
def test_every_number_shows_after_run_all(runs: dict[str, Run], doc: str) -> None:
    cells = [c for c in runs[doc].opened if c["type"] == "markdown"]
    with_roles = [(c, EVAL_ROLE.findall(c["source"])) for c in cells]
    with_roles = [(c, roles) for c, roles in with_roles if roles]
    assert with_roles, f"{doc}: no {{eval}} role in the prose"
    for cell, roles in with_roles:
        stored = {e["expression"]: e["result"] for e in cell["expressions"]}
        missing = [r for r in roles if r not in stored]
        failed = [
            (r, stored[r].get("evalue")) for r in stored if stored[r]["status"] != "ok"
        ]
        # jupyterlab-myst shows a role without a value as the expression in code.
        placeholders = [r for r in roles if r in cell["codes"]]
        assert not missing, f"{doc}: no value for {missing}"
        assert not failed, f"{doc}: expressions failed: {failed}"
        assert not placeholders, f"{doc}: shown as placeholders: {placeholders}"
        for r in roles:
            shown = stored[r]["data"]["text/plain"].strip("'\"")
            assert not re.match(r"np\.\w+\(|array\(", shown), f"{doc}: {r} -> {shown}"


@pytest.mark.parametrize("doc", chapters_with("{solution-start}"))
def test_hidden_cells_and_solutions_stay_collapsed(
    runs: dict[str, Run], doc: str
) -> None:
    # The metadata as written (Run All may change it), the state after Run All.
    before, after = runs[doc].before, runs[doc].after or runs[doc].before
    assert [c["source"] for c in before] == [c["source"] for c in after]
    hidden = [i for i, c in enumerate(before) if c["jupyter"].get("source_hidden")]
    assert hidden, f"{doc}: no collapsed cell"
    # What the site hides, the notebook collapses.
    site_hides = {"remove-cell", "remove-input", "hide-input"}
    missing = [
        c["source"][:50]
        for c in before
        if c["type"] == "code"
        and site_hides & set(c["tags"])
        and not c["jupyter"].get("source_hidden")
    ]
    assert not missing, f"{doc}: hidden on the site, open in JupyterLab: {missing}"
    shown = [after[i]["source"][:50] for i in hidden if not after[i]["inputHidden"]]
    assert not shown, f"{doc}: cells meant to be collapsed are open: {shown}"
    # A solution's explanation sits in its solution-start directive, which
    # jupyterlab-myst shows as a closed <details>, also after Run All.
    starts = [c for c in after if "{solution-start}" in c["source"]]
    assert starts, f"{doc}: no solution"
    open_ = [c["source"][:50] for c in starts if c["closedSolutions"] < 1]
    assert not open_, f"{doc}: solutions shown open: {open_}"


# -- The Lab reads like the site ------------------------------------------------

DISPLAY = re.compile(r"^\$\$\n.*?\n\$\$ *(?:\((?P<label>[\w-]+)\))?$", re.M | re.S)


def site_numbers() -> dict[str, str]:
    """Each labelled equation's number on the site: chapter.k, where chapter
    is the place in _toc.yml's chapters and k counts the chapter's labelled
    display equations (the site numbers no other)."""
    import yaml

    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    numbers = {}
    for n, entry in enumerate(toc["chapters"], 1):
        text = CODE_CELL.sub("", (ROOT / f"{entry['file']}.md").read_text())
        labels = [m["label"] for m in DISPLAY.finditer(text) if m["label"]]
        numbers.update({label: f"{n}.{k}" for k, label in enumerate(labels, 1)})
    return numbers


CODE_CELL = re.compile(r"^```\{code-cell\}.*?^```$", re.M | re.S)


def chapter_number(doc: str) -> int | None:
    """The chapter's number on the site (None for a page that has none)."""
    import yaml

    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    docs = [str(c["file"]) for c in toc["chapters"]]
    return docs.index(doc) + 1 if doc in docs else None


def test_site_numbers_count_labelled_equations_only():
    numbers = site_numbers()
    assert numbers["eq-forward-stats"] == "1.1"
    assert numbers["eq-dx"].startswith("2.")


@pytest.mark.parametrize("doc", chapters())
def test_references_and_exercises_read_as_on_the_site(
    runs: dict[str, Run], doc: str
) -> None:
    numbers, n = site_numbers(), chapter_number(doc)
    text = CODE_CELL.sub("", (ROOT / f"{doc}.md").read_text())
    # As opened, then with every cell opened (after Run All, where it ran).
    ran = runs[doc].after is not None
    stages = [
        ("before Run All", runs[doc].before),
        ("after Run All" if ran else "cells opened", runs[doc].opened),
    ]
    for when, cells in stages:
        markdown = [c for c in cells if c["type"] == "markdown" and not c["labCell"]]
        refs = [r for c in markdown for r in c["refs"]]
        if "{eq}`" in text:
            assert refs, f"{doc} ({when}): no equation reference rendered"
        # Every equation reference resolves and shows the site's number.
        for label, shown in refs:
            assert shown == f"({numbers[label]})", (
                f"{doc} ({when}): {label} shows {shown}, the site ({numbers[label]})"
            )
        # No reference or citation shows jupyterlab-myst's warning label.
        warnings = [w for c in markdown for w in c["notFound"]]
        assert not warnings, f"{doc} ({when}): unresolved {warnings}"
        # Exercises are numbered n.1, n.2, ... as on the site.
        titles = [t for c in markdown for t in c["exercises"]]
        expected = [f"Exercise {n}.{k}" for k in range(1, len(titles) + 1)]
        if "{exercise}" in text and n is not None:
            assert titles == expected, f"{doc} ({when}): {titles}"
        # The end of a solution is no empty box.
        boxes = sum(c["emptyBoxes"] for c in markdown)
        assert not boxes, f"{doc} ({when}): {boxes} empty boxes"
        # A citation reads as on the site: [Author et al., year].
        if "{cite" in text:
            cites = [c["rendered"] for c in markdown if "{cite" in c["source"]]
            assert all(re.search(r"\[[^\]]+, \d{4}\]", r or "") for r in cites), (
                f"{doc} ({when}): a citation without author and year"
            )
        # A {py:...} role with a tilde shows the short name.
        tildes = [c["rendered"] for c in markdown if "~lnorm" in (c["rendered"] or "")]
        assert not tildes, f"{doc} ({when}): a tilde shows: {tildes[0][:80]}"


# -- Opening, running and saving change nothing but the learner's edits ---------


def chapter_files_module() -> Any:
    """lab/chapter_files.py, which make lab's server imports."""
    sys.path.insert(0, str(ROOT / "lab"))
    try:
        import chapter_files
    finally:
        sys.path.remove(str(ROOT / "lab"))
    return chapter_files


@pytest.mark.parametrize("doc", chapters())
def test_what_lab_shows_is_saved_as_it_was(doc: str) -> None:
    """display() and undisplay() in lab/chapter_files.py: every Markdown cell
    shown in Lab is saved as it was on disk, unedited or with a line added."""
    cf = chapter_files_module()
    labels = cf.cite_labels(ROOT / "book" / "references.bib")
    text = (ROOT / f"{doc}.md").read_text()
    chapter = [
        c.source for c in cf.myst_to_notebook(text).cells if c.cell_type == "markdown"
    ]
    shown = [cf.display(c, labels) for c in chapter]
    assert [cf.undisplay(s, chapter, labels, shown) for s in shown] == chapter
    rewritten = [(c, s) for c, s in zip(chapter, shown) if s != c]
    for source, seen in rewritten[:3]:
        edited = cf.undisplay(seen + "\n\nMine.", chapter, labels, shown)
        assert edited == source + "\n\nMine."


def chapter_files(tree: Path) -> dict[str, bytes]:
    """Every file under book/ that git would see (not its ignored ones)."""
    ignored = {".ipynb_checkpoints", "__pycache__", "_build"}
    return {
        str(p.relative_to(tree)): p.read_bytes()
        for p in sorted((tree / "book").rglob("*"))
        if p.is_file()
        and not ignored & set(p.relative_to(tree).parts)
        and p.suffix != ".ipynb"
    }


def test_make_lab_finds_the_jupytext_configuration(
    runs: dict[str, Run], lab: Lab
) -> None:
    assert "Loaded Jupytext configuration file at /jupytext.toml" in (
        lab.log.read_text()
    )


def test_running_and_saving_leave_every_chapter_as_it_was(
    runs: dict[str, Run], lab: Lab
) -> None:
    assert any(r.after is not None for r in runs.values()), "no chapter was run"
    saved, original = chapter_files(lab.tree), chapter_files(ROOT)
    assert saved.keys() == original.keys(), (
        f"files added or removed: {set(saved) ^ set(original)}"
    )
    changed = [p for p in saved if saved[p] != original[p]]
    assert not changed, f"rewritten by opening, running and saving: {changed}"


def round_trip(lab: Lab, path: str, edit: Any = None) -> tuple[bytes, bytes]:
    """The chapter's bytes before and after a GET and a PUT of it as a
    notebook through the contents API, as Lab saves it after Run All (the
    values of {eval} roles in the metadata, outputs, execution counts), with
    ``edit`` applied to the notebook first."""
    before = (lab.root / path).read_bytes()
    model = lab.api("GET", f"contents/{path}?type=notebook&content=1")
    notebook = model["content"]
    for cell in notebook["cells"]:
        if cell["cell_type"] == "code":
            cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "1"}]
            cell["execution_count"] = 1
        elif "{eval}`" in cell["source"]:
            cell["metadata"]["user_expressions"] = [
                {"expression": "1", "result": {"status": "ok", "data": {}}}
            ]
    notebook["metadata"]["language_info"] = {"name": "python"}
    if edit is not None:
        edit(notebook)
    lab.api("PUT", f"contents/{path}", {"type": "notebook", "content": notebook})
    return before, (lab.root / path).read_bytes()


def test_an_edit_is_written_back_as_typed(runs: dict[str, Run], lab: Lab) -> None:
    path = f"{chapters()[0]}.md"
    original = (lab.tree / path).read_text()

    line = "\nprint('my change')"

    def edit(notebook: dict[str, Any]) -> None:
        code = [c for c in notebook["cells"] if c["cell_type"] == "code"]
        code[-1]["source"] += line

    def undo(notebook: dict[str, Any]) -> None:
        code = [c for c in notebook["cells"] if c["cell_type"] == "code"]
        code[-1]["source"] = code[-1]["source"].removesuffix(line)

    _, after = round_trip(lab, path, edit)
    last = CODE_CELL.findall(original)[-1]
    expected = original.replace(last, last[:-3] + line[1:] + "\n```")
    assert after.decode() == expected, "the edit was not written as typed"
    # Undone in Lab and saved: the file is as it was, byte for byte.
    _, after = round_trip(lab, path, undo)
    assert after.decode() == original


@pytest.fixture(scope="module")
def old_lab(tmp_path_factory) -> Any:
    """Negative control: the chapters served as make lab served them before
    (``jupyter lab book/``), where jupytext finds no configuration and the
    server has none of lab/."""
    tmp = tmp_path_factory.mktemp("old-lab")
    tree = copy_tree(tmp / "repo")
    jupyter = str(Path(sys.executable).with_name("jupyter"))
    command = [jupyter, "lab", f"--ServerApp.root_dir={tree / 'book'}"]
    if hasattr(os, "getuid") and os.getuid() == 0:
        command.append("--allow-root")
    yield from serve(tmp, lambda options: command + options, tree, tree / "book")


@pytest.mark.parametrize("served", ["make lab", "old make lab (negative control)"])
def test_a_chapter_only_run_is_saved_unchanged(
    served: str, lab: Lab, old_lab: Lab
) -> None:
    server = lab if served == "make lab" else old_lab
    prefix = "book/" if server is lab else ""
    doc = next(d for d in chapters() if "{eval}`" in (ROOT / f"{d}.md").read_text())
    # What the learner saw rewritten: chapter 2 after Run All and Save.
    before, after = round_trip(server, prefix + f"{Path(doc).name}.md")
    if server is lab:
        assert after == before, "a chapter only opened and run was rewritten"
    else:
        assert after != before, "the negative control did not see the rewrite"


def test_save_text_writes_only_the_edit_or_the_cells() -> None:
    """save_text in lab/chapter_files.py, without a server: nothing edited
    gives None; an edited prose cell with a citation is written back with its
    {cite} role, the rest of the file as it was; an added cell makes jupytext
    write the cells, with the front matter as it was."""
    cf = chapter_files_module()
    labels = cf.cite_labels(ROOT / "book" / "references.bib")
    doc = next(d for d in chapters() if "{cite}`" in (ROOT / f"{d}.md").read_text())
    text = (ROOT / f"{doc}.md").read_text()
    notebook = cf.myst_to_notebook(text)
    for cell in notebook.cells:
        if cell.cell_type == "markdown":
            cell.source = cf.display(cell.source, labels)
    assert cf.save_text(text, notebook, labels) is None
    cited = next(c for c in notebook.cells if "references.bib" in c.source)
    cited.source += " Mine."
    edited = cf.save_text(text, notebook, labels)
    assert edited is not None
    changed = [
        line
        for line in difflib.ndiff(text.splitlines(), edited.splitlines())
        if line[:1] in "+-"
    ]
    assert len(changed) == 2 and changed[1].endswith(" Mine."), changed
    assert "{cite" in changed[1] or "{cite" not in changed[0]
    notebook.cells.insert(1, cf.nbformat.v4.new_code_cell("x = 1"))
    rewritten = cf.save_text(text, notebook, labels)
    front = text[: text.index("\n---\n", 4) + 5]
    assert rewritten.startswith(front)
    assert "x = 1" in [c.source for c in cf.myst_to_notebook(rewritten).cells]
