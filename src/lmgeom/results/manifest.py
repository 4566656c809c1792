"""Run manifests: every setting, seed, version and timing of a run, as JSON."""

from __future__ import annotations

import datetime as _dt
import platform
import sys
from typing import Any


def versions() -> dict[str, str]:
    out = {"python": sys.version.split()[0], "platform": platform.platform()}
    for mod in ("lmgeom", "torch", "transformers", "numpy", "scipy", "pandas", "sklearn"):
        try:
            m = __import__(mod)
            out[mod] = str(getattr(m, "__version__", "?"))
        except ImportError:
            pass
    try:
        import torch

        out["torch_threads"] = str(torch.get_num_threads())
        out["cuda"] = str(torch.cuda.is_available())
    except ImportError:  # pragma: no cover
        pass
    return out


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def base_manifest(command: str, argv_settings: dict[str, Any], signature: str) -> dict[str, Any]:
    return {
        "command": command,
        "settings": argv_settings,
        "signature": signature,
        "versions": versions(),
        "started": now(),
    }
