"""The shape of the code: layers import only layers below them (also inside functions and
through ``importlib``), no import cycles between subpackages, no ``_private`` names imported
from another module, thin commands, and ``python -m lmgeom`` = the ``lmgeom`` script."""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "lmgeom"

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
            if node.level:
                base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
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


def test_e2e_lists_name_real_tests():
    """``conftest.E2E_TESTS`` / ``E2E_MODULES`` name tests by string: a renamed or deleted test
    would silently become a unit test (or the list would rot). Every name must exist."""
    import importlib.util

    here = Path(__file__).parent
    spec = importlib.util.spec_from_file_location("_conftest_probe", here / "conftest.py")
    conf = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(conf)
    for module in conf.E2E_MODULES:
        assert (here / f"{module}.py").is_file(), module
    for module, names in conf.E2E_TESTS.items():
        src = (here / f"{module}.py").read_text()
        for name in names:
            assert f"def {name}(" in src, f"{module}.{name} no longer exists"
