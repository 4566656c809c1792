"""Test hooks. ``LMGEOM_TEST_SLOW_STAGE=extract|metrics|report`` slows that stage down so the
reliability tests can SIGKILL a run inside it. A no-op otherwise (one env lookup per step)."""

from __future__ import annotations

import os
import time


def pause(stage: str) -> None:
    if os.environ.get("LMGEOM_TEST_SLOW_STAGE") == stage:
        time.sleep(0.4)


def fail_once(name: str) -> None:
    """Test hook: with ``LMGEOM_TEST_FLAKY_DIR`` set, the first attempt of a job whose name
    contains ``flaky`` raises (a marker file in that folder remembers it), the next succeeds —
    so the engines' retries can be tested across processes. ``always-fails`` always raises."""
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
