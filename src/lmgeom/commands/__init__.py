"""One module per CLI sub-command (see :mod:`lmgeom.cli`)."""
