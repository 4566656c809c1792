"""Test hook: ``LMGEOM_TEST_SLOW_STAGE=extract|metrics|report`` slows that stage down so the
reliability tests can SIGKILL a run inside it. A no-op otherwise (one env lookup per step)."""

from __future__ import annotations

import os
import time


def pause(stage: str) -> None:
    if os.environ.get("LMGEOM_TEST_SLOW_STAGE") == stage:
        time.sleep(0.4)
