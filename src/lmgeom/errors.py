"""Typed exceptions. Every user mistake raises a subclass of :class:`LmgeomError`.

The CLI prints ``str(exc)`` as one line and exits non-zero; the library raises the same
exception so Python users can catch it. Messages say what is wrong *and* what to do.
"""

from __future__ import annotations


class LmgeomError(ValueError):
    """Base class of every error lmgeom raises for bad input or a bad environment."""


class TextsError(LmgeomError):
    """A corpus could not be loaded or is unusable (empty, bad file, missing column)."""


class ModelError(LmgeomError):
    """A model could not be found, loaded, or has no readout head."""


class ConfigError(LmgeomError):
    """An option value is invalid (k >= d, layers out of range, n_null < 2, ...)."""


class DataError(LmgeomError):
    """Arrays handed to a metric are unusable (NaN/Inf, zero rows, too few samples)."""


class CacheError(LmgeomError):
    """The cache or an output folder cannot be used (corrupt entry, out of disk, other run)."""


class ClusterError(LmgeomError):
    """The cluster cannot finish the work: its workers keep dying (killed, out of memory, node
    gone) beyond ``--retries``. Finished work is kept; the message says where."""


class LowSampleWarning(UserWarning):
    """A number was computed, but from too little data to be trusted (too few texts, null draws
    or sampled pairs, or a readout dimension k at or above the rank of the data). The value is
    still returned; results tables mark it in their ``flag`` column. The minimums and why they
    are what they are: :mod:`lmgeom.metrics.sample_size`."""
