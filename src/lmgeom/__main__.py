"""``python -m lmgeom``: the same as the ``lmgeom`` script."""

import sys

from lmgeom.cli import main

if __name__ == "__main__":
    sys.exit(main())
