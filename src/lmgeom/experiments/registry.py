"""Imports every experiment module so each registers its config (:func:`~.base.register`)."""

import importlib

MODULES = ("analyze", "sweep", "dispersion", "hardness", "clusters", "knnlm", "probes", "convergence", "select", "claims", "finetune")

for _name in MODULES:
    importlib.import_module(f"lmgeom.experiments.{_name}")
