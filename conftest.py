"""The documentation's code blocks are tests: every ```bash and ```python block of README.md and
docs/*.md runs, in order, per page (collected by Sybil when pytest is given those files, as
``make test`` does). A block that cannot run here says why, in the comment above it:
``<!-- skip: next "reason" -->`` (a cluster, a hub download, a 20-minute run, a fragment of the
reader's own training loop); ``pytest README.md docs -rs`` lists them with their reasons.

Each page runs in a fresh temporary folder (its ``runs/...`` outputs land there; ``.venv`` is
linked in so ``. .venv/bin/activate`` works), with this interpreter's ``bin/`` first on PATH,
against the user's own activation cache, as a reader following the page would.

A ```console block is a recorded session, and it runs too: each ``$ command`` (a trailing
backslash continues it) must exit 0 and print what the block shows under it (stdout and stderr
as a terminal shows them). A ``...`` line stands for any number of lines; whitespace runs are
one space; each number may differ from the recorded one by one unit in its last printed digit
or 0.1 % (the same computation on another BLAS), except what is never the same twice: seconds
and the "N batches computed, M from cache" counts of a cache that other pages share.
``$ python`` followed by ``>>>`` lines is a doctest session, its outputs compared the same way.
"""

from __future__ import annotations

import doctest
import functools
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from sybil import Sybil
from sybil.parsers.markdown import CodeBlockParser, PythonCodeBlockParser, SkipParser

ROOT = Path(__file__).resolve().parent
BLOCK_TIMEOUT_S = 1200


# --- make test's parallel schedule (pytest-xdist) ------------------------------------------
# Here, in the root conftest, because the xdist controller only loads the root conftest.

#: tests that start a Ray instance share one worker (one Ray on the machine at a time): their
#: modules, and the tests whose name says they run on the Ray engine
RAY_FILES = re.compile(r"(^|/)test_ray[^/]*\.py$")
RAY_TESTS = re.compile(r"::test_ray_\w*")


def schedule_group(nodeid: str) -> str:
    """The unit ``make test`` schedules on one worker (``--dist loadfile``): the test's file (a
    documentation page's blocks run in order in one folder; a module's fixtures are built
    once), except that every Ray test joins the ``ray`` group."""
    path = nodeid.split("::", 1)[0]
    if RAY_FILES.search(path) or RAY_TESTS.search(nodeid):
        return "ray"
    return path


def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` with :func:`schedule_group` as its scope, in collection order
    (``make test`` lists the pages first, so README.md, the longest unit, starts first)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class GroupScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return schedule_group(nodeid)

    return GroupScheduling(config, log)


def pytest_collection_finish(session) -> None:
    """Convert the installed bundled models once, after collection and before any test or page
    runs, when the run holds anything beyond ``tests/unit`` (a converted model is shared by every
    test through the cache, its conversion locked): under xdist each worker converts its share
    (round robin by worker number) in parallel, so no test waits for a conversion the other
    worker could have done, and no recorded console block ever sees the one-time
    "first load ... dequantizing" line. ``make test-fast`` (unit tests only) converts nothing."""
    unit = ROOT / "tests" / "unit"
    if all(unit in Path(str(item.path)).resolve().parents for item in session.items):
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None and getattr(session.config.option, "numprocesses", None):
        return  # the xdist controller: its workers convert
    try:
        from lmgeom.models.bundled import BUNDLED
        from lmgeom.models.load import prepare_bundled
    except ImportError:  # pragma: no cover - lmgeom not installed: the tests say so
        return
    names = [n for n, bm in BUNDLED.items() if bm.installed()]
    if worker is not None:
        i, n = int(worker.lstrip("gw") or 0), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", 1))
        names = names[i::n]
    for name in names:
        prepare_bundled(name)


def _setup(namespace: dict) -> None:
    folder = Path(tempfile.mkdtemp(prefix="lmgeom-docs-"))
    if (ROOT / ".venv").exists():
        (folder / ".venv").symlink_to(ROOT / ".venv", target_is_directory=True)
    namespace["_cwd_before"] = os.getcwd()
    namespace["_folder"] = folder
    os.chdir(folder)  # python blocks write runs/... here too


def _teardown(namespace: dict) -> None:
    os.chdir(namespace["_cwd_before"])


def _page_env() -> dict[str, str]:
    """A reader's shell: this interpreter's ``bin/`` first on PATH, lmgeom not silenced."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("LMGEOM_QUIET", None)
    return env


def _run_bash(example) -> str | None:
    """One ```bash block as one ``bash -e`` script; a non-zero exit fails the block with the
    script's output."""
    proc = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", example.parsed], check=False,
                          cwd=example.namespace["_folder"], env=_page_env(), capture_output=True,
                          text=True, timeout=BLOCK_TIMEOUT_S)
    if proc.returncode != 0:
        return (f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}\n"
                f"--- stderr\n{proc.stderr[-3000:]}")
    return None


