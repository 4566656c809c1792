"""Writes the API reference pages (``api/generated/<package>.md``) from the code at build time.

One page per public package: its docstring, then every name in its ``__all__`` (a class with
its members, a function, a constant), then each public submodule's docstring; and one page for
the top level (``lmgeom.md``), linking each name of ``lmgeom.__all__`` to its package's page.
The packages import their names lazily (``__getattr__``), which autodoc's ``:members:`` cannot
see, so the names are listed from ``__all__`` explicitly; a name added to ``__all__`` appears
on the next build, and a name that does not resolve fails the build.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import logging
import pkgutil
import re
from pathlib import Path

from sphinx.util.nodes import make_refnode

PACKAGES = ("metrics", "activations", "models", "texts", "lm", "experiments", "monitor",
            "training", "report", "results", "engines", "errors")


def _directive(qualified: str, obj: object) -> str:
    if inspect.isclass(obj):
        return f".. autoclass:: {qualified}\n   :members:\n"
    if inspect.ismodule(obj):
        return f".. automodule:: {qualified}\n   :no-index:\n"
    if callable(obj) and not _is_data(obj):
        parent, _, attr = qualified.rpartition(".")
        if _is_module_path(qualified):  # lmgeom.lm.knnlm: the function, not the module
            return f".. autofunction:: {parent}::{attr}\n"
        return f".. autofunction:: {qualified}\n"
    return _data_directive(qualified, obj)


def _is_module_path(path: str) -> bool:
    try:
        return importlib.util.find_spec(path) is not None
    except (ImportError, ValueError):
        return False


def _is_data(obj: object) -> bool:
    return not (inspect.isclass(obj) or inspect.ismodule(obj) or inspect.isroutine(obj))


def _data_directive(qualified: str, obj: object) -> str:
    # a long value (a registry, a table) is described by its docstring, not printed
    value = "" if len(repr(obj)) <= 160 else "   :no-value:\n"
    return f".. autodata:: {qualified}\n{value}\n"


def public_names(module) -> list[str]:
    """What a module documents: its ``__all__``, or without one the public names it defines."""
    names = getattr(module, "__all__", None)
    if names is None:  # a module without __all__: the public names it defines itself
        names = [n for n, o in vars(module).items() if not n.startswith("_")
                 and getattr(o, "__module__", None) == module.__name__]
    return list(names)


#: modules documented with ``:no-index:`` (their name is also a function's): name -> (page, label)
UNINDEXED: dict[str, tuple[str, str]] = {}


def _defined_here(module) -> list[str]:
    """The public names a module defines itself (top-level def, class, assignment), in order:
    what its section documents, whether or not its ``__all__`` lists them."""
    try:
        tree = ast.parse(inspect.getsource(module))
    except (OSError, TypeError):
        return []
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found = [node.name]
        elif isinstance(node, ast.Assign):
            found = [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found = [node.target.id]
        else:
            found = []
        names += [n for n in found if not n.startswith("_") and n not in names
                  and hasattr(module, n)
                  and not isinstance(getattr(module, n), logging.Logger)]
    return names


def _submodules(module) -> list[str]:
    if not hasattr(module, "__path__"):
        return []
    return sorted(n.name for n in pkgutil.walk_packages(module.__path__, module.__name__ + ".")
                  if not any(p.startswith("_") for p in n.name.split(".")))


def write_pages(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for pkg in PACKAGES:
        name = f"lmgeom.{pkg}"
        module = importlib.import_module(name)
        rst = [f".. automodule:: {name}\n   :no-members:\n", f".. currentmodule:: {name}\n"]
        for attr in public_names(module):
            if not inspect.ismodule(getattr(module, attr)):  # a module: its own section below
                rst.append(_directive(f"{name}.{attr}", getattr(module, attr)))
        subs = _submodules(module)
        if subs:
            title = f"Modules of {name}"
            rst.append(f"{title}\n{'-' * len(title)}\n")
            shown = {id(getattr(module, a)) for a in public_names(module)}
            taken = {n for n in public_names(module) if not inspect.ismodule(getattr(module, n))}
            for sub in subs:
                submodule = importlib.import_module(sub)
                # the package's own names are documented above, once; a submodule's section
                # documents the rest of what it defines itself (referenced by the docstrings)
                own = [n for n in _defined_here(submodule) if id(getattr(submodule, n, None))
                       not in shown]
                opts = "   :no-members:\n"
                if sub.rsplit(".", 1)[1] in taken:  # lmgeom.metrics.dispersion: the function
                    opts += "   :no-index:\n"      # holds the name; a label marks the module
                    label = "mod-" + sub.replace(".", "-").replace("_", "-")
                    UNINDEXED[sub] = (f"api/generated/{pkg}", label)
                    rst.append(f".. _{label}:\n")
                rst.append(f".. automodule:: {sub}\n{opts}")
                if own:  # each name by its own directive: constants without a doc comment too
                    rst.append(f".. currentmodule:: {sub}\n")
                    rst += [_directive(f"{sub}.{n}", getattr(submodule, n)) for n in own]
        text = f"# `{name}`\n\n```{{eval-rst}}\n" + "\n".join(rst) + "```\n"
        _write(out / f"{pkg}.md", text)
    _write(out / "lmgeom.md", top_level_page())


def _write(page: Path, text: str) -> None:
    if not page.exists() or page.read_text() != text:  # unchanged pages keep their mtime
        page.write_text(text)


def top_level_page() -> str:
    """The page of ``lmgeom`` itself: each name of ``lmgeom.__all__`` with the package page
    that documents it (the package whose ``__all__`` lists the same object), so a name added
    to the top level appears here on the next build. A name no package documents fails it."""
    import lmgeom

    rows = []
    for name in lmgeom.__all__:
        if name == "__version__":
            continue
        obj = getattr(lmgeom, name)
        if inspect.ismodule(obj):
            role, pkg = "py:mod", obj.__name__.rsplit(".", 1)[1]
        else:
            role = "py:class" if inspect.isclass(obj) else "py:func"
            packages = {p: importlib.import_module(f"lmgeom.{p}") for p in PACKAGES}
            pkg = next((p for p, m in packages.items()
                        if name in public_names(m) and getattr(m, name) is obj), None)
            if pkg is None:
                raise RuntimeError(f"lmgeom.{name} is in no documented package's __all__")
        rows.append(f"| {{{role}}}`lmgeom.{name}` | {{doc}}`{pkg}` |")
    return ("# `lmgeom`\n\n"
            "The top-level names, re-exported lazily from their packages (`import lmgeom` does "
            "not import\ntorch). Each is documented on its package's page:\n\n"
            "| name | documented at |\n|---|---|\n" + "\n".join(rows) + "\n\n"
            "```{eval-rst}\n.. py:module:: lmgeom\n\n.. py:data:: __version__\n\n"
            "   The installed version of lmgeom.\n```\n")


def _walk(path: str, attributes_first: bool):
    parts = path.split(".")
    try:
        obj = importlib.import_module(parts[0])
    except ImportError:
        return None
    for i, part in enumerate(parts[1:], start=2):
        prefix = ".".join(parts[:i])
        nxt = getattr(obj, part, None) if attributes_first else None
        if nxt is None:
            try:
                nxt = importlib.import_module(prefix)
            except ImportError:
                nxt = getattr(obj, part, None)
        if nxt is None:
            return None
        obj = nxt
    return obj


def _object(path: str):
    """The Python object a dotted path names, or None: by attribute first (the package's
    function ``lmgeom.lm.perplexity`` over the module of that name), else by module."""
    found = _walk(path, attributes_first=True)
    return found if found is not None else _walk(path, attributes_first=False)


def _index(env) -> dict[tuple[str, int], str]:
    """(name, id(object)) -> the one full name the object is documented under."""
    index: dict[tuple[str, int], str] = {}
    for fullname, entry in sorted(env.get_domain("py").objects.items()):
        if entry.aliased or not fullname.startswith("lmgeom"):
            continue
        obj = _object(fullname)
        if obj is not None:
            index.setdefault((fullname.rsplit(".", 1)[-1], id(obj)), fullname)
    return index


def _candidates(target: str, module: str | None, cls: str | None) -> list[str]:
    """Where a reference may mean: the current class and module, the module the documented
    class really lives in, each package above, the top level, and lmgeom.errors."""
    found: list[str] = []
    if module:
        if cls:
            found.append(f"{module}.{cls}.{target}")
            home = getattr(_object(f"{module}.{cls}"), "__module__", None)
            if home:
                found += [f"{home}.{cls}.{target}", f"{home}.{target}"]
        parts = module.split(".")
        found += [".".join(parts[:i] + [target]) for i in range(len(parts), 0, -1)]
    found += [target, f"lmgeom.{target}", f"lmgeom.errors.{target}"]
    return [c for c in dict.fromkeys(found) if c.startswith("lmgeom")]


def resolve_alias(app, env, node, contnode):
    """A reference to an object by another of its paths (``lmgeom.training.loop.train_loop``
    for the documented ``lmgeom.training.train_loop``, or a name relative to the module or
    package it is written in) resolves to where the object is documented. Anything else stays
    a warning (and ``-W`` makes it an error)."""
    if node.get("refdomain") != "py":
        return None
    target = node["reftarget"].lstrip("~.")
    index = getattr(env, "_lmgeom_index", None)
    if index is None:
        index = env._lmgeom_index = _index(env)
    for candidate in _candidates(target, node.get("py:module"), node.get("py:class")):
        if candidate in UNINDEXED:
            page, label = UNINDEXED[candidate]
            return make_refnode(app.builder, node["refdoc"], page, label, contnode, candidate)
        obj = _object(candidate)
        key = (candidate.rsplit(".", 1)[-1], id(obj))
        if obj is None or key not in index:
            continue
        return env.get_domain("py").resolve_xref(env, node["refdoc"], app.builder, "obj",
                                                  index[key], node, contnode)
    return None


_ABS = re.compile(r"(?<![`\\\w|])\|([^|\s`][^|`]*?)\|(?![`\w|])")


_ROLE = re.compile(r":(?:py:)?(func|class|meth|attr|data|mod|exc|obj):`(~?)([\w.]+)`")


def _qualify(obj, name: str):
    """A role's short target, written relative to the module (and class) the docstring lives
    in, as a full path: a name documented at the package level keeps resolving the way it
    reads in its source."""
    home = getattr(obj, "__module__", None) or (name if inspect.ismodule(obj) else None)
    if inspect.ismodule(obj):
        home = obj.__name__
    qual = getattr(obj, "__qualname__", "")
    cls = qual.rsplit(".", 1)[0] if "." in qual else (qual if inspect.isclass(obj) else "")

    def fix(m):
        role, tilde, target = m.groups()
        if target.startswith("lmgeom") or not home or not home.startswith("lmgeom"):
            return m.group(0)
        bare = target.lstrip(".")
        tries = [f"{home}.{cls}.{bare}"] if cls else []
        parts = home.split(".")
        tries += [".".join(parts[:i] + [bare]) for i in range(len(parts), 0, -1)]
        for full in tries:
            found = _object(full)
            where = getattr(found, "__name__" if inspect.ismodule(found) else "__module__", "")
            if found is not None and (_is_data(found) or (where or "").startswith("lmgeom")):
                shown = bare.rsplit(".", 1)[-1] if tilde else target.lstrip(".")
                return f":{role}:`{shown} <{full}>`"
        return m.group(0)
    return fix


def plain_text_fixes(app, what, name, obj, options, lines):
    """Docstrings write an absolute value as ``|z|`` (not an RST substitution), and refer to
    names relative to their own module."""
    own_doc = inspect.cleandoc(getattr(obj, "__doc__", None) or "")
    if what in ("data", "attribute") and own_doc and "\n".join(lines).strip() == own_doc:
        lines[:] = []  # a constant without a doc comment: not the docstring of its type
        return
    fix = _qualify(obj, name)
    out: list[str] = []
    for line in lines:
        # plain-text docstrings open a list right after its lead-in line ("Design:\n* a");
        # RST needs a blank line there
        if (_ITEM.match(line) and out and out[-1].strip() and not _ITEM.match(out[-1])
                and _indent(out[-1]) == _indent(line)):
            out.append("")
        out.append(_ROLE.sub(fix, _ABS.sub(r"\\|\1\\|", line)))
    lines[:] = out


_ITEM = re.compile(r"^\s*(?:[*-]|\d+\.) \S")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def napoleon_for_code_objects(app, what, name, obj, options, lines):
    """Napoleon reads a constant's docstring ``"Default budget: ..."`` as ``type: text``; a
    constant's (and a field's) docstring is prose, so napoleon sees only the rest."""
    from sphinx.ext.napoleon import _process_docstring

    if what not in ("data", "attribute", "property"):
        _process_docstring(app, what, name, obj, options, lines)


def setup(app):
    from sphinx.ext import napoleon

    app.setup_extension("sphinx.ext.napoleon")
    listeners = app.events.listeners.get("autodoc-process-docstring", [])
    for listener in list(listeners):
        if listener.handler is napoleon._process_docstring:
            app.disconnect(listener.id)
    app.connect("autodoc-process-docstring", plain_text_fixes, priority=400)
    app.connect("autodoc-process-docstring", napoleon_for_code_objects)
    app.connect("missing-reference", resolve_alias)
    app.connect("builder-inited",
                lambda app: write_pages(Path(app.srcdir) / "api" / "generated"))
    return {"parallel_read_safe": True, "parallel_write_safe": True}
