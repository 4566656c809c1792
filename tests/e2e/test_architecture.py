"""The shape of the code: layers import only layers below them (also inside functions and
through ``importlib``), no import cycles between subpackages, no ``_private`` names imported
from another module, thin commands, and ``python -m lmgeom`` = the ``lmgeom`` script."""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
from collections.abc import Collection
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "lmgeom"


#: bottom to top; a module may import its own layer's base modules and any layer below it
LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"errors"}),
    frozenset({"_io", "_paths", "_testing", "_version", "_env"}),
    frozenset({"results"}),
    frozenset({"texts"}),
    frozenset({"models"}),
    frozenset({"metrics"}),
    frozenset({"activations"}),
    frozenset({"lm"}),
    frozenset({"monitor"}),
    frozenset({"training"}),
    frozenset({"report"}),
    frozenset({"engines"}),
    frozenset({"experiments"}),
    frozenset({"commands"}),
    frozenset({"cli"}),
    frozenset({"__main__", "<root>"}),
)


RANK = {name: i for i, layer in enumerate(LAYERS) for name in layer}



def _from_target(node: ast.ImportFrom, mod: str, is_pkg: bool) -> str:
    """The absolute module a ``from ... import`` in module ``mod`` names (relative levels
    resolved; ``is_pkg``: ``mod`` is a package's ``__init__``)."""
    if not node.level:
        return node.module or ""
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))

