"""Choosing an engine: :func:`make_engine` builds the engine a config names, above the
interface (:mod:`.base`) and the engines themselves (:mod:`.local`, :mod:`.ray_cluster`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .base import Call, Engine, EngineConfig
from .local import LocalEngine
from .ray_cluster import RayEngine


def make_engine(config: EngineConfig | str = "local") -> Engine:
    """The engine for ``config`` (an :class:`EngineConfig` or just its name); ``ray`` starts
    or joins Ray now and checks the requested resources, before any work is done."""
    cfg = config if isinstance(config, EngineConfig) else EngineConfig(engine=str(config))
    if cfg.engine == "ray":
        return RayEngine(cfg)
    return LocalEngine(cfg)


def map_calls(fn: Callable[..., Any], calls: Sequence[Call], cfg: EngineConfig | str, **kw: Any):
    """``make_engine(cfg).map(fn, calls, **kw)``."""
    return make_engine(cfg).map(fn, calls, **kw)
