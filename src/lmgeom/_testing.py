"""Test hooks, each a no-op unless its environment variable is set (one env lookup per call).

* ``LMGEOM_PAUSE_AT=<stage>[:<n>]`` + ``LMGEOM_PAUSE_DIR`` stops a run inside a stage
  (``extract-lock`` just before an extraction asks for its cache entry's lock, ``extract``
  after a computed batch is stored, ``metrics`` after a layer's result is
  written, ``report`` after a section's plots) until the test releases it (:func:`pause`), so
  the fault tests can SIGKILL, SIGINT or fill the disk at a known point, whatever the speed
  of the machine: no sleeps, no timing windows.
* ``LMGEOM_TEST_FLAKY_DIR`` makes jobs named ``*flaky*`` fail once and ``*always-fails*``
  always (:func:`fail_once`), to test the engines' retries across processes.
* ``LMGEOM_TEST_HOLD_DIR`` + ``LMGEOM_TEST_HOLD=job,extract-batch`` stops the first call at
  such a point, in whichever process reaches it first, until the test kills that process by
  the pid it wrote (:func:`hold`): "a worker dies in the middle of a job", on purpose.
"""

from __future__ import annotations

import os
import time

from ._env import hold_seconds

_pause_calls: dict[str, int] = {}


def pause(stage: str) -> None:
    """Test hook: a deterministic pause point inside ``stage``.

    With ``LMGEOM_PAUSE_AT=<stage>[:<n>]`` (``n`` defaults to 1) and ``LMGEOM_PAUSE_DIR`` set,
    the ``n``-th call of ``pause(stage)`` in this process writes its pid to
    ``<dir>/<stage>.paused`` (atomically: once the file exists the run *is* inside the stage,
    with exactly ``n`` units of it finished and stored) and then waits until
    ``<dir>/<stage>.release`` appears (at most ``LMGEOM_TEST_HOLD_S`` seconds, then it
    raises). The wait is a sleep loop in the calling (main) thread, so a SIGINT sent while
    paused raises ``KeyboardInterrupt`` there, as Ctrl-C in a real run would. Every other
    call passes straight through.
    """
    spec = os.environ.get("LMGEOM_PAUSE_AT")
    if not spec:
        return
    name, _, nth = spec.partition(":")
    if name != stage:
        return
    folder = os.environ.get("LMGEOM_PAUSE_DIR")
    if not folder:
        raise RuntimeError("LMGEOM_PAUSE_AT is set but LMGEOM_PAUSE_DIR is not (test hook)")
    _pause_calls[stage] = _pause_calls.get(stage, 0) + 1
    if _pause_calls[stage] != (int(nth) if nth else 1):
        return
    marker = os.path.join(folder, f"{stage}.paused")
    with open(marker + ".tmp", "w") as fh:
        fh.write(f"{os.getpid()}\n")
    os.replace(marker + ".tmp", marker)
    release = os.path.join(folder, f"{stage}.release")
    deadline = time.monotonic() + hold_seconds()
    while time.monotonic() < deadline:
        if os.path.exists(release):
            return
        time.sleep(0.02)
    raise RuntimeError(f"test pause in {stage} was never released (LMGEOM_PAUSE_DIR)")


def hold(point: str) -> None:
    """Test hook: with ``LMGEOM_TEST_HOLD_DIR`` set and ``point`` listed in ``LMGEOM_TEST_HOLD``
    (comma-separated), the first call of ``point`` across every process (an ``O_EXCL`` claim
    file in that folder decides) writes its pid to ``<dir>/<point>.pid`` and waits until it is
    killed or ``<dir>/<point>.release`` appears (at most ``LMGEOM_TEST_HOLD_S`` seconds, default
    120, then it raises). Later calls pass straight through, so the retry of a killed job runs.

    ``LMGEOM_TEST_HOLD_NODE=NAME`` restricts the hold to processes whose environment has
    ``LMGEOM_TEST_NODE=NAME`` (a Ray node started with that variable: its workers inherit it).
    """
    folder = os.environ.get("LMGEOM_TEST_HOLD_DIR")
    if not folder or point not in os.environ.get("LMGEOM_TEST_HOLD", "").split(","):
        return
    node = os.environ.get("LMGEOM_TEST_HOLD_NODE")
    if node and os.environ.get("LMGEOM_TEST_NODE") != node:
        return
    try:
        fd = os.open(os.path.join(folder, f"{point}.claim"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.close(fd)
    pid_file = os.path.join(folder, f"{point}.pid")
    with open(pid_file + ".tmp", "w") as fh:
        fh.write(f"{os.getpid()}\n{os.environ.get('LMGEOM_TEST_NODE', '')}\n")
    os.replace(pid_file + ".tmp", pid_file)

    deadline = time.monotonic() + hold_seconds()
    release = os.path.join(folder, f"{point}.release")
    while time.monotonic() < deadline:
        if os.path.exists(release):
            return
        time.sleep(0.05)
    raise RuntimeError(f"test hold at {point} was never released (LMGEOM_TEST_HOLD_DIR)")


def fail_once(name: str) -> None:
    """Test hook: with ``LMGEOM_TEST_FLAKY_DIR`` set, the first attempt of a job whose name
    contains ``flaky`` raises (a marker file in that folder remembers it), the next succeeds —
    so the engines' retries can be tested across processes. ``always-fails`` always raises.
    Every sweep job passes here first, so it is also the ``job`` point of :func:`hold`."""
    hold("job")
    folder = os.environ.get("LMGEOM_TEST_FLAKY_DIR")
    if not folder:
        return
    if "always-fails" in name:
        raise RuntimeError(f"injected failure of {name} (LMGEOM_TEST_FLAKY_DIR)")
    if "flaky" in name:
        marker = os.path.join(folder, "attempted-" + "".join(c if c.isalnum() else "_" for c in name))
        if not os.path.exists(marker):
            with open(marker, "w") as fh:
                fh.write(str(os.getpid()))
            raise RuntimeError(f"injected first-attempt failure of {name} (LMGEOM_TEST_FLAKY_DIR)")
