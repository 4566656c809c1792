"""The papers' analyses, composed from texts, models, activations and metrics.

Every experiment returns a tidy :class:`pandas.DataFrame` with the columns of
:data:`lmgeom.results.table.COLUMNS` plus a manifest dict.
"""
