"""The chapters as notebooks: what a learner sees in JupyterLab.

One JupyterLab server (127.0.0.1, no token, a temporary configuration) serves a
copy of ``book/`` and ``lnorm/``, so nothing the test runs or saves touches the
working tree. Headless Chromium opens it; for every chapter of ``_toc.yml`` the
test opens the MyST source as a notebook (jupytext), takes the state before
running, runs *Run All* through JupyterLab's own command, waits for the kernel,
and takes the state again. The tests below read those states:

* both extensions are loaded in the browser (``jupyter labextension list``
  reports a JupyterLab version mismatch only for some of them);
* every code cell ran, and none has an error output;
* no rendered Markdown cell shows raw MyST (``{cite}``, ``{glue``,
  ``{eval}``, ``(label)=``, ``$$``, directive fences) or a math error;
* every ``{eval}`` role shows a value after *Run All*: jupyterlab-myst stored a
  result for it, and no placeholder (the expression itself) is left;
* the cells the site hides are collapsed, and so is every solution.

``LNORM_LAB_CHAPTERS=book/01_forward,...`` limits the run to some chapters;
``LNORM_LAB_SCREENSHOTS=<folder>`` saves a screenshot of each chapter before
and after *Run All*.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    }
    return cell;
  });
})(PANEL)
"""


@dataclass
class Run:
    before: list[dict[str, Any]]  # opened, nothing run
    after: list[dict[str, Any]]  # after Run All
    opened: list[dict[str, Any]]  # then every collapsed cell opened
    seconds: float


# Open what is collapsed, as a learner who clicks a solution does: Lab renders a
# collapsed Markdown cell only then.
EXPAND = """
(panel => {
  for (const w of panel.content.widgets) w.inputHidden = false;
  return true;
})(PANEL)
"""


def wait_for_server(url: str, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        try:
            with urllib.request.urlopen(f"{url}/api/status", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"JupyterLab did not start:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> Any:
    """A JupyterLab server on a copy of the chapters, with a throw-away config."""
    tmp = tmp_path_factory.mktemp("lab")
    for part in ("book", "lnorm"):
        shutil.copytree(
            ROOT / part,
            tmp / part,
            ignore=shutil.ignore_patterns(
                "__pycache__", "_build", ".ipynb_checkpoints"
            ),
        )
    settings = tmp / "settings"
    for plugin, values in {
        # Every cell in the page, not only those in view: the test reads them all.
        "notebook-extension/tracker": {"windowingMode": "none"},
        "apputils-extension/notification": {
            "fetchNews": "false",
            "checkForUpdates": False,
        },
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
        PYTHONPATH=str(tmp),
    )
    port = free_port()
    log = tmp / "lab.log"
    command = [
        str(Path(sys.executable).with_name("jupyter")),
        "lab",
        "--no-browser",
        f"--port={port}",
        "--ip=127.0.0.1",
        "--IdentityProvider.token=",
        "--ServerApp.password=",
        # window.jupyterapp: the test runs Lab's own commands (Run All).
        "--LabApp.expose_app_in_browser=True",
        f"--ServerApp.root_dir={tmp / 'book'}",
    ]
    if hasattr(os, "getuid") and os.getuid() == 0:
        command.append("--allow-root")
    with log.open("w") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=out)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_server(url, process, log)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()


@pytest.fixture(scope="module")
def browser(lab: str) -> Any:
    b = Browser()
    try:
        b.open(f"{lab}/lab")
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


def open_chapter(b: Browser, path: str) -> None:
    p = panel(path)
    b.evaluate(
        "window.lnormPanels = window.lnormPanels || {}, "
        "window.jupyterapp.commands.execute('docmanager:open', "
        f"{{path: {json.dumps(path)}, factory: 'Jupytext Notebook'}})"
        f".then(w => {{ {p} = w; return w.context.ready; }})"
        f".then(() => {p}.sessionContext.ready).then(() => true)"
    )
    b.wait_for(
        f"{p}.content.widgets.length > 0 && "
        f"{p}.sessionContext.session?.kernel?.status === 'idle' && "
        f"{p}.content.widgets.every(w => w.model.type !== 'markdown'"
        " || w.inputHidden || w.node.querySelector('.jp-InputArea > .myst'))",
        60,
        f"{path} to open, rendered, with an idle kernel",
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
    """Close the notebook; its kernel shuts down while the next chapter runs."""
    p = panel(path)
    b.evaluate(
        f"(() => {{ const w = {p}; delete {p}; "
        "w.sessionContext.shutdown().then(() => w.dispose()); return true; })()"
    )


@pytest.fixture(scope="module")
def runs(browser: Browser) -> dict[str, Run]:
    """Every chapter opened, run top to bottom and read back, once.

    While one chapter runs, the next one opens (its kernel starts, its
    Markdown renders): Run All has already queued every cell of the first.
    """
    shots = os.environ.get("LNORM_LAB_SCREENSHOTS")
    docs = chapters()
    paths = {doc: f"{Path(doc).name}.md" for doc in docs}
    results: dict[str, Run] = {}
    before: dict[str, list[dict[str, Any]]] = {}
    if docs:
        open_chapter(browser, paths[docs[0]])
        before[docs[0]] = state(browser, paths[docs[0]])
    for i, doc in enumerate(docs):
        path = paths[doc]
        start = time.monotonic()
        to_front(browser, path)
        if shots:
            browser.screenshot(Path(shots) / f"{Path(doc).name}-before.png")
        start_run_all(browser, path)
        if i + 1 < len(docs):
            following = docs[i + 1]
            open_chapter(browser, paths[following])
            before[following] = state(browser, paths[following])
        browser.wait_for(finished(path), 300, f"Run All of {path}")
        after = state(browser, path)
        if shots:
            to_front(browser, path)
            time.sleep(0.5)
            browser.screenshot(Path(shots) / f"{Path(doc).name}-after.png")
        browser.evaluate(EXPAND.replace("PANEL", panel(path)))
        browser.wait_for(
            f"{panel(path)}.content.widgets.every(w => w.model.type !== "
            "'markdown' || w.node.querySelector('.jp-InputArea > .myst'))",
            30,
            f"the opened cells of {path} to render",
        )
        opened = state(browser, path)
        close_chapter(browser, path)
        results[doc] = Run(before[doc], after, opened, time.monotonic() - start)
    return results


def test_extensions_are_loaded_in_the_browser(browser: Browser) -> None:
    active = browser.evaluate(
        f"{json.dumps(PLUGINS)}.map(p => window.jupyterapp.isPluginActivated(p))"
    )
    assert active == [True] * len(PLUGINS), dict(zip(PLUGINS, active))
    failed = [e for e in browser.errors() if "Failed to create module" in e]
    assert not failed, failed


@pytest.mark.parametrize("doc", chapters())
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


@pytest.mark.parametrize("doc", chapters_with("{eval}`"))
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
    before, after = runs[doc].before, runs[doc].after
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
