"""The ``local`` engine: every call in this process, one after another (errors keep their type)."""

from __future__ import annotations

import logging
import traceback
from collections.abc import Sequence

from .base import EngineConfig, TaskOutcome, judge, retryable

log = logging.getLogger(__name__)


def _names(names: Sequence[str] | None, calls) -> list[str]:
    return list(names) if names is not None else [f"job {i}" for i in range(len(calls))]


class LocalEngine:
    """Runs the calls in this process (see :class:`~lmgeom.engines.base.Engine`)."""

    def __init__(self, config: EngineConfig | None = None) -> None:
        self.config = config or EngineConfig()

    def map(self, fn, calls, *, failure_of=None, on_done=None, names=None) -> list[TaskOutcome]:
        cfg = self.config
        names = _names(names, calls)
        out: list[TaskOutcome] = []
        for i, (args, kwargs) in enumerate(calls):
            attempt = 0
            history: list[str] = []
            while True:
                attempt += 1
                try:
                    value = fn(*args, **kwargs)
                    fail = judge(value, failure_of)
                    tb = None
                except Exception as exc:  # noqa: BLE001 - one job must never end the others
                    value, fail, tb = None, (type(exc).__name__, f"{type(exc).__name__}: {exc}"), \
                        traceback.format_exc(limit=8)
                    err = exc
                else:
                    err = None
                if fail is None:
                    res = TaskOutcome(value, None, None, attempt, history=history)
                    break
                if attempt <= cfg.retries and retryable(fail[0], err):
                    log.warning("%s failed (attempt %d of %d): %s; retrying", names[i], attempt,
                                1 + cfg.retries, fail[1])
                    history.append(f"attempt {attempt}: {fail[1]}"[:500])
                    continue
                res = TaskOutcome(value, fail[1], fail[0], attempt, tb, err, history=history)
                break
            if on_done is not None:
                on_done(i, res)
            out.append(res)
        return out
