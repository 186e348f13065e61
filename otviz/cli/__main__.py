"""``python -m otviz.cli``: the ``otviz`` command (as ``python -m otviz``)."""

import sys

from otviz.cli import main

sys.exit(main())