#: what differs between two runs of the same command: replaced by a placeholder on both sides
VOLATILE = (
    (re.compile(r"\d+ batch(es)? computed, \d+ from cache"), "N batches computed, M from cache"),
    (re.compile(r"\b\d+(\.\d+)? ?s\b"), "T s"),
)
NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?")


def _normal(line: str) -> str:
    line = " ".join(line.split())
    for pattern, placeholder in VOLATILE:
        line = pattern.sub(placeholder, line)
    return line


def _same_line(recorded: str, actual: str) -> bool:
    recorded, actual = _normal(recorded), _normal(actual)
    if NUMBER.split(recorded) != NUMBER.split(actual):
        return False
    for want, got in zip(NUMBER.findall(recorded), NUMBER.findall(actual)):
        w, g = float(want.replace(",", "")), float(got.replace(",", ""))
        decimals = len(want.split(".")[1].split("e")[0].split("E")[0]) if "." in want else 0
        if abs(w - g) > max(10.0 ** -decimals, 1e-3 * abs(w)) * (1 + 1e-9):
            return False
    return True


def matches_recorded(recorded: list[str], actual: list[str]) -> bool:
    """``recorded`` (with ``...`` lines standing for any run of lines) matches all of ``actual``."""
    @functools.cache
    def match(i: int, j: int) -> bool:
        if i == len(recorded):
            return j == len(actual)
        if recorded[i].strip() == "...":
            return any(match(i + 1, k) for k in range(j, len(actual) + 1))
        return j < len(actual) and _same_line(recorded[i], actual[j]) and match(i + 1, j + 1)
    return match(0, 0)


class _Checker(doctest.OutputChecker):
    """doctest's comparison, with the console blocks' rule for numbers, spaces and ``...``."""

    def check_output(self, want: str, got: str, optionflags: int) -> bool:
        return (super().check_output(want, got, optionflags)
                or matches_recorded(_strip_blank_ends(want.splitlines()),
                                    _strip_blank_ends(got.splitlines())))


def console_steps(text: str) -> list[tuple[str, list[str]]]:
    steps: list[tuple[str, list[str]]] = []
    lines = iter(text.splitlines())
    for line in lines:
        if line.startswith("$ "):
            command = line[2:]
            while command.endswith("\\"):
                command = command[:-1] + " " + next(lines).strip()
            steps.append((command, []))
        elif not steps:
            raise ValueError(f"a console block starts with '$ command', not {line!r}")
        else:
            steps[-1][1].append(line)
    return steps


def _strip_blank_ends(lines: list[str]) -> list[str]:
    while lines and not lines[-1].strip():
        lines = lines[:-1]
    while lines and not lines[0].strip():
        lines = lines[1:]
    return lines


def _run_console(example) -> str | None:
    env = {**_page_env(), "PYTHONUNBUFFERED": "1"}  # stdout and stderr in the order printed
    for command, recorded in console_steps(example.parsed):
        recorded = _strip_blank_ends(recorded)
        if command.strip() == "python":  # an interactive session: a doctest
            test = doctest.DocTestParser().get_doctest(
                "\n".join(recorded) + "\n", {}, example.path, example.path, example.line)
            runner = doctest.DocTestRunner(checker=_Checker(), optionflags=doctest.ELLIPSIS)
            report: list[str] = []
            runner.run(test, out=report.append)
            if runner.failures:
                return "".join(report)
            continue
        proc = subprocess.run(["bash", "-o", "pipefail", "-c", command], check=False,
                              cwd=example.namespace["_folder"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=BLOCK_TIMEOUT_S)
        actual = _strip_blank_ends(proc.stdout.splitlines())
        if proc.returncode != 0:
            return f"$ {command}\nexit {proc.returncode}\n{proc.stdout[-3000:]}"
        if not matches_recorded(recorded, actual):
            return (f"$ {command}\nprinted what the page does not show:\n--- recorded\n"
                    + "\n".join(recorded) + "\n--- printed\n" + "\n".join(actual))
    return None


pytest_collect_file = Sybil(
    parsers=[SkipParser(), PythonCodeBlockParser(),
             CodeBlockParser(language="bash", evaluator=_run_bash),
             CodeBlockParser(language="console", evaluator=_run_console)],
    patterns=["README.md", "*.md"],
    excludes=["CONTRIBUTING-helpers.md"],
    setup=_setup,
    teardown=_teardown,
).pytest()
