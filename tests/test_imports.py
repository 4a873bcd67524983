"""Imports in lnorm only go down: no cycle, no reach into dev/ or tests/.

The graph is read from the source with ``ast``, so an import inside a
function (a lazy import, the usual way to hide a cycle) counts like one at
the top of the module. ``lnorm_imports`` is what the closing notes of an
import change quote, module by module.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "lnorm"


def module_name(path: Path, root: Path = ROOT) -> str:
    """``lnorm/gpu/run.py`` -> ``lnorm.gpu.run``; a package is its ``__init__``."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_names(path: Path, root: Path = ROOT,
                   modules: frozenset[str] = frozenset()) -> set[str]:
    """Every module a file imports, anywhere in it, relative imports resolved.

    ``from pkg import a`` names ``pkg.a`` where that is one of ``modules``,
    else ``pkg`` (a name defined in the package's ``__init__``, whose code
    then runs); ``from .a import f`` names ``pkg.a``; ``import a.b`` names
    ``a.b``.
    """
    me = module_name(path, root)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            stem = node.module
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                stem = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                sub = f"{stem}.{alias.name}"
                names.add(sub if sub in modules else stem)
    return names


def lnorm_imports(root: Path = ROOT) -> dict[str, set[str]]:
    """Each module of ``root/lnorm`` and the ``lnorm`` modules it imports."""
    files = {module_name(p, root): p for p in (root / "lnorm").rglob("*.py")}
    modules = frozenset(files)
    return {me: {n for n in imported_names(path, root, modules)
                 if n in files and n != me}
            for me, path in files.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a list of nodes (first == last), or None."""
    state = {}  # node -> 1 on the stack, 2 done

    def visit(node, stack):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt, stack)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node, [])):
            return found
    return None


def test_no_import_cycle_among_lnorm_modules():
    cycle = find_cycle(lnorm_imports())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_lnorm_imports_neither_dev_nor_tests():
    for path in PACKAGE.rglob("*.py"):
        bad = {n for n in imported_names(path)
               if n.split(".")[0] in {"dev", "tests", "benchmarks"}}
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_gpu_does_not_import_the_timing_cli():
    for me, names in lnorm_imports().items():
        if me.startswith("lnorm.gpu"):
            assert "lnorm.bench" not in names, f"{me} imports lnorm.bench"


def test_cost_does_not_follow_the_loops_tuning():
    assert "lnorm.fused" not in lnorm_imports()["lnorm.cost"]


# --- the checks themselves catch what they guard against ----------------------


def _package(tmp_path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / "lnorm" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


@pytest.mark.parametrize("b_text", [
    "from .a import f\n",                             # at the top
    "def g():\n    from . import a\n    return a\n",  # lazy, in a function
    "def g():\n    import lnorm.a\n",                 # absolute, lazy
])
def test_a_planted_cycle_is_found(tmp_path, b_text):
    root = _package(tmp_path, {
        "__init__.py": "from .a import f\n",
        "a.py": "from .sub.b import g\n\ndef f():\n    pass\n",
        "sub/__init__.py": "",
        "sub/b.py": b_text.replace("from . import a", "from .. import a")
                          .replace("from .a", "from ..a"),
    })
    cycle = find_cycle(lnorm_imports(root))
    assert cycle is not None and set(cycle) == {"lnorm.a", "lnorm.sub.b"}


def test_a_chain_that_only_goes_down_is_no_cycle(tmp_path):
    root = _package(tmp_path, {
        "__init__.py": "from .a import f\nfrom . import b\n",
        "a.py": "from .b import g\n\ndef f():\n    from . import c\n",
        "b.py": "from .c import h\n\ndef g():\n    pass\n",
        "c.py": "def h():\n    pass\n",
    })
    graph = lnorm_imports(root)
    assert graph["lnorm.a"] == {"lnorm.b", "lnorm.c"}
    assert graph["lnorm.b"] == {"lnorm.c"}
    assert find_cycle(graph) is None


def test_relative_imports_resolve(tmp_path):
    root = _package(tmp_path, {
        "__init__.py": "",
        "gpu/__init__.py": "from . import run\n",
        "gpu/run.py": "from ..bench import make\nfrom .. import cost\n",
        "bench.py": "", "cost.py": "",
    })
    graph = lnorm_imports(root)
    assert graph["lnorm.gpu.run"] == {"lnorm.bench", "lnorm.cost"}
    assert graph["lnorm.gpu"] == {"lnorm.gpu.run"}
