"""Run manifests: every setting, seed, version and timing of a run, as JSON."""

from __future__ import annotations

import datetime as _dt
import platform
import sys
from importlib import metadata
from typing import Any

#: the packages a manifest records, by import name and distribution name
PACKAGES = (("lmgeom", "lmgeom"), ("torch", "torch"), ("transformers", "transformers"),
            ("numpy", "numpy"), ("scipy", "scipy"), ("pandas", "pandas"),
            ("sklearn", "scikit-learn"))


def versions() -> dict[str, str]:
    """Python, platform and package versions. A package the run imported reports its
    ``__version__``; one it did not is read from its installed metadata rather than imported
    (importing scikit-learn and transformers only to read a version cost seconds per run)."""
    out = {"python": sys.version.split()[0], "platform": platform.platform()}
    for mod, dist in PACKAGES:
        if mod in sys.modules:
            out[mod] = str(getattr(sys.modules[mod], "__version__", "?"))
            continue
        try:
            out[mod] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    torch = sys.modules.get("torch")
    if torch is not None:
        out["torch_threads"] = str(torch.get_num_threads())
        out["cuda"] = str(torch.cuda.is_available())
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
