"""Execution engines: where lmgeom's jobs run (``local``: this process; ``ray``: a Ray cluster).

Every engine has one method, ``map(fn, calls) -> outcomes`` (:class:`Engine`); the unit of work
is a plain, picklable function call, so both engines run the same code and give the same
numbers. :mod:`lmgeom.engines.ray_extract` holds the model-holding Ray actors of a distributed
extraction.
"""

from ..errors import ClusterError
from .base import ENGINES, NOT_RETRYABLE, Engine, EngineConfig, TaskOutcome
from .factory import make_engine, map_calls

__all__ = ["ENGINES", "NOT_RETRYABLE", "ClusterError", "Engine", "EngineConfig", "TaskOutcome",
           "make_engine", "map_calls"]
