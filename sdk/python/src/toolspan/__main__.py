"""``python -m toolspan``: see :mod:`toolspan._cli` (``python -m toolspan --help``)."""

import sys

from ._cli import main

if __name__ == "__main__":
    sys.exit(main())