def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path, source: str | None = None) -> list[tuple[str, str | None, int]]:
    """``(module, imported name or None, line)`` for every lmgeom import in ``path``, including
    function-local ones and ``importlib.import_module("lmgeom....")`` with a constant string.
    ``source`` stands in for the file's text (``path`` then only names the module)."""
    mod = _module_name(path)
    is_pkg = path.name == "__init__.py"
    out: list[tuple[str, str | None, int]] = []
    text = path.read_text() if source is None else source
    for node in ast.walk(ast.parse(text, str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, None, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = _from_target(node, mod, is_pkg)
            for a in node.names:
                # ``from . import x`` may name a submodule: record it as the module itself
                sub = f"{target}.{a.name}"
                if (SRC.parent / Path(*sub.split("."))).with_suffix(".py").is_file() or \
                        (SRC.parent / Path(*sub.split("."))).is_dir():
                    out.append((sub, None, node.lineno))
                else:
                    out.append((target, a.name, node.lineno))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "import_module" and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            out.append((node.args[0].value, None, node.lineno))
    return [(m, n, ln) for m, n, ln in out if m == "lmgeom" or m.startswith("lmgeom.")]


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "<root>"


def _all_imports():
    for path in sorted(SRC.rglob("*.py")):
        mod = _module_name(path)
        for target, name, line in _imports(path):
            yield path, mod, target, name, line


def test_layers_import_only_layers_below():
    bad = []
    for path, mod, target, name, line in _all_imports():
        src, dst = _unit(mod), _unit(target)
        if dst == "<root>" and (name is None or name.startswith("__")):
            continue  # ``from lmgeom import __version__`` (the root imports nothing statically)
        if src == dst or (src in RANK and RANK[src] == 1 and RANK.get(dst) == 1):
            continue  # inside one subpackage, or between the private base modules
        if src not in RANK or dst not in RANK:
            bad.append(f"{path.relative_to(SRC)}:{line}: {mod} -> {target} (unknown layer)")
        elif RANK[dst] >= RANK[src]:
            bad.append(f"{path.relative_to(SRC)}:{line}: {mod} ({src}) imports {target} ({dst}), "
                       "which is not below it")
    assert not bad, "layering violations:\n" + "\n".join(bad)


def test_no_import_cycle_between_subpackages():
    graph: dict[str, set[str]] = {}
    for _, mod, target, name, _ in _all_imports():
        if _unit(target) == "<root>" and (name is None or name.startswith("__")):
            continue
        if _unit(mod) != _unit(target):
            graph.setdefault(_unit(mod), set()).add(_unit(target))
    state: dict[str, int] = {}
    cycle: list[str] = []

    def visit(n: str, stack: list[str]) -> bool:
        state[n] = 1
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                cycle.extend(stack[stack.index(m):] + [n, m] if m in stack else [n, m])
                return True
            if state.get(m) is None and visit(m, stack + [n]):
                return True
        state[n] = 2
        return False

    for n in sorted(graph):
        if state.get(n) is None and visit(n, []):
            break
    assert not cycle, "import cycle: " + " -> ".join(cycle)


def test_no_private_names_across_modules():
    bad = []
    for path, mod, target, name, line in _all_imports():
        if name is not None and name.startswith("_") and not name.startswith("__"):
            bad.append(f"{path.relative_to(SRC)}:{line}: imports {target}.{name}")
        last = target.split(".")[-1]
        if last.startswith("_") and not last.startswith("__"):
            owner = target.rsplit(".", 1)[0]  # a private module is private to its package
            if not (mod == owner or mod.startswith(owner + ".")):
                bad.append(f"{path.relative_to(SRC)}:{line}: imports private module {target}")
    assert not bad, "private imports across modules:\n" + "\n".join(bad)


def test_checker_catches_a_violation():
    """The checks above can fail: a function-local upward import and a private name are seen.
    The probe module is parsed from a string (nothing is written into ``src/``)."""
    probe = SRC / "metrics" / "_zz_probe_for_test.py"
    source = "def f():\n    from ..experiments import sweep\n    from ..texts.files import _x\n"
    found = [(t, n) for t, n, _ in _imports(probe, source)]
    assert ("lmgeom.experiments.sweep", None) in found
    assert ("lmgeom.texts.files", "_x") in found
    mod = _module_name(probe)
    assert RANK[_unit("lmgeom.experiments.sweep")] > RANK[_unit(mod)]  # an upward import


def test_every_lmgeom_import_resolves():
    """A function-local import of a moved module fails only when the function runs; catch it
    here: every imported ``lmgeom`` module exists, and every imported name is defined there."""
    bad = []
    for path, _, target, name, line in _all_imports():
        parts = target.split(".")
        base = SRC.parent.joinpath(*parts)
        if not (base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()):
            bad.append(f"{path.relative_to(SRC)}:{line}: no module {target}")
            continue
        if name is None or name == "*":
            continue
        src = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        if name not in _defined_names(src):
            bad.append(f"{path.relative_to(SRC)}:{line}: {target} has no {name}")
    assert not bad, "unresolved imports:\n" + "\n".join(bad)


@functools.cache
def _defined_names(src: Path) -> frozenset[str]:
    """Names a module defines or imports, plus its string constants (a lazy ``_LAZY`` map or
    ``__all__``); parsed once per module."""
    defined: set[str] = set()
    for node in ast.walk(ast.parse(src.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, ast.Assign):
            defined |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            defined.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            defined |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            defined.add(node.value)
    return frozenset(defined)


#: what makes a module end to end whatever its timings: Ray, a browser, or a bundled model
E2E_SOURCE = re.compile(r"\bray\.init\(|sync_playwright|\bCHROMIUM\b|\bsmollm\b")


def test_tests_live_in_their_kind_folder():
    """The kind of a test is its folder (``tests/conftest.py``): no test module sits at the top
    of ``tests/``, no two share a basename (pytest would refuse to import the second), and no
    unit module starts Ray or a browser or asks for the bundled model's fixture (those belong in
    ``tests/e2e``, out of the inner loop)."""
    tests = Path(__file__).resolve().parents[1]
    assert not list(tests.glob("test_*.py")), "move each test module into unit/, e2e/ or docs/"
    names = [p.name for p in tests.glob("*/test_*.py")]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    offending = {p.name: E2E_SOURCE.search(p.read_text()).group(0)
                 for p in (tests / "unit").glob("test_*.py")
                 if p.name != Path(__file__).name and E2E_SOURCE.search(p.read_text())}
    assert not offending, offending


# --------------------------------------------------------------- imports at the top (issue 27)
#: Third-party packages a function-local import may keep off a path that does not need them:
#: slow to import (scipy, sklearn, pandas: seconds) or optional (the extras). A dotted entry
#: covers that submodule only (``safetensors.torch`` imports torch; ``safetensors`` does not).
HEAVY = frozenset({"torch", "matplotlib", "ray", "faiss", "peft", "datasets", "transformers",
                   "accelerate", "numba", "scipy", "sklearn", "pandas", "pyarrow", "gguf",
                   "huggingface_hub", "playwright", "tensorboard", "safetensors.torch"})


#: Heavy only on the CLI's start path (``lmgeom --help`` imports every command module).
START_ONLY = frozenset({"numpy"})


#: Local imports in files other sessions owned while issue 27 was done (``path: target``), to
#: be moved by them; an entry whose import is gone fails the test (delete the entry).
KNOWN_ELSEWHERE = frozenset({
    "models/bundled.py: lmgeom._io",
    "report/claims.py: lmgeom.results.console",
    "report/claims.py: matplotlib.figure",
    "training/geometry.py: lmgeom.monitor.core",
    "training/tokenizer.py: tokenizers",
})


def _path_of(module: str) -> Path | None:
    base = SRC.parent.joinpath(*module.split("."))
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.is_file():
            return p
    return None


@functools.cache
def _tree(module: str) -> ast.Module:
    return ast.parse(_path_of(module).read_text())


def _top_level(tree: ast.Module) -> list[ast.AST]:
    """Import statements and ``importlib.import_module`` calls that run when the module is
    imported (outside functions and ``if TYPE_CHECKING:``)."""
    out: list[ast.AST] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for n in node.orelse:
                visit(n)
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)) or (
                isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "import_module" and node.args):
            out.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    for n in tree.body:
        visit(n)
    return out


@functools.cache
def _lazy_names(package: str) -> dict[str, str]:
    """``name -> module`` of a package's lazy ``__getattr__`` map (``_LAZY`` / ``_WHERE``)."""
    p = _path_of(package)
    out: dict[str, str] = {}
    if p is None or p.name != "__init__.py":
        return out
    for n in ast.walk(_tree(package)):
        if isinstance(n, ast.Dict):
            for k, v in zip(n.keys, n.values):
                if isinstance(k, ast.Constant) and isinstance(v, ast.Constant) and \
                        isinstance(k.value, str) and isinstance(v.value, str):
                    t = v.value if v.value.startswith("lmgeom.") else f"{package}.{v.value}"
                    if _path_of(t) is not None:
                        out[k.value] = t
    return out


def _loads(module: str, node: ast.AST) -> list[str]:
    """What one import (statement or ``import_module`` call) in ``module`` loads: lmgeom module
    names (a lazily exported name: its defining module) or third-party dotted names."""
    if isinstance(node, ast.Call):  # import_module("lmgeom.x") or f"lmgeom.pkg.{name}"
        arg = node.args[0]
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            return [arg.value]
        if isinstance(arg, ast.JoinedStr) and isinstance(arg.values[0], ast.Constant):
            pkg = str(arg.values[0].value).rstrip(".")
            init = _path_of(pkg)
            if init is not None and init.name == "__init__.py":
                return [pkg] + [f"{pkg}.{q.stem}" for q in sorted(init.parent.glob("*.py"))
                                if q.stem != "__init__"]
        return []
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    assert isinstance(node, ast.ImportFrom)
    if node.level:
        path = _path_of(module)  # None: a probe module that is not on disk
        is_pkg = path is not None and path.name == "__init__.py"
        base = module.split(".") if is_pkg else module.split(".")[:-1]
        pkg = ".".join(base[: len(base) - (node.level - 1)] + [node.module or ""]).rstrip(".")
    else:
        pkg = node.module or ""
    out = [pkg]
    for a in node.names:
        sub = f"{pkg}.{a.name}"
        if pkg.split(".")[0] != "lmgeom" or _path_of(sub) is not None:
            out.append(sub)
        elif a.name in _lazy_names(pkg):
            out.append(_lazy_names(pkg)[a.name])
    return out


def _parents(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


@functools.cache
def _loads_at_top(module: str) -> tuple[str, ...]:
    return tuple(t for node in _top_level(_tree(module)) for t in _loads(module, node))


@functools.cache
def _closure(module: str) -> frozenset[str]:
    """Every module (lmgeom and third-party) that importing ``module`` loads."""
    seen: set[str] = set()
    todo = [module]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        if m.split(".")[0] != "lmgeom" or _path_of(m) is None:
            continue
        todo += _parents(m)
        todo += _loads_at_top(m)
    return frozenset(seen)


def _heavy(modules: frozenset[str] | set[str], kinds: frozenset[str]) -> set[str]:
    return {h for h in kinds for m in modules if m == h or m.startswith(h + ".")}


@functools.cache
def _start_path() -> frozenset[str]:
    mods = ["lmgeom.cli", "lmgeom.__main__"] + [
        f"lmgeom.commands.{q.stem}" for q in (SRC / "commands").glob("*.py")]
    return frozenset().union(*(_closure(m) for m in mods))


def _local_import_violations(path: Path, source: str | None = None) -> list[tuple[str, int]]:
    """``(target, line)`` of every function-local import in ``path`` that avoids nothing:
    everything it loads that counts as heavy is loaded by the module's own top already, it
    breaks no import cycle (the target does not import this module back), and it is not an
    optional third-party probe inside ``try: ... except ImportError``."""
    module = _module_name(path)
    tree = ast.parse(path.read_text() if source is None else source)
    kinds = HEAVY | (START_ONLY if module in _start_path() else frozenset())
    own: set[str] = {module, *_parents(module)}
    for p in _parents(module):
        own |= _closure(p)
    for node in _top_level(tree):
        for t in _loads(module, node):
            own |= _closure(t)
    mine = _heavy(own, kinds)
    optional = {id(n) for t in ast.walk(tree) if isinstance(t, ast.Try)
                and any("ImportError" in ast.unparse(h.type) for h in t.handlers if h.type)
                for s in t.body for n in ast.walk(s)}
    bad = []
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            targets = _loads(module, node)
            lmgeom = [t for t in targets if t.split(".")[0] == "lmgeom"]
            if len(lmgeom) < len(targets) and id(node) in optional:
                continue
            if any(module in _closure(t) for t in lmgeom if t != module):
                continue  # a cycle breaker
            loads = set().union(*(_closure(t) for t in targets))
            if not _heavy(loads, kinds) - mine:
                bad.append((targets[-1] if lmgeom else targets[0], node.lineno))
    return bad


def test_function_local_imports_avoid_something_heavy():
    """A function-local import must keep a heavy or optional dependency off a path (``HEAVY``,
    an lmgeom module that imports one at its top, numpy on the CLI's start path) or break an
    import cycle; every other import goes at the top of the module (STYLE, issue 27)."""
    bad, seen = [], set()
    for path in sorted(SRC.rglob("*.py")):
        rel = str(path.relative_to(SRC))
        for target, line in _local_import_violations(path):
            key = f"{rel}: {target}"
            seen.add(key)
            if key not in KNOWN_ELSEWHERE:
                bad.append(f"{rel}:{line}: import {target} inside a function avoids nothing "
                           "heavy; move it to the top of the module")
    assert not bad, "\n".join(bad)
    gone = sorted(KNOWN_ELSEWHERE - seen)
    assert not gone, f"fixed, so delete from KNOWN_ELSEWHERE: {gone}"


def test_local_import_checker_sees_light_and_heavy_imports():
    """The check above can fail: in a probe module, a local ``json`` / ``lmgeom.errors`` is a
    violation, a local ``torch`` / ``lmgeom.models.load`` (torch at its top) is not, and
    numpy counts as heavy only on the CLI's start path (a command module; the probe source
    stands in for its text, nothing is written)."""
    source = ("import numpy as np\n\ndef f():\n    import json\n    import torch\n"
              "    from ..errors import ConfigError\n    from ..models.load import load_model\n"
              "    from scipy import stats\n    import numpy\n")
    got = {t for t, _ in _local_import_violations(SRC / "texts" / "_zz_probe.py", source)}
    assert got == {"json", "lmgeom.errors", "numpy"}
    start = {t for t, _ in _local_import_violations(SRC / "commands" / "ppl.py",
                                                    source.replace("import numpy as np\n", ""))}
    assert start == {"json", "lmgeom.errors"}
    assert "torch" in _closure("lmgeom.models.load")
    assert "lmgeom.experiments.layer_sweep" in _closure("lmgeom.experiments.registry")


MAX_FUNCTION_LINES = 100


def _oversized(root: Path) -> list[str]:
    out = []
    for path in sorted(root.rglob("*.py")):
        src = path.read_text(encoding="utf-8")
        rel = path.relative_to(root)
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    out.append(f"{rel}:{node.lineno}: {node.name} is {n} lines "
                               f"(> {MAX_FUNCTION_LINES})")
    return out


def test_no_oversized_functions():
    """No function over 100 lines in src/ (a module may be long when it is one concept)."""
    bad = _oversized(SRC)
    assert not bad, "split these:\n" + "\n".join(bad)


def test_size_check_can_fail(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES + 1))
    (tmp_path / "big.py").write_text(f"def f():\n{body}\n")
    assert any("f is" in b for b in _oversized(tmp_path))


def _name_in(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules(root: Path = SRC) -> dict[str, Path]:
    return {_name_in(p, root): p for p in sorted(root.rglob("*.py"))}


def _owner(target: str, mods: Collection[str]) -> str | None:
    """The module a dotted import target lives in (``lmgeom.a.b`` → itself when a module or
    package, else its parent module)."""
    while target and target not in mods:
        target = target.rpartition(".")[0]
    return target or None


def _module_graph(edges) -> dict[str, set[str]]:
    """``{module: modules it imports}`` over lmgeom modules, function-local imports counted.
    ``edges``: ``(module, import target)`` pairs; a module importing its own package's
    ``__init__`` counts as importing that package."""
    graph: dict[str, set[str]] = {}
    mods = set(_modules())
    for mod, target in edges:
        dst = _owner(target, mods)
        if dst and dst != mod:
            graph.setdefault(mod, set()).add(dst)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected sets of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def test_no_import_cycle_between_modules():
    """No two lmgeom modules import each other, directly or around a loop, counting the
    imports inside functions (a function-local import that closes a cycle hides it, it does
    not remove it). A package's ``__init__`` counts as a module of its own."""
    import sys as _sys

    _sys.setrecursionlimit(10_000)
    graph = _module_graph((mod, target) for _, mod, target, _, _ in _all_imports())
    cycles = _cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_cycle_check_can_fail():
    graph = _module_graph([("lmgeom.metrics.pga", "lmgeom.metrics.spectral.x"),
                           ("lmgeom.metrics.spectral", "lmgeom.metrics.pga")])
    assert _cycles(graph) == [["lmgeom.metrics.pga", "lmgeom.metrics.spectral"]]
    assert _cycles({"a": {"b"}, "b": {"c"}}) == []


def _defined(path: Path) -> set[str]:
    """Top-level names a module defines itself (def, class, assignment, ``try``/``if`` blocks
    at top level), not the names it imports."""
    names: set[str] = set()

    def visit(body) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                for t in node.targets:
                    for n in ast.walk(t):
                        if isinstance(n, ast.Name):
                            names.add(n.id)
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and \
                    isinstance(node.target, ast.Name):
                names.add(node.target.id)
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                visit(getattr(node, "orelse", []))
                for h in getattr(node, "handlers", []):
                    visit(h.body)
                visit(getattr(node, "finalbody", []))
            elif isinstance(node, ast.With):
                visit(node.body)

    visit(ast.parse(path.read_text(encoding="utf-8")).body)
    return names


def _reexports(root: Path = SRC) -> list[str]:
    """Every ``from lmgeom.X import name`` (in src, tests, benchmarks) where X is a plain
    module (not a package ``__init__``) that does not define ``name`` itself: the name is
    imported through a shim instead of from its owner."""
    mods = _modules(root)
    defined: dict[str, set[str]] = {}
    bad = []
    files = sorted(root.rglob("*.py"))
    for extra in ("tests", "benchmarks"):
        files += sorted((root.parents[1] / extra).rglob("*.py"))
    for path in files:
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except SyntaxError:
            continue
        mod = _name_in(path, root) if root in path.parents else ""
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom):
                continue
            target = _from_target(node, mod, is_pkg)
            if target not in mods or mods[target].name == "__init__.py":
                continue
            if target not in defined:
                defined[target] = _defined(mods[target])
            for a in node.names:
                if a.name != "*" and a.name not in defined[target] and \
                        f"{target}.{a.name}" not in mods:
                    rel = path.relative_to(root.parents[1])
                    bad.append(f"{rel}:{node.lineno}: {a.name} from {target}, which does not "
                               "define it")
    return bad


def test_no_reexport_outside_a_package_init():
    """A name is imported from the module that defines it, or from its package's
    ``__init__``: never through another module that merely imports it (a shim gives one
    name two import paths and hides which file owns it)."""
    bad = _reexports()
    assert not bad, "imported through a shim:\n" + "\n".join(bad)


def test_reexport_check_can_fail(tmp_path):
    pkg = tmp_path / "src" / "lmgeom"
    (pkg / "a").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a" / "__init__.py").write_text("from .own import thing\n")
    (pkg / "a" / "own.py").write_text("def thing():\n    pass\n")
    (pkg / "a" / "shim.py").write_text("from .own import thing\n")
    (pkg / "a" / "user.py").write_text("from .shim import thing\nfrom .own import thing\n"
                                       "from . import thing\n")
    got = _reexports(pkg)
    assert len(got) == 1 and "thing from lmgeom.a.shim" in got[0], got


#: the leaf of each package split into a family: it imports none of its siblings (the shared
#: types and configs live there, so the other modules import downwards only)
LEAVES = ("lmgeom.activations.cache", "lmgeom.activations.forward", "lmgeom.engines.base",
          "lmgeom.experiments.claims.dispersion_base", "lmgeom.experiments.finetune.config",
          "lmgeom.experiments.knnlm.dispersion", "lmgeom.experiments.select.inputs",
          "lmgeom.experiments.sweep.jobs", "lmgeom.activations.export")


def test_each_family_leaf_imports_no_sibling():
    graph = _module_graph((mod, target) for _, mod, target, _, _ in _all_imports())
    for leaf in LEAVES:
        pkg = leaf.rpartition(".")[0]
        assert _path_of(leaf) is not None, f"{leaf} is gone: update LEAVES"
        sib = sorted(m for m in graph.get(leaf, ()) if m.startswith(pkg + ".") or m == pkg)
        assert not sib, f"{leaf} imports its siblings {sib}"


def test_regularisers_sit_above_the_losses():
    graph = _module_graph((mod, target) for _, mod, target, _, _ in _all_imports())
    assert "lmgeom.training.losses" in graph["lmgeom.training.regularisers"]
    assert "lmgeom.training.regularisers" not in graph.get("lmgeom.training.losses", set())


def test_dir_lists_the_lazy_public_api():
    import lmgeom

    listed = dir(lmgeom)
    assert set(lmgeom.__all__) <= set(listed), set(lmgeom.__all__) - set(listed)
    assert "extract" in listed and "Activations" in listed and listed == sorted(listed)


@pytest.mark.slow
def test_python_m_lmgeom_is_the_script():
    r = subprocess.run([sys.executable, "-m", "lmgeom", "--version"], capture_output=True,
                       text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    from lmgeom import __version__

    assert r.stdout.strip() == f"lmgeom {__version__}"
    r = subprocess.run([sys.executable, "-m", "lmgeom", "texts", "--nope"], capture_output=True,
                       text=True, timeout=120, check=False)
    assert r.returncode == 2 and "unrecognized arguments" in r.stderr

